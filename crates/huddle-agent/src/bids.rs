//! `task_bid`: an agent's bid (or explicit decline) for a ready task under the room's
//! `bid` allocation, written as relays write theirs.
//!
//! The contract-net itself is the core's ([`huddle_core::policy::claim_right`]): while
//! a task's bid window is open nobody claims it; then the best bid (lowest load, fewest
//! unneeded capabilities, lowest agent id) may claim it for one more window; then any
//! capable agent. `task_claim` applies that rule and, when the winner claims, writes
//! `task.rejected` for every other bidder, so an agent acting for itself and relays'
//! agents bid against each other on equal terms.

use huddle_core::config::Allocation;
use huddle_core::policy::{capable, claim_right, winning_bid, ClaimRight};
use huddle_core::tasks::TaskBidBody;
use huddle_core::{TaskStatus, Timestamp, Verb};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{AgentError, Result};
use crate::session::AgentSession;
use crate::views::Written;

/// Arguments of `task_bid`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct BidArgs {
    /// The ready task to bid on (its bid window must be open).
    pub task: String,
    /// Your score: your current load, lower wins (ties go to the bidder with fewer
    /// capabilities the task does not need, then the lower agent id). Default: the
    /// number of tasks you hold in this room.
    #[serde(default)]
    pub load: Option<u32>,
    /// Decline the task instead of bidding: recorded, never wins.
    #[serde(default)]
    pub decline: bool,
}

/// What `task_bid` recorded.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BidResult {
    /// The task.
    pub task: String,
    /// The attempt the bid is for.
    pub attempt: u32,
    /// Whether this answer is a decline.
    pub decline: bool,
    /// The load bid (0 for a decline).
    pub load: u32,
    /// The `task.bid` row; `inserted: false` when you had already answered for this
    /// attempt (the first answer counts and stands).
    pub written: Written,
    /// When the bid window closes (µs, database clock): claim the task with
    /// `task_claim` after it if you lead.
    #[schemars(with = "i64")]
    pub closes_at: Timestamp,
    /// The best bid so far.
    pub leader: Option<String>,
    /// Every bidder so far (declines are not bids).
    pub bidders: Vec<String>,
}

impl AgentSession {
    /// `task_bid`: bids on (or declines) a ready task whose bid window is open.
    pub async fn task_bid(&self, args: BidArgs) -> Result<BidResult> {
        let now = self.store.now().await?;
        let st = self.synced().await?;
        let not_biddable = |why: String| AgentError::NotBiddable {
            task: args.task.clone(),
            why,
        };
        let t = st
            .dag
            .task(&self.room, &args.task)
            .ok_or_else(|| AgentError::NoTask(args.task.clone()))?;
        let config = st.config().effective(&self.room, None);
        if config.allocation != Allocation::Bid {
            return Err(not_biddable(format!(
                "the room allocates by {:?}, not by bids; claim it with task_claim",
                config.allocation
            )));
        }
        let since = match (t.status, st.dag.ready_since(&self.room, &t.id)) {
            (TaskStatus::Open, Some(since)) => since,
            (TaskStatus::Open, None) => {
                return Err(not_biddable(
                    "its dependencies are not all done; bid once it is ready".into(),
                ))
            }
            _ => {
                return Err(not_biddable(format!(
                    "it is {} already",
                    crate::views::status_name(t)
                )))
            }
        };
        let closes_at = match claim_right(&config, t, since, now) {
            ClaimRight::Bidding { closes_at } => closes_at,
            _ => {
                return Err(not_biddable(
                    "its bid window has closed; the winner (or, after one more window, anyone capable) claims it with task_claim".into(),
                ))
            }
        };
        if !args.decline && !capable(&t.needs, &self.capabilities) {
            return Err(not_biddable(format!(
                "it needs capabilities [{}] that you did not declare; such a bid never wins",
                t.needs.join(", ")
            )));
        }
        let load = match (args.decline, args.load) {
            (true, _) => 0,
            (false, Some(l)) => l,
            (false, None) => st
                .dag
                .claimed(&self.room)
                .iter()
                .filter(|c| c.owner.as_deref() == Some(self.agent.as_str()))
                .count() as u32,
        };
        let attempt = t.next_attempt();
        let body = TaskBidBody {
            task: args.task.clone(),
            attempt,
            capabilities: self.capabilities.clone(),
            load,
            decline: args.decline,
        };
        // One answer per agent and attempt: the first counts (as in the fold), and a
        // retried call writes nothing.
        let key = format!(
            "agent/{}/{}/bid/{}/{attempt}",
            self.room, self.agent, args.task
        );
        let row = self.row(Verb::TaskBid, body.to_body(), Some(key));
        drop(st);
        let written = self.append_own(row).await?;
        let st = self.synced().await?;
        let t = st
            .dag
            .task(&self.room, &args.task)
            .ok_or_else(|| AgentError::NoTask(args.task.clone()))?;
        tracing::info!(room = %self.room, agent = %self.agent, task = %args.task, attempt, load, decline = args.decline, inserted = written.inserted, "task bid");
        Ok(BidResult {
            task: args.task.clone(),
            attempt,
            decline: args.decline,
            load,
            written,
            closes_at,
            leader: winning_bid(t).map(|b| b.agent.clone()),
            bidders: t.bids.keys().cloned().collect(),
        })
    }
}
