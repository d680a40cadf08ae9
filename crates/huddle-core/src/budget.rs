//! Per-room token budgets.
//!
//! Every agent turn reports the tokens it used in the `tokens` field of its
//! `turn.replied` or `turn.failed` body, as a number or as `{"input": n, "output": m}`.
//! The fold sums them per room (and per agent, for reports). The budget itself is room
//! configuration ([`crate::config::RoomConfig::budget`]) and is passed in:
//! [`BudgetFold::budget_allows_new_claims`] is false once the room has spent its budget, so
//! the scheduler stops starting work. Turns already running are not cut off, so a room
//! can overshoot by what its in-flight turns use; it never starts more.
//!
//! Sums are commutative, so the state does not depend on how actors' rows interleave.
//! A turn that reports nothing is counted as unreported; a `tokens` field that is not
//! a non-negative integer (or a well-formed split) is counted as malformed and adds
//! nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::model::Interaction;
use crate::protocol::carried_turn;
use crate::verbs::Verb;

pub use crate::protocol::turn::{TokensBody, TurnUsageBody};

/// Token use of one room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomSpend {
    /// Tokens spent in the room.
    pub spent: u64,
    /// Tokens per agent.
    pub by_agent: BTreeMap<String, u64>,
    /// Turns that reported tokens.
    pub reported_turns: u64,
    /// Turns that reported nothing.
    pub unreported_turns: u64,
    /// Turns whose `tokens` field was malformed (ignored).
    pub malformed: u64,
}

/// A room's budget at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BudgetStatus {
    /// Tokens spent.
    pub spent: u64,
    /// The budget; `None` is unlimited.
    pub budget: Option<u64>,
    /// Tokens left; `None` when unlimited.
    pub remaining: Option<u64>,
    /// Whether new claims are allowed.
    pub allows_new_claims: bool,
}

/// Token spend of every room, folded from `turn.replied` and `turn.failed`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetFold {
    rooms: BTreeMap<String, RoomSpend>,
}

impl BudgetFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// A room's token use (all zero for a room with no turns).
    pub fn room(&self, room: &str) -> RoomSpend {
        self.rooms.get(room).cloned().unwrap_or_default()
    }

    /// Tokens spent in a room.
    pub fn spent(&self, room: &str) -> u64 {
        self.rooms.get(room).map_or(0, |r| r.spent)
    }

    /// Whether the scheduler may start new claims in `room` under `budget`
    /// (`RoomConfig::budget`; `None` is unlimited): true while spent < budget.
    pub fn budget_allows_new_claims(&self, room: &str, budget: Option<u64>) -> bool {
        budget.is_none_or(|b| self.spent(room) < b)
    }

    /// The room's budget status under `budget`.
    pub fn status(&self, room: &str, budget: Option<u64>) -> BudgetStatus {
        let spent = self.spent(room);
        BudgetStatus {
            spent,
            budget,
            remaining: budget.map(|b| b.saturating_sub(spent)),
            allows_new_claims: self.budget_allows_new_claims(room, budget),
        }
    }
}

impl Fold for BudgetFold {
    fn apply(&mut self, i: &Interaction) {
        // A turn's end: its `turn.*` row, or the task row carrying it (plan 0095; a
        // task row's own `tokens` are not counted, only its turn's).
        let Some((_, body)) = carried_turn(i.verb, &i.body)
            .filter(|(v, _)| matches!(v, Verb::TurnReplied | Verb::TurnFailed))
        else {
            return;
        };
        let room = self.rooms.entry(i.room.clone()).or_default();
        // Read `tokens` alone, so the rest of the body (owned by others) never makes
        // this fold fail.
        let tokens = match body.get("tokens") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => match TokensBody::deserialize(v) {
                Ok(t) => Some(t.total()),
                Err(_) => {
                    room.malformed += 1;
                    return;
                }
            },
        };
        match tokens {
            None => room.unreported_turns += 1,
            Some(n) => {
                room.reported_turns += 1;
                room.spent = room.spent.saturating_add(n);
                let agent = room.by_agent.entry(i.actor.clone()).or_insert(0);
                *agent = agent.saturating_add(n);
            }
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Role, Timestamp};
    use crate::testing::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ROOM: &str = "lab";
    const T0: Timestamp = Timestamp(1_700_000_000 * SEC);

    fn turn(who: &str, verb: Verb, body: serde_json::Value) -> Interaction {
        row(ROOM, verb, who, Role::Agent, T0, body)
    }

    #[test]
    fn spend_is_summed_and_stops_new_claims_at_the_budget() {
        let rows = positioned(vec![
            turn(
                "a",
                Verb::TurnReplied,
                json!({"text": "done", "tokens": 600}),
            ),
            turn(
                "b",
                Verb::TurnFailed,
                json!({"error": "exit 1", "tokens": {"input": 250, "output": 100}}),
            ),
            turn("a", Verb::TurnReplied, json!({"text": "no usage"})),
            turn("a", Verb::MessagePosted, json!({"tokens": 1_000_000})),
        ]);
        let f: BudgetFold = fold_checked(&rows);
        let r = f.room(ROOM);
        assert_eq!(r.spent, 950);
        assert_eq!(r.by_agent["a"], 600);
        assert_eq!((r.reported_turns, r.unreported_turns), (2, 1));
        assert!(f.budget_allows_new_claims(ROOM, None));
        assert!(f.budget_allows_new_claims(ROOM, Some(951)));
        assert!(!f.budget_allows_new_claims(ROOM, Some(950)));
        assert!(!f.budget_allows_new_claims(ROOM, Some(0)));
        assert_eq!(f.status(ROOM, Some(1_000)).remaining, Some(50));
        assert_eq!(f.status(ROOM, Some(10)).remaining, Some(0));
        assert!(f.budget_allows_new_claims("other-room", Some(1)));
    }

    #[test]
    fn malformed_tokens_are_ignored_and_counted() {
        let bad = [
            json!({"tokens": -5}),
            json!({"tokens": 1.5}),
            json!({"tokens": "100"}),
            json!({"tokens": {"input": 1}}),
            json!({"tokens": [1]}),
        ];
        let rows: Vec<Interaction> = bad
            .iter()
            .map(|b| turn("a", Verb::TurnReplied, b.clone()))
            .chain([turn("a", Verb::TurnReplied, json!("not an object"))])
            .collect();
        let f = BudgetFold::rebuild(&positioned(rows));
        let r = f.room(ROOM);
        assert_eq!(r.malformed, bad.len() as u64);
        assert_eq!(r.spent, 0);
        assert_eq!(r.unreported_turns, 1);
    }

    #[test]
    fn huge_reports_saturate_instead_of_overflowing() {
        let rows = positioned(vec![
            turn("a", Verb::TurnReplied, json!({"tokens": u64::MAX})),
            turn("a", Verb::TurnReplied, json!({"tokens": u64::MAX})),
        ]);
        let f = BudgetFold::rebuild(&rows);
        assert_eq!(f.spent(ROOM), u64::MAX);
        assert!(!f.budget_allows_new_claims(ROOM, Some(u64::MAX)));
    }

    fn turns() -> impl Strategy<Value = Vec<Interaction>> {
        let who = prop::sample::select(vec!["a", "b", "c"]);
        let t = (who, prop::option::of(0u64..10_000), any::<bool>()).prop_map(|(w, n, ok)| {
            let verb = if ok {
                Verb::TurnReplied
            } else {
                Verb::TurnFailed
            };
            turn(w, verb, json!({ "tokens": n }))
        });
        prop::collection::vec(t, 0..30)
    }

    proptest! {
        /// The state hash does not depend on how actors' rows interleave.
        #[test]
        fn any_interleaving_gives_the_same_state(
            (rows, shuffled) in turns().prop_flat_map(|rows| (Just(rows.clone()), interleaving(rows))),
        ) {
            let reference = BudgetFold::rebuild(&positioned(rows)).state_hash();
            prop_assert_eq!(BudgetFold::rebuild(&shuffled).state_hash(), reference);
        }

        /// Once a budget stops new claims, further turns never reopen it.
        #[test]
        fn a_spent_budget_stays_spent(rows in turns(), budget in 0u64..50_000) {
            let mut f = BudgetFold::new();
            let mut stopped = false;
            for r in positioned(rows) {
                f.apply(&r);
                let allows = f.budget_allows_new_claims(ROOM, Some(budget));
                prop_assert!(!(stopped && allows));
                stopped |= !allows;
            }
        }
    }
}
