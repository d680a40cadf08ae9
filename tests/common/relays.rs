//! A harness for end-to-end tests that run relays as separate OS processes.
//!
//! One [`Huddle`] is one test's world: a fresh database on the chosen [`Backend`], a
//! room with an owner, a temporary directory for relay configurations, logs and exec
//! scripts, and the relays it started. Relays are real `huddle relay --config`
//! processes: the harness writes a `huddle.toml` for each, stops them with SIGTERM and
//! reads their JSON summaries, kills them with SIGKILL, and pauses them with SIGSTOP /
//! SIGCONT.
//!
//! The test sees the ledger through its own store handle and waits for conditions by
//! folding it ([`Ledger`]: rows, task DAG, board) with bounded waits, never a fixed
//! sleep before an assertion.
//!
//! ```ignore
//! let mut h = Huddle::new(Backend::Sqlite).await;
//! h.spawn_relay("r0", vec![AgentSpec::sim("a0", 20)]);
//! h.wait_registered(&["a0"]).await;
//! h.config("allocation pull").await;
//! h.delegate("!delegate\nt1: first\nt2: second [after t1]").await;
//! h.wait_for("both done", secs(30), |l| l.summary().done == 2).await;
//! let summaries = h.stop_all().await; // asserts identical state hashes
//! ```
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use huddle_core::board::{CoordNoteBody, Subject, SubjectKind, TurnRepliedBody};
use huddle_core::tasks::TaskSummary;
use huddle_core::{
    Fold, Interaction, InteractionId, NewInteraction, OwnerAuthority, Position, Role, Task,
    Timestamp, Verb,
};
use huddle_sim::Tally;
use huddle_store::{Store, StoreOptions};
use serde_json::{json, Value};

use super::huddle_bin;

/// `Duration::from_secs`, short.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `Duration::from_millis`, short.
pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

// ---------------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------------

/// Which store backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file in a temporary directory.
    Sqlite,
    /// A fresh Postgres database from `huddle-testkit`.
    Postgres,
    /// A database on a Postgres cluster of the test's own, which it may restart.
    PostgresOwnCluster,
}

/// A fresh database for one test; dropped with it.
pub struct TestDatabase {
    /// The URL relays and the harness connect to.
    pub url: String,
    /// The backend.
    pub backend: Backend,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<huddle_testkit::TestDb>,
    cluster: Option<huddle_testkit::PgCluster>,
}

impl TestDatabase {
    /// A fresh, empty database on `backend`.
    pub async fn new(backend: Backend) -> TestDatabase {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir for the database");
                let url = format!("sqlite://{}", dir.path().join("huddle.db").display());
                TestDatabase {
                    url,
                    backend,
                    _dir: Some(dir),
                    _pg: None,
                    cluster: None,
                }
            }
            // Fails loudly, saying how to fix the machine, when there is no Postgres.
            Backend::Postgres => {
                let db = huddle_testkit::test_database().await;
                TestDatabase {
                    url: db.url.clone(),
                    backend,
                    _dir: None,
                    _pg: Some(db),
                    cluster: None,
                }
            }
            Backend::PostgresOwnCluster => {
                let cluster = huddle_testkit::PgCluster::start();
                let (admin, conn) =
                    tokio_postgres::connect(&cluster.admin_url(), tokio_postgres::NoTls)
                        .await
                        .expect("connect to the test's own cluster");
                let driver = tokio::spawn(conn);
                admin
                    .batch_execute("CREATE DATABASE huddle_e2e")
                    .await
                    .expect("create the test database");
                drop(admin);
                let _ = driver.await;
                TestDatabase {
                    url: cluster.url_for("huddle_e2e"),
                    backend,
                    _dir: None,
                    _pg: None,
                    cluster: Some(cluster),
                }
            }
        }
    }

    /// Stops the test's own Postgres cluster and starts it again on the same port:
    /// every connection of every relay breaks.
    pub fn restart_postgres(&self) {
        let cluster = self
            .cluster
            .as_ref()
            .expect("restart_postgres needs Backend::PostgresOwnCluster");
        cluster.restart().expect("restart the cluster");
    }

    /// The test's own Postgres cluster (`Backend::PostgresOwnCluster` only).
    pub fn cluster(&self) -> Option<&huddle_testkit::PgCluster> {
        self.cluster.as_ref()
    }

    fn own_cluster(&self) -> &huddle_testkit::PgCluster {
        self.cluster
            .as_ref()
            .expect("stopping Postgres needs Backend::PostgresOwnCluster")
    }

    /// Stops the test's own Postgres cluster (fast shutdown): every relay loses it.
    pub fn stop_postgres(&self) {
        self.own_cluster().stop().expect("stop the cluster");
    }

    /// Starts the test's own Postgres cluster again on the same port.
    pub fn start_postgres(&self) {
        self.own_cluster().start_again().expect("start the cluster");
    }
}

// ---------------------------------------------------------------------------------
// Relay processes
// ---------------------------------------------------------------------------------

/// How a hosted agent runs its turns.
#[derive(Clone, Debug)]
pub enum DriverSpec {
    /// The built-in simulator.
    Sim {
        /// Mean turn time.
        turn_ms: u64,
        /// Relative jitter, 0..=1.
        jitter: f64,
        /// Probability that a turn fails.
        failure_rate: f64,
        /// Seed.
        seed: u64,
    },
    /// A command per turn (no shell unless the command is one).
    Exec {
        /// Program and arguments.
        command: Vec<String>,
        /// Turn timeout.
        timeout_ms: u64,
    },
    /// A long-lived ACP agent.
    Acp {
        /// Program and arguments.
        command: Vec<String>,
        /// Its working directory.
        cwd: PathBuf,
    },
}

/// One agent in a relay's configuration.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The agent key.
    pub key: String,
    /// Its driver.
    pub driver: DriverSpec,
    /// Declared capabilities.
    pub capabilities: Vec<String>,
    /// `priority` in `huddle.toml` (rank under `responder role-priority`).
    pub priority: Option<u32>,
}

impl AgentSpec {
    /// A simulated agent whose turns take `turn_ms`, never failing.
    pub fn sim(key: &str, turn_ms: u64) -> Self {
        AgentSpec {
            key: key.into(),
            driver: DriverSpec::Sim {
                turn_ms,
                jitter: 0.0,
                failure_rate: 0.0,
                seed: 1,
            },
            capabilities: Vec::new(),
            priority: None,
        }
    }

    /// A simulated agent with relative jitter on its turn time.
    pub fn sim_jitter(key: &str, turn_ms: u64, jitter: f64, seed: u64) -> Self {
        AgentSpec {
            key: key.into(),
            driver: DriverSpec::Sim {
                turn_ms,
                jitter,
                failure_rate: 0.0,
                seed,
            },
            capabilities: Vec::new(),
            priority: None,
        }
    }

    /// An exec agent running `sh <script>` (see [`Huddle::script`]).
    pub fn exec(key: &str, script: &Path) -> Self {
        AgentSpec {
            key: key.into(),
            driver: DriverSpec::Exec {
                command: vec!["sh".into(), script.display().to_string()],
                timeout_ms: 30_000,
            },
            capabilities: Vec::new(),
            priority: None,
        }
    }
}

impl AgentSpec {
    /// An ACP agent running `command` in `cwd`.
    pub fn acp(key: &str, command: Vec<String>, cwd: &Path) -> Self {
        AgentSpec {
            key: key.into(),
            driver: DriverSpec::Acp {
                command,
                cwd: cwd.to_path_buf(),
            },
            capabilities: Vec::new(),
            priority: None,
        }
    }
}

/// A TOML basic string (JSON string escapes are a subset TOML accepts).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// The `huddle.toml` of one relay.
pub fn relay_toml(id: &str, database: &str, rooms: &[&str], agents: &[AgentSpec]) -> String {
    let mut t = String::new();
    let rooms: Vec<String> = rooms.iter().map(|r| toml_str(r)).collect();
    let _ = writeln!(t, "relay = {}", toml_str(id));
    let _ = writeln!(t, "database = {}", toml_str(database));
    let _ = writeln!(t, "rooms = [{}]", rooms.join(", "));
    for a in agents {
        let _ = writeln!(t, "\n[[agent]]\nkey = {}", toml_str(&a.key));
        let caps: Vec<String> = a.capabilities.iter().map(|c| toml_str(c)).collect();
        let _ = writeln!(t, "capabilities = [{}]", caps.join(", "));
        if let Some(p) = a.priority {
            let _ = writeln!(t, "priority = {p}");
        }
        match &a.driver {
            DriverSpec::Sim {
                turn_ms,
                jitter,
                failure_rate,
                seed,
            } => {
                let _ = writeln!(
                    t,
                    "driver = \"sim\"\nsim = {{ turn_ms = {turn_ms}, jitter = {jitter:?}, \
                     failure_rate = {failure_rate:?}, tokens = 10, seed = {seed} }}"
                );
            }
            DriverSpec::Exec {
                command,
                timeout_ms,
            } => {
                let cmd: Vec<String> = command.iter().map(|c| toml_str(c)).collect();
                let _ = writeln!(
                    t,
                    "driver = \"exec\"\nexec = {{ command = [{}], timeout_ms = {timeout_ms} }}",
                    cmd.join(", ")
                );
            }
            DriverSpec::Acp { command, cwd } => {
                let cmd: Vec<String> = command.iter().map(|c| toml_str(c)).collect();
                let _ = writeln!(
                    t,
                    "driver = \"acp\"\nacp = {{ command = [{}], cwd = {}, permissions = \"deny\" }}",
                    cmd.join(", "),
                    toml_str(&cwd.display().to_string())
                );
            }
        }
    }
    t
}

/// What `huddle relay` prints when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelaySummary {
    /// Relay id.
    pub relay: String,
    /// Cursor reached.
    pub cursor: String,
    /// Board fold hash.
    pub board_hash: String,
    /// Task DAG fold hash.
    pub tasks_hash: String,
    /// Turns started.
    pub turns_started: u64,
    /// Turns that replied.
    pub turns_replied: u64,
    /// Turns that failed or were cancelled.
    pub turns_failed: u64,
    /// Turns not started (start deadline passed, claims not confirmed).
    pub turns_not_started: u64,
    /// Fenced appends refused.
    pub fenced_refusals: u64,
    /// Corrupt or foreign rows skipped.
    pub skipped_rows: u64,
    /// Rows the relay's reader delivered (of the rooms it serves only).
    pub rows_read: u64,
    /// Writes retried while the database was away.
    pub writes_retried: u64,
    /// Results given up unwritten.
    pub results_lost: u64,
    /// Owner commands without a valid signature, not executed.
    pub unsigned_commands: u64,
    /// `task.created` rows no verified owner command produced.
    pub unauthorized_rows: u64,
    /// Rows written as a bound agent by a writer it is not bound to.
    pub misbound_rows: u64,
    /// Config rows the config fold ignored.
    pub ignored_config_rows: u64,
    /// Rows not signed by a registered writer key where signatures are required.
    pub unsigned_rows: u64,
    /// Rows under a signing writer's name not signed by its key.
    pub forged_writer_rows: u64,
    /// Rows not read because the relay resumed from its snapshot.
    pub rows_resumed: u64,
    /// Rows of owner-command results the relay sent to the store (plan 0090).
    pub command_rows_sent: u64,
}

impl RelaySummary {
    /// Parses the JSON line.
    pub fn parse(line: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(line).ok()?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(RelaySummary {
            relay: s("relay")?,
            cursor: s("cursor")?,
            board_hash: s("board_hash")?,
            tasks_hash: s("tasks_hash")?,
            turns_started: n("turns_started")?,
            turns_replied: n("turns_replied")?,
            turns_failed: n("turns_failed")?,
            turns_not_started: n("turns_not_started")?,
            fenced_refusals: n("fenced_refusals")?,
            skipped_rows: n("skipped_rows")?,
            rows_read: n("rows_read").unwrap_or(0),
            writes_retried: n("writes_retried").unwrap_or(0),
            results_lost: n("results_lost").unwrap_or(0),
            unsigned_commands: n("unsigned_commands")?,
            unauthorized_rows: n("unauthorized_rows")?,
            misbound_rows: n("misbound_rows")?,
            ignored_config_rows: n("ignored_config_rows")?,
            unsigned_rows: n("unsigned_rows")?,
            forged_writer_rows: n("forged_writer_rows")?,
            rows_resumed: n("rows_resumed").unwrap_or(0),
            command_rows_sent: n("command_rows_sent")?,
        })
    }
}

/// One running `huddle relay` process.
pub struct RelayProcess {
    /// Relay id.
    pub id: String,
    /// The agents it hosts.
    pub agents: Vec<String>,
    child: Child,
    stdout: mpsc::Receiver<String>,
    log: PathBuf,
    paused: bool,
    exited: bool,
}

/// `kill -s SIGNAL pid` through the shell's built-in `kill` (no procps needed).
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("sh")
        .args(["-c", "kill -s \"$0\" \"$1\"", signal, &pid.to_string()])
        .status()
        .expect("run sh -c kill");
    assert!(status.success(), "kill -s {signal} {pid} failed");
}

impl RelayProcess {
    /// Starts `huddle relay --config <config>` with stderr going to `log`, at the log
    /// level `HUDDLE_E2E_LOG` names (default `warn`).
    pub fn spawn(id: &str, agents: Vec<String>, database: &str, config: &Path, log: &Path) -> Self {
        let filter = std::env::var("HUDDLE_E2E_LOG").unwrap_or_else(|_| "warn".into());
        Self::spawn_logging(id, agents, database, config, log, &filter)
    }

    /// [`RelayProcess::spawn`] with the log filter `filter`.
    pub fn spawn_logging(
        id: &str,
        agents: Vec<String>,
        database: &str,
        config: &Path,
        log: &Path,
        filter: &str,
    ) -> Self {
        Self::spawn_with_args(id, agents, database, config, log, filter, &[])
    }

    /// [`RelayProcess::spawn_logging`] with more `huddle relay` flags (e.g.
    /// `--metrics 127.0.0.1:0`).
    pub fn spawn_with_args(
        id: &str,
        agents: Vec<String>,
        database: &str,
        config: &Path,
        log: &Path,
        filter: &str,
        flags: &[&str],
    ) -> Self {
        let log_file = std::fs::File::create(log).expect("create the relay log");
        let mut child = Command::new(huddle_bin())
            .args(["relay", "--config"])
            .arg(config)
            .args(flags)
            .env("HUDDLE_DB", database)
            .env("HUDDLE_LOG", filter)
            .env("HUDDLE_POLL_MS", "200")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("spawn huddle relay");
        let out = child.stdout.take().expect("relay stdout");
        let (tx, stdout) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        RelayProcess {
            id: id.into(),
            agents,
            child,
            stdout,
            log: log.to_path_buf(),
            paused: false,
            exited: false,
        }
    }

    /// Waits up to `limit` for a line of the relay's standard output satisfying
    /// `pred` (lines before it are dropped); panics with the log otherwise.
    pub fn expect_stdout_line(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => continue,
                Err(_) => panic!(
                    "relay {}: no {what} within {limit:?}\n{}",
                    self.id,
                    self.log_tail(40)
                ),
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (at most `limit`) for a relay expected to stop on its own, e.g. one that
    /// refuses to start; returns its exit status. Panics when it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the relay") {
                self.exited = true;
                return status;
            }
            assert!(Instant::now() < deadline, "relay {} kept running", self.id);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running (a paused process is running).
    pub fn is_running(&mut self) -> bool {
        !self.exited && matches!(self.child.try_wait(), Ok(None))
    }

    /// Freezes the process (SIGSTOP): it holds its claims but renews none.
    pub fn pause(&mut self) {
        send_signal(self.pid(), "STOP");
        self.paused = true;
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&mut self) {
        send_signal(self.pid(), "CONT");
        self.paused = false;
    }

    /// Kills the process outright (SIGKILL): no summary, no clean-up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.exited = true;
    }

    /// Sends SIGTERM (waking a paused process first) without waiting.
    pub fn request_stop(&mut self) {
        if self.paused {
            self.resume();
        }
        send_signal(self.pid(), "TERM");
    }

    /// Waits for the process to exit after [`RelayProcess::request_stop`] and returns
    /// its summary. Panics, with the log, if it does not exit in time or prints none.
    pub fn wait_summary(&mut self, limit: Duration) -> RelaySummary {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(ms(20)),
                Ok(None) => {
                    let _ = self.child.kill();
                    panic!(
                        "relay {} did not stop within {limit:?} of SIGTERM\n{}",
                        self.id,
                        self.log_tail(40)
                    );
                }
                Err(e) => panic!("waiting for relay {}: {e}", self.id),
            }
        };
        self.exited = true;
        let mut last = None;
        // The reader thread ends at EOF; give it a moment to deliver the last lines.
        while let Ok(line) = self.stdout.recv_timeout(secs(5)) {
            if let Some(s) = RelaySummary::parse(&line) {
                last = Some(s);
            }
        }
        assert!(
            status.success(),
            "relay {} exited with {status}\n{}",
            self.id,
            self.log_tail(40)
        );
        last.unwrap_or_else(|| {
            panic!(
                "relay {} printed no summary\n{}",
                self.id,
                self.log_tail(40)
            )
        })
    }

    /// SIGTERM, then the summary.
    pub fn terminate(&mut self) -> RelaySummary {
        self.request_stop();
        self.wait_summary(secs(30))
    }

    /// The last `n` lines of the relay's log (its stderr).
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        format!(
            "--- log of relay {} ({}) ---\n{}",
            self.id,
            self.log.display(),
            lines[from..].join("\n")
        )
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------
// The ledger as the test sees it
// ---------------------------------------------------------------------------------

/// The ledger read forward by the test: every row, the config fold, and the report
/// fold of the test's room ([`Tally`], which this dereferences to, so `l.dag`,
/// `l.board`, `l.room`, `l.completions` and `l.claims` are the tally's).
pub struct Ledger {
    /// Every row read so far, in ledger order.
    pub rows: Vec<Interaction>,
    /// The owner's authority: owners, keys, verified commands, and the config fold.
    pub config: OwnerAuthority,
    /// The report fold of the room, as `huddle demo` judges a run.
    pub fold: Tally,
    cursor: Position,
}

/// One `task.completed` row and whether the fold accepted it.
pub type Completion = huddle_sim::Completion;

/// One accepted `task.claimed` row.
pub type ClaimRow = huddle_sim::Claim;

impl std::ops::Deref for Ledger {
    type Target = Tally;

    fn deref(&self) -> &Tally {
        &self.fold
    }
}

impl Ledger {
    fn new(room: &str) -> Self {
        Ledger {
            rows: Vec::new(),
            config: OwnerAuthority::new(),
            fold: Tally::new(room),
            cursor: Position::START,
        }
    }

    /// Reads forward to the end of what is committed.
    pub async fn refresh(&mut self, store: &dyn Store) {
        self.try_refresh(store)
            .await
            .expect("read the ledger forward");
    }

    /// [`Ledger::refresh`] that hands back a store error (a database being restarted)
    /// instead of panicking; what was read before the error is kept.
    pub async fn try_refresh(&mut self, store: &dyn Store) -> Result<(), huddle_store::StoreError> {
        loop {
            let batch = store.read_forward(self.cursor, 1000).await?;
            assert!(
                batch.skipped.is_empty(),
                "the ledger holds rows a reader refuses: {:?}",
                batch.skipped
            );
            if batch.next == self.cursor {
                return Ok(());
            }
            self.cursor = batch.next;
            for r in batch.rows {
                // As the relays do: a task.created / config.set that no signed owner
                // command produced is kept from the other folds.
                self.config.apply(&r);
                if self.config.admits(&r) {
                    self.fold.apply(&r);
                }
                self.rows.push(r);
            }
        }
    }

    /// Rows of the test's room.
    pub fn room_rows(&self) -> impl Iterator<Item = (usize, &Interaction)> {
        self.rows
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.room == self.room)
    }

    /// Rows of a verb in the test's room.
    pub fn of_verb(&self, verb: Verb) -> impl Iterator<Item = (usize, &Interaction)> {
        self.room_rows().filter(move |(_, r)| r.verb == verb)
    }

    /// The task summary of the room.
    pub fn summary(&self) -> TaskSummary {
        self.dag.summary(&self.room)
    }

    /// The row with this id.
    pub fn get(&self, id: InteractionId) -> Option<&Interaction> {
        self.rows.iter().find(|r| r.id == id)
    }

    /// Agent replies (`message.posted` by an agent) to a message.
    pub fn replies_to(&self, message: InteractionId) -> Vec<&Interaction> {
        self.of_verb(Verb::MessagePosted)
            .map(|(_, r)| r)
            .filter(|r| r.role == Role::Agent && r.parent == Some(message))
            .collect()
    }

    /// `turn.replied` rows whose subject is the message.
    pub fn turns_replied_to(&self, message: InteractionId) -> Vec<&Interaction> {
        let hex = message.to_hex();
        self.of_verb(Verb::TurnReplied)
            .map(|(_, r)| r)
            .filter(|r| {
                serde_json::from_value::<TurnRepliedBody>(r.body.clone())
                    .is_ok_and(|b| b.subject.kind == SubjectKind::Message && b.subject.id == hex)
            })
            .collect()
    }

    /// Rows of `verb` about a subject (`turn.*` bodies carry one).
    pub fn about(&self, verb: Verb, subject: &Subject) -> Vec<&Interaction> {
        self.of_verb(verb)
            .map(|(_, r)| r)
            .filter(|r| {
                r.body.get("subject").is_some_and(|s| {
                    s.get("kind").and_then(Value::as_str) == Some(subject.kind.as_str())
                        && s.get("id").and_then(Value::as_str) == Some(subject.id.as_str())
                })
            })
            .collect()
    }

    /// Designation notes (`coord.note`, kind designation) for a message, in ledger
    /// order: `(row, agent, epoch)`.
    pub fn designations(&self, message: InteractionId) -> Vec<(&Interaction, String, i64)> {
        self.of_verb(Verb::CoordNote)
            .map(|(_, r)| r)
            .filter_map(|r| match CoordNoteBody::parse(&r.body) {
                Some(CoordNoteBody::Designation(d)) if d.message == message => {
                    Some((r, d.agent, d.epoch.get()))
                }
                _ => None,
            })
            .collect()
    }

    /// A task of the room.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.dag.task(&self.room, id)
    }

    /// The system's reply to a command message, if any.
    pub fn system_reply(&self, command: InteractionId) -> Option<&Interaction> {
        self.of_verb(Verb::MessagePosted)
            .map(|(_, r)| r)
            .find(|r| r.role == Role::System && r.parent == Some(command))
    }

    /// Every `task.completed` of the room, with whether the fold accepted it.
    pub fn completions(&self) -> Vec<Completion> {
        self.fold.completions.clone()
    }

    /// Every `task.claimed` of the room that the fold accepted.
    pub fn claims(&self) -> Vec<ClaimRow> {
        self.fold.claims.clone()
    }

    /// Asserts every task of the room was completed exactly once, by an accepted
    /// completion, that no completion in the ledger was refused by the fold, and that
    /// each task completed only after all its dependencies. Returns task -> completion.
    pub fn assert_all_done_exactly_once(&self, expected: usize) -> BTreeMap<String, Completion> {
        let s = self.summary();
        assert_eq!(s.total, expected, "tasks created: {s:?}");
        assert_eq!(s.done, expected, "not every task is done: {s:?}");
        let mut done: BTreeMap<String, Completion> = BTreeMap::new();
        for c in self.completions() {
            assert!(
                c.accepted,
                "a task.completed the fold refuses reached the ledger: {c:?}"
            );
            if let Some(first) = done.insert(c.task.clone(), c.clone()) {
                panic!("task {} completed twice: {first:?} and {c:?}", c.task);
            }
        }
        assert_eq!(done.len(), expected, "completions: {}", done.len());
        // No interaction is read twice: a hand-off's rows are never written again
        // beside the lot that carries them (plan 0080).
        let mut read: BTreeMap<huddle_core::InteractionId, usize> = BTreeMap::new();
        for (_, r) in self.room_rows() {
            *read.entry(r.id).or_default() += 1;
        }
        let twice: Vec<String> = read
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| format!("{} x{n}", id.short()))
            .collect();
        assert!(
            twice.is_empty(),
            "interactions read more than once: {twice:?}"
        );
        let tasks = &self.dag.room(&self.room).expect("room has tasks").tasks;
        for (id, t) in tasks {
            let mine = &done[id];
            for d in &t.deps {
                let dep = &done[d];
                assert!(
                    dep.index < mine.index,
                    "{id} completed (row {}) before its dependency {d} (row {})",
                    mine.index,
                    dep.index
                );
            }
        }
        done
    }

    /// Who completed each task.
    pub fn owners(&self) -> BTreeMap<String, String> {
        self.completions()
            .into_iter()
            .filter(|c| c.accepted)
            .map(|c| (c.task, c.actor))
            .collect()
    }

    /// The board's hash and the task DAG's hash over the room's rows, as a relay
    /// hosting only this room computes them.
    pub fn hashes(&self) -> (String, String) {
        let h = self.fold.state_hashes();
        (h.board, h.tasks)
    }

    /// The board's and task DAG's hashes over the room's rows at or before `cursor`:
    /// what a relay whose reads ended at `cursor` must have folded.
    pub fn hashes_upto(&self, cursor: Position) -> (String, String) {
        let mut fold = Tally::new(&self.room);
        let mut authority = OwnerAuthority::new();
        for (_, r) in self.room_rows() {
            if r.position > cursor {
                break;
            }
            authority.apply(r);
            if authority.admits(r) {
                fold.apply(r);
            }
        }
        let h = fold.state_hashes();
        (h.board, h.tasks)
    }

    /// Whether nothing is in flight in the room: every task settled and no turn open.
    pub fn quiescent(&self) -> bool {
        self.dag.is_settled(&self.room)
            && self
                .board
                .room(&self.room)
                .is_none_or(|b| b.open_turns().is_empty())
    }

    /// A short description for failure messages.
    pub fn describe(&self) -> String {
        let mut verbs: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, r) in self.room_rows() {
            *verbs.entry(r.verb.as_str()).or_default() += 1;
        }
        let open = self
            .board
            .room(&self.room)
            .map(|b| b.open_turns().len())
            .unwrap_or(0);
        format!(
            "{} rows; verbs {verbs:?}; tasks {:?}; open turns {open}",
            self.rows.len(),
            self.summary()
        )
    }
}

// ---------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------

/// Serializes the tests of one binary: relays are timing-sensitive (claim leases,
/// responder windows) and a 2-core CI machine should run one world at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One test's world: database, room, relays, and the test's view of the ledger.
pub struct Huddle {
    /// The database.
    pub db: TestDatabase,
    /// The test's own store handle.
    pub store: Arc<dyn Store>,
    /// The room.
    pub room: String,
    /// Its owner.
    pub owner: String,
    /// The ledger as read so far.
    pub ledger: Ledger,
    relays: BTreeMap<String, RelayProcess>,
    dir: tempfile::TempDir,
    started: Instant,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Huddle {
    /// A fresh database on `backend` with room `lobby` owned by `olga`, created with
    /// the CLI.
    pub async fn new(backend: Backend) -> Huddle {
        let turn = ONE_AT_A_TIME.lock().await;
        let db = TestDatabase::new(backend).await;
        let store = huddle_store::open(
            &db.url,
            StoreOptions {
                relay: "e2e".into(),
                poll_interval: ms(100),
                ..Default::default()
            },
        )
        .await
        .expect("open the test database");
        let room = "lobby".to_string();
        let owner = "olga".to_string();
        let out = super::ok({
            let mut c = super::huddle(&db.url);
            c.args(["room", "create", &room, "--owner", &owner]);
            c
        });
        assert!(out.contains("created room"), "{out}");
        let mut h = Huddle {
            ledger: Ledger::new(&room),
            db,
            store,
            room,
            owner,
            relays: BTreeMap::new(),
            dir: {
                let mut dir = tempfile::Builder::new()
                    .prefix("huddle-e2e-")
                    .tempdir()
                    .expect("tempdir");
                // HUDDLE_E2E_KEEP=1 keeps configs, scripts and relay logs for a look.
                dir.disable_cleanup(std::env::var_os("HUDDLE_E2E_KEEP").is_some());
                dir
            },
            started: Instant::now(),
            _turn: turn,
        };
        h.refresh().await;
        h
    }

    /// The temporary directory of this world (configs, logs, scripts).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes an executable shell script and returns its path.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write a script");
        path
    }

    /// Starts relay `id` hosting `agents` in the room.
    pub fn spawn_relay(&mut self, id: &str, agents: Vec<AgentSpec>) {
        let url = self.db.url.clone();
        self.spawn_relay_full(id, agents, &url, None, "");
    }

    /// [`Huddle::spawn_relay`] with more top-level `huddle.toml` lines (e.g.
    /// `sign = true`).
    pub fn spawn_relay_with(&mut self, id: &str, agents: Vec<AgentSpec>, toml: &str) {
        let url = self.db.url.clone();
        self.spawn_relay_full(id, agents, &url, None, toml);
    }

    /// Starts relay `id` hosting `agents` in the room, connecting to `database` (e.g.
    /// the test database through a fault-injecting proxy).
    pub fn spawn_relay_on(&mut self, id: &str, agents: Vec<AgentSpec>, database: &str) {
        self.spawn_relay_full(id, agents, database, None, "");
    }

    /// [`Huddle::spawn_relay`] with its own log filter (e.g. `info`) instead of
    /// `HUDDLE_E2E_LOG`'s.
    pub fn spawn_relay_logging(&mut self, id: &str, agents: Vec<AgentSpec>, filter: Option<&str>) {
        let url = self.db.url.clone();
        self.spawn_relay_full(id, agents, &url, filter, "");
    }

    /// [`Huddle::spawn_relay`] with more `huddle relay` flags (e.g. `--metrics
    /// 127.0.0.1:0`).
    pub fn spawn_relay_flags(&mut self, id: &str, agents: Vec<AgentSpec>, flags: &[&str]) {
        let url = self.db.url.clone();
        self.spawn_relay_inner(id, agents, &url, None, "", flags);
    }

    /// [`Huddle::spawn_relay`] on `database`, with its own log filter and more
    /// top-level `huddle.toml` lines.
    pub fn spawn_relay_full(
        &mut self,
        id: &str,
        agents: Vec<AgentSpec>,
        database: &str,
        filter: Option<&str>,
        toml: &str,
    ) {
        self.spawn_relay_inner(id, agents, database, filter, toml, &[]);
    }

    fn spawn_relay_inner(
        &mut self,
        id: &str,
        agents: Vec<AgentSpec>,
        database: &str,
        filter: Option<&str>,
        toml: &str,
        flags: &[&str],
    ) {
        assert!(
            !self.relays.get_mut(id).is_some_and(|r| r.is_running()),
            "relay {id} is already running"
        );
        let config = self.dir.path().join(format!("{id}.toml"));
        let text = format!(
            "{toml}\n{}",
            relay_toml(id, database, &[&self.room], &agents)
        );
        std::fs::write(&config, text).expect("write the relay config");
        let n = self.relays.keys().filter(|k| k.starts_with(id)).count();
        let log = self.dir.path().join(format!("{id}.{n}.log"));
        let keys = agents.iter().map(|a| a.key.clone()).collect();
        let filter = filter
            .map(str::to_string)
            .unwrap_or_else(|| std::env::var("HUDDLE_E2E_LOG").unwrap_or_else(|_| "warn".into()));
        let p = RelayProcess::spawn_with_args(id, keys, database, &config, &log, &filter, flags);
        self.relays.insert(id.to_string(), p);
    }

    /// A running (or paused) relay.
    pub fn relay(&mut self, id: &str) -> &mut RelayProcess {
        self.relays
            .get_mut(id)
            .unwrap_or_else(|| panic!("no relay {id}"))
    }

    /// The relay hosting `agent`.
    pub fn relay_of(&self, agent: &str) -> &str {
        self.relays
            .values()
            .find(|r| r.agents.iter().any(|a| a == agent))
            .map(|r| r.id.as_str())
            .unwrap_or_else(|| panic!("no relay hosts {agent}"))
    }

    /// Reads the ledger forward.
    pub async fn refresh(&mut self) {
        self.ledger.refresh(&*self.store).await;
    }

    /// The database clock.
    pub async fn db_now(&self) -> Timestamp {
        self.store.now().await.expect("database time")
    }

    /// Waits until `check` (which must not need the database) is true; panics after
    /// `limit` with `what` and the relays' logs.
    pub async fn wait_local(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + limit;
        while !check() {
            if Instant::now() >= deadline {
                let logs: Vec<String> = self.relays.values().map(|r| r.log_tail(15)).collect();
                panic!(
                    "timed out after {limit:?} waiting for {what}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(ms(20)).await;
        }
    }

    /// Waits until `check` returns `Some`, reading the ledger forward between tries.
    /// Panics after `limit` with `what`, the ledger state and the relays' logs; also
    /// panics as soon as a relay that should run has exited.
    pub async fn wait_for<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Ledger) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            self.refresh().await;
            if let Some(v) = check(&self.ledger) {
                return v;
            }
            for r in self.relays.values_mut() {
                if !r.exited && !r.is_running() {
                    panic!(
                        "while waiting for {what}: relay {} exited unexpectedly\n{}",
                        r.id,
                        r.log_tail(40)
                    );
                }
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self.relays.values().map(|r| r.log_tail(15)).collect();
                let now = self.store.now().await.ok();
                let claims: Vec<String> = self
                    .store
                    .list_claims("")
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| {
                        format!(
                            "  {} held by {} at epoch {}, expires in {} ms",
                            c.state.key,
                            c.state.holder,
                            c.state.epoch,
                            now.map_or("?".to_string(), |now| {
                                ((c.state.expires_at - now) / 1000).to_string()
                            })
                        )
                    })
                    .collect();
                panic!(
                    "timed out after {limit:?} waiting for {what}\nledger: {}\nclaims:\n{}\n{}",
                    self.ledger.describe(),
                    claims.join("\n"),
                    logs.join("\n")
                );
            }
            tokio::time::sleep(ms(20)).await;
        }
    }

    /// [`Huddle::wait_for`] with a boolean condition.
    pub async fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&Ledger) -> bool,
    ) {
        self.wait_for(what, limit, |l| cond(l).then_some(())).await
    }

    /// Waits until every agent in `agents` has registered in the room.
    pub async fn wait_registered(&mut self, agents: &[&str]) {
        let room = self.room.clone();
        self.wait_until("agents to register", secs(30), |l| {
            l.board
                .room(&room)
                .is_some_and(|b| agents.iter().all(|a| b.agents.contains_key(*a)))
        })
        .await;
    }

    /// Appends a message through the store and returns its id.
    pub async fn post(&self, actor: &str, role: Role, text: &str) -> InteractionId {
        let row = NewInteraction::new(
            self.room.as_str(),
            Verb::MessagePosted,
            actor,
            role,
            json!({ "text": text }),
        );
        let out = self.store.append(vec![row]).await.expect("post a message");
        out[0].id
    }

    /// Appends several messages in one batch and returns their ids.
    pub async fn post_many(&self, rows: &[(&str, Role, String)]) -> Vec<InteractionId> {
        let batch = rows
            .iter()
            .map(|(actor, role, text)| {
                NewInteraction::new(
                    self.room.as_str(),
                    Verb::MessagePosted,
                    *actor,
                    *role,
                    json!({ "text": text }),
                )
            })
            .collect();
        let out = self.store.append(batch).await.expect("post messages");
        out.iter().map(|a| a.id).collect()
    }

    /// The owner posts `text` with the CLI (signed with the owner's key), without
    /// waiting for anything; returns the message's id.
    pub fn owner_posts(&self, text: &str) -> InteractionId {
        let id = super::ok({
            let mut c = super::huddle(&self.db.url);
            c.args(["post", "--room", &self.room, "--as", &self.owner, text]);
            c
        });
        id.trim().parse().expect("post prints the id")
    }

    /// Posts `text` as the owner with the CLI and waits for the relays' reply to it.
    pub async fn owner_says(&mut self, text: &str) -> String {
        let id = self.owner_posts(text);
        let what = format!("the reply to the owner's {:?}", first_line(text));
        self.wait_for(&what, secs(30), |l| {
            l.system_reply(id).map(|r| {
                r.body
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .await
    }

    /// `!config <args>`, asserting it was accepted.
    pub async fn config(&mut self, args: &str) -> String {
        let reply = self.owner_says(&format!("!config {args}")).await;
        assert!(
            !reply.contains("rejected"),
            "!config {args} was rejected: {reply}"
        );
        reply
    }

    /// A `!delegate` command, asserting it was accepted.
    pub async fn delegate(&mut self, text: &str) -> String {
        let text = if text.starts_with("!delegate") {
            text.to_string()
        } else {
            format!("!delegate\n{text}")
        };
        let reply = self.owner_says(&text).await;
        assert!(reply.starts_with("Created"), "!delegate refused: {reply}");
        reply
    }

    /// Waits until nothing is in flight in the room (every task settled, no open turn).
    pub async fn wait_quiescent(&mut self, limit: Duration) {
        self.wait_until("the room to become quiescent", limit, Ledger::quiescent)
            .await;
    }

    /// Stops every running relay with SIGTERM (all at once) and returns their
    /// summaries, after asserting what every run must end with: every relay folded
    /// the ledger to the same cursor and the same board and task state, and that
    /// state is the one the test folds from the ledger itself. Call it when the room
    /// is quiescent, so no relay writes while the others stop.
    pub async fn stop_all(&mut self) -> Vec<RelaySummary> {
        let summaries = self.stop_all_unchecked().await;
        self.assert_converged(&summaries);
        summaries
    }

    /// [`Huddle::stop_all`] without the convergence assertions, for tests that check
    /// the summaries themselves.
    pub async fn stop_all_unchecked(&mut self) -> Vec<RelaySummary> {
        let ids: Vec<String> = self
            .relays
            .iter_mut()
            .filter_map(|(id, r)| r.is_running().then(|| id.clone()))
            .collect();
        for id in &ids {
            self.relay(id).request_stop();
        }
        let summaries: Vec<RelaySummary> = ids
            .iter()
            .map(|id| self.relay(id).wait_summary(secs(30)))
            .collect();
        self.refresh().await;
        summaries
    }

    /// Asserts that every relay folded exactly what it read: its hashes equal the test's
    /// own fold of the ledger up to the relay's final cursor. Relays that stop together
    /// may end at different cursors when one writes during its shutdown (a cancelled
    /// turn's failure) after another's final read; each must still agree with the
    /// ledger's prefix. The relay that read furthest must agree with the whole ledger.
    pub fn assert_converged(&self, summaries: &[RelaySummary]) {
        let Some(first) = summaries
            .iter()
            .max_by_key(|s| s.cursor.parse::<Position>().unwrap_or(Position::START))
        else {
            return;
        };
        for s in summaries {
            let cursor: Position = s.cursor.parse().expect("a relay's cursor");
            assert_eq!(
                (s.board_hash.clone(), s.tasks_hash.clone()),
                self.ledger.hashes_upto(cursor),
                "relay {} folded a different state than the ledger up to its cursor {cursor}:\n{summaries:#?}",
                s.relay
            );
            assert_eq!(s.skipped_rows, 0, "{s:?}");
        }
        let (board, tasks) = self.ledger.hashes();
        assert_eq!(
            (&first.board_hash, &first.tasks_hash),
            (&board, &tasks),
            "the relays' state differs from the test's own fold of the ledger"
        );
    }

    /// Time since the world was made.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// Forges `agent`'s claim of `task` and its completion with the result `FORGED`
/// through `forger`, under the task claim the forger really acquires (so the
/// database's fences let the rows in), then releases the claim. Returns the epoch of
/// the forged rows and how many rows were written (2).
pub async fn forge_claim_and_completion(
    forger: &dyn Store,
    room: &str,
    task: &str,
    agent: &str,
) -> (huddle_core::ClaimEpoch, u64) {
    let key = huddle_core::protocol::task_key(room, task);
    let epoch = match forger
        .acquire(&key, agent, secs(60))
        .await
        .expect("acquire")
    {
        huddle_store::Acquired::Won(c) => c.epoch,
        other => panic!("the forger could not take {agent}'s task claim: {other:?}"),
    };
    let fence = huddle_store::Fence {
        key: key.clone(),
        holder: agent.into(),
        epoch,
    };
    let row = |verb, body| NewInteraction::new(room, verb, agent, Role::Agent, body);
    let forged = [
        row(
            Verb::TaskClaimed,
            json!({"task": task, "epoch": epoch, "attempt": 1}),
        ),
        row(
            Verb::TaskCompleted,
            json!({"task": task, "epoch": epoch, "result": "FORGED"}),
        ),
    ];
    let written = forged.len() as u64;
    for row in forged {
        let out = forger
            .append_fenced(&fence, vec![row])
            .await
            .expect("the database takes the forged row");
        assert!(out[0].inserted);
    }
    assert!(forger.release(&key, agent, epoch).await.expect("release"));
    (epoch, written)
}

/// The subject of a message, for [`Ledger::about`].
pub fn message_subject(id: InteractionId) -> Subject {
    Subject::message(id)
}
