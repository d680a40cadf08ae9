//! The forged-row battery (plan 0017): rows and statements a malicious writer might
//! try, on each backend where the attack applies. Each must be refused by the
//! database with a clear error; the test prints how many were tried and refused.
//!
//! Postgres runs under the roles `huddle admin` makes: two relay roles and an owner
//! (writer) role. SQLite has no roles: there the claim checks alone apply (whoever can
//! write the file is trusted; see docs/security.md).

use std::time::Duration;

use huddle_core::tasks::{TaskClaimedBody, TaskCompletedBody, TaskEndedBody};
use huddle_core::ClaimEpoch;
use huddle_core::{InteractionId, NewInteraction, Role, Verb};
use huddle_store::postgres::admin::{self, LoginKind};
use huddle_store::postgres::PgStore;
use huddle_store::sqlite::SqliteStore;
use huddle_store::{Acquired, Claims, Fence, Ledger, Store, StoreOptions};
use huddle_testkit::test_database;
use serde_json::json;

const ROOM: &str = "lobby";
const TTL: Duration = Duration::from_secs(60);

fn claimed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    let body = TaskClaimedBody {
        task: task.into(),
        epoch: ClaimEpoch(epoch),
        attempt: 1,
    };
    NewInteraction::new(ROOM, Verb::TaskClaimed, agent, Role::Agent, body.to_body())
}

fn completed(task: &str, agent: &str, epoch: i64, note: &str) -> NewInteraction {
    let body = TaskCompletedBody {
        task: task.into(),
        epoch: ClaimEpoch(epoch),
        result: Some(format!("forged: {note}")),
        tokens: None,
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

/// The tally: every attempt is refused (with the text that says why) or it is a
/// failure of the test.
#[derive(Default)]
struct Tally {
    tried: usize,
    refused: usize,
    got_in: Vec<String>,
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

    fn finish(self, backend: &str) {
        eprintln!(
            "{backend}: {} forged rows and statements tried, {} refused by the database, {} got in",
            self.tried,
            self.refused,
            self.got_in.len()
        );
        assert!(
            self.got_in.is_empty(),
            "{backend}: these got in: {:?}",
            self.got_in
        );
        assert_eq!(self.tried, self.refused);
    }
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

    for (what, row) in [
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

    // Raw statements on the file (a writer not going through huddle at all).
    let conn = rusqlite::Connection::open(path).expect("open raw");
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
