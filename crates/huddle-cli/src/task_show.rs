//! `huddle task show ROOM ID`: one task's story from the ledger — status, owner,
//! annotations, what blocks it, every attempt with its agent, epoch, outcome, reason
//! and duration, and the result.

use std::fmt::Write as _;

use anyhow::bail;
use huddle_core::tasks::{
    BlockedBy, TaskClaimedBody, TaskCompletedBody, TaskEndedBody, TaskReviewedBody, Verdict,
};
use huddle_core::{ClaimEpoch, Interaction, Task, TaskStatus, Timestamp, Verb};
use huddle_sim::Tally;
use huddle_store::StoreOptions;
use serde::Serialize;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::{emit, fold_admitted};

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Still held.
    Running,
    /// Completed (the task is done).
    Completed,
    /// Completed and submitted for review (`[review @agent]`); waiting for the verdict.
    Submitted,
    /// Submitted and accepted by the reviewer (the task is done).
    Accepted,
    /// Submitted and rejected by the reviewer (`reason` holds the feedback).
    Rejected,
    /// Reported failed.
    Failed,
    /// Given back without failing.
    Released,
    /// Its claim lapsed and another claim took the task over.
    Superseded,
}

/// One accepted claim of the task and how it ended.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    /// The attempt number the claim started (from 1).
    pub attempt: u32,
    /// The agent.
    pub agent: String,
    /// The relay that wrote the claim.
    pub relay: String,
    /// The claim epoch.
    pub epoch: ClaimEpoch,
    /// When it was claimed (database time, µs).
    pub claimed_at: Timestamp,
    /// When it ended, if it has.
    pub ended_at: Option<Timestamp>,
    /// How it ended.
    pub outcome: Outcome,
    /// The reason of a failure or release.
    pub reason: Option<String>,
    /// From claim to end, ms.
    pub duration_ms: Option<i64>,
}

/// `huddle task show --json`.
#[derive(Debug, Serialize)]
pub struct TaskShow {
    /// The room.
    pub room: String,
    /// The task as the fold holds it.
    pub task: Task,
    /// Open with every dependency done.
    pub ready: bool,
    /// What keeps it from ever running (empty unless blocked).
    pub blocked_by: Vec<BlockedBy>,
    /// Every accepted claim, in ledger order.
    pub attempts: Vec<Attempt>,
    /// A task given back: the earliest time its next attempt may start (its
    /// back-off, `retry-backoff`).
    pub retry_at: Option<huddle_core::Timestamp>,
    /// A claimed task with a deadline (`[due D]`): when its current attempt is overdue.
    pub due_at: Option<huddle_core::Timestamp>,
}

/// Folds `room` and follows every row about `id` that changed the task.
async fn collect(
    db: &str,
    options: StoreOptions,
    room: &str,
    id: &str,
) -> anyhow::Result<TaskShow> {
    let store = ledger_cmds::open(db, options).await?;
    let mut tally = Tally::new(room);
    let mut config = huddle_core::ConfigFold::new();
    let mut attempts: Vec<Attempt> = Vec::new();
    fold_admitted(&*store, room, |r| {
        let before = tally.dag.task(room, id).cloned();
        tally.apply(r);
        huddle_core::Fold::apply(&mut config, r);
        let after = tally.dag.task(room, id);
        if before.as_ref() != after {
            let submitted = after.is_some_and(|t| t.status == TaskStatus::Submitted);
            follow(&mut attempts, r, id, submitted);
        }
    })
    .await?;
    let Some(task) = tally.dag.task(room, id).cloned() else {
        bail!("room `{room}` has no task `{id}` (`huddle tasks --room {room}` lists them)");
    };
    Ok(TaskShow {
        room: room.to_string(),
        ready: tally.dag.is_ready(room, id),
        blocked_by: tally.dag.blocked_by(room, id),
        retry_at: huddle_core::pacing::retry_at(&config.effective(room, None), room, &task),
        due_at: huddle_core::pacing::attempt_due(&task),
        task,
        attempts,
    })
}

/// Records what an accepted row `r` about task `id` did to its attempts.
/// `submitted`: the task is in review after the row.
fn follow(attempts: &mut Vec<Attempt>, r: &Interaction, id: &str, submitted: bool) {
    let end = |attempts: &mut Vec<Attempt>, epoch: ClaimEpoch, outcome, reason| {
        if let Some(a) = attempts
            .iter_mut()
            .rev()
            .find(|a| a.epoch == epoch && a.outcome == Outcome::Running)
        {
            a.ended_at = Some(r.at);
            a.outcome = outcome;
            a.reason = reason;
            a.duration_ms = Some((r.at.as_micros() - a.claimed_at.as_micros()) / 1_000);
        }
    };
    match r.verb {
        Verb::TaskClaimed => {
            let Some(b) = TaskClaimedBody::parse(&r.body).filter(|b| b.task == id) else {
                return;
            };
            // A claim that supersedes a live one ends the previous attempt.
            if let Some(prev) = attempts
                .iter()
                .rev()
                .find(|a| a.outcome == Outcome::Running)
                .map(|a| a.epoch)
            {
                end(attempts, prev, Outcome::Superseded, None);
            }
            let attempt = u32::try_from(attempts.len()).unwrap_or(u32::MAX) + 1;
            attempts.push(Attempt {
                attempt,
                agent: r.actor.clone(),
                relay: r.relay.clone(),
                epoch: b.epoch,
                claimed_at: r.at,
                ended_at: None,
                outcome: Outcome::Running,
                reason: None,
                duration_ms: None,
            });
        }
        Verb::TaskCompleted => {
            if let Some(b) = TaskCompletedBody::parse(&r.body).filter(|b| b.task == id) {
                let outcome = if submitted {
                    Outcome::Submitted
                } else {
                    Outcome::Completed
                };
                end(attempts, b.epoch, outcome, None);
            }
        }
        Verb::TaskReviewed => {
            if let Some(b) = TaskReviewedBody::parse(&r.body).filter(|b| b.task == id) {
                if let Some(a) = attempts
                    .iter_mut()
                    .rev()
                    .find(|a| a.outcome == Outcome::Submitted)
                {
                    a.outcome = match b.verdict {
                        Verdict::Accept => Outcome::Accepted,
                        Verdict::Reject => Outcome::Rejected,
                    };
                    let said = if b.feedback.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", b.feedback)
                    };
                    a.reason = Some(format!("{} by {}{said}", b.verdict, r.actor));
                }
            }
        }
        Verb::TaskFailed | Verb::TaskReleased => {
            if let Some(b) = TaskEndedBody::parse(&r.body).filter(|b| b.task == id) {
                let outcome = if r.verb == Verb::TaskFailed {
                    Outcome::Failed
                } else {
                    Outcome::Released
                };
                end(attempts, b.epoch, outcome, Some(b.reason));
            }
        }
        _ => {}
    }
}

fn status_word(s: &TaskShow) -> &'static str {
    match s.task.status {
        TaskStatus::Open if s.ready => "ready",
        TaskStatus::Open if !s.blocked_by.is_empty() => "blocked",
        TaskStatus::Open => "waiting",
        TaskStatus::Claimed => "claimed",
        TaskStatus::Submitted => "submitted",
        TaskStatus::Done => "done",
        TaskStatus::Abandoned => "abandoned",
        TaskStatus::Cancelled => "cancelled",
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// The human form.
fn render(s: &TaskShow) -> String {
    let t = &s.task;
    let mut out = String::new();
    let _ = writeln!(out, "task {} in room {}: {}", t.id, s.room, status_word(s));
    let _ = writeln!(out, "label:    {}", t.label);
    let _ = writeln!(
        out,
        "created:  {} by {}",
        format_time(t.created_at),
        t.created_by
    );
    let _ = writeln!(
        out,
        "after:    {}   needs: {}   assignee: {}",
        list(&t.deps),
        list(&t.needs),
        t.assignee.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "priority: {}   size: {}   critical path: {}",
        t.priority, t.size, t.path
    );
    if !t.uses.is_empty() {
        let _ = writeln!(
            out,
            "uses:     {}",
            crate::state_cmds::uses_text(&t.uses).join(", ")
        );
    }
    if !s.blocked_by.is_empty() {
        let why: Vec<String> = s
            .blocked_by
            .iter()
            .map(|b| format!("{} {}", b.task, b.reason.as_str()))
            .collect();
        let _ = writeln!(out, "blocked by: {}", why.join(", "));
    }
    if let Some(ms) = t.due_ms {
        let _ = write!(
            out,
            "due:      {} per attempt, from its claim",
            huddle_core::config::format_duration(ms)
        );
        if let Some(at) = s.due_at {
            let _ = write!(out, " (this attempt by {})", format_time(at));
        }
        out.push('\n');
    }
    if let Some(at) = s.retry_at {
        let _ = writeln!(
            out,
            "back-off: attempt {} not before {}",
            t.attempts + 1,
            format_time(at)
        );
    }
    let _ = writeln!(out, "attempts: {} of {}", t.attempts, t.max_attempts);
    for a in &s.attempts {
        let outcome = match a.outcome {
            Outcome::Running => "running",
            Outcome::Completed => "completed",
            Outcome::Submitted => "submitted (waiting for the review)",
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
            Outcome::Released => "released",
            Outcome::Superseded => "superseded (its claim lapsed)",
        };
        let _ = write!(
            out,
            "  #{} {} (relay {}, epoch {}) claimed {}: {outcome}",
            a.attempt,
            a.agent,
            a.relay,
            a.epoch,
            format_time(a.claimed_at)
        );
        if let Some(ms) = a.duration_ms {
            let _ = write!(out, " after {:.1} s", ms as f64 / 1_000.0);
        }
        if let Some(reason) = &a.reason {
            let _ = write!(out, ": {reason}");
        }
        out.push('\n');
    }
    if let Some(reason) = t
        .last_reason
        .as_ref()
        .filter(|_| t.status != TaskStatus::Done)
    {
        let _ = writeln!(out, "last reason: {reason}");
    }
    match &t.result {
        Some(result) => {
            let _ = writeln!(out, "result:\n{result}");
        }
        None => {
            let _ = writeln!(out, "result:   -");
        }
    }
    out
}

/// `huddle task show ROOM ID [--json]`
pub async fn show(
    db: &str,
    options: StoreOptions,
    room: &str,
    id: &str,
    json: bool,
) -> anyhow::Result<()> {
    let s = collect(db, options, room, id).await?;
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&s)?));
    }
    emit(&render(&s))
}
