//! End-to-end: `huddle serve --owner` (plan 0055), the real binary on SQLite and
//! Postgres. The owner posts through `POST /api/rooms/{room}/messages` with the page's
//! token: commands are signed, a relay answers them, and their effects follow (a
//! `!config` read back, a `!delegate`'s tasks run by the relay). Posting is refused
//! without `--owner`, without the token, from another origin or host, with a wrong
//! content type or an oversized body — and nothing is appended then. The server's
//! folds read forward: after new rows every endpoint still equals the CLI, and a
//! scrape with nothing new reads no row.

use crate::common;
use crate::dashboard::{cli_json, get_with, post, request, seeded, tail_rows, task, Server};

use std::time::{Duration, Instant};

use common::relays::{ms, secs, AgentSpec, Backend, Huddle, TestDatabase};
use common::*;
use serde_json::{json, Value};

/// The token in the room page's post box, if it has one.
fn page_token(server: &Server, room: &str) -> Option<String> {
    let (status, page) = server.get(&format!("/rooms/{room}"));
    assert_eq!(status, 200, "{page}");
    let at = page.find("data-token=\"")? + "data-token=\"".len();
    let token = &page[at..at + page[at..].find('"')?];
    Some(token.to_string())
}

/// `POST /api/rooms/{room}/messages` with the token, a JSON body and more headers.
fn post_raw(
    server: &Server,
    room: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let mut all: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
    if let Some(t) = token {
        all.push(("X-Huddle-Token", t));
    }
    for (k, v) in headers {
        all.retain(|(x, _)| !x.eq_ignore_ascii_case(k));
        all.push((k, v));
    }
    let path = format!("/api/rooms/{room}/messages");
    let (status, text) = request(&server.addr, "POST", &path, &all, Some(body));
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"));
    (status, v)
}

/// Posts `body` with the token; asserts `201` and returns the answer.
fn posts(server: &Server, room: &str, token: &str, body: Value) -> Value {
    let (status, v) = post_raw(server, room, Some(token), &[], body.to_string().as_bytes());
    assert_eq!(status, 201, "POST {body}: {v}");
    v
}

/// The text of the answer row in a `201` answer.
fn answer_text(v: &Value) -> &str {
    v["answer"]["body"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer: {v}"))
}

/// One sample of a Prometheus text exposition, by its name and labels as written.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

on_both_backends!(
    the_owner_posts_commands_over_http_and_sees_their_answers_and_effects,
    the_servers_folds_read_forward_and_answer_what_the_cli_prints,
);

async fn the_owner_posts_commands_over_http_and_sees_their_answers_and_effects(backend: Backend) {
    // Room `lobby`, owned by olga; a relay with two simulated agents.
    let mut h = Huddle::new(backend).await;
    h.spawn_relay(
        "r0",
        vec![AgentSpec::sim("ava", 50), AgentSpec::sim("ben", 50)],
    );
    h.wait_registered(&["ava", "ben"]).await;
    let db = h.db.url.clone();
    let server = Server::start_with(&db, &["--owner", "olga"]);
    let token = page_token(&server, "lobby").expect("the owner's room page has a post box");
    assert_eq!(token.len(), 64, "{token}");

    // `!config` through the endpoint: signed, answered by the relay, and in effect.
    let set = posts(
        &server,
        "lobby",
        &token,
        json!({"text": "!config claim-ttl 45s"}),
    );
    assert_eq!(set["command"], "!config", "{set}");
    assert_eq!(set["signed"], true, "{set}");
    assert_eq!(set["actor"], "olga");
    assert_eq!(set["answer"]["role"], "system", "{set}");
    assert_eq!(set["answer"]["parent"], set["id"], "{set}");
    assert!(!answer_text(&set).contains("rejected"), "{set}");
    let get = posts(
        &server,
        "lobby",
        &token,
        json!({"text": "!config get claim-ttl"}),
    );
    assert!(
        answer_text(&get).contains("claim-ttl = 45s"),
        "the relay's config changed: {get}"
    );

    // `!delegate`: the tasks are created and the relay runs them; the server's own
    // task view follows, equal to the CLI's.
    let delegated = posts(
        &server,
        "lobby",
        &token,
        json!({"text": "!delegate\nt1: first step\nt2: second step [after t1]"}),
    );
    assert!(
        answer_text(&delegated).starts_with("Created 2 tasks"),
        "{delegated}"
    );
    let deadline = Instant::now() + secs(60);
    loop {
        let tasks = server.json("/api/rooms/lobby/tasks");
        if tasks["summary"]["done"] == 2 {
            assert_eq!(
                tasks,
                cli_json(&db, &["tasks", "--room", "lobby", "--json"])
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the delegated tasks were not done: {tasks}"
        );
        std::thread::sleep(ms(100));
    }

    // A plain message: posted (signed: the key is the room's), not waited for.
    let said = posts(
        &server,
        "lobby",
        &token,
        json!({"text": "well done <b>all</b>", "thread": "retro"}),
    );
    assert_eq!(said["command"], Value::Null, "{said}");
    assert_eq!(said["answer"], Value::Null, "{said}");
    assert_eq!(said["signed"], true, "{said}");
    let rows = tail_rows(&db, "lobby");
    let row = rows
        .iter()
        .find(|r| r["id"] == said["id"])
        .expect("the message is in the ledger");
    assert_eq!(row["role"], "owner");
    assert_eq!(row["actor"], "olga");
    assert_eq!(row["thread"], "retro");
    assert_eq!(row["body"]["text"], "well done <b>all</b>");

    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
}

async fn the_servers_folds_read_forward_and_answer_what_the_cli_prints(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seeded(&db).await;
    let server = Server::start(&db);
    let rows_read = |server: &Server| -> f64 {
        let (_, m) = server.get("/metrics");
        sample(&m, "huddle_fold_rows_read_total").expect("huddle_fold_rows_read_total")
    };
    let same_as_cli = |server: &Server| {
        assert_eq!(
            server.json("/api/rooms"),
            cli_json(&db, &["room", "list", "--json"])
        );
        for (path, args) in [
            ("tasks", vec!["tasks", "--room", "dash", "--json"]),
            ("board", vec!["board", "--room", "dash", "--json"]),
            ("claims", vec!["claims", "--room", "dash", "--json"]),
        ] {
            assert_eq!(
                server.json(&format!("/api/rooms/dash/{path}")),
                cli_json(&db, &args),
                "{path}"
            );
        }
    };
    same_as_cli(&server);
    let first = rows_read(&server);
    assert!(first > 0.0);
    // Nothing new: a scrape and every view read no row.
    same_as_cli(&server);
    assert_eq!(
        rows_read(&server),
        first,
        "a request with nothing new read rows"
    );

    // New rows in the room and a new room: the folds read them, once each.
    let before = tail_rows(&db, "dash").len();
    task(&db, "dash", "bo", &["claim", "b"]);
    task(&db, "dash", "bo", &["complete", "b", "--result", "B"]);
    task(&db, "dash", "cy", &["complete", "c", "--result", "C"]);
    post(&db, "dash", "pat", "after the fold");
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "second", "--owner", "ana"]);
        c
    });
    let new = (tail_rows(&db, "dash").len() - before + tail_rows(&db, "second").len()) as f64;
    same_as_cli(&server);
    let tasks = server.json("/api/rooms/dash/tasks");
    assert_eq!(tasks["summary"]["done"], 3, "{tasks}");
    assert_eq!(
        server.json("/api/rooms/second/tasks"),
        cli_json(&db, &["tasks", "--room", "second", "--json"])
    );
    let (_, metrics) = server.get("/metrics");
    assert_eq!(
        sample(&metrics, "huddle_tasks{room=\"dash\",status=\"done\"}"),
        Some(3.0),
        "{metrics}"
    );
    let (_, page) = server.get("/rooms/dash");
    assert!(
        page.contains("after the fold"),
        "the timeline has the new row"
    );
    // Each new row read by the ledger's fold and by its room's, not the ledger again.
    let read = rows_read(&server) - first;
    assert!(
        read >= new && read <= 2.0 * new,
        "{new} new rows, {read} rows read"
    );
}

/// A request that must be refused: what it is, the room, the token, more headers, the
/// body and the status it must get.
type Refused<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    Vec<(&'a str, &'a str)>,
    Vec<u8>,
    u16,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posting_is_refused_without_owner_token_or_within_limits() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let db = database.url.clone();
    seeded(&db).await;
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "other", "--owner", "bob"]);
        c
    });
    // No key, no server; and never on a non-loopback address.
    let err = fails({
        let mut c = huddle(&db);
        c.args(["serve", "--addr", "127.0.0.1:0", "--owner", "keyless"]);
        c
    });
    assert!(
        err.contains("no owner key for keyless at") && err.contains("keyless.key"),
        "{err}"
    );
    let err = fails({
        let mut c = huddle(&db);
        c.args([
            "serve",
            "--addr",
            "0.0.0.0:0",
            "--allow-remote",
            "--owner",
            "ana",
        ]);
        c
    });
    assert!(
        err.contains("--owner is refused on a non-loopback"),
        "{err}"
    );

    // Without --owner: no post box, no token, and the endpoint says why.
    let rows = tail_rows(&db, "dash").len();
    let server = Server::start(&db);
    let (_, page) = server.get("/rooms/dash");
    assert!(!page.contains("post-form") && !page.contains("data-token"));
    let (status, v) = post_raw(&server, "dash", Some("x"), &[], br#"{"text":"hi"}"#);
    assert_eq!(status, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--owner"), "{v}");
    drop(server);

    let server = Server::start_with(&db, &["--owner", "ana"]);
    let token = page_token(&server, "dash").expect("ana's room has a post box");
    assert!(
        page_token(&server, "other").is_none(),
        "bob's room has no box for ana"
    );
    let (_, page) = server.get("/rooms/dash");
    assert!(
        !page.contains(&owner_key("ana").to_hex()),
        "the key is in the page"
    );
    let ok_body = br#"{"text":"hello"}"#.to_vec();
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(70 * 1024)).into_bytes();
    let refused: Vec<Refused> = vec![
        ("no token", "dash", None, vec![], ok_body.clone(), 403),
        (
            "a wrong token",
            "dash",
            Some("0".repeat(64).leak()),
            vec![],
            ok_body.clone(),
            403,
        ),
        (
            "another origin",
            "dash",
            Some(&token),
            vec![("Origin", "http://evil.example")],
            ok_body.clone(),
            403,
        ),
        (
            "a cross-site fetch",
            "dash",
            Some(&token),
            vec![("Sec-Fetch-Site", "cross-site")],
            ok_body.clone(),
            403,
        ),
        (
            "another host",
            "dash",
            Some(&token),
            vec![("Host", "evil.example")],
            ok_body.clone(),
            403,
        ),
        (
            "a form post",
            "dash",
            Some(&token),
            vec![("Content-Type", "application/x-www-form-urlencoded")],
            b"text=hello".to_vec(),
            415,
        ),
        ("an oversized body", "dash", Some(&token), vec![], big, 413),
        (
            "not JSON",
            "dash",
            Some(&token),
            vec![],
            b"{text".to_vec(),
            400,
        ),
        (
            "an unknown field",
            "dash",
            Some(&token),
            vec![],
            br#"{"text":"hi","as":"root"}"#.to_vec(),
            400,
        ),
        (
            "empty text",
            "dash",
            Some(&token),
            vec![],
            br#"{"text":"  "}"#.to_vec(),
            400,
        ),
        (
            "a bad thread",
            "dash",
            Some(&token),
            vec![],
            br#"{"text":"hi","thread":"a/b"}"#.to_vec(),
            400,
        ),
        (
            "too long a wait",
            "dash",
            Some(&token),
            vec![],
            br#"{"text":"hi","wait_ms":600000}"#.to_vec(),
            400,
        ),
        (
            "a room ana does not own",
            "other",
            Some(&token),
            vec![],
            ok_body.clone(),
            403,
        ),
        (
            "no such room",
            "nope",
            Some(&token),
            vec![],
            ok_body.clone(),
            404,
        ),
        (
            "a bad room name",
            "%20dash",
            Some(&token),
            vec![],
            ok_body.clone(),
            400,
        ),
    ];
    for (what, room, token, headers, body, want) in &refused {
        let (status, v) = post_raw(&server, room, *token, headers, body);
        assert_eq!(status, *want, "{what}: {v}");
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: {v}"
        );
    }
    let (status, body) = get_with(&server.addr, "/api/rooms/dash/messages", &[]);
    assert_eq!(status, 405, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    assert_eq!(
        tail_rows(&db, "dash").len(),
        rows,
        "a refused post appended a row"
    );

    // With everything right it posts; a command with no relay to answer says so
    // after the wait asked for.
    let v = posts(&server, "dash", &token, json!({"text": "hello"}));
    assert_eq!(v["signed"], true, "{v}");
    let started = Instant::now();
    let v = posts(
        &server,
        "dash",
        &token,
        json!({"text": "!config get claim-ttl", "wait_ms": 300}),
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(v["answer"], Value::Null, "{v}");
    assert!(
        v["note"].as_str().unwrap().contains("no answer within"),
        "{v}"
    );
    assert_eq!(tail_rows(&db, "dash").len(), rows + 2);
}
