//! Relay presence end to end (issues 13 and 15): relays hold the `relay/<id>` lease and
//! write `relay.heartbeat`; `huddle status` lists them online or offline; after a
//! relay is killed its agent shows offline on the board and a message naming it is
//! reported as waiting on an absent agent, not waited for silently; after a restart
//! the relay is online again and the message is answered once.

use crate::common;

use common::relays::*;
use huddle_core::Role;
use serde_json::Value;

on_both_backends!(presence_follows_the_relays_lease_and_absent_agents_are_reported);

fn status(h: &Huddle) -> Value {
    let mut c = common::huddle(&h.db.url);
    c.args(["status", "--room", &h.room, "--json"]);
    serde_json::from_str(&common::ok(c)).expect("status --json is JSON")
}

fn relay_state(status: &Value, relay: &str) -> Option<String> {
    status["relays"]
        .as_array()?
        .iter()
        .find(|r| r["relay"] == relay)
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

fn board(h: &Huddle) -> Value {
    let mut c = common::huddle(&h.db.url);
    c.args(["board", "--room", &h.room, "--json"]);
    serde_json::from_str(&common::ok(c)).expect("board --json is JSON")
}

/// Polls `check` on a fresh CLI answer until it holds, for at most `limit`.
async fn wait_cli(what: &str, limit: std::time::Duration, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(ms(200)).await;
    }
}

async fn presence_follows_the_relays_lease_and_absent_agents_are_reported(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("executions.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"$HUDDLE_AGENT\" >> {log}\necho \"$HUDDLE_AGENT here\"",
            log = log.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    h.wait_registered(&["ada", "bo"]).await;
    wait_cli("both relays online", secs(30), || {
        let s = status(&h);
        relay_state(&s, "r0").as_deref() == Some("online")
            && relay_state(&s, "r1").as_deref() == Some("online")
    })
    .await;
    let s = status(&h);
    let r1 = s["relays"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["relay"] == "r1"))
        .cloned()
        .expect("r1 in status");
    assert_eq!(r1["agents"], serde_json::json!(["bo"]), "{r1}");
    assert_eq!(r1["version"], env!("CARGO_PKG_VERSION"), "{r1}");
    assert!(r1["behind"].as_u64().is_some(), "{r1}");
    assert!(r1["last_heartbeat"].as_i64().is_some(), "{r1}");
    let text = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["status", "--room", &h.room]);
        c
    });
    assert!(text.contains("r1") && text.contains("online"), "{text}");

    // kill -9: the lease lapses by itself (10 s) and the relay shows offline.
    h.relay("r1").kill9();
    wait_cli("r1 offline", secs(30), || {
        relay_state(&status(&h), "r1").as_deref() == Some("offline")
    })
    .await;
    assert_eq!(relay_state(&status(&h), "r0").as_deref(), Some("online"));
    let q = h.post("hank", Role::Human, "@bo are you there?").await;
    h.wait_until("the question in the ledger", secs(10), |l| {
        l.get(q).is_some()
    })
    .await;
    let b = board(&h);
    let bo = b["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["agent"] == "bo"))
        .cloned()
        .expect("bo on the board");
    assert!(
        bo["hosting"]
            .as_str()
            .is_some_and(|h| h.starts_with("offline")),
        "{bo}"
    );
    let waits = b["waiting_on_absent"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(waits.len(), 1, "{b}");
    assert_eq!(waits[0]["message"], q.to_hex(), "{b}");
    assert_eq!(waits[0]["absent"][0][0], "bo", "{b}");
    let text = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["board", "--room", &h.room]);
        c
    });
    assert!(text.contains("waiting on absent agents"), "{text}");
    assert!(text.contains("offline"), "{text}");

    // Back: online again, and the question is answered once, by bo.
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    wait_cli("r1 online again", secs(30), || {
        relay_state(&status(&h), "r1").as_deref() == Some("online")
    })
    .await;
    h.wait_until("bo's answer", secs(60), |l| !l.replies_to(q).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    let b = board(&h);
    assert!(
        b["waiting_on_absent"]
            .as_array()
            .is_none_or(|w| w.is_empty()),
        "{b}"
    );
    h.stop_all().await;
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        runs.lines().filter(|l| *l == "bo").count(),
        1,
        "bo answered once: {runs}"
    );
    assert_eq!(h.ledger.replies_to(q).len(), 1);
}
