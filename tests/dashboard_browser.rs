//! End-to-end in a real browser: Debian's headless `chromium`, driven through
//! `chromedriver`'s WebDriver protocol (plain JSON over HTTP, spoken by the small
//! client below, so no WebDriver crate is compiled). The room page of `huddle serve`
//! loads, shows the board and the DAG, and follows the room live: a relay's
//! completions turn the DAG's nodes done, the owner types a message and an owner
//! command into the page's post box (`huddle serve --owner`) and they appear in the
//! timeline (the message within a second), with huddle's answer to the command beside
//! the box, and a killed relay's agent turns offline — each within a bounded wait,
//! with no console errors.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (`apt-get install chromium
//! chromium-driver`; `.ci/run` installs them); fails, saying so, without them.
//! Screenshots go to `HUDDLE_SCREENSHOTS` when set (`docs/` holds the ones made so),
//! else beside the test binary.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::relays::{ms, relay_toml, secs, AgentSpec, RelayProcess};
use common::*;
use serde_json::{json, Value};

use crate::dashboard::Server;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One HTTP/1.1 request; the status and the body as JSON. The answer is read by its
/// `Content-Length` (or chunks): chromedriver keeps connections open.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(secs(120))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let complete = |raw: &[u8]| -> Option<(usize, String)> {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let rest = &raw[split + 4..];
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        let done = match length {
            Some(n) => rest.len() >= n,
            None if head.contains("transfer-encoding: chunked") => {
                rest.windows(5).any(|w| w == b"0\r\n\r\n")
            }
            None => false,
        };
        done.then_some((split, head))
    };
    let (split, head) = loop {
        if let Some(found) = complete(&raw) {
            break found;
        }
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            // A signal (a child process of the test exiting) interrupted the wait:
            // nothing was read, read again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        if n == 0 {
            break complete(&raw).unwrap_or_else(|| {
                let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
                (
                    split,
                    String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase(),
                )
            });
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let mut payload = raw[(split + 4).min(raw.len())..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        payload = dechunk(&payload);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
    (status, value)
}

/// A chunked HTTP body, joined.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || raw.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[(eol + 4 + size).min(raw.len())..];
    }
}

/// chromedriver, killed when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running chromedriver and one headless Chromium session.
struct Browser {
    _driver: Driver,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: the browser test needs Debian's chromium and \
                 chromium-driver (`apt-get install -y chromium chromium-driver`)"
            );
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = Driver(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start chromedriver"),
        );
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + secs(30);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(ms(100));
        }
        let profile = tempfile::tempdir().expect("a fresh Chromium profile");
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1600,1200".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"}
        }}});
        let (status, v) = http(&addr, "POST", "/session", Some(&caps));
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session ({status}): {v}"))
            .to_string();
        Browser {
            _driver: driver,
            addr,
            session,
            _profile: profile,
        }
    }

    fn cmd(&self, method: &str, what: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        let (status, v) = http(&self.addr, method, &path, body);
        assert_eq!(status, 200, "{method} {what}: {v}");
        v["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.cmd("POST", "url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    /// Waits up to `limit` for `script` to return true; panics with `what` and the
    /// page's state otherwise. How long it took.
    fn wait_for(&self, what: &str, limit: Duration, script: &str) -> Duration {
        let started = Instant::now();
        loop {
            if self.js(script) == Value::Bool(true) {
                return started.elapsed();
            }
            if started.elapsed() > limit {
                let text = self.js("return document.body.innerText.slice(0, 3000);");
                panic!("{what}: not within {limit:?}; the page says:\n{text}");
            }
            std::thread::sleep(ms(50));
        }
    }

    /// The WebDriver id of the element `css` selects.
    fn element(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "element",
            Some(&json!({"using": "css selector", "value": css})),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// Types `text` into the element `css` selects, as a person would.
    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.cmd(
            "POST",
            &format!("element/{id}/value"),
            Some(&json!({ "text": text })),
        );
    }

    /// Clicks the element `css` selects.
    fn click(&self, css: &str) {
        let id = self.element(css);
        self.cmd("POST", &format!("element/{id}/click"), Some(&json!({})));
    }

    /// Console messages of level SEVERE since the last call.
    fn console_errors(&self) -> Vec<Value> {
        let logs = self.cmd("POST", "se/log", Some(&json!({"type": "browser"})));
        logs.as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["level"] == "SEVERE")
            .collect()
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        use base64_png::decode;
        let data = self.cmd("GET", "screenshot", None);
        let bytes = decode(data.as_str().expect("base64 screenshot"));
        let dir = std::env::var_os("HUDDLE_SCREENSHOTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        // Ends Chromium; chromedriver itself is killed by its guard after this.
        let _ = std::panic::catch_unwind(|| http(&self.addr, "DELETE", &path, None));
    }
}

/// Standard base64 (what WebDriver screenshots are), decoded.
mod base64_png {
    pub fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| -> Option<u32> {
            Some(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return None,
            } as u32)
        };
        let digits: Vec<u32> = text.bytes().filter_map(value).collect();
        let mut out = Vec::with_capacity(digits.len() * 3 / 4);
        for chunk in digits.chunks(4) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, d)| acc | (d << (18 - 6 * i)));
            out.push((n >> 16) as u8);
            if chunk.len() > 2 {
                out.push((n >> 8) as u8);
            }
            if chunk.len() > 3 {
                out.push(n as u8);
            }
        }
        out
    }
}

/// Done tasks by the ledger (`huddle tasks --json`).
fn done_in_ledger(db: &str, room: &str) -> u64 {
    let mut c = huddle(db);
    c.args(["tasks", "--room", room, "--json"]);
    let v: Value = serde_json::from_str(&ok(c)).unwrap();
    v["summary"]["done"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_page_follows_the_room_live_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("huddle.db").display());
    let room = "web";
    // Sixteen tasks in four layers: a fan-out, a join, a tail.
    let mut tasks = vec![("plan".to_string(), vec![])];
    for i in 0..6 {
        tasks.push((format!("fetch-{i}"), vec!["plan".to_string()]));
        tasks.push((format!("parse-{i}"), vec![format!("fetch-{i}")]));
    }
    tasks.push((
        "merge".to_string(),
        (0..6).map(|i| format!("parse-{i}")).collect(),
    ));
    tasks.push(("report".to_string(), vec!["merge".to_string()]));
    tasks.push(("publish".to_string(), vec!["report".to_string()]));
    seed_tasks(&db, room, &tasks, 60_000).await;
    let total = tasks.len();

    // The server posts as the room's owner from its page.
    let server = Server::start_with(&db, &["--owner", "ana"]);
    let browser = Browser::start();
    let url = format!("http://{}/rooms/{room}", server.addr);
    browser.goto(&url);
    browser.wait_for(
        "the event stream connects",
        secs(20),
        "return document.body.dataset.sse === 'open';",
    );
    // The board and the DAG: every task a node, the first one ready.
    assert_eq!(
        browser.js("return document.querySelectorAll('#dag g.node').length;"),
        json!(total)
    );
    assert_eq!(
        browser.js("return document.querySelector('#dag [data-task=\"plan\"]').dataset.status;"),
        json!("ready")
    );
    assert_eq!(
        browser.js("return !!document.querySelector('#board table');"),
        json!(true)
    );
    assert_eq!(
        browser.js("return document.querySelectorAll('#dag path.edge').length;"),
        json!(6 + 6 + 6 + 1 + 1)
    );

    // A relay hosting two simulated agents works the DAG; the page follows the ledger.
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        relay_toml(
            "r0",
            &db,
            &[room],
            &[AgentSpec::sim("dee", 700), AgentSpec::sim("eli", 700)],
        ),
    )
    .unwrap();
    let mut relay = RelayProcess::spawn(
        "r0",
        vec!["dee".into(), "eli".into()],
        &db,
        &config,
        &dir.path().join("relay.log"),
    );
    browser.wait_for(
        "the relay's agents appear online",
        secs(30),
        "var r = document.querySelector('#board tr[data-agent=\"dee\"]'); \
         return !!r && r.dataset.state !== 'offline' && \
         !!document.querySelector('#relays li.relay.online[data-relay=\"r0\"]');",
    );
    // Mid-run: some done, some not.
    browser.wait_for(
        "some tasks done",
        secs(60),
        "return document.querySelectorAll('#dag g.node.done').length >= 3;",
    );
    browser.screenshot("dashboard-room-running.png");
    // Each change of the ledger reaches the page within a bounded wait: sample the
    // ledger and the page until every task is done on both.
    let deadline = Instant::now() + secs(120);
    let mut lag_worst = Duration::ZERO;
    let mut behind_since: Option<(u64, Instant)> = None;
    loop {
        let ledger = done_in_ledger(&db, room);
        let page = browser
            .js("return document.querySelectorAll('#dag g.node.done').length;")
            .as_u64()
            .unwrap();
        assert!(
            page <= ledger,
            "the page shows more done ({page}) than the ledger ({ledger})"
        );
        if page < ledger {
            let since = match behind_since {
                Some((n, t)) if n <= page => t,
                _ => Instant::now(),
            };
            behind_since = Some((page, since));
            lag_worst = lag_worst.max(since.elapsed());
            assert!(
                since.elapsed() < secs(3),
                "the page stayed at {page} done for 3 s while the ledger had {ledger}"
            );
        } else {
            behind_since = None;
        }
        if page as usize == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not finish: {}",
            relay.log_tail(20)
        );
        std::thread::sleep(ms(100));
    }
    eprintln!("the page's worst lag behind the ledger: {lag_worst:?}");
    assert_eq!(
        browser.js("return document.getElementById('counts').textContent;"),
        json!(format!("{total}/{total} done"))
    );

    // The owner posts from the page's box: the message appears in the timeline within
    // a second, as text (its markup escaped, never parsed); an owner command typed
    // there gets huddle's answer beside the box and, highlighted, in the timeline.
    browser.type_into("#post-text", "ship it <b>now</b> & thanks");
    let posted = Instant::now();
    browser.click("#post-send");
    let took = browser.wait_for(
        "the owner's message appears within a second",
        secs(1),
        "return Array.from(document.querySelectorAll('#timeline-list li.message .text')) \
         .some(function (t) { return t.textContent === 'ship it <b>now</b> & thanks'; });",
    );
    eprintln!(
        "the owner's message was on the page {:?} after the click ({took:?} of waiting)",
        posted.elapsed()
    );
    assert_eq!(
        browser.js("return document.querySelectorAll('#timeline-list b').length;"),
        json!(0)
    );
    assert_eq!(
        browser.js("return document.getElementById('post-text').value;"),
        json!(""),
        "the box is emptied once posted"
    );
    browser.type_into("#post-text", "!config get claim-ttl");
    browser.click("#post-send");
    browser.wait_for(
        "huddle's answer to the command beside the box",
        secs(15),
        "var a = document.getElementById('post-answer'); \
         return !a.hidden && a.textContent.indexOf('claim-ttl = ') >= 0;",
    );
    browser.wait_for(
        "the owner's command and huddle's answer appear in the timeline, highlighted",
        secs(5),
        "function has(cls, text) { \
           return Array.from(document.querySelectorAll('#timeline-list li.' + cls + ' .text')) \
             .some(function (t) { return t.textContent.indexOf(text) >= 0; }); } \
         return has('command', '!config get claim-ttl') && has('answer', 'claim-ttl');",
    );
    browser.screenshot("dashboard-owner-answer.png");
    // The timeline by thread: a message posted in thread `design` adds the thread to
    // the filter; filtering shows that thread's messages only.
    browser.type_into("#post-thread", "design");
    browser.type_into("#post-text", "a note on the design");
    browser.click("#post-send");
    browser.wait_for(
        "the thread appears in the filter",
        secs(5),
        "return !!document.querySelector('#thread-filter option[value=\"design\"]');",
    );
    let shown = browser.js(
        "var f = document.getElementById('thread-filter'); f.value = 'design'; \
         f.dispatchEvent(new Event('change')); \
         return Array.from(document.querySelectorAll('#timeline-list li')) \
           .filter(function (li) { return !li.hidden; }) \
           .map(function (li) { return li.dataset.thread + '|' + li.querySelector('.text').textContent; });",
    );
    let shown = shown.as_array().expect("rows").clone();
    assert!(
        !shown.is_empty()
            && shown
                .iter()
                .all(|r| r.as_str().unwrap().starts_with("design|"))
            && shown.contains(&json!("design|a note on the design")),
        "{shown:?}"
    );
    browser.js(
        "var f = document.getElementById('thread-filter'); f.value = '*'; \
         f.dispatchEvent(new Event('change')); return true;",
    );
    browser.screenshot("dashboard-room-finished.png");

    // A killed relay: once its liveness lease lapses (10 s) its agents are offline,
    // with no new row to announce it.
    relay.kill9();
    browser.wait_for(
        "the killed relay's agents turn offline",
        secs(30),
        "var r = document.querySelector('#board tr[data-agent=\"dee\"]'); \
         return !!r && r.dataset.state === 'offline' && \
         !!document.querySelector('#relays li.relay.offline[data-relay=\"r0\"]');",
    );

    // The demo's 300-task DAG on the same server, mid-run and finished.
    let mut demo = huddle(&db)
        .args(["demo", "--tasks", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start huddle demo");
    let deadline = Instant::now() + secs(60);
    loop {
        let (status, body) = server.get("/api/rooms/demo/tasks");
        if status == 200 {
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["summary"]["total"] == 300 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the demo never delegated its DAG"
        );
        std::thread::sleep(ms(50));
    }
    browser.goto(&format!("http://{}/rooms/demo", server.addr));
    browser.wait_for(
        "the demo's event stream connects",
        secs(20),
        "return document.body.dataset.sse === 'open';",
    );
    assert_eq!(
        browser.js("return document.querySelectorAll('#dag g.node').length;"),
        json!(300)
    );
    browser.wait_for(
        "the demo is under way",
        secs(60),
        "return document.querySelectorAll('#dag g.node.done').length >= 60;",
    );
    browser.screenshot("dashboard-demo-300-running.png");
    browser.wait_for(
        "the demo's 300 tasks are done on the page",
        secs(120),
        "return document.querySelectorAll('#dag g.node.done').length === 300;",
    );
    let status = demo.wait().expect("wait for the demo");
    assert!(status.success(), "huddle demo failed: {status}");
    browser.screenshot("dashboard-demo-300-finished.png");

    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}
