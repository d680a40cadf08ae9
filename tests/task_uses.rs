//! End-to-end: `[uses ...]` on `!delegate` lines (plan 0051). Three relays, as
//! separate processes, each with two exec agents, run tasks that share resources;
//! every execution logs `begin`/`end` with one atomic append, and replaying the log
//! checks the conflict rule at every moment — never two holders of overlapping
//! exclusive globs, never more holders than permits — while every task runs exactly
//! once and no attempt is used up waiting for a resource.

use crate::common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Instant;

use common::relays::*;
use huddle_core::resources::{Mode, ResourceName, ResourceRowBody, UNUSED_HOLDINGS};
use huddle_core::tasks::TaskStatus;
use huddle_core::Verb;

on_both_backends!(tasks_that_use_resources_take_turns_and_run_once);

/// What each task holds while it runs, as its `[uses ...]` says.
fn plan() -> Vec<(String, &'static str, Mode)> {
    let mut p = Vec::new();
    for i in 1..=4 {
        p.push((format!("src{i}"), "file:src/**", Mode::Exclusive));
    }
    for i in 1..=2 {
        p.push((format!("lib{i}"), "file:src/lib.rs", Mode::Exclusive));
    }
    for i in 1..=6 {
        p.push((format!("build{i}"), "slot:build", Mode::Permits(2)));
    }
    for i in 1..=3 {
        p.push((format!("read{i}"), "file:docs/**", Mode::Shared));
    }
    p
}

async fn tasks_that_use_resources_take_turns_and_run_once(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("holds.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat > /dev/null\necho \"begin $HUDDLE_TASK\" >> '{log}'\nsleep 0.3\n\
             echo \"end $HUDDLE_TASK\" >> '{log}'\necho done",
            log = log.display()
        ),
    );
    for r in 0..3 {
        h.spawn_relay(
            &format!("r{r}"),
            vec![
                AgentSpec::exec(&format!("a{r}"), &agent),
                AgentSpec::exec(&format!("b{r}"), &agent),
            ],
        );
    }
    h.wait_registered(&["a0", "b0", "a1", "b1", "a2", "b2"])
        .await;
    // Someone outside the DAG holds all of src/ when the tasks arrive: no src or lib
    // task may start before it lets go.
    let holding = h.dir().join("outside-holds");
    let mut outside = {
        let mut c = common::huddle(&h.db.url);
        c.args(["resource", "take", "--room", "lobby", "--agent", "outside"]);
        c.args(["--ttl-ms", "20000", "file:src/**", "--"]);
        c.args([
            "sh",
            "-c",
            &format!(
                "echo 'begin outside' >> '{log}'; touch '{held}'; sleep 3; \
                 echo 'end outside' >> '{log}'",
                log = log.display(),
                held = holding.display()
            ),
        ]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        c.spawn().expect("spawn huddle resource take")
    };
    let began = Instant::now();
    while !holding.exists() {
        assert!(
            began.elapsed() < secs(30),
            "the outside holder never started"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let plan = plan();
    let lines: Vec<String> = plan
        .iter()
        .map(|(id, name, mode)| {
            let mode = match mode {
                Mode::Exclusive => String::new(),
                Mode::Shared => " shared".into(),
                Mode::Permits(n) => format!(" permits {n}"),
            };
            format!("{id}: hold {name} [uses {name}{mode}]")
        })
        .collect();
    h.delegate(&lines.join("\n")).await;
    h.wait_until("every task done", secs(120), |l| {
        plan.iter()
            .all(|(id, _, _)| l.task(id).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    assert!(
        outside.wait().expect("the outside holder").success(),
        "huddle resource take failed"
    );
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    // Replay the log against the conflict rule.
    let mut holds: BTreeMap<String, (ResourceName, Mode)> = plan
        .iter()
        .map(|(id, name, mode)| (id.clone(), (ResourceName::parse(name).unwrap(), *mode)))
        .collect();
    holds.insert(
        "outside".into(),
        (ResourceName::parse("file:src/**").unwrap(), Mode::Exclusive),
    );
    let text = std::fs::read_to_string(&log).expect("the holders' log");
    let mut active: BTreeMap<String, (ResourceName, Mode)> = BTreeMap::new();
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    let mut peak: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        let (step, who) = line.split_once(' ').expect("a log line");
        match step {
            "begin" => {
                let (name, mode) = holds[who].clone();
                let touching: Vec<Mode> = active
                    .values()
                    .filter(|(n, _)| n.touches(&name))
                    .map(|(_, m)| *m)
                    .collect();
                let admitted = match mode {
                    Mode::Exclusive => touching.is_empty(),
                    Mode::Shared => touching.iter().all(|m| *m == Mode::Shared),
                    Mode::Permits(n) => {
                        touching.iter().all(|m| matches!(m, Mode::Permits(_)))
                            && touching.len() < n as usize
                    }
                };
                assert!(
                    admitted,
                    "{who} began holding {name} ({mode}) while {active:?} held:\n{text}"
                );
                active.insert(who.to_string(), (name.clone(), mode));
                let now = active.values().filter(|(n, _)| *n == name).count();
                let p = peak.entry(name.to_string()).or_default();
                *p = (*p).max(now);
                *runs.entry(who.to_string()).or_default() += 1;
            }
            "end" => {
                active.remove(who);
            }
            other => panic!("unexpected log line {other:?}"),
        }
    }
    for (id, _, _) in &plan {
        assert_eq!(runs.get(id), Some(&1), "{id} ran once:\n{text}");
    }
    assert!(
        text.find("end outside").unwrap() < text.find("begin src").unwrap()
            && text.find("end outside").unwrap() < text.find("begin lib").unwrap(),
        "src and lib tasks waited for the outside holder:\n{text}"
    );
    // The permits were used: two builds did run together (six 0.3 s builds, six
    // agents), and shared readers too.
    assert_eq!(peak.get("slot:build"), Some(&2), "{peak:?}\n{text}");

    // No attempt was used up waiting; every acquisition is recorded and released.
    h.refresh().await;
    for (id, _, _) in &plan {
        let t = h.ledger.task(id).expect("the task");
        assert_eq!(t.attempts, 1, "{id} used one attempt");
    }
    // Holdings as (holder, name, epoch), per verb; a release of holdings that a
    // relay took for a turn that then did not start (its claim lapsed meanwhile)
    // records no acquisition and says so.
    let holdings = |verb: Verb, unused: bool| -> Vec<(String, String, i64)> {
        let mut out: Vec<(String, String, i64)> = h
            .ledger
            .of_verb(verb)
            .map(|(_, r)| {
                let b: ResourceRowBody =
                    serde_json::from_value(r.body.clone()).expect("a resource row");
                (r, b)
            })
            .filter(|(_, b)| (b.reason.as_deref() == Some(UNUSED_HOLDINGS)) == unused)
            .flat_map(|(r, b)| {
                b.resources
                    .into_iter()
                    .map(|x| (r.actor.clone(), x.name.to_string(), x.epoch.0))
            })
            .collect();
        out.sort();
        out
    };
    let acquired = holdings(Verb::ResourceAcquired, false);
    assert_eq!(
        h.ledger.of_verb(Verb::ResourceAcquired).count(),
        plan.len() + 1,
        "one acquisition per task and the outside one: {acquired:?}"
    );
    assert_eq!(
        holdings(Verb::ResourceReleased, false),
        acquired,
        "every acquisition released once"
    );
    for unused in holdings(Verb::ResourceReleased, true) {
        assert!(
            !acquired.contains(&unused),
            "{unused:?} is released as unused, yet an acquisition records it"
        );
    }
    let live: Vec<String> = h
        .store
        .list_claims("resource/lobby/")
        .await
        .expect("list the resource claims")
        .into_iter()
        .filter(|c| c.live)
        .map(|c| c.state.key)
        .collect();
    assert!(live.is_empty(), "no resource is still held: {live:?}");
    // Operators see what each task uses.
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("[uses slot:build permits-2]")
            && listing.contains("[uses file:docs/** shared]"),
        "{listing}"
    );
    let shown = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["task", "show", "lobby", "lib1"]);
        c
    });
    assert!(
        shown.contains("uses:     file:src/lib.rs exclusive"),
        "{shown}"
    );
}
