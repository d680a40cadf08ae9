//! Shared helpers for the end-to-end tests: the real `huddle` binary and bounded waits.
#![allow(dead_code)]

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

/// A `huddle` command on database `db`, quiet logs.
pub fn huddle(db: &str) -> Command {
    let mut c = Command::new(huddle_bin());
    c.env("HUDDLE_DB", db)
        .env_remove("RUST_LOG")
        .env("HUDDLE_LOG", "warn");
    c
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
pub mod relays;
