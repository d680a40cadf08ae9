//! Conformance: task lots (plan 0080) — one `task.lot` row read as its items, checked
//! item by item against their claims when it is inserted, all or nothing.

use std::time::Duration;

use huddle_core::{Interaction, Limits, NewInteraction, Position, RawRow, Role, Timestamp, Verb};
use serde_json::json;

use super::{message, read_all, settled, TestBackend};
use crate::traits::{Epoch, Fence, Store};

const TTL: Duration = Duration::from_secs(30);

fn task_row(verb: Verb, task: &str, agent: &str, epoch: Epoch) -> NewInteraction {
    NewInteraction::new(
        "r",
        verb,
        agent,
        Role::Agent,
        json!({ "task": task, "epoch": epoch.get() }),
    )
}

fn turn_row(
    verb: Verb,
    task: &str,
    agent: &str,
    parent: Option<&NewInteraction>,
) -> NewInteraction {
    let row = NewInteraction::new(
        "r",
        verb,
        agent,
        Role::Agent,
        json!({ "turn": format!("{task}-turn"), "text": "x" }),
    );
    match parent {
        Some(p) => row.with_parent(p.id()),
        None => row,
    }
}

fn lot(items: &[NewInteraction]) -> NewInteraction {
    NewInteraction::lot("r", "relay-a", items, &Limits::default()).expect("a valid lot")
}

/// Takes `task/r/<task>` for `agent`, returning its fence.
async fn take(s: &dyn Store, task: &str, agent: &str) -> Fence {
    let key = format!("task/r/{task}");
    let got = s.acquire(&key, agent, TTL).await.expect("acquire");
    assert!(got.won(), "{key} is free");
    Fence {
        key,
        holder: agent.into(),
        epoch: got.state().epoch,
    }
}

fn ids(rows: &[Interaction]) -> Vec<huddle_core::InteractionId> {
    rows.iter().map(|r| r.id).collect()
}

/// A task row of `verb` carrying its turn (plan 0095, `compact-turns`): the body of
/// the turn row it stands for (`turn.prompted` for a claim, `turn.replied` for a
/// completion) as an object in its `turn` member.
fn carrying_turn(verb: Verb, task: &str, agent: &str, e: Epoch) -> NewInteraction {
    let mut row = task_row(verb, task, agent, e);
    let mut turn = json!({"turn": format!("t/r/{task}/{agent}/{e}.{e}", e = e.get()),
                          "subject": {"kind": "task", "id": task, "label": "Build ✓"},
                          "epoch": e.get()});
    if verb == Verb::TaskClaimed {
        turn["drive_epoch"] = json!(e.get());
    } else {
        turn["tokens"] = json!(12);
        turn["activity"] = json!({"tool_calls": 1, "tools": [
            {"title": "Read a.rs", "kind": "read", "status": "completed"}]});
    }
    row.body["turn"] = turn;
    row
}

/// A compact room's lots (plan 0095): task items only, each carrying its turn's body.
/// They are checked like any lot (under their claims) and read back item for item as
/// written, the carried turns intact; a carried turn does not let an item past its
/// fence.
pub async fn a_lot_of_task_rows_carrying_their_turns_reads_back_whole(b: &impl TestBackend) {
    let s = b.store();
    let f1 = take(&*s, "t1", "ada").await;
    let f2 = take(&*s, "t2", "bo").await;
    let both = |verb| {
        vec![
            carrying_turn(verb, "t1", "ada", f1.epoch),
            carrying_turn(verb, "t2", "bo", f2.epoch),
        ]
    };
    let (handoff, done) = (both(Verb::TaskClaimed), both(Verb::TaskCompleted));
    let fences = [f1.clone(), f2.clone()];
    s.append_under(&fences, false, vec![lot(&handoff)])
        .await
        .expect("the lot is under its claims");
    s.append_under(&fences, true, vec![lot(&done)])
        .await
        .expect("the closing lot is under its claims");
    let (rows, skipped, _) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 0);
    let written: Vec<&NewInteraction> = handoff.iter().chain(&done).collect();
    assert_eq!(rows.len(), written.len());
    for (got, item) in rows.iter().zip(written) {
        assert_eq!(
            got.content(),
            *item,
            "an item reads back as written, its turn intact"
        );
        assert_eq!(got.id, item.id());
        assert!(got.body["turn"].is_object());
    }
    // A carried turn is no fence: a task item under a claim its actor does not hold
    // is refused with its whole lot.
    let f3 = take(&*s, "t3", "cy").await;
    let forged = carrying_turn(Verb::TaskClaimed, "t3", "mallory", f3.epoch);
    let refused = s.append_under(&[f3], false, vec![lot(&[forged])]).await;
    assert!(
        refused.is_err(),
        "a lot with an item under another's claim: {refused:?}"
    );
    let (after, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(
        after.len(),
        rows.len(),
        "nothing of the refused lot was written"
    );
}

/// A lot written under its items' claims reads back as its items, in order, in its
/// place among the rows around it, each with the id of its own row and the lot's
/// position; a store read of the room's rows returns the lot itself. A closing lot
/// closes every claim it is fenced by, and its retry writes nothing.
pub async fn a_lot_reads_as_its_items_in_its_place(b: &impl TestBackend) {
    let s = b.store();
    let before = message("r", "ana", "before");
    s.append(vec![before.clone()]).await.expect("append");
    let f1 = take(&*s, "t1", "ada").await;
    let f2 = take(&*s, "t2", "bo").await;
    let c1 = task_row(Verb::TaskClaimed, "t1", "ada", f1.epoch);
    let p1 = turn_row(Verb::TurnPrompted, "t1", "ada", Some(&c1));
    let c2 = task_row(Verb::TaskClaimed, "t2", "bo", f2.epoch);
    let p2 = turn_row(Verb::TurnPrompted, "t2", "bo", Some(&c2));
    let handoff = vec![c1, p1.clone(), c2, p2.clone()];
    let fences = [f1.clone(), f2.clone()];
    let out = s
        .append_under(&fences, false, vec![lot(&handoff)])
        .await
        .expect("the lot is under its claims");
    assert_eq!(out.len(), 1);
    assert!(out[0].inserted);
    let done = vec![
        task_row(Verb::TaskCompleted, "t1", "ada", f1.epoch),
        turn_row(Verb::TurnReplied, "t1", "ada", Some(&p1)),
        task_row(Verb::TaskCompleted, "t2", "bo", f2.epoch),
        turn_row(Verb::TurnReplied, "t2", "bo", Some(&p2)),
    ];
    let closing = lot(&done);
    s.append_under(&fences, true, vec![closing.clone()])
        .await
        .expect("the closing lot is under its claims");
    let after = message("r", "ana", "after");
    s.append(vec![after.clone()]).await.expect("append");

    let (rows, skipped, _) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 0);
    let mut want = vec![before.id()];
    want.extend(handoff.iter().map(NewInteraction::id));
    want.extend(done.iter().map(NewInteraction::id));
    want.push(after.id());
    assert_eq!(ids(&rows), want, "items in order, in the lot's place");
    for (got, item) in rows[1..9].iter().zip(handoff.iter().chain(&done)) {
        assert_eq!(got.content(), *item, "an item reads back as written");
        assert_eq!(got.relay, rows[0].relay, "an item's writer is its lot's");
    }
    assert!(rows[1..5].iter().all(|r| r.position == rows[1].position));
    assert!(rows[5..9].iter().all(|r| r.position == rows[5].position));
    assert!(rows[0].position < rows[1].position && rows[1].position < rows[5].position);
    assert!(rows[5].position < rows[9].position);
    // The rooms' read sees the same.
    let rooms = ["r".to_string()];
    let batch = settled(|| s.read_rooms(&rooms, Position::START, 100)).await;
    assert_eq!(ids(&batch.rows), want);

    // As stored: four rows, the lots themselves.
    let stored = settled(|| s.read_room_rows("r", Position::START, 100)).await;
    assert_eq!(
        stored.rows.iter().map(|r| r.verb).collect::<Vec<_>>(),
        vec![
            Verb::MessagePosted,
            Verb::TaskLot,
            Verb::TaskLot,
            Verb::MessagePosted
        ]
    );
    assert_eq!(stored.rows[2].id, closing.id());
    assert_eq!(stored.next, batch.next);
    // `get` finds rows, not items.
    let got = s
        .get(closing.id())
        .await
        .expect("get")
        .expect("the lot row");
    assert_eq!(got.verb, Verb::TaskLot);
    assert!(s.get(done[0].id()).await.expect("get").is_none());

    // The closing lot closed both claims: neither can be taken again.
    for f in &fences {
        let again = s.acquire(&f.key, "carl", TTL).await.expect("acquire");
        assert!(!again.won(), "{} was closed by the lot", f.key);
    }
    // Its retry (an ambiguous commit) writes nothing and is not refused.
    let retry = s
        .append_under(&fences, true, vec![closing])
        .await
        .expect("a retried closing lot");
    assert!(!retry[0].inserted);
    let (again, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(ids(&again), want);
}

/// A lot is inserted only when every task item is under its claim (held by the
/// item's agent at the item's epoch, live): one item that is not refuses the whole
/// lot, with nothing written.
pub async fn a_lot_is_refused_whole_when_one_item_is_not_under_its_claim(b: &impl TestBackend) {
    let s = b.store();
    let f1 = take(&*s, "t1", "ada").await;
    let good = task_row(Verb::TaskClaimed, "t1", "ada", f1.epoch);
    let prompted = turn_row(Verb::TurnPrompted, "t1", "ada", Some(&good));
    let f2 = take(&*s, "t2", "bo").await;
    let bad_items = [
        (
            "a task nobody claimed",
            task_row(Verb::TaskClaimed, "t9", "ada", f1.epoch),
        ),
        (
            "another agent's claim",
            task_row(Verb::TaskCompleted, "t2", "ada", f2.epoch),
        ),
        (
            "the next epoch",
            task_row(Verb::TaskClaimed, "t2", "bo", Epoch(f2.epoch.get() + 1)),
        ),
        (
            "an earlier epoch",
            task_row(Verb::TaskFailed, "t2", "bo", Epoch(f2.epoch.get() - 1)),
        ),
        (
            "a generation nobody holds",
            NewInteraction::new(
                "r",
                Verb::TaskClaimed,
                "bo",
                Role::Agent,
                json!({ "task": "t2", "epoch": f2.epoch.get(), "generation": 3 }),
            ),
        ),
        (
            "no epoch",
            NewInteraction::new(
                "r",
                Verb::TaskCompleted,
                "bo",
                Role::Agent,
                json!({ "task": "t2" }),
            ),
        ),
    ];
    for (what, bad) in bad_items {
        let err = s
            .append(vec![lot(&[good.clone(), prompted.clone(), bad])])
            .await
            .expect_err(what);
        let text = err.to_string();
        assert!(
            text.contains("huddle:") && text.contains("refused"),
            "{what}: {text}"
        );
    }
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert!(rows.is_empty(), "a refused lot wrote {} rows", rows.len());
    // Under live claims a lot needs no fence of its own: the database checks each item.
    let ok = lot(&[
        good,
        prompted,
        task_row(Verb::TaskClaimed, "t2", "bo", f2.epoch),
    ]);
    s.append(vec![ok])
        .await
        .expect("every item under its claim");
    // Once the claim is released, the same item is refused.
    assert!(s.release(&f1.key, "ada", f1.epoch).await.expect("release"));
    let err = s
        .append(vec![lot(&[task_row(
            Verb::TaskCompleted,
            "t1",
            "ada",
            f1.epoch,
        )])])
        .await
        .expect_err("released");
    assert!(err.to_string().contains("refused"), "{err}");
    let (rows, _, _) = read_all(&*s, Position::START).await;
    assert_eq!(rows.len(), 3);
}

/// A lot the database let in but its readers cannot unpack (an unknown key in an
/// item, a name no writer accepts) is skipped whole and reported, and the rows around
/// it are read.
pub async fn a_corrupt_lot_is_skipped_whole(b: &impl TestBackend) {
    let s = b.store();
    let item = json!({ "verb": "turn.prompted", "actor": "ada", "role": "agent",
        "body": { "turn": "x" } });
    let bodies = [
        json!({ "items": [item, { "verb": "turn.prompted", "actor": "ada",
            "role": "agent", "body": {}, "unknown": 1 }] }),
        json!({ "items": [item, { "verb": "turn.prompted", "actor": "a/b",
            "role": "agent", "body": {} }] }),
        json!({ "items": [item, { "verb": "turn.prompted", "actor": "ada",
            "role": "agent", "parent": "not hex", "body": {} }] }),
    ];
    for body in bodies {
        let content = NewInteraction::new("r", Verb::TaskLot, "relay-a", Role::System, body);
        let (id, text) = content.id_and_body();
        b.insert_raw(RawRow {
            id: id.0.to_vec(),
            position: Position::START,
            at: Timestamp(0),
            relay: String::new(),
            room: "r".into(),
            thread: None,
            verb: "task.lot".into(),
            actor: "relay-a".into(),
            role: "system".into(),
            parent: None,
            caused_by: vec![],
            body: text,
            sig: None,
        })
        .await
        .expect("the database takes the row");
    }
    let after = message("r", "ana", "after");
    s.append(vec![after.clone()]).await.expect("append");
    let (rows, skipped, _) = read_all(&*s, Position::START).await;
    assert_eq!(skipped, 3);
    assert_eq!(
        ids(&rows),
        vec![after.id()],
        "nothing of a corrupt lot is read"
    );
    let batch = settled(|| s.read_forward(Position::START, 10)).await;
    assert!(
        batch.skipped.iter().all(|k| k.reason.contains("task.lot")),
        "{:?}",
        batch.skipped
    );
    // A store read of the room's rows skips them too.
    let stored = settled(|| s.read_room_rows("r", Position::START, 10)).await;
    assert_eq!(stored.skipped.len(), 3);
    assert_eq!(ids(&stored.rows), vec![after.id()]);
}
