//! End-to-end: `huddle task ...`, an agent's task operations from the command line,
//! through the real binary (the same `AgentSession` calls as the MCP tools).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn task(db: &str, agent: &str, args: &[&str]) -> std::process::Command {
    let mut c = huddle(db);
    c.arg("task")
        .arg(args[0])
        .args(["--room", "work", "--agent", agent])
        .args(&args[1..]);
    c
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn task_commands_claim_renew_complete_and_refuse_a_stale_completion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("huddle.db").display().to_string();
    let tasks = vec![
        ("a".to_string(), vec![]),
        ("b".to_string(), vec!["a".to_string()]),
    ];
    seed_tasks(&db, "work", &tasks, 1000).await;

    let first = json(&ok(task(&db, "bo", &["claim", "a", "--json"])));
    assert_eq!(first["claimed"]["task"]["id"], "a", "{first}");
    let epoch = first["claimed"]["epoch"].as_i64().expect("epoch");
    let renewed = ok(task(&db, "bo", &["renew", "a"]));
    assert!(
        renewed.starts_with(&format!("renewed a at epoch {epoch} until ")),
        "{renewed}"
    );
    let held = fails(task(&db, "cy", &["claim", "a"]));
    assert!(
        held.contains("[held_by_other]") && held.contains("bo"),
        "{held}"
    );

    // bo goes quiet past its 1 s lease; cy re-takes a.
    let deadline = Instant::now() + Duration::from_secs(15);
    let second = loop {
        let out = run(task(&db, "cy", &["claim", "a", "--json"]));
        if out.status.success() {
            break json(&String::from_utf8_lossy(&out.stdout));
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("[held_by_other]"), "{err}");
        assert!(Instant::now() < deadline, "a's lease never lapsed");
        std::thread::sleep(Duration::from_millis(200));
    };
    let epoch2 = second["claimed"]["epoch"].as_i64().expect("epoch");
    assert!(epoch2 > epoch, "{second}");

    // bo's stale completion (presenting the epoch it claimed at) is refused.
    let stale = run(task(
        &db,
        "bo",
        &[
            "complete",
            "a",
            "--result",
            "late",
            "--epoch",
            &epoch.to_string(),
        ],
    ));
    assert!(!stale.status.success(), "a stale completion exited 0");
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(
        err.contains("[stale_claim]")
            && err.contains("cy took it")
            && err.contains("nothing was recorded"),
        "{err}"
    );

    let done = json(&ok(task(
        &db,
        "cy",
        &["complete", "a", "--result", "A!", "--json"],
    )));
    assert_eq!(
        (done["task"].as_str(), done["status"].as_str()),
        (Some("a"), Some("done")),
        "{done}"
    );
    // A retry with the same key is recorded once.
    let again = ok(task(&db, "cy", &["complete", "a", "--result", "A!"]));
    assert!(
        again.contains("a: done") && again.contains("already recorded"),
        "{again}"
    );

    // The best next task, with its dependency's result, in human form.
    let b = ok(task(&db, "bo", &["claim"]));
    assert!(
        b.starts_with("claimed b (do b)") && b.contains("after a: A!"),
        "{b}"
    );
    let failed = ok(task(&db, "bo", &["fail", "b", "--reason", "flaky"]));
    assert!(failed.starts_with("b: open"), "{failed}");
    // The retry waits out the task's back-off (`retry-backoff`, 1 s by default).
    let early = fails(task(&db, "bo", &["claim", "b"]));
    assert!(early.contains("backs off until"), "{early}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(task(&db, "bo", &["claim", "b"]));
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains("backs off until") && Instant::now() < until,
            "{err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let released = json(&ok(task(&db, "bo", &["release", "b", "--json"])));
    assert_eq!(released["status"], "open", "{released}");
    let missing = fails(task(&db, "bo", &["claim", "zz"]));
    assert!(missing.contains("[no_task]"), "{missing}");
    let bid = fails(task(&db, "bo", &["bid", "b", "--load", "1"]));
    assert!(
        bid.contains("[not_biddable]") && bid.contains("task_claim"),
        "{bid}"
    );
}
