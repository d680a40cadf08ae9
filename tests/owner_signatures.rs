//! End-to-end: owner commands are executed only when signed with the room owner's
//! key (plan 0016), through the real `huddle` binary and real relays, on both
//! backends. Forged owner rows are inserted directly through the store.

use crate::common;

use common::relays::*;
use huddle_core::{NewInteraction, Role, Verb};
use serde_json::json;

on_both_backends!(only_signed_owner_commands_take_effect);

/// Posts `text` as the owner with keys looked up in `keys` (an empty directory: no
/// key), returning the exit status and stderr.
fn post_without_key(h: &Huddle, keys: &std::path::Path, text: &str) -> (Option<i32>, String) {
    let mut c = common::huddle(&h.db.url);
    c.env("HUDDLE_KEYS", keys)
        .args(["post", "--room", &h.room, "--as", &h.owner, text]);
    let out = common::run(c);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn only_signed_owner_commands_take_effect(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("ada", 10)]);
    h.wait_registered(&["ada"]).await;
    let mut tried = 0;

    // 1. Without the key (another key directory): posted as text, not executed, and
    //    the CLI says why with exit status 3.
    let empty = tempfile::tempdir().expect("tempdir");
    for text in ["!delegate\nevil: take over", "!config claim-ttl 1s"] {
        let (code, stderr) = post_without_key(&h, empty.path(), text);
        tried += 1;
        assert_eq!(code, Some(3), "{stderr}");
        assert!(
            stderr.contains("NOT be executed as an owner command")
                && stderr.contains("no owner key for olga"),
            "{stderr}"
        );
    }

    // 2. Rows written straight into the store with the owner's name and role and no
    //    signature: a command, a task.created, a config.set.
    let unsigned_command = NewInteraction::new(
        h.room.as_str(),
        Verb::MessagePosted,
        "olga",
        Role::Owner,
        json!({"text": "!delegate\nforged1: by a shell"}),
    );
    let forged_task = NewInteraction::new(
        h.room.as_str(),
        Verb::TaskCreated,
        "mallory",
        Role::Owner,
        json!({"task": "forged2", "label": "run me"}),
    );
    let forged_task_as_olga = NewInteraction::new(
        h.room.as_str(),
        Verb::TaskCreated,
        "olga",
        Role::Owner,
        json!({"task": "forged3", "label": "run me too"}),
    );
    let forged_config = NewInteraction::new(
        h.room.as_str(),
        Verb::ConfigSet,
        "olga",
        Role::Owner,
        json!({"set": {"claim-ttl": 1000}}),
    );
    // 3. room.created again, by someone else with their own key, and by "olga" with
    //    another key.
    let mallory = huddle_core::signing::OwnerSecret::from_seed([0x66; 32]);
    let recreated = |owner: &str| {
        NewInteraction::new(
            h.room.as_str(),
            Verb::RoomCreated,
            owner,
            Role::Owner,
            json!({"owner": owner, "key": mallory.public().to_hex()}),
        )
    };
    let mallory_command = mallory.sign(NewInteraction::new(
        h.room.as_str(),
        Verb::MessagePosted,
        "olga",
        Role::Owner,
        json!({"text": "!delegate\nforged4: signed by the wrong key"}),
    ));
    let forged = vec![
        unsigned_command,
        forged_task,
        forged_task_as_olga,
        forged_config,
        recreated("mallory"),
        recreated("olga"),
        mallory_command,
    ];
    tried += forged.len();
    for row in forged {
        let out = h
            .store
            .append(vec![row])
            .await
            .expect("append a forged row");
        assert!(out[0].inserted);
    }

    // 4. The signed command works, and its reply shows the relay read everything
    //    above (relays read the ledger in order).
    let reply = h.delegate("real: the owner's task").await;
    assert!(reply.starts_with("Created 1 task"), "{reply}");
    let reply = h.owner_says("!config get claim-ttl").await;
    assert!(reply.contains("claim-ttl = 1m (default)"), "{reply}");
    h.wait_until("the real task done", secs(30), |l| l.summary().done == 1)
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;

    let l = &h.ledger;
    // The relay says what it ignored, with the counts its own folds kept.
    for s in &summaries {
        assert_eq!(
            (s.unsigned_commands, s.unauthorized_rows),
            (l.config.unsigned_commands(), l.config.unauthorized_rows()),
            "{s:?}"
        );
        assert_eq!(
            s.ignored_config_rows,
            l.config.config().ignored_rows(),
            "{s:?}"
        );
        assert!(
            s.ignored_config_rows >= 3,
            "a config.set, two room.created: {s:?}"
        );
    }
    assert_eq!(l.summary().total, 1, "forged tasks got into the DAG");
    assert!(l.task("real").is_some());
    let system: Vec<&str> = l
        .of_verb(Verb::MessagePosted)
        .filter(|(_, r)| r.role == Role::System)
        .filter_map(|(_, r)| r.body["text"].as_str())
        .collect();
    assert_eq!(
        system.iter().filter(|t| t.starts_with("Created")).count(),
        1,
        "only the signed !delegate was answered: {system:?}"
    );
    for forged in ["evil", "forged1", "forged2", "forged3", "forged4"] {
        assert!(
            l.of_verb(Verb::TaskClaimed)
                .all(|(_, r)| r.body["task"] != forged),
            "{forged} was claimed"
        );
    }
    assert_eq!(l.config.config().owner(&h.room), Some("olga"));
    assert_eq!(
        l.config.config().owner_key(&h.room),
        Some(common::owner_key("olga").public()),
        "a later room.created changed the owner key"
    );
    assert_eq!(l.config.unsigned_commands(), 4, "refused commands counted");
    assert_eq!(l.config.unauthorized_rows(), 2, "forged tasks counted");
    // The CLI's own view of the room leaves the forged rows out, like the relays.
    let tasks = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", &h.room, "--json"]);
        c
    });
    assert!(
        !tasks.contains("forged") && tasks.contains("real"),
        "{tasks}"
    );
    eprintln!(
        "owner signatures: {tried} forged or unsigned owner writes tried, all without effect"
    );
}

on_both_backends!(the_owner_rotates_the_key_and_the_old_key_stops_counting);

/// `huddle room rotate-key`: the rotation is signed with the current key, the key file
/// then holds the new key (the old one kept beside it), `post` refuses to sign with the
/// old key, and a command signed with the old key written anyway is not executed.
async fn the_owner_rotates_the_key_and_the_old_key_stops_counting(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let keys = tempfile::tempdir().expect("tempdir");
    let cmd = |args: &[&str]| {
        let mut c = common::huddle(&db.url);
        c.env("HUDDLE_KEYS", keys.path()).args(args);
        c
    };
    common::ok(cmd(&["room", "create", "rot", "--owner", "rota"]));
    let key_file = keys.path().join("rota.key");
    let read_key = |p: &std::path::Path| -> huddle_core::signing::OwnerSecret {
        std::fs::read_to_string(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .expect("a key file")
    };
    let old = read_key(&key_file);

    // Not the owner, or not the owner's current key: refused, nothing written.
    let out = common::run(cmd(&["room", "rotate-key", "rot", "--owner", "mallory"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("owned by rota, not mallory"));
    let other = keys.path().join("other.key");
    common::ok(cmd(&[
        "room",
        "create",
        "elsewhere",
        "--owner",
        "x",
        "--key",
        other.to_str().unwrap(),
    ]));
    let out = common::run(cmd(&[
        "room",
        "rotate-key",
        "rot",
        "--owner",
        "rota",
        "--key",
        other.to_str().unwrap(),
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("pass the current key"),
        "{stderr}"
    );

    let said = common::ok(cmd(&["room", "rotate-key", "rot", "--owner", "rota"]));
    assert!(said.contains("owner key rotated"), "{said}");
    let new = read_key(&key_file);
    assert_ne!(new.public(), old.public());
    let retired = keys
        .path()
        .join(format!("rota.key.retired-{}", old.public().short()));
    assert_eq!(
        read_key(&retired).public(),
        old.public(),
        "the old key is kept"
    );
    assert!(!keys.path().join("rota.key.next").exists());

    // `post` will not sign with the old key; it signs with the new one.
    let out = common::run(cmd(&[
        "post",
        "--room",
        "rot",
        "--as",
        "rota",
        "--key",
        retired.to_str().unwrap(),
        "!config rate 5",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is not the room's owner key"), "{stderr}");
    common::ok(cmd(&[
        "post",
        "--room",
        "rot",
        "--as",
        "rota",
        "!config rate 6",
    ]));

    // A command signed with the old key, written straight into the store, is not
    // executed; the one signed with the new key is.
    let store = huddle_store::open(&db.url, huddle_store::StoreOptions::default())
        .await
        .expect("open");
    store
        .append(vec![old.sign(NewInteraction::new(
            "rot",
            Verb::MessagePosted,
            "rota",
            Role::Owner,
            json!({"text": "!config rate 7"}),
        ))])
        .await
        .expect("append");
    let mut authority = huddle_core::commands::OwnerAuthority::new();
    let rows = store
        .read_room("rot", huddle_core::Position::START, 1000)
        .await
        .expect("read")
        .rows;
    for row in &rows {
        huddle_core::Fold::apply(&mut authority, row);
    }
    assert_eq!(authority.config().owner_key("rot"), Some(new.public()));
    // The post with the old key (sent unsigned) and the row signed with the old key.
    assert_eq!(authority.unsigned_commands(), 2);
    assert_eq!(
        rows.iter()
            .filter(|r| r.verb == Verb::RoomKeyRotated)
            .count(),
        1
    );
}
