//! Coordination patterns: what decisions and barriers have in common.
//!
//! An instance of a pattern (a proposal, a barrier) is opened by one row and named
//! uniquely in its room; later rows name it: a member's row (a vote, a check-in) or
//! a closing row (`decision.committed`, `barrier.passed`, ...). [`PatternFold`] folds
//! them for any [`Instance`]:
//!
//! - the first opening of a name wins; later ones are counted as duplicates;
//! - rows that name an instance not opened yet are held, in ledger order, and applied
//!   when it opens, so the state does not depend on how different actors' rows
//!   interleave;
//! - bodies that do not parse are counted per room and otherwise ignored;
//! - once an outcome is final, [`PatternFold::due`] gives the one closing row a relay
//!   appends, under an idempotency key every relay computes alike.

use std::collections::BTreeMap;
use std::fmt::Debug;

use serde::Serialize;

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, NewInteraction, Role, Timestamp};
use crate::protocol::closing_key;
use crate::verbs::Verb;

/// One instance of a coordination pattern, and how its rows are read.
pub trait Instance: Clone + Debug + Eq + Serialize {
    /// What a member's row carries besides its actor and time (a vote's option).
    type Member: Clone + Debug + Eq + Serialize;
    /// What a closing row carries that the instance checks.
    type Closing: Clone + Debug + Eq + Serialize;
    /// What judging the outcome needs (passed in by the caller).
    type Rules;
    /// The outcome at some `now`.
    type Status;
    /// The body of a closing row.
    type Closed: Serialize;

    /// The pattern's name in the idempotency keys of closing rows (`decision`).
    const KIND: &'static str;

    /// Reads a row of this pattern; `None` for the verbs of other patterns.
    fn read(i: &Interaction) -> Option<Read<Self>>;

    /// The instance's name, unique in its room.
    fn name(&self) -> &str;

    /// Counts a member's row, in ledger order.
    fn member(&mut self, actor: &str, at: Timestamp, body: Self::Member);

    /// Takes a closing row, in ledger order (the first one it trusts).
    fn close(&mut self, row: ClosingRow<Self::Closing>);

    /// The outcome at database time `now`.
    fn status(&self, now: Timestamp, rules: &Self::Rules) -> Self::Status;

    /// The opening row and its thread: closing rows are caused by it and go there too.
    fn opening(&self) -> (InteractionId, Option<&String>);

    /// Whether a closing row was folded.
    fn closed(&self) -> bool;

    /// The verb and body of the closing row for the outcome at `now`; `None` while
    /// the outcome is open.
    fn closing(&self, now: Timestamp, rules: &Self::Rules) -> Option<(Verb, Self::Closed)>;
}

/// A row of a pattern as [`Instance::read`] reads it. `None` inside: the body did not
/// parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read<S: Instance> {
    /// An opening row.
    Open(Option<S>),
    /// A member's row naming an instance.
    Member(Option<(String, S::Member)>),
    /// A closing row naming an instance.
    Closing(Option<(String, S::Closing)>),
}

/// A closing row as folded, before the instance judges it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClosingRow<B> {
    /// Its verb.
    pub verb: Verb,
    /// What the instance checks of its body.
    pub body: B,
    /// Who wrote it.
    pub actor: String,
    /// Its role.
    pub role: Role,
    /// The closing interaction.
    pub interaction: InteractionId,
}

impl<B> ClosingRow<B> {
    /// Whether its writer may close an instance opened by `opener`: the opener, a
    /// relay (`system`) or the owner.
    pub fn trusted(&self, opener: &str) -> bool {
        self.actor == opener || matches!(self.role, Role::System | Role::Owner)
    }
}

/// A row for an instance after its opening.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Row<S: Instance> {
    Member {
        actor: String,
        at: Timestamp,
        body: S::Member,
    },
    Closing(ClosingRow<S::Closing>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct RoomInstances<S: Instance> {
    /// Opened instances, by name.
    open: BTreeMap<String, S>,
    /// Rows for instances not opened yet, in ledger order.
    pending: BTreeMap<String, Vec<Row<S>>>,
    /// Bodies that did not parse.
    malformed: u64,
    /// Later openings of a name already opened.
    duplicates: u64,
}

impl<S: Instance> Default for RoomInstances<S> {
    fn default() -> Self {
        RoomInstances {
            open: BTreeMap::new(),
            pending: BTreeMap::new(),
            malformed: 0,
            duplicates: 0,
        }
    }
}

/// The instances of one pattern in every room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PatternFold<S: Instance> {
    rooms: BTreeMap<String, RoomInstances<S>>,
}

impl<S: Instance> Default for PatternFold<S> {
    fn default() -> Self {
        PatternFold {
            rooms: BTreeMap::new(),
        }
    }
}

impl<S: Instance> PatternFold<S> {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// One instance's state.
    pub fn get(&self, room: &str, name: &str) -> Option<&S> {
        self.rooms.get(room)?.open.get(name)
    }

    /// A room's instances, by name.
    pub fn instances(&self, room: &str) -> impl Iterator<Item = (&String, &S)> {
        self.rooms.get(room).into_iter().flat_map(|r| r.open.iter())
    }

    /// How many of the pattern's bodies in the room did not parse (they were ignored).
    pub fn malformed(&self, room: &str) -> u64 {
        self.rooms.get(room).map_or(0, |r| r.malformed)
    }

    /// An instance's outcome at `now`.
    pub fn status(
        &self,
        room: &str,
        name: &str,
        now: Timestamp,
        rules: &S::Rules,
    ) -> Option<S::Status> {
        Some(self.get(room, name)?.status(now, rules))
    }

    /// Every closing row due at `now`, in room and name order, written by `actor`
    /// (the relay, role `system`). Each carries an idempotency key, so several relays
    /// writing the same closure land it once.
    pub fn due(&self, now: Timestamp, rules: &S::Rules, actor: &str) -> Vec<NewInteraction> {
        self.rooms
            .iter()
            .flat_map(|(room, r)| {
                r.open
                    .values()
                    .filter_map(move |s| closing_row(room, s, now, rules, actor))
            })
            .collect()
    }

    fn take(state: &mut S, row: Row<S>) {
        match row {
            Row::Member { actor, at, body } => state.member(&actor, at, body),
            Row::Closing(c) => state.close(c),
        }
    }
}

impl<S: Instance> Fold for PatternFold<S> {
    fn apply(&mut self, i: &Interaction) {
        let Some(read) = S::read(i) else {
            return;
        };
        let room = self.rooms.entry(i.room.clone()).or_default();
        let (name, row) = match read {
            Read::Open(Some(mut state)) => {
                if room.open.contains_key(state.name()) {
                    room.duplicates += 1;
                    return;
                }
                let name = state.name().to_string();
                for row in room.pending.remove(&name).unwrap_or_default() {
                    Self::take(&mut state, row);
                }
                room.open.insert(name, state);
                return;
            }
            Read::Member(Some((name, body))) => {
                let actor = i.actor.clone();
                (
                    name,
                    Row::Member {
                        actor,
                        at: i.at,
                        body,
                    },
                )
            }
            Read::Closing(Some((name, body))) => {
                let row = ClosingRow {
                    verb: i.verb,
                    body,
                    actor: i.actor.clone(),
                    role: i.role,
                    interaction: i.id,
                };
                (name, Row::Closing(row))
            }
            Read::Open(None) | Read::Member(None) | Read::Closing(None) => {
                room.malformed += 1;
                return;
            }
        };
        match room.open.get_mut(&name) {
            Some(state) => Self::take(state, row),
            None => room.pending.entry(name).or_default().push(row),
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

/// The one closing row of `instance` for its outcome at `now`, if it is final and no
/// closing row was folded: written by `actor` as `system`, caused by the opening row,
/// in its thread, under an idempotency key every relay computes alike.
fn closing_row<S: Instance>(
    room: &str,
    instance: &S,
    now: Timestamp,
    rules: &S::Rules,
    actor: &str,
) -> Option<NewInteraction> {
    if instance.closed() {
        return None;
    }
    let (verb, body) = instance.closing(now, rules)?;
    let body = serde_json::to_value(body).ok()?;
    let (opening, thread) = instance.opening();
    let mut new = NewInteraction::new(room, verb, actor, Role::System, body)
        .with_parent(opening)
        .with_idempotency_key(closing_key(S::KIND, room, instance.name()));
    new.thread = thread.cloned();
    Some(new)
}
