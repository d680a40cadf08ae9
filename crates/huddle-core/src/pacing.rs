//! Pacing of work, read from the ledger and the config alone: the back-off between
//! attempts of a task, the per-agent circuit breaker, and attempt deadlines.
//!
//! Every function here is a function of folded rows (a task's `returned_at` and
//! attempts, an agent's [`FailStreak`], a claim's time) and of the room's config, so
//! every relay — and every reader, such as `huddle tasks` — computes the same times,
//! with no clock and no randomness of its own. The jitter of a back-off is a hash of
//! what it is about.
//!
//! - **Back-off.** A task given back (failed or released) is offered again only from
//!   `returned_at + backoff`, where `backoff = min(retry-backoff-max, retry-backoff ×
//!   2^(attempts − 1))` scaled by a factor in `[0.5, 1]` from a hash of the room, the
//!   task and the attempt count ([`retry_backoff_ms`]).
//! - **Circuit breaker.** An agent whose last `breaker` turns in a room failed is
//!   benched until `breaker-cooldown` after the last of them ([`benched_until`]); a
//!   success resets the run, so after the cool-down one trial turn decides (a further
//!   failure benches it again at once).
//! - **Deadlines.** An attempt of a task with `[due D]` is overdue `D` after its claim
//!   ([`attempt_due`]).

use crate::board::{BenchedLine, FailStreak, RoomBoard};
use crate::config::RoomConfig;
use crate::model::Timestamp;
use crate::tasks::{Task, TaskDag, TaskStatus};

fn ms_to_us(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000)
}

/// The jitter of a back-off in thousandths, 500..=1000: a hash of the room, the task
/// and the attempts used, so every relay computes the same and tasks that failed
/// together retry apart.
fn jitter_permille(room: &str, task: &str, attempts: u32) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"huddle.retry-backoff.v1\0");
    for part in [room.as_bytes(), task.as_bytes()] {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(&attempts.to_be_bytes());
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    500 + u64::from_be_bytes(first) % 501
}

/// The back-off after `attempts` attempts of `task` were used, ms: `retry-backoff`
/// doubled per attempt after the first, capped at `retry-backoff-max`, jittered to
/// between half and all of that. Zero when `retry-backoff` is 0 or no attempt ran.
pub fn retry_backoff_ms(config: &RoomConfig, room: &str, task: &str, attempts: u32) -> u64 {
    if attempts == 0 || config.retry_backoff_ms == 0 {
        return 0;
    }
    let doublings = (attempts - 1).min(40);
    let full = config
        .retry_backoff_ms
        .saturating_mul(1u64 << doublings)
        .min(config.retry_backoff_max_ms.max(config.retry_backoff_ms));
    let j = jitter_permille(room, task, attempts);
    u64::try_from(u128::from(full) * u128::from(j) / 1000).unwrap_or(u64::MAX)
}

/// When a task that was given back may be claimed again: its last give-back plus
/// its back-off. `None` unless it is open with a give-back (the first attempt never
/// waits, and a claimed, done or abandoned task has no next attempt to pace), and
/// `None` for the first attempt of a generation the owner's `!retry` opened (no claim
/// of it yet: the owner asked for it now).
pub fn retry_at(config: &RoomConfig, room: &str, task: &Task) -> Option<Timestamp> {
    if task.status != TaskStatus::Open || task.attempts == 0 || task.epoch.is_none() {
        return None;
    }
    let back = task.returned_at?;
    let ms = retry_backoff_ms(config, room, &task.id, task.attempts);
    (ms > 0).then(|| back.saturating_add(ms_to_us(ms)))
}

/// Whether `task` is still waiting out its back-off at `now`.
pub fn backing_off(config: &RoomConfig, room: &str, task: &Task, now: Timestamp) -> bool {
    retry_at(config, room, task).is_some_and(|at| now < at)
}

/// When the current attempt of a claimed task with a deadline is overdue: its claim
/// plus the task's `due`. `None` for a task without a deadline or not claimed.
pub fn attempt_due(task: &Task) -> Option<Timestamp> {
    if task.status != TaskStatus::Claimed {
        return None;
    }
    Some(task.claimed_at?.saturating_add(ms_to_us(task.due_ms?)))
}

/// Until when an agent with this streak is benched: `breaker-cooldown` after its last
/// failure, once `breaker` turns in a row failed. `None`: not benched (or the breaker
/// is off).
pub fn benched_until(config: &RoomConfig, streak: &FailStreak) -> Option<Timestamp> {
    (config.breaker > 0 && streak.failed >= config.breaker).then(|| {
        streak
            .last
            .saturating_add(ms_to_us(config.breaker_cooldown_ms))
    })
}

/// Whether `agent` is benched in this room at `now`.
pub fn is_benched(
    board: Option<&RoomBoard>,
    config: &RoomConfig,
    agent: &str,
    now: Timestamp,
) -> bool {
    board
        .and_then(|b| b.failing.get(agent))
        .and_then(|s| benched_until(config, s))
        .is_some_and(|until| now < until)
}

/// The agents of a room benched at `now`, by name (for the `<coordination>` block,
/// the board and `huddle status`).
pub fn benched(board: Option<&RoomBoard>, config: &RoomConfig, now: Timestamp) -> Vec<BenchedLine> {
    let Some(b) = board else {
        return Vec::new();
    };
    b.failing
        .iter()
        .filter_map(|(agent, s)| {
            let until = benched_until(config, s).filter(|u| now < *u)?;
            Some(BenchedLine {
                agent: agent.clone(),
                failed: s.failed,
                until,
            })
        })
        .collect()
}

/// A task that cannot make progress as things stand, and why (for the board).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StuckTask {
    /// The task.
    pub task: String,
    /// Why, in words: `blocked by research (abandoned)`, `needs sql: no agent in the
    /// room declares it`.
    pub reason: String,
}

/// The room's stuck tasks, by id: open tasks that can never run (a dependency
/// abandoned, missing or itself blocked — [`TaskDag::blocked_by`]) and ready tasks
/// whose `needs` no registered agent of the room declares. Costs the room's tasks: a
/// reader's view (`huddle board`), not a relay's per-event work.
pub fn stuck_tasks(dag: &TaskDag, room: &str, board: Option<&RoomBoard>) -> Vec<StuckTask> {
    let Some(r) = dag.room(room) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in r.tasks.values().filter(|t| t.status == TaskStatus::Open) {
        let blocked = dag.blocked_by(room, &t.id);
        if !blocked.is_empty() {
            let why: Vec<String> = blocked
                .iter()
                .map(|b| format!("{} ({})", b.task, b.reason.as_str()))
                .collect();
            out.push(StuckTask {
                task: t.id.clone(),
                reason: format!("blocked by {}", why.join(", ")),
            });
            continue;
        }
        if t.needs.is_empty() || !dag.is_ready(room, &t.id) {
            continue;
        }
        let capable = board.is_some_and(|b| {
            b.agents
                .values()
                .any(|a| t.needs.iter().all(|n| a.capabilities.contains(n)))
        });
        if !capable {
            out.push(StuckTask {
                task: t.id.clone(),
                reason: format!(
                    "needs {}: no agent in the room declares {}",
                    t.needs.join(", "),
                    if t.needs.len() == 1 { "it" } else { "them all" }
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base: u64, max: u64) -> RoomConfig {
        RoomConfig {
            retry_backoff_ms: base,
            retry_backoff_max_ms: max,
            ..RoomConfig::default()
        }
    }

    #[test]
    fn back_off_doubles_is_capped_and_jittered_deterministically() {
        let c = config(1_000, 10_000);
        for attempts in 1..=8u32 {
            let full = (1_000u64 << (attempts - 1)).min(10_000);
            let got = retry_backoff_ms(&c, "lobby", "t", attempts);
            assert!(
                (full / 2..=full).contains(&got),
                "attempt {attempts}: {got} not within [{}, {full}]",
                full / 2
            );
            // The same inputs always give the same back-off.
            assert_eq!(got, retry_backoff_ms(&c, "lobby", "t", attempts));
        }
        // Different tasks spread out (some pair differs).
        let spread: std::collections::BTreeSet<u64> = (0..20)
            .map(|i| retry_backoff_ms(&c, "lobby", &format!("t{i}"), 1))
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
        assert_eq!(retry_backoff_ms(&c, "lobby", "t", 0), 0);
        assert_eq!(retry_backoff_ms(&config(0, 10_000), "lobby", "t", 3), 0);
        // Huge attempt counts saturate at the cap instead of overflowing.
        assert!(retry_backoff_ms(&c, "lobby", "t", u32::MAX) <= 10_000);
    }

    #[test]
    fn stuck_tasks_name_their_blockers_and_missing_capabilities() {
        use crate::fold::Fold;
        use crate::model::Role;
        use crate::testing::{claimed, created, failed, ix, Ledger};
        use crate::verbs::Verb;
        use serde_json::json;
        let rows = vec![
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "x", "max_attempts": 1}),
            ),
            claimed("a", "bo", 1),
            failed("a", "bo", 1),
            created("b", &["a"]),
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "c", "label": "x", "needs": ["sql"]}),
            ),
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "d", "label": "x", "needs": ["rust"]}),
            ),
            created("e", &[]),
            ix(
                Verb::AgentRegistered,
                "bo",
                Role::Agent,
                json!({"capabilities": ["rust"]}),
            ),
        ];
        let mut l = Ledger::default();
        for (n, r) in rows.into_iter().enumerate() {
            l.push(r, Timestamp((n as i64 + 1) * 1_000_000));
        }
        let dag = TaskDag::rebuild(&l.rows);
        let board = crate::board::Board::rebuild(&l.rows);
        let stuck = stuck_tasks(&dag, "lobby", board.room("lobby"));
        let got: Vec<(&str, &str)> = stuck
            .iter()
            .map(|s| (s.task.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("b", "blocked by a (abandoned)"),
                ("c", "needs sql: no agent in the room declares it"),
            ]
        );
    }

    #[test]
    fn the_breaker_benches_after_n_failures_for_the_cooldown() {
        let c = RoomConfig {
            breaker: 3,
            breaker_cooldown_ms: 60_000,
            ..RoomConfig::default()
        };
        let s = |failed| FailStreak {
            failed,
            last: Timestamp(1_000_000),
        };
        assert_eq!(benched_until(&c, &s(2)), None);
        assert_eq!(benched_until(&c, &s(3)), Some(Timestamp(61_000_000)));
        assert_eq!(benched_until(&c, &s(7)), Some(Timestamp(61_000_000)));
        let off = RoomConfig {
            breaker: 0,
            ..c.clone()
        };
        assert_eq!(benched_until(&off, &s(50)), None);
    }
}
