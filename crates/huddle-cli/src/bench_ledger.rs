//! `huddle bench ledger`: append and claim throughput through huddle, beside a plain
//! baseline doing the equivalent raw work on the same database in the same run.
//!
//! - Appends: `writers` concurrent writers for `seconds` per phase, batch sizes 1, 10
//!   and 100. huddle's path validates, hashes, dedupes and rings the doorbell (NOTIFY
//!   on Postgres, sent outside the transaction). The baseline inserts the same columns
//!   with plain SQL and sends no NOTIFY.
//! - Claims: `writers` concurrent contenders on 16 keys. huddle's `acquire` beside the
//!   same upsert issued directly.
//! - Reads: one reader reads every row huddle appended above, forward to the end:
//!   huddle's `read_forward` (each row decoded, re-hashed, checked against the limits
//!   and, when signed, its writer signature verified) beside a plain `SELECT` of the
//!   same columns of the baseline's rows.
//!
//! With `--relay-key`, huddle's appends are signed (plan 0031), so the appends measure
//! signing and the reads verification.
//!
//! Both sides run in a scratch database beside the one given (dropped afterwards), so
//! the bench leaves no rows behind.
//!
//! An unmeasured warm-up of plain appends comes first, so neither side runs on an empty
//! file whose indexes still fit in the page cache. Then each scenario runs four phases
//! in mirrored order, plain / huddle / huddle / plain (huddle / plain / plain / huddle
//! in even rounds), and reports each side's mean, so a drift that grows through the
//! scenario (the file, its log, a busy machine) hits both sides alike (plan 0076).
//! `--rounds N` runs the whole bench N times, each round in a scratch database of its
//! own, and reports the smallest, median and largest ratio of
//! every scenario over the rounds (plan 0075).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use huddle_core::{NewInteraction, Role, Verb};
use huddle_store::{Backend, Store, StoreOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

/// Options of the ledger bench.
#[derive(Clone, Debug)]
pub struct LedgerBenchOptions {
    /// Database URL.
    pub db: String,
    /// Seconds per phase.
    pub seconds: f64,
    /// Concurrent writers / contenders.
    pub writers: usize,
    /// Batch sizes to measure.
    pub batches: Vec<usize>,
    /// huddle's appends are signed with this writer key, when given.
    pub signer: Option<huddle_core::keys::WriterSecret>,
    /// Whole runs of the bench, each in a scratch database of its own.
    pub rounds: usize,
}

/// One measured line.
#[derive(Clone, Debug, Serialize)]
pub struct BenchLine {
    /// What was measured.
    pub scenario: String,
    /// The round it was measured in (1-based).
    pub round: usize,
    /// huddle's rate (interactions or acquisitions per second).
    pub huddle_per_s: f64,
    /// The baseline's rate.
    pub baseline_per_s: f64,
    /// huddle ÷ baseline.
    pub ratio: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct LedgerBenchReport {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// Writers per phase.
    pub writers: usize,
    /// Seconds per phase.
    pub seconds: f64,
    /// Whether huddle's rows were signed (and so verified when read).
    pub signed: bool,
    /// Rounds run.
    pub rounds: usize,
    /// Results: every scenario of every round, round by round.
    pub lines: Vec<BenchLine>,
    /// Per scenario, the ratio's range over the rounds.
    pub spread: Vec<ScenarioSpread>,
}

/// The ratio of one scenario over the rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioSpread {
    /// What was measured.
    pub scenario: String,
    /// Rounds with a ratio.
    pub rounds: usize,
    /// The smallest ratio.
    pub ratio_min: f64,
    /// The median ratio (the mean of the middle two for an even count).
    pub ratio_median: f64,
    /// The largest ratio.
    pub ratio_max: f64,
}

/// Per scenario (in the order the scenarios first appear), the range of the ratios of
/// `lines` over the rounds; ratios that are not finite (a side measured nothing) are
/// left out.
pub fn spread(lines: &[BenchLine]) -> Vec<ScenarioSpread> {
    let mut order: Vec<&str> = Vec::new();
    for l in lines {
        if !order.contains(&l.scenario.as_str()) {
            order.push(&l.scenario);
        }
    }
    order
        .into_iter()
        .filter_map(|scenario| {
            let ratios: Vec<f64> = lines
                .iter()
                .filter(|l| l.scenario == scenario && l.ratio.is_finite())
                .map(|l| l.ratio)
                .collect();
            let rounds = ratios.len();
            let (ratio_min, ratio_median, ratio_max) = crate::bench_stats::min_median_max(ratios)?;
            Some(ScenarioSpread {
                scenario: scenario.to_string(),
                rounds,
                ratio_min,
                ratio_median,
                ratio_max,
            })
        })
        .collect()
}

/// The plain baseline: the same rows and upserts without huddle.
enum Baseline {
    Postgres(Vec<Arc<tokio_postgres::Client>>),
    Sqlite(String, usize),
}

static NONCE: AtomicU64 = AtomicU64::new(0);

fn nonce() -> u64 {
    NONCE.fetch_add(1, Ordering::Relaxed)
}

/// This process's start time: keeps rows of different bench runs on one database
/// distinct (identical content would be deduplicated, or collide in the baseline).
fn process_tag() -> u128 {
    static TAG: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    })
}

fn bench_message(run: u64, writer: usize, n: u64) -> NewInteraction {
    NewInteraction::new(
        "bench",
        Verb::MessagePosted,
        format!("writer-{writer}"),
        Role::Agent,
        json!({ "text": format!("bench message {}-{run}-{writer}-{n}", process_tag()), "n": n }),
    )
}

/// The room the baseline writes in, so each side reads back only its own rows.
const BASELINE_ROOM: &str = "bench-raw";

fn baseline_row(mut row: NewInteraction) -> NewInteraction {
    row.room = BASELINE_ROOM.into();
    row
}

fn baseline_rows(rows: Vec<NewInteraction>) -> Vec<NewInteraction> {
    rows.into_iter().map(baseline_row).collect()
}

impl Baseline {
    /// Reads every baseline row forward in pages of 1,000 (the same columns huddle
    /// reads); returns rows per second.
    async fn reads(&self, bar: &ProgressBar) -> anyhow::Result<f64> {
        let started = Instant::now();
        let mut total = 0u64;
        match self {
            Baseline::Postgres(clients) => {
                let client = clients.first().context("no baseline connection")?;
                // On the same (room, txid, seq) index huddle's room reads use.
                let stmt = client
                    .prepare(
                        "SELECT txid::text, seq, id, room, thread, verb, actor, role, parent, \
                         caused_by, body, (extract(epoch FROM at) * 1000000)::int8, relay, sig \
                         FROM interaction WHERE room = $1 \
                           AND (txid, seq) > ($2::text::xid8, $3::int8) \
                         ORDER BY interaction.txid, interaction.seq LIMIT 1000",
                    )
                    .await?;
                let (mut txid, mut seq) = ("0".to_string(), 0i64);
                loop {
                    let rows = client.query(&stmt, &[&BASELINE_ROOM, &txid, &seq]).await?;
                    let Some(last) = rows.last() else { break };
                    txid = last.try_get(0)?;
                    seq = last.try_get(1)?;
                    for r in &rows {
                        let body: String = r.try_get(10)?;
                        std::hint::black_box(body);
                    }
                    total += rows.len() as u64;
                    bar.inc(rows.len() as u64);
                }
            }
            Baseline::Sqlite(path, _) => {
                let path = path.clone();
                let bar = bar.clone();
                total = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
                    let conn = rusqlite::Connection::open(&path)?;
                    let mut stmt = conn.prepare(
                        "SELECT seq, id, at, relay, room, thread, verb, actor, role, parent, \
                         caused_by, body, sig FROM interaction \
                         WHERE room = ?1 AND seq > ?2 ORDER BY seq LIMIT 1000",
                    )?;
                    let (mut after, mut total) = (0i64, 0u64);
                    loop {
                        let mut rows = stmt.query(rusqlite::params![BASELINE_ROOM, after])?;
                        let mut n = 0u64;
                        while let Some(r) = rows.next()? {
                            after = r.get(0)?;
                            let body: String = r.get(11)?;
                            std::hint::black_box(body);
                            n += 1;
                        }
                        if n == 0 {
                            return Ok(total);
                        }
                        total += n;
                        bar.inc(n);
                    }
                })
                .await??;
            }
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    }

    async fn connect(url: &str, backend: &Backend, writers: usize) -> anyhow::Result<Self> {
        match backend {
            Backend::Postgres(_) => {
                let mut clients = Vec::new();
                for _ in 0..writers {
                    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                        .await
                        .context("baseline connection")?;
                    tokio::spawn(conn);
                    clients.push(Arc::new(client));
                }
                Ok(Baseline::Postgres(clients))
            }
            Backend::Sqlite(path) => Ok(Baseline::Sqlite(path.clone(), writers)),
        }
    }

    /// Runs `writers` baseline appenders for `secs`; returns rows per second.
    async fn appends(&self, batch: usize, secs: f64, bar: &ProgressBar) -> anyhow::Result<f64> {
        let run = nonce();
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let count = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        match self {
            Baseline::Postgres(clients) => {
                let statements = prepare_all(
                    clients,
                    "INSERT INTO interaction (id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key) \
                     SELECT id, room, NULL, verb, actor, role, NULL, '{}', body, NULL \
                     FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) \
                     AS t(id, room, verb, actor, role, body)",
                )
                .await?;
                let clients = Arc::new(clients.clone());
                return measure(clients.len(), secs, bar, move |w, step| {
                    let (client, stmt) = (clients[w].clone(), statements[w].clone());
                    async move {
                        let rows = baseline_rows(bench_batch(run + 1_000_000, w, step, batch));
                        // Equivalent raw work: the same columns, ids precomputed the
                        // cheapest way (blake3 of the text), no checks, no NOTIFY.
                        let ids: Vec<Vec<u8>> = rows
                            .iter()
                            .map(|r| blake3::hash(r.body_text().as_bytes()).as_bytes().to_vec())
                            .collect();
                        let rooms: Vec<&str> = rows.iter().map(|r| r.room.as_str()).collect();
                        let verbs: Vec<&str> = rows.iter().map(|r| r.verb.as_str()).collect();
                        let actors: Vec<&str> = rows.iter().map(|r| r.actor.as_str()).collect();
                        let roles: Vec<&str> = rows.iter().map(|r| r.role.as_str()).collect();
                        let bodies: Vec<String> = rows.iter().map(|r| r.body_text()).collect();
                        client
                            .execute(&stmt, &[&ids, &rooms, &verbs, &actors, &roles, &bodies])
                            .await?;
                        Ok(batch as u64)
                    }
                })
                .await;
            }
            Baseline::Sqlite(path, writers) => {
                let mut handles = Vec::new();
                for w in 0..*writers {
                    let path = path.clone();
                    let count = count.clone();
                    let bar = bar.clone();
                    handles.push(tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                        let mut conn = rusqlite::Connection::open(&path)?;
                        conn.busy_timeout(Duration::from_secs(30))?;
                        conn.pragma_update(None, "synchronous", "NORMAL")?;
                        let mut n = 0u64;
                        while Instant::now() < deadline {
                            let tx = conn.transaction_with_behavior(
                                rusqlite::TransactionBehavior::Immediate,
                            )?;
                            {
                                let mut stmt = tx.prepare_cached(
                                    "INSERT INTO interaction (id, room, verb, actor, role, body, at, relay) \
                                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, CAST(unixepoch('subsec')*1000000 AS INTEGER), 'baseline')",
                                )?;
                                for _ in 0..batch {
                                    n += 1;
                                    let r = baseline_row(bench_message(run + 1_000_000, w, n));
                                    let body = r.body_text();
                                    let id = blake3::hash(body.as_bytes());
                                    stmt.execute(rusqlite::params![
                                        &id.as_bytes()[..],
                                        r.room,
                                        r.verb.as_str(),
                                        r.actor,
                                        r.role.as_str(),
                                        body
                                    ])?;
                                }
                            }
                            tx.commit()?;
                            count.fetch_add(batch as u64, Ordering::Relaxed);
                            bar.inc(batch as u64);
                        }
                        Ok(())
                    }));
                }
                for h in handles {
                    h.await??;
                }
            }
        }
        Ok(count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
    }

    /// Raw contended upserts; returns acquisitions per second.
    async fn claims(&self, secs: f64, bar: &ProgressBar) -> anyhow::Result<f64> {
        let run = nonce();
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let count = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        match self {
            Baseline::Postgres(clients) => {
                let statements = prepare_all(
                    clients,
                    "INSERT INTO external_claim AS c (key, holder, epoch, expires_at) \
                     VALUES ($1, $2, 1, now() + make_interval(secs => $3)) \
                     ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, \
                       epoch = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now() THEN c.epoch ELSE c.epoch + 1 END, \
                       expires_at = EXCLUDED.expires_at, renewed_at = now() \
                     WHERE c.expires_at <= now() OR c.holder = EXCLUDED.holder \
                     RETURNING holder, epoch, expires_at",
                )
                .await?;
                let clients = Arc::new(clients.clone());
                return measure(clients.len(), secs, bar, move |w, step| {
                    let (client, stmt) = (clients[w].clone(), statements[w].clone());
                    async move {
                        let key = format!("bench-raw/{run}/{}", step % 16);
                        let holder = format!("h{w}");
                        client.query(&stmt, &[&key, &holder, &0.001f64]).await?;
                        Ok(1)
                    }
                })
                .await;
            }
            Baseline::Sqlite(path, writers) => {
                let mut handles = Vec::new();
                for w in 0..*writers {
                    let path = path.clone();
                    let count = count.clone();
                    let bar = bar.clone();
                    handles.push(tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                        let mut conn = rusqlite::Connection::open(&path)?;
                        conn.busy_timeout(Duration::from_secs(30))?;
                        let mut n = 0u64;
                        while Instant::now() < deadline {
                            n += 1;
                            let key = format!("bench-raw/{run}/{}", n % 16);
                            let tx = conn.transaction_with_behavior(
                                rusqlite::TransactionBehavior::Immediate,
                            )?;
                            tx.query_row(
                                "INSERT INTO external_claim AS c (key, holder, epoch, expires_at, acquired_at, renewed_at) \
                                 VALUES (?1, ?2, 1, CAST(unixepoch('subsec')*1000000 AS INTEGER) + 1000, 0, 0) \
                                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, \
                                   epoch = CASE WHEN c.holder = excluded.holder AND c.expires_at > CAST(unixepoch('subsec')*1000000 AS INTEGER) THEN c.epoch ELSE c.epoch + 1 END, \
                                   expires_at = excluded.expires_at \
                                 WHERE c.expires_at <= CAST(unixepoch('subsec')*1000000 AS INTEGER) OR c.holder = excluded.holder \
                                 RETURNING epoch",
                                rusqlite::params![key, format!("h{w}")],
                                |_| Ok(()),
                            )
                            .or_else(|e| match e {
                                rusqlite::Error::QueryReturnedNoRows => Ok(()),
                                e => Err(e),
                            })?;
                            tx.commit()?;
                            count.fetch_add(1, Ordering::Relaxed);
                            bar.inc(1);
                        }
                        Ok(())
                    }));
                }
                for h in handles {
                    h.await??;
                }
            }
        }
        Ok(count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
    }
}

/// Runs one task per writer calling `op(writer, step)` (step 1, 2, ...) until `secs`
/// have passed; each call returns how many operations it did. Operations per second.
async fn measure<F, Fut>(writers: usize, secs: f64, bar: &ProgressBar, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send + 'static,
{
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (op, count, bar) = (op.clone(), count.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let mut step = 0u64;
            while Instant::now() < deadline {
                step += 1;
                let done = op(w, step).await?;
                count.fetch_add(done, Ordering::Relaxed);
                bar.inc(done);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Prepares `sql` on every baseline connection.
async fn prepare_all(
    clients: &[Arc<tokio_postgres::Client>],
    sql: &str,
) -> anyhow::Result<Arc<Vec<tokio_postgres::Statement>>> {
    let mut statements = Vec::with_capacity(clients.len());
    for c in clients {
        statements.push(c.prepare(sql).await?);
    }
    Ok(Arc::new(statements))
}

/// The messages of writer `w`'s `step`-th batch: numbered on from the previous batch.
fn bench_batch(run: u64, w: usize, step: u64, batch: usize) -> Vec<NewInteraction> {
    let first = (step - 1) * batch as u64;
    (1..=batch as u64)
        .map(|i| bench_message(run, w, first + i))
        .collect()
}

async fn huddle_appends(
    store: &Arc<dyn Store>,
    writers: usize,
    batch: usize,
    secs: f64,
    bar: &ProgressBar,
) -> anyhow::Result<f64> {
    let run = nonce();
    let store = store.clone();
    measure(writers, secs, bar, move |w, step| {
        let store = store.clone();
        async move {
            store.append(bench_batch(run, w, step, batch)).await?;
            Ok(batch as u64)
        }
    })
    .await
}

/// Reads every row huddle appended forward to the end; returns rows per second.
async fn huddle_reads(store: &Arc<dyn Store>, bar: &ProgressBar) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut cursor = huddle_core::Position::START;
    let mut total = 0u64;
    loop {
        let batch = store.read_room("bench", cursor, 1000).await?;
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
        total += batch.rows.len() as u64;
        bar.inc(batch.rows.len() as u64);
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn huddle_claims(
    store: &Arc<dyn Store>,
    writers: usize,
    secs: f64,
    bar: &ProgressBar,
) -> anyhow::Result<f64> {
    let run = nonce();
    let store = store.clone();
    measure(writers, secs, bar, move |w, step| {
        let store = store.clone();
        async move {
            let key = format!("bench/{run}/{}", step % 16);
            store
                .acquire(&key, &format!("h{w}"), Duration::from_millis(1))
                .await?;
            Ok(1)
        }
    })
    .await
}

fn bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:<40} {pos:>9} ops  {per_sec:>12}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(label.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Runs the ledger bench in a scratch database beside `opts.db` (a new database on
/// the same Postgres server, or a new SQLite file in the same directory), dropped
/// afterwards: the rows both sides write (the baseline's ids are not content hashes)
/// never reach a ledger a relay reads.
/// With several rounds, each has a scratch database of its own.
pub async fn run(opts: LedgerBenchOptions) -> anyhow::Result<LedgerBenchReport> {
    if opts.rounds == 0 {
        anyhow::bail!("--rounds must be positive");
    }
    let mut backend = String::new();
    let mut lines = Vec::new();
    for round in 1..=opts.rounds {
        let scratch =
            crate::scratch::ScratchDatabase::create(&opts.db, "huddle_bench_ledger").await?;
        let result = measure_all(&scratch.url, &opts, round).await;
        let dropped = scratch.drop_now().await;
        let (name, round_lines) = result?;
        dropped?;
        backend = name;
        lines.extend(round_lines);
    }
    Ok(LedgerBenchReport {
        backend,
        writers: opts.writers,
        seconds: opts.seconds,
        signed: opts.signer.is_some(),
        rounds: opts.rounds,
        spread: spread(&lines),
        lines,
    })
}

/// A scenario's four phases in the order they run, each as (huddle?, its nth phase of
/// that side): mirrored, so both sides sit at the same mean position; the plain side
/// first in odd rounds, huddle first in even ones.
fn phases(round: usize) -> [(bool, usize); 4] {
    let h = round.is_multiple_of(2);
    [(h, 1), (!h, 1), (!h, 2), (h, 2)]
}

/// One round of every scenario in `db`: the store's backend name and the round's lines.
async fn measure_all(
    db: &str,
    opts: &LedgerBenchOptions,
    round: usize,
) -> anyhow::Result<(String, Vec<BenchLine>)> {
    let backend = huddle_store::parse_url(db)?;
    let store_opts = StoreOptions {
        relay: "bench".into(),
        pool_size: opts.writers + 2,
        signer: opts.signer.clone(),
        ..Default::default()
    };
    let store = huddle_store::open(db, store_opts)
        .await
        .with_context(|| format!("cannot open the scratch database {db}"))?;
    let baseline = Baseline::connect(db, &backend, opts.writers).await?;
    let half = opts.seconds / 2.0;
    // Not measured: both sides start on a ledger that is no longer empty (an empty
    // file's indexes fit in the page cache, so whichever side ran first was faster).
    let pb = bar("warm-up: plain appends, batch 100 (not measured)");
    baseline.appends(100, half, &pb).await?;
    pb.finish_and_clear();
    let mut lines = Vec::new();
    for &batch in &opts.batches {
        let mut h = 0.0;
        let mut b = 0.0;
        for (huddle, nth) in phases(round) {
            let pb = bar(&format!(
                "appends batch {batch}: {} ({nth}/2)",
                side(huddle)
            ));
            if huddle {
                h += huddle_appends(&store, opts.writers, batch, half, &pb).await?;
            } else {
                b += baseline.appends(batch, half, &pb).await?;
            }
            pb.finish_and_clear();
        }
        lines.push(BenchLine {
            scenario: format!("append, batch {batch}"),
            round,
            huddle_per_s: h / 2.0,
            baseline_per_s: b / 2.0,
            ratio: h / b,
        });
    }
    let mut h = 0.0;
    let mut b = 0.0;
    for (huddle, nth) in phases(round) {
        let pb = bar(&format!("contended claims: {} ({nth}/2)", side(huddle)));
        if huddle {
            h += huddle_claims(&store, opts.writers, half, &pb).await?;
        } else {
            b += baseline.claims(half, &pb).await?;
        }
        pb.finish_and_clear();
    }
    lines.push(BenchLine {
        scenario: "claim acquire, 16 keys contended".into(),
        round,
        huddle_per_s: h / 2.0,
        baseline_per_s: b / 2.0,
        ratio: h / b,
    });
    let mut h = 0.0;
    let mut b = 0.0;
    for (huddle, nth) in phases(round) {
        let pb = bar(&format!("read forward: {} ({nth}/2)", side(huddle)));
        if huddle {
            h += huddle_reads(&store, &pb).await?;
        } else {
            b += baseline.reads(&pb).await?;
        }
        pb.finish_and_clear();
    }
    lines.push(BenchLine {
        scenario: "read forward, every row appended above".into(),
        round,
        huddle_per_s: h / 2.0,
        baseline_per_s: b / 2.0,
        ratio: h / b,
    });
    Ok((store.backend_name().to_string(), lines))
}

/// The name of a side in progress labels.
fn side(huddle: bool) -> &'static str {
    if huddle {
        "huddle"
    } else {
        "baseline"
    }
}

/// A markdown table of the report.
pub fn render(report: &LedgerBenchReport) -> String {
    let mut s = format!(
        "backend: {}, {} writers, {} s per side{}\n\n| scenario | huddle /s | baseline /s | huddle ÷ baseline |\n|---|---:|---:|---:|\n",
        report.backend,
        report.writers,
        report.seconds,
        if report.signed { ", huddle's rows signed" } else { "" }
    );
    for l in &report.lines {
        let round = if report.rounds > 1 {
            format!(", round {}", l.round)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "| {}{round} | {:.0} | {:.0} | {:.2} |\n",
            l.scenario, l.huddle_per_s, l.baseline_per_s, l.ratio
        ));
    }
    s.push_str(&crate::bench_stats::spread_list(
        report.rounds,
        report.spread.iter().map(|sp| {
            (
                sp.scenario.clone(),
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

    fn line(scenario: &str, round: usize, ratio: f64) -> BenchLine {
        BenchLine {
            scenario: scenario.into(),
            round,
            huddle_per_s: ratio,
            baseline_per_s: 1.0,
            ratio,
        }
    }

    #[test]
    fn the_spread_is_per_scenario_in_first_seen_order_without_unmeasured_ratios() {
        let lines = vec![
            line("append, batch 100", 1, 0.8),
            line("claims", 1, 7.0),
            line("append, batch 100", 2, 0.9),
            line("claims", 2, f64::INFINITY),
            line("append, batch 100", 3, 0.95),
            line("reads", 1, f64::NAN),
        ];
        let got = spread(&lines);
        assert_eq!(
            got,
            vec![
                ScenarioSpread {
                    scenario: "append, batch 100".into(),
                    rounds: 3,
                    ratio_min: 0.8,
                    ratio_median: 0.9,
                    ratio_max: 0.95,
                },
                ScenarioSpread {
                    scenario: "claims".into(),
                    rounds: 1,
                    ratio_min: 7.0,
                    ratio_median: 7.0,
                    ratio_max: 7.0,
                },
            ]
        );
    }

    #[test]
    fn each_round_is_mirrored_and_odd_rounds_start_with_the_plain_side() {
        let (p, h) = (false, true);
        assert_eq!(phases(1), [(p, 1), (h, 1), (h, 2), (p, 2)]);
        assert_eq!(phases(2), [(h, 1), (p, 1), (p, 2), (h, 2)]);
        assert_eq!(phases(3), phases(1));
        // Mirrored: each side's mean phase position is the same, so a drift that
        // grows linearly through the round (the file, the log) hits both alike.
        for round in 1..=2 {
            let at = |side: bool| -> usize {
                phases(round)
                    .iter()
                    .enumerate()
                    .filter(|(_, (s, _))| *s == side)
                    .map(|(i, _)| i)
                    .sum()
            };
            assert_eq!(at(h), at(p));
        }
    }
}
