//! The ledger-derived state of a [`Synchronizer`], saved and restored (plan 0063).
//!
//! A relay that restarts resumes from the state it saved instead of folding its rooms
//! from the first row. What is saved is what the rows made of the synchronizer, and
//! nothing the relay did itself: claims, turns, unconfirmed writes, clocks and the
//! walk orders derived from the DAG are left out, exactly as a relay starting from
//! the first row has none of them. [`Synchronizer::save_state`] names every field of
//! the synchronizer, so a field added later must be classified before it compiles.
//!
//! The encoding is CBOR: self-describing (the rows' JSON bodies survive it) and able
//! to key a map by a tuple.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::{OpenMessage, Remembered, Synchronizer};
use crate::board::Board;
use crate::budget::BudgetFold;
use crate::config::RoomConfig;
use crate::model::{InteractionId, NewInteraction, Timestamp};
use crate::protocol::claims::ClaimEpoch;
use crate::protocol::RoomSettledBody;
use crate::resources::ResourceFold;
use crate::tasks::TaskDag;

/// A saved state that cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The bytes are not a state of this format.
    #[error("the saved state does not decode: {0}")]
    Decode(String),
    /// The synchronizer has already folded rows or acted.
    #[error("a state is restored only into a synchronizer that has not folded anything")]
    NotFresh,
}

/// What the rows made of a synchronizer (borrowed, for saving).
#[derive(Serialize)]
struct SavedRef<'a> {
    board: &'a Board,
    resources: &'a ResourceFold,
    dag: &'a TaskDag,
    budget: &'a BudgetFold,
    configs: &'a BTreeMap<(String, Option<String>), RoomConfig>,
    messages: &'a BTreeMap<(String, InteractionId), OpenMessage>,
    remembered: &'a BTreeMap<InteractionId, Remembered>,
    author_order: &'a VecDeque<InteractionId>,
    returned: &'a BTreeMap<String, (String, ClaimEpoch, Timestamp)>,
    watchers: &'a BTreeMap<(String, String), BTreeSet<String>>,
    pending_notices: &'a BTreeMap<InteractionId, NewInteraction>,
    notices_done: &'a (BTreeSet<InteractionId>, VecDeque<InteractionId>),
    pending_stuck: &'a BTreeMap<InteractionId, NewInteraction>,
    stuck_noticed: &'a BTreeSet<InteractionId>,
    settled: &'a BTreeMap<String, RoomSettledBody>,
    /// The reply gate's own state ([`super::ReplyGate::save`]).
    gate: Vec<u8>,
}

/// The owned form of [`SavedRef`].
#[derive(Deserialize)]
struct Saved {
    board: Board,
    resources: ResourceFold,
    dag: TaskDag,
    budget: BudgetFold,
    configs: BTreeMap<(String, Option<String>), RoomConfig>,
    messages: BTreeMap<(String, InteractionId), OpenMessage>,
    remembered: BTreeMap<InteractionId, Remembered>,
    author_order: VecDeque<InteractionId>,
    returned: BTreeMap<String, (String, ClaimEpoch, Timestamp)>,
    watchers: BTreeMap<(String, String), BTreeSet<String>>,
    pending_notices: BTreeMap<InteractionId, NewInteraction>,
    notices_done: (BTreeSet<InteractionId>, VecDeque<InteractionId>),
    pending_stuck: BTreeMap<InteractionId, NewInteraction>,
    stuck_noticed: BTreeSet<InteractionId>,
    settled: BTreeMap<String, RoomSettledBody>,
    gate: Vec<u8>,
}

/// Encodes any serialisable value as CBOR.
pub fn to_cbor<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec fails only when a value refuses to serialise; the states
    // saved here are plain data, so this is a bug, not an input error.
    ciborium::into_writer(value, &mut out).expect("plain data serialises as CBOR");
    out
}

/// Decodes a CBOR value.
pub fn from_cbor<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StateError> {
    ciborium::from_reader(bytes).map_err(|e| StateError::Decode(e.to_string()))
}

impl Synchronizer {
    /// The ledger-derived state, encoded: what [`Synchronizer::restore_state`] takes.
    /// Deterministic: two synchronizers that folded the same rows save the same bytes.
    pub fn save_state(&self) -> Vec<u8> {
        // Every field named: a new one must be placed in the state or declared local.
        let Synchronizer {
            // Configuration: given again to the synchronizer the state is restored into.
            relay: _,
            rooms: _,
            agents: _,
            options: _,
            default_config: _,
            gate,
            // Folded from the rows.
            configs,
            board,
            resources,
            dag,
            budget,
            messages,
            remembered,
            author_order,
            returned,
            watchers,
            pending_notices,
            notices_done,
            pending_stuck,
            stuck_noticed,
            settled,
            // Derived from the DAG: rebuilt on restore.
            backing_off: _,
            walk: _,
            walk_keys: _,
            needs_watch: _,
            // What this relay did, is doing or last decided: a relay that restarts
            // has none of it.
            unfolded_failures: _,
            delivery: _,
            claims: _,
            turns: _,
            held_elsewhere: _,
            pending_uses: _,
            awaiting_view: _,
            ahead: _,
            uses_won: _,
            resource_waits: _,
            closed: _,
            bids_sent: _,
            rejections_sent: _,
            notices_sent: _,
            unsettled: _,
            next_settle_check: _,
            prewrite_rejections: _,
            finished: _,
            reviews_finished: _,
            unconfirmed: _,
            registered: _,
            now: _,
            caught_up: _,
            covered: _,
            coverage_wanted: _,
            next_reconcile: _,
            shutting_down: _,
            stopped_sent: _,
        } = self;
        to_cbor(&SavedRef {
            board,
            resources,
            dag,
            budget,
            configs,
            messages,
            remembered,
            author_order,
            returned,
            watchers,
            pending_notices,
            notices_done,
            pending_stuck,
            stuck_noticed,
            settled,
            gate: gate.save(),
        })
    }

    /// Restores a state saved by [`Synchronizer::save_state`] into this synchronizer,
    /// which must not have folded anything yet, and rebuilds what derives from it. The
    /// caller then reads on from where the saved state ends.
    pub fn restore_state(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        if self.caught_up || self.now.is_some() || self.board.rooms().next().is_some() {
            return Err(StateError::NotFresh);
        }
        let s: Saved = from_cbor(bytes)?;
        self.gate.load(&s.gate).map_err(StateError::Decode)?;
        self.board = s.board;
        self.resources = s.resources;
        self.dag = s.dag;
        self.dag.track_changes();
        self.budget = s.budget;
        self.configs = s.configs;
        self.messages = s.messages;
        self.remembered = s.remembered;
        self.author_order = s.author_order;
        self.returned = s.returned;
        self.watchers = s.watchers;
        self.pending_notices = s.pending_notices;
        self.notices_done = s.notices_done;
        self.pending_stuck = s.pending_stuck;
        self.stuck_noticed = s.stuck_noticed;
        self.settled = s.settled;
        // Every task as if just folded: the walk orders, back-offs and needs watch
        // are rebuilt the way the fold keeps them.
        self.dag.touch_all();
        self.follow_frontier();
        Ok(())
    }

    /// The indexes derived from the DAG (walk orders, back-offs, needs watch), encoded:
    /// for tests comparing a restored synchronizer with one that folded every row.
    #[cfg(test)]
    fn derived_state(&self) -> String {
        // A room whose walk emptied keeps an empty entry: the same as none.
        let walk: BTreeMap<_, _> = self.walk.iter().filter(|(_, w)| !w.is_empty()).collect();
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}",
            walk, self.walk_keys, self.backing_off, self.needs_watch
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fold::Fold;
    use crate::model::{Interaction, Position, Role};
    use crate::sync::{Event, LocalAgent};
    use crate::testing::{history_and_order, linearize, materialize, message};

    fn fresh() -> Synchronizer {
        Synchronizer::new(
            "r1",
            ["lobby"],
            vec![LocalAgent::new("a0"), LocalAgent::new("a1")],
        )
    }

    fn fold(sync: &mut Synchronizer, rows: &[Interaction]) {
        // Two batches, so a split inside a batch is covered as well.
        let half = rows.len() / 2;
        for part in [&rows[..half], &rows[half..]] {
            sync.handle(Event::Ledger {
                rows: part.to_vec(),
                caught_up: false,
            });
        }
    }

    /// The generated coordination history with messages to the local agents mixed in:
    /// some answered, some that name both agents, some from the owner.
    fn with_messages(mut rows: Vec<Interaction>, every: usize) -> Vec<Interaction> {
        let mut out = Vec::new();
        let mut n = 0u64;
        for (i, row) in rows.drain(..).enumerate() {
            out.push(row);
            if i % every.max(1) == 0 {
                let text = match i % 3 {
                    0 => "@a0 can you look at this?",
                    1 => "@a0 @a1 both of you, please",
                    _ => "anyone around?",
                };
                n += 1;
                let role = if i % 2 == 0 { Role::Human } else { Role::Owner };
                let m = message("h", role, text);
                let at = out.last().map(|r| r.at).unwrap_or(Timestamp(1));
                out.push(materialize(m, Position::new(0, 0), at));
                if n.is_multiple_of(2) {
                    let parent = out.last().map(|r| r.id);
                    let mut reply = message("a0", Role::Agent, "on it");
                    reply.parent = parent;
                    out.push(materialize(reply, Position::new(0, 0), at));
                }
            }
        }
        for (i, row) in out.iter_mut().enumerate() {
            row.position = Position::new(0, i as u64 + 1);
        }
        out
    }

    /// What a fold of every row saves equals what a fold of rows `0..k`, saved,
    /// restored into a fresh synchronizer and folded on with rows `k..n` saves — for
    /// every `k` — and the indexes rebuilt from the restored DAG equal the ones the
    /// fold kept row by row.
    fn resumes_anywhere(rows: &[Interaction]) -> Result<(), TestCaseError> {
        let mut whole = fresh();
        fold(&mut whole, rows);
        let expected = whole.save_state();
        let expected_derived = whole.derived_state();
        for k in 0..=rows.len() {
            let mut first = fresh();
            fold(&mut first, &rows[..k]);
            let saved = first.save_state();
            let mut resumed = fresh();
            resumed
                .restore_state(&saved)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                resumed.save_state(),
                saved,
                "restored state re-saves differently at {}",
                k
            );
            fold(&mut resumed, &rows[k..]);
            prop_assert!(
                resumed.save_state() == expected,
                "state differs after resuming at {}",
                k
            );
            prop_assert_eq!(
                resumed.derived_state(),
                expected_derived.clone(),
                "indexes differ after resuming at {}",
                k
            );
            prop_assert_eq!(resumed.board().state_hash(), whole.board().state_hash());
            prop_assert_eq!(resumed.tasks().state_hash(), whole.tasks().state_hash());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn a_restored_state_folds_on_like_the_whole_history((history, order) in history_and_order(), every in 1usize..6) {
            let rows = with_messages(linearize(&history, &order), every);
            resumes_anywhere(&rows)?;
        }
    }

    #[test]
    fn a_state_saved_by_two_synchronizers_of_the_same_rows_is_the_same_bytes() {
        let rows = with_messages(
            linearize(
                &crate::testing::gen_history(6, 3, &[7, 1, 200, 3, 9, 44, 5]),
                &[],
            ),
            2,
        );
        let (mut a, mut b) = (fresh(), fresh());
        fold(&mut a, &rows);
        for r in &rows {
            b.handle(Event::Ledger {
                rows: vec![r.clone()],
                caught_up: false,
            });
        }
        assert_eq!(a.save_state(), b.save_state());
        assert!(!a.save_state().is_empty());
    }

    #[test]
    fn a_state_is_restored_only_into_a_fresh_synchronizer_and_garbage_is_refused() {
        let mut s = fresh();
        assert!(matches!(
            s.restore_state(b"not cbor at all"),
            Err(StateError::Decode(_))
        ));
        let saved = fresh().save_state();
        s.handle(Event::Ledger {
            rows: vec![materialize(
                message("h", Role::Human, "@a0 hi"),
                Position::new(0, 1),
                Timestamp(5),
            )],
            caught_up: true,
        });
        assert!(matches!(s.restore_state(&saved), Err(StateError::NotFresh)));
        // A truncated state does not decode.
        let full = {
            let mut f = fresh();
            f.handle(Event::Ledger {
                rows: vec![materialize(
                    crate::testing::created("t1", &[]),
                    Position::new(0, 1),
                    Timestamp(5),
                )],
                caught_up: false,
            });
            f.save_state()
        };
        assert!(fresh().restore_state(&full[..full.len() / 2]).is_err());
    }
}
