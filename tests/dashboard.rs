//! End-to-end: `huddle serve` (plan 0048), the real binary on SQLite and Postgres,
//! spoken to over plain HTTP/1.0 sockets (so no HTTP client library is needed): every
//! API endpoint answers what the CLI's `--json` prints; the event stream resumes with
//! `Last-Event-ID` across a server restart losing and repeating nothing; hostile input
//! gets 400s; a corrupt ledger row breaks nothing; the pages escape ledger text and
//! draw every task; `/metrics` counts what `tasks --json` counts.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::relays::{ms, secs, Backend, TestDatabase};
use common::*;
use serde_json::Value;

/// A running `huddle serve` and its base URL (`http://127.0.0.1:PORT`).
pub struct Server {
    child: LineChild,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Server {
    /// `huddle serve --addr 127.0.0.1:0` on `db` with a 60 s fallback poll (the
    /// server caps it at 30 s), so an event that arrives within seconds was woken by
    /// the store's doorbell.
    pub fn start(db: &str) -> Server {
        Server::start_with(db, &[])
    }

    /// [`Server::start`] with more `serve` flags (e.g. `--owner ana`).
    pub fn start_with(db: &str, flags: &[&str]) -> Server {
        let mut c = huddle(db);
        c.args(["--poll-ms", "60000", "serve", "--addr", "127.0.0.1:0"])
            .args(flags);
        let child = LineChild::spawn(c);
        let url = child.expect_line("the server's URL", Duration::from_secs(60), |l| {
            l.starts_with("http://127.0.0.1:")
        });
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        Server { child, addr }
    }

    /// Sends SIGINT (Ctrl-C) and waits up to `limit` for the server to exit; its
    /// status.
    pub fn interrupt(mut self, limit: Duration) -> std::process::ExitStatus {
        let pid = self.child.child.id().to_string();
        let status = std::process::Command::new("sh")
            .args(["-c", "kill -s INT \"$0\"", &pid])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.child.try_wait().expect("wait for the server") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not stop within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET path`: status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        get_with(&self.addr, path, &[])
    }

    /// `GET path` that must answer 200 with JSON.
    pub fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }
}

/// A plain HTTP/1.0 request (the answer ends when the server closes the connection).
pub fn get_with(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    request(addr, "GET", path, headers, None)
}

/// A plain HTTP/1.0 `method` request with an optional body (sent with its
/// `Content-Length`); the status and the body of the answer.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = body {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    // A server may answer (413) and close before reading a large body whole.
    let _ = s.write_all(&bytes);
    let mut raw = Vec::new();
    // A reset after the answer (a body the server did not read) still leaves the answer.
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(!raw.is_empty(), "{method} {path}: {e}");
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"));
    (status, body.to_string())
}

/// One server-sent event.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    /// `event:`
    pub event: String,
    /// `id:`
    pub id: String,
    /// `data:` (lines joined)
    pub data: String,
}

/// An open event stream; events arrive on a reader thread.
pub struct SseClient {
    events: mpsc::Receiver<SseEvent>,
    stream: TcpStream,
}

impl SseClient {
    /// Opens `path` with the given headers; panics unless it answers 200.
    pub fn open(addr: &str, path: &str, headers: &[(&str, &str)]) -> SseClient {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        let mut req =
            format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.contains(" 200 "), "GET {path}: {status}");
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
        }
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            let mut cur = SseEvent {
                event: "message".into(),
                id: String::new(),
                data: String::new(),
            };
            let mut data: Vec<String> = Vec::new();
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if line.is_empty() {
                    if !data.is_empty() {
                        cur.data = data.join("\n");
                        if tx.send(cur.clone()).is_err() {
                            break;
                        }
                    }
                    data.clear();
                    cur.event = "message".into();
                    continue;
                }
                if line.starts_with(':') {
                    continue;
                }
                let (k, v) = line.split_once(':').unwrap_or((&line, ""));
                let v = v.strip_prefix(' ').unwrap_or(v);
                match k {
                    "event" => cur.event = v.to_string(),
                    "id" => cur.id = v.to_string(),
                    "data" => data.push(v.to_string()),
                    _ => {}
                }
            }
        });
        SseClient { events, stream: s }
    }

    /// The next event within `limit`, if any.
    pub fn next(&self, limit: Duration) -> Option<SseEvent> {
        self.events.recv_timeout(limit).ok()
    }

    /// Events until `n` have arrived; panics after `limit` with what did.
    pub fn take(&self, n: usize, limit: Duration) -> Vec<SseEvent> {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(e) => got.push(e),
                None => panic!("{} of {n} events within {limit:?}: {got:?}", got.len()),
            }
        }
        got
    }
}

impl Drop for SseClient {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// `huddle ARGS... --json` parsed.
pub fn cli_json(db: &str, args: &[&str]) -> Value {
    let mut c = huddle(db);
    c.args(args);
    let out = ok(c);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// `huddle task ...` as `agent` in `room`.
pub fn task(db: &str, room: &str, agent: &str, args: &[&str]) -> String {
    let mut c = huddle(db);
    c.arg("task")
        .arg(args[0])
        .args(["--room", room, "--agent", agent])
        .args(&args[1..]);
    ok(c)
}

/// `huddle post` as `who`.
pub fn post(db: &str, room: &str, who: &str, text: &str) -> String {
    let mut c = huddle(db);
    c.args(["post", "--room", room, "--as", who, text]);
    ok(c).trim().to_string()
}

/// The room's rows as `huddle tail --json` prints them.
pub fn tail_rows(db: &str, room: &str) -> Vec<Value> {
    let mut c = huddle(db);
    c.args(["tail", "--room", room, "--json"]);
    ok(c)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect()
}

/// A row's cursor text from its JSON.
fn cursor_of(row: &Value) -> String {
    format!(
        "{}:{}",
        row["position"]["major"].as_u64().unwrap(),
        row["position"]["minor"].as_u64().unwrap()
    )
}

/// A room `dash` owned by ana: tasks a, b (after a), c; bo did a, cy holds c, and a
/// person posted a message with markup in it.
pub async fn seeded(db: &str) {
    let tasks = vec![
        ("a".to_string(), vec![]),
        ("b".to_string(), vec!["a".to_string()]),
        ("c".to_string(), vec![]),
    ];
    seed_tasks(db, "dash", &tasks, 60_000).await;
    task(db, "dash", "bo", &["claim", "a"]);
    task(db, "dash", "bo", &["complete", "a", "--result", "A <done>"]);
    task(db, "dash", "cy", &["claim", "c"]);
    post(db, "dash", "pat", "hello <script>alert('x')</script> & bye");
}

on_both_backends!(
    every_endpoint_answers_what_the_cli_prints,
    events_resume_across_a_server_restart_losing_and_repeating_nothing,
    hostile_input_gets_400s_and_a_corrupt_row_breaks_nothing,
    pages_escape_ledger_text_draw_every_task_and_metrics_count_them,
);

async fn every_endpoint_answers_what_the_cli_prints(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seeded(&db).await;
    let server = Server::start(&db);

    assert_eq!(
        server.json("/api/rooms"),
        cli_json(&db, &["room", "list", "--json"])
    );
    let tasks = server.json("/api/rooms/dash/tasks");
    assert_eq!(tasks, cli_json(&db, &["tasks", "--room", "dash", "--json"]));
    assert_eq!(tasks["summary"]["done"], 1, "{tasks}");
    assert_eq!(tasks["summary"]["claimed"], 1, "{tasks}");
    assert_eq!(
        server.json("/api/rooms/dash/board"),
        cli_json(&db, &["board", "--room", "dash", "--json"])
    );
    let claims = server.json("/api/rooms/dash/claims");
    assert_eq!(
        claims,
        cli_json(&db, &["claims", "--room", "dash", "--json"])
    );
    assert!(
        claims
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["state"]["key"] == "task/dash/c" && c["live"] == true),
        "{claims}"
    );

    // Interactions: the rows of `tail --json`, whole or page by page.
    let tail = tail_rows(&db, "dash");
    assert!(tail.len() > 8, "{}", tail.len());
    let all = server.json("/api/rooms/dash/interactions?limit=1000");
    assert_eq!(all["interactions"].as_array().unwrap(), &tail);
    assert_eq!(all["caught_up"], true);
    let mut paged = Vec::new();
    let mut after = "0:0".to_string();
    loop {
        let page = server.json(&format!(
            "/api/rooms/dash/interactions?after={after}&limit=3"
        ));
        let rows = page["interactions"].as_array().unwrap().clone();
        assert!(rows.len() <= 3);
        after = page["next"].as_str().unwrap().to_string();
        if rows.is_empty() {
            break;
        }
        paged.extend(rows);
    }
    assert_eq!(paged, tail);
    // The default page is 100 rows from the start.
    let first = server.json("/api/rooms/dash/interactions");
    assert_eq!(first["interactions"][0], tail[0]);
}

async fn events_resume_across_a_server_restart_losing_and_repeating_nothing(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seeded(&db).await;
    let before = tail_rows(&db, "dash");

    let server = Server::start(&db);
    // From the start: every row so far, in order, each with its cursor as id.
    let sse = SseClient::open(&server.addr, "/api/rooms/dash/events?after=0:0", &[]);
    let mut seen = sse.take(before.len(), secs(30));
    for (e, row) in seen.iter().zip(&before) {
        assert_eq!(e.event, "interaction");
        assert_eq!(e.id, cursor_of(row));
        assert_eq!(&serde_json::from_str::<Value>(&e.data).unwrap(), row);
    }
    // A stream opened without a cursor starts at the end of the room.
    let fresh = SseClient::open(&server.addr, "/api/rooms/dash/events", &[]);
    // A new row arrives on both, well within the server's 30 s fallback poll: the
    // doorbell woke them.
    let started = Instant::now();
    post(&db, "dash", "pat", "while connected");
    let e = sse.take(1, secs(10)).remove(0);
    let f = fresh.take(1, secs(10)).remove(0);
    assert!(started.elapsed() < secs(10));
    assert_eq!(e, f, "both streams send the new row");
    assert_eq!(
        serde_json::from_str::<Value>(&e.data).unwrap()["body"]["text"],
        "while connected"
    );
    seen.push(e);
    assert!(sse.next(ms(300)).is_none(), "nothing else was written");
    let last = seen.last().unwrap().id.clone();

    // The server goes away (Ctrl-C ends it promptly, open streams and all); rows are
    // written while it is down; a new server, and the client resumes from the last id
    // it received.
    let status = server.interrupt(secs(10));
    assert!(status.success(), "huddle serve exited with {status}");
    drop(sse);
    drop(fresh);
    post(&db, "dash", "pat", "while the server was down");
    task(&db, "dash", "bo", &["claim", "b"]);
    task(&db, "dash", "bo", &["complete", "b", "--result", "B"]);
    let server = Server::start(&db);
    let resumed = SseClient::open(
        &server.addr,
        // A Last-Event-ID wins over ?after= (the browser keeps its first URL).
        "/api/rooms/dash/events?after=0:0",
        &[("Last-Event-ID", &last)],
    );
    let after = tail_rows(&db, "dash");
    let missing = after.len() - seen.len();
    assert_eq!(
        missing,
        4,
        "a message, a claim, a completion and its turn row: {:?}",
        after[seen.len()..]
            .iter()
            .map(|r| (r["verb"].clone(), r["actor"].clone()))
            .collect::<Vec<_>>()
    );
    seen.extend(resumed.take(missing, secs(30)));
    assert!(resumed.next(ms(300)).is_none(), "a row was sent twice");
    let ids: Vec<&str> = seen.iter().map(|e| e.id.as_str()).collect();
    let expected: Vec<String> = after.iter().map(cursor_of).collect();
    assert_eq!(ids, expected, "every row once, in ledger order");
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len());
    for (e, row) in seen.iter().zip(&after) {
        assert_eq!(&serde_json::from_str::<Value>(&e.data).unwrap(), row);
    }
}

/// Inserts a row whose id is not its content's hash into room `dash`.
async fn insert_corrupt_row(database: &TestDatabase) {
    let id = vec![0xabu8; 32];
    let body = r#"{"text":"forged"}"#;
    match database.backend {
        Backend::Sqlite => {
            let path = database.url.trim_start_matches("sqlite://").to_string();
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute(
                "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay) \
                 VALUES (?1, 'dash', 'message.posted', 'mallory', 'human', ?2, 0, 'x')",
                rusqlite::params![id, body],
            )
            .unwrap();
        }
        Backend::Postgres | Backend::PostgresOwnCluster => {
            let (client, conn) = tokio_postgres::connect(&database.url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let driver = tokio::spawn(conn);
            client
                .execute(
                    "INSERT INTO interaction (id, room, verb, actor, role, body) \
                     VALUES ($1, 'dash', 'message.posted', 'mallory', 'human', $2)",
                    &[&id, &body],
                )
                .await
                .unwrap();
            drop(client);
            let _ = driver.await;
        }
    }
}

async fn hostile_input_gets_400s_and_a_corrupt_row_breaks_nothing(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seeded(&db).await;
    let server = Server::start(&db);
    let long = "r".repeat(300);
    let bad = [
        "/api/rooms/a%2Fb/tasks".to_string(),
        "/api/rooms/%00x/board".to_string(),
        "/api/rooms/%1B%5B31m/claims".to_string(),
        "/api/rooms/%20dash/tasks".to_string(),
        "/api/rooms/%FF%FE/tasks".to_string(),
        format!("/api/rooms/{long}/tasks"),
        "/api/rooms/dash/interactions?after=x".to_string(),
        "/api/rooms/dash/interactions?after=1".to_string(),
        "/api/rooms/dash/interactions?after=-1:0".to_string(),
        "/api/rooms/dash/interactions?after=99999999999999999999999:0".to_string(),
        "/api/rooms/dash/interactions?after=%ZZ".to_string(),
        "/api/rooms/dash/interactions?limit=0".to_string(),
        "/api/rooms/dash/interactions?limit=1001".to_string(),
        "/api/rooms/dash/interactions?limit=ten".to_string(),
        "/api/rooms/dash/interactions?limit=1&limit=2".to_string(),
        "/api/rooms/dash/interactions?sql=1".to_string(),
        "/api/rooms/dash/events?after=0:".to_string(),
        "/api/rooms/dash/events?limit=5".to_string(),
        "/rooms/a%2Fb".to_string(),
    ];
    for path in &bad {
        let (status, body) = server.get(path);
        assert_eq!(status, 400, "GET {path}: {body}");
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {v}"
        );
    }
    for header in ["garbage", "1:2:3", "-5:0"] {
        let (status, body) = get_with(
            &server.addr,
            "/api/rooms/dash/events",
            &[("Last-Event-ID", header)],
        );
        assert_eq!(status, 400, "Last-Event-ID {header}: {body}");
        assert!(body.contains("Last-Event-ID"), "{body}");
    }
    for path in ["/api/rooms/nope/tasks", "/rooms/nope", "/api/nothing"] {
        let (status, body) = server.get(path);
        assert_eq!(status, 404, "GET {path}: {body}");
        assert!(body.contains("\"error\""), "{body}");
    }
    // An unusual but valid name (a space, non-ASCII, markup) works everywhere, linked
    // percent-encoded and shown escaped.
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "r ü<i>", "--owner", "ana"]);
        c
    });
    let (status, index) = server.get("/");
    assert_eq!(status, 200);
    assert!(
        index.contains("href=\"/rooms/r%20%C3%BC%3Ci%3E\">r ü&lt;i&gt;</a>"),
        "{index}"
    );
    for path in [
        "/rooms/r%20%C3%BC%3Ci%3E",
        "/api/rooms/r%20%C3%BC%3Ci%3E/tasks",
        "/api/rooms/r%20%C3%BC%3Ci%3E/interactions",
    ] {
        let (status, body) = server.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
    }
    // Another host name on a loopback server (DNS rebinding) is refused.
    let (status, _) = get_with(&server.addr, "/api/rooms", &[("Host", "evil.example")]);
    assert_eq!(status, 403);

    // A corrupt row: every endpoint still answers, the interactions page reports it
    // skipped, and the stream sends it as `skipped` and goes on.
    let sse = SseClient::open(&server.addr, "/api/rooms/dash/events", &[]);
    insert_corrupt_row(&database).await;
    post(&db, "dash", "pat", "after the corrupt row");
    let events = sse.take(2, secs(40));
    assert_eq!(events[0].event, "skipped", "{events:?}");
    assert_eq!(events[1].event, "interaction", "{events:?}");
    assert!(events[1].data.contains("after the corrupt row"));
    for path in [
        "/",
        "/rooms/dash",
        "/rooms/dash/live",
        "/api/rooms",
        "/api/rooms/dash/tasks",
        "/api/rooms/dash/board",
        "/api/rooms/dash/claims",
        "/metrics",
    ] {
        let (status, body) = server.get(path);
        assert_eq!(status, 200, "GET {path} after a corrupt row: {body}");
    }
    let page = server.json("/api/rooms/dash/interactions?limit=1000");
    assert_eq!(
        page["skipped"].as_array().unwrap().len(),
        1,
        "{}",
        page["skipped"]
    );
    assert_eq!(
        page["interactions"].as_array().unwrap(),
        &tail_rows(&db, "dash"),
        "the corrupt row is skipped as `tail` skips it"
    );
    let (_, metrics) = server.get("/metrics");
    assert!(metrics.contains("huddle_skipped_rows 1\n"), "{metrics}");
}

async fn pages_escape_ledger_text_draw_every_task_and_metrics_count_them(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let db = database.url.clone();
    seeded(&db).await;
    // A barrier, so the room has a pattern to show.
    ok({
        let mut c = huddle(&db);
        c.args([
            "barrier", "open", "--room", "dash", "--agent", "bo", "build",
        ])
        .args(["--roster", "bo,cy", "--timeout-ms", "600000"]);
        c
    });
    let server = Server::start(&db);

    let (status, index) = server.get("/");
    assert_eq!(status, 200);
    assert!(index.contains("href=\"/rooms/dash\""), "{index}");
    assert!(index.contains("1/3 done"), "{index}");

    let (status, room) = server.get("/rooms/dash");
    assert_eq!(status, 200);
    assert!(
        room.contains("hello &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; bye"),
        "{room}"
    );
    assert!(!room.contains("<script>alert"), "unescaped ledger text");
    assert_eq!(
        room.matches("<script").count(),
        1,
        "only the page's own script"
    );
    assert!(room.contains("<script src=\"/assets/room.js\">"));
    // The DAG: one node per task with its status; the edge a -> b.
    let tasks = cli_json(&db, &["tasks", "--room", "dash", "--json"]);
    for t in tasks["tasks"].as_array().unwrap() {
        let id = t["id"].as_str().unwrap();
        let word = match (t["status"].as_str().unwrap(), t["ready"].as_bool().unwrap()) {
            ("done", _) => "done",
            ("claimed", _) => "claimed",
            ("open", true) => "ready",
            ("open", false) => "waiting",
            (other, _) => panic!("status {other}"),
        };
        assert!(
            room.contains(&format!("data-task=\"{id}\" data-status=\"{word}\"")),
            "task {id} as {word}: {room}"
        );
    }
    assert_eq!(room.matches("<g class=\"node ").count(), 3);
    assert!(room.contains("data-from=\"a\" data-to=\"b\""));
    // Claims with time left; the board's agents.
    assert!(room.contains("task/dash/c"), "{room}");
    assert!(room.contains("data-agent=\"bo\""), "{room}");
    assert!(
        room.contains("<section id=\"patterns\">")
            && room.contains("build [")
            && room.contains("missing: bo, cy"),
        "the barrier, in the words of `huddle barriers`: {room}"
    );
    let (status, script) = server.get("/assets/room.js");
    assert_eq!(status, 200);
    assert!(script.contains("EventSource") && !script.contains("innerHTML = row"));

    // Metrics: the text format, and task counts equal to `tasks --json`.
    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        assert!(value.parse::<f64>().is_ok(), "{line}");
        assert!(name.starts_with("huddle_"), "{line}");
    }
    let s = &tasks["summary"];
    for status in [
        "done",
        "claimed",
        "ready",
        "waiting",
        "blocked",
        "abandoned",
    ] {
        let line = format!(
            "huddle_tasks{{room=\"dash\",status=\"{status}\"}} {}\n",
            s[status]
        );
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    assert!(
        metrics.contains("huddle_claims{kind=\"task\",state=\"live\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("huddle_agent_tasks_done{room=\"dash\",agent=\"bo\"} 1\n"),
        "{metrics}"
    );
    let rows = tail_rows(&db, "dash").len();
    let counted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("huddle_interactions{room=\"dash\""))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted as usize, rows);

    // The live fragment is rendered once for pages asking together, but never served
    // stale: a row appended after a render makes the next request render again.
    let renders = |server: &Server| -> u64 {
        let (_, m) = server.get("/metrics");
        m.lines()
            .find_map(|l| l.strip_prefix("huddle_fragment_renders_total "))
            .and_then(|v| v.parse().ok())
            .expect("huddle_fragment_renders_total")
    };
    let before = renders(&server);
    let together: Vec<_> = (0..10)
        .map(|_| {
            let addr = server.addr.clone();
            std::thread::spawn(move || get_with(&addr, "/rooms/dash/live", &[]))
        })
        .collect();
    for t in together {
        let (status, body) = t.join().unwrap();
        assert_eq!(status, 200);
        assert!(
            body.contains("data-task=\"c\" data-status=\"claimed\""),
            "{body}"
        );
    }
    let rendered = renders(&server) - before;
    assert!(rendered < 10, "10 requests together, {rendered} renders");
    task(&db, "dash", "cy", &["complete", "c", "--result", "C"]);
    let (_, fragment) = server.get("/rooms/dash/live");
    assert!(
        fragment.contains("data-task=\"c\" data-status=\"done\""),
        "a fragment older than the last row was served: {fragment}"
    );
}
