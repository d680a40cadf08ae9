//! Barriers for phased work: nobody enters the next phase until the roster has
//! checked in, or the timeout decides.
//!
//! `barrier.opened` names the phase (unique in the room; the first opening wins), the
//! expected roster, a timeout in database time and what happens at the timeout:
//! `proceed-with-quorum { quorum }` (pass with those who checked in and mark the rest
//! dropped, provided at least `quorum` did) or `escalate` (the default: a person
//! decides). `barrier.checkin` counts only from a roster member, once, and only when
//! its `at` is not after the timeout. A barrier without a timeout is a deadlock waiting
//! for an agent that never returns, so the timeout is required.
//!
//! The status is a pure function of the folded check-ins and a passed-in `now`
//! ([`BarrierState::status`]); [`BarrierFold::due`] gives the `barrier.passed` /
//! `barrier.escalated` row to append once it is final. Check-ins seen before their
//! barrier is opened are held and counted when it opens, so the state does not depend
//! on how different actors' rows interleave.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, NewInteraction, Role, Timestamp};
use crate::protocol::{closing_key, deadline_from, valid_name};
use crate::verbs::Verb;

pub use crate::protocol::barrier::{
    BarrierCheckinBody, BarrierClosedBody, BarrierOpenedBody, OnTimeout, MAX_ROSTER,
};

/// A validated barrier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Barrier {
    /// The phase.
    pub phase: String,
    /// The `barrier.opened` interaction.
    pub interaction: InteractionId,
    /// Its thread; closing rows go there too.
    pub thread: Option<String>,
    /// Who opened it.
    pub opener: String,
    /// Who must check in.
    pub roster: BTreeSet<String>,
    /// Database time after which no check-in counts.
    pub deadline: Timestamp,
    /// What happens at the timeout.
    pub on_timeout: OnTimeout,
}

impl Barrier {
    /// Validates a `barrier.opened` interaction; `None` when malformed (bad phase or
    /// roster name, empty or oversized roster, no timeout or two, impossible quorum).
    pub fn parse(i: &Interaction) -> Option<Barrier> {
        let body = BarrierOpenedBody::deserialize(&i.body).ok()?;
        if !valid_name(&body.phase) {
            return None;
        }
        if body.roster.is_empty()
            || body.roster.len() > MAX_ROSTER
            || !body.roster.iter().all(|r| valid_name(r))
        {
            return None;
        }
        let roster: BTreeSet<String> = body.roster.into_iter().collect();
        let on_timeout = body.on_timeout.unwrap_or(OnTimeout::Escalate);
        if let OnTimeout::ProceedWithQuorum { quorum } = on_timeout {
            if quorum == 0 || quorum > roster.len() as u64 {
                return None;
            }
        }
        let deadline = deadline_from(i.at, body.deadline, body.timeout_ms)?;
        Some(Barrier {
            phase: body.phase,
            interaction: i.id,
            thread: i.thread.clone(),
            opener: i.actor.clone(),
            roster,
            deadline,
            on_timeout,
        })
    }
}

/// Check-ins seen but not counted, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IgnoredCheckins {
    /// From an actor not on the roster.
    pub not_roster: u64,
    /// With an `at` after the timeout.
    pub late: u64,
    /// A member's check-ins after their first.
    pub repeated: u64,
}

/// How a barrier was closed in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BarrierClosure {
    /// `barrier.passed` or `barrier.escalated`.
    pub verb: Verb,
    /// Who wrote it.
    pub actor: String,
    /// The closing interaction.
    pub interaction: InteractionId,
}

/// One barrier and its check-ins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BarrierState {
    barrier: Barrier,
    checked_in: BTreeMap<String, Timestamp>,
    ignored: IgnoredCheckins,
    closure: Option<BarrierClosure>,
    ignored_closures: u64,
}

/// Why a barrier was escalated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BarrierEscalation {
    /// The policy is `escalate` and someone was missing at the timeout.
    Timeout,
    /// The policy is `proceed-with-quorum` but too few checked in.
    QuorumNotReached,
}

impl BarrierEscalation {
    /// The wire text.
    pub fn as_str(&self) -> &'static str {
        match self {
            BarrierEscalation::Timeout => "timeout",
            BarrierEscalation::QuorumNotReached => "quorum-not-reached",
        }
    }
}

/// A barrier's state at some `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum BarrierStatus {
    /// Waiting for these roster members.
    Waiting {
        /// Not checked in yet, sorted.
        missing: Vec<String>,
    },
    /// Final: the next phase may start.
    Passed {
        /// Members dropped at the timeout (empty when everyone checked in), sorted.
        dropped: Vec<String>,
    },
    /// Final: a person decides.
    Escalated {
        /// Members missing at the timeout, sorted.
        missing: Vec<String>,
        /// Why.
        reason: BarrierEscalation,
    },
}

impl BarrierStatus {
    /// Whether the status can no longer change.
    pub fn is_final(&self) -> bool {
        !matches!(self, BarrierStatus::Waiting { .. })
    }
}

/// Rules for evaluating barriers (the caller passes them in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierRules {
    /// How long after the timeout to wait before judging it, µs (default 2 s): a
    /// check-in stamped just before it may still be committing.
    pub grace_us: i64,
}

impl Default for BarrierRules {
    fn default() -> Self {
        BarrierRules {
            grace_us: 2_000_000,
        }
    }
}

impl BarrierState {
    /// The validated barrier.
    pub fn barrier(&self) -> &Barrier {
        &self.barrier
    }

    /// Counted check-ins: member to database time.
    pub fn checked_in(&self) -> &BTreeMap<String, Timestamp> {
        &self.checked_in
    }

    /// Check-ins seen but not counted.
    pub fn ignored(&self) -> IgnoredCheckins {
        self.ignored
    }

    /// The first accepted closing row, if one was folded.
    pub fn closure(&self) -> Option<&BarrierClosure> {
        self.closure.as_ref()
    }

    /// Roster members not checked in, sorted.
    pub fn missing(&self) -> Vec<String> {
        self.barrier
            .roster
            .iter()
            .filter(|m| !self.checked_in.contains_key(*m))
            .cloned()
            .collect()
    }

    /// The status at database time `now`. Monotone: once final it stays final.
    pub fn status(&self, now: Timestamp, rules: &BarrierRules) -> BarrierStatus {
        let missing = self.missing();
        if missing.is_empty() {
            return BarrierStatus::Passed {
                dropped: Vec::new(),
            };
        }
        let timed_out = now > self.barrier.deadline.saturating_add(rules.grace_us.max(0));
        if !timed_out {
            return BarrierStatus::Waiting { missing };
        }
        match self.barrier.on_timeout {
            OnTimeout::ProceedWithQuorum { quorum } if self.checked_in.len() as u64 >= quorum => {
                BarrierStatus::Passed { dropped: missing }
            }
            OnTimeout::ProceedWithQuorum { .. } => BarrierStatus::Escalated {
                missing,
                reason: BarrierEscalation::QuorumNotReached,
            },
            OnTimeout::Escalate => BarrierStatus::Escalated {
                missing,
                reason: BarrierEscalation::Timeout,
            },
        }
    }

    /// The closing row to append for a final status, written by `actor` (a relay,
    /// role `system`); `None` while waiting or once a closing row was folded.
    pub fn due(
        &self,
        room: &str,
        now: Timestamp,
        rules: &BarrierRules,
        actor: &str,
    ) -> Option<NewInteraction> {
        if self.closure.is_some() {
            return None;
        }
        let checked_in: Vec<String> = self.checked_in.keys().cloned().collect();
        let phase = self.barrier.phase.clone();
        let (verb, body) = match self.status(now, rules) {
            BarrierStatus::Waiting { .. } => return None,
            BarrierStatus::Passed { dropped } => (
                Verb::BarrierPassed,
                BarrierClosedBody {
                    phase,
                    checked_in,
                    dropped,
                    missing: Vec::new(),
                    reason: None,
                },
            ),
            BarrierStatus::Escalated { missing, reason } => (
                Verb::BarrierEscalated,
                BarrierClosedBody {
                    phase,
                    checked_in,
                    dropped: Vec::new(),
                    missing,
                    reason: Some(reason.as_str().to_string()),
                },
            ),
        };
        let body = serde_json::to_value(body).ok()?;
        let mut new = NewInteraction::new(room, verb, actor, Role::System, body)
            .with_parent(self.barrier.interaction)
            .with_idempotency_key(closing_key("barrier", room, &self.barrier.phase));
        new.thread = self.barrier.thread.clone();
        Some(new)
    }

    fn checkin(&mut self, actor: &str, at: Timestamp) {
        if !self.barrier.roster.contains(actor) {
            self.ignored.not_roster += 1;
        } else if at > self.barrier.deadline {
            self.ignored.late += 1;
        } else if self.checked_in.contains_key(actor) {
            self.ignored.repeated += 1;
        } else {
            self.checked_in.insert(actor.to_string(), at);
        }
    }

    fn close(&mut self, c: PendingClose) {
        let trusted =
            c.actor == self.barrier.opener || matches!(c.role, Role::System | Role::Owner);
        if self.closure.is_some() || !trusted {
            self.ignored_closures += 1;
            return;
        }
        self.closure = Some(BarrierClosure {
            verb: c.verb,
            actor: c.actor,
            interaction: c.interaction,
        });
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct PendingClose {
    verb: Verb,
    actor: String,
    role: Role,
    interaction: InteractionId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Pending {
    Checkin { actor: String, at: Timestamp },
    Close(PendingClose),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
struct RoomBarriers {
    barriers: BTreeMap<String, BarrierState>,
    /// Rows for barriers not opened yet, in ledger order.
    pending: BTreeMap<String, Vec<Pending>>,
    malformed: u64,
    duplicate_openings: u64,
}

/// The barriers of every room, folded from `barrier.*` interactions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BarrierFold {
    rooms: BTreeMap<String, RoomBarriers>,
}

impl BarrierFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fold rebuilt from scratch over `interactions` in ledger order.
    pub fn from_interactions<'a>(interactions: impl IntoIterator<Item = &'a Interaction>) -> Self {
        let mut f = Self::new();
        f.apply_all(interactions);
        f
    }

    /// One barrier's state.
    pub fn get(&self, room: &str, phase: &str) -> Option<&BarrierState> {
        self.rooms.get(room)?.barriers.get(phase)
    }

    /// A room's barriers, by phase.
    pub fn barriers(&self, room: &str) -> impl Iterator<Item = (&String, &BarrierState)> {
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.barriers.iter())
    }

    /// How many `barrier.*` bodies in the room did not parse (they were ignored).
    pub fn malformed(&self, room: &str) -> u64 {
        self.rooms.get(room).map_or(0, |r| r.malformed)
    }

    /// A barrier's status at `now`.
    pub fn status(
        &self,
        room: &str,
        phase: &str,
        now: Timestamp,
        rules: &BarrierRules,
    ) -> Option<BarrierStatus> {
        Some(self.get(room, phase)?.status(now, rules))
    }

    /// Every closing row due at `now`, in room and phase order, written by `actor`
    /// (the relay, role `system`), each with an idempotency key.
    pub fn due(&self, now: Timestamp, rules: &BarrierRules, actor: &str) -> Vec<NewInteraction> {
        self.rooms
            .iter()
            .flat_map(|(room, r)| {
                r.barriers
                    .values()
                    .filter_map(move |b| b.due(room, now, rules, actor))
            })
            .collect()
    }

    fn apply_pending(state: &mut BarrierState, p: Pending) {
        match p {
            Pending::Checkin { actor, at } => state.checkin(&actor, at),
            Pending::Close(c) => state.close(c),
        }
    }

    fn route(&mut self, i: &Interaction, phase: String, p: Pending) {
        let room = self.rooms.entry(i.room.clone()).or_default();
        match room.barriers.get_mut(&phase) {
            Some(state) => Self::apply_pending(state, p),
            None => room.pending.entry(phase).or_default().push(p),
        }
    }
}

impl Fold for BarrierFold {
    fn apply(&mut self, i: &Interaction) {
        match i.verb {
            Verb::BarrierOpened => {
                let room = self.rooms.entry(i.room.clone()).or_default();
                let Some(barrier) = Barrier::parse(i) else {
                    room.malformed += 1;
                    return;
                };
                if room.barriers.contains_key(&barrier.phase) {
                    room.duplicate_openings += 1;
                    return;
                }
                let phase = barrier.phase.clone();
                let mut state = BarrierState {
                    barrier,
                    checked_in: BTreeMap::new(),
                    ignored: IgnoredCheckins::default(),
                    closure: None,
                    ignored_closures: 0,
                };
                for p in room.pending.remove(&phase).unwrap_or_default() {
                    Self::apply_pending(&mut state, p);
                }
                room.barriers.insert(phase, state);
            }
            Verb::BarrierCheckin => match BarrierCheckinBody::deserialize(&i.body) {
                Ok(c) => self.route(
                    i,
                    c.phase,
                    Pending::Checkin {
                        actor: i.actor.clone(),
                        at: i.at,
                    },
                ),
                Err(_) => self.rooms.entry(i.room.clone()).or_default().malformed += 1,
            },
            Verb::BarrierPassed | Verb::BarrierEscalated => {
                match BarrierClosedBody::deserialize(&i.body) {
                    Ok(c) => self.route(
                        i,
                        c.phase,
                        Pending::Close(PendingClose {
                            verb: i.verb,
                            actor: i.actor.clone(),
                            role: i.role,
                            interaction: i.id,
                        }),
                    ),
                    Err(_) => self.rooms.entry(i.room.clone()).or_default().malformed += 1,
                }
            }
            _ => {}
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ROOM: &str = "pipeline";
    const T0: Timestamp = 1_700_000_000 * SEC;
    const SCRAPERS: [&str; 5] = ["s1", "s2", "s3", "s4", "s5"];

    fn open(on_timeout: serde_json::Value) -> Interaction {
        row(
            ROOM,
            Verb::BarrierOpened,
            "aggregator",
            Role::Agent,
            T0,
            json!({"phase": "scrape", "roster": SCRAPERS, "timeout_ms": 60_000,
                   "on_timeout": on_timeout}),
        )
    }

    fn checkin(who: &str, at: Timestamp) -> Interaction {
        row(
            ROOM,
            Verb::BarrierCheckin,
            who,
            Role::Agent,
            at,
            json!({"phase": "scrape"}),
        )
    }

    /// Folds the rows (checking rebuilds) and gives the `scrape` barrier's status.
    fn check(rows: Vec<Interaction>, now: Timestamp) -> BarrierStatus {
        let f: BarrierFold = fold_checked(&positioned(rows));
        f.status(ROOM, "scrape", now, &BarrierRules::default())
            .expect("barrier opened")
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn passes_when_all_five_scrapers_check_in() {
        let t = T0 + SEC;
        let mut rows = vec![open(json!("escalate"))];
        rows.extend(SCRAPERS[..4].iter().map(|s| checkin(s, t)));
        assert_eq!(
            check(rows.clone(), t),
            BarrierStatus::Waiting {
                missing: names(&["s5"])
            }
        );
        rows.push(checkin("s5", t));
        assert_eq!(
            check(rows, t),
            BarrierStatus::Passed {
                dropped: Vec::new()
            }
        );
    }

    #[test]
    fn timeout_proceeds_with_quorum_and_drops_the_laggard() {
        let mut rows = vec![open(json!({"proceed-with-quorum": {"quorum": 4}}))];
        rows.extend(SCRAPERS[..4].iter().map(|s| checkin(s, T0 + SEC)));
        // Late check-in from the laggard: does not count.
        rows.push(checkin("s5", T0 + 61 * SEC));
        assert_eq!(
            check(rows.clone(), T0 + 59 * SEC),
            BarrierStatus::Waiting {
                missing: names(&["s5"])
            }
        );
        let after = T0 + 63 * SEC;
        assert_eq!(
            check(rows.clone(), after),
            BarrierStatus::Passed {
                dropped: names(&["s5"])
            }
        );
        let f = BarrierFold::from_interactions(&positioned(rows.clone()));
        let due = f.due(after, &BarrierRules::default(), "relay-1");
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].verb, Verb::BarrierPassed);
        assert_eq!(due[0].body["dropped"], json!(["s5"]));
        assert_eq!(due[0].parent, Some(rows[0].id));
        // Once the closing row is folded nothing more is due.
        let mut closed = rows;
        closed.push(from_new(due[0].clone(), after));
        let f = BarrierFold::from_interactions(&positioned(closed));
        assert!(f.due(after, &BarrierRules::default(), "relay-1").is_empty());
        assert_eq!(
            f.get(ROOM, "scrape").unwrap().closure().unwrap().verb,
            Verb::BarrierPassed
        );
    }

    #[test]
    fn timeout_escalates_by_policy_or_without_quorum() {
        let after = T0 + 63 * SEC;
        let mut rows = vec![open(json!("escalate"))];
        rows.extend(SCRAPERS[..4].iter().map(|s| checkin(s, T0 + SEC)));
        assert_eq!(
            check(rows, after),
            BarrierStatus::Escalated {
                missing: names(&["s5"]),
                reason: BarrierEscalation::Timeout
            }
        );
        let mut rows = vec![open(json!({"proceed-with-quorum": {"quorum": 4}}))];
        rows.extend(SCRAPERS[..3].iter().map(|s| checkin(s, T0 + SEC)));
        assert_eq!(
            check(rows, after),
            BarrierStatus::Escalated {
                missing: names(&["s4", "s5"]),
                reason: BarrierEscalation::QuorumNotReached
            }
        );
    }

    #[test]
    fn strangers_and_repeats_do_not_count() {
        let t = T0 + SEC;
        let mut rows = vec![open(json!({"proceed-with-quorum": {"quorum": 1}}))];
        rows.push(checkin("mallory", t));
        rows.push(checkin("s1", t));
        rows.push(checkin("s1", t + 1));
        let f = BarrierFold::from_interactions(&positioned(rows));
        let b = f.get(ROOM, "scrape").unwrap();
        assert_eq!(b.checked_in().len(), 1);
        assert_eq!(
            b.ignored(),
            IgnoredCheckins {
                not_roster: 1,
                late: 0,
                repeated: 1
            }
        );
    }

    #[test]
    fn malformed_bodies_are_ignored_and_counted() {
        let bad = [
            json!({}),
            json!({"phase": "p", "roster": ["a"]}),
            json!({"phase": "p", "roster": [], "timeout_ms": 1}),
            json!({"phase": "p", "roster": ["a"], "timeout_ms": 1, "deadline": 1}),
            json!({"phase": "p", "roster": ["a"], "timeout_ms": 1,
                   "on_timeout": {"proceed-with-quorum": {"quorum": 2}}}),
            json!({"phase": "p", "roster": ["a"], "timeout_ms": 1,
                   "on_timeout": {"proceed-with-quorum": {"quorum": 0}}}),
            json!({"phase": "p", "roster": ["a"], "timeout_ms": 1, "on_timeout": "panic"}),
            json!({"phase": "", "roster": ["a"], "timeout_ms": 1}),
            json!({"phase": "p", "roster": [""], "timeout_ms": 1}),
            json!(42),
        ];
        let mut rows: Vec<Interaction> = bad
            .iter()
            .map(|b| row(ROOM, Verb::BarrierOpened, "x", Role::Agent, T0, b.clone()))
            .collect();
        rows.push(row(
            ROOM,
            Verb::BarrierCheckin,
            "a",
            Role::Agent,
            T0,
            json!({"phase": 1}),
        ));
        rows.push(row(
            ROOM,
            Verb::BarrierPassed,
            "a",
            Role::System,
            T0,
            json!([]),
        ));
        let f = BarrierFold::from_interactions(&positioned(rows));
        assert_eq!(f.malformed(ROOM), bad.len() as u64 + 2);
        assert_eq!(f.barriers(ROOM).count(), 0);
    }

    fn scenario() -> impl Strategy<Value = Vec<Interaction>> {
        let who = prop::sample::select(vec!["s1", "s2", "s3", "s4", "s5", "x", "y"]);
        let c = (who, 0i64..90).prop_map(|(w, s)| checkin(w, T0 + s * SEC));
        (prop::collection::vec(c, 0..20), 1u64..=5, any::<bool>()).prop_map(|(cs, q, proceed)| {
            let policy = if proceed {
                json!({"proceed-with-quorum": {"quorum": q}})
            } else {
                json!("escalate")
            };
            let mut rows = vec![open(policy)];
            rows.extend(cs);
            rows
        })
    }

    proptest! {
        /// The state hash does not depend on how actors' rows interleave.
        #[test]
        fn any_interleaving_gives_the_same_state(
            (rows, shuffled) in scenario().prop_flat_map(|rows| (Just(rows.clone()), interleaving(rows))),
        ) {
            let reference = BarrierFold::from_interactions(&positioned(rows)).state_hash();
            prop_assert_eq!(BarrierFold::from_interactions(&shuffled).state_hash(), reference);
        }

        /// Check-ins from outside the roster never change a barrier's status, so they
        /// can never pass it.
        #[test]
        fn strangers_never_pass_a_barrier(
            rows in scenario(),
            strangers in prop::collection::vec(
                (prop::sample::select(vec!["x", "y", "z"]), 0i64..90, any::<prop::sample::Index>()), 1..10),
            now in 0i64..120,
        ) {
            let rules = BarrierRules::default();
            let roster_only: Vec<Interaction> = rows
                .into_iter()
                .filter(|r| r.verb == Verb::BarrierOpened || SCRAPERS.contains(&r.actor.as_str()))
                .collect();
            let mut with_strangers = roster_only.clone();
            for (w, s, idx) in strangers {
                with_strangers.insert(idx.index(with_strangers.len() + 1), checkin(w, T0 + s * SEC));
            }
            let now = T0 + now * SEC;
            let a = BarrierFold::from_interactions(&positioned(roster_only));
            let b = BarrierFold::from_interactions(&positioned(with_strangers.clone()));
            prop_assert_eq!(a.status(ROOM, "scrape", now, &rules), b.status(ROOM, "scrape", now, &rules));
            // Strangers alone never pass it, at any time.
            let only: Vec<Interaction> = with_strangers
                .into_iter()
                .filter(|r| r.verb == Verb::BarrierOpened || !SCRAPERS.contains(&r.actor.as_str()))
                .collect();
            let c = BarrierFold::from_interactions(&positioned(only));
            let passed = matches!(c.status(ROOM, "scrape", now, &rules), Some(BarrierStatus::Passed { .. }));
            prop_assert!(!passed);
        }
    }
}
