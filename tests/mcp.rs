//! End-to-end: `huddle mcp` driven by clients written with the official MCP Python
//! SDK (`tests/mcp/*.py`). The SDK is installed into `target/mcp-venv` on first use
//! (or taken from `HUDDLE_MCP_PYTHON`); failing to install it fails the test loudly.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::mcp::client_script as script;
use common::relays::{Backend, TestDatabase};
use common::*;
use huddle_core::{Fold, Position, TaskDag, TaskStatus, Verb};
use huddle_store::StoreOptions;

async fn fold(db: &str, room: &str) -> (TaskDag, usize) {
    let store = huddle_store::open(db, StoreOptions::default())
        .await
        .unwrap();
    let mut dag = TaskDag::new();
    let mut completions = 0;
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 5000).await.unwrap();
        for r in &batch.rows {
            completions += usize::from(r.verb == Verb::TaskCompleted);
            dag.apply(r);
        }
        if batch.next == cursor {
            return (dag, completions);
        }
        cursor = batch.next;
    }
}

fn wait_all(children: &mut [(String, Child)], limit: Duration) -> Vec<(String, bool)> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    for (name, child) in children.iter_mut() {
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                out.push((name.clone(), status.success()));
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("client {name} did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    out
}

fn tempdb() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huddle.db").display().to_string();
    (dir, path)
}

/// Runs the client script `name` on a fresh room `room` (tasks a, b after a, c; the
/// given claim TTL) and asserts it printed OK; returns the database.
async fn run_client(name: &str, room: &str, claim_ttl_ms: u64) -> (tempfile::TempDir, String) {
    let (dir, db) = tempdb();
    let tasks = vec![
        ("a".to_string(), vec![]),
        ("b".to_string(), vec!["a".to_string()]),
        ("c".to_string(), vec![]),
    ];
    seed_tasks(&db, room, &tasks, claim_ttl_ms).await;
    let out = script(name, &db, room).output().expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "{name} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, db)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_client_lists_and_calls_every_tool() {
    let (_dir, db) = run_client("tools.py", "tools", 1000).await;
    let (dag, completions) = fold(&db, "tools").await;
    assert_eq!(completions, 2, "a and c, once each");
    assert_eq!(dag.task("tools", "c").unwrap().owner.as_deref(), Some("cy"));
}

/// A reviewer acting for itself over MCP judges a worker's submission (plan 0053).
#[tokio::test(flavor = "multi_thread")]
async fn a_python_client_reviews_with_task_review() {
    let (_dir, db) = tempdb();
    let room = "rev";
    seed_commands(
        &db,
        room,
        &["!delegate\nw: write it [review @lead rounds 2]\nnext: then this [after w]"],
    )
    .await;
    client_ok("review.py", &db, room);
    let (dag, completions) = fold(&db, room).await;
    assert_eq!(completions, 2, "two submissions of w");
    let w = dag.task(room, "w").expect("w");
    assert_eq!(
        (w.status, w.generation, w.rejections),
        (TaskStatus::Done, 1, 1)
    );
}

/// Seeds `room` with the owner's signed `commands` (and the rows a relay derives).
async fn seed_commands(db: &str, room: &str, commands: &[&str]) {
    ok({
        let mut c = huddle(db);
        c.args(["room", "create", room, "--owner", "ana"]);
        c
    });
    let rows = huddle_core::seed_room(room, "ana", &owner_key("ana"), commands)
        .expect("seed the commands");
    let store = huddle_store::open(db, StoreOptions::default())
        .await
        .expect("open");
    store
        .append(rows[1..].to_vec())
        .await
        .expect("seed the room");
}

/// Runs client `name` against `room` of `db` and asserts it printed OK.
fn client_ok(name: &str, db: &str, room: &str) {
    let out = script(name, db, room).output().expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "{name} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The server of an agent acting for itself fails its overdue and stalled tasks, and
/// the circuit breaker benches it after two failures (plan 0054).
#[tokio::test(flavor = "multi_thread")]
async fn a_python_client_is_paced_like_a_driven_agent() {
    let (_dir, db) = tempdb();
    let room = "pace";
    seed_commands(
        &db,
        room,
        &[
            "!config stall-timeout 2s breaker 2 retry-backoff 0 claim-ttl 30s",
            "!delegate\nlate: slow one [due 1s]\nquiet: silent one\nf1: one",
        ],
    )
    .await;
    client_ok("pacing.py", &db, room);
    let store = huddle_store::open(&db, StoreOptions::default())
        .await
        .unwrap();
    let rows = store
        .read_room(room, Position::START, 10_000)
        .await
        .unwrap()
        .rows;
    let failed_turns: Vec<String> = rows
        .iter()
        .filter(|r| r.verb == Verb::TurnFailed && r.actor == "bo")
        .map(|r| r.body["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(failed_turns.len(), 2, "{failed_turns:?}");
    assert!(failed_turns[0].starts_with("overdue:") && failed_turns[1].starts_with("stalled:"));
    let (dag, _) = fold(&db, room).await;
    assert_eq!(dag.task(room, "f1").unwrap().owner.as_deref(), Some("cy"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_client_reads_and_subscribes_to_resources() {
    run_client("resources.py", "res", 60_000).await;
}

on_both_backends!(eight_mcp_agents_work_a_200_task_dag_exactly_once);

/// Eight `huddle mcp` processes (eight agents) work a 200-task DAG through
/// `task_claim` / `task_complete` only; one dies holding a task.
async fn eight_mcp_agents_work_a_200_task_dag_exactly_once(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    let dir = tempfile::tempdir().expect("tempdir for the log");
    let room = "dag";
    let tasks: Vec<(String, Vec<String>)> = (0..200)
        .map(|i| {
            let mut deps = Vec::new();
            if i >= 8 {
                deps.push(format!("t{}", i - 8));
            }
            if i % 5 == 0 && i / 3 + 8 < i {
                deps.push(format!("t{}", i / 3));
            }
            (format!("t{i}"), deps)
        })
        .collect();
    seed_tasks(&db, room, &tasks, 2000).await;
    let log = dir.path().join("executions.log");
    let worker = |n: usize| {
        let agent = format!("agent{n}");
        let mut c = script("worker.py", &db, room);
        c.arg(&agent).arg(&log);
        c.stdout(Stdio::null()).stderr(Stdio::inherit());
        (agent, c)
    };
    // One client dies right after its first claim, mid-task: it starts first, so it
    // surely holds a task when it dies, and the others must re-take that task after
    // its lease.
    let (name, mut crasher) = worker(7);
    crasher.args(["--crash-after-claims", "1"]);
    let mut crashed = vec![(name, crasher.spawn().expect("spawn worker.py"))];
    let ended = wait_all(&mut crashed, Duration::from_secs(120));
    assert_eq!(ended, vec![("agent7".to_string(), false)], "agent7 dies");
    let mut children: Vec<(String, Child)> = (0..7)
        .map(|n| {
            let (agent, mut c) = worker(n);
            (agent, c.spawn().expect("spawn worker.py"))
        })
        .collect();
    let ended = wait_all(&mut children, Duration::from_secs(600));
    for (agent, success) in &ended {
        assert!(*success, "{agent} failed");
    }

    let (dag, completions) = fold(&db, room).await;
    assert_eq!(completions, 200, "one completion row per task");
    for (id, _) in &tasks {
        let t = dag.task(room, id).expect("task");
        assert_eq!(t.status, TaskStatus::Done, "{id}");
    }
    let text = std::fs::read_to_string(&log).expect("executions log");
    let mut execs: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let mut done: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [kind, agent, task, epoch] = parts[..] else {
            panic!("bad log line {line:?}");
        };
        let entry = (agent.to_string(), epoch.parse::<i64>().expect("epoch"));
        match kind {
            "exec" => execs.entry(task.to_string()).or_default().push(entry),
            "done" => done.entry(task.to_string()).or_default().push(entry),
            "stale" => {}
            other => panic!("bad log kind {other}"),
        }
    }
    // Every task's completion was accepted exactly once, from the owner the ledger
    // records, at its epoch.
    assert_eq!(done.len(), 200);
    for (task, d) in &done {
        assert_eq!(d.len(), 1, "{task} accepted twice: {d:?}");
        let t = dag.task(room, task).unwrap();
        assert_eq!(
            (t.owner.clone(), t.epoch.map(|e| e.get())),
            (Some(d[0].0.clone()), Some(d[0].1)),
            "{task}"
        );
    }
    // The killed client's task was executed again by another agent, after the lease.
    let crashed: Vec<(&String, &Vec<(String, i64)>)> = execs
        .iter()
        .filter(|(_, e)| e.iter().any(|(a, _)| a == "agent7"))
        .collect();
    assert_eq!(crashed.len(), 1, "agent7 claimed exactly one task");
    let (task, runs) = crashed[0];
    assert!(runs.len() >= 2, "{task} re-taken: {runs:?}");
    let finisher = &done[task][0];
    assert_ne!(finisher.0, "agent7");
    assert!(finisher.1 > runs[0].1, "re-taken at a higher epoch");
    // Executions repeat only for lapsed leases: at most a handful beyond 200.
    let total: usize = execs.values().map(Vec::len).sum();
    assert!(total >= 201, "{total} executions");
}

/// Shared resources and shared state through two `huddle mcp` processes
/// (`tests/mcp/shared.py`): a held resource blocks the other agent until the holder's
/// server ends and gives it back; a stale put is refused.
#[tokio::test(flavor = "multi_thread")]
async fn python_clients_share_resources_and_state() {
    let (_dir, db) = tempdb();
    seed_tasks(&db, "shared", &[], 1000).await;
    let out = script("shared.py", &db, "shared")
        .output()
        .expect("run shared.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "shared.py failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = huddle_store::open(&db, StoreOptions::default())
        .await
        .unwrap();
    let rows = store
        .read_room("shared", Position::START, 10_000)
        .await
        .unwrap()
        .rows;
    let count = |v: Verb| rows.iter().filter(|r| r.verb == v).count();
    assert_eq!(count(Verb::ResourceAcquired), 2);
    assert_eq!(
        count(Verb::ResourceReleased),
        2,
        "ava's server gave hers back at its end"
    );
    assert!(count(Verb::ResourceRenewed) >= 1);
    assert_eq!(count(Verb::StatePut), 1);
}

/// Decisions, barriers and the lease through three `huddle mcp` processes
/// (`tests/mcp/patterns.py`); the ledger holds what the folds need.
#[tokio::test(flavor = "multi_thread")]
async fn python_clients_vote_wait_at_a_barrier_and_pass_the_lease() {
    let (_dir, db) = tempdb();
    seed_tasks(&db, "patterns", &[], 1000).await;
    let out = script("patterns.py", &db, "patterns")
        .output()
        .expect("run patterns.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "patterns.py failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = huddle_store::open(&db, StoreOptions::default())
        .await
        .unwrap();
    let rows = store
        .read_room("patterns", Position::START, 10_000)
        .await
        .unwrap()
        .rows;
    let count = |v: Verb| rows.iter().filter(|r| r.verb == v).count();
    assert_eq!(count(Verb::DecisionVoted), 2);
    assert_eq!(count(Verb::DecisionCommitted), 1);
    assert_eq!(count(Verb::BarrierCheckin), 2);
    assert_eq!(
        count(Verb::LeaseDirective),
        1,
        "the stale directive was refused"
    );

    // The same, where users look.
    let show = |what: &str, json: bool| {
        let mut c = huddle(&db);
        c.args([what, "--room", "patterns"]);
        if json {
            c.arg("--json");
        }
        ok(c)
    };
    let decisions: serde_json::Value = serde_json::from_str(&show("decisions", true)).unwrap();
    assert_eq!(decisions[0]["id"], "ship");
    assert_eq!(decisions[0]["status"], "committed");
    assert_eq!(decisions[0]["closed_by"], "decision.committed");
    assert!(show("decisions", false).contains("ship [committed yes] by ava"));
    let barriers: serde_json::Value = serde_json::from_str(&show("barriers", true)).unwrap();
    assert_eq!(barriers[0]["phase"], "build");
    assert_eq!(barriers[0]["status"], "passed");
    assert!(show("barriers", false).contains("build [passed] by ava"));
    let leases: serde_json::Value = serde_json::from_str(&show("lease", true)).unwrap();
    assert_eq!(leases[0]["name"], "coordinator");
    assert_eq!(leases[0]["holder"], "cy");
    assert_eq!(leases[0]["directives"][0]["check"], "applies");
    let text = show("lease", false);
    assert!(text.contains("coordinator [held] cy at epoch"), "{text}");
}
