//! Policies: the only code that branches on the room's topology.
//!
//! The mechanism (claims, folds, the synchronizer) is the same for every topology; it
//! asks these functions three questions and never looks at [`Responder`] or
//! [`Allocation`] itself:
//!
//! - [`responder_delay_ms`]: how long an agent waits before contending for the reply
//!   claim of a message (`race`: nobody waits; `designated` / `role-priority`: the
//!   preferred agent goes at once, everyone else after the fallback window, so a
//!   silent preferred agent degrades to a race and the claim still picks exactly one).
//! - [`claim_right`]: who may claim a ready task now (an `@agent` assignee first, for
//!   one claim lease, under every allocation; then `pull` and `push`: any capable
//!   agent; `bid`: nobody while
//!   the bid window is open, then the winning bidder, then anyone capable if the
//!   winner has not claimed within one more window; no bids falls back to pull).
//! - [`winning_bid`] / [`bid_score`]: the deterministic contract-net award.
//!
//! Capability matching is the same everywhere: an agent can take a task when it
//! declares every capability in the task's `needs`.

use crate::config::{Allocation, Responder, RoomConfig};
use crate::model::Timestamp;
use crate::tasks::{Task, TaskBid};

/// Microseconds per millisecond (config is in ms, timestamps in µs).
const US_PER_MS: i64 = 1_000;

fn ms_to_us(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX / US_PER_MS)
        .saturating_mul(US_PER_MS)
}

/// An agent that may answer a message, as the responder policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponderCandidate<'a> {
    /// The agent key.
    pub agent: &'a str,
    /// Its `role-priority` rank (lower goes first).
    pub priority: u32,
}

/// How long `agent` waits, in ms after the message, before contending for its reply
/// claim. `candidates` are every agent eligible to answer (on every relay), `agent`
/// among them.
///
/// - `race`: 0 for everyone.
/// - `designated`: 0 for `responder_agent`, the fallback window for the others; 0 for
///   everyone when the designated agent is not a candidate.
/// - `role-priority`: 0 for the candidates with the lowest priority rank, the fallback
///   window for the others.
pub fn responder_delay_ms(
    config: &RoomConfig,
    agent: &str,
    candidates: &[ResponderCandidate<'_>],
) -> u64 {
    let window = config.responder_window_ms;
    match config.responder {
        Responder::Race => 0,
        Responder::Designated => match config.responder_agent.as_deref() {
            Some(pref) if candidates.iter().any(|c| c.agent == pref) => {
                if agent == pref {
                    0
                } else {
                    window
                }
            }
            _ => 0,
        },
        Responder::RolePriority => {
            let best = candidates.iter().map(|c| c.priority).min();
            let mine = candidates
                .iter()
                .find(|c| c.agent == agent)
                .map(|c| c.priority);
            match (best, mine) {
                (Some(b), Some(m)) if m > b => window,
                _ => 0,
            }
        }
    }
}

/// Whether an agent declaring `capabilities` can take a task that `needs` these.
pub fn capable(needs: &[String], capabilities: &[String]) -> bool {
    needs.iter().all(|n| capabilities.iter().any(|c| c == n))
}

/// Who may claim a ready task now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimRight {
    /// Any capable agent.
    Anyone,
    /// Only this agent (the assignee, or the winning bidder).
    Only(String),
    /// The bid window is open until `closes_at` (µs): capable agents bid, nobody
    /// claims.
    Bidding {
        /// Database time at which the window closes.
        closes_at: Timestamp,
    },
}

impl ClaimRight {
    /// Whether `agent` (declaring `capabilities`) may claim `task` under this right.
    pub fn allows(&self, agent: &str, capabilities: &[String], task: &Task) -> bool {
        match self {
            ClaimRight::Anyone => capable(&task.needs, capabilities),
            ClaimRight::Only(a) => a == agent,
            ClaimRight::Bidding { .. } => false,
        }
    }

    /// The next moment this right changes by itself (a window closing), if any.
    pub fn changes_at(&self, config: &RoomConfig, ready_since: Timestamp) -> Option<Timestamp> {
        let window = ms_to_us(config.bid_window_ms);
        match self {
            ClaimRight::Bidding { closes_at } => Some(*closes_at),
            ClaimRight::Only(_) if config.allocation == Allocation::Bid => {
                Some(ready_since.saturating_add(window).saturating_add(window))
            }
            _ => None,
        }
    }
}

/// Who may claim `task` (ready since `ready_since`) at `now`, under the room's
/// allocation policy.
pub fn claim_right(
    config: &RoomConfig,
    task: &Task,
    ready_since: Timestamp,
    now: Timestamp,
) -> ClaimRight {
    // `@agent` means that agent under every allocation: the assignee has one claim
    // lease to take its ready task; after that the allocation decides (anyone capable
    // under pull and push; under bid the window has long closed), so an assignee that
    // is absent (a typo, a relay that died) never strands the task.
    if let Some(a) = &task.assignee {
        if now < ready_since.saturating_add(ms_to_us(config.claim_ttl_ms)) {
            return ClaimRight::Only(a.clone());
        }
    }
    match config.allocation {
        Allocation::Pull | Allocation::Push => ClaimRight::Anyone,
        Allocation::Bid => {
            let window = ms_to_us(config.bid_window_ms);
            let closes_at = ready_since.saturating_add(window);
            if now < closes_at {
                return ClaimRight::Bidding { closes_at };
            }
            match winning_bid(task) {
                // The winner has one more window to claim; then anyone capable may,
                // so a winner whose relay died never strands the task.
                Some(w) if now < closes_at.saturating_add(window) => {
                    ClaimRight::Only(w.agent.clone())
                }
                _ => ClaimRight::Anyone,
            }
        }
    }
}

/// When who may claim `task` (ready since `ready_since`) depends on the bids placed
/// until a database time (the `bid` allocation: the window's close), that time. A
/// claim decision is made only on a view that has folded every row committed before
/// it; `None` when bids decide nothing.
pub fn bids_decide_until(config: &RoomConfig, ready_since: Timestamp) -> Option<Timestamp> {
    (config.allocation == Allocation::Bid)
        .then(|| ready_since.saturating_add(ms_to_us(config.bid_window_ms)))
}

/// Whether agents bid on ready tasks when they see them (the `bid` allocation).
pub fn bids_on_sight(config: &RoomConfig) -> bool {
    config.allocation == Allocation::Bid
}

/// The rank of a bid; a lower rank is a better bid. Compared field by field:
/// lower declared load first, then fewer capabilities the task does not need (keep
/// generalists free for work only they can do), then the lower agent id, so two
/// different bidders never tie.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BidScore {
    /// Declared load.
    pub load: u32,
    /// Declared capabilities the task does not need.
    pub extra_capabilities: usize,
    /// The bidder (the final tiebreak).
    pub agent: String,
}

/// The score of `bid` for `task`, or `None` when the bidder lacks a needed capability
/// (such a bid never wins).
pub fn bid_score(task: &Task, bid: &TaskBid) -> Option<BidScore> {
    if !capable(&task.needs, &bid.capabilities) {
        return None;
    }
    let extra = bid
        .capabilities
        .iter()
        .filter(|c| !task.needs.contains(c))
        .count();
    Some(BidScore {
        load: bid.load,
        extra_capabilities: extra,
        agent: bid.agent.clone(),
    })
}

/// The winning bid among the task's bids for its next attempt: the best
/// [`BidScore`]. `None` when no capable agent bid.
pub fn winning_bid(task: &Task) -> Option<&TaskBid> {
    task.bids
        .values()
        .filter_map(|b| bid_score(task, b).map(|s| (s, b)))
        .min_by(|x, y| x.0.cmp(&y.0))
        .map(|(_, b)| b)
}

/// Every bidder for the task's next attempt other than `winner`, sorted: the agents
/// that must be sent an explicit `task.rejected` when `winner` claims.
pub fn losing_bidders<'a>(task: &'a Task, winner: &str) -> Vec<&'a str> {
    task.bids
        .keys()
        .map(String::as_str)
        .filter(|a| *a != winner)
        .collect()
}

/// Who may re-take a task whose owner's claim may have lapsed (the reconcile pass):
/// any capable agent, whatever the allocation. A lapsed lease means the owner's relay
/// stopped renewing it; for an assigned task the owner was the assignee, so keeping the task
/// for it would strand the task with its relay. Bidding is not repeated for a re-take:
/// the attempt was already allocated once.
pub fn retake_right(_config: &RoomConfig, _task: &Task) -> ClaimRight {
    ClaimRight::Anyone
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // case tables
mod tests {
    use super::*;
    use crate::fold::Fold;
    use crate::model::Role;
    use crate::tasks::TaskDag;
    use crate::testing::{bid, ix, Ledger};
    use crate::verbs::Verb;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn cfg(responder: Responder, pref: Option<&str>, allocation: Allocation) -> RoomConfig {
        RoomConfig {
            responder,
            responder_agent: pref.map(str::to_string),
            allocation,
            ..RoomConfig::default()
        }
    }

    fn cand(agent: &str, priority: u32) -> ResponderCandidate<'_> {
        ResponderCandidate { agent, priority }
    }

    #[test]
    fn responder_delays() {
        use Responder::*;
        let all = [cand("bo", 10), cand("cy", 20), cand("dee", 10)];
        let no_bo = [cand("cy", 20), cand("dee", 30)];
        // (policy, preferred, candidates, agent, expected delay)
        let cases: Vec<(
            Responder,
            Option<&str>,
            &[ResponderCandidate<'_>],
            &str,
            u64,
        )> = vec![
            (Race, None, &all, "bo", 0),
            (Race, Some("cy"), &all, "bo", 0),
            (Designated, Some("cy"), &all, "cy", 0),
            (Designated, Some("cy"), &all, "bo", 1_500),
            // The designated agent is not a candidate: a plain race.
            (Designated, Some("zed"), &all, "bo", 0),
            (Designated, None, &all, "bo", 0),
            (RolePriority, None, &all, "bo", 0),
            (RolePriority, None, &all, "dee", 0),
            (RolePriority, None, &all, "cy", 1_500),
            (RolePriority, None, &no_bo, "cy", 0),
            (RolePriority, None, &no_bo, "dee", 1_500),
        ];
        for (i, (r, pref, cands, agent, want)) in cases.into_iter().enumerate() {
            let c = cfg(r, pref, Allocation::Pull);
            assert_eq!(responder_delay_ms(&c, agent, cands), want, "case {i}");
        }
    }

    fn task_with_bids(needs: &[&str], bids: &[(&str, &[&str], u32)]) -> Task {
        let mut l = Ledger::default();
        l.push(
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "t", "label": "summarise 40 pages", "needs": needs, "assignee": "cy"}),
            ),
            Timestamp(0),
        );
        for (agent, caps, load) in bids {
            l.push(bid("t", agent, 1, caps, *load), Timestamp(1));
        }
        TaskDag::rebuild(&l.rows)
            .task("lobby", "t")
            .unwrap()
            .clone()
    }

    #[test]
    fn contract_net_worked_example() {
        // A is idle with the right model, B has three tasks queued, C lacks the tool.
        let t = task_with_bids(
            &["model"],
            &[
                ("a", &["model"], 0),
                ("b", &["model"], 3),
                ("c", &["browser"], 0),
            ],
        );
        assert_eq!(winning_bid(&t).map(|b| b.agent.as_str()), Some("a"));
        assert_eq!(losing_bidders(&t, "a"), vec!["b", "c"]);
        assert_eq!(bid_score(&t, &t.bids["c"]), None);
    }

    #[test]
    fn bid_ties_break_by_specialisation_then_agent() {
        let t = task_with_bids(&[], &[("zed", &[], 0), ("amy", &["x", "y"], 0)]);
        assert_eq!(winning_bid(&t).unwrap().agent, "zed");
        let t = task_with_bids(&[], &[("zed", &[], 0), ("amy", &[], 0)]);
        assert_eq!(winning_bid(&t).unwrap().agent, "amy");
        let t = task_with_bids(&["x"], &[("zed", &["y"], 0)]);
        assert_eq!(winning_bid(&t), None);
    }

    #[test]
    fn claim_rights_by_allocation_and_time() {
        use Allocation::*;
        let with_bids = task_with_bids(&[], &[("bo", &[], 1), ("dee", &[], 0)]);
        let no_bids = task_with_bids(&[], &[]);
        let mut unassigned = no_bids.clone();
        unassigned.assignee = None;
        let s = 1_000_000; // ready since 1 s; window 2 s
                           // (allocation, task, now, expected)
        let mut bids_unassigned = with_bids.clone();
        bids_unassigned.assignee = None;
        let lease = 60_000_000; // the default claim TTL
        let cases: Vec<(Allocation, &Task, i64, ClaimRight)> = vec![
            (Pull, &bids_unassigned, s, ClaimRight::Anyone),
            (Pull, &unassigned, s, ClaimRight::Anyone),
            // @cy means cy under every allocation, for one claim lease.
            (Pull, &no_bids, s, ClaimRight::Only("cy".into())),
            (Pull, &no_bids, s + lease - 1, ClaimRight::Only("cy".into())),
            (Pull, &no_bids, s + lease, ClaimRight::Anyone),
            (Bid, &with_bids, s, ClaimRight::Only("cy".into())),
            (
                Bid,
                &with_bids,
                s + lease - 1,
                ClaimRight::Only("cy".into()),
            ),
            (Bid, &with_bids, s + lease, ClaimRight::Anyone),
            (Push, &no_bids, s, ClaimRight::Only("cy".into())),
            (
                Push,
                &no_bids,
                s + 60_000_000 - 1,
                ClaimRight::Only("cy".into()),
            ),
            // One claim lease (default 60 s) after it became ready: anyone.
            (Push, &no_bids, s + 60_000_000, ClaimRight::Anyone),
            (Push, &unassigned, s, ClaimRight::Anyone),
            (
                Bid,
                &bids_unassigned,
                s,
                ClaimRight::Bidding {
                    closes_at: Timestamp(s + 2_000_000),
                },
            ),
            (
                Bid,
                &bids_unassigned,
                s + 1_999_999,
                ClaimRight::Bidding {
                    closes_at: Timestamp(s + 2_000_000),
                },
            ),
            (
                Bid,
                &bids_unassigned,
                s + 2_000_000,
                ClaimRight::Only("dee".into()),
            ),
            (Bid, &bids_unassigned, s + 4_000_000, ClaimRight::Anyone),
            (Bid, &unassigned, s + 2_000_000, ClaimRight::Anyone),
        ];
        for (i, (alloc, task, now, want)) in cases.into_iter().enumerate() {
            let c = cfg(Responder::Race, None, alloc);
            assert_eq!(
                claim_right(&c, task, Timestamp(s), Timestamp(now)),
                want,
                "case {i}"
            );
        }
        assert!(ClaimRight::Anyone.allows("x", &[], &no_bids));
        assert!(!ClaimRight::Only("cy".into()).allows("x", &[], &no_bids));
        assert!(!ClaimRight::Bidding {
            closes_at: Timestamp(0)
        }
        .allows("x", &[], &no_bids));
        let needs_rust = task_with_bids(&["rust"], &[]);
        assert!(!ClaimRight::Anyone.allows("x", &[], &needs_rust));
        assert!(ClaimRight::Anyone.allows("x", &["rust".into()], &needs_rust));
        let push = cfg(Responder::Race, None, Push);
        assert_eq!(retake_right(&push, &no_bids), ClaimRight::Anyone);
        assert_eq!(retake_right(&push, &unassigned), ClaimRight::Anyone);
    }

    fn arb_bids() -> impl Strategy<Value = (Vec<String>, Vec<(String, Vec<String>, u32)>)> {
        let cap = prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(str::to_string);
        let needs = prop::collection::vec(cap.clone(), 0..3);
        let one = (
            prop::sample::select(vec!["p", "q", "r", "s", "t", "u"]).prop_map(str::to_string),
            prop::collection::vec(cap, 0..4),
            0u32..3,
        );
        (needs, prop::collection::vec(one, 0..8))
    }

    proptest! {
        /// Every bid set has exactly one winner when some capable agent bid, and none
        /// otherwise; the winner beats every other capable bid strictly and does not
        /// depend on the order the bids arrived in.
        #[test]
        fn exactly_one_winner((needs, bids) in arb_bids(), seed in any::<u64>()) {
            let needs_ref: Vec<&str> = needs.iter().map(String::as_str).collect();
            let as_refs: Vec<(&str, Vec<&str>, u32)> = bids
                .iter()
                .map(|(a, c, l)| (a.as_str(), c.iter().map(String::as_str).collect(), *l))
                .collect();
            let table: Vec<(&str, &[&str], u32)> =
                as_refs.iter().map(|(a, c, l)| (*a, c.as_slice(), *l)).collect();
            let t = task_with_bids(&needs_ref, &table);
            // The same bids in another order.
            let mut rotated = table.clone();
            if !rotated.is_empty() {
                let k = (seed as usize) % rotated.len();
                rotated.rotate_left(k);
                rotated.reverse();
            }
            let t2 = task_with_bids(&needs_ref, &rotated);
            let capable_bids: BTreeMap<&String, BidScore> = t
                .bids
                .iter()
                .filter_map(|(a, b)| bid_score(&t, b).map(|s| (a, s)))
                .collect();
            let w = winning_bid(&t);
            prop_assert_eq!(w.is_some(), !capable_bids.is_empty());
            if let Some(w) = w {
                let ws = &capable_bids[&w.agent];
                for (a, s) in &capable_bids {
                    if **a != w.agent {
                        prop_assert!(ws < s);
                    }
                }
                // First bid per agent counts, so compare winners only when each agent
                // bid once.
                let mut agents: Vec<&str> = table.iter().map(|b| b.0).collect();
                agents.sort();
                let unique = agents.windows(2).all(|p| p[0] != p[1]);
                if unique {
                    prop_assert_eq!(winning_bid(&t2).map(|b| b.agent.clone()), Some(w.agent.clone()));
                }
                prop_assert_eq!(losing_bidders(&t, &w.agent).len(), t.bids.len() - 1);
            }
        }
    }
}
