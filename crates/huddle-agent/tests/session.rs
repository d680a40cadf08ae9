//! The agent operations over the in-memory store with a clock moved by hand.

use std::sync::Arc;
use std::time::Duration;

use huddle_agent::views::{ClaimArgs, CompleteArgs, GiveBackArgs, PostArgs, ReadArgs, RenewArgs};
use huddle_agent::{AgentError, AgentSession, BidArgs};
use huddle_core::signing::OwnerSecret;
use huddle_core::tasks::TaskCreatedBody;
use huddle_core::{Fold, NewInteraction, Position, Role, TaskDag, TaskStatus, Timestamp, Verb};
use huddle_store::memory::{ManualClock, MemoryStore};
use huddle_store::{Store, StoreOptions};

const ROOM: &str = "lobby";
/// The room owner's signing key.
fn owner_key() -> OwnerSecret {
    OwnerSecret::from_seed([7; 32])
}

/// The default claim TTL (60 s).
const TTL: Duration = Duration::from_secs(60);

struct Room {
    store: Arc<dyn Store>,
    clock: ManualClock,
}

impl Room {
    /// A room owned by `ana` with `tasks` as `(id, deps, max_attempts)`.
    async fn new(tasks: &[(&str, &[&str], u32)]) -> Room {
        Room::with_config(tasks, "").await
    }

    /// As [`Room::new`], with more `!config` settings (`key value ...`).
    async fn with_config(tasks: &[(&str, &[&str], u32)], config: &str) -> Room {
        let clock = ManualClock::new(Timestamp(1_000_000_000));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(
            StoreOptions {
                poll_interval: Duration::from_millis(20),
                ..Default::default()
            },
            clock.clone(),
        ));
        let max = tasks.first().map_or(3, |t| t.2);
        assert!(
            tasks.iter().all(|t| t.2 == max),
            "one max-attempts per room"
        );
        let mut delegate = String::from("!delegate");
        for (id, deps, _) in tasks {
            delegate.push_str(&format!("\n{id}: do {id}"));
            if !deps.is_empty() {
                delegate.push_str(&format!(" [after {}]", deps.join(", ")));
            }
        }
        let config = format!("!config max-attempts {max} {config}");
        let mut commands = vec![config.as_str()];
        if !tasks.is_empty() {
            commands.push(&delegate);
        }
        let rows = huddle_core::seed_room(ROOM, "ana", &owner_key(), &commands).unwrap();
        store.append(rows).await.unwrap();
        Room { store, clock }
    }

    async fn agent(&self, key: &str) -> AgentSession {
        self.capable(key, &[]).await
    }

    async fn capable(&self, key: &str, capabilities: &[&str]) -> AgentSession {
        let caps = capabilities.iter().map(|c| c.to_string()).collect();
        AgentSession::open(self.store.clone(), ROOM, key, caps)
            .await
            .unwrap()
    }

    async fn dag(&self) -> TaskDag {
        let batch = self
            .store
            .read_forward(Position::START, 10_000)
            .await
            .unwrap();
        TaskDag::rebuild(&batch.rows)
    }

    async fn rows(&self, verb: Verb) -> usize {
        let batch = self
            .store
            .read_forward(Position::START, 10_000)
            .await
            .unwrap();
        batch.rows.iter().filter(|r| r.verb == verb).count()
    }
}

fn claim(task: &str) -> ClaimArgs {
    ClaimArgs {
        task: Some(task.into()),
        wait_ms: None,
    }
}

fn complete(task: &str, result: &str) -> CompleteArgs {
    CompleteArgs {
        task: task.into(),
        result: Some(result.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn claim_complete_and_the_dependent_sees_the_result() {
    let room = Room::new(&[("a", &[], 3), ("b", &["a"], 3)]).await;
    let bo = room.agent("bo").await;
    let tasks = bo.tasks().await.unwrap();
    assert_eq!(tasks.ready_for_you, vec!["a"]);
    let err = bo.task_claim(claim("b")).await.unwrap_err();
    assert!(matches!(err, AgentError::NotClaimable { .. }), "{err}");
    assert!(err.to_string().contains("dependencies"), "{err}");

    let c = bo.task_claim(ClaimArgs::default()).await.unwrap();
    let c = c.claimed.expect("a is claimable");
    assert_eq!((c.task.id.as_str(), c.attempt, c.resumed), ("a", 1, false));
    // Claiming again (a client's retry) resumes the same claim and writes nothing.
    let again = bo.task_claim(claim("a")).await.unwrap().claimed.unwrap();
    assert!(again.resumed);
    assert_eq!(again.epoch, c.epoch);
    assert_eq!(room.rows(Verb::TaskClaimed).await, 1);

    let done = bo.task_complete(complete("a", "42")).await.unwrap();
    assert_eq!(done.status, "done");
    // A retry of the completion is accepted and writes nothing new.
    let retry = bo.task_complete(complete("a", "42")).await.unwrap();
    assert!(!retry.written.inserted);
    assert_eq!(room.rows(Verb::TaskCompleted).await, 1);

    let b = bo
        .task_claim(ClaimArgs::default())
        .await
        .unwrap()
        .claimed
        .unwrap();
    assert_eq!(b.task.id, "b");
    assert_eq!(b.dependencies[0].result.as_deref(), Some("42"));
    // The finished task's claim is closed: nobody takes it again.
    let cy = room.agent("cy").await;
    let err = cy.task_claim(claim("a")).await.unwrap_err();
    assert!(err.to_string().contains("done"), "{err}");
}

#[tokio::test]
async fn a_held_task_is_refused_and_a_lapsed_one_is_retaken_and_the_stale_completion_refused() {
    let room = Room::new(&[("a", &[], 3)]).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    let first = bo.task_claim(claim("a")).await.unwrap().claimed.unwrap();
    let err = cy.task_claim(claim("a")).await.unwrap_err();
    assert!(
        matches!(err, AgentError::HeldBy { ref holder, .. } if holder == "bo"),
        "{err}"
    );
    let none = cy.task_claim(ClaimArgs::default()).await.unwrap();
    assert!(none.claimed.is_none() && !none.settled);

    // A renewal keeps it; then bo goes quiet past the lease.
    room.clock.advance(TTL / 2);
    bo.task_renew(RenewArgs {
        task: "a".into(),
        epoch: None,
    })
    .await
    .unwrap();
    room.clock.advance(TTL / 2 + Duration::from_secs(1));
    assert!(
        cy.task_claim(claim("a")).await.is_err(),
        "renewed: still bo's"
    );
    room.clock.advance(TTL);
    let second = cy
        .task_claim(ClaimArgs::default())
        .await
        .unwrap()
        .claimed
        .unwrap();
    assert_eq!(second.task.id, "a");
    assert!(second.epoch > first.epoch);
    assert_eq!(second.attempt, 2);

    let err = bo.task_complete(complete("a", "late")).await.unwrap_err();
    assert_eq!(err.code(), "stale_claim");
    let text = err.to_string();
    assert!(text.contains("lapsed") && text.contains("cy"), "{text}");
    let err = bo
        .task_renew(RenewArgs {
            task: "a".into(),
            epoch: Some(first.epoch),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "stale_claim");

    cy.task_complete(complete("a", "on time")).await.unwrap();
    let dag = room.dag().await;
    let a = dag.task(ROOM, "a").unwrap();
    assert_eq!(a.status, TaskStatus::Done);
    assert_eq!(a.owner.as_deref(), Some("cy"));
    assert_eq!(a.result.as_deref(), Some("on time"));
    assert_eq!(room.rows(Verb::TaskCompleted).await, 1);
    let settled = bo.task_claim(ClaimArgs::default()).await.unwrap();
    assert!(settled.settled, "{:?}", settled.reason);
}

#[tokio::test]
async fn failures_retry_until_the_last_attempt_abandons_and_closes() {
    let room = Room::new(&[("a", &[], 2)]).await;
    let bo = room.agent("bo").await;
    let fail = || GiveBackArgs {
        task: "a".into(),
        reason: Some("broke".into()),
        ..Default::default()
    };
    bo.task_claim(claim("a")).await.unwrap();
    let out = bo.task_fail(fail()).await.unwrap();
    assert_eq!(out.status, "open");
    // The retry waits out its back-off (`retry-backoff`, 1 s by default, jittered
    // down to no less than half), as it would on any relay.
    let err = bo.task_claim(claim("a")).await.unwrap_err();
    assert!(err.to_string().contains("backs off until"), "{err}");
    let best = bo.task_claim(ClaimArgs::default()).await.unwrap();
    assert!(best.claimed.is_none() && !best.settled, "{:?}", best.reason);
    room.clock.advance(std::time::Duration::from_secs(1));
    bo.task_claim(claim("a")).await.unwrap();
    let out = bo.task_fail(fail()).await.unwrap();
    assert_eq!(out.status, "abandoned");
    let err = bo.task_claim(claim("a")).await.unwrap_err();
    assert!(err.to_string().contains("abandoned"), "{err}");
    // Closed in the claims table too.
    let acq = room.store.acquire("task/lobby/a", "cy", TTL).await.unwrap();
    assert!(acq.closed());
}

#[tokio::test]
async fn a_lapsed_last_attempt_retaken_abandons_the_task() {
    let room = Room::new(&[("a", &[], 1)]).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    bo.task_claim(claim("a")).await.unwrap();
    room.clock.advance(TTL * 2);
    let out = cy.task_claim(ClaimArgs::default()).await.unwrap();
    assert!(out.claimed.is_none());
    assert_eq!(
        room.dag().await.task(ROOM, "a").unwrap().status,
        TaskStatus::Abandoned
    );
    assert!(out.settled, "{:?}", out.reason);
}

#[tokio::test]
async fn release_gives_the_task_back_for_another_agent() {
    let room = Room::new(&[("a", &[], 3)]).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    bo.task_claim(claim("a")).await.unwrap();
    let out = bo
        .task_release(GiveBackArgs {
            task: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.status, "open");
    room.clock.advance(std::time::Duration::from_secs(1));
    let c = cy.task_claim(claim("a")).await.unwrap().claimed.unwrap();
    assert_eq!(c.attempt, 2);
    // bo no longer holds it: its writes are refused.
    let err = bo.task_complete(complete("a", "x")).await.unwrap_err();
    assert!(matches!(err.code(), "stale_claim" | "not_holder"), "{err}");
}

#[tokio::test]
async fn read_long_polls_and_post_speaks_only_as_the_agent() {
    let room = Room::new(&[]).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    let start = bo.read(ReadArgs::default()).await.unwrap();
    assert!(start.interactions.iter().any(|i| i.verb == "room.created"));
    let cursor = start.next.clone();
    let waiter = tokio::spawn(async move {
        bo.read(ReadArgs {
            after: Some(cursor),
            wait_ms: Some(5_000),
            ..Default::default()
        })
        .await
        .unwrap()
    });
    let posted = cy
        .post(PostArgs {
            text: "@bo hello".into(),
            idempotency_key: Some("k1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the long poll wakes")
        .unwrap();
    assert_eq!(got.interactions.len(), 1);
    assert_eq!(got.interactions[0].id, posted.id);
    assert_eq!(got.interactions[0].actor, "cy");
    assert_eq!(got.interactions[0].role, "agent");
    // The same idempotency key never posts twice, whatever the text.
    let again = cy
        .post(PostArgs {
            text: "different".into(),
            idempotency_key: Some("k1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((again.id, again.inserted), (posted.id, false));
    let err = cy
        .post(PostArgs {
            text: "x".into(),
            reply_to: Some("nope".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "bad_argument");
}

#[tokio::test]
async fn a_message_gets_one_reply_whoever_answers() {
    let room = Room::new(&[]).await;
    let before = room.rows(Verb::MessagePosted).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    let dee = room.agent("dee").await;
    let ask = |text: &str| PostArgs {
        text: text.into(),
        ..Default::default()
    };
    let reply = |to: &str, text: &str| PostArgs {
        text: text.into(),
        reply_to: Some(to.to_string()),
        ..Default::default()
    };
    let q1 = bo.post(ask("@cy who takes this?")).await.unwrap();
    let first = cy.post(reply(&q1.id, "mine")).await.unwrap();
    assert!(first.inserted);
    // The same reply again (a retry) is the reply already written.
    let retry = cy.post(reply(&q1.id, "mine")).await.unwrap();
    assert_eq!(
        (retry.id.as_str(), retry.inserted),
        (first.id.as_str(), false)
    );
    // Any other reply, from anyone, is refused and writes nothing.
    for (who, text) in [(&dee, "no, mine"), (&cy, "and another thing")] {
        let err = who.post(reply(&q1.id, text)).await.unwrap_err();
        assert_eq!(err.code(), "reply_taken", "{err}");
        assert!(err.to_string().contains("cy answered it"), "{err}");
    }
    // A message naming several agents gets one reply from each of them.
    let parts = bo
        .post(ask("@cy and @dee: each take your part"))
        .await
        .unwrap();
    assert!(
        cy.post(reply(&parts.id, "cy's part"))
            .await
            .unwrap()
            .inserted
    );
    assert!(
        dee.post(reply(&parts.id, "dee's part"))
            .await
            .unwrap()
            .inserted
    );
    let err = cy.post(reply(&parts.id, "cy again")).await.unwrap_err();
    assert_eq!(err.code(), "reply_taken", "{err}");
    assert!(err.to_string().contains("cy answered it"), "{err}");
    // A reply someone (a relay's agent) is writing now is refused while it is held.
    let q2 = bo.post(ask("second question")).await.unwrap();
    let key = huddle_core::protocol::reply_key(ROOM, &q2.id.parse().unwrap());
    let held = room.store.acquire(&key, "eve", TTL).await.unwrap();
    assert!(matches!(held, huddle_store::Acquired::Won(_)));
    let err = dee.post(reply(&q2.id, "me")).await.unwrap_err();
    assert_eq!(err.code(), "reply_taken");
    assert!(err.to_string().contains("eve is answering it now"), "{err}");
    // Once that hold lapses unanswered, the message can be answered.
    room.clock.advance(TTL + Duration::from_secs(1));
    assert!(dee.post(reply(&q2.id, "me")).await.unwrap().inserted);
    let posted = room.rows(Verb::MessagePosted).await - before;
    assert_eq!(
        posted, 7,
        "three questions; one reply to each of the first and last, two to the one naming two"
    );
}

#[tokio::test]
async fn tasks_no_signed_owner_command_created_do_not_exist_for_agents() {
    let room = Room::new(&[("a", &[], 3)]).await;
    // Any writer of the database can append a task.created naming the owner; without
    // a signed `!delegate` behind it, it is no task.
    let forged = TaskCreatedBody {
        task: "forged".into(),
        label: "wire the money".into(),
        deps: vec![],
        assignee: None,
        needs: vec![],
        max_attempts: Some(3),
        priority: None,
        size: None,
        path: None,
        due_ms: None,
        uses: Vec::new(),
        review: None,
        undo: None,
    };
    room.store
        .append(vec![NewInteraction::new(
            ROOM,
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            forged.to_body(),
        )])
        .await
        .unwrap();
    let bo = room.agent("bo").await;
    let tasks = bo.tasks().await.unwrap();
    let ids: Vec<&str> = tasks.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["a"]);
    let err = bo.task_claim(claim("forged")).await.unwrap_err();
    assert_eq!(err.code(), "no_task", "{err}");
}

#[tokio::test]
async fn a_missing_room_is_refused_at_open() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreOptions::default()));
    let err = AgentSession::open(store, "nowhere", "bo", vec![])
        .await
        .err()
        .expect("no room");
    assert_eq!(err.code(), "no_room");
}

fn bid(task: &str, load: Option<u32>, decline: bool) -> BidArgs {
    BidArgs {
        task: task.into(),
        load,
        decline,
    }
}

#[tokio::test]
async fn bids_decide_who_claims_after_the_window_and_losers_are_told() {
    let room = Room::with_config(&[("a", &[], 3)], "allocation bid bid-window 1s").await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    let dee = room.agent("dee").await;

    // In the window nobody claims; agents bid (or decline).
    let err = cy.task_claim(claim("a")).await.unwrap_err();
    assert!(
        matches!(err, AgentError::NotClaimable { ref why, .. } if why.contains("bid window")),
        "{err}"
    );
    let b = bo.task_bid(bid("a", Some(2), false)).await.unwrap();
    assert_eq!((b.attempt, b.leader.as_deref()), (1, Some("bo")));
    assert!(b.written.inserted);
    let c = cy.task_bid(bid("a", None, false)).await.unwrap();
    assert_eq!(
        (c.load, c.leader.as_deref()),
        (0, Some("cy")),
        "lower load leads"
    );
    let d = dee.task_bid(bid("a", None, true)).await.unwrap();
    assert!(d.decline && d.written.inserted);
    assert_eq!(d.bidders, vec!["bo", "cy"], "a decline is not a bid");
    // One answer per attempt: a second one writes nothing and the first stands.
    let again = bo.task_bid(bid("a", Some(0), false)).await.unwrap();
    assert_eq!(again.written.id, b.written.id);
    assert!(!again.written.inserted);
    assert_eq!(again.leader.as_deref(), Some("cy"));

    // The window closes: only the winner may claim for one more window.
    room.clock.advance(Duration::from_millis(1100));
    let err = bo.task_claim(claim("a")).await.unwrap_err();
    assert!(
        matches!(err, AgentError::NotClaimable { ref why, .. } if why.contains("reserved for cy")),
        "{err}"
    );
    assert!(bo
        .task_claim(ClaimArgs::default())
        .await
        .unwrap()
        .claimed
        .is_none());
    let late = dee.task_bid(bid("a", None, false)).await.unwrap_err();
    assert_eq!(late.code(), "not_biddable", "{late}");
    let won = cy
        .task_claim(ClaimArgs::default())
        .await
        .unwrap()
        .claimed
        .unwrap();
    assert_eq!(won.task.id, "a");
    // The loser is told; the decliner is not a loser.
    assert_eq!(room.rows(Verb::TaskRejected).await, 1);
    assert_eq!(
        room.dag()
            .await
            .task(ROOM, "a")
            .unwrap()
            .rejected
            .keys()
            .collect::<Vec<_>>(),
        vec!["bo"]
    );
}

#[tokio::test]
async fn bids_are_refused_where_they_cannot_count() {
    let pull = Room::new(&[("a", &[], 3)]).await;
    let bo = pull.agent("bo").await;
    let err = bo.task_bid(bid("a", None, false)).await.unwrap_err();
    assert!(err.to_string().contains("not by bids"), "{err}");

    let room = Room::with_config(&[("a", &[], 3), ("b", &["a"], 3)], "allocation bid").await;
    let bo = room.agent("bo").await;
    let err = bo.task_bid(bid("b", None, false)).await.unwrap_err();
    assert!(err.to_string().contains("dependencies"), "{err}");
    let err = bo.task_bid(bid("zz", None, false)).await.unwrap_err();
    assert_eq!(err.code(), "no_task");
}

#[tokio::test]
async fn an_agent_bound_to_other_writers_is_refused_at_open() {
    let room = Room::with_config(&[], "agents ada@r0,ada@r1").await;
    let writer = room
        .store
        .writer()
        .expect("the memory store names its writer");
    assert!(!["r0", "r1"].contains(&writer.as_str()));
    let err = AgentSession::open(room.store.clone(), ROOM, "ada", vec![])
        .await
        .err()
        .expect("ada is bound to r0 and r1");
    assert_eq!(err.code(), "bound_elsewhere");
    assert!(
        err.to_string()
            .contains("bound to r0, r1 in room \"lobby\""),
        "{err}"
    );
    // Nothing was written as ada; an unbound agent opens as before.
    let rows = room.store.read_forward(Position::START, 100).await.unwrap();
    assert!(rows.rows.iter().all(|r| r.actor != "ada"));
    room.agent("bo").await;
}

/// `post` with `progress`: a `turn.progress` note on the message the agent is
/// answering (it holds the reply claim, as a relay driving it holds it in its name),
/// refused without that claim or without `reply_to`; the note is not a reply, and the
/// reply after it is still the message's one reply.
#[tokio::test]
async fn a_progress_note_is_written_under_the_reply_claim_and_is_not_the_reply() {
    let room = Room::new(&[]).await;
    let bo = room.agent("bo").await;
    let cy = room.agent("cy").await;
    let q = bo
        .post(PostArgs {
            text: "@cy how is it going?".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let note = |text: &str, to: Option<&str>| PostArgs {
        text: text.into(),
        reply_to: to.map(str::to_string),
        progress: true,
        ..Default::default()
    };
    // Not answering it yet: no reply claim of cy's.
    let err = cy.post(note("reading", Some(&q.id))).await.unwrap_err();
    assert_eq!(err.code(), "not_holder", "{err}");
    let err = cy.post(note("reading", None)).await.unwrap_err();
    assert_eq!(err.code(), "bad_argument", "{err}");
    // The relay driving cy holds the reply claim in cy's name.
    let key = huddle_core::protocol::reply_key("lobby", &q.id.parse().unwrap());
    assert!(room.store.acquire(&key, "cy", TTL).await.unwrap().won());
    let first = cy.post(note("reading", Some(&q.id))).await.unwrap();
    let second = cy.post(note("reading", Some(&q.id))).await.unwrap();
    assert!(
        first.inserted && second.inserted,
        "the same text twice is two notes"
    );
    assert_ne!(first.id, second.id);
    assert_eq!(room.rows(Verb::TurnProgress).await, 2);
    let replies_before = room.rows(Verb::MessagePosted).await;
    // Someone else cannot post progress on cy's answer.
    let err = bo.post(note("me too", Some(&q.id))).await.unwrap_err();
    assert_eq!(err.code(), "not_holder", "{err}");
    assert_eq!(room.rows(Verb::MessagePosted).await, replies_before);
}
