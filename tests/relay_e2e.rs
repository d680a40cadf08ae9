//! End-to-end: relays as separate OS processes over one database (plan 0008).
//!
//! Every scenario is an `async fn(Backend)`; `on_both_backends!` turns it into one
//! test per backend. Each test ends by stopping its relays with SIGTERM and checking
//! that every relay folded the same board and task state as the test itself.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::relays::*;
use huddle_core::{InteractionId, Role, TaskStatus, Verb};

on_both_backends!(
    one_reply_per_broadcast_under_race,
    dag_of_300_tasks_with_6_agents,
    dag_of_300_tasks_with_30_agents,
    designated_agent_answers_and_silence_falls_back,
    four_topologies_switched_by_config,
    live_relay_keeps_its_claims_past_the_ttl,
    killed_relay_tasks_are_retaken_within_ttl,
    paused_relay_never_writes_under_a_stale_epoch,
    forged_completions_change_nothing,
    agent_text_is_never_a_command,
    failed_task_goes_to_an_idle_agent_elsewhere,
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

// ---------------------------------------------------------------------------------
// 2. `designated`: the named agent answers; when it is silent, another one does after
//    the fallback window
// ---------------------------------------------------------------------------------

/// Posts a message as `hank` and waits for its reply; returns (message, replier).
async fn ask(h: &mut Huddle, text: &str) -> (InteractionId, String) {
    let id = h.post("hank", Role::Human, text).await;
    let who = h
        .wait_for(&format!("a reply to {text:?}"), secs(30), |l| {
            l.replies_to(id).first().map(|r| r.actor.clone())
        })
        .await;
    (id, who)
}

async fn designated_agent_answers_and_silence_falls_back(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("dora", 20)]);
    h.spawn_relay(
        "r1",
        vec![AgentSpec::sim("b10", 20), AgentSpec::sim("b11", 20)],
    );
    h.spawn_relay(
        "r2",
        vec![AgentSpec::sim("b20", 20), AgentSpec::sim("b21", 20)],
    );
    h.wait_registered(&["dora", "b10", "b11", "b20", "b21"])
        .await;
    let window_us = 1_000_000;
    h.config("responder designated responder-agent dora responder-window 1s rate 100")
        .await;
    let mut asked = Vec::new();

    // The designated agent answers, one message after another.
    for i in 0..5 {
        let (id, who) = ask(&mut h, &format!("dora, status {i}?")).await;
        assert_eq!(who, "dora", "message {i} was answered by {who}");
        asked.push(id);
    }

    // Silent because its relay is frozen: another agent answers, after the window.
    h.relay("r0").pause();
    let (id, who) = ask(&mut h, "is anyone there while dora is frozen?").await;
    assert_ne!(who, "dora");
    let msg_at = h.ledger.get(id).expect("message").at;
    let (note, agent, _) = h.ledger.designations(id).remove(0);
    assert_eq!(agent, who);
    assert!(
        note.at - msg_at >= window_us,
        "{who} took the message {} µs after it was posted, inside the 1 s window",
        note.at - msg_at
    );
    asked.push(id);
    // Back again: dora answers new messages, and never the one another agent took.
    h.relay("r0").resume();
    let (id, who) = ask(&mut h, "dora, are you back?").await;
    assert_eq!(who, "dora");
    asked.push(id);

    // Silent because its relay is stopped: dora stays registered and designated.
    let early = h.relay("r0").terminate();
    assert_eq!(early.fenced_refusals, 0, "{early:?}");
    let (id, who) = ask(&mut h, "is anyone there while dora is away?").await;
    assert_ne!(who, "dora");
    let msg_at = h.ledger.get(id).expect("message").at;
    let (note, _, _) = h.ledger.designations(id).remove(0);
    assert!(note.at - msg_at >= window_us, "taken inside the window");
    asked.push(id);

    // Silent because every turn of hers fails (an exec agent that exits non-zero):
    // her failure is recorded and another agent answers.
    let failing = h.script(
        "fails.sh",
        "cat >/dev/null\necho 'out of order' >&2\nexit 3",
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("dora", &failing)]);
    let (id, who) = ask(&mut h, "dora, can you take this one?").await;
    assert_ne!(who, "dora");
    let failed = h.ledger.about(Verb::TurnFailed, &message_subject(id));
    assert!(
        failed.iter().any(|r| r.actor == "dora"),
        "dora's failed turn is not recorded: {failed:?}"
    );
    let notes = h.ledger.designations(id);
    assert_eq!(
        notes.first().map(|n| n.1.as_str()),
        Some("dora"),
        "she went first"
    );
    assert!(notes.last().is_some_and(|n| n.1 == who && n.2 > notes[0].2));
    // The others take over as soon as they read her failure, not a lease later.
    let failed_at = failed.iter().map(|r| r.at).min().expect("a failed turn");
    let taken_at = notes.last().map(|n| n.0.at).expect("a designation");
    assert!(
        taken_at - failed_at < 1_500_000,
        "{who} took over {} ms after dora's failure",
        (taken_at - failed_at) / 1000
    );
    asked.push(id);
    h.wait_quiescent(secs(30)).await;
    h.relay("r0").terminate();

    // A restarted relay reads the whole history, answers nothing twice, and is live.
    h.spawn_relay("r0", vec![AgentSpec::sim("dora", 20)]);
    let (id, who) = ask(&mut h, "dora, welcome back?").await;
    assert_eq!(who, "dora");
    asked.push(id);

    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    for id in &asked {
        assert_eq!(h.ledger.replies_to(*id).len(), 1, "replies to {id:?}");
        assert_eq!(h.ledger.turns_replied_to(*id).len(), 1);
    }
}

// ---------------------------------------------------------------------------------
// 3. Four topologies in one room, switched only by !config
// ---------------------------------------------------------------------------------

fn done_with_prefix(l: &Ledger, prefix: &str, n: usize) -> bool {
    l.dag.room(&l.room).is_some_and(|r| {
        r.tasks
            .values()
            .filter(|t| t.id.starts_with(prefix) && t.status == TaskStatus::Done)
            .count()
            == n
    })
}

async fn four_topologies_switched_by_config(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay(
        "r0",
        vec![AgentSpec::sim("lead", 30), AgentSpec::sim("w01", 30)],
    );
    h.spawn_relay(
        "r1",
        vec![AgentSpec::sim("w10", 30), AgentSpec::sim("w11", 30)],
    );
    h.spawn_relay(
        "r2",
        vec![AgentSpec::sim("w20", 30), AgentSpec::sim("w21", 30)],
    );
    let agents = ["lead", "w01", "w10", "w11", "w20", "w21"];
    h.wait_registered(&agents).await;

    // Peer race + pull: anyone answers, anyone takes any task.
    h.config("responder race allocation pull").await;
    let (_, who) = ask(&mut h, "peers: who takes this?").await;
    assert!(agents.contains(&who.as_str()));
    h.delegate(
        &(1..=8)
            .map(|i| format!("p{i}: peer job {i}\n"))
            .collect::<String>(),
    )
    .await;
    h.wait_until("peer tasks done", secs(30), |l| done_with_prefix(l, "p", 8))
        .await;
    let owners = h.ledger.owners();
    let peers: BTreeSet<&String> = owners
        .iter()
        .filter(|(t, _)| t.starts_with('p'))
        .map(|(_, a)| a)
        .collect();
    assert!(peers.len() >= 2, "8 peer tasks all went to {peers:?}");

    // Orchestrator + push: the lead answers, tasks go to their assignees.
    h.config("responder designated responder-agent lead allocation push")
        .await;
    let (_, who) = ask(&mut h, "lead, what is the plan?").await;
    assert_eq!(who, "lead");
    let assigned = [
        ("o1", "w10"),
        ("o2", "w11"),
        ("o3", "w20"),
        ("o4", "w21"),
        ("o5", "w01"),
    ];
    h.delegate(
        "o1: build part a @w10\n\
         o2: build part b @w11\n\
         o3: build part c @w20\n\
         o4: build part d @w21\n\
         o5: integrate [after o1, o2, o3, o4] @w01\n\
         o6: whoever is free",
    )
    .await;
    h.wait_until("orchestrated tasks done", secs(30), |l| {
        done_with_prefix(l, "o", 6)
    })
    .await;
    let owners = h.ledger.owners();
    for (task, agent) in assigned {
        assert_eq!(owners[task], agent, "{task} was done by {}", owners[task]);
    }

    // Pipeline DAG: stages run in dependency order.
    h.config("responder race allocation pull").await;
    h.delegate(
        "s1: fetch\n\
         s2: parse [after s1]\n\
         s3a: index [after s2]\n\
         s3b: summarise [after s2]\n\
         s4: publish [after s3a, s3b]",
    )
    .await;
    h.wait_until("pipeline done", secs(30), |l| done_with_prefix(l, "s", 5))
        .await;

    // Contract net: agents bid, the best bid claims, losers are told.
    h.config("allocation bid bid-window 300ms").await;
    h.delegate(
        &(1..=6)
            .map(|i| format!("b{i}: tender {i}\n"))
            .collect::<String>(),
    )
    .await;
    h.wait_until("tendered tasks done", secs(30), |l| {
        done_with_prefix(l, "b", 6)
    })
    .await;

    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let done = h.ledger.assert_all_done_exactly_once(8 + 6 + 5 + 6);
    // The pipeline's stages completed in order (dependencies are checked above too).
    assert!(done["s1"].index < done["s2"].index);
    assert!(done["s2"].index < done["s3a"].index.min(done["s3b"].index));
    assert!(done["s3a"].index.max(done["s3b"].index) < done["s4"].index);

    // Contract net: each tender was claimed by one of its bidders when it had any, and
    // every other bidder for that attempt was rejected by the winner.
    let l = &h.ledger;
    let bids: Vec<(usize, String, u32, String)> = l
        .of_verb(Verb::TaskBid)
        .map(|(i, r)| {
            (
                i,
                r.body["task"].as_str().unwrap_or_default().to_string(),
                r.body["attempt"].as_u64().unwrap_or_default() as u32,
                r.actor.clone(),
            )
        })
        .collect();
    assert!(!bids.is_empty(), "nobody bid under allocation bid");
    let mut tenders_awarded_to_bidders = 0;
    for c in l.claims().into_iter().filter(|c| c.task.starts_with('b')) {
        let bidders: BTreeSet<&String> = bids
            .iter()
            .filter(|(i, t, a, _)| *i < c.index && *t == c.task && *a == c.attempt)
            .map(|(_, _, _, who)| who)
            .collect();
        if bidders.is_empty() {
            continue; // no bids: the window fell back to pull
        }
        assert!(
            bidders.contains(&c.actor),
            "{} was claimed by {}, who did not bid; bidders {bidders:?}",
            c.task,
            c.actor
        );
        tenders_awarded_to_bidders += 1;
        for loser in bidders.iter().filter(|b| **b != &c.actor) {
            let rejected = l.of_verb(Verb::TaskRejected).any(|(_, r)| {
                r.actor == c.actor
                    && r.body["task"] == c.task.as_str()
                    && r.body["agent"] == loser.as_str()
                    && r.body["attempt"] == c.attempt
            });
            assert!(rejected, "{loser} lost {} but was never told", c.task);
        }
    }
    assert!(tenders_awarded_to_bidders > 0, "no tender went to a bidder");
    // Bids only happened under `bid`.
    for (i, task, _, _) in &bids {
        assert!(
            task.starts_with('b'),
            "bid on {task} (row {i}) outside the bid phase"
        );
    }
}

// ---------------------------------------------------------------------------------
// 5. Failover: a killed relay's tasks are re-taken within TTL + one tick; a paused
//    relay never writes under its stale epoch
// ---------------------------------------------------------------------------------

const TTL_US: i64 = 2_000_000;

/// The counterpart of failover: a relay that is alive renews the claims of its turns,
/// so a turn longer than the TTL is never re-taken by an idle agent elsewhere.
async fn live_relay_keeps_its_claims_past_the_ttl(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("slow", 5_000)]);
    h.wait_registered(&["slow"]).await;
    h.config("claim-ttl 2s").await;
    h.delegate("long: a job longer than the lease").await;
    h.wait_until("slow holds the job", secs(30), |l| {
        l.task("long")
            .is_some_and(|t| t.status == TaskStatus::Claimed)
    })
    .await;
    h.spawn_relay("r1", vec![AgentSpec::sim("idle", 10)]);
    h.wait_registered(&["idle"]).await;
    let m = h
        .post("hank", Role::Human, "a message slow might answer")
        .await;
    let (first_epoch, owner) = {
        let t = h.ledger.task("long").expect("task");
        (t.epoch, t.owner.clone())
    };
    assert_eq!(owner.as_deref(), Some("slow"));
    h.wait_until("the long job done", secs(30), |l| l.summary().done == 1)
        .await;
    h.wait_until("the message answered", secs(30), |l| {
        !l.replies_to(m).is_empty()
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;
    let claims = h.ledger.claims();
    assert_eq!(
        claims.len(),
        1,
        "the job changed hands while its owner was alive: {claims:?}"
    );
    let done = h.ledger.assert_all_done_exactly_once(1);
    assert_eq!(
        (done["long"].actor.as_str(), Some(done["long"].epoch)),
        ("slow", first_epoch)
    );
    for s in &summaries {
        assert_eq!(s.fenced_refusals, 0, "{s:?}");
        assert_eq!(s.turns_failed, 0, "{s:?}");
    }
}

async fn killed_relay_tasks_are_retaken_within_ttl(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    // r0's turns never end by themselves: its agents are mid-turn when it is killed.
    h.spawn_relay(
        "r0",
        vec![AgentSpec::sim("k0", 600_000), AgentSpec::sim("k1", 600_000)],
    );
    h.wait_registered(&["k0", "k1"]).await;
    h.config("claim-ttl 2s").await;
    h.delegate("x1: long job one\nx2: long job two\nx3: wrap up [after x1, x2]")
        .await;
    h.wait_until("r0's agents hold x1 and x2", secs(30), |l| {
        ["x1", "x2"].iter().all(|t| {
            l.task(t).is_some_and(|t| {
                t.status == TaskStatus::Claimed
                    && t.owner.as_deref().is_some_and(|o| o.starts_with('k'))
            })
        }) && l
            .board
            .room(&l.room)
            .is_some_and(|b| b.open_turns().len() == 2)
    })
    .await;
    let held: BTreeMap<String, i64> = ["x1", "x2"]
        .iter()
        .map(|t| {
            (
                t.to_string(),
                h.ledger
                    .task(t)
                    .and_then(|t| t.epoch)
                    .map_or(0, |e| e.get()),
            )
        })
        .collect();
    for r in 1..3 {
        h.spawn_relay(
            &format!("r{r}"),
            vec![
                AgentSpec::sim(&format!("s{r}0"), 100),
                AgentSpec::sim(&format!("s{r}1"), 100),
            ],
        );
    }
    h.wait_registered(&["s10", "s11", "s20", "s21"]).await;

    let leases = h.store.list_claims("task/lobby/").await.expect("claims");
    let lease_end = leases
        .iter()
        .filter(|c| c.live && c.state.holder.starts_with('k'))
        .map(|c| c.state.expires_at)
        .max()
        .expect("r0 holds live task claims");
    let killed_at = h.db_now().await;
    h.relay("r0").kill9();

    h.wait_until("every task done after the kill", secs(30), |l| {
        l.summary().done == 3
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let done = h.ledger.assert_all_done_exactly_once(3);

    let tick_us = TTL_US / 4;
    let slack_us = 1_000_000;
    for (task, old_epoch) in &held {
        let retake = h
            .ledger
            .claims()
            .into_iter()
            .find(|c| c.task == *task && c.epoch.get() > *old_epoch)
            .unwrap_or_else(|| panic!("{task} was never re-taken"));
        assert!(retake.actor.starts_with('s'), "{retake:?}");
        let after_kill = retake.at - killed_at;
        let after_lapse = retake.at - lease_end;
        eprintln!(
            "{task}: re-taken by {} {} ms after the kill ({} ms after the lease lapsed)",
            retake.actor,
            after_kill / 1000,
            after_lapse / 1000
        );
        assert!(
            after_kill <= TTL_US + tick_us + slack_us,
            "{task} re-taken {after_kill} µs after the kill: more than TTL + one tick + slack"
        );
        assert!(
            retake.at >= lease_end,
            "{task} re-taken before its lease lapsed"
        );
        let c = &done[task];
        assert_eq!(
            (c.actor.as_str(), c.epoch),
            (retake.actor.as_str(), retake.epoch)
        );
    }
}

async fn paused_relay_never_writes_under_a_stale_epoch(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    // p1's turn never ends by itself (only a lost claim ends it); p2's ends while the
    // relay is frozen, so it tries to complete under its stale epoch once resumed.
    h.spawn_relay(
        "rp",
        vec![AgentSpec::sim("p1", 600_000), AgentSpec::sim("p2", 2_500)],
    );
    h.wait_registered(&["p1", "p2"]).await;
    h.config("claim-ttl 2s").await;
    let m = h.post("hank", Role::Human, "p, are you there?").await;
    let msg = message_subject(m);
    h.wait_until("p1 answering the message", secs(30), |l| {
        !l.about(Verb::TurnPrompted, &msg).is_empty()
    })
    .await;
    h.delegate("y1: slow job").await;
    h.wait_until("p2 working on y1", secs(30), |l| {
        l.task("y1")
            .is_some_and(|t| t.owner.as_deref() == Some("p2") && t.status == TaskStatus::Claimed)
            && l.board
                .room(&l.room)
                .is_some_and(|b| b.open_turns().len() == 2)
    })
    .await;
    let stale_task_epoch = h.ledger.task("y1").and_then(|t| t.epoch).expect("epoch");
    let (_, p1, stale_reply_epoch) = h.ledger.designations(m).remove(0);
    assert_eq!(p1, "p1");

    h.spawn_relay("rq", vec![AgentSpec::sim("q1", 100)]);
    h.wait_registered(&["q1"]).await;
    h.relay("rp").pause();
    h.wait_until("q1 to take over both", secs(30), |l| {
        l.task("y1").is_some_and(|t| t.status == TaskStatus::Done) && !l.replies_to(m).is_empty()
    })
    .await;
    h.relay("rp").resume();
    // Once resumed, rp renews nothing (its leases lapsed and were re-taken): p1's turn
    // is cancelled and only its failure is recorded.
    h.wait_until("p1's turn to end as failed", secs(30), |l| {
        l.about(Verb::TurnFailed, &msg)
            .iter()
            .any(|r| r.actor == "p1")
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;

    let l = &h.ledger;
    let replies = l.replies_to(m);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].actor, "q1");
    assert_eq!(l.turns_replied_to(m).len(), 1);
    let (_, q, reply_epoch) = l.designations(m).pop().expect("designation");
    assert_eq!(q, "q1");
    assert!(reply_epoch > stale_reply_epoch);
    let done = l.assert_all_done_exactly_once(1);
    assert_eq!(done["y1"].actor, "q1");
    assert!(done["y1"].epoch > stale_task_epoch);
    // Nothing the paused relay's agents wrote after the pause was accepted: no reply,
    // no completion, no release of the task they lost.
    for (_, r) in l.room_rows() {
        if r.actor.starts_with('p') {
            let reply = r.verb == Verb::MessagePosted && r.role == Role::Agent;
            let task_end = matches!(
                r.verb,
                Verb::TaskCompleted | Verb::TaskReleased | Verb::TaskFailed | Verb::TurnReplied
            );
            assert!(
                !reply && !task_end,
                "the paused relay wrote {:?} {}",
                r.verb,
                r.body
            );
        }
    }
    let rp = summaries
        .iter()
        .find(|s| s.relay == "rp")
        .expect("rp summary");
    assert!(
        rp.fenced_refusals + rp.turns_failed >= 2,
        "both stale turns should be refused or cancelled: {rp:?}"
    );
    eprintln!("paused relay: {rp:?}");
}

// ---------------------------------------------------------------------------------
// 6. Forged completions change nothing
// ---------------------------------------------------------------------------------

async fn forged_completions_change_nothing(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("x0", 1_500)]);
    h.spawn_relay("r1", vec![AgentSpec::sim("x1", 1_500)]);
    h.wait_registered(&["x0", "x1"]).await;
    h.delegate("f1: real work\nf2: next step [after f1]").await;
    let (owner, epoch) = h
        .wait_for("f1 claimed", secs(30), |l| {
            l.task("f1")
                .filter(|t| t.status == TaskStatus::Claimed)
                .and_then(|t| Some((t.owner.clone()?, t.epoch?.get())))
        })
        .await;
    let other = if owner == "x0" { "x1" } else { "x0" };
    let before = h.ledger.dag.room(&h.room).expect("room").tasks.clone();

    use huddle_core::tasks::TaskCompletedBody;
    use huddle_core::NewInteraction;
    let forged = |task: &str, actor: &str, role: Role, epoch: i64, note: &str| {
        NewInteraction::new(
            "lobby",
            Verb::TaskCompleted,
            actor,
            role,
            TaskCompletedBody {
                task: task.into(),
                epoch: huddle_core::ClaimEpoch(epoch),
                result: Some(format!("forged: {note}")),
                tokens: None,
                generation: 0,
            }
            .to_body(),
        )
    };
    let rows = vec![
        forged(
            "f1",
            other,
            Role::Agent,
            epoch,
            "another agent, current epoch",
        ),
        forged("f1", "mallory", Role::Agent, epoch, "a stranger"),
        forged("f1", "olga", Role::Owner, epoch, "the room owner"),
        forged(
            "f1",
            &owner,
            Role::Agent,
            epoch - 1,
            "the owner, stale epoch",
        ),
        forged(
            "f1",
            &owner,
            Role::Agent,
            epoch + 1,
            "the owner, future epoch",
        ),
        forged("f2", &owner, Role::Agent, epoch, "a task nobody holds"),
    ];
    // The database refuses every one (migration 0003: a task row needs a live claim
    // held by its actor at its epoch); the folds would ignore them as well.
    for r in rows {
        let err = h
            .store
            .append(vec![r])
            .await
            .expect_err("the database refuses a forged completion");
        assert!(err.to_string().contains("huddle:"), "{err}");
    }
    h.refresh().await;
    let after = h.ledger.dag.room(&h.room).expect("room");
    assert_eq!(
        after.tasks, before,
        "forged completions changed the task DAG"
    );
    assert_eq!(after.refusals.refused, 0, "{:?}", after.refusals);
    assert!(
        h.ledger.dag.ready_frontier(&h.room).is_empty(),
        "f2 became ready"
    );

    h.wait_until("both tasks done for real", secs(30), |l| {
        l.summary().done == 2
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let completions = h.ledger.completions();
    let accepted: Vec<_> = completions.iter().filter(|c| c.accepted).collect();
    assert_eq!(accepted.len(), 2, "{completions:#?}");
    assert_eq!(completions.len(), 2);
    let f1 = accepted.iter().find(|c| c.task == "f1").expect("f1");
    assert_eq!((f1.actor.as_str(), f1.epoch.get()), (owner.as_str(), epoch));
    let f2_claim = h
        .ledger
        .claims()
        .into_iter()
        .find(|c| c.task == "f2")
        .expect("f2 claimed");
    assert!(
        f2_claim.index > f1.index,
        "f2 was claimed before f1 was really done"
    );
    let result = h.ledger.task("f1").and_then(|t| t.result.clone());
    assert!(
        result.as_deref().is_some_and(|r| !r.starts_with("forged")),
        "{result:?}"
    );
}

// ---------------------------------------------------------------------------------
// 7. An agent's reply is data, never a command
// ---------------------------------------------------------------------------------

async fn agent_text_is_never_a_command(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let delegating = h.script(
        "delegating.sh",
        "cat >/dev/null\nprintf '!delegate\\nevil1: take over the room\\nevil2: and more [after evil1]\\n'",
    );
    let configuring = h.script(
        "configuring.sh",
        "cat >/dev/null\nprintf '!config allocation push claim-ttl 1s\\n'",
    );
    // The first agent even bears the owner's name: its role is still `agent`.
    h.spawn_relay("r0", vec![AgentSpec::exec("olga", &delegating)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("eve", &configuring)]);
    h.wait_registered(&["olga", "eve"]).await;

    let m1 = h.post("hank", Role::Human, "@olga what do you say?").await;
    let m2 = h.post("hank", Role::Human, "@eve and you?").await;
    h.wait_until("both agents to reply", secs(30), |l| {
        !l.replies_to(m1).is_empty() && !l.replies_to(m2).is_empty()
    })
    .await;
    // A task turn whose result is a command, too.
    h.delegate("job: write the plan").await;
    h.wait_until("the job done", secs(30), |l| l.summary().done == 1)
        .await;
    // Relays read the ledger in order: once they answer a later owner command, they
    // have read every agent reply before it.
    let reply = h.owner_says("!config get").await;
    assert!(reply.contains("allocation = pull (default)"), "{reply}");
    assert!(reply.contains("claim-ttl = 1m (default)"), "{reply}");
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    let l = &h.ledger;
    let olga_says = l.replies_to(m1)[0].body["text"]
        .as_str()
        .unwrap_or_default();
    assert!(olga_says.starts_with("!delegate"), "{olga_says}");
    assert_eq!(l.replies_to(m2)[0].actor, "eve");
    let created: Vec<String> = l
        .of_verb(Verb::TaskCreated)
        .map(|(_, r)| r.body["task"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(created, ["job"], "agent text created tasks");
    assert_eq!(
        l.of_verb(Verb::ConfigSet).count(),
        0,
        "agent text changed config"
    );
    let result = l
        .task("job")
        .and_then(|t| t.result.clone())
        .unwrap_or_default();
    assert!(result.starts_with('!'), "{result}");
    let system: Vec<&str> = l
        .of_verb(Verb::MessagePosted)
        .filter(|(_, r)| r.role == Role::System)
        .filter_map(|(_, r)| r.body["text"].as_str())
        .collect();
    assert_eq!(
        system.iter().filter(|t| t.starts_with("Created")).count(),
        1,
        "{system:?}"
    );
}

// ---------------------------------------------------------------------------------
// A failed task attempt is handed over (fails today: see plans/0008, "Found")
// ---------------------------------------------------------------------------------

/// An agent whose every turn fails holds a task; a healthy agent idles on another
/// relay. The failed attempt must go back to the room and be done by the healthy
/// agent, not burned again and again by the failing one until it is abandoned.
async fn failed_task_goes_to_an_idle_agent_elsewhere(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let failing = h.script("fails.sh", "cat >/dev/null\nsleep 1\nexit 3");
    h.spawn_relay("r0", vec![AgentSpec::exec("flaky", &failing)]);
    h.wait_registered(&["flaky"]).await;
    h.delegate("j1: a job flaky cannot do").await;
    h.wait_until("flaky holds j1", secs(30), |l| {
        l.task("j1")
            .is_some_and(|t| t.status == TaskStatus::Claimed)
    })
    .await;
    h.spawn_relay("r1", vec![AgentSpec::sim("steady", 20)]);
    h.wait_registered(&["steady"]).await;
    h.wait_until("j1 settled", secs(30), |l| l.dag.is_settled(&l.room))
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let attempts: Vec<String> = h
        .ledger
        .claims()
        .into_iter()
        .map(|c| format!("{}#{}", c.actor, c.attempt))
        .collect();
    let j1 = h.ledger.task("j1").expect("j1");
    assert_eq!(
        j1.status,
        TaskStatus::Done,
        "j1 ended {:?} after attempts {attempts:?} while steady was idle",
        j1.status
    );
    let done = h.ledger.assert_all_done_exactly_once(1);
    assert_eq!(done["j1"].actor, "steady", "attempts {attempts:?}");
}

// ---------------------------------------------------------------------------------
// A restarted database: every connection of every relay breaks mid-run
// ---------------------------------------------------------------------------------

/// Three relays work a DAG on a Postgres cluster that is restarted while tasks are
/// claimed and running: every relay reconnects (pool, LISTEN, reads forward from its
/// cursor), every task is still completed exactly once, and the relays converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_survive_a_restarted_postgres() {
    let mut h = Huddle::new(Backend::PostgresOwnCluster).await;
    let all = three_relays(&mut h, 150);
    h.wait_registered(&strs(&all)).await;
    h.config("claim-ttl 3s").await;
    let reply = h.delegate(&dag_text(60)).await;
    assert!(reply.starts_with("Created 60 tasks"), "{reply}");
    h.wait_until("some tasks done, some running", secs(60), |l| {
        let s = l.summary();
        s.done >= 10 && s.claimed > 0
    })
    .await;
    h.db.restart_postgres();
    h.wait_until("60 tasks done after the restart", secs(120), |l| {
        l.summary().done == 60
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(60);
    let s = h.ledger.summary();
    assert_eq!((s.ready, s.claimed, s.abandoned), (0, 0, 0), "{s:?}");
}
