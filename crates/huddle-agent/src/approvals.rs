//! Approval gates: `approval_request` (ask the room owner before an action) and
//! `approval` (where a request stands), both able to wait for the answer.
//!
//! The request is an `approval.requested` row by the agent; the answer is the owner's
//! signed `!approve ID` / `!deny ID [reason]`, verified by the owner authority every
//! reader folds ([`huddle_core::approval`]), so an answer by anyone else counts
//! nowhere.

use std::time::Duration;

use huddle_core::approval::{Approval, ApprovalRequestBody, MAX_APPROVAL_TEXT_BYTES};
use huddle_core::{validate_name, NewInteraction, Role, Timestamp, Verb};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{AgentError, Result};
use crate::session::{AgentSession, MAX_WAIT_MS};
use crate::views::Written;

/// Arguments of `approval_request`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRequestArgs {
    /// What you want to do, in one line the owner can judge ("deploy v2 to prod").
    pub action: String,
    /// More about it: what changes, what could go wrong.
    #[serde(default)]
    pub details: Option<String>,
    /// Thread to ask in.
    #[serde(default)]
    pub thread: Option<String>,
    /// Wait up to this long (ms, at most 60000) for the owner's answer.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// A key of your choosing: a retry with the same key returns the same request
    /// (and id) instead of asking twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Arguments of `approval`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalArgs {
    /// The id `approval_request` returned.
    pub id: String,
    /// Wait up to this long (ms, at most 60000) while the request is pending.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// An approval request and where it stands.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalView {
    /// The id the owner answers.
    pub id: String,
    /// `pending`, `approved` or `denied`. Act only on `approved`.
    pub status: String,
    /// What was asked.
    pub action: String,
    /// More about it.
    pub details: Option<String>,
    /// Who asked.
    pub requested_by: String,
    /// When (µs, database clock).
    #[schemars(with = "i64")]
    pub requested_at: Timestamp,
    /// Who answered (the room owner).
    pub answered_by: Option<String>,
    /// When (µs, database clock).
    #[schemars(with = "Option<i64>")]
    pub answered_at: Option<Timestamp>,
    /// The reason of a deny, if the owner gave one.
    pub reason: Option<String>,
    /// How the owner answers, while it is pending.
    pub how_to_answer: Option<String>,
}

impl From<&Approval> for ApprovalView {
    fn from(a: &Approval) -> Self {
        let status = a.status();
        ApprovalView {
            id: a.id.clone(),
            status: status.as_str().to_string(),
            action: a.action.clone(),
            details: a.details.clone(),
            requested_by: a.requested_by.clone(),
            requested_at: a.requested_at,
            answered_by: a.answer.as_ref().map(|x| x.by.clone()),
            answered_at: a.answer.as_ref().map(|x| x.at),
            reason: a.answer.as_ref().and_then(|x| x.reason.clone()),
            how_to_answer: a.answer.is_none().then(|| {
                format!(
                    "the room owner posts `!approve {0}` or `!deny {0} [reason]` \
                     (`huddle post --as OWNER`)",
                    a.id
                )
            }),
        }
    }
}

/// Result of `approval_request`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRequested {
    /// The request, as it stands after the wait.
    pub approval: ApprovalView,
    /// The `approval.requested` row; `inserted: false` for a retry.
    pub written: Written,
}

impl AgentSession {
    /// `approval_request`: asks the room owner before an action; waits up to
    /// `wait_ms` for the answer.
    pub async fn approval_request(&self, args: ApprovalRequestArgs) -> Result<ApprovalRequested> {
        let action = args.action.trim();
        if action.is_empty() {
            return Err(AgentError::BadArgument(
                "action is empty: say what you want to do".into(),
            ));
        }
        for (what, text) in [
            ("action", Some(action)),
            ("details", args.details.as_deref()),
        ] {
            if text.is_some_and(|t| t.len() > MAX_APPROVAL_TEXT_BYTES) {
                return Err(AgentError::BadArgument(format!(
                    "{what} is over {MAX_APPROVAL_TEXT_BYTES} bytes; shorten it"
                )));
            }
        }
        let key = self.idempotency(args.idempotency_key.as_deref())?;
        // A retry (same key) gets the same id; otherwise the database clock makes
        // two identical requests two requests.
        let salt = match &key {
            Some(k) => k.clone(),
            None => self.store.now().await?.0.to_string(),
        };
        let mut hasher = blake3::Hasher::new();
        for part in [&self.room, &self.agent, action, &salt] {
            hasher.update(part.as_bytes());
            hasher.update(&[0]);
        }
        let id = format!("ap-{}", &hasher.finalize().to_hex()[..8]);
        let body = ApprovalRequestBody {
            approval: id.clone(),
            action: action.to_string(),
            details: args.details.filter(|d| !d.trim().is_empty()),
        };
        let mut row = NewInteraction::new(
            self.room.as_str(),
            Verb::ApprovalRequested,
            self.agent.as_str(),
            Role::Agent,
            body.to_body(),
        );
        if let Some(t) = args.thread {
            validate_name("thread", &t, self.store.limits())
                .map_err(|e| AgentError::BadArgument(e.to_string()))?;
            row = row.in_thread(t);
        }
        if let Some(k) = key {
            row = row.with_idempotency_key(k);
        }
        let written = self.append_own(row).await?;
        // With an idempotency key reused for another action, the first request stands.
        let stored =
            self.store
                .get(written.id.parse().map_err(|_| {
                    AgentError::BadArgument("the store returned a malformed id".into())
                })?)
                .await?;
        let id = stored
            .and_then(|r| {
                r.body
                    .get("approval")
                    .and_then(|a| a.as_str())
                    .map(str::to_string)
            })
            .unwrap_or(id);
        let approval = self
            .approval(ApprovalArgs {
                id,
                wait_ms: args.wait_ms,
            })
            .await?;
        Ok(ApprovalRequested { approval, written })
    }

    /// `approval`: where a request stands; with `wait_ms`, waits while it is pending.
    pub async fn approval(&self, args: ApprovalArgs) -> Result<ApprovalView> {
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        let deadline = Instant::now() + wait;
        loop {
            let view = {
                let st = self.synced().await?;
                let a = st
                    .authority
                    .approvals()
                    .get(&self.room, &args.id)
                    .ok_or_else(|| AgentError::NoApproval(args.id.clone()))?;
                ApprovalView::from(a)
            };
            if view.answered_by.is_some() || !self.wait_for_news(deadline).await {
                return Ok(view);
            }
        }
    }

    /// Every approval request of the room, pending first, then by time.
    pub async fn approvals(&self) -> Result<Vec<ApprovalView>> {
        let st = self.synced().await?;
        Ok(views(st.authority.approvals().room(&self.room)))
    }
}

/// Views of `approvals`, pending first, then oldest first.
pub fn views<'a>(approvals: impl Iterator<Item = &'a Approval>) -> Vec<ApprovalView> {
    let mut all: Vec<&Approval> = approvals.collect();
    all.sort_by_key(|a| (a.answer.is_some(), a.requested_at, a.id.clone()));
    all.into_iter().map(ApprovalView::from).collect()
}
