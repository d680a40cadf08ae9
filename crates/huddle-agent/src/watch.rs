//! Pacing for an agent that acts for itself, as relays pace the agents they drive
//! (plan 0054): the circuit breaker keeps a benched agent from claiming, and a
//! watchdog fails the tasks this session holds once their attempt is past its
//! deadline (`[due D]`) or silent for the room's `stall-timeout` (no `task_claim` or
//! `task_renew` on it), so the task is retried instead of waiting for its lease.

use std::sync::Arc;
use std::time::Duration;

use huddle_core::config::format_duration;
use huddle_core::protocol::{CoordNoteBody, NoticeBody, SYSTEM_ACTOR};
use huddle_core::{NewInteraction, Role, Timestamp, Verb};
use tokio::time::Instant;

use crate::error::Result;
use crate::session::{AgentSession, Folded};
use crate::views::GiveBackArgs;

/// How often the watchdog looks at the tasks a session holds.
const WATCH_EVERY: Duration = Duration::from_secs(1);

impl AgentSession {
    /// Why this agent may not claim now: the circuit breaker benched it (its last
    /// `breaker` turns in the room failed), until when. `None` when it may.
    pub(crate) fn benched_why(&self, st: &Folded, now: Timestamp) -> Option<String> {
        let config = st.config().effective(&self.room, None);
        let streak = st.board.room(&self.room)?.failing.get(&self.agent)?;
        let until = huddle_core::pacing::benched_until(&config, streak).filter(|u| now < *u)?;
        Some(format!(
            "the circuit breaker benched you: your last {} turns in this room failed; you \
             get no work until {} (breaker-cooldown), then one trial decides",
            streak.failed,
            huddle_core::board::format_timestamp(until)
        ))
    }

    /// Fails every task this session holds whose attempt is overdue or stalled, as a
    /// relay fails a driven turn (`task.failed` with reason `overdue: ...` or
    /// `stalled: ...`, a `turn.failed`, and for a deadline a `task-overdue` notice to
    /// the owner). Returns `(task, reason)` of each one failed. A completion racing
    /// with it is settled by the claim's fence: whichever is written first counts.
    pub async fn watch_held(&self) -> Result<Vec<(String, String)>> {
        let now = self.store.now().await?;
        let due: Vec<(String, huddle_core::ClaimEpoch, String, bool)> = {
            let st = self.synced().await?;
            let config = st.config().effective(&self.room, None);
            // What this session claimed, and what the ledger says this agent holds
            // (a claim taken by another process of the agent, e.g. `huddle task
            // claim`): a deadline is the ledger's, whoever watches.
            let mut held: std::collections::BTreeMap<String, huddle_core::ClaimEpoch> =
                st.mine.clone();
            for t in st.dag.claimed(&self.room) {
                if let (Some(o), Some(e)) = (&t.owner, t.epoch) {
                    if *o == self.agent {
                        held.entry(t.id.clone()).or_insert(e);
                    }
                }
            }
            let mut due = Vec::new();
            for (id, epoch) in held {
                let Some(t) = st.dag.task(&self.room, &id) else {
                    continue;
                };
                // No longer this agent's at that epoch (lapsed and re-taken, or
                // finished): a write under it is refused and explained by its fence.
                if !t.is_held_by(&self.agent, epoch) {
                    continue;
                }
                if let Some(ms) = huddle_core::pacing::attempt_due(t)
                    .filter(|d| now >= *d)
                    .and(t.due_ms)
                {
                    let why = format!(
                        "overdue: attempt not finished within its deadline ({} from its claim)",
                        format_duration(ms)
                    );
                    due.push((id, epoch, why, true));
                    continue;
                }
                let stall = config.stall_timeout_ms;
                let silent = st
                    .activity
                    .get(&id)
                    .is_some_and(|a| a.elapsed() >= Duration::from_millis(stall));
                if stall > 0 && silent {
                    let why = format!(
                        "stalled: no task_renew or other call on it for {}",
                        format_duration(stall)
                    );
                    due.push((id, epoch, why, false));
                }
            }
            due
        };
        let mut failed = Vec::new();
        for (task, epoch, reason, overdue) in due {
            let attempt = self
                .synced()
                .await?
                .dag
                .task(&self.room, &task)
                .map_or(0, |t| t.attempts);
            match self
                .task_fail(GiveBackArgs {
                    task: task.clone(),
                    reason: Some(reason.clone()),
                    epoch: Some(epoch),
                    idempotency_key: None,
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(room = %self.room, agent = %self.agent, task = %task, %reason, "held task failed by the watchdog");
                    if overdue {
                        self.notice_overdue(&task, attempt, &reason).await;
                    }
                    failed.push((task, reason));
                }
                // Completed, given back or lost meanwhile: nothing to fail.
                Err(e) => {
                    tracing::debug!(room = %self.room, agent = %self.agent, task = %task, error = %e, "watchdog: the task is no longer this session's")
                }
            }
        }
        Ok(failed)
    }

    /// The owner's `task-overdue` notice, with the text a relay writes.
    async fn notice_overdue(&self, task: &str, attempt: u32, reason: &str) {
        let body = CoordNoteBody::Notice(NoticeBody {
            about: NoticeBody::TASK_OVERDUE.to_string(),
            to: Some("owner".to_string()),
            task: Some(task.to_string()),
            text: format!(
                "task {task}: attempt {attempt} by {} was cancelled and failed: {reason}",
                self.agent
            ),
        });
        let row = NewInteraction::new(
            self.room.as_str(),
            Verb::CoordNote,
            SYSTEM_ACTOR,
            Role::System,
            body.to_body(),
        );
        if let Err(e) = self.store.append(vec![row]).await {
            tracing::warn!(room = %self.room, task, error = %e, "the overdue notice was not written");
        }
    }

    /// Whether this session holds any task (what the watchdog has to look at).
    async fn holds_tasks(&self) -> bool {
        !self.state.lock().await.mine.is_empty()
    }
}

/// Runs [`AgentSession::watch_held`] every second while the session holds tasks, for
/// as long as the returned task is not aborted (`huddle mcp` runs one per agent).
pub fn spawn_watchdog(session: Arc<AgentSession>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut next = Instant::now();
        loop {
            next += WATCH_EVERY;
            tokio::time::sleep_until(next).await;
            if !session.holds_tasks().await {
                continue;
            }
            if let Err(e) = session.watch_held().await {
                tracing::warn!(room = %session.room(), agent = %session.agent(), error = %e, "watchdog pass failed; trying again");
            }
        }
    })
}
