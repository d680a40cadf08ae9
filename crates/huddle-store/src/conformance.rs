//! The conformance suite: one written behaviour that every backend runs (feature
//! `testing`).
//!
//! A backend's test file implements [`TestBackend`] and invokes
//! [`conformance_tests!`](crate::conformance_tests) with an async constructor; every
//! function below becomes one `#[tokio::test]`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{Interaction, NewInteraction, Position, RawRow, Role, Timestamp, Verb};
use serde_json::json;
use tokio::sync::Barrier;

use crate::error::{Result, StoreError};
use crate::subscribe::Subscription;
use crate::traits::{Acquired, ClaimRequest, ClaimRow, Epoch, Fence, Store};
use crate::StoreOptions;

#[path = "conformance_lots.rs"]
pub mod lots;
#[path = "conformance_resources.rs"]
pub mod resources;
#[path = "conformance_rooms.rs"]
pub mod rooms;

/// An append transaction that has inserted its rows (they hold their sequence
/// numbers) but has not committed yet.
#[async_trait]
pub trait HeldAppend: Send {
    /// Commits the held transaction.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// How a backend's writers relate while one of them holds a transaction open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// One writer at a time: a second writer waits until the held transaction commits
    /// (SQLite's `BEGIN IMMEDIATE`, the in-memory store's writer gate).
    Serialized,
    /// Writers run side by side: a second writer commits while the first, which took
    /// the lower sequence number, is still open (Postgres).
    Concurrent,
}

/// What the suite needs from a backend beyond the [`Store`] traits.
#[async_trait]
pub trait TestBackend: Send + Sync + 'static {
    /// The store under test (a fresh, migrated, empty database).
    fn store(&self) -> Arc<dyn Store>;
    /// Another independent handle on the same database, as a second relay would open.
    /// Its fallback poll must be long (30 s or more), so that a prompt wake-up in the
    /// suite proves the doorbell rather than the poll, and its doorbell must be live
    /// when this returns: whatever any handle or process commits afterwards rings it.
    async fn reopen(&self, relay: &str) -> Result<Arc<dyn Store>>;
    /// [`TestBackend::reopen`] with a store that signs every row it appends with
    /// `signer`.
    async fn reopen_signing(
        &self,
        relay: &str,
        signer: huddle_core::keys::WriterSecret,
    ) -> Result<Arc<dyn Store>>;
    /// Whether a second writer waits for a held append or commits beside it.
    fn writers(&self) -> Writers;
    /// A URL another process can open with [`crate::open`], or `None` when the
    /// database lives in this process only.
    fn url(&self) -> Option<String>;
    /// What the `relay` column of a row holds when a store opened with
    /// `StoreOptions::relay = relay` wrote it (Postgres records the database role).
    fn recorded_relay(&self, relay: &str) -> String;
    /// Starts an append transaction, inserts `batch` and returns without committing.
    async fn hold_append(&self, batch: Vec<NewInteraction>) -> Result<Box<dyn HeldAppend>>;
    /// Inserts a row bypassing every check, as a foreign or broken writer would. Only
    /// the content columns of `row` and its `sig` are used; the database assigns the
    /// rest (`relay` is this store's writer).
    async fn insert_raw(&self, row: RawRow) -> Result<()>;
}

/// Invokes every conformance test for a backend. `$make` is an async fn returning a
/// [`TestBackend`] over a fresh database. With `across_processes` (backends whose
/// database another process can open, see [`TestBackend::url`]) the suite also runs
/// [`a_commit_in_another_process_wakes_a_subscriber`].
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@each $make;
            append_and_read_back,
            identical_content_is_one_row,
            identical_content_from_concurrent_writers_is_one_row,
            idempotency_key_returns_first_id,
            oversized_and_invalid_batches_write_nothing,
            hostile_names_round_trip,
            no_gaps_when_a_lower_sequence_commits_last,
            concurrent_writers_and_readers_see_every_row_once_in_one_order,
            corrupt_rows_are_skipped_and_never_block_the_cursor,
            signed_rows_are_verified_on_read,
            claim_has_exactly_one_winner_among_32,
            same_holder_renews_without_new_epoch,
            a_live_claim_is_kept_only_for_its_driver,
            other_holder_wins_only_after_expiry,
            release_then_reacquire_bumps_epoch,
            fenced_append_refused_after_handover,
            fenced_append_racing_a_takeover_lands_only_under_a_live_epoch,
            subscription_wakes_on_append_from_another_handle,
            claims_are_listed_by_prefix,
            a_closed_claim_is_never_acquired_again,
            an_append_under_two_claims_needs_both,
            a_retried_closing_append_is_idempotent,
            a_closing_append_under_many_fences_closes_all_or_none,
            a_batch_acquire_answers_each_claim_as_acquire_would,
            a_batch_acquire_out_of_order_takes_nothing,
            a_handoff_writes_its_rows_only_at_the_epochs_expected,
            a_write_then_hand_off_writes_first_or_does_nothing,
            concurrent_batch_acquires_have_one_winner_per_claim,
            a_duplicate_under_a_lost_fence_is_refused,
            a_refreshed_reader_reports_a_read_that_began_after_the_request,
        );
        $crate::conformance_tests!(@each $make; resources::
            resources_exclusive_and_shared_by_glob_overlap,
            resources_permits_never_exceed_their_count,
            resources_are_taken_all_or_nothing,
            resources_lapse_by_the_database_clock,
            resources_retaken_keep_the_epoch_and_change_mode,
            resources_have_one_exclusive_winner_among_16,
            resources_bad_requests_are_refused,
            state_versions_are_decided_by_the_database,
        );
        $crate::conformance_tests!(@each $make; rooms::
            read_rooms_reads_only_those_rooms_in_order,
            read_rooms_never_skips_a_lower_sequence_that_commits_last,
            archive_removes_a_room_and_leaves_its_row,
            archive_refuses_a_changed_room_or_live_claims,
            prune_removes_only_what_can_never_matter,
        );
        $crate::conformance_tests!(@each $make; lots::
            a_lot_reads_as_its_items_in_its_place,
            a_lot_of_task_rows_carrying_their_turns_reads_back_whole,
            a_lot_is_refused_whole_when_one_item_is_not_under_its_claim,
            a_corrupt_lot_is_skipped_whole,
        );
    };
    ($make:path, across_processes) => {
        $crate::conformance_tests!($make);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_commit_in_another_process_wakes_a_subscriber() {
            if $crate::conformance::child_role().await {
                return;
            }
            let backend = $make().await;
            $crate::conformance::a_commit_in_another_process_wakes_a_subscriber(&backend).await;
        }
    };
    (@each $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let backend = $make().await;
                $crate::conformance::$name(&backend).await;
            }
        )*
    };
    (@each $make:path; $module:ident:: $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let backend = $make().await;
                $crate::conformance::$module::$name(&backend).await;
            }
        )*
    };
}

fn message(room: &str, actor: &str, text: &str) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::MessagePosted,
        actor,
        Role::Human,
        json!({ "text": text }),
    )
}

/// Reads everything after `after` (following `next` until nothing is left).
async fn read_all(store: &dyn Store, after: Position) -> (Vec<Interaction>, usize, Position) {
    let mut rows = Vec::new();
    let mut skipped = 0;
    let mut cursor = after;
    loop {
        let batch = settled(|| store.read_forward(cursor, 50)).await;
        assert!(batch.next >= cursor, "cursor went backwards");
        let done = batch.rows.is_empty() && batch.skipped.is_empty();
        skipped += batch.skipped.len();
        rows.extend(batch.rows);
        cursor = batch.next;
        if done {
            return (rows, skipped, cursor);
        }
    }
}

/// A read that waits out rows held back: committed past the cursor behind a
/// transaction the store cannot yet place, on Postgres one still open (or just ended)
/// elsewhere on the server ([`crate::ReadBatch::held_back`]). A reader is woken again
/// for them; a test reading its own writes reads again, for up to 10 s.
pub async fn settled<F, Fut>(read: F) -> crate::ReadBatch
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<crate::ReadBatch>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let batch = read().await.expect("read");
        if !batch.held_back {
            return batch;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows held back for 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the database clock is past `t`.
async fn wait_for_db_time(store: &dyn Store, t: Timestamp) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.now().await.expect("now") <= t {
        assert!(
            tokio::time::Instant::now() < deadline,
            "database clock stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Busy-waits until `t`. The racing tasks of the suite start this way rather than on a
/// timer or a barrier: a timer rounds a few microseconds up to a millisecond, and a
/// barrier wakes its waiters a scheduling delay after the last arrival, either longer
/// than many operations take, so the tasks would run one after the other instead of
/// side by side. (The suite's runtime has worker threads to spare.)
fn spin_until(t: std::time::Instant) {
    while std::time::Instant::now() < t {
        std::hint::spin_loop();
    }
}

/// Appended rows come back verified, in order, with every field intact.
pub async fn append_and_read_back(b: &impl TestBackend) {
    let s = b.store();
    let first = message("lobby", "ana", "hello");
    let second = message("lobby", "bo", "hi ana")
        .in_thread("t1")
        .with_parent(first.id())
        .with_caused_by(vec![first.id()]);
    let out = s
        .append(vec![first.clone(), second.clone()])
        .await
        .expect("append");
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|a| a.inserted));
    assert_eq!(out[0].id, first.id());
    assert_eq!(out[1].id, second.id());

    let (rows, skipped, cursor) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 0);
    assert_eq!(rows.len(), 2);
    assert!(rows[0].position < rows[1].position);
    assert_eq!(rows[0].content(), first);
    assert_eq!(rows[1].content(), second);
    assert_eq!(rows[1].thread.as_deref(), Some("t1"));
    assert!(
        rows[0].at > Timestamp(0),
        "at comes from the database clock"
    );
    assert!(!rows[0].relay.is_empty());
    // The writer a store names (what agent bindings are checked against before
    // writing) is what its rows record.
    assert_eq!(s.writer().as_deref(), Some(rows[0].relay.as_str()));
    assert_eq!(cursor, rows[1].position);

    // Nothing new after the cursor.
    let again = settled(|| s.read_forward(cursor, 10)).await;
    assert!(again.rows.is_empty() && again.skipped.is_empty());
    assert_eq!(again.next, cursor);

    // Reading from the middle returns only the tail.
    let tail = settled(|| s.read_forward(rows[0].position, 10)).await;
    assert_eq!(tail.rows.len(), 1);
    assert_eq!(tail.rows[0].id, second.id());

    assert_eq!(
        s.get(second.id()).await.expect("get").map(|r| r.id),
        Some(second.id())
    );

    // A batch of one with every optional field (backends may write it another way).
    let third = message("lobby", "cy", "all fields")
        .in_thread("t2")
        .with_parent(second.id())
        .with_caused_by(vec![first.id(), second.id()])
        .with_idempotency_key("third");
    let out = s.append(vec![third.clone()]).await.expect("append one");
    assert_eq!(out[0].id, third.id());
    let tail = settled(|| s.read_forward(cursor, 10)).await;
    assert_eq!(tail.rows.len(), 1);
    let mut expected = third.clone();
    expected.idempotency_key = None; // not part of the content
    assert_eq!(tail.rows[0].content(), expected);
    assert!(s
        .get(message("x", "y", "z").id())
        .await
        .expect("get")
        .is_none());
}

/// Appending identical content again (alone or in the same batch) is a no-op that
/// returns the existing id.
pub async fn identical_content_is_one_row(b: &impl TestBackend) {
    let s = b.store();
    let m = message("lobby", "ana", "same");
    let a = s.append(vec![m.clone()]).await.expect("append");
    let again = s.append(vec![m.clone()]).await.expect("append");
    assert!(a[0].inserted);
    assert!(!again[0].inserted);
    assert_eq!(a[0].id, again[0].id);
    let other = message("lobby", "ana", "different");
    let batch = s
        .append(vec![other.clone(), other.clone(), m.clone()])
        .await
        .expect("append");
    assert_eq!(batch.len(), 3);
    assert!(batch[0].inserted);
    assert!(!batch[1].inserted);
    assert!(!batch[2].inserted);
    assert_eq!(batch[1].id, other.id());
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(rows.len(), 2);
}

/// Writers on several handles appending the same content at the same moment all get
/// its id; exactly one of them inserted it, and the ledger holds it once.
pub async fn identical_content_from_concurrent_writers_is_one_row(b: &impl TestBackend) {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 5;
    let mut stores = Vec::new();
    for w in 0..WRITERS {
        stores.push(if w % 2 == 0 {
            b.store()
        } else {
            b.reopen(&format!("twin-{w}")).await.expect("reopen")
        });
    }
    let mut expected = Vec::new();
    for round in 0..ROUNDS {
        let m = message("r", "twin", &format!("the same words, round {round}"));
        let start = Arc::new(Barrier::new(WRITERS));
        let tasks: Vec<_> = stores
            .iter()
            .map(|store| {
                let (store, start, m) = (store.clone(), start.clone(), m.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    store.append(vec![m]).await.expect("append")
                })
            })
            .collect();
        let mut inserted = 0;
        for t in tasks {
            let out = t.await.expect("join");
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].id, m.id(), "every writer gets the content's id");
            inserted += usize::from(out[0].inserted);
        }
        assert_eq!(inserted, 1, "round {round}: {inserted} writers inserted");
        expected.push(m.id());
    }
    let (rows, _, _) = read_all(&*b.store(), Position::START).await;
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), expected);
}

/// A second append with the same idempotency key returns the first row's id.
pub async fn idempotency_key_returns_first_id(b: &impl TestBackend) {
    let s = b.store();
    let one = message("lobby", "ana", "one").with_idempotency_key("req-7");
    let two = message("lobby", "ana", "two").with_idempotency_key("req-7");
    let a = s.append(vec![one.clone()]).await.expect("append");
    let c = s.append(vec![two]).await.expect("append");
    assert!(a[0].inserted);
    assert!(!c[0].inserted);
    assert_eq!(c[0].id, one.id());
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].body["text"], "one");
}

/// An oversized body, a bad name or an oversized batch refuses the whole batch with a
/// clear error and writes nothing.
pub async fn oversized_and_invalid_batches_write_nothing(b: &impl TestBackend) {
    let s = b.store();
    let max = s.limits().max_body_bytes;
    let big = message("lobby", "ana", &"x".repeat(max + 1));
    let ok = message("lobby", "ana", "fine");
    let err = s
        .append(vec![ok.clone(), big])
        .await
        .expect_err("oversized body must be refused");
    assert!(
        matches!(
            err,
            StoreError::Invalid(huddle_core::ModelError::BodyTooLarge { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("limit"), "{err}");

    let bad_name = message("a/b", "ana", "x");
    assert!(matches!(
        s.append(vec![ok.clone(), bad_name]).await,
        Err(StoreError::Invalid(_))
    ));

    let too_many: Vec<_> = (0..s.limits().max_batch + 1)
        .map(|i| message("lobby", "ana", &i.to_string()))
        .collect();
    assert!(matches!(
        s.append(too_many).await,
        Err(StoreError::BatchTooLarge { .. })
    ));

    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert!(rows.is_empty(), "a refused batch wrote {} rows", rows.len());
    // A body right at the limit is accepted.
    let overhead = message("lobby", "ana", "").body_text().len();
    let exact = message("lobby", "ana", &"y".repeat(max - overhead));
    assert_eq!(exact.body_text().len(), max);
    s.append(vec![exact]).await.expect("a body at the limit");
}

/// Names with quotes, semicolons and unicode are stored and read back faithfully;
/// a 10 KB name is refused with a clear error.
pub async fn hostile_names_round_trip(b: &impl TestBackend) {
    let s = b.store();
    let names = [
        "robert'); DROP TABLE interaction; --",
        "\"quoted\" room",
        "ünïcödé 部屋 🚀",
        "semi;colon",
        "back\\slash %_ like",
    ];
    for name in names {
        let m = message(name, name, &format!("from {name}")).in_thread(name);
        s.append(vec![m]).await.expect("hostile but valid name");
    }
    let (rows, skipped, _) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 0);
    let got: Vec<_> = rows.iter().map(|r| r.room.as_str()).collect();
    assert_eq!(got, names.to_vec());
    for r in &rows {
        assert_eq!(r.actor, r.room);
        assert_eq!(r.thread.as_deref(), Some(r.room.as_str()));
    }
    let huge = "x".repeat(10 * 1024);
    let err = s
        .append(vec![message(&huge, "ana", "x")])
        .await
        .expect_err("10 KB room name");
    assert!(err.to_string().contains("room"), "{err}");
}

/// A transaction that took a lower sequence number but commits last is never
/// skipped: readers see every row exactly once, in one order.
///
/// The held append takes the lower position. On a backend whose writers run side by
/// side, the second writer commits while the held one is still open (the out-of-order
/// commit this is about, forced, not left to timing); on one that serializes writers,
/// the second writer waits. Either way a read in between returns nothing — a row
/// behind an open transaction must not move the cursor past that transaction's row —
/// and after the held commit both rows come back once, held row first.
pub async fn no_gaps_when_a_lower_sequence_commits_last(b: &impl TestBackend) {
    let s = b.store();
    s.append(vec![message("r", "a", "before")])
        .await
        .expect("append");
    let (before, _, cursor) = read_all(&*s, Position::START).await;
    assert_eq!(before.len(), 1);

    let slow = message("r", "slow", "takes the lower sequence");
    let fast = message("r", "fast", "commits first");
    let writer_store = b.reopen("fast-writer").await.expect("reopen");
    let held = b.hold_append(vec![slow.clone()]).await.expect("hold");
    let fast_row = fast.clone();
    let mut writer = tokio::spawn(async move { writer_store.append(vec![fast_row]).await });
    if b.writers() == Writers::Concurrent {
        tokio::time::timeout(Duration::from_secs(10), &mut writer)
            .await
            .expect("a concurrent writer waited for the held transaction")
            .expect("join")
            .expect("fast append");
    }
    let batch = s.read_forward(cursor, 100).await.expect("read");
    assert!(
        batch.rows.is_empty() && batch.skipped.is_empty(),
        "read past a transaction that is still open: {:?}",
        batch.rows
    );
    assert_eq!(
        batch.next, cursor,
        "the cursor moved past an open transaction"
    );
    // The committed row behind the open transaction is reported as held back (what a
    // one-shot reader waits for to see its own write), in the room's read too.
    let concurrent = b.writers() == Writers::Concurrent;
    assert_eq!(
        batch.held_back, concurrent,
        "held back behind an open transaction"
    );
    let room = s.read_room("r", cursor, 100).await.expect("read room");
    assert!(room.rows.is_empty(), "{:?}", room.rows);
    assert_eq!(room.held_back, concurrent);
    held.commit().await.expect("commit held");
    if b.writers() == Writers::Serialized {
        writer.await.expect("join").expect("fast append");
    }
    let (seen, _, _) = read_all(&*s, cursor).await;
    assert_eq!(
        seen.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![slow.id(), fast.id()],
        "every row exactly once, the held (lower) one first"
    );
    let (_, _, end) = read_all(&*s, cursor).await;
    let after = s.read_forward(end, 100).await.expect("read at the end");
    assert!(
        after.rows.is_empty() && !after.held_back,
        "nothing held back any more"
    );
    // A fresh reader from the start sees the same order.
    let (all, _, _) = read_all(&*s, Position::START).await;
    let ids: Vec<_> = all.iter().skip(1).map(|r| r.id).collect();
    assert_eq!(ids, vec![slow.id(), fast.id()]);
}

/// Several writers (on several handles) and two readers following the ledger at the
/// same time: each reader sees every row exactly once, both in the same order.
pub async fn concurrent_writers_and_readers_see_every_row_once_in_one_order(b: &impl TestBackend) {
    const WRITERS: usize = 6;
    const PER_WRITER: usize = 40;
    let total = WRITERS * PER_WRITER;
    let mut handles = Vec::new();
    for w in 0..WRITERS {
        let store = if w % 2 == 0 {
            b.store()
        } else {
            b.reopen(&format!("writer-{w}")).await.expect("reopen")
        };
        handles.push(tokio::spawn(async move {
            for i in 0..PER_WRITER {
                let batch = if i % 5 == 0 {
                    vec![
                        message("r", &format!("w{w}"), &format!("{i}a")),
                        message("r", &format!("w{w}"), &format!("{i}b")),
                    ]
                } else {
                    vec![message("r", &format!("w{w}"), &i.to_string())]
                };
                store.append(batch).await.expect("append");
            }
        }));
    }
    let expected = total + WRITERS * PER_WRITER.div_ceil(5);
    let mut readers = Vec::new();
    for r in 0..2 {
        let store = b.reopen(&format!("reader-{r}")).await.expect("reopen");
        readers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut cursor = Position::START;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while seen.len() < expected {
                assert!(tokio::time::Instant::now() < deadline, "reader stalled");
                let batch = store.read_forward(cursor, 7).await.expect("read");
                assert!(batch.next >= cursor);
                cursor = batch.next;
                seen.extend(batch.rows.into_iter().map(|r| r.id));
            }
            seen
        }));
    }
    for h in handles {
        h.await.expect("writer");
    }
    let a = readers.remove(0).await.expect("reader");
    let c = readers.remove(0).await.expect("reader");
    let unique: HashSet<_> = a.iter().collect();
    assert_eq!(unique.len(), a.len(), "a reader saw a row twice");
    assert_eq!(a.len(), expected);
    assert_eq!(a, c, "readers disagree on the order");
    let (all, _, _) = read_all(&*b.store(), Position::START).await;
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), a);
}

/// Corrupt or foreign rows (invalid JSON, unknown verb, wrong id) are skipped and
/// counted; rows after them are still read.
pub async fn corrupt_rows_are_skipped_and_never_block_the_cursor(b: &impl TestBackend) {
    let s = b.store();
    let good = message("r", "ana", "good");
    let raw = |body: &str, verb: &str, id: Vec<u8>| huddle_core::RawRow {
        id,
        position: Position::START,
        at: Timestamp(0),
        relay: String::new(),
        room: "r".into(),
        thread: None,
        verb: verb.into(),
        actor: "mallory".into(),
        role: "agent".into(),
        parent: None,
        caused_by: vec![],
        body: body.into(),
        sig: None,
    };
    b.insert_raw(raw("{not json", "message.posted", vec![1; 32]))
        .await
        .expect("raw");
    b.insert_raw(raw(r#"{"text":"x"}"#, "evil.verb", vec![2; 32]))
        .await
        .expect("raw");
    b.insert_raw(raw(r#"{"text":"forged"}"#, "message.posted", vec![3; 32]))
        .await
        .expect("raw");
    // Rows whose id matches their content but that no writer would accept: a body
    // over the size limit, and text holding NUL (escaped, so the table takes it).
    for text in ["x".repeat(300 * 1024), r"a\u0000b".to_string()] {
        let body = format!(r#"{{"text":"{text}"}}"#);
        let value: serde_json::Value = serde_json::from_str(&body).expect("json");
        let id = NewInteraction::new("r", Verb::MessagePosted, "mallory", Role::Agent, value).id();
        b.insert_raw(raw(&body, "message.posted", id.0.to_vec()))
            .await
            .expect("raw");
    }
    s.append(vec![good.clone()]).await.expect("append");
    let (rows, skipped, _) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 5);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, good.id());
    // One batch reports the reasons.
    let batch = settled(|| s.read_forward(Position::START, 10)).await;
    assert_eq!(batch.skipped.len(), 5);
    let reasons: Vec<_> = batch.skipped.iter().map(|k| k.reason.clone()).collect();
    assert!(reasons[0].contains("JSON"), "{reasons:?}");
    assert!(reasons[1].contains("verb"), "{reasons:?}");
    assert!(reasons[2].contains("hash"), "{reasons:?}");
    assert!(reasons[3].contains("the limit is"), "{reasons:?}");
    assert!(reasons[4].contains("NUL"), "{reasons:?}");
}

/// A signing store's rows read back with their signer, whichever append path wrote
/// them (one row, a batch, a batch with a duplicate, under a fence), and a stored row
/// whose signature does not verify for its writer and content is skipped and counted
/// like a corrupt row. A row signed by some other key that verifies is read back with
/// that key: which keys count is the readers' folds' call (`relay-keys`). A duplicate
/// appended by a signing store keeps the first writer's row.
pub async fn signed_rows_are_verified_on_read(b: &impl TestBackend) {
    use huddle_core::keys::WriterSecret;
    let key = WriterSecret::from_seed([0x21; 32]);
    let signing = b
        .reopen_signing("signer", key.clone())
        .await
        .expect("reopen");
    assert_eq!(signing.signer(), Some(key.public()));
    assert_eq!(b.store().signer(), None);
    let plain = message("r", "ana", "plain");
    b.store().append(vec![plain.clone()]).await.expect("append");
    let one = message("r", "ana", "one");
    let two = [message("r", "ana", "two a"), message("r", "ana", "two b")];
    let dup = [message("r", "ana", "dup a"), plain.clone()];
    let fenced = message("r", "ana", "fenced");
    signing.append(vec![one.clone()]).await.expect("append one");
    signing.append(two.to_vec()).await.expect("append two");
    let out = signing.append(dup.to_vec()).await.expect("append dup");
    assert!(out[0].inserted && !out[1].inserted);
    let Acquired::Won(c) = signing
        .acquire("k/signed", "ada", Duration::from_secs(30))
        .await
        .expect("acquire")
    else {
        panic!("a free claim")
    };
    let fence = Fence {
        key: "k/signed".into(),
        holder: "ada".into(),
        epoch: c.epoch,
    };
    signing
        .append_fenced(&fence, vec![fenced.clone()])
        .await
        .expect("append fenced");

    // Forgeries stored under the plain store's writer name.
    let writer = b.store().writer().expect("the writer is known");
    let mallory = WriterSecret::from_seed([0x66; 32]);
    let raw = |n: &NewInteraction, sig: Option<String>| RawRow {
        id: n.id().0.to_vec(),
        position: Position::START,
        at: Timestamp(0),
        relay: String::new(),
        room: n.room.clone(),
        thread: None,
        verb: n.verb.as_str().into(),
        actor: n.actor.clone(),
        role: n.role.as_str().into(),
        parent: None,
        caused_by: vec![],
        body: n.body_text(),
        sig,
    };
    let copied = message("r", "mallory", "copied signature");
    let elsewhere = message("r", "mallory", "signed for another writer");
    let malformed = message("r", "mallory", "malformed");
    let other_key = message("r", "mallory", "mallory's own key");
    for row in [
        raw(&copied, Some(key.sign_row(&writer, &one.id()).to_text())),
        raw(
            &elsewhere,
            Some(key.sign_row("signer-2", &elsewhere.id()).to_text()),
        ),
        raw(&malformed, Some("ed25519:00:00".into())),
        raw(
            &other_key,
            Some(mallory.sign_row(&writer, &other_key.id()).to_text()),
        ),
    ] {
        b.insert_raw(row).await.expect("raw");
    }

    for reader in [b.store(), signing.clone()] {
        let (rows, skipped, _) = read_all(&*reader, Position::START).await;
        assert_eq!(skipped, 3, "{rows:?}");
        let signer_of = |n: &NewInteraction| {
            rows.iter()
                .find(|r| r.id == n.id())
                .unwrap_or_else(|| panic!("{n:?} not read"))
                .signer
        };
        assert_eq!(signer_of(&plain), None, "the first writer's row stays");
        for n in [&one, &two[0], &two[1], &dup[0], &fenced] {
            assert_eq!(signer_of(n), Some(key.public()), "{n:?}");
        }
        assert_eq!(signer_of(&other_key), Some(mallory.public()));
        assert_eq!(rows.len(), 7);
        let got = reader.get(one.id()).await.expect("get").expect("row");
        assert_eq!(got.signer, Some(key.public()));
        assert!(reader.get(copied.id()).await.expect("get").is_none());
    }
}

/// 32 concurrent contenders on one key (on several handles): exactly one wins.
pub async fn claim_has_exactly_one_winner_among_32(b: &impl TestBackend) {
    let other = b.reopen("second").await.expect("reopen");
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = if i % 2 == 0 { b.store() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .acquire("task/r/t1", &format!("agent-{i}"), Duration::from_secs(30))
                .await
                .expect("acquire")
        }));
    }
    let mut winners = Vec::new();
    let mut holders = HashSet::new();
    for t in tasks {
        let out = t.await.expect("join");
        holders.insert(out.state().holder.clone());
        if let Acquired::Won(state) = out {
            winners.push(state);
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(holders.len(), 1, "everyone must see the one holder");
    assert_eq!(winners[0].epoch, Epoch(1));
}

/// The same holder re-acquiring or renewing keeps the epoch and extends the lease;
/// a wrong epoch cannot renew.
pub async fn same_holder_renews_without_new_epoch(b: &impl TestBackend) {
    let s = b.store();
    let ttl = Duration::from_secs(30);
    let first = s.acquire("k", "a", ttl).await.expect("acquire");
    let Acquired::Won(first) = first else {
        panic!("free claim not won")
    };
    wait_for_db_time(&*s, first.expires_at - 30_000_000).await;
    let again = s.acquire("k", "a", ttl).await.expect("acquire");
    assert!(again.won());
    assert_eq!(again.state().epoch, first.epoch);
    assert!(again.state().expires_at > first.expires_at);
    let renewed = s
        .renew("k", "a", first.epoch, ttl)
        .await
        .expect("renew")
        .expect("renew of a live claim");
    assert_eq!(renewed.epoch, first.epoch);
    assert!(s
        .renew("k", "a", first.epoch.next(), ttl)
        .await
        .expect("renew")
        .is_none());
    assert!(s
        .renew("k", "b", first.epoch, ttl)
        .await
        .expect("renew")
        .is_none());
}

/// A claim taken for a driver (plan 0094) is kept, its epoch with it, only for the
/// same holder and the same driver; the same holder for another driver, or for none,
/// finds it held, by a lone acquire, a batch and a hand-off alike (whose rows are
/// then not written). A claim taken without a driver is held against a driver in the
/// same way. Once it lapses, another driver takes it at a higher epoch, and the fences
/// of the epoch before are refused.
pub async fn a_live_claim_is_kept_only_for_its_driver(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let ttl = Duration::from_secs(30);
    let driven = |key: &str, driver: &str, ttl: Duration| {
        ClaimRequest::new(key, "ada", ttl).driven_by(driver)
    };
    let first = s
        .acquire_request(&driven("task/r/t1", "relay-a", Duration::from_millis(400)))
        .await
        .expect("acquire");
    let Acquired::Won(first) = first else {
        panic!("free claim not won: {first:?}")
    };
    let again = s
        .acquire_request(&driven("task/r/t1", "relay-a", Duration::from_millis(400)))
        .await
        .expect("acquire");
    assert!(again.won(), "the same holder and driver keep it: {again:?}");
    assert_eq!(again.state().epoch, first.epoch);
    let listed = s.list_claims("task/r/t1").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].driver.as_deref(), Some("relay-a"), "{listed:?}");
    let held = |a: &Acquired| matches!(a, Acquired::HeldBy(st) if st.holder == "ada" && st.epoch == first.epoch);
    let by_b = other
        .acquire_request(&driven("task/r/t1", "relay-b", ttl))
        .await
        .expect("acquire");
    assert!(held(&by_b), "another driver finds it held: {by_b:?}");
    let undriven = other
        .acquire("task/r/t1", "ada", ttl)
        .await
        .expect("acquire");
    assert!(held(&undriven), "no driver finds it held: {undriven:?}");
    let batch = other
        .acquire_batch(&[
            driven("task/r/t1", "relay-b", ttl),
            driven("task/r/t2", "relay-b", ttl),
        ])
        .await
        .expect("batch");
    assert!(held(batch[0].as_ref().expect("tried")), "{batch:?}");
    assert!(batch[1].as_ref().is_some_and(Acquired::won), "{batch:?}");
    let claimed = |task: &str| {
        NewInteraction::new(
            "r",
            Verb::TaskClaimed,
            "ada",
            Role::Agent,
            json!({ "task": task, "epoch": 1, "attempt": 1 }),
        )
    };
    let h = other
        .acquire_and_append(
            &[driven("task/r/t1", "relay-b", ttl)],
            vec![crate::ConditionalAppend {
                when_won: vec![(0, Epoch(1))],
                rows: vec![claimed("t1")],
            }],
        )
        .await
        .expect("hand-off");
    assert!(held(h.acquired[0].as_ref().expect("tried")), "{h:?}");
    assert_eq!(
        h.appended[0], None,
        "a hand-off held by another driver writes nothing"
    );
    // The driver that won writes under the claim; the holder alone names it.
    let fence = Fence {
        key: "task/r/t1".into(),
        holder: "ada".into(),
        epoch: first.epoch,
    };
    s.append_under(std::slice::from_ref(&fence), false, vec![claimed("t1")])
        .await
        .expect("the winning driver's fence holds");
    // A claim taken without a driver is held against one, and kept without one.
    let plain = s.acquire("task/r/t3", "ada", ttl).await.expect("acquire");
    assert!(plain.won());
    let listed = s.list_claims("task/r/t3").await.expect("list");
    assert_eq!(listed[0].driver, None, "{listed:?}");
    let h = other
        .acquire_and_append(
            &[driven("task/r/t3", "relay-b", ttl)],
            vec![crate::ConditionalAppend {
                when_won: vec![(0, Epoch(1))],
                rows: vec![claimed("t3")],
            }],
        )
        .await
        .expect("hand-off");
    assert!(matches!(&h.acquired[0], Some(Acquired::HeldBy(_))), "{h:?}");
    assert_eq!(h.appended[0], None);
    let kept = s.acquire("task/r/t3", "ada", ttl).await.expect("acquire");
    assert!(
        kept.won() && kept.state().epoch == plain.state().epoch,
        "{kept:?}"
    );
    // Lapsed: another driver takes it, at the next epoch, and the old fence fails.
    wait_for_db_time(&*s, again.state().expires_at).await;
    let taken = other
        .acquire_request(&driven("task/r/t1", "relay-b", ttl))
        .await
        .expect("acquire");
    assert!(
        taken.won(),
        "a lapsed claim goes to another driver: {taken:?}"
    );
    assert_eq!(taken.state().epoch, first.epoch.next());
    let back = s
        .acquire_request(&driven("task/r/t1", "relay-a", ttl))
        .await
        .expect("acquire");
    assert!(
        matches!(&back, Acquired::HeldBy(st) if st.epoch == first.epoch.next()),
        "{back:?}"
    );
    let refused = s
        .append_under(
            std::slice::from_ref(&fence),
            false,
            vec![message("r", "ada", "late")],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
}

/// A different holder wins only after the lease expired by the database clock, with
/// a higher epoch; the old holder can no longer renew.
pub async fn other_holder_wins_only_after_expiry(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let a = s
        .acquire("k", "a", Duration::from_millis(300))
        .await
        .expect("acquire");
    assert!(a.won());
    let blocked = other
        .acquire("k", "b", Duration::from_secs(30))
        .await
        .expect("acquire");
    match &blocked {
        Acquired::HeldBy(state) => {
            assert_eq!(state.holder, "a");
            assert_eq!(state.epoch, a.state().epoch);
        }
        other => panic!("took an unexpired claim: {other:?}"),
    }
    wait_for_db_time(&*s, a.state().expires_at).await;
    let b_won = other
        .acquire("k", "b", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(b_won.won());
    assert!(b_won.state().epoch > a.state().epoch);
    assert!(s
        .renew("k", "a", a.state().epoch, Duration::from_secs(30))
        .await
        .expect("renew")
        .is_none());
    // The former holder re-taking after b's expiry gets a still higher epoch.
    let short = other
        .renew("k", "b", b_won.state().epoch, Duration::from_millis(100))
        .await
        .expect("renew")
        .expect("live");
    wait_for_db_time(&*s, short.expires_at).await;
    let back = s
        .acquire("k", "a", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(back.won());
    assert!(back.state().epoch > b_won.state().epoch);
}

/// Release expires the claim without deleting it: the next acquisition, even by the
/// same holder, gets a higher epoch. A release with a stale epoch does nothing.
pub async fn release_then_reacquire_bumps_epoch(b: &impl TestBackend) {
    let s = b.store();
    let ttl = Duration::from_secs(30);
    let first = s.acquire("lease/r/coord", "a", ttl).await.expect("acquire");
    let e1 = first.state().epoch;
    assert!(!s
        .release("lease/r/coord", "a", e1.next())
        .await
        .expect("release"));
    assert!(!s.release("lease/r/coord", "b", e1).await.expect("release"));
    assert!(s.release("lease/r/coord", "a", e1).await.expect("release"));
    let rows = s.list_claims("lease/").await.expect("list");
    assert_eq!(rows.len(), 1, "released claims stay as rows");
    assert!(!rows[0].live);
    let again = s.acquire("lease/r/coord", "a", ttl).await.expect("acquire");
    assert!(again.won());
    assert!(again.state().epoch > e1);
    assert!(s
        .release("lease/r/coord", "a", again.state().epoch)
        .await
        .expect("release"));
    let third = s.acquire("lease/r/coord", "b", ttl).await.expect("acquire");
    assert!(third.won());
    assert!(third.state().epoch > again.state().epoch);
}

/// An append under a stale `(holder, epoch)` is refused once someone else took the
/// claim, and nothing is written.
pub async fn fenced_append_refused_after_handover(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let a = s
        .acquire("task/r/t1", "a", Duration::from_millis(300))
        .await
        .expect("acquire");
    let fence_a = Fence {
        key: "task/r/t1".into(),
        holder: "a".into(),
        epoch: a.state().epoch,
    };
    let ok = s
        .append_fenced(&fence_a, vec![message("r", "a", "claimed")])
        .await
        .expect("fenced append while holding");
    assert!(ok[0].inserted);
    wait_for_db_time(&*s, a.state().expires_at).await;
    let taken = other
        .acquire("task/r/t1", "b", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(taken.won());
    let err = s
        .append_fenced(&fence_a, vec![message("r", "a", "late completion")])
        .await
        .expect_err("stale fence must be refused");
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    let fence_b = Fence {
        key: "task/r/t1".into(),
        holder: "b".into(),
        epoch: taken.state().epoch,
    };
    other
        .append_fenced(&fence_b, vec![message("r", "b", "done")])
        .await
        .expect("current holder");
    let unknown = Fence {
        key: "task/r/never".into(),
        holder: "a".into(),
        epoch: Epoch(1),
    };
    assert!(matches!(
        s.append_fenced(&unknown, vec![message("r", "a", "x")])
            .await,
        Err(StoreError::Fenced { .. })
    ));
    let (rows, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<_> = rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("claimed"), json!("done")]);
}

/// The write that finishes work closes its claims in the same transaction: after it,
/// no holder ever acquires the key again, before or after its lease would have
/// lapsed, on any handle; the answer names the closing row. Renew and release of a
/// closed claim change nothing, and no further append passes its fence.
pub async fn a_closed_claim_is_never_acquired_again(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let won = s
        .acquire("task/r/t1", "a", Duration::from_millis(300))
        .await
        .expect("acquire");
    let fence = Fence {
        key: "task/r/t1".into(),
        holder: "a".into(),
        epoch: won.state().epoch,
    };
    let done = message("r", "a", "completed");
    let done_id = done.id();
    s.append_under(
        std::slice::from_ref(&fence),
        true,
        vec![done, message("r", "a", "and noted")],
    )
    .await
    .expect("closing append under a live claim");
    for (store, holder) in [(&s, "a"), (&other, "b"), (&other, "a")] {
        match store
            .acquire("task/r/t1", holder, Duration::from_secs(30))
            .await
            .expect("acquire")
        {
            Acquired::Closed { state, by } => {
                assert_eq!(by, done_id, "the answer names the closing row");
                assert_eq!((state.holder.as_str(), state.epoch), ("a", fence.epoch));
            }
            other => panic!("{holder} acquired a closed claim: {other:?}"),
        }
    }
    // Past the lease it once had: still closed (closed is not expiry).
    wait_for_db_time(&*s, won.state().expires_at).await;
    assert!(other
        .acquire("task/r/t1", "b", Duration::from_secs(30))
        .await
        .expect("acquire")
        .closed());
    assert_eq!(
        s.renew("task/r/t1", "a", fence.epoch, Duration::from_secs(30))
            .await
            .expect("renew"),
        None,
        "a closed claim cannot be renewed"
    );
    assert!(!s
        .release("task/r/t1", "a", fence.epoch)
        .await
        .expect("release"));
    assert!(matches!(
        s.append_fenced(&fence, vec![message("r", "a", "a second completion")])
            .await,
        Err(StoreError::Fenced { .. })
    ));
    let listed = s.list_claims("task/r/").await.expect("list");
    assert_eq!(
        listed.len(),
        1,
        "closed is a state of the row, not a deletion"
    );
    assert!(!listed[0].live, "a closed claim is not live");
    assert_eq!(
        listed[0].state.epoch, fence.epoch,
        "the epoch history stays"
    );
    let (rows, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<_> = rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("completed"), json!("and noted")]);
    // A closing append needs a row to name.
    assert!(s.append_under(&[], true, Vec::new()).await.is_err());
}

/// An append under two claims (the agent's task claim and the relay's drive claim)
/// is refused when either has changed hands, and writes nothing.
pub async fn an_append_under_two_claims_needs_both(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let task = s
        .acquire("task/r/t1", "ada", Duration::from_millis(300))
        .await
        .expect("acquire");
    let drive = s
        .acquire("taskdrive/r/t1", "relay-a", Duration::from_secs(30))
        .await
        .expect("acquire");
    let fences = [
        Fence {
            key: "task/r/t1".into(),
            holder: "ada".into(),
            epoch: task.state().epoch,
        },
        Fence {
            key: "taskdrive/r/t1".into(),
            holder: "relay-a".into(),
            epoch: drive.state().epoch,
        },
    ];
    s.append_under(&fences, false, vec![message("r", "ada", "claimed")])
        .await
        .expect("both held");
    // The task claim lapses and is re-taken by the same agent elsewhere: a new epoch.
    wait_for_db_time(&*s, task.state().expires_at).await;
    let retaken = other
        .acquire("task/r/t1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(retaken.won());
    assert!(retaken.state().epoch > task.state().epoch);
    let err = s
        .append_under(&fences, true, vec![message("r", "ada", "stale completion")])
        .await
        .expect_err("the task claim changed epoch");
    assert!(
        matches!(&err, StoreError::Fenced { key, .. } if key == "task/r/t1"),
        "{err}"
    );
    // Same holder and epoch for the task claim, but another relay drives it.
    let fences_b = [
        Fence {
            key: "task/r/t1".into(),
            holder: "ada".into(),
            epoch: retaken.state().epoch,
        },
        Fence {
            key: "taskdrive/r/t1".into(),
            holder: "relay-b".into(),
            epoch: drive.state().epoch,
        },
    ];
    let err = other
        .append_under(&fences_b, true, vec![message("r", "ada", "not my drive")])
        .await
        .expect_err("relay-b does not hold the drive claim");
    assert!(
        matches!(&err, StoreError::Fenced { key, .. } if key == "taskdrive/r/t1"),
        "{err}"
    );
    // Given out of key order (a store may check them in key order): the refusal
    // still names the fence that does not hold.
    let reversed = [fences_b[1].clone(), fences_b[0].clone()];
    let err = other
        .append_under(&reversed, true, vec![message("r", "ada", "not my drive")])
        .await
        .expect_err("relay-b does not hold the drive claim");
    assert!(
        matches!(&err, StoreError::Fenced { key, .. } if key == "taskdrive/r/t1"),
        "{err}"
    );
    // Nothing was closed by the refused writes.
    assert!(other
        .acquire("task/r/t1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire")
        .won());
    let (rows, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<_> = rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("claimed")]);
}

/// A batch acquire answers every request as [`crate::Claims::acquire`] would (won,
/// held by someone else, closed), and a conditional request is tried only when the
/// request it waits for was won: a lost task claim takes no drive claim.
pub async fn a_batch_acquire_answers_each_claim_as_acquire_would(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let ttl = Duration::from_secs(30);
    // t2 is held by someone else; t3 is finished (closed).
    assert!(other
        .acquire("task/r/t2", "bo", ttl)
        .await
        .expect("acquire")
        .won());
    let t3 = s.acquire("task/r/t3", "cy", ttl).await.expect("acquire");
    let closing = [Fence {
        key: "task/r/t3".into(),
        holder: "cy".into(),
        epoch: t3.state().epoch,
    }];
    let done = s
        .append_under(&closing, true, vec![message("r", "cy", "done")])
        .await
        .expect("close t3");
    // t4 was released: the next holder gets a higher epoch.
    let t4 = s.acquire("task/r/t4", "di", ttl).await.expect("acquire");
    assert!(s
        .release("task/r/t4", "di", t4.state().epoch)
        .await
        .expect("release"));
    let requests = vec![
        ClaimRequest::new("task/r/t1", "ada", ttl),
        ClaimRequest::new("task/r/t2", "ada", ttl),
        ClaimRequest::new("task/r/t3", "ada", ttl),
        ClaimRequest::new("task/r/t4", "ada", ttl),
        ClaimRequest::new("taskdrive/r/t1", "relay-a", ttl).after(0),
        ClaimRequest::new("taskdrive/r/t2", "relay-a", ttl).after(1),
        ClaimRequest::new("taskdrive/r/t3", "relay-a", ttl).after(2),
        ClaimRequest::new("taskdrive/r/t4", "relay-a", ttl).after(3),
    ];
    let out = s.acquire_batch(&requests).await.expect("batch");
    assert_eq!(out.len(), requests.len());
    let got = |i: usize| {
        out[i]
            .as_ref()
            .unwrap_or_else(|| panic!("request {i} not tried"))
    };
    assert!(matches!(got(0), Acquired::Won(st) if st.holder == "ada" && st.epoch == Epoch(1)));
    assert!(
        matches!(got(1), Acquired::HeldBy(st) if st.holder == "bo"),
        "{:?}",
        got(1)
    );
    assert!(
        matches!(got(2), Acquired::Closed { by, .. } if *by == done[0].id),
        "{:?}",
        got(2)
    );
    assert!(got(3).won());
    assert!(got(3).state().epoch > t4.state().epoch);
    assert!(matches!(got(4), Acquired::Won(st) if st.holder == "relay-a"));
    assert!(
        out[5].is_none(),
        "drive of a lost task claim tried: {:?}",
        out[5]
    );
    assert!(
        out[6].is_none(),
        "drive of a closed task claim tried: {:?}",
        out[6]
    );
    assert!(got(7).won());
    // The answers are the store's: the won claims fence appends, and nothing was
    // taken for the requests not tried.
    let fences = [
        Fence {
            key: "task/r/t1".into(),
            holder: "ada".into(),
            epoch: got(0).state().epoch,
        },
        Fence {
            key: "taskdrive/r/t1".into(),
            holder: "relay-a".into(),
            epoch: got(4).state().epoch,
        },
    ];
    s.append_under(&fences, false, vec![message("r", "ada", "claimed t1")])
        .await
        .expect("the batch's claims hold");
    let drives: Vec<String> = s
        .list_claims("taskdrive/")
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.state.key)
        .collect();
    assert_eq!(drives, vec!["taskdrive/r/t1", "taskdrive/r/t4"]);
    // The same holder asking again in a batch extends its claims at the same epochs.
    let again = s.acquire_batch(&requests[..1]).await.expect("batch");
    assert!(matches!(&again[0], Some(Acquired::Won(st)) if st.epoch == got(0).state().epoch));
    assert!(s.acquire_batch(&[]).await.expect("empty batch").is_empty());
}

/// A hand-off's rows are written with its claims only when they were won at the
/// epochs the rows carry; otherwise nothing of them is written (and the claims won
/// stay won, for the caller to write under).
pub async fn a_handoff_writes_its_rows_only_at_the_epochs_expected(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let ttl = Duration::from_secs(30);
    let claimed = |task: &str, epoch: i64| {
        NewInteraction::new(
            "r",
            Verb::TaskClaimed,
            "ada",
            Role::Agent,
            json!({ "task": task, "epoch": epoch, "attempt": 1 }),
        )
    };
    // t2 was taken before (its next epoch is 2); t3 is held by someone else.
    let t2 = s.acquire("task/r/t2", "di", ttl).await.expect("acquire");
    assert!(s
        .release("task/r/t2", "di", t2.state().epoch)
        .await
        .expect("release"));
    assert!(other
        .acquire("task/r/t3", "bo", ttl)
        .await
        .expect("acquire")
        .won());
    let requests = vec![
        ClaimRequest::new("task/r/t1", "ada", ttl),
        ClaimRequest::new("task/r/t2", "ada", ttl),
        ClaimRequest::new("task/r/t3", "ada", ttl),
        ClaimRequest::new("taskdrive/r/t1", "relay-a", ttl).after(0),
        ClaimRequest::new("taskdrive/r/t2", "relay-a", ttl).after(1),
        ClaimRequest::new("taskdrive/r/t3", "relay-a", ttl).after(2),
    ];
    let append = |task: &str, i: usize, d: usize| crate::ConditionalAppend {
        when_won: vec![(i, Epoch(1)), (d, Epoch(1))],
        rows: vec![
            claimed(task, 1),
            message("r", "relay-a", &format!("prompt {task}")),
        ],
    };
    let h = s
        .acquire_and_append(
            &requests,
            vec![append("t1", 0, 3), append("t2", 1, 4), append("t3", 2, 5)],
        )
        .await
        .expect("hand-off");
    assert!(matches!(&h.acquired[0], Some(Acquired::Won(st)) if st.epoch == Epoch(1)));
    assert!(matches!(&h.acquired[1], Some(Acquired::Won(st)) if st.epoch == Epoch(2)));
    assert!(matches!(&h.acquired[2], Some(Acquired::HeldBy(_))));
    assert!(
        h.acquired[5].is_none(),
        "the drive of a lost claim is not tried"
    );
    let written = h.appended[0].as_ref().expect("t1's rows are written");
    assert!(written.len() == 2 && written.iter().all(|a| a.inserted));
    assert_eq!(h.appended[1], None, "t2 was won at epoch 2, not 1");
    assert_eq!(h.appended[2], None, "t3 was not won");
    let (rows, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {}", r.verb, r.body))
        .collect();
    assert!(texts.iter().any(|t| t.contains("prompt t1")), "{texts:?}");
    assert!(
        !texts.iter().any(|t| t.contains("t2") || t.contains("t3")),
        "{texts:?}"
    );
    // The claims won stay won: the caller writes t2's rows under epoch 2 itself.
    s.append_under(
        &[Fence {
            key: "task/r/t2".into(),
            holder: "ada".into(),
            epoch: Epoch(2),
        }],
        false,
        vec![claimed("t2", 2)],
    )
    .await
    .expect("t2's claim holds at epoch 2");
    // Bad shapes are refused with nothing taken.
    let mut keyed = append("t9", 0, 1);
    keyed.rows[1] = keyed.rows[1].clone().with_idempotency_key("k");
    for bad in [
        vec![keyed],
        vec![crate::ConditionalAppend {
            when_won: vec![(7, Epoch(1))],
            rows: vec![claimed("t9", 1)],
        }],
    ] {
        let reqs = [
            ClaimRequest::new("task/r/t9", "ada", ttl),
            ClaimRequest::new("taskdrive/r/t9", "relay-a", ttl).after(0),
        ];
        assert!(s.acquire_and_append(&reqs, bad).await.is_err());
    }
    assert!(
        s.list_claims("task/r/t9").await.expect("list").is_empty(),
        "a refused hand-off takes nothing"
    );
}

/// A fenced write sent ahead of a hand-off (plan 0082): written (closing its claims)
/// with the hand-off's claims and rows; sent again, identical, it deduplicates and the
/// claims are taken at the same epochs; refused by its fence, nothing of the call is
/// done — no claim of the hand-off taken, none of its rows written.
pub async fn a_write_then_hand_off_writes_first_or_does_nothing(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let ttl = Duration::from_secs(30);
    let d1 = s.acquire("task/r/d1", "ada", ttl).await.expect("acquire");
    assert!(d1.won());
    let first = crate::FencedWrite {
        fences: vec![Fence {
            key: "task/r/d1".into(),
            holder: "ada".into(),
            epoch: d1.state().epoch,
        }],
        close: true,
        rows: vec![message("r", "ada", "d1 done")],
    };
    let requests = vec![ClaimRequest::new("task/r/n1", "ada", ttl)];
    let rows = |text: &str| crate::ConditionalAppend {
        when_won: vec![(0, Epoch(1))],
        rows: vec![message("r", "ada", text)],
    };
    for round in 0..2 {
        let (written, h) = s
            .append_then_hand_off(first.clone(), &requests, vec![rows("n1 claimed")])
            .await
            .expect("write, then hand-off");
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].id, first.rows[0].id());
        assert_eq!(written[0].inserted, round == 0, "round {round}");
        assert!(matches!(&h.acquired[0], Some(Acquired::Won(st)) if st.epoch == Epoch(1)));
        assert!(h.appended[0].is_some(), "round {round}");
    }
    assert!(
        matches!(
            s.acquire("task/r/d1", "bo", ttl).await.expect("acquire"),
            Acquired::Closed { .. }
        ),
        "the write closed its claim"
    );
    // Refused by its fence: nothing of the call happens.
    assert!(other
        .acquire("task/r/d2", "bo", ttl)
        .await
        .expect("acquire")
        .won());
    let refused = crate::FencedWrite {
        fences: vec![Fence {
            key: "task/r/d2".into(),
            holder: "ada".into(),
            epoch: Epoch(1),
        }],
        close: true,
        rows: vec![message("r", "ada", "d2 done")],
    };
    let err = s
        .append_then_hand_off(
            refused,
            &[ClaimRequest::new("task/r/n2", "ada", ttl)],
            vec![rows("n2 claimed")],
        )
        .await
        .expect_err("a fence that does not hold");
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert!(
        s.list_claims("task/r/n2").await.expect("list").is_empty(),
        "no claim of a refused call is taken"
    );
    let (all, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<String> = all.iter().map(|r| r.body.to_string()).collect();
    assert!(texts.iter().any(|t| t.contains("n1 claimed")), "{texts:?}");
    assert!(
        !texts
            .iter()
            .any(|t| t.contains("d2 done") || t.contains("n2 claimed")),
        "{texts:?}"
    );
    assert_eq!(
        texts.iter().filter(|t| t.contains("d1 done")).count(),
        1,
        "the write sent twice is in once"
    );
}

/// A batch whose keys are not in increasing byte order, or whose condition names a
/// later request, is refused before anything is taken.
pub async fn a_batch_acquire_out_of_order_takes_nothing(b: &impl TestBackend) {
    let s = b.store();
    let ttl = Duration::from_secs(30);
    let unordered = [
        ClaimRequest::new("task/r/b", "ada", ttl),
        ClaimRequest::new("task/r/a", "ada", ttl),
    ];
    assert!(s.acquire_batch(&unordered).await.is_err());
    let repeated = [
        ClaimRequest::new("task/r/a", "ada", ttl),
        ClaimRequest::new("task/r/a", "bo", ttl),
    ];
    assert!(s.acquire_batch(&repeated).await.is_err());
    let forward = [
        ClaimRequest::new("task/r/a", "ada", ttl).after(1),
        ClaimRequest::new("task/r/b", "ada", ttl),
    ];
    assert!(s.acquire_batch(&forward).await.is_err());
    assert!(s.list_claims("").await.expect("list").is_empty());
}

/// Batches from two handles over the same claims, all at once: every claim has
/// exactly one holder, every requester sees that holder, and a drive claim is taken
/// exactly for the task claims its requester won (no deadlock between batches).
pub async fn concurrent_batch_acquires_have_one_winner_per_claim(b: &impl TestBackend) {
    let other = b.reopen("second").await.expect("reopen");
    let ttl = Duration::from_secs(30);
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8usize {
        let store = if i % 2 == 0 { b.store() } else { other.clone() };
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let agent = format!("agent-{i}");
            let relay = format!("relay-{i}");
            // Each asks for 6 of 8 tasks, starting at a different one.
            let mut ids: Vec<usize> = (0..6).map(|k| (i + k) % 8).collect();
            ids.sort_unstable();
            let mut requests: Vec<ClaimRequest> = ids
                .iter()
                .map(|t| ClaimRequest::new(format!("task/r/t{t}"), agent.clone(), ttl))
                .collect();
            for (j, t) in ids.iter().enumerate() {
                requests.push(
                    ClaimRequest::new(format!("taskdrive/r/t{t}"), relay.clone(), ttl).after(j),
                );
            }
            barrier.wait().await;
            let out = store.acquire_batch(&requests).await.expect("batch");
            (agent, relay, requests, out)
        }));
    }
    let mut task_winner: std::collections::HashMap<String, String> = Default::default();
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut drive_winner: std::collections::HashMap<String, String> = Default::default();
    for t in tasks {
        let (agent, relay, requests, out) = t.await.expect("join");
        let n = requests.len() / 2;
        for (j, r) in requests.iter().enumerate() {
            let answer = &out[j];
            if j < n {
                let a = answer.as_ref().expect("task claims are always tried");
                seen.push((r.key.clone(), a.state().holder.clone()));
                let drive = &out[j + n];
                if a.won() {
                    assert_eq!(a.state().holder, agent);
                    assert!(
                        task_winner.insert(r.key.clone(), agent.clone()).is_none(),
                        "two winners of {}",
                        r.key
                    );
                    let d = drive
                        .as_ref()
                        .expect("drive after a won task claim is tried");
                    assert!(d.won(), "{d:?}");
                    drive_winner.insert(requests[j + n].key.clone(), relay.clone());
                } else {
                    assert!(drive.is_none(), "drive after a lost task claim was tried");
                }
            }
        }
    }
    assert_eq!(
        task_winner.len(),
        8,
        "every task claim won once: {task_winner:?}"
    );
    for (key, holder) in seen {
        assert_eq!(
            task_winner.get(&key),
            Some(&holder),
            "{key} seen held by {holder}"
        );
    }
    let rows = b.store().list_claims("taskdrive/").await.expect("list");
    assert_eq!(rows.len(), 8);
    for row in rows {
        assert_eq!(drive_winner.get(&row.state.key), Some(&row.state.holder));
    }
}

/// A closing append retried after an ambiguous commit (the connection broke after
/// the commit) is accepted and writes nothing twice; a different batch under the
/// same closed claim is refused.
pub async fn a_retried_closing_append_is_idempotent(b: &impl TestBackend) {
    let s = b.store();
    let won = s
        .acquire("reply/r/m1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire");
    let fence = Fence {
        key: "reply/r/m1".into(),
        holder: "ada".into(),
        epoch: won.state().epoch,
    };
    let batch = vec![message("r", "ada", "the answer")];
    let first = s
        .append_under(std::slice::from_ref(&fence), true, batch.clone())
        .await
        .expect("first");
    assert!(first[0].inserted);
    let again = s
        .append_under(std::slice::from_ref(&fence), true, batch)
        .await
        .expect("a retry of the same closing append");
    assert_eq!(again[0].id, first[0].id);
    assert!(!again[0].inserted);
    assert!(matches!(
        s.append_under(
            std::slice::from_ref(&fence),
            true,
            vec![message("r", "ada", "another answer")]
        )
        .await,
        Err(StoreError::Fenced { .. })
    ));
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(rows.len(), 1);
}

/// A closing append under many fences (a relay's completion lot: a task claim and a
/// drive claim a task) closes every one of them or, when any does not hold, none: the
/// error names the first that does not, and a plain append under the others still
/// passes afterwards. Retried once it succeeded, it passes again (closed by itself).
pub async fn a_closing_append_under_many_fences_closes_all_or_none(b: &impl TestBackend) {
    let s = b.store();
    let ttl = Duration::from_secs(30);
    let mut fences = Vec::new();
    for i in 0..6 {
        let key = format!("task/r/m{i}");
        let won = s.acquire(&key, "ada", ttl).await.expect("acquire");
        assert!(won.won());
        fences.push(Fence {
            key,
            holder: "ada".into(),
            epoch: won.state().epoch,
        });
    }
    // The fifth names an epoch the claim never had.
    let mut stale = fences.clone();
    stale[4].epoch = Epoch(stale[4].epoch.0 + 1);
    let err = s
        .append_under(&stale, true, vec![message("r", "ada", "refused")])
        .await
        .expect_err("one fence does not hold");
    assert!(
        matches!(&err, StoreError::Fenced { key, .. } if key == "task/r/m4"),
        "{err}"
    );
    // Nothing was closed: every claim still fences a plain append.
    s.append_under(&fences, false, vec![message("r", "ada", "still held")])
        .await
        .expect("every fence still holds");
    let batch = vec![message("r", "ada", "all done")];
    let done = s
        .append_under(&fences, true, batch.clone())
        .await
        .expect("every fence holds");
    assert!(done[0].inserted);
    let again = s
        .append_under(&fences, true, batch)
        .await
        .expect("a retry of the same closing append");
    assert!(!again[0].inserted);
    for fence in &fences {
        let retry = s.acquire(&fence.key, "ada", ttl).await.expect("acquire");
        assert!(!retry.won(), "{} was closed by the append", fence.key);
    }
    let (rows, _, _) = read_all(&*s, Position::START).await;
    let texts: Vec<_> = rows.iter().map(|r| r.body["text"].clone()).collect();
    assert_eq!(texts, vec![json!("still held"), json!("all done")]);
}

/// Re-appending rows that are already in the ledger (a relay restarted after a kill
/// writing its turn's record again) passes its fences only while they hold: the
/// duplicate is a no-op while the claim is still the writer's, and refused, not
/// answered "already there", once the claim was taken over or closed.
pub async fn a_duplicate_under_a_lost_fence_is_refused(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let won = s
        .acquire("task/r/t1", "a", Duration::from_millis(300))
        .await
        .expect("acquire");
    let fence = Fence {
        key: "task/r/t1".into(),
        holder: "a".into(),
        epoch: won.state().epoch,
    };
    let prompted = vec![message("r", "a", "turn prompted at epoch 1")];
    let first = s
        .append_under(std::slice::from_ref(&fence), false, prompted.clone())
        .await
        .expect("under a held claim");
    assert!(first[0].inserted);
    let again = s
        .append_under(std::slice::from_ref(&fence), false, prompted.clone())
        .await
        .expect("the same rows again while the claim holds");
    assert_eq!(again[0].id, first[0].id);
    assert!(!again[0].inserted);
    // The lease lapses and another holder takes the claim.
    wait_for_db_time(&*s, won.state().expires_at).await;
    let taken = other
        .acquire("task/r/t1", "b", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(taken.won());
    let err = s
        .append_under(std::slice::from_ref(&fence), false, prompted.clone())
        .await
        .expect_err("a duplicate under a lost fence is refused");
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    // The new holder finishes and closes it: the old duplicate is still refused.
    let fence_b = Fence {
        key: "task/r/t1".into(),
        holder: "b".into(),
        epoch: taken.state().epoch,
    };
    other
        .append_under(
            std::slice::from_ref(&fence_b),
            true,
            vec![message("r", "b", "done")],
        )
        .await
        .expect("the holder's closing append");
    let err = s
        .append_under(std::slice::from_ref(&fence), false, prompted)
        .await
        .expect_err("a duplicate under a closed claim is refused");
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(rows.len(), 2);
}

/// A fenced append racing a takeover of its claim lands only while the epoch it names
/// is still the claim's: the new holder, reading right after it won, already sees
/// every append that landed, and a refused append leaves no row.
///
/// Each round, one task appends under `(a, e)` while another (on another handle)
/// releases `(a, e)` and acquires the claim for `b`. Both start at one instant, one of
/// them later by a round-dependent offset scaled to how long the two take, so over the
/// rounds the append falls before, inside and after the takeover. The test needs both outcomes
/// to have happened, so a race that was never run cannot pass.
pub async fn fenced_append_racing_a_takeover_lands_only_under_a_live_epoch(b: &impl TestBackend) {
    const MIN_ROUNDS: usize = 40;
    const MAX_ROUNDS: usize = 400;
    let ttl = Duration::from_secs(30);
    let worker = b.store();
    let taker = b.reopen("taker").await.expect("reopen");
    let (mut landed, mut refused) = (0usize, 0usize);
    // How long the slower side took last round (first guess: 1 ms).
    let mut span = Duration::from_millis(1);
    let mut round = 0;
    while round < MIN_ROUNDS || landed == 0 || refused == 0 {
        assert!(
            round < MAX_ROUNDS,
            "{MAX_ROUNDS} rounds and the race never went both ways: \
             {landed} appends landed, {refused} were refused"
        );
        let key = format!("task/r/race-{round}");
        let first = worker.acquire(&key, "a", ttl).await.expect("acquire");
        let Acquired::Won(first) = first else {
            panic!("a fresh key was not won")
        };
        let epoch = first.epoch;
        let fence = Fence {
            key: key.clone(),
            holder: "a".into(),
            epoch,
        };
        let row = message("r", "a", &format!("under epoch {epoch} in round {round}"));
        // From nothing to a little more than the slower side took last round, on the
        // appender's side in even rounds and the taker's in odd ones: short enough
        // that the two overlap, varied so that they overlap differently whatever the
        // backend's speed.
        let offset = span.mul_f64(((round * 37) % 100) as f64 / 80.0);
        let start = std::time::Instant::now() + Duration::from_millis(2);
        let (append_start, takeover_start) = if round % 2 == 0 {
            (start + offset, start)
        } else {
            (start, start + offset)
        };
        let append = {
            let (worker, row) = (worker.clone(), row.clone());
            tokio::spawn(async move {
                spin_until(append_start);
                let took = std::time::Instant::now();
                (
                    worker.append_fenced(&fence, vec![row]).await,
                    took.elapsed(),
                )
            })
        };
        let takeover = {
            let (taker, key, id) = (taker.clone(), key.clone(), row.id());
            tokio::spawn(async move {
                spin_until(takeover_start);
                let took = std::time::Instant::now();
                assert!(
                    taker.release(&key, "a", epoch).await.expect("release"),
                    "the live claim was not released"
                );
                let won = taker.acquire(&key, "b", ttl).await.expect("acquire");
                assert!(won.won(), "a released claim was not taken: {won:?}");
                assert!(won.state().epoch > epoch);
                // What the new holder sees the moment it holds the claim.
                let seen = taker.get(id).await.expect("get").is_some();
                (seen, took.elapsed())
            })
        };
        let (appended, append_took) = append.await.expect("join");
        let (seen_by_new_holder, takeover_took) = takeover.await.expect("join");
        span = append_took.max(takeover_took);
        match appended {
            Ok(out) => {
                assert!(out[0].inserted);
                assert!(
                    seen_by_new_holder,
                    "round {round}: a fenced append landed after its epoch was taken over"
                );
                landed += 1;
            }
            Err(StoreError::Fenced { .. }) => {
                assert!(
                    worker.get(row.id()).await.expect("get").is_none(),
                    "round {round}: a refused append wrote its row"
                );
                refused += 1;
            }
            Err(e) => panic!("round {round}: fenced append failed: {e}"),
        }
        round += 1;
    }
    eprintln!("fenced race: {round} rounds, {landed} appends landed, {refused} refused");
    let (rows, _, _) = read_all(&*b.store(), Position::START).await;
    assert_eq!(
        rows.len(),
        landed,
        "exactly the appends that landed are stored"
    );
}

/// A subscription on one handle wakes up for appends made on another, promptly
/// (well before the fallback poll): each append is made only after the subscriber
/// has caught up and is waiting.
pub async fn subscription_wakes_on_append_from_another_handle(b: &impl TestBackend) {
    let reader = b.reopen("reader").await.expect("reopen");
    assert!(
        reader.poll_interval() >= Duration::from_secs(30),
        "reopen must give a long fallback poll"
    );
    let mut sub = Subscription::new(reader, Position::START, 100);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Errors go to the test through the channel: once the test is over (the runtime
    // shutting down cancels the store's blocking reads) nobody is listening.
    let follower = tokio::spawn(async move {
        loop {
            let batch = match sub.next().await {
                Ok(batch) => batch,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            for row in batch.rows {
                if tx.send(Ok(row.body["text"].clone())).is_err() {
                    return;
                }
            }
        }
    });
    let writer = b.store();
    for i in 0..3 {
        writer
            .append(vec![message("r", "w", &i.to_string())])
            .await
            .expect("append");
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the subscription did not wake up for a new row")
            .expect("follower alive")
            .expect("the subscription failed");
        assert_eq!(got, json!(i.to_string()));
    }
    follower.abort();
}

/// Claims are listed by key prefix, in key order, with liveness by the database clock.
pub async fn claims_are_listed_by_prefix(b: &impl TestBackend) {
    let s = b.store();
    let ttl = Duration::from_secs(30);
    for key in ["task/r/b", "task/r/a", "reply/r/m1"] {
        assert!(s.acquire(key, "h", ttl).await.expect("acquire").won());
    }
    let tasks = s.list_claims("task/").await.expect("list");
    let keys: Vec<_> = tasks.iter().map(|c| c.state.key.as_str()).collect();
    assert_eq!(keys, vec!["task/r/a", "task/r/b"]);
    assert!(tasks.iter().all(|c| c.live));
    assert_eq!(s.list_claims("").await.expect("list").len(), 3);
    // A prefix with LIKE wildcards is matched literally.
    assert!(s.list_claims("task/%").await.expect("list").is_empty());
    assert!(s.list_claims("task/_/").await.expect("list").is_empty());
    // The edges of a prefix's range, byte order (upper case before lower, a longer
    // key after its prefix), keys beyond ASCII, and an exact key as the prefix.
    for key in [
        "task0",
        "tas",
        "task/r/B",
        "task/r/a/2",
        "task/ü/x",
        "task/r/\u{10FFFF}",
    ] {
        assert!(s.acquire(key, "h", ttl).await.expect("acquire").won());
    }
    let keys =
        |rows: Vec<ClaimRow>| -> Vec<String> { rows.into_iter().map(|c| c.state.key).collect() };
    assert_eq!(
        keys(s.list_claims("task/").await.expect("list")),
        vec![
            "task/r/B",
            "task/r/a",
            "task/r/a/2",
            "task/r/b",
            "task/r/\u{10FFFF}",
            "task/ü/x"
        ]
    );
    assert_eq!(
        keys(s.list_claims("task/r/a").await.expect("list")),
        vec!["task/r/a", "task/r/a/2"]
    );
    assert_eq!(
        keys(s.list_claims("task/ü").await.expect("list")),
        vec!["task/ü/x"]
    );
    assert_eq!(
        keys(s.list_claims("task/r/\u{10FFFF}").await.expect("list")),
        vec!["task/r/\u{10FFFF}"]
    );
    assert_eq!(
        keys(s.list_claims("task0").await.expect("list")),
        vec!["task0"]
    );
    assert_eq!(s.list_claims("").await.expect("list").len(), 9);
}

/// Set in the child process of [`a_commit_in_another_process_wakes_a_subscriber`]: the
/// database URL the child appends to.
pub const CHILD_URL_ENV: &str = "HUDDLE_CONFORMANCE_CHILD_URL";

/// The relay name the child process writes under.
const CHILD_RELAY: &str = "child-process";

/// The row the child process appends.
fn child_row() -> NewInteraction {
    message("lobby", "child", "from another process")
}

/// In the child process of [`a_commit_in_another_process_wakes_a_subscriber`] (when
/// [`CHILD_URL_ENV`] is set): opens the database, appends one row, makes sure its
/// doorbell went out, and returns `true`. Elsewhere returns `false` at once.
pub async fn child_role() -> bool {
    let Ok(url) = std::env::var(CHILD_URL_ENV) else {
        return false;
    };
    let options = StoreOptions {
        relay: CHILD_RELAY.into(),
        ..StoreOptions::default()
    };
    let store = crate::open(&url, options).await.expect("child open");
    let out = store.append(vec![child_row()]).await.expect("child append");
    assert!(out[0].inserted);
    store.flush().await;
    true
}

/// The next step of `steps`, within a bound.
async fn next_step(steps: &mut crate::Reader) -> crate::ReadStep {
    tokio::time::timeout(Duration::from_secs(10), steps.recv())
        .await
        .expect("a step in time")
        .expect("read")
}

/// A spawned reader that has caught up and waits for its doorbell answers
/// [`crate::Reader::refresh`] with one more step: empty, caught up, from a read that
/// began after the request (so its caller knows nothing committed before that moment
/// is left unread). Rows appended meanwhile come in that step.
pub async fn a_refreshed_reader_reports_a_read_that_began_after_the_request(b: &impl TestBackend) {
    let s = b.store();
    s.append(vec![message("r", "a", "before")])
        .await
        .expect("append");
    let reader = b.reopen("reader").await.expect("reopen");
    let mut steps =
        Subscription::new(reader, Position::START, 10).spawn(4, Duration::from_millis(50));
    let first = next_step(&mut steps).await;
    assert_eq!(first.batch.rows.len(), 1);
    assert!(first.caught_up);
    // Idle and caught up: no step until asked (the fallback poll is far off).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), steps.recv())
            .await
            .is_err(),
        "an idle reader sends nothing by itself"
    );
    for _ in 0..2 {
        let asked = std::time::Instant::now();
        steps.refresh();
        let fresh = next_step(&mut steps).await;
        assert!(fresh.caught_up && fresh.batch.rows.is_empty(), "{fresh:?}");
        assert!(fresh.began.is_some_and(|t| t >= asked), "{fresh:?}");
    }
    let asked = std::time::Instant::now();
    s.append(vec![message("r", "a", "after")])
        .await
        .expect("append");
    steps.refresh();
    let mut rows = Vec::new();
    let mut began = None;
    while rows.is_empty() || began.is_none_or(|t| t < asked) {
        let step = next_step(&mut steps).await;
        rows.extend(step.batch.rows);
        began = step.began;
    }
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].body["text"], json!("after"));
}

/// A real second process (this test binary, re-run in a child role) appends a row;
/// this process's doorbell rings through the backend's cross-process path (SQLite's
/// change watcher, Postgres's LISTEN connection), not the fallback poll, and a
/// subscription picks the row up.
pub async fn a_commit_in_another_process_wakes_a_subscriber(b: &impl TestBackend) {
    let url = b
        .url()
        .expect("a backend run across processes must give a URL");
    let reader = b.reopen("reader").await.expect("reopen");
    let mut sub = Subscription::new(reader.clone(), Position::START, 10);
    assert!(sub.poll_once().await.expect("read").rows.is_empty());
    let mut bell = reader.doorbell();
    bell.borrow_and_update();

    let exe = std::env::current_exe().expect("test binary path");
    let child = tokio::process::Command::new(exe)
        .args([
            "--exact",
            "a_commit_in_another_process_wakes_a_subscriber",
            "--test-threads=1",
        ])
        .env(CHILD_URL_ENV, url)
        .output()
        .await
        .expect("run the child process");
    assert!(
        child.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    // Nothing in this process appended, so only the cross-process path can ring.
    tokio::time::timeout(Duration::from_secs(10), bell.changed())
        .await
        .expect("no doorbell for another process's commit")
        .expect("bell open");
    let batch = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("subscription did not wake")
        .expect("next");
    assert_eq!(batch.rows.len(), 1);
    assert_eq!(batch.rows[0].id, child_row().id());
    assert_eq!(batch.rows[0].relay, b.recorded_relay(CHILD_RELAY));
}
