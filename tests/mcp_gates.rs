//! End-to-end: delegation by agents and approval gates through `huddle mcp` driven by
//! the official MCP Python SDK (`tests/mcp/gates.py`) and through the CLI, on SQLite
//! and Postgres.

use crate::common;

use common::mcp::client_script;
use common::relays::{ms, relay_toml, secs, AgentSpec, Backend, RelayProcess, TestDatabase};
use common::*;
use huddle_core::{Fold, OwnerAuthority, Position, Role, TaskDag, TaskStatus, Verb};
use huddle_store::StoreOptions;
use serde_json::Value;

/// Creates `room` owned by `ana`, with `lead` as the one delegator.
async fn seed(db: &str, room: &str) {
    ok({
        let mut c = huddle(db);
        c.args(["room", "create", room, "--owner", "ana"]);
        c
    });
    let rows = huddle_core::seed_room(
        room,
        "ana",
        &owner_key("ana"),
        &["!config claim-ttl 30s", "!config delegators lead"],
    )
    .expect("seed commands");
    let store = huddle_store::open(db, StoreOptions::default())
        .await
        .expect("open the database");
    store
        .append(rows[1..].to_vec())
        .await
        .expect("seed the room");
}

/// Every row of the room.
async fn rows(db: &str, room: &str) -> Vec<huddle_core::Interaction> {
    let store = huddle_store::open(db, StoreOptions::default())
        .await
        .unwrap();
    store
        .read_room(room, Position::START, 10_000)
        .await
        .unwrap()
        .rows
}

/// The task DAG and the owner authority, folded as every reader folds them.
async fn fold(db: &str, room: &str) -> (TaskDag, OwnerAuthority) {
    let rows = rows(db, room).await;
    let mut auth = OwnerAuthority::new();
    let mut dag = TaskDag::new();
    for r in &rows {
        auth.apply(r);
        if auth.admits(r) {
            dag.apply(r);
        }
    }
    (dag, auth)
}

/// The texts of huddle's replies to approval commands (`!approve` / `!deny`), in
/// ledger order.
async fn system_replies(db: &str, room: &str) -> Vec<String> {
    let rows = rows(db, room).await;
    let text =
        |r: &huddle_core::Interaction| r.body["text"].as_str().unwrap_or_default().to_string();
    let answers: Vec<_> = rows
        .iter()
        .filter(|r| r.verb == Verb::MessagePosted && r.role == Role::Owner)
        .filter(|r| text(r).starts_with("!approve") || text(r).starts_with("!deny"))
        .map(|r| r.id)
        .collect();
    rows.iter()
        .filter(|r| r.role == Role::System && r.parent.is_some_and(|p| answers.contains(&p)))
        .map(text)
        .collect()
}

on_both_backends!(python_agents_delegate_and_wait_for_approvals);

async fn python_agents_delegate_and_wait_for_approvals(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    let room = "gates";
    seed(&db, room).await;
    let out = client_script("gates.py", &db, room)
        .output()
        .expect("run gates.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "gates.py failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("GATES "))
        .expect("the script prints the approval ids")
        .split(' ')
        .collect();

    // The ledger, folded by any reader: the delegator's tasks, nobody else's.
    let (dag, auth) = fold(&db, room).await;
    assert_eq!(
        dag.task(room, "build").unwrap().created_by,
        "lead",
        "the delegator's task counts"
    );
    assert!(
        dag.task(room, "x").is_none(),
        "the refused plan wrote nothing"
    );
    let approvals = auth.approvals();
    let status = |id: &str| approvals.status(room, id).map(|s| s.as_str());
    assert_eq!(
        [status(ids[0]), status(ids[1]), status(ids[2])],
        [Some("approved"), Some("denied"), Some("pending")]
    );
    // mallory's `post` and `huddle post --as mallory`: neither counted as an answer.
    let forged = approvals
        .get(room, ids[0])
        .unwrap()
        .answer
        .as_ref()
        .unwrap();
    assert_eq!(forged.by, "ana");

    // `huddle approvals`: pending first, with how to answer; --json is the tool's view.
    let text = ok({
        let mut c = huddle(&db);
        c.args(["approvals", "--room", room]);
        c
    });
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(ids[2]) && first.contains("[pending]"),
        "{text}"
    );
    assert!(text.contains(&format!("!approve {}", ids[2])), "{text}");
    assert!(text.contains("reason: keep it a week"), "{text}");
    let json: Value = serde_json::from_str(&ok({
        let mut c = huddle(&db);
        c.args(["approvals", "--room", room, "--json"]);
        c
    }))
    .unwrap();
    let statuses: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["pending", "approved", "denied"]);

    // The same through the CLI: a non-delegator is refused, the lead is not.
    let err = fails({
        let mut c = huddle(&db);
        c.args(["task", "delegate", "--room", room, "--agent", "mallory"])
            .arg("y: sneak in");
        c
    });
    assert!(err.contains("[not_delegator]"), "{err}");
    let made: Value = serde_json::from_str(&ok({
        let mut c = huddle(&db);
        c.args([
            "task", "delegate", "--room", room, "--agent", "lead", "--json",
        ])
        .arg("ship: ship it [after build]");
        c
    }))
    .unwrap();
    assert_eq!(made["created"], serde_json::json!(["ship"]));
    let (dag, _) = fold(&db, room).await;
    assert_eq!(
        dag.task(room, "ship").unwrap().deps,
        vec!["build".to_string()]
    );
    assert!(dag.task(room, "y").is_none());
    // An answer to an unknown id: the relay replies with the error, nothing counts.
    ok({
        let mut c = huddle(&db);
        c.args([
            "post",
            "--room",
            room,
            "--as",
            "ana",
            "!approve ap-ffffffff",
        ]);
        c
    });

    // A relay hosting bo drives the delegator's tasks like the owner's: its fold
    // admits them (`spec` was completed through MCP; `build` and `ship` are left),
    // and answers the owner's approval commands.
    let dir = tempfile::tempdir().expect("tempdir for the relay");
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        relay_toml("r0", &db, &[room], &[AgentSpec::sim("bo", 50)]),
    )
    .expect("write the relay config");
    let mut relay = RelayProcess::spawn(
        "r0",
        vec!["bo".into()],
        &db,
        &config,
        &dir.path().join("relay.log"),
    );
    let deadline = std::time::Instant::now() + secs(60);
    loop {
        let (dag, _) = fold(&db, room).await;
        let done = |t: &str| dag.task(room, t).map(|t| t.status) == Some(TaskStatus::Done);
        let replies = system_replies(&db, room).await;
        if done("build") && done("ship") && replies.len() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay did not finish the delegated tasks: {}",
            relay.log_tail(20)
        );
        tokio::time::sleep(ms(200)).await;
    }
    relay.terminate();
    // One reply per signed owner answer (none for mallory's), the unknown id refused.
    let replies = system_replies(&db, room).await;
    assert_eq!(
        replies,
        [
            format!("Approved {}.", ids[0]),
            format!("Denied {}: keep it a week", ids[1]),
            "not recorded: there is no approval request `ap-ffffffff` in this room; \
             `huddle approvals` lists them"
                .to_string(),
        ]
    );
    let (_, auth) = fold(&db, room).await;
    assert_eq!(auth.approvals().status(room, "ap-ffffffff"), None);
    assert_eq!(auth.approvals().room(room).count(), 3);
}
