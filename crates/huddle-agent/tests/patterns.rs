//! Decisions, barriers and the coordinator lease through agent sessions, over the
//! in-memory store with a clock moved by hand.

use std::sync::Arc;
use std::time::Duration;

use huddle_agent::pattern_views::{
    BarrierArgs, BarrierArriveArgs, BarrierOpenArgs, DecisionArgs, DirectiveArgs, LeaseArgs,
    LeaseNameArgs, ProposeArgs, VoteArgs, VotersArg,
};
use huddle_agent::{AgentError, AgentSession};
use huddle_core::signing::OwnerSecret;
use huddle_core::{NewInteraction, Position, Role, Timestamp, Verb};
use huddle_store::memory::{ManualClock, MemoryStore};
use huddle_store::{Store, StoreOptions};
use serde_json::json;

const ROOM: &str = "ops";

struct Room {
    store: Arc<dyn Store>,
    clock: ManualClock,
}

impl Room {
    async fn new() -> Room {
        let clock = ManualClock::new(Timestamp(1_000_000_000));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(
            StoreOptions {
                poll_interval: Duration::from_millis(20),
                ..Default::default()
            },
            clock.clone(),
        ));
        let owner = OwnerSecret::from_seed([9; 32]);
        let rows = huddle_core::seed_room(ROOM, "ana", &owner, &[]).unwrap();
        store.append(rows).await.unwrap();
        Room { store, clock }
    }

    async fn agents(&self, keys: &[&str]) -> Vec<Arc<AgentSession>> {
        let mut out = Vec::new();
        for k in keys {
            let s = AgentSession::open(self.store.clone(), ROOM, k, vec![])
                .await
                .unwrap();
            out.push(Arc::new(s));
        }
        out
    }

    /// How many rows of `verb` the room holds.
    async fn count(&self, verb: Verb) -> usize {
        let batch = self
            .store
            .read_room(ROOM, Position::START, 10_000)
            .await
            .unwrap();
        batch.rows.iter().filter(|r| r.verb == verb).count()
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn proposal(id: &str, quorum: u64) -> ProposeArgs {
    ProposeArgs {
        id: id.into(),
        question: Some("ship it?".into()),
        voters: VotersArg::List(names(&["a", "b", "c", "d", "e"])),
        quorum_count: Some(quorum),
        window_ms: 60_000,
        ..Default::default()
    }
}

fn vote(id: &str, option: &str) -> VoteArgs {
    VoteArgs {
        id: id.into(),
        option: option.into(),
    }
}

#[tokio::test]
async fn five_agents_reach_quorum_and_the_outcome_is_recorded() {
    let room = Room::new().await;
    let ag = room.agents(&["a", "b", "c", "d", "e", "zed"]).await;
    let p = ag[0].propose(proposal("ship", 3)).await.unwrap();
    assert_eq!(p.decision.status, "open");
    assert_eq!(p.decision.proposer, "a");
    // The same proposal again is a retry; another one under the id is refused.
    assert!(
        !ag[0]
            .propose(proposal("ship", 3))
            .await
            .unwrap()
            .written
            .inserted
    );
    let taken = ag[1].propose(proposal("ship", 2)).await.unwrap_err();
    assert_eq!(taken.code(), "name_taken");

    // Someone waits for the outcome while the votes come in.
    let waiter = {
        let e = ag[4].clone();
        tokio::spawn(async move {
            e.decision(DecisionArgs {
                id: "ship".into(),
                wait_ms: Some(10_000),
            })
            .await
        })
    };
    ag[0].vote(vote("ship", "yes")).await.unwrap();
    let b = ag[1].vote(vote("ship", "yes")).await.unwrap();
    assert_eq!(b.decision.status, "open");
    assert_eq!(b.decision.your_vote.as_deref(), Some("yes"));
    // A non-voter, an option not offered and a changed vote are refused.
    let e = ag[5].vote(vote("ship", "yes")).await.unwrap_err();
    assert!(matches!(e, AgentError::NotListed { .. }), "{e}");
    let e = ag[2].vote(vote("ship", "maybe")).await.unwrap_err();
    assert_eq!(e.code(), "bad_argument");
    let e = ag[1].vote(vote("ship", "no")).await.unwrap_err();
    assert_eq!(e.code(), "already_voted");
    // The same vote again is a retry: one row.
    assert!(
        !ag[1]
            .vote(vote("ship", "yes"))
            .await
            .unwrap()
            .written
            .inserted
    );

    // The third concurring vote commits: 3 against at most 2 still to come.
    let c = ag[2].vote(vote("ship", "yes")).await.unwrap();
    assert_eq!(c.decision.status, "committed");
    assert_eq!(c.decision.option.as_deref(), Some("yes"));
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.status, "committed");
    assert!(waited.is_final);

    // The proposer's session writes the closing row, once.
    let seen = ag[0]
        .decision(DecisionArgs {
            id: "ship".into(),
            wait_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(seen.closed_by.as_deref(), Some("decision.committed"));
    ag[0]
        .decision(DecisionArgs {
            id: "ship".into(),
            wait_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(room.count(Verb::DecisionCommitted).await, 1);
    assert_eq!(room.count(Verb::DecisionVoted).await, 3);
    // A late vote still counts (before the deadline) but cannot change it.
    let d = ag[3].vote(vote("ship", "no")).await.unwrap();
    assert_eq!(d.decision.status, "committed");
    assert_eq!(d.decision.waiting_for, names(&["e"]));
}

#[tokio::test]
async fn a_vote_that_times_out_on_a_tie_escalates() {
    let room = Room::new().await;
    let ag = room.agents(&["a", "b", "c", "d", "e"]).await;
    ag[0].propose(proposal("merge", 2)).await.unwrap();
    for (i, option) in ["yes", "yes", "no", "no"].into_iter().enumerate() {
        ag[i].vote(vote("merge", option)).await.unwrap();
    }
    // Two against two with e outstanding: open until the deadline.
    let open = ag[4]
        .decision(DecisionArgs {
            id: "merge".into(),
            wait_ms: Some(50),
        })
        .await
        .unwrap();
    assert_eq!(open.status, "open");
    assert_eq!(open.waiting_for, names(&["e"]));

    // The deadline (60 s) and the grace (2 s) pass while someone waits.
    let waiter = {
        let d = ag[3].clone();
        tokio::spawn(async move {
            d.decision(DecisionArgs {
                id: "merge".into(),
                wait_ms: Some(10_000),
            })
            .await
        })
    };
    room.clock.advance(Duration::from_secs(63));
    let out = waiter.await.unwrap().unwrap();
    assert_eq!(out.status, "escalated");
    assert_eq!(out.reason.as_deref(), Some("thin-margin"));
    assert_eq!(out.margin, Some(0.0));

    let late = ag[4].vote(vote("merge", "yes")).await.unwrap_err();
    assert_eq!(late.code(), "too_late");
    // The proposer records the escalation for the owner.
    let closed = ag[0]
        .decision(DecisionArgs {
            id: "merge".into(),
            wait_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(closed.closed_by.as_deref(), Some("decision.escalated"));
    assert_eq!(room.count(Verb::DecisionEscalated).await, 1);
}

fn open(phase: &str, roster: &[&str], quorum: Option<u64>) -> BarrierOpenArgs {
    BarrierOpenArgs {
        phase: phase.into(),
        roster: names(roster),
        timeout_ms: 10_000,
        quorum,
        thread: None,
    }
}

fn arrive(phase: &str) -> BarrierArriveArgs {
    BarrierArriveArgs {
        phase: phase.into(),
    }
}

#[tokio::test]
async fn a_barrier_passes_when_its_roster_arrives() {
    let room = Room::new().await;
    let ag = room.agents(&["lead", "s1", "s2", "s3", "zed"]).await;
    let b = ag[0]
        .barrier_open(open("scrape", &["s1", "s2", "s3"], None))
        .await
        .unwrap();
    assert_eq!(b.barrier.status, "waiting");
    assert_eq!(b.barrier.missing, names(&["s1", "s2", "s3"]));
    let e = ag[4].barrier_arrive(arrive("scrape")).await.unwrap_err();
    assert_eq!(e.code(), "not_listed");
    let e = ag[1].barrier_arrive(arrive("nope")).await.unwrap_err();
    assert_eq!(e.code(), "no_barrier");

    let waiter = {
        let s1 = ag[1].clone();
        tokio::spawn(async move {
            s1.barrier_arrive(arrive("scrape")).await.unwrap();
            s1.barrier(BarrierArgs {
                phase: "scrape".into(),
                wait_ms: Some(10_000),
            })
            .await
        })
    };
    ag[2].barrier_arrive(arrive("scrape")).await.unwrap();
    let last = ag[3].barrier_arrive(arrive("scrape")).await.unwrap();
    assert!(last.barrier.you_checked_in);
    let passed = waiter.await.unwrap().unwrap();
    assert_eq!(passed.status, "passed");
    assert!(passed.dropped.is_empty());
    // The opener's session records it.
    let seen = ag[0]
        .barrier(BarrierArgs {
            phase: "scrape".into(),
            wait_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(seen.closed_by.as_deref(), Some("barrier.passed"));
    assert_eq!(room.count(Verb::BarrierPassed).await, 1);
}

#[tokio::test]
async fn a_barrier_passes_by_quorum_at_its_timeout() {
    let room = Room::new().await;
    let roster = ["s1", "s2", "s3", "s4", "s5"];
    let ag = room.agents(&["lead", "s1", "s2", "s3", "s4", "s5"]).await;
    ag[0]
        .barrier_open(open("scrape", &roster, Some(3)))
        .await
        .unwrap();
    let bad = ag[0].barrier_open(open("x", &roster, Some(6))).await;
    assert_eq!(bad.unwrap_err().code(), "bad_argument");
    for s in &ag[1..4] {
        s.barrier_arrive(arrive("scrape")).await.unwrap();
    }
    let waiter = {
        let s1 = ag[1].clone();
        tokio::spawn(async move {
            s1.barrier(BarrierArgs {
                phase: "scrape".into(),
                wait_ms: Some(10_000),
            })
            .await
        })
    };
    // The timeout (10 s) and the grace (2 s) pass: three of five is the quorum.
    room.clock.advance(Duration::from_secs(13));
    let passed = waiter.await.unwrap().unwrap();
    assert_eq!(passed.status, "passed");
    assert_eq!(passed.dropped, names(&["s4", "s5"]));
    let late = ag[4].barrier_arrive(arrive("scrape")).await.unwrap_err();
    assert_eq!(late.code(), "too_late");
}

fn lease(ttl_ms: u64) -> LeaseArgs {
    LeaseArgs {
        name: None,
        ttl_ms: Some(ttl_ms),
    }
}

fn directive(v: serde_json::Value) -> DirectiveArgs {
    DirectiveArgs {
        name: None,
        directive: v,
        idempotency_key: None,
    }
}

#[tokio::test]
async fn the_coordinator_lease_fails_over_and_stale_directives_are_ignored() {
    let room = Room::new().await;
    let ag = room.agents(&["w1", "w2", "w3"]).await;
    let (w1, w2, w3) = (&ag[0], &ag[1], &ag[2]);
    let held = w1.lease_acquire(lease(5_000)).await.unwrap();
    assert_eq!(held.lease.status, "held");
    assert!(held.lease.you_hold);
    let first = held.lease.epoch.unwrap();
    let e = w2.lease_acquire(lease(5_000)).await.unwrap_err();
    assert_eq!(e.code(), "lease_held");
    let e = w2.lease_renew(lease(5_000)).await.unwrap_err();
    assert_eq!(e.code(), "not_lease_holder");
    w1.lease_directive(directive(json!({"assign": "t1", "to": "w2"})))
        .await
        .unwrap();
    // Renewing keeps the epoch.
    room.clock.advance(Duration::from_secs(3));
    let renewed = w1.lease_renew(LeaseArgs::default()).await.unwrap();
    assert_eq!(renewed.lease.epoch, Some(first));
    assert_eq!(renewed.lease.ttl_ms, Some(5_000));

    // w1 stops renewing; once its lease lapsed, w2 takes over at a higher epoch.
    room.clock.advance(Duration::from_secs(6));
    let seen = w3.lease(LeaseNameArgs::default()).await.unwrap();
    assert_eq!(seen.status, "lapsed");
    let taken = w2.lease_acquire(lease(5_000)).await.unwrap();
    let second = taken.lease.epoch.unwrap();
    assert!(second > first);
    assert_eq!(taken.lease.holder.as_deref(), Some("w2"));

    // The ex-coordinator can neither renew nor direct.
    let e = w1.lease_renew(LeaseArgs::default()).await.unwrap_err();
    assert_eq!(e.code(), "stale_claim");
    assert!(e.to_string().contains("w2 took it"), "{e}");
    let e = w1
        .lease_directive(directive(json!({"assign": "t2", "to": "w1"})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "stale_claim");
    // A directive at the old epoch written around the claims (a partitioned writer)
    // is in the ledger, but judged stale.
    room.store
        .append(vec![NewInteraction::new(
            ROOM,
            Verb::LeaseDirective,
            "w1",
            Role::Agent,
            json!({"name": "coordinator", "epoch": first, "directive": {"assign": "t3", "to": "w1"}}),
        )])
        .await
        .unwrap();
    w2.lease_directive(directive(json!({"assign": "t3", "to": "w3"})))
        .await
        .unwrap();
    let view = w3.lease(LeaseNameArgs::default()).await.unwrap();
    let checks: Vec<(&str, u64, &str)> = view
        .directives
        .iter()
        .map(|d| (d.actor.as_str(), d.epoch, d.check.as_str()))
        .collect();
    assert_eq!(
        checks,
        vec![
            ("w1", first, "applies"),
            ("w1", first, "stale"),
            ("w2", second, "applies")
        ]
    );

    // Released, the lease goes to the next agent at once.
    w2.lease_release(LeaseNameArgs::default()).await.unwrap();
    let third = w3.lease_acquire(lease(5_000)).await.unwrap();
    assert!(third.lease.epoch.unwrap() > second);
    assert_eq!(third.lease.holder.as_deref(), Some("w3"));
}
