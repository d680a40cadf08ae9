//! The Postgres backend against the store's written behaviour, plus the
//! Postgres-only behaviour (migrations under the advisory lock, the batch statement).
//!
//! Needs PostgreSQL: `initdb`/`pg_ctl` on the machine or `HUDDLE_TEST_DATABASE_URL`
//! (see huddle-testkit). Without either these tests fail, loudly.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::{InteractionId, NewInteraction, Position, RawRow, Role, Verb};
use huddle_store::conformance::TestBackend;
use huddle_store::postgres::{PgOptions, PgStore, PgTestBackend};
use huddle_store::{Acquired, Fence, Ledger, StoreError, StoreOptions, Subscription};
use huddle_testkit::test_database;
use serde_json::json;

async fn make_backend() -> PgTestBackend {
    let db = test_database().await;
    PgTestBackend::new(&db.url)
        .await
        .expect("connect to the test database")
        .holding(db)
}

fn msg(text: &str) -> NewInteraction {
    NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({ "text": text }),
    )
}

async fn read_all(ledger: &dyn Ledger) -> Vec<huddle_core::Interaction> {
    let mut out = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = ledger.read_forward(cursor, 7).await.expect("read");
        if batch.rows.is_empty() && batch.skipped.is_empty() {
            return out;
        }
        cursor = batch.next;
        out.extend(batch.rows);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_relays_starting_together_on_a_fresh_database_all_connect() {
    let db = test_database().await;
    let mut joins = Vec::new();
    for i in 0..8 {
        let url = db.url.clone();
        joins.push(tokio::spawn(async move {
            let options = StoreOptions {
                relay: format!("r{i}"),
                ..StoreOptions::default()
            };
            PgStore::connect(&url, options).await
        }));
    }
    let mut stores = Vec::new();
    for j in joins {
        stores.push(
            j.await
                .expect("join")
                .expect("every concurrent connect succeeds"),
        );
    }
    // Each migration was recorded once, and the schema works from every store.
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let n: i64 = client
        .query_one("SELECT count(*) FROM huddle_migration", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n as usize, huddle_store::migrations::POSTGRES.len());
    for (i, s) in stores.iter().enumerate() {
        s.append(vec![msg(&format!("from {i}"))])
            .await
            .expect("append");
    }
    assert_eq!(read_all(&stores[0]).await.len(), 8);
}

#[tokio::test]
async fn appends_are_idempotent_by_content_and_by_key_within_and_across_batches() {
    let b = make_backend().await;
    let s = b.store();
    let a = msg("a");
    let keyed = msg("k1").with_idempotency_key("key-1");
    let same_key_other_content = msg("k2").with_idempotency_key("key-1");
    let out = s
        .append(vec![
            a.clone(),
            a.clone(),
            keyed.clone(),
            same_key_other_content.clone(),
        ])
        .await
        .expect("append");
    assert_eq!(
        out.iter().map(|x| (x.id, x.inserted)).collect::<Vec<_>>(),
        vec![
            (a.id(), true),
            (a.id(), false),
            (keyed.id(), true),
            (keyed.id(), false),
        ]
    );
    // Again, in another batch: nothing new, same ids.
    let again = s
        .append(vec![same_key_other_content, a.clone()])
        .await
        .expect("append");
    assert_eq!(again[0].id, keyed.id());
    assert!(!again[0].inserted);
    assert_eq!(again[1].id, a.id());
    assert!(!again[1].inserted);
    let rows = read_all(&*s).await;
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a.id(), keyed.id()]
    );
}

#[tokio::test]
async fn every_field_round_trips_including_hostile_names() {
    let b = make_backend().await;
    let s = b.store();
    let parent = msg("p");
    s.append(vec![parent.clone()]).await.expect("append parent");
    let hostile = "Ro'om\"; DROP TABLE interaction; -- ü 🦀";
    let n = NewInteraction::new(
        hostile,
        Verb::TaskCreated,
        "bo\\b'",
        Role::Agent,
        json!({"nested": {"z": 1, "a": [true, null, "x"]}, "text": "é"}),
    )
    .in_thread("th'read")
    .with_parent(parent.id())
    .with_caused_by(vec![parent.id(), InteractionId([7; 32])]);
    let out = s.append(vec![n.clone()]).await.expect("append");
    assert!(out[0].inserted);
    let got = s.get(n.id()).await.expect("get").expect("present");
    assert_eq!(got.content(), n);
    assert_eq!(got.caused_by, n.caused_by);
    assert!(got.at > 0);
    assert_eq!(got.relay, "postgres", "Postgres records the database role");
    let too_big = NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({"text": "x".repeat(300 * 1024)}),
    );
    let err = s
        .append(vec![msg("fine"), too_big])
        .await
        .expect_err("oversized body refused");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(read_all(&*s).await.len(), 2, "nothing of the refused batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_committing_out_of_sequence_order_is_never_skipped() {
    let b = make_backend().await;
    let s = b.store();
    let held = b
        .hold_append(vec![msg("held-1"), msg("held-2")])
        .await
        .expect("hold");
    for i in 0..5 {
        s.append(vec![msg(&format!("later-{i}"))])
            .await
            .expect("append");
    }
    // The held transaction is older than every later one: readers wait for it.
    let early = s.read_forward(Position::START, 100).await.expect("read");
    assert!(early.rows.is_empty(), "{:?}", early.rows);
    assert_eq!(early.next, Position::START);
    held.commit().await.expect("commit");
    let rows = read_all(&*s).await;
    let texts: Vec<String> = rows
        .iter()
        .map(|r| r.body["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(texts.len(), 7);
    assert_eq!(&texts[..2], &["held-1", "held-2"]);
    let unique: HashSet<_> = rows.iter().map(|r| r.id).collect();
    assert_eq!(unique.len(), 7);
}

#[tokio::test]
async fn corrupt_and_foreign_rows_are_skipped_counted_and_passed() {
    let b = make_backend().await;
    let s = b.pg_store();
    s.append(vec![msg("before")]).await.expect("append");
    let good = msg("template");
    let raw = RawRow {
        id: good.id().0.to_vec(),
        position: Position::START,
        at: 0,
        relay: String::new(),
        room: good.room.clone(),
        thread: None,
        verb: "message.posted".into(),
        actor: good.actor.clone(),
        role: "human".into(),
        parent: None,
        caused_by: vec![],
        body: good.body_text(),
    };
    let broken = vec![
        RawRow {
            body: "{not json".into(),
            id: vec![1; 32],
            ..raw.clone()
        },
        RawRow {
            verb: "evil.verb".into(),
            id: vec![2; 32],
            ..raw.clone()
        },
        RawRow {
            role: "god".into(),
            id: vec![3; 32],
            ..raw.clone()
        },
        // Well-formed but its id is not its content's hash.
        RawRow {
            id: vec![4; 32],
            ..raw.clone()
        },
    ];
    for r in broken {
        b.insert_raw(r).await.expect("insert raw");
    }
    s.append(vec![msg("after")]).await.expect("append");
    let mut cursor = Position::START;
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    loop {
        let batch = s
            .read_forward(cursor, 2)
            .await
            .expect("read never fails on a row");
        if batch.rows.is_empty() && batch.skipped.is_empty() {
            break;
        }
        cursor = batch.next;
        rows.extend(batch.rows);
        skipped.extend(batch.skipped);
    }
    assert_eq!(rows.len(), 2);
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert_eq!(s.skipped_total(), 4);
    assert!(s.get(InteractionId([2; 32])).await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_exclusive_epoch_fenced_and_judged_by_the_database_clock() {
    let b = make_backend().await;
    let s = b.store();
    let ttl = Duration::from_secs(30);
    let mut joins = Vec::new();
    for i in 0..32 {
        let s = s.clone();
        joins.push(tokio::spawn(async move {
            s.acquire("task/lobby/t1", &format!("agent-{i}"), ttl).await
        }));
    }
    let mut winners = Vec::new();
    for j in joins {
        if let Acquired::Won(state) = j.await.expect("join").expect("acquire") {
            winners.push(state);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let first = winners.remove(0);
    assert_eq!(first.epoch, 1);
    // The same holder re-acquires (extends) at the same epoch; renew keeps it too.
    let again = s
        .acquire(&first.key, &first.holder, ttl)
        .await
        .expect("re-acquire");
    assert_eq!(again.state().epoch, 1);
    assert!(again.won());
    let renewed = s
        .renew(&first.key, &first.holder, 1, ttl)
        .await
        .expect("renew")
        .expect("still held");
    assert_eq!(renewed.epoch, 1);
    // Another holder is refused while it is live.
    let other = s
        .acquire(&first.key, "intruder", ttl)
        .await
        .expect("acquire");
    assert!(matches!(other, Acquired::HeldBy(ref st) if st.holder == first.holder));
    // A fenced append under the live claim works.
    let fence = Fence {
        key: first.key.clone(),
        holder: first.holder.clone(),
        epoch: 1,
    };
    s.append_fenced(&fence, vec![msg("under claim")])
        .await
        .expect("fenced append");
    // Release, then someone else takes it at a higher epoch; the old fence is refused.
    assert!(s
        .release(&first.key, &first.holder, 1)
        .await
        .expect("release"));
    assert!(!s
        .release(&first.key, &first.holder, 1)
        .await
        .expect("release twice"));
    let taken = s.acquire(&first.key, "bo", ttl).await.expect("acquire");
    assert!(taken.won());
    assert_eq!(taken.state().epoch, 2);
    let err = s
        .append_fenced(&fence, vec![msg("stale")])
        .await
        .expect_err("stale fence refused");
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert!(s
        .renew(&first.key, &first.holder, 1, ttl)
        .await
        .expect("renew")
        .is_none());
    // Expiry by the database clock: a short lease lapses and is re-taken, even by the
    // same holder, at a higher epoch.
    let short = s
        .acquire("lease/lobby/x", "bo", Duration::from_millis(50))
        .await
        .expect("acquire");
    assert_eq!(short.state().epoch, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.list_claims("lease/").await.expect("list")[0].live {
        assert!(Instant::now() < deadline, "lease never lapsed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = s
        .acquire("lease/lobby/x", "bo", Duration::from_secs(5))
        .await
        .expect("acquire");
    assert!(again.won());
    assert_eq!(again.state().epoch, 2, "re-taken after expiry: a new epoch");
    let listed = s.list_claims("task/").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state.holder, "bo");
    assert!(listed[0].live);
    assert_eq!(s.list_claims("").await.expect("list").len(), 2);
    let texts: Vec<String> = read_all(&*s)
        .await
        .iter()
        .map(|r| r.body["text"].to_string())
        .collect();
    assert_eq!(texts, vec!["\"under claim\""]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_store_is_woken_by_the_doorbell_not_the_poll() {
    let db = test_database().await;
    let slow_poll = StoreOptions {
        poll_interval: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let b = PgTestBackend::with_options(&db.url, slow_poll, PgOptions::default())
        .await
        .expect("connect")
        .holding(db);
    let reader = b.store();
    let writer = b.reopen("writer").await.expect("reopen");
    let ledger: Arc<dyn Ledger> = reader;
    let mut sub = Subscription::new(ledger, Position::START, 100);
    let mut seen = Vec::new();
    for i in 0..20 {
        let n = msg(&format!("ring {i}"));
        writer.append(vec![n.clone()]).await.expect("append");
        while !seen.contains(&n.id()) {
            let batch = tokio::time::timeout(Duration::from_secs(20), sub.next())
                .await
                .expect("woken well before the 60 s poll")
                .expect("read");
            seen.extend(batch.rows.iter().map(|r| r.id));
        }
    }
    assert_eq!(seen.len(), 20);
}

async fn raw_session(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("raw session");
    tokio::spawn(conn);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_transaction_in_another_database_does_not_hold_back_readers() {
    let b = make_backend().await;
    let other = test_database().await;
    let s = b.store();
    // A transaction with an xid, left open, in another database of the same cluster
    // (or server, with HUDDLE_TEST_DATABASE_URL).
    let elsewhere = raw_session(&other.url).await;
    elsewhere
        .batch_execute("BEGIN; CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .await
        .expect("open transaction elsewhere");
    let n = msg("not held back");
    s.append(vec![n.clone()]).await.expect("append");
    let batch = s.read_forward(Position::START, 10).await.expect("read");
    assert_eq!(
        batch.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![n.id()]
    );
    // The same open transaction in *this* database does hold readers back: it could
    // still write rows below the cursor.
    let here = raw_session(b.url()).await;
    here.batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .await
        .expect("open transaction here");
    let m = msg("held back");
    s.append(vec![m.clone()]).await.expect("append");
    let held = s.read_forward(batch.next, 10).await.expect("read");
    assert!(held.rows.is_empty(), "{:?}", held.rows);
    here.batch_execute("COMMIT").await.expect("commit");
    let after = s.read_forward(batch.next, 10).await.expect("read");
    assert_eq!(
        after.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![m.id()]
    );
    drop(elsewhere);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_held_back_by_a_claim_transaction_arrive_when_it_ends_without_the_poll() {
    let db = test_database().await;
    let slow_poll = StoreOptions {
        poll_interval: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let b = PgTestBackend::with_options(&db.url, slow_poll, PgOptions::default())
        .await
        .expect("connect")
        .holding(db);
    let ledger: Arc<dyn Ledger> = b.store();
    let writer = b.reopen("writer").await.expect("reopen");
    let mut sub = Subscription::new(ledger, Position::START, 100);
    // A claim upsert in flight (it has a transaction id, and sends no NOTIFY when it
    // ends): rows committed after it started are held back until it ends.
    let claimer = raw_session(b.url()).await;
    claimer
        .batch_execute(
            "BEGIN; INSERT INTO external_claim (key, holder, epoch, expires_at) \
             VALUES ('lease/lobby/slow', 'x', 1, now() + interval '1 minute')",
        )
        .await
        .expect("open claim transaction");
    let n = msg("behind the claim");
    writer.append(vec![n.clone()]).await.expect("append");
    let early = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(early.is_err(), "read a row behind a running transaction");
    claimer.batch_execute("COMMIT").await.expect("commit");
    let batch = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("the store re-rings while rows are held back; no 60 s poll")
        .expect("read");
    assert_eq!(
        batch.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![n.id()]
    );
}
