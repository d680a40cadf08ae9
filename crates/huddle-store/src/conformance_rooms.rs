//! Conformance: reading several rooms, archiving a room, pruning claims (plan 0057).

use std::time::Duration;

use huddle_core::protocol::{ArchiveDigest, RoomArchivedBody};
use huddle_core::{Interaction, NewInteraction, Position, Role, Verb};
use serde_json::json;

use super::{message, read_all, settled, wait_for_db_time, TestBackend, Writers};
use crate::error::StoreError;
use crate::traits::{Acquired, ArchiveRefusal, ArchiveRequest, Fence, Store};

/// Every row of `rooms` after `after`, read with [`crate::Ledger::read_rooms`] pages of
/// `page`, for rows committed before the call: checks that the cursor never goes back
/// and no page is over-full. A read that finds nothing is tried once more a moment
/// later before the rows are taken as all read: on Postgres a row can be held back for
/// a moment behind the read horizon by a transaction that had just ended when the
/// read's snapshot was taken (it is read on the next pass, as a subscription would).
async fn read_rooms_all(
    store: &dyn Store,
    rooms: &[String],
    after: Position,
    page: usize,
) -> (Vec<Interaction>, Position) {
    let mut rows = Vec::new();
    let mut cursor = after;
    let mut empty = 0;
    loop {
        let batch = settled(|| store.read_rooms(rooms, cursor, page)).await;
        assert!(batch.next >= cursor, "cursor went backwards");
        let n = batch.rows.len() + batch.skipped.len();
        assert!(n <= page, "a page of {page} returned {n} rows");
        cursor = batch.next;
        rows.extend(batch.rows);
        if n > 0 {
            empty = 0;
            continue;
        }
        empty += 1;
        if empty == 2 {
            return (rows, cursor);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(rooms: &[&str]) -> Vec<String> {
    rooms.iter().map(|r| r.to_string()).collect()
}

/// A multi-room read returns exactly the rows of those rooms, once each, in ledger
/// order, for any page size; repeated names change nothing; no rooms, no rows.
pub async fn read_rooms_reads_only_those_rooms_in_order(b: &impl TestBackend) {
    let s = b.store();
    for i in 0..12 {
        let mut batch = vec![message("a", "ana", &format!("a{i}"))];
        if i % 3 == 0 {
            batch.push(message("b", "bo", &format!("b{i}")));
            batch.push(message("c", "cy", &format!("c{i}")));
        } else {
            batch.push(message("b", "bo", &format!("b{i}")));
        }
        s.append(batch).await.expect("append");
    }
    for i in 0..5 {
        s.append(vec![message("c", "cy", &format!("late c{i}"))])
            .await
            .expect("append");
    }
    let (all, _, end) = read_all(&*s, Position::START).await;
    for wanted in [names(&["a", "c"]), names(&["c", "a", "c"]), names(&["b"])] {
        let expected: Vec<_> = all
            .iter()
            .filter(|r| wanted.contains(&r.room))
            .map(|r| r.id)
            .collect();
        for page in [1, 2, 7, 100] {
            let (rows, cursor) = read_rooms_all(&*s, &wanted, Position::START, page).await;
            assert_eq!(
                rows.iter().map(|r| r.id).collect::<Vec<_>>(),
                expected,
                "rooms {wanted:?}, page {page}"
            );
            let last = all
                .iter()
                .filter(|r| wanted.contains(&r.room))
                .map(|r| r.position)
                .max()
                .expect("rows");
            assert_eq!(cursor, last, "the cursor ends at the rooms' last row");
        }
        // From the middle: only what follows.
        let middle = all[all.len() / 2].position;
        let (rows, _) = read_rooms_all(&*s, &wanted, middle, 3).await;
        let tail: Vec<_> = all
            .iter()
            .filter(|r| r.position > middle && wanted.contains(&r.room))
            .map(|r| r.id)
            .collect();
        assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), tail);
    }
    for empty in [Vec::new(), names(&["nobody"])] {
        let batch = s
            .read_rooms(&empty, Position::START, 10)
            .await
            .expect("read_rooms");
        assert!(batch.rows.is_empty() && batch.skipped.is_empty());
        assert_eq!(batch.next, Position::START);
    }
    let batch = s
        .read_rooms(&names(&["a"]), end, 10)
        .await
        .expect("read_rooms");
    assert!(batch.rows.is_empty());
    assert_eq!(batch.next, end);
}

/// The out-of-order commit case for a multi-room read: a lower-sequence append to one
/// of the rooms held open while a later one (to another of the rooms, and to a room
/// not read) commits. A read in between returns nothing and keeps its cursor; after
/// the held commit both rows come back once, the held one first.
pub async fn read_rooms_never_skips_a_lower_sequence_that_commits_last(b: &impl TestBackend) {
    let s = b.store();
    let rooms = names(&["a", "c"]);
    s.append(vec![message("a", "ana", "before")])
        .await
        .expect("append");
    let (before, cursor) = read_rooms_all(&*s, &rooms, Position::START, 10).await;
    assert_eq!(before.len(), 1);

    let slow = message("a", "slow", "takes the lower sequence");
    let fast = message("c", "fast", "commits first");
    let other = message("b", "fast", "another room commits first too");
    let writer_store = b.reopen("fast-writer").await.expect("reopen");
    let held = b.hold_append(vec![slow.clone()]).await.expect("hold");
    let rows = vec![other.clone(), fast.clone()];
    let mut writer = tokio::spawn(async move {
        for row in rows {
            writer_store.append(vec![row]).await?;
        }
        Ok::<_, StoreError>(())
    });
    if b.writers() == Writers::Concurrent {
        tokio::time::timeout(Duration::from_secs(10), &mut writer)
            .await
            .expect("a concurrent writer waited for the held transaction")
            .expect("join")
            .expect("fast appends");
    }
    let batch = s.read_rooms(&rooms, cursor, 100).await.expect("read");
    assert!(
        batch.rows.is_empty() && batch.skipped.is_empty(),
        "read past a transaction that is still open: {:?}",
        batch.rows
    );
    assert_eq!(
        batch.next, cursor,
        "the cursor moved past an open transaction"
    );
    held.commit().await.expect("commit held");
    if b.writers() == Writers::Serialized {
        writer.await.expect("join").expect("fast appends");
    }
    let (seen, _) = read_rooms_all(&*s, &rooms, cursor, 100).await;
    assert_eq!(
        seen.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![slow.id(), fast.id()],
        "every row of the rooms exactly once, the held (lower) one first"
    );
}

/// The `room.archived` row an owner leaves for `rows` (unsigned: the store checks
/// only its shape; readers check the signature).
fn archived_row(room: &str, rows: &[Interaction]) -> NewInteraction {
    let mut digest = ArchiveDigest::new();
    for r in rows {
        digest.add(&r.id);
    }
    let body = RoomArchivedBody {
        owner: "olga".into(),
        rows: digest.rows(),
        digest: digest.hex(),
    };
    NewInteraction::new(
        room,
        Verb::RoomArchived,
        "olga",
        Role::Owner,
        body.to_body(),
    )
}

fn created(room: &str) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::RoomCreated,
        "olga",
        Role::Owner,
        json!({"owner": "olga"}),
    )
}

/// Every row of `room`.
async fn room_rows(store: &dyn Store, room: &str) -> Vec<Interaction> {
    read_rooms_all(store, &names(&[room]), Position::START, 50)
        .await
        .0
}

/// Archiving removes every row of the room but its `room.archived` row, and its
/// claims; other rooms keep theirs; the room is closed to every later row; readers
/// keep reading forward without a gap, and new rows come after the archived one.
pub async fn archive_removes_a_room_and_leaves_its_row(b: &impl TestBackend) {
    let s = b.store();
    s.append(vec![created("old"), created("kept")])
        .await
        .expect("append");
    for i in 0..20 {
        s.append(vec![
            message("old", "ana", &format!("old {i}")),
            message("kept", "ana", &format!("kept {i}")),
        ])
        .await
        .expect("append");
    }
    // A finished task of the old room: its claim closed. A claim of the kept room.
    let won = s
        .acquire("task/old/t1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire");
    let fence = Fence {
        key: "task/old/t1".into(),
        holder: "ada".into(),
        epoch: won.state().epoch,
    };
    s.append_under(&[fence], true, vec![message("old", "ada", "done")])
        .await
        .expect("closing append");
    s.acquire("task/kept/t1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire");
    let (_, _, reader_cursor) = read_all(&*s, Position::START).await;
    let kept_before = room_rows(&*s, "kept").await;

    let rows = room_rows(&*s, "old").await;
    assert_eq!(rows.len(), 22);
    let archived = archived_row("old", &rows);
    let out = s
        .archive_room(ArchiveRequest {
            rows: rows.len() as u64,
            archived: archived.clone(),
        })
        .await
        .expect("archive");
    assert_eq!(out.id, archived.id());
    assert_eq!(out.rows_removed, 22);
    assert_eq!(out.claims_removed, 1);

    let left = room_rows(&*s, "old").await;
    assert_eq!(
        left.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![archived.id()],
        "only the room.archived row is left"
    );
    assert_eq!(left[0].verb, Verb::RoomArchived);
    assert!(
        left[0].position > rows.last().expect("rows").position,
        "the archived row comes after every row it replaced"
    );
    assert_eq!(room_rows(&*s, "kept").await, kept_before);
    assert!(s.list_claims("task/old/").await.expect("list").is_empty());
    assert_eq!(s.list_claims("task/kept/").await.expect("list").len(), 1);

    // Closed to every later row, on any handle; the archived row itself dedupes.
    let other = b.reopen("second").await.expect("reopen");
    for store in [&s, &other] {
        for row in [
            message("old", "ana", "back again?"),
            created("old"),
            rows[3].content(),
        ] {
            let err = store.append(vec![row]).await.expect_err("an archived room");
            assert!(err.to_string().contains("archived"), "{err}");
        }
    }
    let again = s.append(vec![archived.clone()]).await.expect("dedupe");
    assert!(!again[0].inserted);
    // A room.archived row comes only from an archive: appended to a live room it
    // would make relays stop serving it.
    let forged = archived_row("kept", &kept_before);
    let err = other
        .append(vec![forged])
        .await
        .expect_err("a room.archived row outside an archive");
    assert!(err.to_string().contains("only by archiving"), "{err}");

    // A reader that had read up to before the archive goes on without a gap: the
    // archived row, then rows appended since.
    let fresh = message("kept", "ana", "after the archive");
    s.append(vec![fresh.clone()]).await.expect("append");
    let (next, _, _) = read_all(&*other, reader_cursor).await;
    assert_eq!(
        next.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![archived.id(), fresh.id()]
    );
    let (all, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(all.iter().filter(|r| r.room == "old").count(), 1);
    assert_eq!(all.iter().filter(|r| r.room == "kept").count(), 22);
}

/// An archive is refused, changing nothing, when the room changed since its export,
/// has a live claim, does not exist, is archived already, or the row is not a
/// `room.archived` row recording the count.
pub async fn archive_refuses_a_changed_room_or_live_claims(b: &impl TestBackend) {
    let s = b.store();
    s.append(vec![created("busy"), message("busy", "ana", "hello")])
        .await
        .expect("append");
    let rows = room_rows(&*s, "busy").await;
    let refusal = |r: crate::Result<crate::ArchiveOutcome>| match r {
        Err(StoreError::ArchiveRefused { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // A row appended after the export.
    s.append(vec![message("busy", "ana", "one more")])
        .await
        .expect("append");
    let reason = refusal(
        s.archive_room(ArchiveRequest {
            rows: rows.len() as u64,
            archived: archived_row("busy", &rows),
        })
        .await,
    );
    assert_eq!(
        reason,
        ArchiveRefusal::Changed {
            exported: 2,
            now: 3
        }
    );
    let rows = room_rows(&*s, "busy").await;
    // A live claim of the room.
    let won = s
        .acquire("reply/busy/m1", "ada", Duration::from_secs(30))
        .await
        .expect("acquire");
    let reason = refusal(
        s.archive_room(ArchiveRequest {
            rows: rows.len() as u64,
            archived: archived_row("busy", &rows),
        })
        .await,
    );
    assert_eq!(
        reason,
        ArchiveRefusal::LiveClaims(vec!["reply/busy/m1".to_string()])
    );
    // A row that does not record the count, or is not a room.archived row.
    let mut wrong = archived_row("busy", &rows);
    wrong.body["rows"] = json!(99);
    assert!(matches!(
        refusal(
            s.archive_room(ArchiveRequest {
                rows: rows.len() as u64,
                archived: wrong,
            })
            .await
        ),
        ArchiveRefusal::BadRow(_)
    ));
    assert!(matches!(
        refusal(
            s.archive_room(ArchiveRequest {
                rows: 1,
                archived: message("busy", "olga", "{\"rows\":1}"),
            })
            .await
        ),
        ArchiveRefusal::BadRow(_)
    ));
    // No such room (rows without a room.created are not a room).
    s.append(vec![message("stray", "ana", "no room here")])
        .await
        .expect("append");
    let stray = room_rows(&*s, "stray").await;
    assert_eq!(
        refusal(
            s.archive_room(ArchiveRequest {
                rows: 1,
                archived: archived_row("stray", &stray),
            })
            .await
        ),
        ArchiveRefusal::NoRoom
    );
    // Nothing changed.
    assert_eq!(room_rows(&*s, "busy").await, rows);
    assert_eq!(s.list_claims("reply/busy/").await.expect("list").len(), 1);

    // Released, it is archived; then once only.
    assert!(s
        .release("reply/busy/m1", "ada", won.state().epoch)
        .await
        .expect("release"));
    s.archive_room(ArchiveRequest {
        rows: rows.len() as u64,
        archived: archived_row("busy", &rows),
    })
    .await
    .expect("archive once released");
    assert_eq!(
        refusal(
            s.archive_room(ArchiveRequest {
                rows: 0,
                archived: archived_row("busy", &[]),
            })
            .await
        ),
        ArchiveRefusal::Archived
    );
}

/// Pruning removes relay leases expired for longer than asked and every claim of an
/// archived room, and nothing else: live or recently expired relay leases, and every
/// claim of a live room (open, expired or closed) keep their rows and epochs. A pruned
/// relay id is taken again from epoch 1.
pub async fn prune_removes_only_what_can_never_matter(b: &impl TestBackend) {
    let s = b.store();
    let short = Duration::from_millis(1);
    let long = Duration::from_secs(60);
    let gone = s
        .acquire("relay/gone", "gone@h/pid1/x", short)
        .await
        .expect("acquire");
    s.acquire("relay/alive", "alive@h/pid2/y", long)
        .await
        .expect("acquire");
    for key in [
        "task/live/t1",
        "lease/live/coordinator",
        "resource/live/ada/exclusive/api:x",
    ] {
        s.acquire(key, "ada", short).await.expect("acquire");
    }
    let done = s
        .acquire("task/live/t2", "ada", long)
        .await
        .expect("acquire");
    s.append_under(
        &[Fence {
            key: "task/live/t2".into(),
            holder: "ada".into(),
            epoch: done.state().epoch,
        }],
        true,
        vec![message("live", "ada", "t2 done")],
    )
    .await
    .expect("closing append");
    // An archived room, and a claim taken in it afterwards.
    s.append(vec![created("gone-room")]).await.expect("append");
    let rows = room_rows(&*s, "gone-room").await;
    s.archive_room(ArchiveRequest {
        rows: 1,
        archived: archived_row("gone-room", &rows),
    })
    .await
    .expect("archive");
    s.acquire("task/gone-room/t1", "ada", long)
        .await
        .expect("acquire");
    wait_for_db_time(&*s, gone.state().expires_at).await;

    // Not old enough yet: only the archived room's claim goes.
    let pruned = s
        .prune_claims(Duration::from_secs(3600))
        .await
        .expect("prune");
    assert_eq!((pruned.relay_leases, pruned.archived_rooms), (0, 1));
    let keys = |rows: Vec<crate::ClaimRow>| -> Vec<String> {
        rows.into_iter().map(|r| r.state.key).collect()
    };
    let before = keys(s.list_claims("").await.expect("list"));
    assert!(before.contains(&"relay/gone".to_string()));

    let pruned = s.prune_claims(Duration::ZERO).await.expect("prune");
    assert_eq!((pruned.relay_leases, pruned.archived_rooms), (1, 0));
    let after = keys(s.list_claims("").await.expect("list"));
    assert_eq!(
        after,
        vec![
            "lease/live/coordinator".to_string(),
            "relay/alive".into(),
            "resource/live/ada/exclusive/api:x".into(),
            "task/live/t1".into(),
            "task/live/t2".into(),
        ]
    );
    assert!(s
        .acquire("task/live/t2", "bo", long)
        .await
        .expect("acquire")
        .closed());
    match s
        .acquire("relay/gone", "gone@h/pid3/z", long)
        .await
        .expect("acquire")
    {
        Acquired::Won(state) => assert_eq!(state.epoch.get(), 1),
        other => panic!("a pruned relay id is free: {other:?}"),
    }
}
