//! End-to-end: the real `huddle` binary against Postgres (`--db postgres://...`),
//! including a follower in another process that keeps waking up after its LISTEN
//! connection is killed.

use crate::common;

use std::time::Duration;

use common::relays::{AgentSpec, Backend, Huddle};
use common::*;

async fn db() -> huddle_testkit::TestDb {
    huddle_testkit::test_database().await
}

fn post(url: &str, who: &str, text: &str) -> String {
    ok({
        let mut c = huddle(url);
        c.args(["post", "--room", "lobby", "--as", who, text]);
        c
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_post_tail_and_claims_on_postgres() {
    let db = db().await;
    let url = db.url.clone();
    let out = ok({
        let mut c = huddle(&url);
        c.arg("migrate");
        c
    });
    assert!(out.contains("postgres database"), "{out}");
    ok({
        let mut c = huddle(&url);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    post(&url, "olga", "hello \"all\"; ünï");
    post(&url, "hank", "hi");
    let text = ok({
        let mut c = huddle(&url);
        c.args(["tail", "--room", "lobby"]);
        c
    });
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[1].contains("olga (owner) message.posted: hello \"all\"; ünï"));
    assert!(lines[2].contains("hank (human) message.posted: hi"));
    let claims = ok({
        let mut c = huddle(&url);
        c.arg("claims");
        c
    });
    assert_eq!(claims.trim(), "no claims");
}

/// A `tail --follow` in another process with a 60 s fallback poll wakes up for new
/// rows promptly, and keeps doing so after its LISTEN connection is terminated: it
/// re-LISTENs and reads forward from its cursor, losing and repeating nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_survives_killed_listen_connections() {
    let db = db().await;
    let url = db.url.clone();
    ok({
        let mut c = huddle(&url);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    let follower = LineChild::spawn({
        let mut c = huddle(&url);
        c.args(["tail", "--room", "lobby", "--follow", "--json"])
            .env("HUDDLE_POLL_MS", "60000");
        c
    });
    follower.expect_line("room.created", Duration::from_secs(20), |l| {
        l.contains("room.created")
    });
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(conn);
    for round in 0..3 {
        let text = format!("before kill {round}");
        post(&url, "hank", &text);
        follower.expect_line(&text, Duration::from_secs(10), |l| l.contains(&text));

        // Kill the follower's LISTEN connection and wait (at most 10 s) until its
        // backend has exited: a backend that is still dying can deliver one more
        // notification, and then the row below would not need the reconnect at all
        // (nor would a LISTEN connection exist yet when the next round kills it).
        // The `post` just run may have had a LISTEN connection of its own whose
        // backend is still on its way out: terminating it can find it gone (false),
        // so what is checked is that none of the pids is left afterwards.
        let pids: Vec<i32> = admin
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = 'huddle-listen' AND datname = current_database() \
                 AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("list LISTEN backends")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            !pids.is_empty(),
            "round {round}: no LISTEN connection found to kill"
        );
        admin
            .execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM unnest($1::int4[]) AS pid",
                &[&pids],
            )
            .await
            .expect("terminate");
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                &[&pids],
            )
            .await
            .expect("count LISTEN backends left")
            .get(0);
        assert_eq!(
            left, 0,
            "round {round}: a LISTEN backend did not exit within 10 s of {pids:?}"
        );
        // The follower must notice, reconnect and LISTEN again; until it does, a row
        // appended now is only found by reading forward after the reconnect.
        let text = format!("after kill {round}");
        post(&url, "hank", &text);
        follower.expect_line(&text, Duration::from_secs(15), |l| l.contains(&text));
    }
    drop(follower);
    // Nothing was lost or repeated: the full tail has every row once.
    let all = ok({
        let mut c = huddle(&url);
        c.args(["tail", "--room", "lobby", "--json"]);
        c
    });
    assert_eq!(all.lines().count(), 1 + 6, "{all}");
}

/// A relay on Postgres keeps two batches of results and claims in flight unless its
/// configuration says otherwise (plan 0091), and says so in its start line; with
/// `batches_in_flight = 1` it keeps one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_postgres_keeps_two_batches_in_flight_by_default() {
    let mut h = Huddle::new(Backend::Postgres).await;
    let url = h.db.url.clone();
    h.spawn_relay_full("r0", vec![AgentSpec::sim("a0", 5)], &url, Some("info"), "");
    h.spawn_relay_full(
        "r1",
        vec![AgentSpec::sim("a1", 5)],
        &url,
        Some("info"),
        "batches_in_flight = 1",
    );
    h.wait_registered(&["a0", "a1"]).await;
    for (relay, want) in [("r0", "batches_in_flight=2"), ("r1", "batches_in_flight=1")] {
        let log = h.relay(relay).log_tail(10_000);
        let start = log
            .lines()
            .find(|l| l.contains("relay starting"))
            .unwrap_or_else(|| panic!("no start line: {log}"));
        assert!(start.contains(want), "{relay}: {start}");
    }
    h.stop_all().await;
}
