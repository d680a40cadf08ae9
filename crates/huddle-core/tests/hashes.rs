//! Hashes that other relays and stored ledgers depend on.
//!
//! - An interaction's id is the blake3 hash of its canonical encoding, and every row
//!   already written is checked against it on read: an encoding change would make
//!   every stored row "corrupt". A known interaction is pinned here to its id, so such
//!   a change fails a test instead of a deployment.
//! - A fold's state hash is how relays check they converged; it is worth something only
//!   if different states hash differently.

use std::collections::BTreeMap;

use huddle_core::{
    Fold, Interaction, InteractionId, NewInteraction, Position, Role, TaskDag, Verb,
};
use serde_json::json;

/// An interaction that uses every hashed field: thread, parent, several causes, and a
/// body with nested values, unicode and keys out of order.
fn known() -> NewInteraction {
    NewInteraction::new(
        "lobby",
        Verb::TaskCreated,
        "ana",
        Role::Owner,
        json!({
            "task": "t1",
            "label": "write the plan ✓",
            "deps": ["t0"],
            "needs": ["rust"],
            "max_attempts": 3,
        }),
    )
    .in_thread("design")
    .with_parent(InteractionId([0x11; 32]))
    .with_caused_by(vec![InteractionId([0x22; 32]), InteractionId([0x33; 32])])
}

#[test]
fn a_known_interaction_keeps_its_id() {
    let n = known();
    assert_eq!(
        n.body_text(),
        r#"{"deps":["t0"],"label":"write the plan ✓","max_attempts":3,"needs":["rust"],"task":"t1"}"#,
        "the canonical body: sorted keys, no whitespace, unicode as is"
    );
    assert_eq!(
        n.id().to_hex(),
        "0e738e48ec8b3d5a5a3933714045e6e280016125ac54a2bf697d089dd42e7230",
        "the id of a known interaction changed: the canonical encoding is not what \
         stored ledgers were written with"
    );
    // The idempotency key is not content.
    assert_eq!(n.clone().with_idempotency_key("k").id(), n.id());
}

/// `n` as read back from the ledger at `(0, seq)`.
fn read_back(n: NewInteraction, seq: u64) -> Interaction {
    let id = n.id();
    Interaction::as_read(
        n,
        id,
        Position::new(0, seq),
        huddle_core::Timestamp(1_700_000_000_000_000 + seq as i64 * 1_000),
        "relay0",
        None,
    )
}

fn ledger(rows: Vec<NewInteraction>) -> Vec<Interaction> {
    rows.into_iter()
        .zip(1..)
        .map(|(n, seq)| read_back(n, seq))
        .collect()
}

fn created(room: &str, task: &str, label: &str) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::TaskCreated,
        "ana",
        Role::Owner,
        json!({ "task": task, "label": label }),
    )
}

fn claimed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    NewInteraction::new(
        "lobby",
        Verb::TaskClaimed,
        agent,
        Role::Agent,
        json!({ "task": task, "epoch": epoch, "attempt": 1 }),
    )
}

#[test]
fn different_task_dags_hash_differently() {
    let states: Vec<(&str, Vec<NewInteraction>)> = vec![
        ("empty", vec![]),
        ("one task", vec![created("lobby", "t1", "plan")]),
        ("another label", vec![created("lobby", "t1", "build")]),
        ("another room", vec![created("attic", "t1", "plan")]),
        (
            "two tasks",
            vec![
                created("lobby", "t1", "plan"),
                created("lobby", "t2", "plan"),
            ],
        ),
        (
            "claimed",
            vec![created("lobby", "t1", "plan"), claimed("t1", "bo", 1)],
        ),
        (
            "claimed by another agent",
            vec![created("lobby", "t1", "plan"), claimed("t1", "cy", 1)],
        ),
        (
            "claimed at another epoch",
            vec![created("lobby", "t1", "plan"), claimed("t1", "bo", 2)],
        ),
    ];
    let mut seen: BTreeMap<[u8; 32], &str> = BTreeMap::new();
    for (name, rows) in states {
        let rows = ledger(rows);
        let hash = TaskDag::rebuild(&rows).state_hash();
        // Equal states hash equally, so a difference below is the state's, not noise.
        assert_eq!(TaskDag::rebuild(&rows).state_hash(), hash, "{name}");
        if let Some(other) = seen.insert(hash, name) {
            panic!("\"{name}\" and \"{other}\" have the same state hash");
        }
    }
}
