//! `huddle bench tasks`: end-to-end task hand-out throughput, beside a plain-SQL job
//! queue doing the same hand-out on the same database in the same run.
//!
//! - **huddle**: `--relays` real `huddle relay` processes host `--agents` simulated
//!   agents (round-robin) whose turns take `--turn-ms`. The owner delegates `--tasks`
//!   tasks (independent, or `--shape lanes`: `--lanes` chains, each task after the
//!   previous one of its chain) in `!delegate` messages of 1,000, and the bench folds
//!   the room until every task is done.
//! - **baseline**: `--agents` workers, each on its own connection, take jobs from a
//!   plain table (`UPDATE .. WHERE id = (SELECT .. FOR UPDATE SKIP LOCKED)` on
//!   Postgres, the same in `BEGIN IMMEDIATE` on SQLite), sleep the same turn, then
//!   insert a completion row and mark the job (and release its dependents) in one
//!   statement. No ledger, no board, no fencing, no NOTIFY; an idle worker polls every
//!   millisecond.
//!
//! Reported per side: tasks per second (huddle: from the first `!delegate` to the
//! last completion, database clock), executions per task (huddle: turns the relays
//! started; must be 1.00), pickup latency (from an agent's or worker's turn ending to
//! its next turn starting, both sides: the relays measure it and report it in their
//! summaries, in buckets, so huddle's percentiles are a bucket's upper bound; plan
//! 0083), CPU per task of the clients
//! (the relay processes, or the bench process running the workers) and of the
//! database server (Postgres on this machine: the postmaster and its children; on
//! SQLite the database is inside the clients), and the relays' peak resident memory.
//!
//! Everything runs in a scratch database beside the one given (a new Postgres
//! database on the same server, or a new SQLite file in the same directory), dropped
//! at the end: the bench leaves nothing a relay would read.
//!
//! `--rounds N` runs every task count N times, each round in a scratch database of its
//! own, the side that runs first alternating (round 1 the queue, round 2 huddle, ...),
//! and reports the smallest, median and largest ratio of the rounds (plan 0073): on a
//! shared machine one pair of runs drifts as much as the changes being measured.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use huddle_core::signing::OwnerSecret;
use huddle_core::{NewInteraction, Position, Role, Verb};
use huddle_sim::{Tally, WorkTask, Workload};
use huddle_store::{Ledger, Store, StoreOptions, Subscription};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::scratch::{unique_tag, ScratchDatabase, ScratchDir};

/// The DAG a run delegates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Independent tasks: all ready at once.
    Independent,
    /// `--lanes` chains: task i depends on task i - lanes.
    Lanes,
}

/// Flags of `huddle bench tasks`.
#[derive(Args, Debug, Clone)]
pub struct TasksArgs {
    /// Task counts to run, comma-separated; each runs in a fresh room.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub tasks: Vec<usize>,
    /// Agents (huddle) and workers (baseline).
    #[arg(long, default_value_t = 16)]
    pub agents: usize,
    /// Relay processes (agents spread round-robin).
    #[arg(long, default_value_t = 3)]
    pub relays: usize,
    /// Length of one turn or job, milliseconds.
    #[arg(long, default_value_t = 1)]
    pub turn_ms: u64,
    /// The DAG: independent tasks or chains.
    #[arg(long, value_enum, default_value_t = Shape::Independent)]
    pub shape: Shape,
    /// Chains of `--shape lanes`.
    #[arg(long, default_value_t = 16)]
    pub lanes: usize,
    /// Give up on a side after this many seconds without progress.
    #[arg(long, default_value_t = 60)]
    pub stall_s: u64,
    /// Skip the plain-SQL baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// The owner sets `!config lease-ahead on` before delegating: a busy agent holds
    /// its next task while it works (plan 0084).
    #[arg(long)]
    pub lease_ahead: bool,
    /// With `--lease-ahead`: the owner also sets `!config lease-depth N`, how many
    /// tasks one agent may hold ahead (plan 0085; the room's default otherwise).
    #[arg(long, requires = "lease_ahead", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub lease_depth: Option<u32>,
    /// The owner sets `!config compact-turns on` before delegating: a task turn is
    /// written in two rows, its start and end carried by the task's rows (plan 0095).
    #[arg(long)]
    pub compact_turns: bool,
    /// Each relay keeps up to N batches of results and claims in flight at once
    /// (`batches_in_flight` in its configuration, plan 0087; default: the relays'
    /// own, 2 on Postgres and 1 on SQLite, plan 0091).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    pub batches_in_flight: Option<u32>,
    /// Run every task count this many times, each round in a fresh scratch database,
    /// the side that runs first alternating; the report gives the ratio's range.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// JSON report instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One side of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    /// Seconds from the first hand-out to the last completion.
    pub seconds: f64,
    /// Tasks (jobs) completed per second.
    pub per_s: f64,
    /// Executions per task: turns started by the relays, or jobs run by the workers.
    pub executions_per_task: f64,
    /// Pickup latency, median, milliseconds.
    pub pickup_p50_ms: f64,
    /// Pickup latency, 99th percentile, milliseconds.
    pub pickup_p99_ms: f64,
    /// CPU of the clients (relay processes, or the bench's workers) per task, ms.
    pub client_cpu_ms_per_task: f64,
    /// CPU of the database server per task, ms (`None` when it is not measurable
    /// here: SQLite runs inside the clients, or Postgres is on another machine).
    pub db_cpu_ms_per_task: Option<f64>,
    /// The largest peak resident memory of one relay process, MiB (huddle only).
    pub relay_peak_rss_mib: Option<f64>,
    /// Why the side stopped before every task was done, if it did.
    pub stopped_early: Option<String>,
}

impl Side {
    /// Every task done, each executed exactly once.
    pub fn clean(&self) -> bool {
        self.stopped_early.is_none() && (self.executions_per_task - 1.0).abs() < 1e-9
    }
}

/// One task count in one round.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// Tasks delegated.
    pub tasks: usize,
    /// The round, from 1.
    pub round: usize,
    /// huddle.
    pub huddle: Side,
    /// The plain-SQL job queue.
    pub baseline: Option<Side>,
    /// huddle tasks/s ÷ baseline jobs/s.
    pub ratio: Option<f64>,
}

/// The ratio of one task count over the rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Tasks delegated.
    pub tasks: usize,
    /// Rounds with a ratio.
    pub rounds: usize,
    /// The smallest ratio.
    pub ratio_min: f64,
    /// The median ratio (the mean of the middle two for an even count).
    pub ratio_median: f64,
    /// The largest ratio.
    pub ratio_max: f64,
}

/// Per task count, the range of the ratios of `lines` (counts without any left out).
pub fn spread(lines: &[Line]) -> Vec<Spread> {
    let mut by_n: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for l in lines {
        if let Some(r) = l.ratio {
            by_n.entry(l.tasks).or_default().push(r);
        }
    }
    by_n.into_iter()
        .filter_map(|(tasks, rs)| {
            let rounds = rs.len();
            let (ratio_min, ratio_median, ratio_max) = crate::bench_stats::min_median_max(rs)?;
            Some(Spread {
                tasks,
                rounds,
                ratio_min,
                ratio_median,
                ratio_max,
            })
        })
        .collect()
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct TasksReport {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// The DAG shape.
    pub shape: Shape,
    /// Chains, for `lanes`.
    pub lanes: usize,
    /// Agents / workers.
    pub agents: usize,
    /// Relay processes.
    pub relays: usize,
    /// Turn length, ms.
    pub turn_ms: u64,
    /// Whether the room ran with `lease-ahead on`.
    pub lease_ahead: bool,
    /// The `lease-depth` the owner set, if any.
    pub lease_depth: Option<u32>,
    /// Whether the room ran with `compact-turns on`.
    pub compact_turns: bool,
    /// Batches each relay kept in flight at most.
    pub batches_in_flight: u32,
    /// Rounds run.
    pub rounds: usize,
    /// One line per task count and round.
    pub lines: Vec<Line>,
    /// Per task count, the ratio's range over the rounds.
    pub spread: Vec<Spread>,
}

impl TasksReport {
    /// Whether every huddle run finished with exactly one execution per task.
    pub fn clean(&self) -> bool {
        self.lines.iter().all(|l| l.huddle.clean())
    }
}

/// The workload of one run.
fn workload(args: &TasksArgs, n: usize) -> Workload {
    let work = Duration::from_millis(args.turn_ms);
    let lanes = args.lanes.max(1);
    let tasks = (0..n)
        .map(|i| WorkTask {
            id: format!("t{i:06}"),
            label: format!("job {i}"),
            deps: match args.shape {
                Shape::Lanes if i >= lanes => vec![format!("t{:06}", i - lanes)],
                _ => Vec::new(),
            },
            work,
            tokens: 10,
            assignee: None,
        })
        .collect();
    Workload {
        kind: match args.shape {
            Shape::Independent => "independent",
            Shape::Lanes => "lanes",
        },
        tasks,
        one_task_per_command: false,
    }
}

// ---------------------------------------------------------------------------------
// CPU and memory from /proc
// ---------------------------------------------------------------------------------

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// `(ppid, utime + stime, cutime + cstime)` of a process, in clock ticks.
fn proc_stat(pid: u32) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((
        u32::try_from(num(1)?).ok()?,
        num(11)? + num(12)?,
        num(13)? + num(14)?,
    ))
}

/// CPU seconds used so far by the processes `pids`.
fn cpu_of(pids: &[u32]) -> f64 {
    let ticks: u64 = pids.iter().filter_map(|p| proc_stat(*p)).map(|s| s.1).sum();
    ticks as f64 / clock_ticks_per_s()
}

/// CPU seconds used so far by a Postgres server: the postmaster, its reaped
/// children, and its live children.
fn server_cpu(postmaster: u32) -> Option<f64> {
    let (_, own, reaped) = proc_stat(postmaster)?;
    let mut ticks = own + reaped;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, t, _)) = proc_stat(pid) {
            if ppid == postmaster {
                ticks += t;
            }
        }
    }
    Some(ticks as f64 / clock_ticks_per_s())
}

/// Peak resident memory of a process, MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The postmaster of the Postgres server behind `url`, when it runs on this machine.
async fn postmaster_of(url: &str) -> Option<u32> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    let driver = tokio::spawn(conn);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?
        .get(0);
    // Read while the session is open: once it closes, its backend exits and its
    // `/proc` entry goes with it (read after the close, this failed now and then and
    // the run reported no database CPU).
    let parent = proc_stat(u32::try_from(pid).ok()?).map(|(ppid, _, _)| ppid);
    drop(client);
    let _ = driver.await;
    parent
}

/// The database server's CPU seconds so far, if measurable.
fn db_cpu(postmaster: Option<u32>) -> Option<f64> {
    postmaster.and_then(server_cpu)
}

fn percentile_ms(sorted_us: &[i64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() - 1) as f64 * p).round() as usize;
    sorted_us[i.min(sorted_us.len() - 1)] as f64 / 1000.0
}

fn bar(len: u64, label: String) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {label:<28} [{{bar:30}}] {{pos}}/{{len}}  {{per_sec}}  {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

// ---------------------------------------------------------------------------------
// huddle: relay processes
// ---------------------------------------------------------------------------------

/// A `huddle relay` child process.
struct RelayChild {
    id: String,
    child: Child,
    summary: Arc<Mutex<Option<serde_json::Value>>>,
}

impl RelayChild {
    fn spawn(id: &str, config: &Path, log: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("the huddle binary's own path")?;
        let log = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(exe)
            .args(["relay", "--config"])
            .arg(config)
            .env(
                "HUDDLE_LOG",
                // Lost claims and refused writes are logged at `info`: what a run
                // that was not clean is read for.
                std::env::var("HUDDLE_BENCH_LOG").unwrap_or("warn,huddle_relay=info".into()),
            )
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start relay {id}"))?;
        let summary = Arc::new(Mutex::new(None));
        if let Some(out) = child.stdout.take() {
            let slot = summary.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                        if let Ok(mut s) = slot.lock() {
                            *s = Some(v);
                        }
                    }
                }
            });
        }
        Ok(RelayChild {
            id: id.to_string(),
            child,
            summary,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits (bounded) for the exit and its summary.
    fn stop(mut self) -> Option<serde_json::Value> {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: signalling our own child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    tracing::warn!(relay = %self.id, "relay did not stop within 30 s; killing it");
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
        // The reader thread sees end-of-file once the process is gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(v) = self.summary.lock().ok().and_then(|s| s.clone()) {
                return Some(v);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn relay_toml(id: &str, db: &str, room: &str, agents: &[String], args: &TasksArgs) -> String {
    let mut t = format!(
        "relay = {}\ndatabase = {}\nrooms = [{}]\n",
        toml_str(id),
        toml_str(db),
        toml_str(room),
    );
    if let Some(n) = args.batches_in_flight {
        t.push_str(&format!("batches_in_flight = {n}\n"));
    }
    let turn_ms = args.turn_ms;
    for a in agents {
        t.push_str(&format!(
            "\n[[agent]]\nkey = {}\ncapabilities = []\ndriver = \"sim\"\n\
             sim = {{ turn_ms = {turn_ms}, jitter = 0.0, failure_rate = 0.0, tokens = 10, seed = 1 }}\n",
            toml_str(a)
        ));
    }
    t
}

/// How often the bench's observer reads the room forward once it has caught up.
const OBSERVE_EVERY: Duration = Duration::from_millis(50);

/// Opens the bench's one store: the owner appends through it and the observer reads
/// through it. On Postgres it does not LISTEN, and the observer reads every
/// [`OBSERVE_EVERY`] (see [`follow`]): the bench adds no listener to the relays'
/// doorbells and no wake-up per commit to the machine it measures. Its appends still
/// ring the relays' doorbells.
async fn open_bench_store(db: &str) -> anyhow::Result<Arc<dyn Store>> {
    let options = StoreOptions {
        relay: "bench-owner".to_string(),
        poll_interval: OBSERVE_EVERY,
        ..Default::default()
    };
    Ok(match huddle_store::parse_url(db)? {
        huddle_store::Backend::Postgres(url) => {
            let pg = huddle_store::postgres::PgOptions {
                listen: false,
                ..Default::default()
            };
            Arc::new(huddle_store::postgres::PgStore::connect_with(&url, options, pg).await?)
        }
        huddle_store::Backend::Sqlite(_) => huddle_store::open(db, options).await?,
    })
}

/// Folds the room forward into `tally` until `done` or nothing moved for `stall`:
/// a read after each full page, otherwise every [`OBSERVE_EVERY`]. The figures come
/// from the rows' database times, not from when the observer read them.
async fn follow(
    sub: &mut Subscription,
    tally: &mut Tally,
    stall: Duration,
    bar: Option<&ProgressBar>,
    mut done: impl FnMut(&Tally) -> bool,
) -> anyhow::Result<Option<String>> {
    let mut last_move = tokio::time::Instant::now();
    loop {
        if done(tally) {
            return Ok(None);
        }
        if last_move.elapsed() >= stall {
            return Ok(Some(format!("nothing happened for {stall:?}")));
        }
        let batch = sub.poll_once().await?;
        // A relay's heartbeat is not progress: relays alive around a stuck room would
        // otherwise keep the bench waiting for ever.
        if batch.rows.iter().any(|r| r.verb != Verb::RelayHeartbeat) {
            last_move = tokio::time::Instant::now();
        }
        for r in &batch.rows {
            tally.apply(r);
        }
        if let Some(b) = bar {
            let s = tally.dag.summary(&tally.room);
            b.set_position(s.done as u64);
            b.set_message(format!("claimed {} ready {}", s.claimed, s.ready));
        }
        if batch.rows.len() < sub.page() && !done(tally) {
            tokio::time::sleep(OBSERVE_EVERY.min(stall)).await;
        }
    }
}

async fn run_huddle(
    args: &TasksArgs,
    db: &str,
    postmaster: Option<u32>,
    n: usize,
    quiet: bool,
) -> anyhow::Result<Side> {
    let room = format!("bench-tasks-{n}-{}", unique_tag());
    let mut dir = ScratchDir::create("huddle-bench-tasks")?;
    let owner = open_bench_store(db).await?;
    let ledger: Arc<dyn Ledger> = owner.clone();
    let mut sub = Subscription::new(ledger, Position::START, 5000);
    let mut tally = Tally::new(&room);

    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("randomness: {e}"))?;
    let key = OwnerSecret::from_seed(seed);
    owner
        .append(vec![NewInteraction::new(
            room.as_str(),
            Verb::RoomCreated,
            "bench-owner",
            Role::Owner,
            json!({ "owner": "bench-owner", "key": key.public().to_hex() }),
        )])
        .await?;

    let names = huddle_sim::agent_names(args.agents);
    let mut relays = Vec::new();
    for r in 0..args.relays.max(1) {
        let id = format!("bench-relay-{r}");
        let mine: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % args.relays.max(1) == r)
            .map(|(_, a)| a.clone())
            .collect();
        let config = PathBuf::from(dir.db(&format!("{id}.toml")));
        std::fs::write(&config, relay_toml(&id, db, &room, &mine, args))?;
        let log = PathBuf::from(dir.db(&format!("{id}.log")));
        relays.push(RelayChild::spawn(&id, &config, &log)?);
    }
    let result = drive(
        args, &owner, &key, &mut sub, &mut tally, &relays, postmaster, n, quiet,
    )
    .await;
    let peak = relays
        .iter()
        .filter_map(|r| peak_rss_mib(r.pid()))
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let mut turns = 0u64;
    let mut idle = huddle_relay::metrics::IdleGaps::default();
    for r in relays {
        let id = r.id.clone();
        match r.stop() {
            Some(s) => {
                turns += s["turns_started"].as_u64().unwrap_or(0);
                match serde_json::from_value::<huddle_relay::metrics::IdleGaps>(
                    s["agent_idle"].clone(),
                ) {
                    Ok(g) => idle.merge(&g),
                    Err(e) => {
                        tracing::warn!(relay = %id, error = %e, "no idle gaps in the relay's summary")
                    }
                }
            }
            None => tracing::warn!(relay = %id, "no summary from the relay"),
        }
    }
    let (mut side, delegate_at) = result?;
    side.relay_peak_rss_mib = peak;
    side.executions_per_task = turns as f64 / n.max(1) as f64;
    if let (Some(first), Some(last)) = (delegate_at, tally.last_done_at) {
        side.seconds = last.micros_since(first) as f64 / 1e6;
        side.per_s = n as f64 / side.seconds.max(1e-9);
    }
    // Pickup as the relays measured it (plan 0083): an agent's result and its next
    // claim often commit together, so the ledger cannot show the wait before them.
    let ms = |q: f64| {
        idle.quantile_us(q)
            .map_or(f64::NAN, |us| us as f64 / 1000.0)
    };
    side.pickup_p50_ms = ms(0.5);
    side.pickup_p99_ms = ms(0.99);
    if !side.clean() {
        // What the relays logged is what explains it: kept, and said where.
        tracing::warn!(
            dir = %dir.keep().display(),
            stopped_early = side.stopped_early.as_deref().unwrap_or("no"),
            executions_per_task = side.executions_per_task,
            "the huddle run was not clean: its relays' logs and configurations are kept"
        );
    }
    Ok(side)
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &TasksArgs,
    owner: &Arc<dyn Store>,
    key: &OwnerSecret,
    sub: &mut Subscription,
    tally: &mut Tally,
    relays: &[RelayChild],
    postmaster: Option<u32>,
    n: usize,
    quiet: bool,
) -> anyhow::Result<(Side, Option<huddle_core::Timestamp>)> {
    let stall = Duration::from_secs(args.stall_s.max(1));
    let agents = args.agents;
    if let Some(why) = follow(sub, tally, stall, None, |t| t.registered() >= agents).await? {
        anyhow::bail!("the relays did not register their agents: {why}");
    }
    let pids: Vec<u32> = relays.iter().map(RelayChild::pid).collect();
    let (cpu0, db0) = (cpu_of(&pids), db_cpu(postmaster));
    let room = tally.room.clone();
    let say = |text: String| {
        owner.append(vec![key.sign(NewInteraction::new(
            room.as_str(),
            Verb::MessagePosted,
            "bench-owner",
            Role::Owner,
            json!({ "text": text }),
        ))])
    };
    if args.lease_ahead {
        say("!config lease-ahead on".into()).await?;
    }
    if let Some(depth) = args.lease_depth {
        say(format!("!config lease-depth {depth}")).await?;
    }
    if args.compact_turns {
        say("!config compact-turns on".into()).await?;
    }
    let mut delegate_at = None;
    for text in workload(args, n).delegate_messages() {
        let appended = say(text).await?;
        if delegate_at.is_none() {
            if let Some(a) = appended.first() {
                delegate_at = owner.get(a.id).await?.map(|r| r.at);
            }
        }
    }
    let progress = (!quiet).then(|| bar(n as u64, format!("huddle, {n} tasks")));
    let stopped = follow(sub, tally, stall, progress.as_ref(), |t| {
        t.dag.summary(&t.room).done >= n
    })
    .await?;
    if let Some(b) = &progress {
        b.finish_and_clear();
    }
    let (cpu1, db1) = (cpu_of(&pids), db_cpu(postmaster));
    let per_task = |a: f64, b: f64| (b - a) * 1000.0 / n.max(1) as f64;
    Ok((
        Side {
            client_cpu_ms_per_task: per_task(cpu0, cpu1),
            db_cpu_ms_per_task: db0.zip(db1).map(|(a, b)| per_task(a, b)),
            stopped_early: stopped,
            ..Side::default()
        },
        delegate_at,
    ))
}

// ---------------------------------------------------------------------------------
// The plain-SQL job queue
// ---------------------------------------------------------------------------------

/// What the workers measured.
#[derive(Default)]
struct WorkerTally {
    executions: AtomicU64,
    done: AtomicUsize,
    pickups_us: Mutex<Vec<i64>>,
}

fn self_cpu() -> f64 {
    cpu_of(&[std::process::id()])
}

async fn run_baseline(
    args: &TasksArgs,
    db: &str,
    postmaster: Option<u32>,
    n: usize,
    quiet: bool,
) -> anyhow::Result<Side> {
    let tag = unique_tag();
    let (jobs, done) = (format!("bench_job_{tag}"), format!("bench_job_done_{tag}"));
    let lanes = match args.shape {
        Shape::Independent => None,
        Shape::Lanes => Some(args.lanes.max(1)),
    };
    let tally = Arc::new(WorkerTally::default());
    let progress = (!quiet).then(|| bar(n as u64, format!("plain SQL, {n} jobs")));
    let turn = Duration::from_millis(args.turn_ms);
    let stall = Duration::from_secs(args.stall_s.max(1));
    let (cpu0, db0) = (self_cpu(), db_cpu(postmaster));
    let started = Instant::now();
    let result = match huddle_store::parse_url(db)? {
        huddle_store::Backend::Postgres(url) => {
            pg_queue(
                &url,
                &jobs,
                &done,
                n,
                lanes,
                args.agents,
                turn,
                stall,
                &tally,
                progress.as_ref(),
            )
            .await
        }
        huddle_store::Backend::Sqlite(path) => {
            let (jobs, done, tally, progress) =
                (jobs.clone(), done.clone(), tally.clone(), progress.clone());
            let agents = args.agents;
            tokio::task::spawn_blocking(move || {
                sqlite_queue(
                    &path,
                    &jobs,
                    &done,
                    n,
                    lanes,
                    agents,
                    turn,
                    stall,
                    &tally,
                    progress.as_ref(),
                )
            })
            .await?
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let (cpu1, db1) = (self_cpu(), db_cpu(postmaster));
    if let Some(b) = &progress {
        b.finish_and_clear();
    }
    let stopped = result?;
    let per_task = |a: f64, b: f64| (b - a) * 1000.0 / n.max(1) as f64;
    let mut pickups = tally
        .pickups_us
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    pickups.sort_unstable();
    Ok(Side {
        seconds,
        per_s: tally.done.load(Ordering::Relaxed) as f64 / seconds.max(1e-9),
        executions_per_task: tally.executions.load(Ordering::Relaxed) as f64 / n.max(1) as f64,
        pickup_p50_ms: percentile_ms(&pickups, 0.5),
        pickup_p99_ms: percentile_ms(&pickups, 0.99),
        client_cpu_ms_per_task: per_task(cpu0, cpu1),
        db_cpu_ms_per_task: db0.zip(db1).map(|(a, b)| per_task(a, b)),
        relay_peak_rss_mib: None,
        stopped_early: stopped,
    })
}

/// The jobs: `(id, dep, ready)`.
fn jobs_of(n: usize, lanes: Option<usize>) -> Vec<(i64, Option<i64>, bool)> {
    (0..n as i64)
        .map(|i| match lanes {
            Some(l) if i >= l as i64 => (i, Some(i - l as i64), false),
            _ => (i, None, true),
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn pg_queue(
    url: &str,
    jobs: &str,
    done: &str,
    n: usize,
    lanes: Option<usize>,
    workers: usize,
    turn: Duration,
    stall: Duration,
    tally: &Arc<WorkerTally>,
    progress: Option<&ProgressBar>,
) -> anyhow::Result<Option<String>> {
    let (admin, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "CREATE TABLE {jobs} (id bigint PRIMARY KEY, dep bigint, state smallint NOT NULL);
             CREATE INDEX ON {jobs} (id) WHERE state = 1;
             CREATE INDEX ON {jobs} (dep);
             CREATE TABLE {done} (id bigint NOT NULL, worker int NOT NULL, at timestamptz NOT NULL DEFAULT now());"
        ))
        .await?;
    let all = jobs_of(n, lanes);
    for chunk in all.chunks(10_000) {
        let ids: Vec<i64> = chunk.iter().map(|j| j.0).collect();
        let deps: Vec<Option<i64>> = chunk.iter().map(|j| j.1).collect();
        let states: Vec<i16> = chunk.iter().map(|j| if j.2 { 1 } else { 0 }).collect();
        admin
            .execute(
                &format!(
                    "INSERT INTO {jobs} (id, dep, state) SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::smallint[])"
                ),
                &[&ids, &deps, &states],
            )
            .await?;
    }
    let fetch = format!(
        "UPDATE {jobs} SET state = 2 WHERE id = \
         (SELECT id FROM {jobs} WHERE state = 1 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
    );
    let complete = format!(
        "WITH d AS (INSERT INTO {done} (id, worker) VALUES ($1, $2)) \
         UPDATE {jobs} SET state = CASE WHEN id = $1 THEN 3 ELSE 1 END WHERE id = $1 OR dep = $1"
    );
    let mut handles = Vec::new();
    for w in 0..workers.max(1) {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let (fetch, complete, tally) = (fetch.clone(), complete.clone(), tally.clone());
        let progress = progress.cloned();
        handles.push(tokio::spawn(async move {
            let fetch = client.prepare(&fetch).await?;
            let complete = client.prepare(&complete).await?;
            let mut free_since = Instant::now();
            let mut last_work = Instant::now();
            let worker = i32::try_from(w).unwrap_or(i32::MAX);
            loop {
                if tally.done.load(Ordering::Relaxed) >= n {
                    return anyhow::Ok(None);
                }
                let row = client.query_opt(&fetch, &[]).await?;
                let Some(row) = row else {
                    if last_work.elapsed() >= stall {
                        return Ok(Some(format!("no job for {stall:?}")));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let id: i64 = row.get(0);
                let waited = free_since.elapsed().as_micros() as i64;
                if let Ok(mut p) = tally.pickups_us.lock() {
                    p.push(waited);
                }
                tally.executions.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(turn).await;
                free_since = Instant::now();
                last_work = free_since;
                client.execute(&complete, &[&id, &worker]).await?;
                tally.done.fetch_add(1, Ordering::Relaxed);
                if let Some(b) = &progress {
                    b.inc(1);
                }
            }
        }));
    }
    let mut stopped = None;
    for h in handles {
        if let Some(why) = h.await?? {
            stopped = Some(why);
        }
    }
    admin
        .batch_execute(&format!("DROP TABLE {jobs}; DROP TABLE {done};"))
        .await?;
    drop(admin);
    let _ = driver.await;
    Ok(stopped)
}

#[allow(clippy::too_many_arguments)]
fn sqlite_queue(
    path: &str,
    jobs: &str,
    done: &str,
    n: usize,
    lanes: Option<usize>,
    workers: usize,
    turn: Duration,
    stall: Duration,
    tally: &Arc<WorkerTally>,
    progress: Option<&ProgressBar>,
) -> anyhow::Result<Option<String>> {
    let open = || -> anyhow::Result<rusqlite::Connection> {
        let c = rusqlite::Connection::open(path)?;
        c.busy_timeout(Duration::from_secs(30))?;
        c.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(c)
    };
    let mut admin = open()?;
    admin.execute_batch(&format!(
        "CREATE TABLE {jobs} (id INTEGER PRIMARY KEY, dep INTEGER, state INTEGER NOT NULL);
         CREATE INDEX {jobs}_ready ON {jobs} (id) WHERE state = 1;
         CREATE INDEX {jobs}_dep ON {jobs} (dep);
         CREATE TABLE {done} (id INTEGER NOT NULL, worker INTEGER NOT NULL, at INTEGER NOT NULL);"
    ))?;
    {
        let tx = admin.transaction()?;
        {
            let mut stmt = tx.prepare(&format!(
                "INSERT INTO {jobs} (id, dep, state) VALUES (?1, ?2, ?3)"
            ))?;
            for (id, dep, ready) in jobs_of(n, lanes) {
                stmt.execute(rusqlite::params![id, dep, if ready { 1 } else { 0 }])?;
            }
        }
        tx.commit()?;
    }
    let fetch = format!(
        "UPDATE {jobs} SET state = 2 WHERE id = \
         (SELECT id FROM {jobs} WHERE state = 1 ORDER BY id LIMIT 1) RETURNING id"
    );
    let insert = format!(
        "INSERT INTO {done} (id, worker, at) VALUES (?1, ?2, CAST(unixepoch('subsec') * 1000000 AS INTEGER))"
    );
    let mark = format!(
        "UPDATE {jobs} SET state = CASE WHEN id = ?1 THEN 3 ELSE 1 END WHERE id = ?1 OR dep = ?1"
    );
    let stopped: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for w in 0..workers.max(1) {
            let (fetch, insert, mark, stopped) = (&fetch, &insert, &mark, &stopped);
            handles.push(s.spawn(move || -> anyhow::Result<()> {
                let mut conn = open()?;
                let mut free_since = Instant::now();
                let mut last_work = Instant::now();
                loop {
                    if tally.done.load(Ordering::Relaxed) >= n {
                        return Ok(());
                    }
                    let tx =
                        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    let id: Option<i64> = {
                        let mut stmt = tx.prepare_cached(fetch)?;
                        let mut rows = stmt.query([])?;
                        match rows.next()? {
                            Some(r) => Some(r.get(0)?),
                            None => None,
                        }
                    };
                    tx.commit()?;
                    let Some(id) = id else {
                        if last_work.elapsed() >= stall {
                            if let Ok(mut s) = stopped.lock() {
                                *s = Some(format!("no job for {stall:?}"));
                            }
                            return Ok(());
                        }
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    if let Ok(mut p) = tally.pickups_us.lock() {
                        p.push(free_since.elapsed().as_micros() as i64);
                    }
                    tally.executions.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(turn);
                    free_since = Instant::now();
                    last_work = free_since;
                    let tx =
                        conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    tx.prepare_cached(insert)?
                        .execute(rusqlite::params![id, w as i64])?;
                    tx.prepare_cached(mark)?.execute(rusqlite::params![id])?;
                    tx.commit()?;
                    tally.done.fetch_add(1, Ordering::Relaxed);
                    if let Some(b) = progress {
                        b.inc(1);
                    }
                }
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a baseline worker panicked"))??;
        }
        Ok(())
    })?;
    admin.execute_batch(&format!("DROP TABLE {jobs}; DROP TABLE {done};"))?;
    Ok(stopped.into_inner().unwrap_or(None))
}

// ---------------------------------------------------------------------------------
// The bench
// ---------------------------------------------------------------------------------

/// Runs the bench: for each round, in a scratch database beside `db` of its own, for
/// each task count the baseline and huddle on that database (the baseline first in odd
/// rounds, huddle first in even ones).
pub async fn run(args: TasksArgs, db: String) -> anyhow::Result<TasksReport> {
    if args.agents == 0 || args.relays == 0 || args.rounds == 0 || args.tasks.contains(&0) {
        anyhow::bail!("agents, relays, rounds and task counts must be positive");
    }
    let mut backend = String::new();
    let mut lines = Vec::new();
    for round in 1..=args.rounds {
        let scratch = ScratchDatabase::create(&db, "huddle_bench_tasks").await?;
        let result = run_in(&args, &scratch.url, round, &mut lines).await;
        let dropped = scratch.drop_now().await;
        backend = result?;
        dropped?;
    }
    let spread = spread(&lines);
    Ok(TasksReport {
        backend,
        shape: args.shape,
        lanes: args.lanes,
        agents: args.agents,
        relays: args.relays,
        turn_ms: args.turn_ms,
        lease_ahead: args.lease_ahead,
        lease_depth: args.lease_depth,
        compact_turns: args.compact_turns,
        batches_in_flight: args
            .batches_in_flight
            .unwrap_or_else(|| huddle_relay::runtime::default_batches_in_flight(&db) as u32),
        rounds: args.rounds,
        lines,
        spread,
    })
}

/// One round on the scratch database `db`: a line per task count pushed to `lines`.
/// Returns the backend's name.
async fn run_in(
    args: &TasksArgs,
    db: &str,
    round: usize,
    lines: &mut Vec<Line>,
) -> anyhow::Result<String> {
    // Opening the store applies the schema to the fresh database.
    let store = huddle_store::open(db, StoreOptions::default()).await?;
    let backend = store.backend_name().to_string();
    drop(store);
    let postmaster = match huddle_store::parse_url(db)? {
        huddle_store::Backend::Postgres(url) => postmaster_of(&url).await,
        huddle_store::Backend::Sqlite(_) => None,
    };
    let quiet = args.json;
    let huddle_first = round.is_multiple_of(2);
    let baseline_of = |n: usize| async move {
        if args.no_baseline {
            Ok(None)
        } else {
            run_baseline(args, db, postmaster, n, quiet).await.map(Some)
        }
    };
    for &n in &args.tasks {
        let (baseline, huddle) = if huddle_first {
            let huddle = run_huddle(args, db, postmaster, n, quiet).await?;
            (baseline_of(n).await?, huddle)
        } else {
            let baseline = baseline_of(n).await?;
            (baseline, run_huddle(args, db, postmaster, n, quiet).await?)
        };
        let ratio = baseline
            .as_ref()
            .filter(|b| b.per_s > 0.0)
            .map(|b| huddle.per_s / b.per_s);
        lines.push(Line {
            tasks: n,
            round,
            huddle,
            baseline,
            ratio,
        });
    }
    Ok(backend)
}

/// A markdown table of the report.
pub fn render(r: &TasksReport) -> String {
    let shape = match r.shape {
        Shape::Independent => "independent".to_string(),
        Shape::Lanes => format!("{} lanes", r.lanes),
    };
    let mut s = format!(
        "backend: {}, {shape}, {} agents over {} relay processes, {} ms turns{}{}{}\n\n\
         | tasks | side | tasks/s | executions/task | pickup p50 / p99 ms | client CPU ms/task | db CPU ms/task | relay peak RSS MiB | huddle ÷ baseline |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
        r.backend,
        r.agents,
        r.relays,
        r.turn_ms,
        match (r.lease_ahead, r.lease_depth) {
            (false, _) => String::new(),
            (true, None) => ", lease ahead".to_string(),
            (true, Some(d)) => format!(", lease ahead {d} deep"),
        },
        if r.compact_turns {
            ", compact turns"
        } else {
            ""
        },
        if r.batches_in_flight > 1 {
            format!(", {} batches in flight", r.batches_in_flight)
        } else {
            String::new()
        }
    );
    let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
    let mut row = |n: usize, name: String, side: &Side, ratio: Option<f64>| {
        let note = side
            .stopped_early
            .as_ref()
            .map(|w| format!(" (stopped: {w})"))
            .unwrap_or_default();
        s.push_str(&format!(
            "| {n} | {name}{note} | {:.0} | {:.2} | {:.1} / {:.1} | {:.2} | {} | {} | {} |\n",
            side.per_s,
            side.executions_per_task,
            side.pickup_p50_ms,
            side.pickup_p99_ms,
            side.client_cpu_ms_per_task,
            opt(side.db_cpu_ms_per_task, 2),
            opt(side.relay_peak_rss_mib, 0),
            opt(ratio, 2),
        ));
    };
    let mut by_n: BTreeMap<usize, Vec<&Line>> = BTreeMap::new();
    for l in &r.lines {
        by_n.entry(l.tasks).or_default().push(l);
    }
    for (n, ls) in by_n {
        for l in ls {
            let round = if r.rounds > 1 {
                format!(", round {}", l.round)
            } else {
                String::new()
            };
            if let Some(b) = &l.baseline {
                row(n, format!("plain SQL{round}"), b, None);
            }
            row(n, format!("huddle{round}"), &l.huddle, l.ratio);
        }
    }
    s.push_str(&crate::bench_stats::spread_list(
        r.rounds,
        r.spread.iter().map(|sp| {
            (
                format!("{} tasks", sp.tasks),
                sp.ratio_min,
                sp.ratio_median,
                sp.ratio_max,
            )
        }),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(tasks: usize, round: usize, ratio: Option<f64>) -> Line {
        Line {
            tasks,
            round,
            huddle: Side::default(),
            baseline: ratio.map(|_| Side::default()),
            ratio,
        }
    }

    #[test]
    fn the_spread_is_the_range_and_middle_of_each_counts_ratios() {
        let lines = vec![
            line(1000, 1, Some(0.30)),
            line(5000, 1, Some(0.20)),
            line(1000, 2, Some(0.10)),
            line(5000, 2, Some(0.40)),
            line(1000, 3, Some(0.25)),
            line(7000, 1, None),
        ];
        let got = spread(&lines);
        assert_eq!(
            got,
            vec![
                Spread {
                    tasks: 1000,
                    rounds: 3,
                    ratio_min: 0.10,
                    ratio_median: 0.25,
                    ratio_max: 0.30,
                },
                Spread {
                    tasks: 5000,
                    rounds: 2,
                    ratio_min: 0.20,
                    ratio_median: (0.20 + 0.40) / 2.0,
                    ratio_max: 0.40,
                },
            ]
        );
        assert!(spread(&[line(10, 1, None)]).is_empty());
    }
}
