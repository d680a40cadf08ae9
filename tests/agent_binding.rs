//! End-to-end: agents bound to writers (plan 0028), through the real `huddle` binary
//! and real relays, on both backends. The owner binds `ada` to relay r0; rows written
//! as ada by another writer (on Postgres another relay's database role) are ignored by
//! every reader and counted, and writers refuse to act as ada elsewhere.

use crate::common;

use std::sync::Arc;

use common::relays::*;
use common::{fails, huddle, ok};
use huddle_core::{TaskStatus, Verb};
use huddle_store::{Store, StoreOptions};

on_both_backends!(rows_as_a_bound_agent_from_another_writer_change_nothing);

/// The writers of this test: their names (what the binding names and rows record) and
/// the database URL each connects with. On SQLite a writer is the relay id it
/// declares; on Postgres it is a relay role made with `huddle admin add-relay`.
fn writers(h: &Huddle) -> Vec<(String, String)> {
    match h.db.backend {
        Backend::Sqlite => ["r0", "r1"]
            .map(|w| (w.to_string(), h.db.url.clone()))
            .to_vec(),
        Backend::Postgres | Backend::PostgresOwnCluster => {
            ok({
                let mut c = huddle(&h.db.url);
                c.args(["admin", "init"]);
                c
            });
            // Role names are cluster-wide and the test cluster is shared: suffix them.
            let tag = std::process::id();
            ["r0", "r1"]
                .map(|w| {
                    let name = format!("{w}-{tag}");
                    let url = ok({
                        let mut c = huddle(&h.db.url);
                        c.args(["admin", "add-relay", &name]);
                        c
                    });
                    (name, url.trim().to_string())
                })
                .to_vec()
        }
    }
}

async fn rows_as_a_bound_agent_from_another_writer_change_nothing(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let ws = writers(&h);
    let ((w0, url0), (w1, url1)) = (ws[0].clone(), ws[1].clone());

    // r1 hosts bo; tasks go to their assignee (push), so bo leaves ada's task alone.
    h.spawn_relay_on(&w1, vec![AgentSpec::sim("bo", 50)], &url1);
    h.wait_registered(&["bo"]).await;
    let reply = h.owner_says("!config allocation push").await;
    assert!(reply.contains("allocation"), "{reply}");
    let reply = h.owner_says(&format!("!config agents ada@{w0}")).await;
    assert!(reply.contains(&format!("ada@{w0}")), "{reply}");
    h.delegate("t: ada's work @ada").await;

    // The forger: a store writing as w1, straight through the store API, with a claim
    // it really acquired (so the database's fences let the rows in).
    let forger: Arc<dyn Store> = huddle_store::open(
        &url1,
        StoreOptions {
            relay: w1.clone(),
            ..Default::default()
        },
    )
    .await
    .expect("open the forger's store");
    let (epoch, tried) = forge_claim_and_completion(&*forger, &h.room, "t", "ada").await;

    // Every reader ignores them: the task is still open for ada.
    h.refresh().await;
    let t = h.ledger.task("t").expect("task t");
    assert_eq!(t.status, TaskStatus::Open, "{t:?}");
    assert_eq!(h.ledger.config.misbound_rows(), tried);
    let tasks = ok({
        let mut c = huddle(&h.db.url);
        c.args(["tasks", "--room", &h.room, "--json"]);
        c
    });
    assert!(!tasks.contains("FORGED"), "{tasks}");

    // A relay of another writer configured to host ada refuses to start, naming the
    // binding; so do `huddle task` commands acting as ada from another writer.
    let (other, other_url) = match backend {
        Backend::Sqlite => ("r2".to_string(), h.db.url.clone()),
        _ => (w1.clone(), url1.clone()),
    };
    h.spawn_relay_on("r2", vec![AgentSpec::sim("ada", 50)], &other_url);
    let refused = h.relay("r2");
    let status = refused.wait_exit(secs(30));
    assert!(!status.success(), "{status}");
    let log = refused.log_tail(20);
    assert!(
        log.contains(&format!("agent \"ada\" is bound to {w0}"))
            && log.contains(&format!("not to this writer \"{other}\"")),
        "{log}"
    );
    let err = fails({
        let mut c = huddle(&other_url);
        c.args(["--relay-id", &other, "task", "claim", "t"])
            .args(["--room", &h.room, "--agent", "ada"]);
        c
    });
    assert!(
        err.contains("[bound_elsewhere]") && err.contains(&w0),
        "{err}"
    );
    let err = fails({
        let mut c = huddle(&other_url);
        c.args([
            "--relay-id",
            &other,
            "mcp",
            "--room",
            &h.room,
            "--agent",
            "ada",
        ])
        .stdin(std::process::Stdio::null());
        c
    });
    assert!(
        err.contains(&format!("agent \"ada\" is bound to {w0}")),
        "{err}"
    );

    // ada's own relay does the task for real.
    h.spawn_relay_on(&w0, vec![AgentSpec::sim("ada", 50)], &url0);
    h.wait_until("ada's task done", secs(60), |l| {
        l.task("t").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    let t = h.ledger.task("t").unwrap();
    assert_ne!(t.result.as_deref(), Some("FORGED"), "{t:?}");
    assert!(t.epoch > Some(epoch), "{t:?}");
    let done: Vec<_> = h
        .ledger
        .of_verb(Verb::TaskCompleted)
        .map(|(_, r)| r.relay.clone())
        .collect();
    assert_eq!(
        done,
        [w1.clone(), w0.clone()],
        "the forged and the real completion"
    );
    let summaries = h.stop_all().await;
    for s in &summaries {
        assert_eq!(s.misbound_rows, tried, "{s:?}");
    }
    eprintln!("agent binding: {tried} rows forged as a bound agent, all ignored and counted");
}
