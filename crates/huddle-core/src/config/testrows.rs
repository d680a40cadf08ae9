//! Test helper: ledger rows with chosen positions and times.

use serde_json::Value;

use crate::model::{Interaction, NewInteraction, Position, Role, Timestamp};
use crate::verbs::Verb;

/// A row as a backend would return it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row(
    pos: u64,
    at: Timestamp,
    room: &str,
    thread: Option<&str>,
    verb: Verb,
    actor: &str,
    role: Role,
    body: Value,
) -> Interaction {
    let mut n = NewInteraction::new(room, verb, actor, role, body);
    n.thread = thread.map(str::to_string);
    Interaction {
        id: n.id(),
        position: Position::new(0, pos),
        at,
        relay: "test-relay".into(),
        room: n.room,
        thread: n.thread,
        verb: n.verb,
        actor: n.actor,
        role: n.role,
        parent: None,
        caused_by: Vec::new(),
        body: n.body,
    }
}
