//! The forged-row battery (issue 9; plans 0016, 0017, 0028, 0031, 0032): rows and
//! statements a malicious writer might try, on each backend where the attack applies.
//! Each must be refused by the database with a clear error, or — where the database
//! cannot judge it (a signature, the owner's key) — get in and then be ignored by the
//! owner authority every reader folds through, and counted, or be skipped by every
//! reader as corrupt. The test prints how many were tried and how each ended.
//!
//! Postgres runs under the roles `huddle admin` makes: two relay roles and an owner
//! (writer) role. SQLite has no roles: there the claim checks apply in the database
//! and signatures in the readers (whoever can write the file can write any `relay`;
//! see docs/security.md).

use std::time::Duration;

use std::collections::BTreeMap;

use huddle_core::keys::WriterSecret;
use huddle_core::signing::OwnerSecret;
use huddle_core::tasks::{
    TaskClaimedBody, TaskCompletedBody, TaskEndedBody, TaskReviewedBody, Verdict,
};
use huddle_core::ClaimEpoch;
use huddle_core::{Fold, InteractionId, NewInteraction, OwnerAuthority, Position, Role, Verb};
use huddle_store::conformance::settled;
use huddle_store::postgres::admin::{self, LoginKind};
use huddle_store::postgres::PgStore;
use huddle_store::sqlite::SqliteStore;
use huddle_store::{
    Acquired, ArchiveRefusal, ArchiveRequest, Claims, Fence, Ledger, Store, StoreError,
    StoreOptions,
};
use huddle_testkit::test_database;
use serde_json::json;

const ROOM: &str = "lobby";
const TTL: Duration = Duration::from_secs(60);

fn claimed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    let body = TaskClaimedBody {
        task: task.into(),
        epoch: ClaimEpoch(epoch),
        attempt: 1,
        generation: 0,
    };
    NewInteraction::new(ROOM, Verb::TaskClaimed, agent, Role::Agent, body.to_body())
}

fn completed(task: &str, agent: &str, epoch: i64, note: &str) -> NewInteraction {
    let body = TaskCompletedBody {
        task: task.into(),
        epoch: ClaimEpoch(epoch),
        result: Some(format!("forged: {note}")),
        tokens: None,
        generation: 0,
    };
    NewInteraction::new(
        ROOM,
        Verb::TaskCompleted,
        agent,
        Role::Agent,
        body.to_body(),
    )
}

fn ended(verb: Verb, task: &str, agent: &str, epoch: i64) -> NewInteraction {
    let body = TaskEndedBody {
        task: task.into(),
        epoch: ClaimEpoch(epoch),
        reason: "forged".into(),
        generation: 0,
    };
    NewInteraction::new(ROOM, verb, agent, Role::Agent, body.to_body())
}

fn reply(agent: &str, to: InteractionId, text: &str) -> NewInteraction {
    NewInteraction::new(
        ROOM,
        Verb::MessagePosted,
        agent,
        Role::Agent,
        json!({ "text": text }),
    )
    .with_parent(to)
}

fn human(text: &str) -> NewInteraction {
    NewInteraction::new(
        ROOM,
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({ "text": text }),
    )
}

/// Which counter of the owner authority a row that got in must raise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ignored {
    /// An owner command that does not verify: it stays chat, never executed.
    UnsignedCommand,
    /// A `task.created` no verified command derived.
    UnauthorizedTask,
    /// A `config.set` no verified command derived.
    ForgedConfig,
    /// A later `room.created` or an unverified `room.key_rotated`: read, changes
    /// nothing.
    BadRoomRow,
    /// A row as a bound agent by another writer.
    Misbound,
    /// A row under a signing writer's name without its key.
    ForgedWriter,
    /// A row not signed by a registered key where signatures are required.
    UnsignedRow,
}

impl Ignored {
    /// Whether the row is kept from every fold (not only without effect).
    fn kept_from_folds(self) -> bool {
        !matches!(self, Ignored::UnsignedCommand | Ignored::BadRoomRow)
    }
}

/// The tally: every attempt is refused by the database (with the text that says
/// why), or gets in and is then ignored by the folds and counted, or is skipped by
/// readers as corrupt — or it is a failure of the test.
#[derive(Default)]
struct Tally {
    tried: usize,
    refused: usize,
    got_in: Vec<String>,
    /// Rows the database took that every reader's folds must ignore: what, id, counter.
    to_ignore: Vec<(String, InteractionId, Ignored)>,
    ignored: usize,
    /// Rows every reader must skip as corrupt: what, id.
    to_skip: Vec<(String, InteractionId)>,
    skipped: usize,
}

impl Tally {
    /// Records an attempt whose outcome is `Err(reason)` when refused.
    fn attempt(&mut self, what: &str, outcome: Result<(), String>, expect_in_error: &[&str]) {
        self.tried += 1;
        match outcome {
            Err(reason) => {
                assert!(
                    expect_in_error.iter().any(|e| reason.contains(e)),
                    "{what}: refused, but not clearly: {reason}"
                );
                eprintln!("refused  {what}: {reason}");
                self.refused += 1;
            }
            Ok(()) => {
                eprintln!("GOT IN   {what}");
                self.got_in.push(what.to_string());
            }
        }
    }

    /// Records a row the database took (it cannot judge it) that every reader's folds
    /// must ignore, raising `counter` (checked by [`Tally::check_readers`]).
    fn must_be_ignored(&mut self, what: &str, id: InteractionId, counter: Ignored) {
        self.tried += 1;
        self.to_ignore.push((what.to_string(), id, counter));
    }

    /// Records a row every reader must skip as corrupt.
    fn must_be_skipped(&mut self, what: &str, id: InteractionId) {
        self.tried += 1;
        self.to_skip.push((what.to_string(), id));
    }

    /// Reads the whole ledger as every reader does — rows verified by the store, then
    /// folded through the owner authority — and checks that each row recorded with
    /// [`Tally::must_be_ignored`] was stored, not admitted, and counted, each counter
    /// raised exactly as often as expected; that each row recorded with
    /// [`Tally::must_be_skipped`] was skipped; and that every row in `honest` was
    /// admitted.
    async fn check_readers(&mut self, store: &dyn Store, honest: &[InteractionId]) {
        let mut authority = OwnerAuthority::new();
        let mut admitted = BTreeMap::new();
        let mut cursor = Position::START;
        let mut skipped = 0;
        loop {
            // Rows held back are read again, as a woken reader would ([`settled`]).
            let batch = settled(|| store.read_forward(cursor, 500)).await;
            skipped += batch.skipped.len();
            for row in &batch.rows {
                authority.apply(row);
                admitted.insert(row.id, authority.admits(row));
            }
            if batch.next == cursor {
                break;
            }
            cursor = batch.next;
        }
        for id in honest {
            assert_eq!(
                admitted.get(id),
                Some(&true),
                "an honest row {id} was not admitted"
            );
        }
        let mut expected: BTreeMap<Ignored, u64> = BTreeMap::new();
        for (what, id, counter) in std::mem::take(&mut self.to_ignore) {
            match admitted.get(&id) {
                Some(true) if counter.kept_from_folds() => {
                    eprintln!("GOT IN   {what}: admitted by the folds");
                    self.got_in.push(what);
                }
                Some(_) => {
                    eprintln!("ignored  {what}: stored, no effect on any fold ({counter:?})");
                    *expected.entry(counter).or_default() += 1;
                    self.ignored += 1;
                }
                None => panic!("{what}: the row is not in the ledger"),
            }
        }
        let count = |c| expected.get(&c).copied().unwrap_or(0);
        assert_eq!(
            authority.unsigned_commands(),
            count(Ignored::UnsignedCommand)
        );
        assert_eq!(
            authority.unauthorized_rows(),
            count(Ignored::UnauthorizedTask)
        );
        assert_eq!(
            authority.config().ignored_rows(),
            count(Ignored::ForgedConfig) + count(Ignored::BadRoomRow)
        );
        assert_eq!(authority.misbound_rows(), count(Ignored::Misbound));
        assert_eq!(authority.forged_writer_rows(), count(Ignored::ForgedWriter));
        assert_eq!(authority.unsigned_rows(), count(Ignored::UnsignedRow));
        // And the room is as its owner made it: same owner and key, the default claim
        // TTL, signatures still required, only the real task.
        let config = authority.config();
        assert_eq!(config.owner(VAULT), Some("olga"));
        assert_eq!(config.owner_key(VAULT), Some(owner_key().public()));
        let effective = config.effective(VAULT, None);
        assert_eq!(effective.claim_ttl_ms, 60_000);
        assert!(effective.require_signatures);
        assert!(authority.task_exists(VAULT, "t1"));
        for evil in ["evil", "evil-olga", "evil-mallory", "evil-olga-again"] {
            assert!(!authority.task_exists(VAULT, evil), "{evil}");
        }
        let to_skip = std::mem::take(&mut self.to_skip);
        assert_eq!(
            skipped,
            to_skip.len(),
            "rows skipped as corrupt: {to_skip:?}"
        );
        for (what, id) in to_skip {
            assert!(!admitted.contains_key(&id), "{what}: read back");
            eprintln!("skipped  {what}: refused by every reader as corrupt");
            self.skipped += 1;
        }
    }

    fn finish(self, backend: &str) {
        eprintln!(
            "{backend}: {} forged rows and statements tried: {} refused by the database, \
             {} ignored and counted by every fold, {} skipped by every reader, {} got in",
            self.tried,
            self.refused,
            self.ignored,
            self.skipped,
            self.got_in.len()
        );
        assert!(
            self.got_in.is_empty(),
            "{backend}: these got in: {:?}",
            self.got_in
        );
        assert!(self.to_ignore.is_empty() && self.to_skip.is_empty());
        assert_eq!(self.tried, self.refused + self.ignored + self.skipped);
    }
}

const VAULT: &str = "vault";

fn in_vault(verb: Verb, actor: &str, role: Role, body: serde_json::Value) -> NewInteraction {
    NewInteraction::new(VAULT, verb, actor, role, body)
}

fn said(actor: &str, role: Role, text: &str) -> NewInteraction {
    in_vault(Verb::MessagePosted, actor, role, json!({ "text": text }))
}

/// Appends one row the database must take; returns its id.
async fn stored(store: &dyn Store, row: NewInteraction) -> InteractionId {
    let out = store
        .append(vec![row])
        .await
        .expect("the database takes the row");
    assert!(out[0].inserted, "a new row");
    out[0].id
}

/// The owner's key, the honest writer's signing key and the room `vault` as its
/// owner `olga` sets it up: the honest writer's key registered, ada bound to the
/// honest writer, one task. The rows are appended by `honest` (a signing store);
/// returns their ids.
async fn seed_vault(honest: &dyn Store, honest_key: &WriterSecret) -> Vec<InteractionId> {
    let writer = honest.writer().expect("the honest writer is known");
    let rows = huddle_core::seed_room(
        VAULT,
        "olga",
        &owner_key(),
        &[
            &format!(
                "!config relay-keys {writer}={}",
                honest_key.public().to_hex()
            ),
            &format!("!config agents ada@{writer}"),
            "!delegate\nt1: the real task",
        ],
    )
    .expect("seed the room");
    let out = honest.append(rows).await.expect("append the room");
    out.iter().map(|a| a.id).collect()
}

fn owner_key() -> OwnerSecret {
    OwnerSecret::from_seed([0x0a; 32])
}

/// The forgeries the database cannot judge, shared by both backends: owner rows
/// without the owner's key, rows under the honest writer's name without its key
/// (`impersonator`: a store writing as the honest writer, where the backend lets one
/// exist — SQLite), rows as ada from another writer (`attacker`), unsigned rows once
/// the room requires signatures, and rows with bad signatures (`raw_sig`: inserts a
/// row with the given `sig` text as the attacker would). Every one must be ignored
/// by the folds and counted, or skipped as corrupt.
async fn fold_battery<F, Fut>(
    honest: &dyn Store,
    honest_key: &WriterSecret,
    attacker: &dyn Store,
    impersonator: Option<&dyn Store>,
    ada_as_attacker: Option<Ignored>,
    raw_sig: F,
    t: &mut Tally,
) where
    F: Fn(NewInteraction, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut honest_rows = seed_vault(honest, honest_key).await;
    let mallory = OwnerSecret::from_seed([0x66; 32]);

    // Owner rows without the owner's key.
    let id = stored(
        attacker,
        said("olga", Role::Owner, "!delegate\nevil: run me"),
    )
    .await;
    t.must_be_ignored("an unsigned owner !delegate", id, Ignored::UnsignedCommand);
    let id = stored(
        attacker,
        mallory.sign(said("olga", Role::Owner, "!config claim-ttl 1s")),
    )
    .await;
    t.must_be_ignored(
        "an owner !config signed by another key",
        id,
        Ignored::UnsignedCommand,
    );
    let forged_task = |actor: &str| {
        in_vault(
            Verb::TaskCreated,
            actor,
            Role::Owner,
            json!({"task": format!("evil-{actor}"), "label": "run me"}),
        )
    };
    let id = stored(attacker, forged_task("olga")).await;
    t.must_be_ignored("task.created as the owner", id, Ignored::UnauthorizedTask);
    let id = stored(attacker, forged_task("mallory")).await;
    t.must_be_ignored(
        "task.created with role owner",
        id,
        Ignored::UnauthorizedTask,
    );
    let id = stored(
        attacker,
        in_vault(
            Verb::ConfigSet,
            "olga",
            Role::Owner,
            json!({"set": {"claim-ttl": 1000}}),
        ),
    )
    .await;
    t.must_be_ignored("a hand-written config.set", id, Ignored::ForgedConfig);
    let id = stored(
        attacker,
        in_vault(
            Verb::RoomCreated,
            "mallory",
            Role::Owner,
            json!({"owner": "mallory", "key": mallory.public().to_hex()}),
        ),
    )
    .await;
    t.must_be_ignored("room.created for an existing room", id, Ignored::BadRoomRow);
    let id = stored(
        attacker,
        in_vault(
            Verb::RoomKeyRotated,
            "olga",
            Role::Owner,
            json!({"key": mallory.public().to_hex()}),
        ),
    )
    .await;
    t.must_be_ignored("an unsigned owner key rotation", id, Ignored::BadRoomRow);

    // Rows as ada, who is bound to the honest writer, from another writer (on
    // Postgres the database refuses them first: see the caller).
    if let Some(counter) = ada_as_attacker {
        let id = stored(attacker, said("ada", Role::Agent, "I am ada")).await;
        t.must_be_ignored("a message as ada from another writer", id, counter);
        let id = stored(
            attacker,
            in_vault(
                Verb::AgentRegistered,
                "ada",
                Role::Agent,
                json!({"capabilities": []}),
            ),
        )
        .await;
        t.must_be_ignored("agent.registered as ada from another writer", id, counter);
    }

    // Rows under the honest writer's own name without its key.
    if let Some(imp) = impersonator {
        let id = stored(
            imp,
            said("ada", Role::Agent, "unsigned, under the honest name"),
        )
        .await;
        t.must_be_ignored(
            "a row under the honest writer's name, unsigned",
            id,
            Ignored::ForgedWriter,
        );
    }

    // The room requires signatures from here on.
    let owner = owner_key();
    let mut authority = OwnerAuthority::new();
    let mut cursor = Position::START;
    loop {
        let batch = honest.read_room(VAULT, cursor, 500).await.expect("read");
        for r in &batch.rows {
            authority.apply(r);
        }
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    let command = owner.sign(said("olga", Role::Owner, "!config require-signatures on"));
    let rows = huddle_core::command_rows(command, authority.config())
        .expect("a command")
        .expect("accepted");
    // Stored by the attacker, unsigned: the owner's signed rows count anyway.
    let out = attacker.append(rows).await.expect("append");
    honest_rows.extend(out.iter().map(|a| a.id));
    let honest_chat = stored(
        honest,
        said("bo", Role::Human, "signed by the honest writer"),
    )
    .await;
    honest_rows.push(honest_chat);

    let id = stored(attacker, said("bo", Role::Human, "unsigned")).await;
    t.must_be_ignored(
        "an unsigned message in a room that requires signatures",
        id,
        Ignored::UnsignedRow,
    );
    let id = stored(
        attacker,
        said("olga", Role::Owner, "!config require-signatures off"),
    )
    .await;
    t.must_be_ignored(
        "an unsigned owner command in a room that requires signatures",
        id,
        Ignored::UnsignedRow,
    );
    let id = stored(attacker, forged_task("olga-again")).await;
    t.must_be_ignored(
        "task.created in a room that requires signatures",
        id,
        Ignored::UnsignedRow,
    );
    if let Some(imp) = impersonator {
        let id = stored(
            imp,
            said("bo", Role::Human, "under the honest name, unsigned"),
        )
        .await;
        t.must_be_ignored(
            "a row under the honest writer's name, unsigned, signatures required",
            id,
            Ignored::ForgedWriter,
        );
    }

    // Bad signatures: a valid signature copied onto other content, one made for
    // another writer's name, and a malformed one.
    let writer = honest.writer().expect("writer");
    let copied = said("bo", Role::Human, "a copied signature");
    raw_sig(
        copied.clone(),
        honest_key.sign_row(&writer, &honest_chat).to_text(),
    )
    .await;
    t.must_be_skipped(
        "a row with a signature copied from another row",
        copied.id(),
    );
    let other_writer = said("bo", Role::Human, "signed for another writer");
    raw_sig(
        other_writer.clone(),
        honest_key.sign_row("nobody", &other_writer.id()).to_text(),
    )
    .await;
    t.must_be_skipped("a row signed for another writer's name", other_writer.id());
    let malformed = said("bo", Role::Human, "a malformed signature");
    raw_sig(malformed.clone(), "ed25519:00:00".into()).await;
    t.must_be_skipped("a row with a malformed signature", malformed.id());

    t.check_readers(honest, &honest_rows).await;
}

async fn append(store: &dyn Store, row: NewInteraction) -> Result<(), String> {
    store
        .append(vec![row])
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn won(a: Acquired) -> i64 {
    match a {
        Acquired::Won(s) => s.epoch.get(),
        other => panic!("expected to win the claim: {other:?}"),
    }
}

/// The attacks that need no second role, on `store` (with the honest writer `honest`
/// having claimed `t1` for `ada`, epoch `epoch`). Shared by both backends.
async fn claim_battery(honest: &dyn Store, attacker: &dyn Store, t: &mut Tally) {
    const FENCE_ERR: &[&str] = &["huddle:", "refused"];
    let task_key = format!("task/{ROOM}/t1");
    let epoch = won(honest
        .acquire(&task_key, "ada", TTL)
        .await
        .expect("acquire"));
    // The honest path passes: a fenced task.claimed under the live claim.
    let fence = Fence {
        key: task_key.clone(),
        holder: "ada".into(),
        epoch: ClaimEpoch(epoch),
    };
    honest
        .append_fenced(&fence, vec![claimed("t1", "ada", epoch)])
        .await
        .expect("the honest task.claimed is accepted");
    // A retried task's generation is fenced by its own claim (plan 0052).
    let gen_key = format!("task/{ROOM}/t1/1");
    let gen_epoch = won(honest.acquire(&gen_key, "ada", TTL).await.expect("acquire"));
    let of_generation = |mut row: NewInteraction, g: u32| {
        row.body["generation"] = g.into();
        row
    };
    honest
        .append_fenced(
            &Fence {
                key: gen_key,
                holder: "ada".into(),
                epoch: ClaimEpoch(gen_epoch),
            },
            vec![of_generation(claimed("t1", "ada", gen_epoch), 1)],
        )
        .await
        .expect("generation 1's task.claimed is accepted under its own claim");

    for (what, row) in [
        (
            "task.claimed of a generation nobody holds",
            of_generation(claimed("t1", "ada", epoch), 2),
        ),
        (
            "task.completed of generation 1 at generation 0's epoch + 7",
            of_generation(completed("t1", "ada", gen_epoch + 7, "wrong epoch"), 1),
        ),
        (
            "task.claimed at epoch i64::MAX",
            claimed("t1", "ada", i64::MAX),
        ),
        (
            "task.completed at epoch i64::MAX",
            completed("t1", "ada", i64::MAX, "max epoch"),
        ),
        (
            "task.claimed at the next epoch",
            claimed("t1", "ada", epoch + 1),
        ),
        (
            "task.claimed at an earlier epoch",
            claimed("t1", "ada", epoch - 1),
        ),
        ("task.claimed at epoch 0", claimed("t1", "ada", 0)),
        (
            "task.completed by a non-holder at the live epoch",
            completed("t1", "bo", epoch, "not the holder"),
        ),
        (
            "task.completed by a stranger",
            completed("t1", "mallory", epoch, "a stranger"),
        ),
        (
            "task.completed as role owner",
            NewInteraction::new(
                ROOM,
                Verb::TaskCompleted,
                "olga",
                Role::Owner,
                TaskCompletedBody {
                    task: "t1".into(),
                    epoch: ClaimEpoch(epoch),
                    result: Some("forged".into()),
                    tokens: None,
                    generation: 0,
                }
                .to_body(),
            ),
        ),
        (
            "task.completed for a task nobody claimed",
            completed("t2", "ada", 1, "unclaimed"),
        ),
        (
            "task.failed by a non-holder",
            ended(Verb::TaskFailed, "t1", "bo", epoch),
        ),
        (
            "task.released by a non-holder",
            ended(Verb::TaskReleased, "t1", "bo", epoch),
        ),
        (
            "task.completed with a string epoch",
            NewInteraction::new(
                ROOM,
                Verb::TaskCompleted,
                "ada",
                Role::Agent,
                json!({ "task": "t1", "epoch": epoch.to_string(), "result": "x" }),
            ),
        ),
        (
            "task.completed naming no task",
            NewInteraction::new(
                ROOM,
                Verb::TaskCompleted,
                "ada",
                Role::Agent,
                json!({ "epoch": epoch, "result": "x" }),
            ),
        ),
    ] {
        t.attempt(what, append(attacker, row).await, FENCE_ERR);
    }

    // A reviewer's verdict is fenced by its review claim (plan 0053).
    let review = |agent: &str, epoch: i64, generation: u32| {
        let body = TaskReviewedBody {
            task: "t1".into(),
            epoch: ClaimEpoch(epoch),
            verdict: Verdict::Accept,
            feedback: String::new(),
            generation,
        };
        NewInteraction::new(ROOM, Verb::TaskReviewed, agent, Role::Agent, body.to_body())
    };
    t.attempt(
        "task.reviewed without a review claim",
        append(attacker, review("lead", 1, 0)).await,
        FENCE_ERR,
    );
    let review_key = format!("review/{ROOM}/t1/1");
    let review_epoch = won(honest
        .acquire(&review_key, "lead", TTL)
        .await
        .expect("acquire"));
    for (what, row) in [
        (
            "task.reviewed by an agent not holding the review claim",
            review("mallory", review_epoch, 1),
        ),
        (
            "task.reviewed at another epoch of the review claim",
            review("lead", review_epoch + 1, 1),
        ),
        (
            "task.reviewed of a generation whose review claim nobody holds",
            review("lead", review_epoch, 0),
        ),
    ] {
        t.attempt(what, append(attacker, row).await, FENCE_ERR);
    }
    honest
        .append_under(
            &[Fence {
                key: review_key.clone(),
                holder: "lead".into(),
                epoch: ClaimEpoch(review_epoch),
            }],
            true,
            vec![review("lead", review_epoch, 1)],
        )
        .await
        .expect("the honest verdict is accepted under its review claim");
    let mut second = review("lead", review_epoch, 1);
    second.body["feedback"] = "changed my mind".into();
    t.attempt(
        "a second verdict under a closed review claim",
        append(attacker, second).await,
        FENCE_ERR,
    );

    // An agent reply with no reply claim.
    let question = honest
        .append(vec![human("who answers?")])
        .await
        .expect("post")[0]
        .id;
    t.attempt(
        "an agent reply without its reply claim",
        append(attacker, reply("ada", question, "forged answer")).await,
        FENCE_ERR,
    );
    // The reply claim held by another agent.
    let reply_key = format!("reply/{ROOM}/{question}");
    let reply_epoch = won(honest
        .acquire(&reply_key, "bo", TTL)
        .await
        .expect("acquire"));
    t.attempt(
        "an agent reply by an agent not holding the reply claim",
        append(attacker, reply("ada", question, "forged answer")).await,
        FENCE_ERR,
    );
    // The honest reply passes and closes the claim; a second reply is refused.
    honest
        .append_under(
            &[Fence {
                key: reply_key.clone(),
                holder: "bo".into(),
                epoch: ClaimEpoch(reply_epoch),
            }],
            true,
            vec![reply("bo", question, "the real answer")],
        )
        .await
        .expect("the honest reply is accepted");
    t.attempt(
        "a second reply under a closed reply claim",
        append(attacker, reply("bo", question, "again")).await,
        FENCE_ERR,
    );

    // The holder of a released claim.
    assert!(honest
        .release(&task_key, "ada", ClaimEpoch(epoch))
        .await
        .expect("release"));
    t.attempt(
        "task.completed by the holder of a released claim",
        append(attacker, completed("t1", "ada", epoch, "released")).await,
        FENCE_ERR,
    );
    t.attempt(
        "task.completed by the holder of a released claim, through the honest store",
        append(honest, completed("t1", "ada", epoch, "released, honest")).await,
        FENCE_ERR,
    );

    // A completed task: the claim is closed by the completion; another completion at
    // the same epoch is refused.
    let epoch2 = won(honest
        .acquire(&task_key, "ada", TTL)
        .await
        .expect("re-acquire"));
    assert!(epoch2 > epoch);
    let fence2 = Fence {
        key: task_key.clone(),
        holder: "ada".into(),
        epoch: ClaimEpoch(epoch2),
    };
    honest
        .append_under(
            std::slice::from_ref(&fence2),
            true,
            vec![completed("t1", "ada", epoch2, "honest").clone()],
        )
        .await
        .expect("the honest completion is accepted");
    // Its retry (an ambiguous commit) is accepted and writes nothing.
    let again = honest
        .append_under(
            std::slice::from_ref(&fence2),
            true,
            vec![completed("t1", "ada", epoch2, "honest")],
        )
        .await
        .expect("a retried completion is accepted");
    assert!(!again[0].inserted);
    t.attempt(
        "a second completion under a closed claim",
        append(attacker, completed("t1", "ada", epoch2, "after close")).await,
        FENCE_ERR,
    );
}

/// A lot of `items` in the battery's room (plan 0080).
fn lot_of(items: &[NewInteraction]) -> NewInteraction {
    NewInteraction::lot(
        &items[0].room,
        "relay",
        items,
        &huddle_core::Limits::default(),
    )
    .expect("a lot of valid items")
}

/// Task lots (plan 0080): the database checks every task item of a lot against its
/// claim, as it checks the row the item stands for, and refuses the whole lot when one
/// fails. Shared by both backends.
async fn lot_battery(honest: &dyn Store, attacker: &dyn Store, t: &mut Tally) {
    const FENCE_ERR: &[&str] = &["huddle:", "refused"];
    let key = format!("task/{ROOM}/t3");
    let epoch = won(honest.acquire(&key, "ada", TTL).await.expect("acquire"));
    let fence = Fence {
        key: key.clone(),
        holder: "ada".into(),
        epoch: ClaimEpoch(epoch),
    };
    let good = claimed("t3", "ada", epoch);
    for (what, bad) in [
        (
            "a lot with an item for a task nobody claimed",
            claimed("t8", "ada", 1),
        ),
        (
            "a lot with an item by a non-holder",
            completed("t3", "bo", epoch, "not the holder"),
        ),
        (
            "a lot with an item at the next epoch",
            completed("t3", "ada", epoch + 1, "next epoch"),
        ),
        (
            "a lot with an item at epoch i64::MAX",
            completed("t3", "ada", i64::MAX, "max epoch"),
        ),
        (
            "a lot with an item whose epoch is text",
            NewInteraction::new(
                ROOM,
                Verb::TaskCompleted,
                "ada",
                Role::Agent,
                json!({ "task": "t3", "epoch": epoch.to_string(), "result": "x" }),
            ),
        ),
        (
            "a lot with an item whose epoch is past i64::MAX",
            NewInteraction::new(
                ROOM,
                Verb::TaskCompleted,
                "ada",
                Role::Agent,
                json!({ "task": "t3", "epoch": 9_999_999_999_999_999_999u64, "result": "x" }),
            ),
        ),
        (
            "a lot with an item naming no task",
            NewInteraction::new(
                ROOM,
                Verb::TaskClaimed,
                "ada",
                Role::Agent,
                json!({ "epoch": epoch }),
            ),
        ),
    ] {
        t.attempt(
            what,
            append(attacker, lot_of(&[good.clone(), bad])).await,
            FENCE_ERR,
        );
    }
    // The honest lot passes and closes the claim; a second completion lot is refused.
    honest
        .append_under(
            std::slice::from_ref(&fence),
            true,
            vec![lot_of(&[good, completed("t3", "ada", epoch, "honest")])],
        )
        .await
        .expect("the honest lot is accepted under its claim");
    t.attempt(
        "a completion lot under a closed claim",
        append(
            attacker,
            lot_of(&[completed("t3", "ada", epoch, "after close")]),
        )
        .await,
        FENCE_ERR,
    );
    // A released claim.
    let key4 = format!("task/{ROOM}/t4");
    let epoch4 = won(honest.acquire(&key4, "ada", TTL).await.expect("acquire"));
    assert!(honest
        .release(&key4, "ada", ClaimEpoch(epoch4))
        .await
        .expect("release"));
    t.attempt(
        "a lot with an item under a released claim",
        append(
            attacker,
            lot_of(&[completed("t4", "ada", epoch4, "released")]),
        )
        .await,
        FENCE_ERR,
    );
}

/// Lot rows no writer builds, for a raw INSERT: `(what, role, body)`. Each must be
/// refused by the database's insert check.
fn misshapen_lots() -> Vec<(&'static str, &'static str, String)> {
    let prompted = r#"{"verb":"turn.prompted","actor":"ada","role":"agent","body":{"turn":"x"}}"#;
    vec![
        (
            "a lot with a config.set item",
            "system",
            r#"{"items":[{"verb":"config.set","actor":"ada","role":"agent","body":{}}]}"#.into(),
        ),
        (
            "a lot with an owner's item",
            "system",
            r#"{"items":[{"verb":"task.completed","actor":"olga","role":"owner","body":{"task":"t1","epoch":1}}]}"#.into(),
        ),
        (
            "a lot of 65 items",
            "system",
            format!(r#"{{"items":[{}]}}"#, vec![prompted; 65].join(",")),
        ),
        (
            "a lot with no items",
            "system",
            r#"{"items":[]}"#.into(),
        ),
        (
            "a lot with a key beside its items",
            "system",
            format!(r#"{{"items":[{prompted}],"also":1}}"#),
        ),
        (
            "a lot written as an agent",
            "agent",
            format!(r#"{{"items":[{prompted}]}}"#),
        ),
    ]
}

#[tokio::test]
async fn sqlite_refuses_forged_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("h.db");
    let path = path.to_str().expect("utf-8 path");
    let honest = SqliteStore::open(path, StoreOptions::default())
        .await
        .expect("open");
    let attacker = SqliteStore::open(
        path,
        StoreOptions {
            relay: "mallory-relay".into(),
            ..StoreOptions::default()
        },
    )
    .await
    .expect("open");
    let mut t = Tally::default();
    claim_battery(&honest, &attacker, &mut t).await;
    lot_battery(&honest, &attacker, &mut t).await;

    // Raw statements on the file (a writer not going through huddle at all).
    let conn = rusqlite::Connection::open(path).expect("open raw");
    for (what, role, body) in misshapen_lots() {
        let out = conn
            .execute(
                "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay) \
                 VALUES (randomblob(32), 'lobby', 'task.lot', 'relay', ?1, ?2, 0, 'x')",
                rusqlite::params![role, body],
            )
            .map(|_| ())
            .map_err(|e| e.to_string());
        t.attempt(&format!("a raw INSERT of {what}"), out, &["huddle:"]);
    }
    for (what, sql) in [
        (
            "UPDATE of an interaction",
            "UPDATE interaction SET body = '{}'",
        ),
        ("DELETE of an interaction", "DELETE FROM interaction"),
    ] {
        let out = conn.execute(sql, []).map(|_| ()).map_err(|e| e.to_string());
        t.attempt(what, out, &["append-only"]);
    }
    let out = conn
        .execute(
            "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay) \
             VALUES (randomblob(32), 'lobby', 'task.completed', 'ada', 'agent', \
                     '{\"task\":\"t1\",\"epoch\":9223372036854775807}', 0, 'x')",
            [],
        )
        .map(|_| ())
        .map_err(|e| e.to_string());
    t.attempt(
        "a raw INSERT of a completion at i64::MAX",
        out,
        &["huddle:"],
    );

    // The forgeries only the readers can judge: under the honest writer's name (any
    // writer of the file can claim it), as a bound agent, unsigned, badly signed.
    let honest_key = WriterSecret::from_seed([0x0b; 32]);
    let signing = SqliteStore::open(
        path,
        StoreOptions {
            relay: "honest".into(),
            signer: Some(honest_key.clone()),
            ..StoreOptions::default()
        },
    )
    .await
    .expect("open");
    let impersonator = SqliteStore::open(
        path,
        StoreOptions {
            relay: "honest".into(),
            ..StoreOptions::default()
        },
    )
    .await
    .expect("open");
    let raw_sig = |n: NewInteraction, sig: String| {
        let conn = &conn;
        async move {
            conn.execute(
                "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay, sig) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, 'honest', ?7)",
                rusqlite::params![
                    &n.id().0[..],
                    n.room,
                    n.verb.as_str(),
                    n.actor,
                    n.role.as_str(),
                    n.body_text(),
                    sig
                ],
            )
            .expect("the file takes a raw row");
        }
    };
    fold_battery(
        &signing,
        &honest_key,
        &attacker,
        Some(&impersonator),
        Some(Ignored::Misbound),
        raw_sig,
        &mut t,
    )
    .await;
    t.finish("sqlite");
}

#[tokio::test]
async fn postgres_refuses_forged_rows_and_statements() {
    let db = test_database().await;
    admin::init(&db.url).await.expect("admin init");
    // Role names are cluster-wide: make them unique to this database.
    let tag = db.name.trim_start_matches("huddle_t_").replace('_', "-");
    let honest_role = format!("ra-{tag}");
    let attacker_role = format!("rb-{tag}");
    let owner_role = format!("ow-{tag}");
    let honest_url = admin::add_login(&db.url, &honest_role, LoginKind::Relay)
        .await
        .expect("add relay a")
        .url;
    let attacker_url = admin::add_login(&db.url, &attacker_role, LoginKind::Relay)
        .await
        .expect("add relay b")
        .url;
    let owner_url = admin::add_login(&db.url, &owner_role, LoginKind::Owner)
        .await
        .expect("add owner")
        .url;
    let honest = PgStore::connect(&honest_url, StoreOptions::default())
        .await
        .expect("connect as relay a");
    let attacker = PgStore::connect(&attacker_url, StoreOptions::default())
        .await
        .expect("connect as relay b");
    let mut t = Tally::default();
    claim_battery(&honest, &attacker, &mut t).await;
    lot_battery(&honest, &attacker, &mut t).await;

    // Rows the honest relay wrote carry its role.
    let rows = honest
        .read_forward(huddle_core::Position::START, 1000)
        .await
        .expect("read");
    assert!(!rows.rows.is_empty());
    assert!(rows.rows.iter().all(|r| r.relay == honest_role));

    // Claims belong to the role that acquired them.
    const FENCE_ERR: &[&str] = &["huddle:", "refused"];
    let key = format!("task/{ROOM}/t9");
    let epoch = won(honest.acquire(&key, "ada", TTL).await.expect("acquire"));
    t.attempt(
        "task.claimed by another relay under a live claim it did not acquire",
        append(&attacker, claimed("t9", "ada", epoch)).await,
        FENCE_ERR,
    );
    t.attempt(
        "a lot by another relay with an item under a live claim it did not acquire",
        append(&attacker, lot_of(&[claimed("t9", "ada", epoch)])).await,
        FENCE_ERR,
    );
    let fence = Fence {
        key: key.clone(),
        holder: "ada".into(),
        epoch: ClaimEpoch(epoch),
    };
    let out = attacker
        .append_fenced(&fence, vec![claimed("t9", "ada", epoch)])
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    t.attempt(
        "a fenced append presenting another relay's claim",
        out,
        &["fenced"],
    );
    let taken = attacker.acquire(&key, "ada", TTL).await.expect("acquire");
    t.attempt(
        "acquiring another relay's live claim under the same holder name",
        if taken.won() {
            Ok(())
        } else {
            Err(format!("held: {taken:?}"))
        },
        &["held"],
    );
    let renewed = attacker
        .renew(&key, "ada", ClaimEpoch(epoch), TTL)
        .await
        .expect("renew");
    t.attempt(
        "renewing another relay's claim",
        renewed.map_or(Err("not renewed".to_string()), |_| Ok(())),
        &["not renewed"],
    );
    let released = attacker
        .release(&key, "ada", ClaimEpoch(epoch))
        .await
        .expect("release");
    t.attempt(
        "releasing another relay's claim",
        if released {
            Ok(())
        } else {
            Err("not released".to_string())
        },
        &["not released"],
    );

    // Raw statements as the attacking relay role and as the owner role.
    let (raw, driver) = tokio_postgres::connect(&attacker_url, tokio_postgres::NoTls)
        .await
        .expect("raw connect");
    let driver = tokio::spawn(driver);
    let (owner, owner_driver) = tokio_postgres::connect(&owner_url, tokio_postgres::NoTls)
        .await
        .expect("owner connect");
    let owner_driver = tokio::spawn(owner_driver);
    let denied: &[&str] = &["permission denied", "must be owner", "huddle:"];
    let forged_relay = format!(
        "INSERT INTO interaction (id, room, verb, actor, role, body, relay) \
         VALUES (decode(repeat('ab', 32), 'hex'), 'lobby', 'message.posted', 'ana', 'human', \
                 '{{\"text\":\"hi\"}}', '{honest_role}')"
    );
    let statements: Vec<(&str, String)> = vec![
        ("a row whose relay names another role", forged_relay),
        (
            "UPDATE of interactions",
            "UPDATE interaction SET body = '{}'".into(),
        ),
        ("DELETE of interactions", "DELETE FROM interaction".into()),
        ("TRUNCATE of interactions", "TRUNCATE interaction".into()),
        (
            "disabling the append-only trigger",
            "ALTER TABLE interaction DISABLE TRIGGER interaction_append_only".into(),
        ),
        (
            "disabling the insert check",
            "ALTER TABLE interaction DISABLE TRIGGER interaction_checked".into(),
        ),
        (
            "dropping the append-only trigger",
            "DROP TRIGGER interaction_append_only ON interaction".into(),
        ),
        (
            "replacing the insert check function",
            "CREATE OR REPLACE FUNCTION huddle_check_insert() RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
                .into(),
        ),
        (
            "ALTER TABLE interaction",
            "ALTER TABLE interaction ADD COLUMN x int".into(),
        ),
        (
            "skipping triggers with session_replication_role",
            "SET session_replication_role = replica".into(),
        ),
        (
            "UPDATE of a claim's epoch to i64::MAX",
            "UPDATE external_claim SET epoch = 9223372036854775807".into(),
        ),
        (
            "INSERT of a claim",
            "INSERT INTO external_claim (key, holder, epoch, expires_at) \
             VALUES ('task/lobby/t7', 'ada', 9223372036854775807, now() + interval '1 hour')"
                .into(),
        ),
        ("DELETE of claims", "DELETE FROM external_claim".into()),
        ("dropping the ledger", "DROP TABLE interaction".into()),
        (
            "creating a shadowing table in public",
            "CREATE TABLE public.external_claim_x (k text)".into(),
        ),
    ];
    for (what, sql) in &statements {
        let out = raw.batch_execute(sql).await.map_err(|e| db_error(&e));
        t.attempt(&format!("relay role: {what}"), out, denied);
    }
    for (what, sql) in [
        (
            "claiming through the claim functions",
            "SELECT * FROM huddle_claim_acquire('task/lobby/t8', 'ada', 60000000)",
        ),
        (
            "UPDATE of interactions",
            "UPDATE interaction SET body = '{}'",
        ),
        ("TRUNCATE of interactions", "TRUNCATE interaction"),
        (
            "disabling the append-only trigger",
            "ALTER TABLE interaction DISABLE TRIGGER ALL",
        ),
    ] {
        let out = owner.batch_execute(sql).await.map_err(|e| db_error(&e));
        t.attempt(&format!("owner role: {what}"), out, denied);
    }
    let owner_claim = format!(
        "INSERT INTO interaction (id, room, verb, actor, role, body) \
         VALUES (decode(repeat('cd', 32), 'hex'), 'lobby', 'task.claimed', 'ada', 'agent', \
                 '{{\"task\":\"t9\",\"epoch\":{epoch},\"attempt\":1}}')"
    );
    let out = owner
        .batch_execute(&owner_claim)
        .await
        .map_err(|e| db_error(&e));
    t.attempt("owner role: task.claimed at a live epoch", out, denied);

    // The administrator binds ada (in room vault) to the honest relay role: the
    // database refuses rows as ada from any other role, however they are made.
    assert!(admin::bind_agent(&db.url, VAULT, "ada", &honest_role)
        .await
        .expect("bind ada"));
    const BOUND_ERR: &[&str] = &["may not write as agent ada in room vault"];
    t.attempt(
        "relay role: a message as an agent bound to another role",
        append(&attacker, said("ada", Role::Agent, "I am ada")).await,
        BOUND_ERR,
    );
    t.attempt(
        "relay role: agent.registered as an agent bound to another role",
        append(
            &attacker,
            in_vault(
                Verb::AgentRegistered,
                "ada",
                Role::Agent,
                json!({"capabilities": []}),
            ),
        )
        .await,
        BOUND_ERR,
    );
    let vault_key = format!("task/{VAULT}/t5");
    let vault_epoch = won(attacker
        .acquire(&vault_key, "ada", TTL)
        .await
        .expect("acquire"));
    let out = attacker
        .append_fenced(
            &Fence {
                key: vault_key.clone(),
                holder: "ada".into(),
                epoch: ClaimEpoch(vault_epoch),
            },
            vec![NewInteraction {
                room: VAULT.into(),
                ..claimed("t5", "ada", vault_epoch)
            }],
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    t.attempt(
        "relay role: task.claimed as a bound agent under a claim it acquired",
        out,
        BOUND_ERR,
    );
    let out = raw
        .batch_execute(&format!(
            "INSERT INTO interaction (id, room, verb, actor, role, body) \
             VALUES (decode(repeat('ef', 32), 'hex'), '{VAULT}', 'message.posted', 'ada', \
                     'agent', '{{\"text\":\"raw\"}}')"
        ))
        .await
        .map_err(|e| db_error(&e));
    t.attempt(
        "relay role: a raw INSERT as a bound agent",
        out,
        &["may not write as agent"],
    );
    let out = attacker
        .append_fenced(
            &Fence {
                key: vault_key.clone(),
                holder: "ada".into(),
                epoch: ClaimEpoch(vault_epoch),
            },
            vec![lot_of(&[NewInteraction {
                room: VAULT.into(),
                ..completed("t5", "ada", vault_epoch, "as a bound agent")
            }])],
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    t.attempt(
        "relay role: a lot with an item as a bound agent under a claim it acquired",
        out,
        &["may not write as agent"],
    );
    for (n, (what, role, body)) in misshapen_lots().into_iter().enumerate() {
        let out = raw
            .batch_execute(&format!(
                "INSERT INTO interaction (id, room, verb, actor, role, body) \
                 VALUES (decode(repeat('{:02x}', 32), 'hex'), 'lobby', 'task.lot', 'relay', \
                         '{role}', '{body}')",
                0x70 + n
            ))
            .await
            .map_err(|e| db_error(&e));
        t.attempt(
            &format!("relay role: a raw INSERT of {what}"),
            out,
            &["huddle:"],
        );
    }
    for (what, sql) in [
        (
            "binding an agent to itself",
            format!(
                "INSERT INTO agent_binding (room, agent, writer, bound_us) \
                 VALUES ('{VAULT}', 'ada', '{attacker_role}', 0)"
            ),
        ),
        (
            "removing the bindings",
            "DELETE FROM agent_binding".to_string(),
        ),
        (
            "rewriting a binding",
            format!("UPDATE agent_binding SET writer = '{attacker_role}'"),
        ),
    ] {
        let out = raw.batch_execute(&sql).await.map_err(|e| db_error(&e));
        t.attempt(&format!("relay role: {what}"), out, denied);
        let out = owner.batch_execute(&sql).await.map_err(|e| db_error(&e));
        t.attempt(&format!("owner role: {what}"), out, denied);
    }
    // The bound role itself may write as ada.
    append(&honest, said("ada", Role::Agent, "the real ada"))
        .await
        .expect("the bound role writes as ada");

    // The forgeries only the readers can judge, from the attacking relay role.
    let honest_key = WriterSecret::from_seed([0x0b; 32]);
    let signing = PgStore::connect(
        &honest_url,
        StoreOptions {
            signer: Some(honest_key.clone()),
            ..StoreOptions::default()
        },
    )
    .await
    .expect("connect as relay a, signing");
    assert_eq!(signing.writer().as_deref(), Some(honest_role.as_str()));
    let raw_sig = |n: NewInteraction, sig: String| {
        let raw = &raw;
        async move {
            raw.execute(
                "INSERT INTO interaction (id, room, verb, actor, role, body, sig) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &&n.id().0[..],
                    &n.room,
                    &n.verb.as_str(),
                    &n.actor,
                    &n.role.as_str(),
                    &n.body_text(),
                    &sig,
                ],
            )
            .await
            .expect("the database takes a row it cannot check the signature of");
        }
    };
    fold_battery(
        &signing,
        &honest_key,
        &attacker,
        None,
        None,
        raw_sig,
        &mut t,
    )
    .await;
    drop(raw);
    drop(owner);
    let _ = driver.await;
    let _ = owner_driver.await;

    // The honest relay's work still passes after all of that.
    let fence = Fence {
        key,
        holder: "ada".into(),
        epoch: ClaimEpoch(epoch),
    };
    honest
        .append_under(
            std::slice::from_ref(&fence),
            true,
            vec![claimed("t9", "ada", epoch)],
        )
        .await
        .expect("the honest write still passes");
    t.finish("postgres");
}

fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Every row of `room`, by the store's reader.
async fn rows_of(store: &dyn Store, room: &str) -> Vec<huddle_core::Interaction> {
    let mut rows = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 500).await.expect("read");
        if batch.next == cursor {
            return rows;
        }
        cursor = batch.next;
        rows.extend(batch.rows);
    }
}

/// The archive request for every row of `room` as `owner` (unsigned: the database
/// judges the role, the readers the signature).
async fn archive_request(store: &dyn Store, room: &str, owner: &str) -> ArchiveRequest {
    let rows = rows_of(store, room).await;
    ArchiveRequest {
        rows: rows.len() as u64,
        archived: huddle_core::archive::archived_row(room, owner, rows.iter().map(|r| &r.id)),
    }
}

/// A raw session as `url`'s role.
async fn raw_session(url: &str) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("raw connect");
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, driver)
}

/// Archiving on Postgres (plan 0057): rows leave the ledger only through
/// `huddle_room_archive`, called by the role that created the room (or the
/// administrator) — never by another owner role, never by a relay role, even for a
/// room the relay created. No role may delete rows, touch `archived_room` or prune
/// claims; once archived, the room takes no row from anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_leave_only_by_their_owners_archive() {
    let db = test_database().await;
    admin::init(&db.url).await.expect("admin init");
    let tag = db.name.trim_start_matches("huddle_t_").replace('_', "-");
    let mut urls = BTreeMap::new();
    for (name, kind) in [
        ("oa", LoginKind::Owner),
        ("ob", LoginKind::Owner),
        ("rl", LoginKind::Relay),
    ] {
        let role = format!("{name}-{tag}");
        let url = admin::add_login(&db.url, &role, kind)
            .await
            .expect("add login")
            .url;
        urls.insert(name, url);
    }
    let connect = |name: &str| {
        let url = urls[name].clone();
        async move {
            PgStore::connect(&url, StoreOptions::default())
                .await
                .expect("connect")
        }
    };
    let (owner_a, owner_b, relay) = (
        connect("oa").await,
        connect("ob").await,
        connect("rl").await,
    );
    let created = |room: &str, owner: &str| {
        NewInteraction::new(
            room,
            Verb::RoomCreated,
            owner,
            Role::Owner,
            json!({ "owner": owner }),
        )
    };
    owner_a
        .append(vec![created("done", "olga")])
        .await
        .expect("create");
    for i in 0..5 {
        relay
            .append(vec![NewInteraction::new(
                "done",
                Verb::MessagePosted,
                "ada",
                Role::Agent,
                json!({ "text": format!("step {i}") }),
            )])
            .await
            .expect("a relay writes in the room");
    }
    relay
        .append(vec![created("relays-own", "rl")])
        .await
        .expect("create");

    let refused = |r: huddle_store::Result<huddle_store::ArchiveOutcome>| match r {
        Err(StoreError::ArchiveRefused {
            reason: ArchiveRefusal::NotAllowed(why),
            ..
        }) => why,
        other => panic!("expected a refusal for the role, got {other:?}"),
    };
    let request = archive_request(&owner_a, "done", "olga").await;
    let why = refused(owner_b.archive_room(request.clone()).await);
    assert!(why.contains("may not archive room done"), "{why}");
    let why = refused(relay.archive_room(request.clone()).await);
    assert!(why.contains("may not archive"), "{why}");
    let own = archive_request(&relay, "relays-own", "rl").await;
    let why = refused(relay.archive_room(own).await);
    assert!(why.contains("may not archive room relays-own"), "{why}");
    assert_eq!(rows_of(&owner_a, "done").await.len(), 6, "nothing removed");
    // A room.archived row of its own making would make relays stop serving the room.
    for store in [&relay, &owner_a] {
        let err = store
            .append(vec![request.archived.clone()])
            .await
            .expect_err("a room.archived row outside an archive");
        assert!(err.to_string().contains("only by archiving"), "{err}");
    }

    // Raw statements: no delete, no archive mark, no prune, for any role.
    let denied = ["permission denied", "must be owner", "huddle:"];
    for name in ["oa", "rl"] {
        let (raw, driver) = raw_session(&urls[name]).await;
        for sql in [
            "DELETE FROM interaction WHERE room = 'done'".to_string(),
            "INSERT INTO archived_room (room, archived_id, rows, archived_by, removing) \
             VALUES ('done', decode(repeat('ab', 32), 'hex'), 0, 'x', true)"
                .to_string(),
            "UPDATE archived_room SET removing = true".to_string(),
            "SELECT * FROM huddle_prune_claims(0)".to_string(),
            "DROP TRIGGER interaction_no_delete ON interaction".to_string(),
            "ALTER TABLE interaction DISABLE TRIGGER interaction_archived_room".to_string(),
        ] {
            let err = raw
                .batch_execute(&sql)
                .await
                .expect_err(&format!("{name}: {sql} must be refused"));
            let text = db_error(&err);
            assert!(
                denied.iter().any(|d| text.contains(d)),
                "{name}: {sql}: refused, but not clearly: {text}"
            );
        }
        drop(raw);
        let _ = driver.await;
    }
    // Even the schema owner's own DELETE is refused by the trigger: only the
    // archive function's mark lets rows go.
    let (admin_raw, admin_driver) = raw_session(&db.url).await;
    let err = admin_raw
        .batch_execute("DELETE FROM interaction WHERE room = 'done'")
        .await
        .expect_err("the administrator's plain DELETE is refused");
    assert!(db_error(&err).contains("append-only"), "{}", db_error(&err));

    // The creating role archives it; then nobody adds a row, and the claims of the
    // room taken since are pruned by the administrator alone.
    let out = owner_a
        .archive_room(request)
        .await
        .expect("the owner archives");
    assert_eq!(out.rows_removed, 6);
    let left = rows_of(&relay, "done").await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].verb, Verb::RoomArchived);
    assert_eq!(
        left[0].relay,
        format!("oa-{tag}"),
        "written by the owner's role"
    );
    for store in [&owner_a, &owner_b, &relay] {
        let err = store
            .append(vec![created("done", "mallory")])
            .await
            .expect_err("an archived room takes no row");
        assert!(err.to_string().contains("archived"), "{err}");
    }
    relay
        .acquire("task/done/t1", "ada", TTL)
        .await
        .expect("acquire");
    let pruned = relay.prune_claims(Duration::ZERO).await;
    assert!(
        pruned
            .as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied")),
        "{pruned:?}"
    );
    let admin_store = PgStore::connect(&db.url, StoreOptions::default())
        .await
        .expect("connect as the administrator");
    let pruned = admin_store
        .prune_claims(Duration::ZERO)
        .await
        .expect("the administrator prunes");
    assert_eq!(pruned.archived_rooms, 1);
    drop(admin_raw);
    let _ = admin_driver.await;
}

/// Claim drivers under relay roles (plan 0094): a relay role hands off a task with one
/// claim driven by its relay id, in one statement (the new signatures are granted to
/// relay roles), and a relay of the release before — calling the batch acquire
/// without drivers, as it did — finds the claim held, as does the same role for
/// another driver. Only the same driver keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claim_drivers_hold_against_older_relays_and_other_drivers() {
    let db = test_database().await;
    admin::init(&db.url).await.expect("admin init");
    let tag = db.name.trim_start_matches("huddle_t_").replace('_', "-");
    let url = admin::add_login(&db.url, &format!("rd-{tag}"), LoginKind::Relay)
        .await
        .expect("add relay")
        .url;
    let relay = PgStore::connect(&url, StoreOptions::default())
        .await
        .expect("connect as relay");
    let key = "task/lobby/t1";
    let h = relay
        .acquire_and_append(
            &[huddle_store::ClaimRequest::new(key, "ada", TTL).driven_by("relay-1")],
            vec![huddle_store::ConditionalAppend {
                when_won: vec![(0, huddle_store::Epoch(1))],
                rows: vec![claimed("t1", "ada", 1)],
            }],
        )
        .await
        .expect("hand-off");
    assert!(h.acquired[0].as_ref().is_some_and(Acquired::won), "{h:?}");
    assert!(
        h.appended[0].is_some(),
        "the hand-off's row is written: {h:?}"
    );
    let (raw, conn) = raw_session(&url).await;
    // A relay of the release before (the four-argument batch acquire, no driver),
    // another driver, and the same driver.
    let args = "ARRAY['task/lobby/t1'], ARRAY['ada'], ARRAY[60000000::int8], ARRAY[0]";
    for (drivers, want, why) in [
        ("", (false, 1), "an older relay finds the driven claim held"),
        (
            ", ARRAY['relay-2']",
            (false, 1),
            "another driver finds it held",
        ),
        (
            ", ARRAY['relay-1']",
            (true, 1),
            "the same driver keeps it at its epoch",
        ),
    ] {
        let sql = format!("SELECT o_won, o_epoch FROM huddle_claim_acquire_batch({args}{drivers})");
        let row = raw.query_one(sql.as_str(), &[]).await.expect("acquire");
        let got = (row.get::<_, bool>(0), row.get::<_, i64>(1));
        assert_eq!(got, want, "{why}");
    }
    let listed = relay.list_claims(key).await.expect("list");
    assert_eq!(listed[0].driver.as_deref(), Some("relay-1"), "{listed:?}");
    drop(raw);
    conn.abort();
}
