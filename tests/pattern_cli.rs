//! End-to-end: the pattern writes from the command line — `huddle propose`, `huddle
//! vote`, `huddle barrier open|arrive`, `huddle lease acquire|renew|release`, `huddle
//! approval request|status` — through
//! the real binary (the same `AgentSession` calls as the MCP tools), on SQLite and
//! Postgres.

use crate::common;

use common::relays::{Backend, TestDatabase};
use common::*;
use serde_json::Value;

const ROOM: &str = "ops";

/// `huddle WORDS... --room ops --agent AGENT ARGS...`
fn agent_cmd(db: &str, words: &[&str], agent: &str, args: &[&str]) -> std::process::Command {
    let mut c = huddle(db);
    c.args(words)
        .args(["--room", ROOM, "--agent", agent])
        .args(args);
    c
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

on_both_backends!(pattern_writes_from_the_command_line);

async fn pattern_writes_from_the_command_line(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seed_tasks(&db, ROOM, &[], 1000).await;

    // A decision: two concurring votes of three commit; a second vote is refused.
    let p = json(&ok(agent_cmd(
        &db,
        &["propose"],
        "ava",
        &[
            "ship",
            "--voters",
            "ava,bo,cy",
            "--window-ms",
            "60000",
            "--question",
            "Ship?",
            "--json",
        ],
    )));
    assert_eq!(p["decision"]["status"], "open", "{p}");
    ok(agent_cmd(&db, &["vote"], "ava", &["ship", "yes"]));
    let v = ok(agent_cmd(&db, &["vote"], "bo", &["ship", "yes"]));
    assert!(v.starts_with("ship [committed yes] by ava"), "{v}");
    let retry = ok(agent_cmd(&db, &["vote"], "bo", &["ship", "yes"]));
    assert!(retry.contains("already recorded"), "{retry}");
    let err = fails(agent_cmd(&db, &["vote"], "bo", &["ship", "no"]));
    assert!(err.contains("[already_voted]"), "{err}");
    let err = fails(agent_cmd(&db, &["vote"], "mallory", &["ship", "no"]));
    assert!(err.contains("[not_listed]"), "{err}");
    let weighted = fails(agent_cmd(
        &db,
        &["propose"],
        "ava",
        &["w", "--voters", "ava=x", "--window-ms", "1000"],
    ));
    assert!(weighted.contains("is not a number"), "{weighted}");

    // A barrier released by its roster.
    ok(agent_cmd(
        &db,
        &["barrier", "open"],
        "ava",
        &["build", "--roster", "bo,cy", "--timeout-ms", "60000"],
    ));
    let err = fails(agent_cmd(&db, &["barrier", "arrive"], "ava", &["build"]));
    assert!(err.contains("[not_listed]"), "{err}");
    ok(agent_cmd(&db, &["barrier", "arrive"], "bo", &["build"]));
    let passed = json(&ok(agent_cmd(
        &db,
        &["barrier", "arrive"],
        "cy",
        &["build", "--json"],
    )));
    assert_eq!(passed["barrier"]["status"], "passed", "{passed}");

    // The lease: held, refused to another, renewed, released, taken at a later epoch.
    let held = json(&ok(agent_cmd(
        &db,
        &["lease", "acquire"],
        "bo",
        &["--ttl-ms", "30000", "--json"],
    )));
    let epoch = held["lease"]["epoch"].as_u64().expect("an epoch");
    let err = fails(agent_cmd(&db, &["lease", "acquire"], "cy", &[]));
    assert!(err.contains("[lease_held]") && err.contains("bo"), "{err}");
    let err = fails(agent_cmd(&db, &["lease", "renew"], "cy", &[]));
    assert!(err.contains("[not_lease_holder]"), "{err}");
    ok(agent_cmd(&db, &["lease", "renew"], "bo", &[]));
    ok(agent_cmd(&db, &["lease", "release"], "bo", &[]));
    let taken = json(&ok(agent_cmd(
        &db,
        &["lease", "acquire"],
        "cy",
        &["--json"],
    )));
    assert_eq!(taken["lease"]["holder"], "cy", "{taken}");
    assert!(taken["lease"]["epoch"].as_u64().unwrap() > epoch, "{taken}");

    // An approval gate from the command line; the owner answers with a signed post.
    let asked = json(&ok(agent_cmd(
        &db,
        &["approval", "request"],
        "bo",
        &["--action", "deploy to prod", "--json"],
    )));
    let id = asked["approval"]["id"].as_str().expect("an id").to_string();
    assert_eq!(asked["approval"]["status"], "pending", "{asked}");
    let pending = ok(agent_cmd(&db, &["approval", "status"], "bo", &[&id]));
    assert!(pending.contains(&format!("!approve {id}")), "{pending}");
    ok({
        let mut c = huddle(&db);
        c.args([
            "post",
            "--room",
            ROOM,
            "--as",
            "ana",
            &format!("!approve {id}"),
        ]);
        c
    });
    let answered = ok(agent_cmd(
        &db,
        &["approval", "status"],
        "bo",
        &[&id, "--wait-ms", "10000"],
    ));
    assert!(
        answered.starts_with(&format!("{id} [approved by ana")),
        "{answered}"
    );
    let err = fails(agent_cmd(&db, &["approval", "status"], "bo", &["ap-nope"]));
    assert!(err.contains("[no_approval]"), "{err}");

    // The views agree; `huddle lease --room` is still the view.
    let decisions = json(&ok({
        let mut c = huddle(&db);
        c.args(["decisions", "--room", ROOM, "--json"]);
        c
    }));
    assert_eq!(decisions[0]["status"], "committed", "{decisions}");
    let lease = ok({
        let mut c = huddle(&db);
        c.args(["lease", "--room", ROOM]);
        c
    });
    assert!(lease.starts_with("coordinator [held] cy"), "{lease}");
}

/// A command sees the write of the command before it even when that row is held back
/// behind another writer's transaction that is still open (Postgres: the gap-free
/// cursor does not read past an older open transaction). The agent's catch-up reads
/// again while committed rows are held back, for up to a second; here the other
/// transaction commits 0.7 s after the two commands start, so without that wait
/// `approval status` would not find the request it follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sees_the_write_before_it_behind_an_open_transaction() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let db = database.url.clone();
    seed_tasks(&db, ROOM, &[], 1000).await;
    let (other, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    other
        .batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .await
        .expect("an open transaction with an id");
    let url = db.clone();
    let commands = tokio::task::spawn_blocking(move || {
        let asked = json(&ok(agent_cmd(
            &url,
            &["approval", "request"],
            "bo",
            &["--action", "deploy", "--json"],
        )));
        let id = asked["approval"]["id"].as_str().expect("an id").to_string();
        let status = run(agent_cmd(&url, &["approval", "status"], "bo", &[&id]));
        (id, status)
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    other.batch_execute("COMMIT").await.expect("commit");
    let (id, status) = commands.await.expect("join");
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && stdout.contains(&format!("!approve {id}")),
        "status of {id}: {}\n{stdout}",
        String::from_utf8_lossy(&status.stderr)
    );
}
