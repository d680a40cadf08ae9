//! `huddle bench startup` (issue 12, plan 0057): how long a relay process takes to
//! start and answer, and its peak memory, on a ledger whose other rooms hold many
//! rows, against the same relay on a ledger holding its room alone.
//!
//! It measures any `huddle` binary (`--huddle PATH`), so a build from before a change
//! is measured the same way: the binary's own `migrate` makes the schema of its
//! version, and the rows are inserted with plain SQL (valid interactions whose ids are
//! content hashes, computed here; only columns every schema version has). Everything
//! happens in a scratch database beside `--db`, dropped at the end.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use huddle_core::{InteractionId, NewInteraction, Role, Verb};
use serde::Serialize;
use serde_json::json;

use crate::scratch::{ScratchDatabase, ScratchDir};

/// The room the measured relay serves.
const SERVED: &str = "served";
/// Its agent.
const AGENT: &str = "a0";
/// Rows per insert statement.
const CHUNK: usize = 5_000;

/// `huddle bench startup` flags.
#[derive(clap::Args, Debug)]
pub struct StartupArgs {
    /// Rows of other rooms: history the relay does not serve.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: usize,
    /// How many other rooms share those rows.
    #[arg(long, default_value_t = 100)]
    pub rooms: usize,
    /// Rows of the room the relay serves.
    #[arg(long, default_value_t = 2_000)]
    pub served_rows: usize,
    /// Relay starts measured on each ledger.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The `huddle` binary whose relay is measured [default: this one].
    #[arg(long, value_name = "PATH")]
    pub huddle: Option<PathBuf>,
    /// Give up on a start after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// The relay keeps a snapshot of its folds (plan 0063): the first start writes
    /// it, every later start resumes from it (builds that have snapshots).
    #[arg(long)]
    pub snapshot: bool,
    /// JSON report instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One relay start.
#[derive(Clone, Debug, Serialize)]
pub struct Start {
    /// From the process's start to its agent's reply to a message waiting in its
    /// room (start-up, one claim round and one turn), milliseconds.
    pub first_reply_ms: f64,
    /// From the relay's start to its first caught-up read, as it logs it (builds
    /// that log it), milliseconds.
    pub caught_up_ms: Option<u64>,
    /// Peak resident memory of the relay process at its reply (`VmHWM`), KiB.
    pub peak_rss_kib: Option<u64>,
    /// Rows its reader delivered, from its summary (builds that report it).
    pub rows_read: Option<u64>,
    /// Rows it did not read because it resumed from its snapshot (builds that report
    /// it).
    pub rows_resumed: Option<u64>,
    /// How long reading, checking and restoring its snapshot took, as it logs it.
    pub resume_ms: Option<u64>,
}

/// The starts on one ledger.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    /// Rows of other rooms in the ledger.
    pub other_rows: usize,
    /// Rows of the served room when measuring started.
    pub served_rows: usize,
    /// Each start.
    pub starts: Vec<Start>,
    /// Median of `first_reply_ms`.
    pub median_reply_ms: f64,
    /// Median of `peak_rss_kib`.
    pub median_peak_rss_kib: Option<u64>,
}

/// The report.
#[derive(Clone, Debug, Serialize)]
pub struct StartupReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The binary measured.
    pub binary: String,
    /// Seconds the other rooms' rows took to insert.
    pub seed_s: f64,
    /// The served room alone, then with the other rooms' rows.
    pub phases: Vec<Phase>,
}

/// Plain-SQL inserts into the scratch database.
enum Seeder {
    Postgres(tokio_postgres::Client, tokio::task::JoinHandle<()>),
    Sqlite(PathBuf),
}

impl Seeder {
    async fn open(url: &str) -> anyhow::Result<Self> {
        match huddle_store::parse_url(url)? {
            huddle_store::Backend::Postgres(url) => {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .context("connect to the scratch database")?;
                let driver = tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(Seeder::Postgres(client, driver))
            }
            huddle_store::Backend::Sqlite(path) => Ok(Seeder::Sqlite(PathBuf::from(path))),
        }
    }

    /// Inserts `rows` (content, with its id and canonical body), in statements of
    /// [`CHUNK`] rows.
    async fn insert(&self, rows: &[NewInteraction]) -> anyhow::Result<()> {
        for chunk in rows.chunks(CHUNK) {
            let ids: Vec<Vec<u8>> = chunk.iter().map(|n| n.id().0.to_vec()).collect();
            let rooms: Vec<&str> = chunk.iter().map(|n| n.room.as_str()).collect();
            let verbs: Vec<&str> = chunk.iter().map(|n| n.verb.as_str()).collect();
            let actors: Vec<&str> = chunk.iter().map(|n| n.actor.as_str()).collect();
            let roles: Vec<&str> = chunk.iter().map(|n| n.role.as_str()).collect();
            let bodies: Vec<String> = chunk.iter().map(NewInteraction::body_text).collect();
            match self {
                Seeder::Postgres(client, _) => {
                    client
                        .execute(
                            "INSERT INTO interaction (id, room, verb, actor, role, body)
                             SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[],
                                                  $4::text[], $5::text[], $6::text[])",
                            &[&ids, &rooms, &verbs, &actors, &roles, &bodies],
                        )
                        .await
                        .context("insert rows")?;
                }
                Seeder::Sqlite(path) => {
                    let path = path.clone();
                    let owned: Vec<(Vec<u8>, String, String, String, String, String)> = ids
                        .into_iter()
                        .zip(chunk)
                        .zip(bodies)
                        .map(|((id, n), body)| {
                            (
                                id,
                                n.room.clone(),
                                n.verb.as_str().to_string(),
                                n.actor.clone(),
                                n.role.as_str().to_string(),
                                body,
                            )
                        })
                        .collect();
                    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                        let mut conn = rusqlite::Connection::open(&path)?;
                        conn.busy_timeout(Duration::from_secs(30))?;
                        let tx = conn.transaction()?;
                        {
                            let mut insert = tx.prepare(
                                "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay)
                                 VALUES (?1, ?2, ?3, ?4, ?5, ?6,
                                         CAST(unixepoch('subsec') * 1000000 AS INTEGER), 'bench')",
                            )?;
                            for (id, room, verb, actor, role, body) in &owned {
                                insert.execute(rusqlite::params![id, room, verb, actor, role, body])?;
                            }
                        }
                        tx.commit()?;
                        Ok(())
                    })
                    .await??;
                }
            }
        }
        Ok(())
    }

    /// Where `message` lies in the ledger: `(txid, seq)` on Postgres (`txid` as
    /// text), `("", seq)` on SQLite.
    async fn position(&self, message: &InteractionId) -> anyhow::Result<(String, i64)> {
        let id = message.0.to_vec();
        match self {
            Seeder::Postgres(client, _) => {
                let row = client
                    .query_one(
                        "SELECT txid::text, seq FROM interaction WHERE id = $1",
                        &[&id],
                    )
                    .await?;
                Ok((row.try_get(0)?, row.try_get(1)?))
            }
            Seeder::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || -> anyhow::Result<(String, i64)> {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    let seq = conn.query_row(
                        "SELECT seq FROM interaction WHERE id = ?1",
                        rusqlite::params![id],
                        |r| r.get(0),
                    )?;
                    Ok((String::new(), seq))
                })
                .await?
            }
        }
    }

    /// Whether the agent answered `message`, which lies at `after` (a later row with
    /// it as parent). Only the room's rows after it are looked at, on the room index:
    /// the poll must not scan the history whose start-up it measures, on the
    /// machine it measures.
    async fn answered(
        &self,
        message: &InteractionId,
        after: &(String, i64),
    ) -> anyhow::Result<bool> {
        let parent = message.0.to_vec();
        match self {
            Seeder::Postgres(client, _) => Ok(client
                .query_opt(
                    "SELECT 1 FROM interaction WHERE room = $1 \
                     AND (txid, seq) > ($3::text::xid8, $4::int8) \
                     AND parent = $2 AND verb = 'message.posted' LIMIT 1",
                    &[&SERVED, &parent, &after.0, &after.1],
                )
                .await?
                .is_some()),
            Seeder::Sqlite(path) => {
                let (path, seq) = (path.clone(), after.1);
                tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
                    let conn = rusqlite::Connection::open_with_flags(
                        &path,
                        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                    )?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    let mut stmt = conn.prepare(
                        "SELECT 1 FROM interaction WHERE room = ?1 AND seq > ?3 \
                         AND parent = ?2 AND verb = 'message.posted' LIMIT 1",
                    )?;
                    Ok(stmt.exists(rusqlite::params![SERVED, parent, seq])?)
                })
                .await?
            }
        }
    }

    async fn close(self) {
        if let Seeder::Postgres(client, driver) = self {
            drop(client);
            let _ = driver.await;
        }
    }
}

/// A message of `room` numbered `n`.
fn chatter(room: &str, n: usize) -> NewInteraction {
    NewInteraction::new(
        room,
        Verb::MessagePosted,
        "chatter",
        Role::Human,
        json!({ "text": format!("history row {n} of room {room}, nobody answers it"), "nonce": format!("history-{n}") }),
    )
}

/// Peak resident memory of process `pid` (`VmHWM` in `/proc/<pid>/status`), KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The relay's own `caught up` log line's `elapsed_ms`, if it logged one.
fn caught_up_ms(log: &Path) -> Option<u64> {
    logged_ms(log, "caught up with the rooms")
}

/// The `elapsed_ms` of the first line of the relay's log containing `what`.
fn logged_ms(log: &Path, what: &str) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|l| l.contains(what))?;
    let at = line.find("elapsed_ms=")? + "elapsed_ms=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn relay_toml(db: &str, snapshot: Option<&Path>) -> String {
    let s = |v: &str| serde_json::to_string(v).unwrap_or_default();
    // Without --snapshot every start reads from the first row (relays keep one by
    // default).
    let snapshot = snapshot
        .map(|p| format!("snapshot = {}\n", s(&p.display().to_string())))
        .unwrap_or_else(|| "snapshot = false\n".to_string());
    format!(
        "relay = \"bench-startup\"\ndatabase = {}\nrooms = [{}]\n{snapshot}\n[[agent]]\nkey = {}\n\
         capabilities = []\ndriver = \"sim\"\n\
         sim = {{ turn_ms = 1, jitter = 0.0, failure_rate = 0.0, tokens = 10, seed = 1 }}\n",
        s(db),
        s(SERVED),
        s(AGENT)
    )
}

/// SIGTERM, then the exit (killed after 30 s) and the summary line, if any.
fn stop(mut child: Child) -> Option<serde_json::Value> {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.wait();
    let out = child.stdout.take()?;
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .last()
}

/// Starts the relay, waits for its agent's reply to a message posted just before, and
/// stops it.
async fn start_once(
    binary: &Path,
    seeder: &Seeder,
    config: &Path,
    log: &Path,
    run: usize,
    timeout: Duration,
) -> anyhow::Result<Start> {
    let ping = NewInteraction::new(
        SERVED,
        Verb::MessagePosted,
        "bench",
        Role::Human,
        json!({ "text": format!("@{AGENT} are you there? (start {run})"), "nonce": format!("start-{run}-{}", crate::scratch::unique_tag()) }),
    );
    seeder.insert(std::slice::from_ref(&ping)).await?;
    let at = seeder.position(&ping.id()).await?;
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let started = Instant::now();
    let child = Command::new(binary)
        .args(["relay", "--config"])
        .arg(config)
        .env("HUDDLE_LOG", "warn,huddle=info")
        .env_remove("RUST_LOG")
        .env_remove("HUDDLE_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("cannot start {} relay", binary.display()))?;
    let pid = child.id();
    let deadline = started + timeout;
    let mut child = Some(child);
    loop {
        if seeder.answered(&ping.id(), &at).await? {
            break;
        }
        if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            bail!("the relay exited ({status}) before answering:\n{tail}");
        }
        if Instant::now() > deadline {
            if let Some(c) = child.take() {
                stop(c);
            }
            bail!("no answer within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_reply_ms = started.elapsed().as_secs_f64() * 1000.0;
    let peak = peak_rss_kib(pid);
    let summary = child.take().and_then(stop);
    Ok(Start {
        first_reply_ms,
        caught_up_ms: caught_up_ms(log),
        resume_ms: logged_ms(log, "resumed from the snapshot"),
        peak_rss_kib: peak,
        rows_read: summary
            .as_ref()
            .and_then(|s| s.get("rows_read"))
            .and_then(|v| v.as_u64()),
        rows_resumed: summary
            .as_ref()
            .and_then(|s| s.get("rows_resumed"))
            .and_then(|v| v.as_u64()),
    })
}

fn median_f(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the bench on a scratch database beside `db`.
pub async fn run(args: StartupArgs, db: String) -> anyhow::Result<StartupReport> {
    if args.runs == 0 || args.rooms == 0 {
        bail!("--runs and --rooms must be positive");
    }
    let binary = match &args.huddle {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("the huddle binary's own path")?,
    };
    let scratch = ScratchDatabase::create(&db, "huddle_bench_startup").await?;
    let dir = ScratchDir::create("huddle-bench-startup")?;
    let result = measure(&args, &binary, &scratch.url, &dir).await;
    if let Err(e) = scratch.drop_now().await {
        tracing::warn!(error = %e, "the scratch database was not dropped");
    }
    let (seed_s, phases) = result?;
    Ok(StartupReport {
        backend: match huddle_store::parse_url(&db)? {
            huddle_store::Backend::Postgres(_) => "postgres".into(),
            huddle_store::Backend::Sqlite(_) => "sqlite".into(),
        },
        binary: binary.display().to_string(),
        seed_s,
        phases,
    })
}

async fn measure(
    args: &StartupArgs,
    binary: &Path,
    url: &str,
    dir: &ScratchDir,
) -> anyhow::Result<(f64, Vec<Phase>)> {
    let status = Command::new(binary)
        .args(["--db", url, "migrate"])
        .env_remove("HUDDLE_DB")
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {} migrate", binary.display()))?;
    if !status.success() {
        bail!("{} migrate failed ({status})", binary.display());
    }
    let seeder = Seeder::open(url).await?;
    let owner = huddle_core::signing::OwnerSecret::from_seed([7; 32]);
    let mut served = vec![NewInteraction::new(
        SERVED,
        Verb::RoomCreated,
        "bench",
        Role::Owner,
        json!({ "owner": "bench", "key": owner.public().to_hex() }),
    )];
    served.extend((0..args.served_rows).map(|i| chatter(SERVED, i)));
    seeder.insert(&served).await?;
    let config = PathBuf::from(dir.db("relay.toml"));
    let snapshot = args
        .snapshot
        .then(|| PathBuf::from(dir.db("relay.snapshot")));
    std::fs::write(&config, relay_toml(url, snapshot.as_deref()))?;
    let timeout = Duration::from_secs(args.timeout_s);
    let mut phases = Vec::new();
    let mut seed_s = 0.0;
    for other_rows in [0, args.rows] {
        if other_rows > 0 {
            let t = Instant::now();
            let per_chunk = CHUNK * 10;
            let mut written = 0;
            while written < other_rows {
                let n = per_chunk.min(other_rows - written);
                let rows: Vec<NewInteraction> = (written..written + n)
                    .map(|i| chatter(&format!("other-{}", i % args.rooms), i))
                    .collect();
                seeder.insert(&rows).await?;
                written += n;
                if !args.json {
                    eprint!("\rinserted {written} of {other_rows} rows of other rooms");
                }
            }
            if !args.json {
                eprintln!();
            }
            seed_s = t.elapsed().as_secs_f64();
        }
        let mut starts = Vec::new();
        for run in 0..args.runs {
            let log = PathBuf::from(dir.db(&format!("relay-{other_rows}-{run}.log")));
            starts.push(start_once(binary, &seeder, &config, &log, run, timeout).await?);
        }
        let mut peaks: Vec<u64> = starts.iter().filter_map(|s| s.peak_rss_kib).collect();
        peaks.sort_unstable();
        phases.push(Phase {
            other_rows,
            served_rows: args.served_rows + 1,
            median_reply_ms: median_f(starts.iter().map(|s| s.first_reply_ms).collect()),
            median_peak_rss_kib: peaks.get(peaks.len() / 2).copied(),
            starts,
        });
    }
    seeder.close().await;
    Ok((seed_s, phases))
}

/// The report as a table.
pub fn render(r: &StartupReport) -> String {
    let mut out = format!(
        "relay start-up on {} ({}); other rooms' rows inserted in {:.1} s\n\
         {:>12} {:>12} {:>16} {:>10} {:>14} {:>14} {:>10} {:>12}\n",
        r.backend,
        r.binary,
        r.seed_s,
        "other rows",
        "served rows",
        "first reply ms",
        "resume ms",
        "caught up ms",
        "peak RSS MiB",
        "rows read",
        "rows resumed"
    );
    for p in &r.phases {
        for s in &p.starts {
            out.push_str(&format!(
                "{:>12} {:>12} {:>16.0} {:>10} {:>14} {:>14} {:>10} {:>12}\n",
                p.other_rows,
                p.served_rows,
                s.first_reply_ms,
                s.resume_ms.map_or("-".into(), |v| v.to_string()),
                s.caught_up_ms.map_or("-".into(), |v| v.to_string()),
                s.peak_rss_kib
                    .map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
                s.rows_read.map_or("-".into(), |v| v.to_string()),
                s.rows_resumed.map_or("-".into(), |v| v.to_string()),
            ));
        }
        out.push_str(&format!(
            "{:>12} {:>12} {:>16.0} {:>10} {:>14} {:>14}   (median)\n",
            p.other_rows,
            p.served_rows,
            p.median_reply_ms,
            "",
            "",
            p.median_peak_rss_kib
                .map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        ));
    }
    out
}
