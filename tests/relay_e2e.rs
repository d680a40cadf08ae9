//! End-to-end: relays as separate OS processes over one database (plan 0008).
//!
//! Every scenario is an `async fn(Backend)`; `on_both_backends!` turns it into one
//! test per backend. Each test ends by stopping its relays with SIGTERM and checking
//! that every relay folded the same board and task state as the test itself.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::relays::*;
use huddle_core::{InteractionId, Role, TaskStatus, Verb};

/// One `#[tokio::test]` per backend for a scenario `async fn name(Backend)`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await
            }
        }
    )*};
}

on_both_backends!(
    one_reply_per_broadcast_under_race,
    dag_of_300_tasks_with_6_agents,
    dag_of_300_tasks_with_30_agents,
);

/// Three relays of two simulated agents each.
fn three_relays(h: &mut Huddle, turn_ms: u64) -> Vec<String> {
    let mut all = Vec::new();
    for r in 0..3 {
        let agents: Vec<AgentSpec> = (0..2)
            .map(|a| AgentSpec::sim_jitter(&format!("a{r}{a}"), turn_ms, 0.5, 7 + r))
            .collect();
        all.extend(agents.iter().map(|a| a.key.clone()));
        h.spawn_relay(&format!("r{r}"), agents);
    }
    all
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------------
// 1. Exactly one reply per addressed broadcast message under `race`
// ---------------------------------------------------------------------------------

async fn one_reply_per_broadcast_under_race(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let agents = three_relays(&mut h, 15);
    h.wait_registered(&strs(&agents)).await;
    // Four people post 200 messages in bursts: lift the per-sender rate cap.
    h.config("responder race rate 1000 rate-window 1s").await;

    let humans = ["hank", "hana", "hugo", "hedy"];
    let mut ids: Vec<InteractionId> = Vec::new();
    let mut n = 0usize;
    let mut burst = 1usize;
    while n < 200 {
        let size = burst.min(200 - n);
        let rows: Vec<(&str, Role, String)> = (n..n + size)
            .map(|i| (humans[i % 4], Role::Human, format!("question {i}: anyone?")))
            .collect();
        ids.extend(h.post_many(&rows).await);
        n += size;
        burst = burst % 13 + 1;
        tokio::time::sleep(ms(15)).await;
    }
    assert_eq!(ids.len(), 200);

    h.wait_until("a reply to each of 200 messages", secs(90), |l| {
        ids.iter().all(|id| !l.replies_to(*id).is_empty())
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;

    let mut by_agent: BTreeMap<String, usize> = BTreeMap::new();
    for id in &ids {
        let replies = h.ledger.replies_to(*id);
        let turns = h.ledger.turns_replied_to(*id);
        assert_eq!(
            replies.len(),
            1,
            "message {id:?} got {} replies",
            replies.len()
        );
        assert_eq!(
            turns.len(),
            1,
            "message {id:?}: {} turn.replied",
            turns.len()
        );
        assert_eq!(replies[0].actor, turns[0].actor);
        assert!(agents.contains(&replies[0].actor), "{}", replies[0].actor);
        *by_agent.entry(replies[0].actor.clone()).or_default() += 1;
    }
    // Every relay took part: the claims, not one process, settled who answers.
    for s in &summaries {
        assert!(
            s.turns_replied > 0,
            "relay {} answered nothing: {s:?}",
            s.relay
        );
    }
    let replied: u64 = summaries.iter().map(|s| s.turns_replied).sum();
    assert_eq!(replied, 200, "{summaries:#?}");
    eprintln!("race: 200 replies by {by_agent:?} in {:?}", h.elapsed());
}

// ---------------------------------------------------------------------------------
// 4. A 300-task DAG over 3 relays
// ---------------------------------------------------------------------------------

/// A deterministic 300-task DAG: each task waits for up to three of the fifteen
/// tasks before it; about one in eight is a root.
fn dag_text(n: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut text = String::from("!delegate\n");
    for i in 0..n {
        let mut deps = BTreeSet::new();
        if i > 0 && next() % 8 != 0 {
            let k = 1 + next() % 3;
            for _ in 0..k {
                let back = 1 + (next() as usize) % i.min(15);
                deps.insert(format!("t{:03}", i - back));
            }
        }
        if deps.is_empty() {
            text.push_str(&format!("t{i:03}: step {i}\n"));
        } else {
            let d: Vec<String> = deps.into_iter().collect();
            text.push_str(&format!("t{i:03}: step {i} [after {}]\n", d.join(", ")));
        }
    }
    text
}

async fn dag_over_three_relays(backend: Backend, per_relay: usize) {
    let mut h = Huddle::new(backend).await;
    let mut all = Vec::new();
    for r in 0..3 {
        let agents: Vec<AgentSpec> = (0..per_relay)
            .map(|a| AgentSpec::sim_jitter(&format!("a{r}{a:02}"), 10, 0.5, 3 + r as u64))
            .collect();
        all.extend(agents.iter().map(|a| a.key.clone()));
        h.spawn_relay(&format!("r{r}"), agents);
    }
    h.wait_registered(&strs(&all)).await;
    let reply = h.delegate(&dag_text(300)).await;
    assert!(reply.starts_with("Created 300 tasks"), "{reply}");
    h.wait_until("300 tasks done", secs(120), |l| l.summary().done == 300)
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;

    let done = h.ledger.assert_all_done_exactly_once(300);
    let s = h.ledger.summary();
    assert_eq!((s.ready, s.claimed, s.abandoned), (0, 0, 0), "{s:?}");
    // Claims respected dependencies too: no accepted claim before its deps were done.
    for c in h.ledger.claims() {
        let t = h.ledger.dag.task(&h.room, &c.task).expect("task");
        for d in &t.deps {
            assert!(
                done[d].index < c.index,
                "{} claimed before {d} was done",
                c.task
            );
        }
    }
    let mut per_agent: BTreeMap<&str, usize> = BTreeMap::new();
    for c in done.values() {
        *per_agent.entry(c.actor.as_str()).or_default() += 1;
    }
    for s in &summaries {
        assert!(s.turns_replied > 0, "relay {} did no task: {s:?}", s.relay);
    }
    assert!(
        h.ledger
            .dag
            .room(&h.room)
            .is_some_and(|r| r.tasks.values().all(|t| t.status == TaskStatus::Done)),
        "every task done"
    );
    eprintln!(
        "dag: 300 tasks, {} agents, {} agents worked, in {:?}: {summaries:?}",
        all.len(),
        per_agent.len(),
        h.elapsed()
    );
}

async fn dag_of_300_tasks_with_6_agents(backend: Backend) {
    dag_over_three_relays(backend, 2).await
}

async fn dag_of_300_tasks_with_30_agents(backend: Backend) {
    dag_over_three_relays(backend, 10).await
}

#[allow(dead_code)]
fn unused(_: Verb) {}
