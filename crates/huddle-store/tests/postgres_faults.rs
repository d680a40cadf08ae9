//! Fault injection on the Postgres backend: a killed LISTEN connection, a restarted
//! server, a session stuck idle in a transaction. In each case nothing is lost or
//! duplicated and readers are not stalled for long.
//!
//! Every wait is a bounded loop on a condition; no assertion follows a fixed sleep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::{InteractionId, NewInteraction, Position, Role, Verb};
use huddle_store::conformance::TestBackend;
use huddle_store::postgres::{PgOptions, PgStore, PgTestBackend, LISTEN_APPLICATION_NAME};
use huddle_store::{
    ClaimRequest, Fence, FencedWrite, Ledger, StoreError, StoreOptions, Subscription,
};
use huddle_testkit::{test_database, PgCluster};
use serde_json::json;
use tokio::sync::mpsc;

fn msg(text: &str) -> NewInteraction {
    NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({ "text": text }),
    )
}

/// Store options whose fallback poll never fires during a test: a row that arrives
/// promptly came through the doorbell (or a reconnect's read-forward).
fn no_poll() -> StoreOptions {
    StoreOptions {
        poll_interval: Duration::from_secs(60),
        ..StoreOptions::default()
    }
}

async fn admin_session(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin session");
    tokio::spawn(conn);
    client
}

/// Follows the ledger in a task, forwarding every row id; read errors (server down)
/// are retried, as a relay would.
fn follow(ledger: Arc<dyn Ledger>) -> mpsc::UnboundedReceiver<InteractionId> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut sub = Subscription::new(ledger, Position::START, 100);
        loop {
            match sub.next().await {
                Ok(batch) => {
                    for row in batch.rows {
                        if tx.send(row.id).is_err() {
                            return;
                        }
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    rx
}

/// Receives exactly `expected`, in order, each within `within`.
async fn expect_rows(
    rx: &mut mpsc::UnboundedReceiver<InteractionId>,
    expected: &[InteractionId],
    within: Duration,
    what: &str,
) {
    for id in expected {
        let got = tokio::time::timeout(within, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: row {id:?} did not arrive within {within:?}"))
            .expect("follower alive");
        assert_eq!(got, *id, "{what}: rows out of order or duplicated");
    }
}

/// Asserts nothing more arrives for a short while (a duplicate would).
async fn expect_quiet(rx: &mut mpsc::UnboundedReceiver<InteractionId>) {
    if let Ok(Some(extra)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        panic!("unexpected extra row {extra:?} (a duplicate?)");
    }
}

async fn listening_sessions(admin: &tokio_postgres::Client) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1 \
             AND query LIKE 'LISTEN%' AND state = 'idle'",
            &[&LISTEN_APPLICATION_NAME],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn wait_listening(admin: &tokio_postgres::Client, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = listening_sessions(admin).await;
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "LISTEN sessions did not come back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (a) The LISTEN connection is killed again and again. A row appended right after
/// a kill arrives through the reconnect's read-forward; a row appended once the
/// listener is back arrives through its new LISTEN. Nothing is lost or duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_listen_connections_lose_nothing() {
    let db = test_database().await;
    let b = PgTestBackend::with_options(&db.url, no_poll(), PgOptions::default())
        .await
        .expect("connect")
        .holding(db);
    let reader: Arc<dyn Ledger> = b.store();
    let writer = b.reopen("writer").await.expect("writer");
    let admin = admin_session(b.url()).await;
    let mut rows = follow(reader);
    wait_listening(&admin, 2).await;
    let mut appended = Vec::new();
    for round in 0..5 {
        let before = listening_sessions(&admin).await;
        let killed: i64 = admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = $1) AS k",
                &[&LISTEN_APPLICATION_NAME],
            )
            .await
            .expect("terminate")
            .get(0);
        assert!(killed >= 1, "round {round}: no LISTEN session to kill");

        // Appended while nobody may be listening: found by the read-forward that
        // follows the reconnect.
        let during = msg(&format!("during outage {round}"));
        writer.append(vec![during.clone()]).await.expect("append");
        appended.push(during.id());
        expect_rows(
            &mut rows,
            &[during.id()],
            Duration::from_secs(20),
            "after kill",
        )
        .await;

        // Once the listener is back (new sessions), a new row arrives by NOTIFY.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = wait_listening(&admin, 2).await;
            if now.iter().all(|p| !before.contains(p)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the killed listener never came back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let after = msg(&format!("after reconnect {round}"));
        writer.append(vec![after.clone()]).await.expect("append");
        appended.push(after.id());
        expect_rows(
            &mut rows,
            &[after.id()],
            Duration::from_secs(20),
            "re-LISTEN",
        )
        .await;
    }
    expect_quiet(&mut rows).await;
    assert_eq!(appended.len(), 10);
}

/// (b) The server restarts under a running subscriber: appends fail as retryable
/// `Unavailable` while it is down and succeed after; the subscriber catches up on
/// every row exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing_and_duplicates_nothing() {
    let cluster = PgCluster::start();
    let admin = admin_session(&cluster.admin_url()).await;
    admin
        .batch_execute("CREATE DATABASE restart_test")
        .await
        .expect("create database");
    drop(admin);
    let url = cluster.url_for("restart_test");
    let reader: Arc<dyn Ledger> = Arc::new(
        PgStore::connect(&url, no_poll())
            .await
            .expect("reader connect"),
    );
    let writer = PgStore::connect(
        &url,
        StoreOptions {
            relay: "writer".into(),
            ..no_poll()
        },
    )
    .await
    .expect("writer connect");
    let mut rows = follow(reader);
    let mut expected = Vec::new();
    for i in 0..3 {
        let n = msg(&format!("before {i}"));
        writer.append(vec![n.clone()]).await.expect("append");
        expected.push(n.id());
    }
    expect_rows(
        &mut rows,
        &expected,
        Duration::from_secs(20),
        "before restart",
    )
    .await;

    cluster.stop().expect("stop the server");
    let down = msg("while down");
    let err = writer
        .append(vec![down.clone()])
        .await
        .expect_err("an append cannot succeed while the server is down");
    assert!(
        matches!(err, StoreError::Unavailable(_)) && err.is_retryable(),
        "expected Unavailable, got {err:?}"
    );

    cluster.start_again().expect("start the server again");
    // The first attempts may still meet connections that died with the server; every
    // failure must be a retryable one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match writer.append(vec![down.clone()]).await {
            Ok(out) => {
                assert!(out[0].inserted);
                break;
            }
            Err(e) => {
                assert!(e.is_retryable(), "non-retryable after restart: {e:?}");
                assert!(Instant::now() < deadline, "appends never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let mut after = vec![down.id()];
    for i in 0..3 {
        let n = msg(&format!("after {i}"));
        writer
            .append(vec![n.clone()])
            .await
            .expect("append after restart");
        after.push(n.id());
    }
    expect_rows(&mut rows, &after, Duration::from_secs(30), "after restart").await;
    expect_quiet(&mut rows).await;
}

/// (c) A session that stalls inside an append transaction holds every reader's
/// horizon back; `idle_in_transaction_session_timeout` cuts it, its rows are rolled
/// back, and readers move on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stuck_in_a_transaction_is_cut_and_readers_move_on() {
    let db = test_database().await;
    let pg = PgOptions {
        idle_in_transaction_timeout: Duration::from_secs(1),
        ..PgOptions::default()
    };
    let b = PgTestBackend::with_options(&db.url, StoreOptions::default(), pg)
        .await
        .expect("connect")
        .holding(db);
    let s = b.store();
    // A session configured like the store's pooled ones begins an append and stalls.
    let stuck = msg("never committed");
    let held = b.hold_append(vec![stuck.clone()]).await.expect("hold");
    let later = msg("committed behind the stuck one");
    s.append(vec![later.clone()]).await.expect("append");
    let blocked = s.read_forward(Position::START, 10).await.expect("read");
    assert!(
        blocked.rows.is_empty(),
        "a row behind an open transaction was read: {:?}",
        blocked.rows
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let batch = s.read_forward(Position::START, 10).await.expect("read");
        if !batch.rows.is_empty() {
            break batch.rows;
        }
        assert!(
            Instant::now() < deadline,
            "readers still stalled: the stuck session was never cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![later.id()],
        "the stuck transaction's row must be rolled back"
    );
    let err = held
        .commit()
        .await
        .expect_err("the stuck session was terminated");
    assert!(err.is_retryable(), "{err:?}");
    assert!(s.get(stuck.id()).await.expect("get").is_none());
}

/// Backends of this database waiting for a lock.
async fn lock_waiters(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

async fn wait_lock_waiters(admin: &tokio_postgres::Client, n: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while lock_waiters(admin).await < n {
        assert!(Instant::now() < deadline, "{what}: never waited for a lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (d) Two relays' results-then-hand-off statements whose fences and acquisitions
/// cross (plan 0088): one writes under `b` and `c` and asks for `a`, the other writes
/// under `a` and asks for `b` (as a relay does for a task whose `task.claimed` it has
/// not read yet). A statement locks its fences, then its acquisitions, each in key
/// order; were an acquisition to wait for a claim it cannot win, the first would hold
/// `b` waiting for `c` (held here by a third session), the second would hold `a`
/// waiting for `b`, and once `c` is free the first would wait for `a`: a deadlock,
/// one statement aborted. A claim another holder keeps live is answered as it stands,
/// without waiting for its row, so both complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_fences_and_acquisitions_do_not_deadlock() {
    let db = test_database().await;
    let b = PgTestBackend::new(&db.url)
        .await
        .expect("connect")
        .holding(db);
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let admin = admin_session(b.url()).await;
    let ttl = Duration::from_secs(60);
    let mut epoch = std::collections::HashMap::new();
    for (key, holder) in [("task/r/a", "bo"), ("task/r/b", "ada"), ("task/r/c", "ada")] {
        let got = s.acquire(key, holder, ttl).await.expect("acquire");
        assert!(got.won(), "{key}: {got:?}");
        epoch.insert(key, got.state().epoch);
    }
    let fence = |key: &'static str, holder: &str| Fence {
        key: key.into(),
        holder: holder.into(),
        epoch: epoch[key],
    };
    let ada = FencedWrite {
        fences: vec![fence("task/r/b", "ada"), fence("task/r/c", "ada")],
        close: true,
        rows: vec![msg("ada's results")],
    };
    let bo = FencedWrite {
        fences: vec![fence("task/r/a", "bo")],
        close: true,
        rows: vec![msg("bo's result")],
    };

    // A third session holds `c`.
    let mut blocker = admin_session(b.url()).await;
    let held = blocker.transaction().await.expect("begin");
    held.execute(
        "SELECT 1 FROM external_claim WHERE key = 'task/r/c' FOR UPDATE",
        &[],
    )
    .await
    .expect("lock c");
    let first = tokio::spawn(async move {
        s.append_then_hand_off(ada, &[ClaimRequest::new("task/r/a", "ada", ttl)], vec![])
            .await
    });
    wait_lock_waiters(&admin, 1, "ada's statement").await;
    let second = tokio::spawn(async move {
        other
            .append_then_hand_off(bo, &[ClaimRequest::new("task/r/b", "bo", ttl)], vec![])
            .await
    });
    // bo's statement either finishes (its acquisition of `b` does not wait) or waits
    // for ada's row; only then is `c` let go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !second.is_finished() && lock_waiters(&admin).await < 2 {
        assert!(
            Instant::now() < deadline,
            "bo's statement neither ended nor waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.commit().await.expect("release c");

    let within = Duration::from_secs(30);
    let (ada_written, ada_handoff) = tokio::time::timeout(within, first)
        .await
        .expect("ada's statement finished")
        .expect("join")
        .expect("ada's statement succeeds");
    let (bo_written, bo_handoff) = tokio::time::timeout(within, second)
        .await
        .expect("bo's statement finished")
        .expect("join")
        .expect("bo's statement succeeds");
    assert!(ada_written.iter().all(|a| a.inserted), "{ada_written:?}");
    assert!(bo_written.iter().all(|a| a.inserted), "{bo_written:?}");
    // Each asked for a claim the other held (or had just closed): neither won it.
    for (who, h) in [("ada", &ada_handoff), ("bo", &bo_handoff)] {
        let answer = h.acquired[0].as_ref().expect("tried");
        assert!(
            !answer.won(),
            "{who} took a claim held by the other: {answer:?}"
        );
    }
    // And both writes closed their fences: no claim is live.
    let claims = b.store().list_claims("task/r/").await.expect("list");
    assert_eq!(claims.len(), 3, "{claims:?}");
    assert!(claims.iter().all(|c| !c.live), "{claims:?}");
}
