//! SQLite-specific behaviour the conformance suite does not reach: in-memory mode,
//! migrations, defensive decoding of wrong column types, the change watcher's life,
//! error mapping, and claim edge cases judged by the database clock.

use std::sync::Arc;
use std::time::Duration;

use huddle_core::{ModelError, NewInteraction, Position, Role, Verb};
use rusqlite::{params, Connection};
use serde_json::json;

use super::conn::{self, ConnKind};
use super::*;
use crate::conformance::TestBackend;
use crate::migrations::{self, Migration};

fn message(room: &str, text: &str) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({ "text": text }),
    )
}

async fn backend() -> SqliteTestBackend {
    SqliteTestBackend::new().await.expect("test backend")
}

fn raw(b: &SqliteTestBackend) -> Connection {
    conn::open_connection(b.path().to_str().expect("utf-8 path"), ConnKind::Writer)
        .expect("raw connection")
}

/// Waits (bounded) until the database clock is past `t`.
async fn wait_for_db_time(store: &SqliteStore, t: Timestamp) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.now().await.expect("now") <= t {
        assert!(
            tokio::time::Instant::now() < deadline,
            "database clock stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn in_memory_store_appends_reads_and_claims() {
    let store = crate::open("sqlite::memory:", StoreOptions::default())
        .await
        .expect("open in memory");
    assert_eq!(store.backend_name(), "sqlite");
    let a = message("lobby", "one");
    let b = message("side", "two");
    let out = store
        .append(vec![a.clone(), b.clone()])
        .await
        .expect("append");
    assert!(out.iter().all(|x| x.inserted));
    let batch = store.read_forward(Position::START, 10).await.expect("read");
    assert_eq!(batch.rows.len(), 2);
    assert_eq!(batch.rows[0].position, Position::new(0, 1));
    assert_eq!(batch.rows[1].position, Position::new(0, 2));
    assert_eq!(batch.rows[0].relay, "local");
    assert!(store
        .acquire("k", "h", Duration::from_secs(5))
        .await
        .expect("acquire")
        .won());
    // Two opens of :memory: are two private databases.
    let other = SqliteStore::open(":memory:", StoreOptions::default())
        .await
        .expect("open");
    assert!(other
        .read_forward(Position::START, 10)
        .await
        .expect("read")
        .rows
        .is_empty());
}

#[tokio::test]
async fn empty_path_is_a_configuration_error() {
    let err = SqliteStore::open("", StoreOptions::default())
        .await
        .err()
        .expect("empty path refused");
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}

#[tokio::test]
async fn read_room_returns_only_that_room_and_advances() {
    let b = backend().await;
    let s = b.sqlite();
    s.append(vec![
        message("a", "1"),
        message("b", "2"),
        message("a", "3"),
    ])
    .await
    .expect("append");
    let batch = s.read_room("a", Position::START, 10).await.expect("read");
    let texts: Vec<_> = batch.rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("1"), json!("3")]);
    assert_eq!(batch.next, Position::new(0, 3));
    let none = s.read_room("a", batch.next, 10).await.expect("read");
    assert!(none.rows.is_empty());
    assert_eq!(none.next, batch.next);
    let zero = s.read_forward(Position::START, 0).await.expect("read");
    assert!(zero.rows.is_empty());
    assert_eq!(zero.next, Position::START);
}

/// A read statement is prepared once: binding a new cursor or limit to it must not
/// make SQLite prepare it again (a bound `LIMIT ?` does, unless the connection keeps
/// one plan per statement), or every read of a relay re-parses its SQL.
#[tokio::test]
async fn read_statements_are_not_prepared_again_for_new_bindings() {
    use rusqlite::StatementStatus;
    let b = backend().await;
    let s = b.sqlite();
    for i in 0..5 {
        s.append(vec![
            message("a", &i.to_string()),
            message("b", &i.to_string()),
        ])
        .await
        .expect("append");
    }
    let rooms = ["a".to_string(), "b".to_string()];
    let mut at = Position::START;
    for limit in [1, 2, 3, 7, 1, 500] {
        let batch = s.read_rooms(&rooms, at, limit).await.expect("read rooms");
        assert!(!batch.rows.is_empty() || at == Position::new(0, 10));
        at = batch.next;
        s.read_room("a", Position::START, limit)
            .await
            .expect("read room");
        s.read_forward(Position::START, limit)
            .await
            .expect("read forward");
    }
    assert_eq!(at, Position::new(0, 10), "every row was read");
    let reprepared = s
        .inner
        .read(|conn| {
            let mut n = 0;
            for sql in [READ_ROOM, READ_FORWARD] {
                let stmt = conn.prepare_cached(sql)?;
                n += stmt.get_status(StatementStatus::RePrepare);
            }
            Ok(n)
        })
        .expect("statement status");
    assert_eq!(reprepared, 0, "read statements were prepared again");
}

#[tokio::test]
async fn rows_carry_the_relay_and_the_database_clock() {
    let b = backend().await;
    let s = b.sqlite();
    let before = s.now().await.expect("now");
    s.append(vec![message("r", "x")]).await.expect("append");
    let after = s.now().await.expect("now");
    let rows = s.read_forward(Position::START, 1).await.expect("read").rows;
    assert_eq!(rows[0].relay, "conformance");
    assert!(
        before <= rows[0].at && rows[0].at <= after,
        "{before} {} {after}",
        rows[0].at
    );
}

#[tokio::test]
async fn interactions_cannot_be_updated_or_deleted() {
    let b = backend().await;
    b.sqlite()
        .append(vec![message("r", "x")])
        .await
        .expect("append");
    let conn = raw(&b);
    let upd = conn.execute("UPDATE interaction SET room = 'other'", []);
    assert!(upd.is_err(), "UPDATE must be refused");
    let del = conn.execute("DELETE FROM interaction", []);
    assert!(del.is_err(), "DELETE must be refused");
    let n: i64 = conn
        .query_row("SELECT count(*) FROM interaction", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_opening_a_new_file_together_migrate_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("new.db");
    let path = path.to_str().expect("utf-8").to_string();
    let opens: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            tokio::spawn(async move {
                let options = StoreOptions {
                    relay: format!("r{i}"),
                    ..StoreOptions::default()
                };
                SqliteStore::open(&path, options).await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for o in opens {
        stores.push(o.await.expect("join").expect("concurrent open"));
    }
    let conn = Connection::open(&path).expect("open");
    let applied: Vec<(i64, String)> = conn
        .prepare("SELECT version, checksum FROM huddle_migration ORDER BY version")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows");
    let expected: Vec<_> = migrations::SQLITE
        .iter()
        .map(|m| (m.version, m.checksum()))
        .collect();
    assert_eq!(applied, expected);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn an_edited_or_unknown_migration_is_refused() {
    let b = backend().await;
    let mut conn = raw(&b);
    // Re-running the known list is a no-op.
    conn::migrate(&mut conn).expect("idempotent");
    let edited = [Migration {
        sql: "CREATE TABLE whatever (x INTEGER);",
        ..migrations::SQLITE[0]
    }];
    let err = conn::migrate_with(&mut conn, &edited).expect_err("edited migration");
    assert!(matches!(err, StoreError::Migration(_)), "{err}");
    assert!(err.to_string().contains("changed"), "{err}");
    // A database from a newer huddle: a version this build does not know.
    conn.execute(
        "INSERT INTO huddle_migration VALUES (99, 'future', 'x', 0)",
        [],
    )
    .expect("insert");
    let err = SqliteStore::open(b.path().to_str().expect("utf-8"), StoreOptions::default())
        .await
        .err()
        .expect("unknown migration");
    assert!(err.to_string().contains("upgrade huddle"), "{err}");
}

#[tokio::test]
async fn wrong_column_types_are_skipped_as_corrupt() {
    let b = backend().await;
    let s = b.sqlite();
    let good = message("r", "good");
    let id = good.id();
    let conn = raw(&b);
    conn.pragma_update(None, "ignore_check_constraints", true)
        .expect("pragma");
    let insert = |id: u8,
                  body: &dyn rusqlite::ToSql,
                  at: &dyn rusqlite::ToSql,
                  room: &dyn rusqlite::ToSql,
                  caused_by: &[u8]| {
        conn.execute(
            "INSERT INTO interaction (id, room, verb, actor, role, caused_by, body, at, relay) \
             VALUES (?1, ?2, 'message.posted', 'm', 'agent', ?3, ?4, ?5, 'x')",
            params![vec![id; 32], room, caused_by, body, at],
        )
        .expect("raw insert");
    };
    let body = good.body_text();
    // body stored as a BLOB
    insert(1, &body.as_bytes().to_vec(), &1_i64, &"r", &[]);
    // at stored as text
    insert(2, &body, &"soon", &"r", &[]);
    // room stored as a BLOB
    insert(3, &body, &1_i64, &vec![0xff_u8, 0xfe], &[]);
    // caused_by not a multiple of 32 bytes
    insert(4, &body, &1_i64, &"r", &[7; 33]);
    // text that is not UTF-8
    conn.execute(
        "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay) \
         VALUES (?1, CAST(X'FF00FF' AS TEXT), 'message.posted', 'm', 'agent', ?2, 1, 'x')",
        params![vec![5_u8; 32], body],
    )
    .expect("raw insert");
    s.append(vec![good]).await.expect("append");

    let batch = s.read_forward(Position::START, 100).await.expect("read");
    assert_eq!(batch.skipped.len(), 5, "{:?}", batch.skipped);
    assert_eq!(batch.rows.len(), 1);
    assert_eq!(batch.rows[0].id, id);
    assert_eq!(batch.next, Position::new(0, 6));
    assert!(
        batch.skipped[0].reason.contains("body"),
        "{:?}",
        batch.skipped[0]
    );
    assert!(
        batch.skipped[1].reason.contains("at"),
        "{:?}",
        batch.skipped[1]
    );
    assert!(
        batch.skipped[2].reason.contains("room"),
        "{:?}",
        batch.skipped[2]
    );
    assert!(
        batch.skipped[3].reason.contains("id"),
        "{:?}",
        batch.skipped[3]
    );
    assert!(
        batch.skipped[4].reason.contains("room"),
        "{:?}",
        batch.skipped[4]
    );
    assert_eq!(s.skipped_total(), 5);
    // Reading one row at a time still moves past each corrupt row.
    let mut cursor = Position::START;
    for _ in 0..5 {
        let step = s.read_forward(cursor, 1).await.expect("read");
        assert_eq!(step.skipped.len(), 1);
        assert!(step.next > cursor);
        cursor = step.next;
    }
    assert_eq!(s.skipped_total(), 10);
    // `get` of a corrupt row is "not found", never an error.
    let corrupt = huddle_core::InteractionId([1; 32]);
    assert!(s.get(corrupt).await.expect("get").is_none());
}

#[tokio::test]
async fn a_commit_by_another_connection_rings_the_doorbell() {
    let b = backend().await;
    let s = b.sqlite();
    let mut bell = s.doorbell();
    bell.borrow_and_update();
    // A different program writes: no local append could have rung the bell.
    let conn = raw(&b);
    conn.execute(
        "INSERT INTO external_claim (key, holder, epoch, expires_at, acquired_at, renewed_at) VALUES ('k', 'someone', 1, 0, 0, 0)",
        [],
    )
    .expect("foreign write");
    tokio::time::timeout(Duration::from_secs(5), bell.changed())
        .await
        .expect("the watcher rang within 5 s")
        .expect("bell open");
    // A local append rings it directly too.
    bell.borrow_and_update();
    s.append(vec![message("r", "x")]).await.expect("append");
    assert!(bell.has_changed().expect("bell open"));
}

/// Drains the events pending on `events` (the stores' own start-up opens the bell).
#[cfg(target_os = "linux")]
fn drain(events: &mut super::watcher::FileEvents) {
    while events.wait(Duration::ZERO) == Some(true) {}
}

/// Plan 0064: another store's append reaches this store's watcher as one event of the
/// bell file; a write that appends no row (a claim) raises none, so the pages SQLite
/// writes to its log wake nobody.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn another_stores_append_rings_the_bell_file_and_a_claim_does_not() {
    let b = backend().await;
    let bell = super::watcher::bell_path(b.path());
    assert!(bell.exists(), "opening a store creates its bell file");
    let mut events = super::watcher::FileEvents::watch(b.path()).expect("inotify");
    assert_eq!(events.bell(), Some(bell.as_path()), "the bell is watched");
    let other = b.reopen("other").await.expect("reopen");
    drain(&mut events);

    other
        .acquire("k", "someone", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert_eq!(
        events.wait(Duration::from_millis(300)),
        Some(false),
        "a commit that appends no row rings no bell"
    );
    other.append(vec![message("r", "x")]).await.expect("append");
    assert_eq!(events.wait(Duration::from_secs(5)), Some(true), "rung");
    assert_eq!(events.wait(Duration::ZERO), Some(false), "once per commit");
}

/// Plan 0064: a bell file deleted under a running watcher is created and watched
/// again, and the next append still reaches the watcher through it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_deleted_bell_file_is_created_and_watched_again() {
    let b = backend().await;
    let bell = super::watcher::bell_path(b.path());
    let mut events = super::watcher::FileEvents::watch(b.path()).expect("inotify");
    drain(&mut events);
    std::fs::remove_file(&bell).expect("delete the bell");
    assert_eq!(events.wait(Duration::from_secs(5)), Some(true));
    // (The store's own watcher may already have created it again: it sees the same
    // event.)
    drain(&mut events);
    assert!(bell.exists(), "the watcher created the bell file again");
    assert_eq!(events.bell(), Some(bell.as_path()));
    b.sqlite()
        .append(vec![message("r", "after")])
        .await
        .expect("append");
    assert_eq!(events.wait(Duration::from_secs(5)), Some(true), "rung");
}

#[tokio::test]
async fn the_watcher_thread_stops_when_the_store_is_dropped() {
    let b = backend().await;
    let store = SqliteStore::open(b.path().to_str().expect("utf-8"), StoreOptions::default())
        .await
        .expect("open");
    let alive = store.watcher_alive().expect("file stores have a watcher");
    assert!(alive.upgrade().is_some());
    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive.upgrade().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "watcher thread still running"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn busy_and_locked_map_to_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("busy.db");
    let path = path.to_str().expect("utf-8");
    let holder = conn::open_connection(path, ConnKind::Writer).expect("open");
    holder.execute_batch("BEGIN IMMEDIATE").expect("begin");
    let other = conn::open_connection(path, ConnKind::Writer).expect("open");
    other
        .busy_timeout(Duration::from_millis(20))
        .expect("timeout");
    let err = StoreError::from(other.execute_batch("BEGIN IMMEDIATE").expect_err("busy"));
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(err.is_retryable());
    let syntax = StoreError::from(other.execute_batch("SELEKT 1").expect_err("syntax"));
    assert!(matches!(syntax, StoreError::Backend(_)), "{syntax}");
    assert!(!syntax.is_retryable());
}

#[tokio::test]
async fn epochs_strictly_increase_across_handovers_and_expiry() {
    let b = backend().await;
    let s = b.sqlite();
    let short = Duration::from_millis(50);
    let mut last = Epoch(0);
    for round in 0..4 {
        // Alternate holders; every second round the former holder re-takes its own
        // expired claim, which must bump the epoch all the same.
        let holder = if round % 3 == 0 { "a" } else { "b" };
        let won = s.acquire("k", holder, short).await.expect("acquire");
        let Acquired::Won(state) = won else {
            panic!("round {round}: expired claim not re-taken: {won:?}")
        };
        assert!(
            state.epoch > last,
            "round {round}: {} <= {last}",
            state.epoch
        );
        last = state.epoch;
        // Same holder while unexpired: epoch kept.
        let again = s.acquire("k", holder, short).await.expect("acquire");
        if again.won() {
            assert_eq!(again.state().epoch, last);
            wait_for_db_time(&s, again.state().expires_at).await;
        } else {
            panic!("the holder lost its own live claim: {again:?}");
        }
        // Expired: cannot renew, cannot release, cannot write fenced.
        assert!(s
            .renew("k", holder, last, short)
            .await
            .expect("renew")
            .is_none());
        assert!(!s.release("k", holder, last).await.expect("release"));
        let fence = Fence {
            key: "k".into(),
            holder: holder.into(),
            epoch: last,
        };
        let err = s
            .append_fenced(&fence, vec![message("r", &format!("late {round}"))])
            .await
            .expect_err("fenced append on an expired claim");
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    }
    assert_eq!(last, Epoch(4));
    assert!(s
        .read_forward(Position::START, 10)
        .await
        .expect("read")
        .rows
        .is_empty());
    let listed = s.list_claims("k").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].live);
    assert_eq!(listed[0].state.epoch, Epoch(4));
}

#[tokio::test]
async fn an_invalid_fenced_batch_is_refused_before_the_fence_is_checked() {
    let b = backend().await;
    let s = b.sqlite();
    let fence = Fence {
        key: "nobody".into(),
        holder: "h".into(),
        epoch: Epoch(1),
    };
    let err = s
        .append_fenced(&fence, vec![message("a/b", "x")])
        .await
        .expect_err("invalid");
    assert!(
        matches!(err, StoreError::Invalid(ModelError::BadName { .. })),
        "{err}"
    );
    let limits = s.limits().clone();
    let big = Limits {
        max_batch: 2,
        ..limits
    };
    let small = SqliteTestBackend::with_options(StoreOptions {
        limits: big,
        ..StoreOptions::default()
    })
    .await
    .expect("backend");
    let err = small
        .sqlite()
        .append(vec![
            message("r", "1"),
            message("r", "2"),
            message("r", "3"),
        ])
        .await
        .expect_err("batch too large");
    assert!(
        matches!(err, StoreError::BatchTooLarge { got: 3, max: 2 }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_append_blocks_writers_until_it_commits_and_keeps_commit_order() {
    let b = backend().await;
    let s = b.sqlite();
    let held = b
        .hold_append(vec![message("r", "held")])
        .await
        .expect("hold");
    let writer = {
        let s = Arc::clone(&s);
        tokio::spawn(async move { s.append(vec![message("r", "waiting")]).await })
    };
    // The writer waits on the lock, so it cannot have written anything yet.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished(), "a writer got past a held write lock");
    assert!(s
        .read_forward(Position::START, 10)
        .await
        .expect("read")
        .rows
        .is_empty());
    held.commit().await.expect("commit");
    writer.await.expect("join").expect("append");
    let rows = s
        .read_forward(Position::START, 10)
        .await
        .expect("read")
        .rows;
    let texts: Vec<_> = rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("held"), json!("waiting")]);
}

/// The length of the log of the backend's database, in frames (a page and its header).
fn log_frames(b: &SqliteTestBackend) -> u64 {
    let page: i64 = raw(b)
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page size");
    let page = u64::try_from(page).expect("a page size");
    let mut wal = b.path().as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(std::path::PathBuf::from(wal))
        .map(|m| m.len() / (page + 24))
        .unwrap_or(0)
}

/// Batch `i` of 100 messages of 3 kB by `actor`, numbered from `i * 100`.
fn large_batch(actor: &str, i: u64) -> Vec<NewInteraction> {
    let filler = "x".repeat(3000);
    (0..100)
        .map(|j| {
            NewInteraction::new(
                "r",
                Verb::MessagePosted,
                actor,
                Role::Agent,
                json!({ "text": filler, "n": i * 100 + j }),
            )
        })
        .collect()
}

/// Reads the whole ledger forward; every row's id.
async fn all_ids(s: &dyn Ledger) -> Vec<huddle_core::InteractionId> {
    let mut cursor = Position::START;
    let mut ids = Vec::new();
    loop {
        let step = s.read_forward(cursor, 1000).await.expect("read");
        if step.rows.is_empty() {
            return ids;
        }
        ids.extend(step.rows.iter().map(|r| r.id));
        cursor = step.next;
    }
}

/// Plan 0077: the checkpointer copies the log beside the writer, which never waits
/// for it; under appends that never pause (four appenders, each sending its next batch
/// as soon as the last is answered) the checkpointer cannot finish between two
/// commits, and the writer's own checkpoint past 4,000 frames is what lets the log
/// restart. The log stays bounded (it would pass 15,000 frames otherwise) and every
/// row reads back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_writes_keeps_the_log_bounded() {
    let b = backend().await;
    let s: Arc<dyn Ledger> = b.sqlite();
    let appenders: Vec<_> = (0..4)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    s.append(large_batch(&format!("w{w}"), i))
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    // Samples the log's length for as long as the appenders run.
    let mut largest = log_frames(&b);
    while appenders.iter().any(|a| !a.is_finished()) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        largest = largest.max(log_frames(&b));
    }
    for a in appenders {
        a.await.expect("appender");
    }
    assert!(
        largest > 3_000,
        "the appends filled the log towards the writer's threshold: {largest} frames"
    );
    assert!(
        largest < 6_000,
        "the log restarted under a steady stream of writes: at most {largest} frames"
    );
    let ids = all_ids(s.as_ref()).await;
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "a row read twice");
    assert_eq!(ids.len(), 20_000);
}

/// Plan 0068: the log is checkpointed outside the writer's commits (SQLite's automatic
/// checkpoint inside `COMMIT` is replaced on its connection; plan 0077: by a
/// checkpointer thread beside the writer). A
/// store whose appends write many thousand log frames keeps its log bounded, and
/// every row reads back.
#[tokio::test]
async fn the_writer_checkpoints_the_log_and_keeps_it_bounded() {
    let b = backend().await;
    let s = b.sqlite();
    let mut frames = 0u64;
    // About 12,000 frames in all: 150 commits of 100 rows of 3 kB.
    for i in 0..150 {
        s.append(large_batch("ana", i)).await.expect("append");
        frames = frames.max(log_frames(&b));
    }
    assert!(
        frames > 900,
        "the appends filled the log to its threshold: {frames} frames"
    );
    assert!(
        frames < 4_500,
        "the log was checkpointed and reused: at most {frames} frames"
    );
    assert_eq!(all_ids(s.as_ref()).await.len(), 15_000);
}
