//! `task_delegate`: a lead agent creates tasks, when the room owner allowed it.
//!
//! Who may delegate is room config, set only by the owner's signed `!config
//! delegators lead,planner`. The session writes, in one batch, the agent's
//! `!delegate` message and the `task.created` rows the core derives for it
//! ([`huddle_core::commands::delegate_rows`]); every reader's owner authority admits
//! those rows only while the agent is a delegator at that point of the ledger
//! (`docs/protocol.md`, "Delegation by agents"). A non-delegator is refused here with
//! what to do; rows it writes around the session count nowhere.

use huddle_core::commands::{created_summary, delegate_rows, ParseContext};
use huddle_core::{validate_name, InteractionId, NewInteraction, Position, Role, Verb};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{AgentError, Result};
use crate::session::AgentSession;
use crate::views::Written;

/// Arguments of `task_delegate`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct DelegateArgs {
    /// The tasks, one per line, in the `!delegate` grammar: `id: label [after dep1,
    /// dep2] [@agent]`. Dependencies may name tasks of this plan or existing tasks;
    /// ids must be new. A leading `!delegate` line is optional.
    pub tasks: String,
    /// Thread to delegate in (the thread's `delegators` setting then applies).
    #[serde(default)]
    pub thread: Option<String>,
    /// A key of your choosing: a retry with the same key and tasks creates nothing
    /// twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// What `task_delegate` created.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DelegateResult {
    /// The task ids, dependencies first.
    pub created: Vec<String>,
    /// The `!delegate` message; `inserted: false` when this plan was already
    /// delegated (a retry): nothing new was created.
    pub message: Written,
    /// A one-line summary, as the owner's `!delegate` reply says it.
    pub summary: String,
}

impl AgentSession {
    /// `task_delegate`: creates tasks with the `!delegate` grammar and limits, if the
    /// room owner made this agent one of the room's `delegators`.
    pub async fn task_delegate(&self, args: DelegateArgs) -> Result<DelegateResult> {
        let text = match args.tasks.trim_start().strip_prefix("!delegate") {
            Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => {
                args.tasks.trim_start().to_string()
            }
            _ => format!("!delegate\n{}", args.tasks),
        };
        let mut message = NewInteraction::new(
            self.room.as_str(),
            Verb::MessagePosted,
            self.agent.as_str(),
            Role::Agent,
            serde_json::json!({ "text": text }),
        );
        if let Some(t) = args.thread.as_deref() {
            validate_name("thread", t, self.store.limits())
                .map_err(|e| AgentError::BadArgument(e.to_string()))?;
            message = message.in_thread(t);
        }
        if let Some(k) = self.idempotency(args.idempotency_key.as_deref())? {
            message = message.with_idempotency_key(k);
        }
        let id = message.id();
        if self.store.get(id).await?.is_some() {
            // A retry: this very plan is in the ledger already.
            return self.delegated_before(id).await;
        }
        let rows = {
            let st = self.synced().await?;
            let config = st.config().effective(&self.room, args.thread.as_deref());
            if !config.may_delegate(&self.agent) {
                return Err(AgentError::NotDelegator {
                    delegators: listed(&config.delegators),
                });
            }
            let exists = |t: &str| st.authority.task_exists(&self.room, t);
            let ctx = ParseContext {
                task_exists: &exists,
                ..ParseContext::default()
            };
            delegate_rows(message, st.config(), &ctx)
                .map_err(|e| AgentError::BadPlan(e.to_string()))?
        };
        let created: Vec<String> = rows[1..]
            .iter()
            .filter_map(|r| r.body.get("task").and_then(|t| t.as_str()))
            .map(str::to_string)
            .collect();
        let summary = summary(&created);
        self.store.append(rows).await?;
        self.store.flush().await;
        // Every reader decides with the ledger as it is at the message: check that
        // the plan counted there (the owner may have changed the delegators, or
        // someone taken an id, since this session looked).
        let st = self.synced().await?;
        if let Some(missing) = created
            .iter()
            .find(|t| !st.authority.task_exists(&self.room, t))
        {
            let config = st.config().effective(&self.room, args.thread.as_deref());
            if !config.may_delegate(&self.agent) {
                return Err(AgentError::NotDelegator {
                    delegators: listed(&config.delegators),
                });
            }
            return Err(AgentError::BadPlan(format!(
                "task {missing:?} was created by someone else meanwhile, so none of this \
                 plan counts; call `tasks` and delegate again with new ids"
            )));
        }
        Ok(DelegateResult {
            created,
            message: Written {
                id: id.to_string(),
                inserted: true,
            },
            summary,
        })
    }
}

impl AgentSession {
    /// The result of a `!delegate` message already in the ledger: the tasks it
    /// created (read back from the room; a retry is rare).
    async fn delegated_before(&self, message: InteractionId) -> Result<DelegateResult> {
        let mut created = Vec::new();
        let mut cursor = Position::START;
        loop {
            let batch = self.store.read_room(&self.room, cursor, 1000).await?;
            created.extend(
                batch
                    .rows
                    .iter()
                    .filter(|r| r.verb == Verb::TaskCreated && r.parent == Some(message))
                    .filter_map(|r| r.body.get("task").and_then(|t| t.as_str()))
                    .map(str::to_string),
            );
            if batch.next == cursor {
                break;
            }
            cursor = batch.next;
        }
        Ok(DelegateResult {
            summary: summary(&created),
            created,
            message: Written {
                id: message.to_string(),
                inserted: false,
            },
        })
    }
}

/// The owner's `!delegate` reply for these ids.
fn summary(ids: &[String]) -> String {
    created_summary(&ids.iter().map(String::as_str).collect::<Vec<_>>())
}

fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "nobody".to_string()
    } else {
        names.join(", ")
    }
}
