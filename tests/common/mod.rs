//! Shared helpers for the end-to-end tests: the real `huddle` binary and bounded waits.
#![allow(dead_code)]

/// One `#[tokio::test]` per backend for a scenario `async fn name(Backend)` (the
/// test file has `Backend` in scope and declares `#[macro_use] mod common;`).
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await
            }
        }
    )*};
}

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The path of the `huddle` binary, built once per test process with the same cargo
/// and profile that runs the tests.
pub fn huddle_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("huddle-cli", "huddle"))
        .clone()
}

/// Builds binary `bin` of workspace package `package` with the cargo and profile that
/// run the tests, and returns its path.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {bin}: {e}"));
    assert!(status.success(), "building {bin} failed");
    // target/debug/deps/<test> -> target/debug/<bin>
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("test binary lives in target/<profile>/deps");
    let path = dir.join(bin);
    assert!(path.exists(), "no {bin} binary at {}", path.display());
    path
}

/// Where the tests' owner keys live (`HUDDLE_KEYS` of every [`huddle`] command):
/// shared by all tests, since `huddle room create` reuses a key file that exists.
pub fn keys_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("owner-keys")
}

/// The secret key of owner `name` as the tests' `huddle room create` made it.
pub fn owner_key(name: &str) -> huddle_core::signing::OwnerSecret {
    let path = keys_dir().join(format!("{name}.key"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read the owner key {}: {e}", path.display()));
    text.trim().parse().expect("a valid owner key file")
}

/// A `huddle` command on database `db`, quiet logs, owner keys in [`keys_dir`].
pub fn huddle(db: &str) -> Command {
    let mut c = Command::new(huddle_bin());
    c.env("HUDDLE_DB", db)
        .env_remove("RUST_LOG")
        .env_remove("HUDDLE_OWNER_KEY")
        .env("HUDDLE_KEYS", keys_dir())
        .env("HUDDLE_LOG", "warn");
    c
}

/// A room owned by `ana` with `tasks` as `(id, deps)` and the given claim TTL,
/// written as the owner's signed `!config` and `!delegate` with the rows a relay
/// appends for them.
pub async fn seed_tasks(db: &str, room: &str, tasks: &[(String, Vec<String>)], claim_ttl_ms: u64) {
    ok({
        let mut c = huddle(db);
        c.args(["room", "create", room, "--owner", "ana"]);
        c
    });
    let store = huddle_store::open(db, huddle_store::StoreOptions::default())
        .await
        .expect("open the database");
    let mut delegate = String::from("!delegate");
    for (id, deps) in tasks {
        delegate.push_str(&format!("\n{id}: do {id}"));
        if !deps.is_empty() {
            delegate.push_str(&format!(" [after {}]", deps.join(", ")));
        }
    }
    let config = format!("!config claim-ttl {claim_ttl_ms}ms max-attempts 5");
    let mut commands = vec![config.as_str()];
    if !tasks.is_empty() {
        commands.push(&delegate);
    }
    // The signed commands and the rows a relay appends for them; the room itself was
    // created above with the same owner key.
    let rows =
        huddle_core::seed_room(room, "ana", &owner_key("ana"), &commands).expect("seed commands");
    let rows = &rows[1..];
    for chunk in rows.chunks(100) {
        store.append(chunk.to_vec()).await.expect("seed the room");
    }
}

/// Runs a command, returning its output.
pub fn run(mut c: Command) -> Output {
    c.output().expect("spawn huddle")
}

/// Runs and asserts success, returning stdout.
pub fn ok(c: Command) -> String {
    let out = run(c);
    assert!(
        out.status.success(),
        "huddle failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs and asserts failure, returning stderr.
pub fn fails(c: Command) -> String {
    let out = run(c);
    assert!(
        !out.status.success(),
        "expected failure, got stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).expect("utf-8 stderr")
}

/// A child process whose stdout lines are collected on a thread.
pub struct LineChild {
    /// The process.
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl LineChild {
    /// Spawns `c` with stdout piped.
    pub fn spawn(mut c: Command) -> Self {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LineChild { child, lines }
    }

    /// Waits up to `limit` for a line satisfying `pred`; panics with `what` otherwise.
    pub fn expect_line(&self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => continue,
                Err(_) => panic!("no line within {limit:?}: {what}"),
            }
        }
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub mod history;
pub mod mcp;
pub mod relays;
