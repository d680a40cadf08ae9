//! Several scheduling passes' hand-outs and task results in one store round trip
//! (plan 0081).
//!
//! A relay under load runs a scheduling pass for nearly every event, and each pass
//! used to send its own writes: the result of the one turn that just ended, the
//! hand-off of the one task its agent takes next. A statement's cost is mostly fixed
//! (plan 0078), so the relay now keeps **one batch of task results and claim
//! acquisitions in flight at a time** (or up to the relay's `batches_in_flight`,
//! plan 0087): what passes produce meanwhile waits and goes together as the next,
//! and results are held a little longer
//! (`hold`, default 2 ms) while other task turns of the relay are still running, so
//! turns that end close together share one lot. Everything else a pass produces
//! (turn starts, renewals, releases, other writes) is performed at once, as before.
//!
//! Pure: which intents wait, in what order they go, and when.

use std::collections::HashSet;
use std::time::Duration;

use huddle_core::sync::Intent;
use tokio::time::Instant;

/// The intents waiting to be sent as one batch.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    queued: Vec<Intent>,
    /// When the first intent now waiting arrived.
    since: Option<Instant>,
    /// Whether a task result is waiting (only results are held).
    results: bool,
    /// A pass that had to keep its order went in whole: send in arrival order.
    in_order: bool,
    /// Claim keys the waiting intents acquire or write under.
    keys: HashSet<String>,
}

/// Whether `intent` is a task turn's result: an append under its turn's claims that
/// closes them and whose rows can be items of a lot.
fn is_task_result(intent: &Intent) -> bool {
    matches!(intent, Intent::Append { close: true, fences, batch }
        if !fences.is_empty() && crate::lots::lottable(batch))
}

fn batched(intent: &Intent) -> bool {
    matches!(intent, Intent::Acquire { .. }) || is_task_result(intent)
}

/// The claim keys an intent acquires, renews, releases or writes under.
fn keys(intent: &Intent) -> Vec<&str> {
    match intent {
        Intent::Acquire { key, then, .. } => {
            let mut v = vec![key.as_str()];
            v.extend(then.as_ref().map(|c| c.key.as_str()));
            v
        }
        Intent::Append { fences, .. } => fences.iter().map(|f| f.key.as_str()).collect(),
        Intent::Renew { key, .. } | Intent::Release { key, .. } => vec![key.as_str()],
        _ => Vec::new(),
    }
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Takes a pass's task results and acquisitions into the batch and returns the
    /// rest, to be performed at once in their order. A pass whose other intents
    /// renew or release a claim that a waiting or batched intent names goes into the
    /// batch whole, and the batch is then sent in arrival order: a claim's
    /// acquisition, result and release are never reordered.
    pub(crate) fn take(&mut self, pass: Vec<Intent>, now: Instant) -> Vec<Intent> {
        if !pass.iter().any(batched) {
            return pass;
        }
        let mut named: HashSet<&str> = self.keys.iter().map(String::as_str).collect();
        named.extend(pass.iter().filter(|i| batched(i)).flat_map(keys));
        let clash = pass.iter().any(|i| {
            matches!(i, Intent::Renew { .. } | Intent::Release { .. })
                && keys(i).iter().any(|k| named.contains(k))
        });
        let (into, rest): (Vec<Intent>, Vec<Intent>) = if clash {
            self.in_order = true;
            (pass, Vec::new())
        } else {
            pass.into_iter().partition(batched)
        };
        for i in &into {
            self.keys.extend(keys(i).into_iter().map(str::to_string));
            self.results |= is_task_result(i);
        }
        self.since.get_or_insert(now);
        self.queued.extend(into);
        rest
    }

    /// When the batch should be sent, if nothing is in flight: at once, or — while
    /// it holds a task result and other task turns run — `hold` after the first
    /// intent arrived. `None` when nothing waits.
    pub(crate) fn due(&self, hold: Duration, task_turns_running: bool) -> Option<Instant> {
        let since = self.since?;
        Some(if self.results && task_turns_running {
            since + hold
        } else {
            since
        })
    }

    /// Empties the batch: its intents in the order they go — every task result,
    /// then every acquisition (each kind in arrival order), or all in arrival order
    /// when a pass had to keep its order.
    pub(crate) fn drain(&mut self) -> Vec<Intent> {
        let in_order = self.in_order;
        let mut out = std::mem::take(&mut self.queued);
        *self = Batch::default();
        if !in_order {
            // Stable: results first, then the rest (acquisitions and, never
            // otherwise, nothing else).
            out.sort_by_key(|i| !is_task_result(i));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::sync::{ClaimEpoch, ClaimPurpose, ClaimRef};
    use huddle_core::{NewInteraction, Role, Verb};

    fn acquire(key: &str) -> Intent {
        Intent::Acquire {
            key: key.into(),
            holder: "a".into(),
            driver: Some("relay-t".into()),
            ttl: Duration::from_secs(30),
            purpose: ClaimPurpose::Task {
                room: "r".into(),
                task: key.into(),
                agent: "a".into(),
                generation: 0,
            },
            then: None,
            write: None,
        }
    }

    fn fence(key: &str) -> ClaimRef {
        ClaimRef {
            key: key.into(),
            holder: "a".into(),
            epoch: ClaimEpoch::FIRST,
        }
    }

    fn result(key: &str) -> Intent {
        Intent::Append {
            fences: vec![fence(key)],
            close: true,
            batch: vec![NewInteraction::new(
                "r",
                Verb::TaskCompleted,
                "a",
                Role::Agent,
                serde_json::json!({"task": key, "epoch": 1, "result": "ok"}),
            )],
        }
    }

    fn release(key: &str) -> Intent {
        Intent::Release {
            key: key.into(),
            holder: "a".into(),
            epoch: ClaimEpoch::FIRST,
        }
    }

    fn names(intents: &[Intent]) -> Vec<String> {
        intents
            .iter()
            .map(|i| match i {
                Intent::Acquire { key, .. } => format!("acquire {key}"),
                Intent::Append { fences, close, .. } => {
                    format!(
                        "append {} {close}",
                        fences.first().map_or("-", |f| f.key.as_str())
                    )
                }
                Intent::Release { key, .. } => format!("release {key}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn results_and_acquisitions_wait_and_go_results_first() {
        let t0 = Instant::now();
        let mut b = Batch::default();
        let rest = b.take(vec![result("t1"), release("x"), acquire("t2")], t0);
        assert_eq!(names(&rest), ["release x"]);
        let rest = b.take(
            vec![result("t3"), acquire("t4")],
            t0 + Duration::from_millis(1),
        );
        assert!(rest.is_empty());
        assert_eq!(
            names(&b.drain()),
            [
                "append t1 true",
                "append t3 true",
                "acquire t2",
                "acquire t4"
            ]
        );
        assert!(b.is_empty());
        assert_eq!(b.due(Duration::from_millis(2), true), None);
    }

    #[test]
    fn a_pass_without_results_or_acquisitions_goes_at_once() {
        let mut b = Batch::default();
        let unfenced = Intent::Append {
            fences: Vec::new(),
            close: false,
            batch: Vec::new(),
        };
        let rest = b.take(vec![release("x"), unfenced], Instant::now());
        assert_eq!(rest.len(), 2);
        assert!(b.is_empty());
    }

    #[test]
    fn a_release_of_a_waiting_claim_keeps_the_order_of_everything() {
        let t0 = Instant::now();
        let mut b = Batch::default();
        assert!(b.take(vec![acquire("k")], t0).is_empty());
        let rest = b.take(vec![result("t1"), release("k"), acquire("k2")], t0);
        assert!(rest.is_empty(), "the clashing pass waits whole");
        assert_eq!(
            names(&b.drain()),
            ["acquire k", "append t1 true", "release k", "acquire k2"]
        );
        // Within one pass, too.
        let rest = b.take(vec![acquire("k"), release("k")], t0);
        assert!(rest.is_empty());
        assert_eq!(names(&b.drain()), ["acquire k", "release k"]);
    }

    #[test]
    fn only_results_are_held_and_only_while_task_turns_run() {
        let t0 = Instant::now();
        let hold = Duration::from_millis(2);
        let mut b = Batch::default();
        b.take(vec![acquire("t1")], t0);
        assert_eq!(b.due(hold, true), Some(t0), "a hand-off alone goes at once");
        b.take(vec![result("t2")], t0 + Duration::from_millis(1));
        assert_eq!(
            b.due(hold, true),
            Some(t0 + hold),
            "held from the first arrival"
        );
        assert_eq!(b.due(hold, false), Some(t0), "no turn left to wait for");
    }
}
