//! End-to-end: what an operator reads in the terminal — `huddle trace` of a delegate
//! whose first task was re-taken after its relay was killed, `tail` filters and
//! one-line summaries, `claims --live --room`.

use crate::common;

use common::relays::*;
use common::{fails, huddle, ok};
use huddle_core::{InteractionId, Role, TaskStatus, Verb};
use serde_json::Value;

fn cli(h: &Huddle, args: &[&str]) -> std::process::Command {
    let mut c = huddle(&h.db.url);
    c.args(args);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_tail_and_claims_show_a_retaken_task() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    // r0's agent never ends its turn by itself: it is mid-turn when r0 is killed.
    h.spawn_relay("r0", vec![AgentSpec::sim("k0", 600_000)]);
    h.wait_registered(&["k0"]).await;
    h.config("claim-ttl 2s").await;
    h.delegate("x1: long job\nx2: wrap up [after x1]").await;
    h.wait_until("k0 holds x1", secs(30), |l| {
        l.task("x1")
            .is_some_and(|t| t.status == TaskStatus::Claimed && t.owner.as_deref() == Some("k0"))
    })
    .await;

    // claims --live --room: k0's task claim, driven by r0 (one claim, plan 0094),
    // nothing of other rooms.
    let live = ok(cli(&h, &["claims", "--live", "--room", "lobby"]));
    assert!(
        live.contains("task/lobby/x1 held by k0 driven by r0 epoch"),
        "{live}"
    );
    assert!(!live.contains("taskdrive/"), "{live}");
    assert!(
        live.lines().all(|l| l.contains("/lobby/")),
        "only the room's claims: {live}"
    );
    let all = ok(cli(&h, &["claims"]));
    assert!(all.contains("relay/r0"), "{all}");
    let err = fails(cli(&h, &["claims", "--room", "nowhere"]));
    assert!(err.contains("nowhere"), "{err}");

    // Kill r0; r1's agent re-takes x1 after the lease lapses and finishes both.
    h.spawn_relay("r1", vec![AgentSpec::sim("s1", 50)]);
    h.wait_registered(&["s1"]).await;
    h.relay("r0").kill9();
    h.wait_until("both tasks done", secs(60), |l| l.summary().done == 2)
        .await;
    h.wait_quiescent(secs(30)).await;
    let released = ok(cli(&h, &["claims", "--live", "--room", "lobby"]));
    assert!(
        !released.contains("task/lobby/"),
        "finished tasks hold no live claim: {released}"
    );

    // The delegate command's id.
    let delegate: InteractionId = h
        .ledger
        .of_verb(Verb::MessagePosted)
        .map(|(_, r)| r)
        .find(|r| {
            r.role == Role::Owner
                && r.body["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("!delegate"))
        })
        .map(|r| r.id)
        .expect("the delegate command");

    // trace of the command: every task's life, with the re-take.
    let text = ok(cli(
        &h,
        &["trace", "--room", "lobby", &delegate.to_string()[..10]],
    ));
    assert!(
        text.starts_with(&format!("trace of message {delegate} in room lobby")),
        "{text}"
    );
    for needle in [
        "task x1:",
        "task x2:",
        "k0 (agent) via r0 task.claimed epoch 1",
        "s1 (agent) via r1 task.claimed epoch 2",
        "→ done by s1 after 2 attempt(s)",
        "→ done by s1 after 1 attempt(s)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    // x1's timeline is in order: claimed by k0, then by s1, then completed.
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {text}"))
    };
    assert!(at("task.claimed epoch 1") < at("task.claimed epoch 2"));
    assert!(at("task.claimed epoch 2") < at("s1 (agent) via r1 task.completed epoch 2"));

    let json: Value = serde_json::from_str(&ok(cli(
        &h,
        &["trace", "--room", "lobby", &delegate.to_string(), "--json"],
    )))
    .expect("trace --json");
    assert_eq!(json["kind"], "message");
    let created: Vec<&Value> = json["root"]["children"]
        .as_array()
        .expect("children")
        .iter()
        .filter(|c| c["verb"] == "task.created")
        .collect();
    assert_eq!(created.len(), 2, "{json:#}");
    let x1 = created
        .iter()
        .find(|c| c["task"]["task"] == "x1")
        .expect("x1");
    assert_eq!(x1["task"]["status"], "done");
    let epochs: Vec<u64> = x1["task"]["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter(|s| s["verb"] == "task.claimed")
        .map(|s| s["epoch"].as_u64().expect("epoch"))
        .collect();
    assert_eq!(epochs, vec![1, 2], "{x1:#}");
    let completed = x1["task"]["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .find(|s| s["verb"] == "task.completed")
        .expect("completed");
    assert!(completed["took_ms"].as_f64().is_some_and(|t| t >= 0.0));

    // A task id traces the task alone.
    let task = ok(cli(&h, &["trace", "--room", "lobby", "x2"]));
    assert!(task.starts_with("trace of task x2 in room lobby"), "{task}");
    assert!(task.contains("→ done by s1"), "{task}");
    let err = fails(cli(&h, &["trace", "--room", "lobby", "zz"]));
    assert!(err.contains("neither a task of room lobby"), "{err}");

    // tail --verb: a family and an exact verb; bookkeeping rows on one line.
    let claims = ok(cli(
        &h,
        &["tail", "--room", "lobby", "--verb", "task.claimed"],
    ));
    assert_eq!(claims.lines().count(), 3, "x1 twice, x2 once: {claims}");
    assert!(
        claims.lines().all(|l| l.contains("task.claimed: ")),
        "{claims}"
    );
    assert!(
        claims.contains("attempt=1 epoch=1 task=x1"),
        "key=value summary: {claims}"
    );
    let family = ok(cli(&h, &["tail", "--room", "lobby", "--verb", "task."]));
    assert!(family.lines().count() >= 3 + 2 + 2, "{family}");
    assert!(
        family.lines().all(|l| l.contains(" task.")),
        "only task verbs: {family}"
    );
    let err = fails(cli(
        &h,
        &["tail", "--room", "lobby", "--verb", "task.claimd"],
    ));
    assert!(
        err.contains("no such verb") && err.contains("task.claimed"),
        "{err}"
    );
    // --since: everything is newer than an hour, nothing newer than the future.
    let all = ok(cli(&h, &["tail", "--room", "lobby"]));
    let recent = ok(cli(&h, &["tail", "--room", "lobby", "--since", "1h"]));
    assert_eq!(all, recent);
    let err = fails(cli(&h, &["tail", "--room", "lobby", "--since", "soon"]));
    assert!(err.contains("--since soon"), "{err}");
    // --thread: the room's top level only, or a thread that has nothing.
    let top = ok(cli(&h, &["tail", "--room", "lobby", "--thread", "-"]));
    assert_eq!(top, all, "everything here is at the top level");
    let none = ok(cli(&h, &["tail", "--room", "lobby", "--thread", "side"]));
    assert!(none.is_empty(), "{none}");

    h.stop_all_unchecked().await;
}

/// `tasks --watch` draws the table again as the DAG moves, from nothing done to all
/// done, in a process of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_watch_redraws_as_the_dag_moves() {
    use std::io::BufRead as _;
    let mut h = Huddle::new(Backend::Sqlite).await;
    let err = fails(cli(&h, &["tasks", "--room", "nowhere", "--watch"]));
    assert!(err.contains("does not exist"), "{err}");
    let err = fails(cli(&h, &["tasks", "--room", "lobby", "--watch", "--json"]));
    assert!(err.contains("--json") && err.contains("--watch"), "{err}");

    let mut watch = cli(&h, &["tasks", "--room", "lobby", "--watch"]);
    watch
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = watch.spawn().expect("huddle tasks --watch");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen: Vec<String> = Vec::new();
    let mut wait_line = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = ok(&line);
                    seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("no {what} within 60 s:\n{}", seen.join("\n")),
            }
        }
    };
    wait_line("first drawing", &|l| l.starts_with("room lobby — 0 tasks"));

    // Turns of a second: longer than a redraw, so a drawing falls between a and b.
    h.spawn_relay("r0", vec![AgentSpec::sim("ada", 1000)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("a: first\nb: second [after a]").await;
    wait_line("a drawing with a done", &|l| {
        l.starts_with("room lobby — 2 tasks: 1 done")
    });
    wait_line("a drawing with both done", &|l| {
        l.starts_with("room lobby — 2 tasks: 2 done")
    });
    let _ = child.kill();
    let _ = child.wait();
    h.stop_all_unchecked().await;
}
