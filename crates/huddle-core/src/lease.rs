//! A coordinator with a lease, not a leader for life.
//!
//! The coordinator posts `lease.heartbeat` rows carrying its epoch; every
//! `lease.directive` it issues carries the same epoch. A directive whose epoch is
//! older than the latest heartbeat's is stale and is ignored: that fencing stops a
//! slow or partitioned ex-coordinator from giving orders after the group moved on.
//!
//! When no heartbeat arrives within the lease's ttl (judged with a passed-in `now` in
//! database time), the lease has lapsed and the successor is the **lowest agent id
//! among recently active agents**: agents (role `agent`) with any interaction in the
//! room whose `at` lies within [`LeaseRules::active_window_us`] before `now`. The
//! lapsed holder is passed over unless nobody else is active. Every relay computes
//! the same successor from the same ledger, with no vote; the successor heartbeats
//! with epoch + 1 ([`LeaseFold::due`]). Should that successor be dead too, the turn
//! passes to the next candidate for each further ttl the lease stays lapsed.
//!
//! The lease state is a join of its heartbeats (highest epoch wins; at one epoch the
//! lowest holder id wins a conflict; then the latest heartbeat), so it does not depend
//! on how actors' rows interleave. Whether a directive applies depends on the lease
//! as of the directive's place in the ledger, so it is not folded into the state: a
//! reader asks [`LeaseFold::check_directive`] when it reaches the directive, before
//! applying it. For an atomic hand-over a relay may also hold the claim
//! `lease/<room>/<name>` and heartbeat with the claim's epoch; the election here
//! decides who tries.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, NewInteraction, Role, Timestamp};
use crate::protocol::valid_name;
use crate::verbs::Verb;

pub use crate::protocol::lease::{
    LeaseDirectiveBody, LeaseHeartbeatBody, DEFAULT_LEASE, DEFAULT_TTL_MS, MAX_TTL_MS, MIN_TTL_MS,
};

/// The latest heartbeat state of one lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// Who holds it.
    pub holder: String,
    /// Its epoch.
    pub epoch: u64,
    /// Database time of the holder's latest heartbeat at this epoch.
    pub last_heartbeat: Timestamp,
    /// Its ttl, µs.
    pub ttl_us: i64,
    /// The highest renewal counter seen.
    pub beat: u64,
}

impl Lease {
    /// When the lease lapses without another heartbeat.
    pub fn expires_at(&self) -> Timestamp {
        self.last_heartbeat.saturating_add(self.ttl_us)
    }

    /// Joins another heartbeat into this state. Commutative and idempotent, so the
    /// state does not depend on fold order.
    fn join(&mut self, hb: Lease) {
        let ours = (self.epoch, std::cmp::Reverse(&self.holder));
        let theirs = (hb.epoch, std::cmp::Reverse(&hb.holder));
        if theirs > ours {
            *self = hb;
        } else if theirs == ours {
            if (hb.last_heartbeat, hb.ttl_us) > (self.last_heartbeat, self.ttl_us) {
                self.last_heartbeat = hb.last_heartbeat;
                self.ttl_us = hb.ttl_us;
            }
            self.beat = self.beat.max(hb.beat);
        }
    }
}

/// A lease at some `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum LeaseStatus {
    /// Nobody ever heartbeated this lease.
    Vacant,
    /// Held until `expires_at`.
    Held {
        /// The holder.
        holder: String,
        /// Its epoch.
        epoch: u64,
        /// When it lapses without another heartbeat.
        expires_at: Timestamp,
    },
    /// The holder missed its heartbeat; a successor should take over.
    Lapsed {
        /// The last holder.
        holder: String,
        /// Its epoch.
        epoch: u64,
        /// When it lapsed.
        expired_at: Timestamp,
    },
}

/// Whether a `lease.directive` applies, judged against the lease as folded so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "check")]
pub enum DirectiveCheck {
    /// It carries the current epoch and comes from the current holder: apply it.
    Applies {
        /// The lease.
        name: String,
        /// Its epoch.
        epoch: u64,
        /// The directive.
        directive: serde_json::Value,
    },
    /// It carries an epoch older than the latest heartbeat's: ignore it.
    Stale {
        /// The directive's epoch.
        epoch: u64,
        /// The lease's current epoch.
        current: u64,
    },
    /// The epoch is current but the actor is not the holder: ignore it.
    NotHolder {
        /// The current holder.
        holder: String,
    },
    /// No heartbeat at this epoch has been folded yet (a coordinator heartbeats
    /// before it directs): ignore it.
    Unfenced {
        /// The directive's epoch.
        epoch: u64,
    },
    /// The body did not parse: ignore it.
    Malformed,
}

/// Rules for the lease election (the caller passes them in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRules {
    /// How far back an agent's latest interaction may be for it to count as
    /// recently active, µs (default 10 minutes).
    pub active_window_us: i64,
    /// The ttl a successor's first heartbeat asks for, ms (default 90 s).
    pub ttl_ms: u64,
}

impl Default for LeaseRules {
    fn default() -> Self {
        LeaseRules {
            active_window_us: 600_000_000,
            ttl_ms: DEFAULT_TTL_MS,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
struct RoomLeases {
    leases: BTreeMap<String, Lease>,
    /// Agent to the database time of its latest interaction in the room.
    active: BTreeMap<String, Timestamp>,
    malformed: u64,
}

/// Coordinator leases and agent activity of every room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeaseFold {
    rooms: BTreeMap<String, RoomLeases>,
}

fn lease_name(name: Option<String>) -> Option<String> {
    let name = name.unwrap_or_else(|| DEFAULT_LEASE.to_string());
    valid_name(&name).then_some(name)
}

impl LeaseFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// The latest heartbeat state of a lease.
    pub fn lease(&self, room: &str, name: &str) -> Option<&Lease> {
        self.rooms.get(room)?.leases.get(name)
    }

    /// How many `lease.*` bodies in the room did not parse (they were ignored).
    pub fn malformed(&self, room: &str) -> u64 {
        self.rooms.get(room).map_or(0, |r| r.malformed)
    }

    /// The lease at database time `now`.
    pub fn status(&self, room: &str, name: &str, now: Timestamp) -> LeaseStatus {
        match self.lease(room, name) {
            None => LeaseStatus::Vacant,
            Some(l) if now > l.expires_at() => LeaseStatus::Lapsed {
                holder: l.holder.clone(),
                epoch: l.epoch,
                expired_at: l.expires_at(),
            },
            Some(l) => LeaseStatus::Held {
                holder: l.holder.clone(),
                epoch: l.epoch,
                expires_at: l.expires_at(),
            },
        }
    }

    /// Agents with an interaction in the room within the active window before `now`,
    /// sorted by id.
    pub fn recently_active(&self, room: &str, now: Timestamp, rules: &LeaseRules) -> Vec<String> {
        let since = now.saturating_sub(rules.active_window_us.max(0));
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.active.iter())
            .filter(|(_, at)| **at >= since)
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Who should take the lease over at `now`: `None` while it is held or when no
    /// agent is recently active; otherwise the lowest recently active agent id,
    /// passing over the lapsed holder unless it is the only one.
    ///
    /// Liveness fallback: a successor that is itself dead would otherwise block the
    /// election until it leaves the active window. So for every further ttl the lease
    /// stays lapsed, the turn passes to the next candidate in id order (round robin).
    /// Two relays that disagree at a turn boundary may both take over at the same
    /// epoch; the lease's join keeps the lower holder id, so they still converge.
    pub fn successor(
        &self,
        room: &str,
        name: &str,
        now: Timestamp,
        rules: &LeaseRules,
    ) -> Option<String> {
        let (lapsed_holder, turn) = match (self.status(room, name, now), self.lease(room, name)) {
            (LeaseStatus::Held { .. }, _) => return None,
            (
                LeaseStatus::Lapsed {
                    holder, expired_at, ..
                },
                Some(l),
            ) => {
                let turn = now.micros_since(expired_at) / l.ttl_us.max(1);
                (Some(holder), u64::try_from(turn).unwrap_or(0))
            }
            _ => (None, 0),
        };
        let active = self.recently_active(room, now, rules);
        let mut candidates: Vec<&String> = active
            .iter()
            .filter(|a| Some(*a) != lapsed_holder.as_ref())
            .collect();
        if candidates.is_empty() {
            candidates = active.iter().collect();
        }
        if candidates.is_empty() {
            return None;
        }
        let n = candidates.len() as u64;
        let pick = usize::try_from(turn % n).unwrap_or(0);
        candidates.get(pick).map(|s| s.to_string())
    }

    /// The heartbeat agent `me` should append at `now`, if any: a renewal (same
    /// epoch, next beat) once a third of the ttl has passed while `me` holds the
    /// lease, or a takeover (epoch + 1) when the lease is vacant or lapsed and `me`
    /// is the successor.
    pub fn due(
        &self,
        room: &str,
        name: &str,
        me: &str,
        now: Timestamp,
        rules: &LeaseRules,
    ) -> Option<NewInteraction> {
        let body = match (self.status(room, name, now), self.lease(room, name)) {
            (LeaseStatus::Held { holder, .. }, Some(l)) => {
                let renew_at = l.last_heartbeat.saturating_add(l.ttl_us / 3);
                if holder != me || now < renew_at {
                    return None;
                }
                LeaseHeartbeatBody {
                    name: Some(name.to_string()),
                    holder: Some(me.to_string()),
                    epoch: l.epoch,
                    ttl_ms: Some(u64::try_from(l.ttl_us / 1000).unwrap_or(DEFAULT_TTL_MS)),
                    beat: l.beat.saturating_add(1),
                }
            }
            (LeaseStatus::Held { .. }, None) => return None,
            (_, lease) => {
                if self.successor(room, name, now, rules).as_deref() != Some(me) {
                    return None;
                }
                LeaseHeartbeatBody {
                    name: Some(name.to_string()),
                    holder: Some(me.to_string()),
                    epoch: lease.map_or(1, |l| l.epoch.saturating_add(1)),
                    ttl_ms: Some(rules.ttl_ms.clamp(MIN_TTL_MS, MAX_TTL_MS)),
                    beat: 0,
                }
            }
        };
        let body = serde_json::to_value(body).ok()?;
        Some(NewInteraction::new(
            room,
            Verb::LeaseHeartbeat,
            me,
            Role::Agent,
            body,
        ))
    }

    /// Whether a `lease.directive` applies against the lease as folded so far. Call
    /// it when the reader reaches the directive in ledger order. `None` for any other
    /// verb.
    pub fn check_directive(&self, i: &Interaction) -> Option<DirectiveCheck> {
        if i.verb != Verb::LeaseDirective {
            return None;
        }
        let Ok(body) = LeaseDirectiveBody::deserialize(&i.body) else {
            return Some(DirectiveCheck::Malformed);
        };
        let Some(name) = lease_name(body.name) else {
            return Some(DirectiveCheck::Malformed);
        };
        let check = match self.lease(&i.room, &name) {
            None => DirectiveCheck::Unfenced { epoch: body.epoch },
            Some(l) if body.epoch < l.epoch => DirectiveCheck::Stale {
                epoch: body.epoch,
                current: l.epoch,
            },
            Some(l) if body.epoch > l.epoch => DirectiveCheck::Unfenced { epoch: body.epoch },
            Some(l) if l.holder != i.actor => DirectiveCheck::NotHolder {
                holder: l.holder.clone(),
            },
            Some(l) => DirectiveCheck::Applies {
                name,
                epoch: l.epoch,
                directive: body.directive,
            },
        };
        Some(check)
    }

    fn heartbeat(i: &Interaction) -> Option<(String, Lease)> {
        let body = LeaseHeartbeatBody::deserialize(&i.body).ok()?;
        let name = lease_name(body.name)?;
        let holder = match body.holder {
            None => i.actor.clone(),
            Some(h) if h == i.actor || i.role == Role::System => h,
            Some(_) => return None,
        };
        if !valid_name(&holder) {
            return None;
        }
        let ttl_ms = body
            .ttl_ms
            .unwrap_or(DEFAULT_TTL_MS)
            .clamp(MIN_TTL_MS, MAX_TTL_MS);
        Some((
            name,
            Lease {
                holder,
                epoch: body.epoch,
                last_heartbeat: i.at,
                ttl_us: i64::try_from(ttl_ms).unwrap_or(i64::MAX / 1000) * 1000,
                beat: body.beat,
            },
        ))
    }
}

impl Fold for LeaseFold {
    fn apply(&mut self, i: &Interaction) {
        let room = self.rooms.entry(i.room.clone()).or_default();
        if i.role == Role::Agent {
            let last = room.active.entry(i.actor.clone()).or_insert(i.at);
            *last = (*last).max(i.at);
        }
        match i.verb {
            Verb::LeaseHeartbeat => match Self::heartbeat(i) {
                Some((name, hb)) => match room.leases.get_mut(&name) {
                    Some(l) => l.join(hb),
                    None => {
                        room.leases.insert(name, hb);
                    }
                },
                None => room.malformed += 1,
            },
            Verb::LeaseDirective => {
                let ok = LeaseDirectiveBody::deserialize(&i.body)
                    .ok()
                    .and_then(|b| lease_name(b.name))
                    .is_some();
                if !ok {
                    room.malformed += 1;
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

    const ROOM: &str = "ops";
    const T0: Timestamp = Timestamp(1_700_000_000 * SEC);

    fn hb(who: &str, epoch: u64, at: Timestamp, beat: u64) -> Interaction {
        row(
            ROOM,
            Verb::LeaseHeartbeat,
            who,
            Role::Agent,
            at,
            json!({"epoch": epoch, "ttl_ms": 90_000, "beat": beat}),
        )
    }

    fn directive(who: &str, epoch: u64, at: Timestamp) -> Interaction {
        row(
            ROOM,
            Verb::LeaseDirective,
            who,
            Role::Agent,
            at,
            json!({"epoch": epoch, "directive": {"assign": "t1", "to": "w2"}}),
        )
    }

    fn msg(who: &str, at: Timestamp) -> Interaction {
        row(
            ROOM,
            Verb::MessagePosted,
            who,
            Role::Agent,
            at,
            json!({"text": "working"}),
        )
    }

    #[test]
    fn lapsed_coordinator_is_succeeded_by_lowest_active_id_and_fenced() {
        // c coordinates at epoch 1 (heartbeat every 30 s, ttl 90 s) and dies at T0.
        let rows = positioned(vec![
            hb("c", 1, T0, 0),
            msg("w2", T0 + 60 * SEC),
            msg("w1", T0 + 80 * SEC),
            msg("zz", T0 - 3_600 * SEC), // long gone: not recently active
            row(
                ROOM,
                Verb::MessagePosted,
                "ana",
                Role::Human,
                T0 + 85 * SEC,
                json!({"text": "hi"}),
            ),
        ]);
        let f: LeaseFold = fold_checked(&rows);
        let rules = LeaseRules::default();
        assert!(matches!(
            f.status(ROOM, DEFAULT_LEASE, T0 + 90 * SEC),
            LeaseStatus::Held { epoch: 1, .. }
        ));
        assert_eq!(
            f.successor(ROOM, DEFAULT_LEASE, T0 + 90 * SEC, &rules),
            None
        );
        let now = T0 + 91 * SEC;
        assert!(matches!(
            f.status(ROOM, DEFAULT_LEASE, now),
            LeaseStatus::Lapsed { epoch: 1, .. }
        ));
        assert_eq!(
            f.recently_active(ROOM, now, &rules),
            vec!["c".to_string(), "w1".to_string(), "w2".to_string()]
        );
        // c is passed over; w1 < w2.
        assert_eq!(
            f.successor(ROOM, DEFAULT_LEASE, now, &rules).as_deref(),
            Some("w1")
        );
        assert!(f.due(ROOM, DEFAULT_LEASE, "w2", now, &rules).is_none());
        // Had w1 not taken over within another ttl, w2's turn would come, then w1's.
        let later = T0 + (90 + 91) * SEC;
        assert_eq!(
            f.successor(ROOM, DEFAULT_LEASE, later, &rules).as_deref(),
            Some("w2")
        );
        assert_eq!(
            f.successor(ROOM, DEFAULT_LEASE, later + 90 * SEC, &rules)
                .as_deref(),
            Some("w1")
        );
        let takeover = f.due(ROOM, DEFAULT_LEASE, "w1", now, &rules).unwrap();
        assert_eq!(takeover.body["epoch"], 2);

        let mut f = f;
        f.apply(&from_new(takeover, now));
        // The old coordinator wakes up and gives an order at epoch 1: stale.
        assert_eq!(
            f.check_directive(&directive("c", 1, now + SEC)),
            Some(DirectiveCheck::Stale {
                epoch: 1,
                current: 2
            })
        );
        assert!(matches!(
            f.check_directive(&directive("w1", 2, now + SEC)),
            Some(DirectiveCheck::Applies { epoch: 2, .. })
        ));
        assert!(matches!(
            f.check_directive(&directive("w2", 2, now + SEC)),
            Some(DirectiveCheck::NotHolder { .. })
        ));
        assert!(matches!(
            f.check_directive(&directive("w2", 3, now + SEC)),
            Some(DirectiveCheck::Unfenced { epoch: 3 })
        ));
        // Its late heartbeat at epoch 1 does not take the lease back.
        f.apply(&hb("c", 1, now + 2 * SEC, 1));
        assert_eq!(f.lease(ROOM, DEFAULT_LEASE).unwrap().holder, "w1");
    }

    #[test]
    fn holder_renews_after_a_third_of_the_ttl() {
        let f = LeaseFold::rebuild(&positioned(vec![hb("c", 4, T0, 7)]));
        let rules = LeaseRules::default();
        assert!(f
            .due(ROOM, DEFAULT_LEASE, "c", T0 + 29 * SEC, &rules)
            .is_none());
        let renewal = f
            .due(ROOM, DEFAULT_LEASE, "c", T0 + 30 * SEC, &rules)
            .unwrap();
        assert_eq!(renewal.body["epoch"], 4);
        assert_eq!(renewal.body["beat"], 8);
        assert!(f
            .due(ROOM, DEFAULT_LEASE, "w1", T0 + 30 * SEC, &rules)
            .is_none());
    }

    #[test]
    fn vacant_lease_elects_lowest_active_agent_at_epoch_one() {
        let f = LeaseFold::rebuild(&positioned(vec![msg("b", T0), msg("a", T0), msg("c", T0)]));
        let rules = LeaseRules::default();
        assert_eq!(f.status(ROOM, DEFAULT_LEASE, T0), LeaseStatus::Vacant);
        let hb = f.due(ROOM, DEFAULT_LEASE, "a", T0, &rules).unwrap();
        assert_eq!(hb.body["epoch"], 1);
        // Nobody active: nobody elected.
        assert_eq!(
            f.successor(ROOM, DEFAULT_LEASE, T0 + 3_600 * SEC, &rules),
            None
        );
    }

    #[test]
    fn only_a_relay_may_heartbeat_for_someone_else_and_bad_bodies_are_counted() {
        let forged = row(
            ROOM,
            Verb::LeaseHeartbeat,
            "mallory",
            Role::Agent,
            T0,
            json!({"epoch": 9, "holder": "c"}),
        );
        let relay = row(
            ROOM,
            Verb::LeaseHeartbeat,
            "relay-1",
            Role::System,
            T0,
            json!({"epoch": 2, "holder": "c"}),
        );
        let bad = [
            json!({}),
            json!({"epoch": -1}),
            json!({"epoch": "1"}),
            json!({"epoch": 1, "name": ""}),
        ];
        let mut rows = vec![forged, relay];
        rows.extend(
            bad.iter()
                .map(|b| row(ROOM, Verb::LeaseHeartbeat, "a", Role::Agent, T0, b.clone())),
        );
        rows.push(row(
            ROOM,
            Verb::LeaseDirective,
            "a",
            Role::Agent,
            T0,
            json!({"no": "epoch"}),
        ));
        let f = LeaseFold::rebuild(&positioned(rows));
        assert_eq!(f.malformed(ROOM), 1 + bad.len() as u64 + 1);
        let l = f.lease(ROOM, DEFAULT_LEASE).unwrap();
        assert_eq!((l.holder.as_str(), l.epoch), ("c", 2));
        assert_eq!(
            f.check_directive(&row(
                ROOM,
                Verb::LeaseDirective,
                "c",
                Role::Agent,
                T0,
                json!([])
            )),
            Some(DirectiveCheck::Malformed)
        );
    }

    fn lease_rows() -> impl Strategy<Value = Vec<Interaction>> {
        let who = prop::sample::select(vec!["a", "b", "c", "d"]);
        let item = (who, 0u64..5, 0i64..300, 0u8..3, 0u64..3).prop_map(|(w, e, s, kind, beat)| {
            let at = T0 + s * SEC;
            match kind {
                0 => hb(w, e, at, beat),
                1 => directive(w, e, at),
                _ => msg(w, at),
            }
        });
        prop::collection::vec(item, 0..30)
    }

    proptest! {
        /// The state hash does not depend on how actors' rows interleave.
        #[test]
        fn any_interleaving_gives_the_same_state(
            (rows, shuffled) in lease_rows().prop_flat_map(|rows| (Just(rows.clone()), interleaving(rows))),
        ) {
            let reference = LeaseFold::rebuild(&positioned(rows)).state_hash();
            prop_assert_eq!(LeaseFold::rebuild(&shuffled).state_hash(), reference);
        }

        /// A directive older than the latest folded heartbeat never applies, and one
        /// that applies is from the holder at the current epoch.
        #[test]
        fn stale_directives_never_apply(rows in lease_rows()) {
            let mut f = LeaseFold::new();
            for r in positioned(rows) {
                if let Some(check) = f.check_directive(&r) {
                    let epoch = r.body["epoch"].as_u64().unwrap_or(0);
                    let lease = f.lease(ROOM, DEFAULT_LEASE);
                    let current = lease.map(|l| l.epoch);
                    if current.is_some_and(|c| epoch < c) {
                        prop_assert!(!matches!(check, DirectiveCheck::Applies { .. }), "{check:?}");
                    }
                    if let DirectiveCheck::Applies { epoch: e, .. } = check {
                        prop_assert_eq!(Some(e), current);
                        prop_assert_eq!(Some(r.actor.as_str()), lease.map(|l| l.holder.as_str()));
                    }
                }
                f.apply(&r);
            }
        }

        /// Every relay elects the same successor however the rows interleave, and it
        /// is always a recently active agent.
        #[test]
        fn election_is_deterministic(
            (rows, shuffled) in lease_rows().prop_flat_map(|rows| (Just(rows.clone()), interleaving(rows))),
            now in 0i64..900,
        ) {
            let rules = LeaseRules { active_window_us: 120 * SEC, ..LeaseRules::default() };
            let now = T0 + now * SEC;
            let a = LeaseFold::rebuild(&positioned(rows));
            let b = LeaseFold::rebuild(&shuffled);
            let s = a.successor(ROOM, DEFAULT_LEASE, now, &rules);
            prop_assert_eq!(&s, &b.successor(ROOM, DEFAULT_LEASE, now, &rules));
            if let Some(s) = s {
                prop_assert!(a.recently_active(ROOM, now, &rules).contains(&s));
            }
        }
    }
}
