//! `huddle task claim|renew|complete|fail|release|review|bid|delegate`: the task operations of an agent
//! that acts for itself, for agents and scripts without MCP. Each subcommand opens an
//! [`AgentSession`] and makes the one call the MCP tool of the same name makes; `--json`
//! prints the tool's structured result, and a refusal is the tool's error (code and
//! message) with a non-zero exit.

use clap::{Args, Subcommand};
use huddle_agent::views::{
    ClaimArgs, CompleteArgs, GiveBackArgs, RenewArgs, ReviewArgs, TaskWritten,
};
use huddle_agent::{AgentError, AgentSession, BidArgs, DelegateArgs};
use huddle_core::ClaimEpoch;
use huddle_store::StoreOptions;
use serde::Serialize;

use crate::output::format_time;

/// The agent and its room, as `huddle mcp` and `huddle task` take them.
#[derive(Args, Debug)]
pub struct Identity {
    /// The room the agent works in.
    #[arg(long)]
    pub room: String,
    /// The agent acting (never taken from a tool argument).
    #[arg(long)]
    pub agent: String,
    /// Capabilities the agent declares (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub capabilities: Vec<String>,
}

/// Who acts, and how to print.
#[derive(Args, Debug)]
pub struct Agent {
    #[command(flatten)]
    pub(crate) id: Identity,
    /// The structured result, as the MCP tool returns it.
    #[arg(long)]
    pub(crate) json: bool,
}

impl Agent {
    /// The agent's session in its room.
    pub(crate) async fn open(
        &self,
        db: &str,
        options: StoreOptions,
    ) -> anyhow::Result<AgentSession> {
        let store = huddle_store::open(db, options).await?;
        let id = &self.id;
        AgentSession::open(store, &id.room, &id.agent, id.capabilities.clone())
            .await
            .map_err(refusal)
    }
}

/// How a write is fenced and de-duplicated.
#[derive(Args, Debug)]
pub struct Fencing {
    /// The claim epoch the write presents: pass the one `claim` printed, so a write
    /// after the lease lapsed is refused as stale [default: the epoch the ledger
    /// records for the agent].
    #[arg(long)]
    epoch: Option<i64>,
    /// Makes a retried write safe: the same key never writes twice.
    #[arg(long)]
    idempotency_key: Option<String>,
}

impl Fencing {
    fn epoch(&self) -> Option<ClaimEpoch> {
        self.epoch.map(ClaimEpoch)
    }
}

/// What `fail` and `release` take.
#[derive(Args, Debug)]
pub struct GiveBack {
    /// The task.
    task: String,
    /// Why.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    fencing: Fencing,
}

impl From<GiveBack> for GiveBackArgs {
    fn from(g: GiveBack) -> Self {
        GiveBackArgs {
            task: g.task,
            reason: g.reason,
            epoch: g.fencing.epoch(),
            idempotency_key: g.fencing.idempotency_key,
        }
    }
}

/// `huddle task ...`
#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// Claim a task: the one named, or the best ready one for the agent.
    Claim {
        #[command(flatten)]
        who: Agent,
        /// The task [default: the best ready one].
        task: Option<String>,
        /// Wait up to this long for a claimable task (ms, at most 60000).
        #[arg(long)]
        wait_ms: Option<u64>,
    },
    /// Extend the lease of a task the agent holds.
    Renew {
        #[command(flatten)]
        who: Agent,
        /// The task.
        task: String,
        /// The claim epoch [default: the agent's, as the ledger records it].
        #[arg(long)]
        epoch: Option<i64>,
    },
    /// Complete a task the agent holds, with a result.
    Complete {
        #[command(flatten)]
        who: Agent,
        /// The task.
        task: String,
        /// A short result.
        #[arg(long)]
        result: Option<String>,
        #[command(flatten)]
        fencing: Fencing,
    },
    /// Report that a task the agent holds failed; it is retried until its attempts
    /// are used.
    Fail {
        #[command(flatten)]
        who: Agent,
        #[command(flatten)]
        args: GiveBack,
    },
    /// Give a task back without failing it.
    Release {
        #[command(flatten)]
        who: Agent,
        #[command(flatten)]
        args: GiveBack,
    },
    /// Give the verdict on a task submitted for the agent's review (`[review @agent]`):
    /// accept it (done) or reject it with feedback (another attempt).
    Review {
        #[command(flatten)]
        who: Agent,
        /// The task.
        task: String,
        /// `accept` or `reject`.
        verdict: String,
        /// What must change (for a rejection), or a comment.
        #[arg(long)]
        feedback: Option<String>,
    },
    /// Create tasks as a delegator (`!config delegators ...`): one per line as
    /// `id: label [after dep1, dep2] [@agent]`, the owner's `!delegate` grammar.
    Delegate {
        #[command(flatten)]
        who: Agent,
        /// The task lines; `-` reads them from stdin.
        tasks: String,
        /// Thread to delegate in.
        #[arg(long)]
        thread: Option<String>,
        /// Makes a retry safe: the same key and tasks create nothing twice.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// One task's story, for anyone who can read the room: status, annotations, what
    /// blocks it, every attempt (agent, relay, epoch, outcome, reason, duration) and
    /// the result.
    Show {
        /// The room.
        room: String,
        /// The task id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Bid on a ready task while its bid window is open (allocation bid).
    Bid {
        #[command(flatten)]
        who: Agent,
        /// The task.
        task: String,
        /// The score: the agent's load, lower wins [default: the tasks it holds].
        #[arg(long)]
        load: Option<u32>,
        /// Decline the task instead of bidding.
        #[arg(long)]
        decline: bool,
    },
}

/// Runs a `huddle task` subcommand.
pub async fn run(db: &str, options: StoreOptions, command: TaskCommand) -> anyhow::Result<()> {
    let who = match &command {
        TaskCommand::Claim { who, .. }
        | TaskCommand::Renew { who, .. }
        | TaskCommand::Complete { who, .. }
        | TaskCommand::Fail { who, .. }
        | TaskCommand::Release { who, .. }
        | TaskCommand::Bid { who, .. }
        | TaskCommand::Review { who, .. }
        | TaskCommand::Delegate { who, .. } => who,
        TaskCommand::Show { room, id, json } => {
            return crate::task_show::show(db, options, room, id, *json).await;
        }
    };
    let me = who.open(db, options).await?;
    let json = who.json;
    match command {
        TaskCommand::Claim { task, wait_ms, .. } => {
            let r = me
                .task_claim(ClaimArgs { task, wait_ms })
                .await
                .map_err(refusal)?;
            show(json, &r, || match &r.claimed {
                Some(c) => {
                    let mut s = format!(
                        "claimed {} ({}) at epoch {}, attempt {}; lease {} ms, renew before {}",
                        c.task.id,
                        c.task.label,
                        c.epoch,
                        c.attempt,
                        c.lease_ms,
                        format_time(c.expires_at)
                    );
                    for d in &c.dependencies {
                        s.push_str(&format!(
                            "\n  after {}: {}",
                            d.id,
                            d.result.as_deref().unwrap_or("(no result)")
                        ));
                    }
                    if let Some(f) = &c.review_feedback {
                        s.push_str(&format!(
                            "\n  sent back by {} (review round {}): {}",
                            f.reviewer, f.round, f.feedback
                        ));
                    }
                    s
                }
                None => format!(
                    "nothing claimed: {}",
                    r.reason.as_deref().unwrap_or("no reason given")
                ),
            })
        }
        TaskCommand::Renew { task, epoch, .. } => {
            let r = me
                .task_renew(RenewArgs {
                    task,
                    epoch: epoch.map(ClaimEpoch),
                })
                .await
                .map_err(refusal)?;
            show(json, &r, || {
                format!(
                    "renewed {} at epoch {} until {}",
                    r.task,
                    r.epoch,
                    format_time(r.expires_at)
                )
            })
        }
        TaskCommand::Complete {
            task,
            result,
            fencing,
            ..
        } => {
            let r = me
                .task_complete(CompleteArgs {
                    task,
                    result,
                    epoch: fencing.epoch(),
                    idempotency_key: fencing.idempotency_key,
                })
                .await
                .map_err(refusal)?;
            show(json, &r, || written(&r))
        }
        TaskCommand::Delegate {
            tasks,
            thread,
            idempotency_key,
            ..
        } => {
            let tasks = if tasks == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                tasks
            };
            let r = me
                .task_delegate(DelegateArgs {
                    tasks,
                    thread,
                    idempotency_key,
                })
                .await
                .map_err(refusal)?;
            show(json, &r, || {
                if r.message.inserted {
                    r.summary.clone()
                } else {
                    format!("{} (already delegated; nothing new)", r.summary)
                }
            })
        }
        TaskCommand::Review {
            task,
            verdict,
            feedback,
            ..
        } => {
            let r = me
                .task_review(ReviewArgs {
                    task,
                    verdict,
                    feedback,
                })
                .await
                .map_err(refusal)?;
            show(json, &r, || {
                format!("{} {}: the task is {} now", r.verdict, r.task, r.status)
            })
        }
        // Answered above, before an agent session is opened.
        TaskCommand::Show { .. } => Ok(()),
        TaskCommand::Fail { args, .. } => give_back(&me, json, true, args.into()).await,
        TaskCommand::Release { args, .. } => give_back(&me, json, false, args.into()).await,
        TaskCommand::Bid {
            task,
            load,
            decline,
            ..
        } => {
            let r = me
                .task_bid(BidArgs {
                    task,
                    load,
                    decline,
                })
                .await
                .map_err(refusal)?;
            show(json, &r, || {
                let what = if r.decline {
                    "declined".to_string()
                } else {
                    format!("bid load {} on", r.load)
                };
                format!(
                    "{what} {} (attempt {}){}; leader {}; the window closes at {}",
                    r.task,
                    r.attempt,
                    if r.written.inserted {
                        ""
                    } else {
                        " — your first answer for this attempt stands"
                    },
                    r.leader.as_deref().unwrap_or("none"),
                    format_time(r.closes_at)
                )
            })
        }
    }
}

/// `fail` (when `fail`) or `release`.
async fn give_back(
    me: &AgentSession,
    json: bool,
    fail: bool,
    args: GiveBackArgs,
) -> anyhow::Result<()> {
    let r = if fail {
        me.task_fail(args).await
    } else {
        me.task_release(args).await
    }
    .map_err(refusal)?;
    show(json, &r, || written(&r))
}

/// A session's refusal as the MCP tool words it: `[code] message`.
pub(crate) fn refusal(e: AgentError) -> anyhow::Error {
    anyhow::anyhow!("[{}] {e}", e.code())
}

/// Prints `value` as JSON, or the human line.
pub(crate) fn show<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        println!("{}", human());
    }
    Ok(())
}

fn written(r: &TaskWritten) -> String {
    format!(
        "{}: {} (epoch {}){}",
        r.task,
        r.status,
        r.epoch,
        if r.written.inserted {
            ""
        } else {
            "; already recorded"
        }
    )
}
