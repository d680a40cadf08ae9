//! `docs/operations.md`'s Postgres set-up, step by step with the real binary (plans
//! 0017, 0032): `huddle admin init`, three relay roles and a reader role; then relays
//! run under those roles and finish a delegated DAG, every row they write is
//! attributed to its relay's role, the database enforces the owner's binding of an
//! agent to a relay role once `huddle admin sync-agents` copies it, and the reader
//! can read but not write.

use crate::common;

use common::relays::*;
use common::{fails, huddle, ok};
use huddle_core::Verb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_setup_runs_relays_under_their_own_roles() {
    let mut h = Huddle::new(Backend::Postgres).await;
    let admin_url = h.db.url.clone();
    // Role names are cluster-wide and the test cluster is shared: suffix them.
    let tag = std::process::id();

    // 1. huddle admin init (twice: it is idempotent).
    for _ in 0..2 {
        let out = ok({
            let mut c = huddle(&admin_url);
            c.args(["admin", "init"]);
            c
        });
        assert!(out.contains("huddle_relay"), "{out}");
    }
    // 2. One role per relay, and a reader; each prints its connection URL.
    let mut urls = Vec::new();
    for r in ["relay-a", "relay-b", "relay-c"] {
        let name = format!("{r}-{tag}");
        let url = ok({
            let mut c = huddle(&admin_url);
            c.args(["admin", "add-relay", &name]);
            c
        });
        let url = url.trim().to_string();
        assert!(url.starts_with("postgres") && url.contains(&name), "{url}");
        urls.push((name, url));
    }
    let reader = format!("dashboard-{tag}");
    let reader_url = ok({
        let mut c = huddle(&admin_url);
        c.args(["admin", "add-reader", &reader]);
        c
    })
    .trim()
    .to_string();
    // Not a huddle role: left alone.
    let err = fails({
        let mut c = huddle(&admin_url);
        c.args(["admin", "remove-relay", "postgres"]);
        c
    });
    assert!(err.contains("not a huddle login"), "{err}");

    // 3. Relays under their roles finish a DAG.
    for (i, (name, url)) in urls.iter().enumerate() {
        h.spawn_relay_on(name, vec![AgentSpec::sim(&format!("x{i}"), 200)], url);
    }
    h.wait_registered(&["x0", "x1", "x2"]).await;
    h.delegate("d1: first\nd2: second [after d1]\nd3: third\nd4: fourth [after d2, d3]")
        .await;
    h.wait_until("all four tasks done", secs(60), |l| l.summary().done == 4)
        .await;
    h.wait_quiescent(secs(30)).await;

    // 4. The database enforces the owner's binding of agents to relay roles: the owner
    //    binds x0 to relay-a, the administrator copies the signed binding into the
    //    database, and relay-b's role can no longer write as x0.
    let (relay_a, relay_b) = (&urls[0].0, &urls[1].1);
    h.config(&format!("agents x0@{relay_a}")).await;
    let synced = ok({
        let mut c = huddle(&admin_url);
        c.args(["admin", "sync-agents", "lobby"]);
        c
    });
    assert_eq!(synced.trim(), format!("lobby x0 {relay_a}"));
    let listed = ok({
        let mut c = huddle(&admin_url);
        c.args(["admin", "bindings", "--json"]);
        c
    });
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    assert_eq!(
        listed,
        serde_json::json!([{"room": "lobby", "agent": "x0", "relay": relay_a}])
    );
    let forger = huddle_store::open(relay_b, huddle_store::StoreOptions::default())
        .await
        .expect("open as relay-b");
    let err = forger
        .append(vec![huddle_core::NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "x0",
            huddle_core::Role::Agent,
            serde_json::json!({"text": "I am x0"}),
        )])
        .await
        .expect_err("the database refuses it");
    assert!(
        err.to_string()
            .contains("may not write as agent x0 in room lobby")
            && err.to_string().contains(relay_a.as_str()),
        "{err}"
    );
    // Unbinding lets any role write as it again (the folds still hold the owner's
    // binding).
    let out = common::run({
        let mut c = huddle(&admin_url);
        c.args(["admin", "unbind-agent", "lobby", "x0"]);
        c
    });
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 binding(s)"));
    let empty = ok({
        let mut c = huddle(&admin_url);
        c.args(["admin", "bindings", "lobby"]);
        c
    });
    assert!(empty.trim().is_empty(), "{empty}");

    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(4);
    let roles: Vec<&str> = urls.iter().map(|(n, _)| n.as_str()).collect();
    for verb in [
        Verb::TaskClaimed,
        Verb::TaskCompleted,
        Verb::AgentRegistered,
    ] {
        for (_, r) in h.ledger.of_verb(verb) {
            assert!(
                roles.contains(&r.relay.as_str()),
                "{verb:?} by {} attributed to {}",
                r.actor,
                r.relay
            );
        }
    }

    // 5. The reader reads and cannot write.
    let out = ok({
        let mut c = huddle(&reader_url);
        c.args(["tail", "--room", "lobby"]);
        c
    });
    assert!(out.contains("d4"), "{out}");
    let err = fails({
        let mut c = huddle(&reader_url);
        c.args(["post", "--room", "lobby", "--as", "eve", "hello"]);
        c
    });
    assert!(err.contains("permission denied"), "{err}");

    // 6. Removing a relay is idempotent too.
    for expect in ["removed", "nothing to remove"] {
        let out = common::run({
            let mut c = huddle(&admin_url);
            c.args(["admin", "remove-relay", &urls[2].0]);
            c
        });
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(expect));
    }
    for (name, _) in &urls[..2] {
        ok({
            let mut c = huddle(&admin_url);
            c.args(["admin", "remove-relay", name]);
            c
        });
    }
    ok({
        let mut c = huddle(&admin_url);
        c.args(["admin", "remove-reader", &reader]);
        c
    });
}

#[test]
fn admin_on_sqlite_explains_there_are_no_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let out = ok({
        let mut c = huddle(&db);
        c.args(["admin", "init"]);
        c
    });
    assert!(out.contains("no database roles"), "{out}");
    let err = fails({
        let mut c = huddle(&db);
        c.args(["admin", "add-relay", "relay-a"]);
        c
    });
    assert!(err.contains("SQLite has no database roles"), "{err}");
}
