//! The Postgres backend against the store's written behaviour (the conformance
//! suite), plus what only Postgres has: migrations under the advisory lock, the batch
//! statement's duplicate resolution, the cluster-wide transaction horizon, the
//! self-ringing bell for held-back rows. (The suite's cross-process test runs here
//! too.)
//!
//! Needs PostgreSQL: `initdb`/`pg_ctl` on the machine or `HUDDLE_TEST_DATABASE_URL`
//! (see huddle-testkit). Without either these tests fail, loudly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::{InteractionId, NewInteraction, Position, RawRow, Role, Timestamp, Verb};
use huddle_store::conformance::{settled, TestBackend};
use huddle_store::postgres::{PgOptions, PgStore, PgTestBackend};
use huddle_store::{Ledger, StoreError, StoreOptions, Subscription};
use huddle_testkit::{test_database, test_database_collated};
use serde_json::json;

async fn make_backend() -> PgTestBackend {
    let db = test_database().await;
    PgTestBackend::new(&db.url)
        .await
        .expect("connect to the test database")
        .holding(db)
}

huddle_store::conformance_tests!(make_backend, across_processes);

/// Claim keys sort byte by byte whatever the database's default collation (migration
/// 0015): on a database that sorts text as English does (`a` before `B`, punctuation
/// weighed differently), a prefix is still exactly a range of keys and the listing is
/// still in byte order.
#[tokio::test]
async fn claims_are_listed_by_prefix_on_a_database_with_a_locale_collation() {
    let db = test_database_collated("en").await;
    let backend = PgTestBackend::new(&db.url)
        .await
        .expect("connect to the test database")
        .holding(db);
    huddle_store::conformance::claims_are_listed_by_prefix(&backend).await;
}

/// A human message in `room`.
fn in_room(room: &str, text: &str) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({ "text": text }),
    )
}

fn msg(text: &str) -> NewInteraction {
    in_room("lobby", text)
}

/// Every row, once the test's own writes are all readable (rows held back are read
/// again: [`settled`]).
async fn read_all(ledger: &dyn Ledger) -> Vec<huddle_core::Interaction> {
    let mut out = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = settled(|| ledger.read_forward(cursor, 7)).await;
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
async fn parents_and_several_causes_round_trip_through_the_batch_statement() {
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
    assert!(got.at > Timestamp(0));
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

#[tokio::test]
async fn skipped_rows_are_counted_and_not_returned_by_get() {
    let b = make_backend().await;
    let s = b.pg_store();
    let forged = RawRow {
        id: vec![9; 32],
        position: Position::START,
        at: Timestamp(0),
        relay: String::new(),
        room: "lobby".into(),
        thread: None,
        verb: "message.posted".into(),
        actor: "mallory".into(),
        role: "agent".into(),
        parent: None,
        caused_by: vec![vec![1; 32]],
        body: r#"{"text":"forged"}"#.into(),
        sig: None,
    };
    b.insert_raw(forged).await.expect("insert raw");
    let batch = s.read_forward(Position::START, 10).await.expect("read");
    assert!(batch.rows.is_empty());
    assert_eq!(batch.skipped.len(), 1);
    assert_eq!(
        batch.next, batch.skipped[0].position,
        "the cursor moves past it"
    );
    assert_eq!(s.skipped_total(), 1);
    assert!(s.get(InteractionId([9; 32])).await.expect("get").is_none());
    assert_eq!(s.skipped_total(), 2, "every sighting counts");
}

#[tokio::test]
async fn read_room_returns_only_that_room_on_its_index() {
    let b = make_backend().await;
    let s = b.store();
    s.append(vec![
        in_room("a", "1"),
        in_room("b", "2"),
        in_room("a", "3"),
    ])
    .await
    .expect("append");
    s.append(vec![in_room("b", "4")]).await.expect("append");
    let batch = s.read_room("a", Position::START, 10).await.expect("read");
    let texts: Vec<_> = batch.rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("1"), json!("3")]);
    assert_eq!(batch.next, batch.rows[1].position);
    let none = s.read_room("a", batch.next, 10).await.expect("read");
    assert!(none.rows.is_empty());
    assert_eq!(none.next, batch.next);
    let one = s.read_room("b", Position::START, 1).await.expect("read");
    assert_eq!(one.rows.len(), 1);
    let rest = s.read_room("b", one.next, 10).await.expect("read");
    assert_eq!(rest.rows[0].body["text"], json!("4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_store_closes_its_listen_and_notify_sessions() {
    let db = test_database().await;
    let store = PgStore::connect(&db.url, StoreOptions::default())
        .await
        .expect("connect");
    store.append(vec![msg("ring once")]).await.expect("append");
    store.flush_doorbell().await;
    let admin = raw_session(&db.url).await;
    let count = || async {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name IN ('huddle-listen', 'huddle-notify')",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        n
    };
    assert!(store.wait_listening(Duration::from_secs(20)).await);
    assert_eq!(count().await, 2, "one LISTEN and one NOTIFY session");
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(20);
    while count().await > 0 {
        assert!(
            Instant::now() < deadline,
            "background sessions outlived the store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store opened with `PgOptions::listen` off (the bench's observer) opens no LISTEN
/// session and its doorbell never rings; it still reads what others append, on its
/// poll, and its own appends still wake a store that listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_listen_reads_on_its_poll_and_still_rings_others() {
    let db = test_database().await;
    let quiet = Arc::new(
        PgStore::connect_with(
            &db.url,
            StoreOptions {
                poll_interval: Duration::from_millis(50),
                ..StoreOptions::default()
            },
            PgOptions {
                application_name: "huddle-quiet".into(),
                listen: false,
                ..PgOptions::default()
            },
        )
        .await
        .expect("connect quietly"),
    );
    let loud = PgStore::connect(&db.url, StoreOptions::default())
        .await
        .expect("connect");
    assert!(loud.wait_listening(Duration::from_secs(20)).await);
    assert!(
        !quiet.wait_listening(Duration::from_millis(200)).await,
        "a store that does not listen never reports listening"
    );
    let admin = raw_session(&db.url).await;
    let listeners: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'huddle-listen'",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    assert_eq!(
        listeners, 1,
        "only the listening store has a LISTEN session"
    );

    // The listening store's append: the quiet store's bell stays silent, and its
    // subscription finds the row on its poll.
    let quiet_bell = quiet.doorbell();
    loud.append(vec![msg("from the loud store")])
        .await
        .expect("append");
    loud.flush_doorbell().await;
    let mut sub = Subscription::new(quiet.clone(), Position::START, 100);
    let batch = tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("the quiet store reads on its poll")
        .expect("read");
    assert_eq!(batch.rows[0].body["text"], json!("from the loud store"));
    assert!(
        !quiet_bell.has_changed().unwrap_or(true),
        "nothing rang the quiet store's doorbell"
    );

    // The quiet store's append rings the listening store's doorbell.
    let mut loud_bell = loud.doorbell();
    loud_bell.borrow_and_update();
    quiet
        .append(vec![msg("from the quiet store")])
        .await
        .expect("append");
    tokio::time::timeout(Duration::from_secs(20), loud_bell.changed())
        .await
        .expect("the quiet store's append rang the listening store")
        .expect("bell open");
}

/// The SQL overlap of migration 0007 decides exactly as huddle-core's: thousands of
/// generated glob pairs (over a small alphabet, so that they often meet), each asked
/// of both, agree.
#[tokio::test]
async fn sql_glob_overlap_agrees_with_the_core() {
    use huddle_core::glob::Glob;
    let b = make_backend().await;
    let (client, conn) = tokio_postgres::connect(b.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    // xorshift: deterministic, no dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut glob = || {
        let segs = 1 + next(3);
        let parts: Vec<String> = (0..segs)
            .map(|_| match next(4) {
                0 => "**".to_string(),
                _ => (0..1 + next(3))
                    .map(|_| ["a", "b", "?", "*", "é"][next(5) as usize])
                    .collect(),
            })
            .collect();
        Glob::parse(&parts.join("/")).expect("generated globs are valid")
    };
    let pairs: Vec<(Glob, Glob)> = (0..3000).map(|_| (glob(), glob())).collect();
    let left: Vec<String> = pairs.iter().map(|p| p.0.as_str().to_string()).collect();
    let right: Vec<String> = pairs.iter().map(|p| p.1.as_str().to_string()).collect();
    let rows = client
        .query(
            "SELECT huddle_glob_overlap(l, r) FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(l, r, o) ORDER BY o",
            &[&left, &right],
        )
        .await
        .expect("ask the database");
    let mut overlapping = 0;
    for ((a, b), row) in pairs.iter().zip(&rows) {
        let sql: bool = row.get(0);
        assert_eq!(sql, a.overlaps(b), "{a} vs {b}");
        overlapping += usize::from(sql);
    }
    assert!(
        overlapping > 300 && overlapping < 2700,
        "a mix: {overlapping} of 3000 overlap"
    );
    // And resource names: kinds, equal names, file globs.
    let touches = |a: &str, b: &str| {
        let client = &client;
        let (a, b) = (a.to_string(), b.to_string());
        async move {
            let row = client
                .query_one("SELECT huddle_resource_touches($1, $2)", &[&a, &b])
                .await
                .expect("touches");
            row.get::<_, bool>(0)
        }
    };
    assert!(touches("file:src/**", "file:src/a.rs").await);
    assert!(!touches("file:src/**", "api:src/a.rs").await);
    assert!(!touches("api:a*", "api:ab").await);
    assert!(touches("api:ab", "api:ab").await);
}

#[tokio::test]
async fn pooled_sessions_plan_each_statement_once_unless_the_url_says_otherwise() {
    let db = test_database().await;
    let one_session = StoreOptions {
        pool_size: 1,
        ..StoreOptions::default()
    };
    let s = PgStore::connect_with(&db.url, one_session.clone(), PgOptions::default())
        .await
        .expect("connect");
    let rooms = vec!["a".to_string(), "b".to_string()];
    let mut cursor = Position::START;
    for i in 0..12 {
        s.append(vec![
            in_room("a", &format!("a{i}")),
            in_room("b", &format!("b{i}")),
        ])
        .await
        .expect("append");
        // A transaction of another test that ended a moment ago can still hold the
        // read horizon back for one read (it counts as this database's until it is
        // gone from `pg_stat_activity`): read on until both rows are in, bounded.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < 2 {
            let batch = s.read_rooms(&rooms, cursor, 100).await.expect("read");
            got += batch.rows.len();
            cursor = batch.next;
            assert!(Instant::now() < deadline, "round {i}: {got} of 2 rows read");
            if got < 2 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        assert_eq!(got, 2, "round {i}");
    }
    let (mode, plans) = s.session_plans().await.expect("plans");
    assert_eq!(mode, "force_generic_plan");
    // The multi-room read: under `auto` its value-specific plan always looks cheaper
    // (the array's length is known), so it was planned again at every call.
    let read = plans
        .iter()
        .find(|(sql, _, _)| sql.contains("unnest($4::text[])"))
        .unwrap_or_else(|| panic!("the multi-room read is prepared: {plans:?}"));
    assert_eq!(read.2, 0, "custom plans of the read: {read:?}");
    assert!(read.1 >= 12, "generic plans of the read: {read:?}");
    assert!(plans.iter().all(|(_, _, custom)| *custom == 0), "{plans:?}");
    drop(s);

    // A URL that sets its own mode keeps it.
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20plan_cache_mode%3Dauto", db.url);
    let s = PgStore::connect_with(&url, one_session, PgOptions::default())
        .await
        .expect("connect with the URL's own plan_cache_mode");
    let (mode, _) = s.session_plans().await.expect("plans");
    assert_eq!(mode, "auto");
}

/// Postgres's `huddle_claim_room` (what archiving and `prune-claims` go by) files
/// every claim kind under the room `room_of_claim` gives, and no other: the two
/// lists of room-scoped kinds agree (migration 0017 added `cmdresult`).
#[tokio::test]
async fn the_database_knows_the_room_of_every_room_scoped_claim_kind() {
    let db = test_database().await;
    let _store = PgStore::connect(&db.url, StoreOptions::default())
        .await
        .expect("connect");
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let mut keys: Vec<String> = huddle_core::protocol::ROOM_CLAIM_KINDS
        .iter()
        .map(|kind| format!("{kind}/lobby/x"))
        .collect();
    keys.extend([
        "relay/lobby".into(),
        "other/lobby/x".into(),
        "task//x".into(),
    ]);
    keys.push(huddle_core::protocol::command_result_key(
        "lobby",
        &InteractionId([7; 32]),
    ));
    for key in &keys {
        let room: Option<String> = client
            .query_one("SELECT huddle_claim_room($1)", &[key])
            .await
            .expect("huddle_claim_room")
            .get(0);
        assert_eq!(
            room.as_deref(),
            huddle_core::protocol::room_of_claim(key),
            "the room of {key}"
        );
    }
}
