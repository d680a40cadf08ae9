//! Task lots (plan 0080): a ledger whose task turns' rows are carried in `task.lot`
//! rows folds to the same state as the same rows written one by one. The folds hold
//! no ledger positions, so sharing one position among a lot's items changes nothing.

use huddle_core::board::Board;
use huddle_core::tasks::{TaskClaimedBody, TaskCompletedBody, TaskEndedBody};
use huddle_core::{
    ClaimEpoch, Fold, Interaction, Limits, NewInteraction, Position, RawRow, Role, TaskDag,
    Timestamp, Verb,
};
use proptest::prelude::*;
use serde_json::json;

const ROOM: &str = "r";

/// What happens to one task: the attempts that fail, then whether the last one ends.
#[derive(Clone, Debug)]
struct Script {
    failures: u8,
    completes: bool,
}

/// The rows of task `k` under `script`, in the order its relay would write them.
fn task_rows(k: usize, script: &Script) -> Vec<NewInteraction> {
    let task = format!("t{k}");
    let agent = format!("a{}", k % 3);
    let row = |verb, body| NewInteraction::new(ROOM, verb, agent.as_str(), Role::Agent, body);
    let mut rows = Vec::new();
    let attempts = u64::from(script.failures) + 1;
    for attempt in 1..=attempts {
        let epoch = ClaimEpoch(i64::try_from(attempt).expect("small"));
        let claimed = row(
            Verb::TaskClaimed,
            TaskClaimedBody {
                task: task.clone(),
                epoch,
                attempt: u32::try_from(attempt).expect("small"),
                generation: 0,
            }
            .to_body(),
        );
        let prompted = row(
            Verb::TurnPrompted,
            json!({ "turn": format!("{task}-{attempt}"), "subject": task }),
        )
        .with_parent(claimed.id());
        let last = attempt == attempts;
        let (ended, turn_end) = if !last {
            (
                row(
                    Verb::TaskFailed,
                    TaskEndedBody {
                        task: task.clone(),
                        epoch,
                        reason: "no".into(),
                        generation: 0,
                    }
                    .to_body(),
                ),
                Verb::TurnFailed,
            )
        } else if script.completes {
            (
                row(
                    Verb::TaskCompleted,
                    TaskCompletedBody {
                        task: task.clone(),
                        epoch,
                        result: Some(format!("done {task}")),
                        tokens: None,
                        generation: 0,
                    }
                    .to_body(),
                ),
                Verb::TurnReplied,
            )
        } else {
            rows.push(claimed);
            rows.push(prompted);
            break;
        };
        let turn_end = row(turn_end, json!({ "turn": format!("{task}-{attempt}") }))
            .with_parent(prompted.id());
        rows.extend([claimed, prompted, ended, turn_end]);
    }
    rows
}

/// The stored row of `n` at `seq`, written by a transaction at `at`, as a store
/// would return it before verifying.
fn stored(n: &NewInteraction, seq: u64, at: Timestamp) -> RawRow {
    let (id, body) = n.checked(&Limits::default()).expect("valid");
    RawRow {
        id: id.0.to_vec(),
        position: Position::new(0, seq),
        at,
        relay: "relay0".into(),
        room: n.room.clone(),
        thread: n.thread.clone(),
        verb: n.verb.as_str().into(),
        actor: n.actor.clone(),
        role: n.role.as_str().into(),
        parent: n.parent.map(|p| p.0.to_vec()),
        caused_by: n.caused_by.iter().map(|c| c.0.to_vec()).collect(),
        body,
        sig: None,
    }
}

/// What readers get from `batches` written one transaction each (the rows of a
/// transaction share its time): as rows, or each batch of turn rows as one lot.
fn read(batches: &[Vec<NewInteraction>], as_lots: bool) -> Vec<Interaction> {
    let mut out = Vec::new();
    let mut seq = 0;
    for (batch, t) in batches.iter().zip(1..) {
        let at = Timestamp(1_700_000_000_000_000 + t * 1_000);
        let lot = as_lots && batch[0].verb != Verb::TaskCreated;
        let rows = if lot {
            vec![
                NewInteraction::lot(ROOM, "relay0", batch, &Limits::default())
                    .expect("a valid lot"),
            ]
        } else {
            batch.clone()
        };
        for n in &rows {
            seq += 1;
            stored(n, seq, at).read_into(&mut out).expect("a good row");
        }
    }
    out
}

fn folds(rows: &[Interaction]) -> ([u8; 32], [u8; 32]) {
    (
        TaskDag::rebuild(rows).state_hash(),
        Board::rebuild(rows).state_hash(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Tasks created, then their turns interleaved as relays would write them; some
    /// runs of turn rows packed into lots of random sizes. Readers of both ledgers see
    /// the same interactions, in the same order, and every fold the same state.
    #[test]
    fn a_ledger_with_lots_folds_as_the_same_rows_one_by_one(
        scripts in proptest::collection::vec(
            (0u8..3, any::<bool>()).prop_map(|(failures, completes)| Script { failures, completes }),
            1..12,
        ),
        order in proptest::collection::vec(any::<u16>(), 0..200),
        cuts in proptest::collection::vec(1usize..9, 1..200),
    ) {
        let mut rows: Vec<NewInteraction> = (0..scripts.len())
            .map(|k| NewInteraction::new(
                ROOM,
                Verb::TaskCreated,
                "olga",
                Role::Owner,
                json!({ "task": format!("t{k}"), "label": format!("task {k}") }),
            ))
            .collect();
        // Interleave the tasks' rows, each task's in its own order.
        let mut queues: Vec<std::collections::VecDeque<NewInteraction>> = scripts
            .iter()
            .enumerate()
            .map(|(k, s)| task_rows(k, s).into())
            .collect();
        let mut picks = order.iter().cycle();
        while queues.iter().any(|q| !q.is_empty()) {
            let live: Vec<usize> = (0..queues.len()).filter(|&k| !queues[k].is_empty()).collect();
            let k = live[usize::from(*picks.next().unwrap_or(&0)) % live.len()];
            rows.extend(queues[k].pop_front());
        }
        // One transaction per created task, and per run of turn rows of the sizes
        // `cuts` gives.
        let mut batches: Vec<Vec<NewInteraction>> = Vec::new();
        let mut cut = cuts.iter().cycle();
        let mut i = 0;
        while i < rows.len() {
            if rows[i].verb == Verb::TaskCreated {
                batches.push(vec![rows[i].clone()]);
                i += 1;
                continue;
            }
            let want = *cut.next().unwrap_or(&1);
            let mut end = i;
            while end < rows.len() && end - i < want && rows[end].verb != Verb::TaskCreated {
                end += 1;
            }
            batches.push(rows[i..end].to_vec());
            i = end;
        }
        let plain = read(&batches, false);
        let unpacked = read(&batches, true);

        prop_assert_eq!(
            plain.iter().map(|r| r.content()).collect::<Vec<_>>(),
            unpacked.iter().map(|r| r.content()).collect::<Vec<_>>()
        );
        prop_assert_eq!(
            plain.iter().map(|r| r.id).collect::<Vec<_>>(),
            unpacked.iter().map(|r| r.id).collect::<Vec<_>>()
        );
        prop_assert_eq!(folds(&plain), folds(&unpacked));
        // And the folds saw something: every script's task is known, the done ones done.
        let dag = TaskDag::rebuild(&unpacked);
        let done = scripts.iter().filter(|s| s.completes).count();
        prop_assert_eq!(dag.summary(ROOM).done, done);
    }
}
