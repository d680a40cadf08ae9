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

use crate::model::{Interaction, InteractionId, Timestamp};
use crate::pattern::{ClosingRow, Instance, PatternFold, Read};
use crate::protocol::{deadline_from, valid_name};
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
}

/// The barriers of every room, folded from `barrier.*` interactions.
pub type BarrierFold = PatternFold<BarrierState>;

/// A barrier is a pattern instance: opened by `barrier.opened`, checked in to by
/// `barrier.checkin`, closed by `barrier.passed` / `barrier.escalated`.
impl Instance for BarrierState {
    /// A check-in carries nothing but its actor and time.
    type Member = ();
    /// A closing row is judged by its writer alone.
    type Closing = ();
    type Rules = BarrierRules;
    type Closed = BarrierClosedBody;
    type Status = BarrierStatus;

    const KIND: &'static str = "barrier";

    fn read(i: &Interaction) -> Option<Read<Self>> {
        let read = match i.verb {
            Verb::BarrierOpened => Read::Open(Barrier::parse(i).map(|barrier| BarrierState {
                barrier,
                checked_in: BTreeMap::new(),
                ignored: IgnoredCheckins::default(),
                closure: None,
                ignored_closures: 0,
            })),
            Verb::BarrierCheckin => Read::Member(
                BarrierCheckinBody::deserialize(&i.body)
                    .ok()
                    .map(|c| (c.phase, ())),
            ),
            Verb::BarrierPassed | Verb::BarrierEscalated => Read::Closing(
                BarrierClosedBody::deserialize(&i.body)
                    .ok()
                    .map(|c| (c.phase, ())),
            ),
            _ => return None,
        };
        Some(read)
    }

    fn name(&self) -> &str {
        &self.barrier.phase
    }

    fn member(&mut self, actor: &str, at: Timestamp, _: ()) {
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

    fn close(&mut self, c: ClosingRow<()>) {
        if self.closure.is_some() || !c.trusted(&self.barrier.opener) {
            self.ignored_closures += 1;
            return;
        }
        self.closure = Some(BarrierClosure {
            verb: c.verb,
            actor: c.actor,
            interaction: c.interaction,
        });
    }

    /// The status at database time `now`. Monotone: once final it stays final.
    fn status(&self, now: Timestamp, rules: &BarrierRules) -> BarrierStatus {
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

    fn opening(&self) -> (InteractionId, Option<&String>) {
        (self.barrier.interaction, self.barrier.thread.as_ref())
    }

    fn closed(&self) -> bool {
        self.closure.is_some()
    }

    fn closing(&self, now: Timestamp, rules: &BarrierRules) -> Option<(Verb, BarrierClosedBody)> {
        let checked_in: Vec<String> = self.checked_in.keys().cloned().collect();
        let phase = self.barrier.phase.clone();
        let closing = match self.status(now, rules) {
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
        Some(closing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::Fold;
    use crate::model::Role;
    use crate::testing::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ROOM: &str = "pipeline";
    const T0: Timestamp = Timestamp(1_700_000_000 * SEC);
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
        let f = BarrierFold::rebuild(&positioned(rows.clone()));
        let due = f.due(after, &BarrierRules::default(), "relay-1");
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].verb, Verb::BarrierPassed);
        assert_eq!(due[0].body["dropped"], json!(["s5"]));
        assert_eq!(due[0].parent, Some(rows[0].id));
        // Once the closing row is folded nothing more is due.
        let mut closed = rows;
        closed.push(from_new(due[0].clone(), after));
        let f = BarrierFold::rebuild(&positioned(closed));
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
        let f = BarrierFold::rebuild(&positioned(rows));
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
        let f = BarrierFold::rebuild(&positioned(rows));
        assert_eq!(f.malformed(ROOM), bad.len() as u64 + 2);
        assert_eq!(f.instances(ROOM).count(), 0);
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
            let reference = BarrierFold::rebuild(&positioned(rows)).state_hash();
            prop_assert_eq!(BarrierFold::rebuild(&shuffled).state_hash(), reference);
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
            let a = BarrierFold::rebuild(&positioned(roster_only));
            let b = BarrierFold::rebuild(&positioned(with_strangers.clone()));
            prop_assert_eq!(a.status(ROOM, "scrape", now, &rules), b.status(ROOM, "scrape", now, &rules));
            // Strangers alone never pass it, at any time.
            let only: Vec<Interaction> = with_strangers
                .into_iter()
                .filter(|r| r.verb == Verb::BarrierOpened || !SCRAPERS.contains(&r.actor.as_str()))
                .collect();
            let c = BarrierFold::rebuild(&positioned(only));
            let passed = matches!(c.status(ROOM, "scrape", now, &rules), Some(BarrierStatus::Passed { .. }));
            prop_assert!(!passed);
        }
    }
}
