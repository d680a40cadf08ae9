//! Packing task turns' rows into lots (plan 0080, stage 2): what the executor writes
//! together as one `task.lot` row instead of one transaction of rows per turn.
//!
//! Pure: which writes go together and the lot rows they make. A lot is all or
//! nothing, so the executor falls back to the writes one by one when a lot is
//! refused (one of its claims lost), and every write keeps its own outcome.

use huddle_core::model::{LOT_ITEM_VERBS, MAX_LOT_ITEMS};
use huddle_core::{Limits, NewInteraction, Role};

/// The share of the body limit a lot is filled to: its items' bodies, encoded,
/// with room for their other fields.
const FILL: usize = 2;
/// What an item's fields other than its body take in a lot, at most (names are at
/// most `max_name_bytes`, ids 64 hex digits).
fn item_overhead(limits: &Limits, item: &NewInteraction) -> usize {
    64 + 3 * limits.max_name_bytes + 66 * (1 + item.caused_by.len())
}

/// Whether `rows` can be items of a lot: all of one room, task turn rows by agents,
/// without idempotency keys.
pub(crate) fn lottable(rows: &[NewInteraction]) -> bool {
    let Some(first) = rows.first() else {
        return false;
    };
    rows.iter().all(|r| {
        r.room == first.room
            && r.role == Role::Agent
            && r.idempotency_key.is_none()
            && LOT_ITEM_VERBS.contains(&r.verb)
    })
}

/// A lot to write: the writes it carries (indices into what was packed) and its row.
#[derive(Debug)]
pub(crate) struct Lot {
    /// The writes it stands for, in order.
    pub members: Vec<usize>,
    /// The `task.lot` row.
    pub row: NewInteraction,
}

/// Packs `writes` (each the rows of one turn's write) into lots of at least two
/// writes each, by room, in order, within the lot's item and size limits; the rest
/// (not lottable, alone in their room, or a lot that would not validate) are left
/// for one write each. Returns the lots and the indices left.
pub(crate) fn pack(
    writes: &[&[NewInteraction]],
    writer: &str,
    limits: &Limits,
) -> (Vec<Lot>, Vec<usize>) {
    let budget = limits.max_body_bytes / FILL;
    // Open groups by room, in the order rooms first appear.
    let mut groups: Vec<(String, Vec<usize>, usize, usize)> = Vec::new();
    let mut closed: Vec<Vec<usize>> = Vec::new();
    let mut left = Vec::new();
    for (i, rows) in writes.iter().enumerate() {
        if !lottable(rows) {
            left.push(i);
            continue;
        }
        let size: usize = rows
            .iter()
            .map(|r| r.body_text().len() + item_overhead(limits, r))
            .sum();
        if size > budget || rows.len() > MAX_LOT_ITEMS {
            left.push(i);
            continue;
        }
        let room = &rows[0].room;
        let slot = match groups.iter().position(|g| &g.0 == room) {
            Some(g) => g,
            None => {
                groups.push((room.clone(), Vec::new(), 0, 0));
                groups.len() - 1
            }
        };
        let g = &mut groups[slot];
        if g.2 + size > budget || g.3 + rows.len() > MAX_LOT_ITEMS {
            closed.push(std::mem::take(&mut g.1));
            g.2 = 0;
            g.3 = 0;
        }
        g.1.push(i);
        g.2 += size;
        g.3 += rows.len();
    }
    closed.extend(groups.into_iter().map(|g| g.1));
    let mut lots = Vec::new();
    for members in closed {
        if members.len() < 2 {
            left.extend(members);
            continue;
        }
        let items: Vec<&NewInteraction> = members.iter().flat_map(|&i| writes[i]).collect();
        match NewInteraction::lot_of(&items[0].room, writer, items.iter().copied(), limits) {
            Ok(row) => lots.push(Lot { members, row }),
            Err(e) => {
                tracing::debug!(error = %e, "these writes do not make a lot; written one by one");
                left.extend(members);
            }
        }
    }
    left.sort_unstable();
    (lots, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::Verb;
    use serde_json::json;

    fn row(room: &str, verb: Verb, agent: &str, text: &str) -> NewInteraction {
        NewInteraction::new(
            room,
            verb,
            agent,
            Role::Agent,
            json!({ "task": "t", "epoch": 1, "result": text }),
        )
    }

    fn result(room: &str, agent: &str) -> Vec<NewInteraction> {
        vec![
            row(room, Verb::TaskCompleted, agent, "done"),
            row(room, Verb::TurnReplied, agent, "done"),
        ]
    }

    #[test]
    fn writes_of_one_room_go_together_and_the_rest_alone() {
        let reply = vec![
            row("r", Verb::MessagePosted, "ann", "hi"),
            row("r", Verb::TurnReplied, "ann", "hi"),
        ];
        let keyed = vec![row("r", Verb::TaskCompleted, "bob", "x").with_idempotency_key("k")];
        let writes = [
            result("r", "a1"),
            reply,
            result("s", "a2"),
            result("r", "a3"),
            keyed,
            result("r", "a4"),
        ];
        let refs: Vec<&[NewInteraction]> = writes.iter().map(Vec::as_slice).collect();
        let (lots, left) = pack(&refs, "relay-1", &Limits::default());
        assert_eq!(lots.len(), 1);
        assert_eq!(lots[0].members, vec![0, 3, 5]);
        assert_eq!(lots[0].row.verb, Verb::TaskLot);
        assert_eq!(lots[0].row.actor, "relay-1");
        // The lot stands for its members' rows, in order.
        let items: Vec<NewInteraction> = [0, 3, 5]
            .iter()
            .flat_map(|&i| writes[i].iter().cloned())
            .collect();
        assert_eq!(
            lots[0].row,
            NewInteraction::lot("r", "relay-1", &items, &Limits::default()).unwrap()
        );
        // A reply's rows, a keyed row and a lone room's write are written alone.
        assert_eq!(left, vec![1, 2, 4]);
    }

    #[test]
    fn a_lot_stays_within_its_item_and_size_limits() {
        let writes: Vec<Vec<NewInteraction>> =
            (0..40).map(|i| result("r", &format!("a{i}"))).collect();
        let refs: Vec<&[NewInteraction]> = writes.iter().map(Vec::as_slice).collect();
        let (lots, left) = pack(&refs, "relay-1", &Limits::default());
        assert!(left.is_empty());
        assert_eq!(
            lots.iter().map(|l| l.members.len()).collect::<Vec<_>>(),
            vec![32, 8],
            "64 items at most"
        );
        // Big results: the body limit splits them.
        let big = "x".repeat(40 * 1024);
        let writes: Vec<Vec<NewInteraction>> = (0..6)
            .map(|i| {
                vec![
                    row("r", Verb::TaskCompleted, &format!("a{i}"), &big),
                    row("r", Verb::TurnReplied, &format!("a{i}"), "ok"),
                ]
            })
            .collect();
        let refs: Vec<&[NewInteraction]> = writes.iter().map(Vec::as_slice).collect();
        let limits = Limits::default();
        let (lots, left) = pack(&refs, "relay-1", &limits);
        assert!(lots.len() >= 2, "{} lots", lots.len());
        for lot in &lots {
            assert!(lot.row.body_text().len() <= limits.max_body_bytes);
        }
        let packed: usize = lots.iter().map(|l| l.members.len()).sum();
        assert_eq!(packed + left.len(), 6);
        // One write alone makes no lot.
        let one = [result("r", "a1")];
        let refs: Vec<&[NewInteraction]> = one.iter().map(Vec::as_slice).collect();
        let (lots, left) = pack(&refs, "relay-1", &Limits::default());
        assert!(lots.is_empty());
        assert_eq!(left, vec![0]);
    }
}
