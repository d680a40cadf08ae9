//! Start-up independent of history (plan 0057): a relay reads only the rooms it
//! serves, and an owner archives a settled room — exported, verified, removed from
//! the ledger but for its `room.archived` row — after which nothing can use the room
//! and relays refuse to serve it. Both backends, with the real binary.

use crate::common;

use common::relays::*;
use common::{fails, huddle, keys_dir, ok, seed_tasks};
use huddle_core::{Interaction, NewInteraction, Position, Role, Verb};
use huddle_store::Store;
use serde_json::json;

on_both_backends!(
    a_relay_reads_only_the_rooms_it_serves,
    an_owner_archives_a_settled_room_for_good,
);

/// Appends `count` messages to `room`, 500 per batch.
async fn fill(store: &dyn Store, room: &str, from: usize, count: usize) {
    let rows: Vec<NewInteraction> = (from..from + count)
        .map(|i| {
            NewInteraction::new(
                room,
                Verb::MessagePosted,
                "chatter",
                Role::Human,
                json!({ "text": format!("row {i} of a room nobody here serves") }),
            )
        })
        .collect();
    for chunk in rows.chunks(500) {
        store.append(chunk.to_vec()).await.expect("fill the room");
    }
}

/// Every row of `room`.
async fn rows_of(store: &dyn Store, room: &str) -> Vec<Interaction> {
    let mut rows = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await.expect("read");
        if batch.next == cursor {
            return rows;
        }
        cursor = batch.next;
        rows.extend(batch.rows);
    }
}

/// A relay serving the room while another room holds thousands of rows (written
/// before it started and while it runs) reads none of them: its reader delivers at
/// most the rows of its own room.
async fn a_relay_reads_only_the_rooms_it_serves(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    fill(&*h.store, "busy", 0, 4000).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("a0", 20)]);
    h.wait_registered(&["a0"]).await;
    fill(&*h.store, "busy", 4000, 2000).await;
    let m = h.post("hank", Role::Human, "@a0 are you there?").await;
    h.wait_until("a0's reply", secs(30), |l| !l.replies_to(m).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;
    let served = h.ledger.room_rows().count() as u64;
    let other = h.ledger.rows.iter().filter(|r| r.room == "busy").count();
    assert_eq!(other, 6000);
    let s = &summaries[0];
    assert!(
        s.rows_read > 0 && s.rows_read <= served,
        "the relay read {} rows; its room holds {served} (and another room {other}): {s:?}",
        s.rows_read
    );
}

/// `huddle room archive`: refused for a room that is not settled and for anyone but
/// the owner (with nothing written); for the owner of a settled room, the file holds
/// every row and verifies, the ledger keeps only the `room.archived` row and none of
/// the room's claims, the relay serving it stops, nothing can be posted there or the
/// room created again, a relay refuses to serve it, a tampered archive fails to
/// verify, and the stopped relay's lease can be pruned.
async fn an_owner_archives_a_settled_room_for_good(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("a0", 20)]);
    h.wait_registered(&["a0"]).await;
    h.delegate("t1: first\nt2: second [after t1]").await;
    h.wait_until("both tasks done", secs(60), |l| l.summary().done == 2)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.wait_until("the room recorded settled", secs(30), |l| {
        l.of_verb(Verb::RoomSettled).count() > 0
    })
    .await;
    let db = h.db.url.clone();
    let file = h.dir().join("lobby.jsonl");
    let archive = |room: &str, extra: &[&str]| {
        let mut c = huddle(&db);
        c.args(["room", "archive", room, "--to"])
            .arg(&file)
            .args(extra);
        c
    };

    // A room with a ready task nobody has done is not settled.
    seed_tasks(&db, "open", &[("u1".to_string(), Vec::new())], 60_000).await;
    let err = fails(archive("open", &[]));
    assert!(err.contains("room open is not settled"), "{err}");
    // Only the owner archives, with the room's key.
    let err = fails(archive("lobby", &["--owner", "mallory"]));
    assert!(err.contains("owned by olga, not mallory"), "{err}");
    let other_key = keys_dir().join("ana.key");
    let err = fails(archive(
        "lobby",
        &["--key", other_key.to_str().expect("path")],
    ));
    assert!(err.contains("is not room lobby's owner key"), "{err}");
    assert!(!file.exists(), "a refused archive leaves no file");
    assert!(rows_of(&*h.store, "open").await.len() > 1);

    let before = rows_of(&*h.store, "lobby").await;
    let out = ok(archive("lobby", &[]));
    assert!(out.contains("room lobby archived to"), "{out}");
    // The relay serving only that room stops by itself.
    let summary = h.relay("r0").wait_summary(secs(30));
    assert_eq!(summary.results_lost, 0, "{summary:?}");

    // The file holds every row (those written since `before` too) and verifies.
    let verified = ok({
        let mut c = huddle(&db);
        c.args(["room", "verify-archive", "--json"]).arg(&file);
        c
    });
    let verified: serde_json::Value = serde_json::from_str(&verified).expect("JSON");
    let archived_rows = verified["rows"].as_u64().expect("rows");
    assert!(archived_rows >= before.len() as u64, "{verified}");
    assert_eq!(verified["room"], "lobby");
    assert_eq!(verified["owner"], "olga");
    let text = std::fs::read_to_string(&file).expect("read the archive");
    assert_eq!(text.lines().count() as u64, archived_rows + 1);
    let ids: Vec<String> = before.iter().map(|r| r.id.to_string()).collect();
    assert!(ids.iter().all(|id| text.contains(id.as_str())));

    // The ledger keeps only the room.archived row; the room's claims are gone.
    let left = rows_of(&*h.store, "lobby").await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].verb, Verb::RoomArchived);
    assert_eq!(left[0].id.to_string(), verified["archived"]);
    let claims = h.store.list_claims("").await.expect("claims");
    assert!(
        claims
            .iter()
            .all(|c| huddle_core::protocol::room_of_claim(&c.state.key) != Some("lobby")),
        "{claims:?}"
    );
    assert!(
        rows_of(&*h.store, "open").await.len() > 1,
        "other rooms keep theirs"
    );

    let list = ok({
        let mut c = huddle(&db);
        c.args(["room", "list"]);
        c
    });
    assert!(list.contains("lobby  archived"), "{list}");

    // Nothing uses the room again.
    let err = fails({
        let mut c = huddle(&db);
        c.args(["post", "--room", "lobby", "--as", "olga", "anyone here?"]);
        c
    });
    assert!(err.contains("was archived by its owner olga"), "{err}");
    let err = fails({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    assert!(err.contains("archived"), "{err}");
    let err = h
        .store
        .append(vec![NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "hank",
            Role::Human,
            json!({"text": "straight to the database"}),
        )])
        .await
        .expect_err("the database refuses rows of an archived room");
    assert!(err.to_string().contains("archived"), "{err}");
    h.spawn_relay("r1", vec![AgentSpec::sim("a1", 20)]);
    let status = h.relay("r1").wait_exit(secs(30));
    assert!(!status.success());
    let log = h.relay("r1").log_tail(20);
    assert!(
        log.contains("room \"lobby\" was archived by its owner olga"),
        "{log}"
    );

    // A tampered archive does not verify.
    let tampered = h.dir().join("tampered.jsonl");
    std::fs::write(&tampered, text.replacen("t1: first", "t1: FIRST", 1)).expect("write");
    let err = fails({
        let mut c = huddle(&db);
        c.args(["room", "verify-archive"]).arg(&tampered);
        c
    });
    assert!(err.contains("not the hash of its content"), "{err}");

    // The stopped relay's lease is pruned; nothing else is.
    let out = ok({
        let mut c = huddle(&db);
        c.args(["admin", "prune-claims", "--older-than", "0"]);
        c
    });
    assert!(
        out.contains("pruned 1 relay leases") && out.contains("0 claims of archived rooms"),
        "{out}"
    );
}
