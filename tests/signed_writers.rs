//! End-to-end: signed writers and a room that requires signatures (plan 0031), on
//! SQLite — where any writer of the file can write any `relay` value, so only
//! signatures make a row's writer, and with it the agent binding, hold. Real relays
//! sign with their keys; the owner registers them; rows forged into the file under a
//! relay's name or from an unregistered writer change nothing and are counted by
//! every reader; writers without a registered key are refused with a reason; a CLI
//! writer, an agent acting for itself and a driven agent's MCP server sign too.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::mcp::driven_agent_script;
use common::relays::*;
use common::{fails, huddle, ok};
use huddle_core::keys::WriterSecret;
use huddle_core::{NewInteraction, Role, TaskStatus, Verb};
use huddle_store::{Store, StoreOptions};
use serde_json::json;

/// `huddle writer-key ID` with the key file `dir/ID.key`: the `ID=<key>` entry.
fn writer_key(h: &Huddle, id: &str) -> (String, PathBuf) {
    let path = h.dir().join(format!("{id}.key"));
    let entry = ok({
        let mut c = huddle(&h.db.url);
        c.arg("--relay-key").arg(&path).args(["writer-key", id]);
        c
    });
    let entry = entry.trim().to_string();
    assert!(entry.starts_with(&format!("{id}=")), "{entry}");
    (entry, path)
}

fn signing(key: &Path) -> String {
    format!(
        "sign = true\nkey = {}",
        serde_json::to_string(&key.display().to_string()).expect("a path string")
    )
}

/// A store writing into the test's database as writer `relay`, signing with `key`.
async fn store_as(h: &Huddle, relay: &str, key: Option<WriterSecret>) -> Arc<dyn Store> {
    huddle_store::open(
        &h.db.url,
        StoreOptions {
            relay: relay.into(),
            signer: key,
            ..Default::default()
        },
    )
    .await
    .expect("open a store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_rows_signed_by_registered_writers_count() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    let (e0, k0) = writer_key(&h, "r0");
    let (e1, k1) = writer_key(&h, "r1");
    let (edesk, kdesk) = writer_key(&h, "desk");
    let (ecy, kcy) = writer_key(&h, "cy-cli");
    // The same command again reads the key, it does not make another.
    assert_eq!(writer_key(&h, "r0").0, e0);

    // r1 hosts bo; tasks go to their assignee, so ada's task waits for ada's relay.
    h.spawn_relay_with("r1", vec![AgentSpec::sim("bo", 50)], &signing(&k1));
    h.wait_registered(&["bo"]).await;
    h.config("allocation push").await;
    h.config(&format!("relay-keys {e0},{e1},{edesk},{ecy}"))
        .await;
    h.config("agents ada@r0,bo@r1,cy@cy-cli").await;
    // The trust keys are room-wide: refused in a thread, with the reason.
    let reply = ok({
        let mut c = huddle(&h.db.url);
        c.args([
            "post", "--room", &h.room, "--thread", "side", "--as", &h.owner,
        ])
        .args(["--wait", "!config agents ada@r9"]);
        c
    });
    assert!(
        reply.contains("`agents` applies to the whole room") && reply.contains("!config room"),
        "{reply}"
    );
    h.config("require-signatures on").await;
    h.delegate("t: ada's work @ada\nc: cy's work @cy\nd: dan's work @dan")
        .await;

    // Forgeries written straight into the file.
    let mut unsigned: u64 = 0;
    let mut forged_writer: u64 = 0;
    // Unsigned, from a writer the room does not know: bo must not answer it.
    let hello = h.post("mallory", Role::Human, "@bo do something").await;
    unsigned += 1;
    // Under r0's name without r0's key: ada's claim and a forged completion, under a
    // claim the forger really took (the file's fences let them in).
    let impostor = store_as(&h, "r0", None).await;
    let (epoch, written) = forge_claim_and_completion(&*impostor, &h.room, "t", "ada").await;
    forged_writer += written;
    let as_ada = |verb, body| NewInteraction::new(h.room.as_str(), verb, "ada", Role::Agent, body);
    // Under r0's name, signed by a key that is not r0's.
    let mallory = store_as(&h, "r0", Some(WriterSecret::from_seed([0x66; 32]))).await;
    mallory
        .append(vec![as_ada(
            Verb::AgentRegistered,
            json!({"capabilities": ["evil"]}),
        )])
        .await
        .expect("append");
    forged_writer += 1;
    // A writer signing with its own key, which nobody registered.
    let stranger = store_as(&h, "r9", Some(WriterSecret::from_seed([0x99; 32]))).await;
    stranger
        .append(vec![NewInteraction::new(
            h.room.as_str(),
            Verb::MessagePosted,
            "mallory",
            Role::Human,
            json!({"text": "@bo signed by a stranger"}),
        )])
        .await
        .expect("append");
    unsigned += 1;

    // Writers without a registered key are refused before they write, with the reason.
    let messages = |h: &Huddle| h.ledger.of_verb(Verb::MessagePosted).count();
    h.refresh().await;
    let before = messages(&h);
    let err = fails({
        let mut c = huddle(&h.db.url);
        c.args(["post", "--room", &h.room, "--as", "bo", "hi"]);
        c
    });
    assert!(
        err.contains("not posted") && err.contains("requires signed rows"),
        "{err}"
    );
    let no_keys = tempfile::tempdir().expect("tempdir");
    let err = fails({
        let mut c = huddle(&h.db.url);
        c.env("HUDDLE_KEYS", no_keys.path())
            .args(["post", "--room", &h.room, "--as", &h.owner])
            .arg("!config require-signatures off");
        c
    });
    assert!(
        err.contains("not posted") && err.contains("no owner key for olga"),
        "{err}"
    );
    let err = fails({
        let mut c = huddle(&h.db.url);
        c.args(["task", "claim", "c", "--room", &h.room, "--agent", "gus"]);
        c
    });
    assert!(
        err.contains("[unsigned_writer]") && err.contains("signs nothing"),
        "{err}"
    );
    // cy's own writer id without cy's key: the room registers a key for that name.
    let err = fails({
        let mut c = huddle(&h.db.url);
        c.args(["--relay-id", "cy-cli", "task", "claim", "c"])
            .args(["--room", &h.room, "--agent", "cy"]);
        c
    });
    assert!(
        err.contains("[unsigned_writer]") && err.contains("registers the keys"),
        "{err}"
    );
    h.refresh().await;
    assert_eq!(messages(&h), before, "nothing was posted");
    // A relay that does not sign, and one whose key is not registered, do not start.
    h.spawn_relay("r2", vec![AgentSpec::sim("eve", 50)]);
    let r3_key = h.dir().join("r3.key");
    h.spawn_relay_with("r3", vec![AgentSpec::sim("fay", 50)], &signing(&r3_key));
    for (id, why) in [("r2", "signs nothing"), ("r3", "which is not registered")] {
        let relay = h.relay(id);
        let status = relay.wait_exit(secs(30));
        assert!(!status.success(), "{id}: {status}");
        let log = relay.log_tail(20);
        assert!(
            log.contains("refusing to write in this room") && log.contains(why),
            "{id}: {log}"
        );
    }

    // Registered writers work: a person posting from the desk's key, an agent acting
    // for itself with its own key, the relays and the driven agent's MCP server.
    let desk = ok({
        let mut c = huddle(&h.db.url);
        c.args(["--relay-id", "desk", "--relay-key"])
            .arg(&kdesk)
            .args([
                "post",
                "--room",
                &h.room,
                "--as",
                "bo-person",
                "hello from the desk",
            ]);
        c
    });
    let desk: huddle_core::InteractionId = desk.trim().parse().expect("an id");
    let cy = |args: &[&str]| {
        let mut c = huddle(&h.db.url);
        c.args(["--relay-id", "cy-cli", "--relay-key"])
            .arg(&kcy)
            .arg("task")
            .arg(args[0])
            .args(["--room", &h.room, "--agent", "cy"])
            .args(&args[1..]);
        c
    };
    ok(cy(&["claim", "c"]));
    ok(cy(&["complete", "c", "--result", "done by cy"]));
    let driven = driven_agent_script(&h);
    h.spawn_relay_with(
        "r0",
        vec![AgentSpec::sim("ada", 50), AgentSpec::exec("dan", &driven)],
        &signing(&k0),
    );
    h.wait_until("every task done", secs(120), |l| l.summary().done == 3)
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;

    let t = h.ledger.task("t").expect("task t");
    assert_eq!(t.status, TaskStatus::Done);
    assert_ne!(t.result.as_deref(), Some("FORGED"), "{t:?}");
    assert!(t.epoch > Some(epoch), "{t:?}");
    let c = h.ledger.task("c").expect("task c");
    assert_eq!(c.result.as_deref(), Some("done by cy"), "{c:?}");
    let d = h.ledger.task("d").expect("task d");
    assert_eq!(
        d.result.as_deref().map(str::trim_end),
        Some("mine=d"),
        "{d:?}"
    );
    // The driven agent's note went through its relay's signing MCP server and counts.
    let row = |pred: &dyn Fn(&huddle_core::Interaction) -> bool| {
        h.ledger
            .rows
            .iter()
            .find(|r| pred(r))
            .cloned()
            .expect("the row")
    };
    let note = row(&|r| r.body.get("text").and_then(|t| t.as_str()) == Some("working on d"));
    assert_eq!((note.actor.as_str(), note.relay.as_str()), ("dan", "r0"));
    let k0_public: huddle_core::keys::OwnerKey = e0["r0=".len()..].parse().expect("a key");
    assert_eq!(note.signer, Some(k0_public));
    assert!(h.ledger.config.admits(&note));
    assert!(h.ledger.config.admits(&row(&|r| r.id == desk)));
    // Nobody answered the forged messages: they never reached a fold.
    assert!(h.ledger.replies_to(hello).is_empty());
    // Every reader counted exactly the forgeries.
    assert_eq!(h.ledger.config.unsigned_rows(), unsigned);
    assert_eq!(h.ledger.config.forged_writer_rows(), forged_writer);
    assert_eq!(summaries.len(), 2, "{summaries:?}");
    for s in &summaries {
        assert_eq!(
            (s.unsigned_rows, s.forged_writer_rows, s.misbound_rows),
            (unsigned, forged_writer, 0),
            "{s:?}"
        );
    }
    eprintln!(
        "signed writers: {unsigned} unsigned and {forged_writer} forged-writer rows \
         ignored and counted by every reader; 6 unregistered writers refused before \
         writing (2 posts, 2 agent sessions, 2 relays)"
    );
}
