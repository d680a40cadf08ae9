//! `huddle bench coord`: the coordination-strategies scenario (300 URLs, fixed work
//! per URL, 6 / 30 / 300 agents over 3 relays) and the wake latency between two
//! store handles.
//!
//! Each agent count runs in a fresh room (on SQLite without `--db`: a fresh database
//! file) through [`crate::scenario`], the same code as `huddle demo`. Targets:
//! duplicates 0, missed 0, makespan ÷ ideal ≤ 1.10 at 30 agents and ≤ 1.25 at 300.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use huddle_relay::RelayOptions;
use huddle_store::StoreOptions;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::demo::AllocationArg;
use crate::scenario::{
    self, Progress, Quiet, ScenarioOptions, ScenarioReport, Tally, WakeReport, Workload,
};

/// Flags of `huddle bench coord`.
#[derive(Args, Debug, Clone)]
pub struct CoordArgs {
    /// Agent counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "6,30,300")]
    pub agents: Vec<usize>,
    /// Independent tasks (URLs).
    #[arg(long, default_value_t = 300)]
    pub tasks: usize,
    /// Work per task, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub task_ms: u64,
    /// In-process relays (agents spread round-robin).
    #[arg(long, default_value_t = 3)]
    pub relays: usize,
    /// Task allocation.
    #[arg(long, value_enum, default_value_t = AllocationArg::Pull)]
    pub allocation: AllocationArg,
    /// Wake-latency probes (0 skips the measurement).
    #[arg(long, default_value_t = 200)]
    pub wake_samples: usize,
    /// Pause between wake probes, milliseconds (keeps the system idle).
    #[arg(long, default_value_t = 20)]
    pub wake_gap_ms: u64,
    /// Diagnosis: the synchronizer's cap on task claims started per pass.
    #[arg(long)]
    pub max_wakes: Option<usize>,
    /// Diagnosis: the relay's longest wait between reconcile ticks, milliseconds.
    #[arg(long)]
    pub max_tick_ms: Option<u64>,
    /// JSON report instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One agent count.
#[derive(Clone, Debug, Serialize)]
pub struct CoordRun {
    /// Agents.
    pub agents: usize,
    /// The makespan ÷ ideal target, when there is one.
    pub target: Option<f64>,
    /// Whether the run met every target (0 duplicates, 0 missed, ratio).
    pub meets_targets: bool,
    /// The scenario report.
    pub report: ScenarioReport,
}

/// The bench report.
#[derive(Clone, Debug, Serialize)]
pub struct CoordReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Tasks per run.
    pub tasks: usize,
    /// Work per task, ms.
    pub task_ms: u64,
    /// Relays.
    pub relays: usize,
    /// Allocation.
    pub allocation: String,
    /// Synchronizer cap on claims per pass, when overridden.
    pub max_wakes: Option<usize>,
    /// Relay tick, ms, when overridden.
    pub max_tick_ms: Option<u64>,
    /// One line per agent count.
    pub runs: Vec<CoordRun>,
    /// Wake latency at idle.
    pub wake: Option<WakeReport>,
}

/// The makespan ÷ ideal target for an agent count.
pub fn target_for(agents: usize) -> Option<f64> {
    match agents {
        30 => Some(1.10),
        300 => Some(1.25),
        _ => None,
    }
}

struct BenchBar {
    bar: ProgressBar,
}

impl Progress for BenchBar {
    fn phase(&mut self, text: &str) {
        self.bar.set_message(text.to_string());
    }

    fn update(&mut self, tally: &Tally, _relay_of: &BTreeMap<String, String>) {
        let s = tally.dag.summary(&tally.room);
        self.bar.set_position(s.done as u64);
        self.bar
            .set_message(format!("claimed {} · ready {}", s.claimed, s.ready));
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Runs the bench.
pub async fn run(
    args: CoordArgs,
    db: Option<String>,
    store: StoreOptions,
) -> anyhow::Result<CoordReport> {
    if args.agents.is_empty() || args.agents.contains(&0) || args.tasks == 0 || args.relays == 0 {
        bail!("agent counts, --tasks and --relays must be positive");
    }
    let temp = std::env::temp_dir().join(format!(
        "huddle-bench-coord-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    if db.is_none() {
        std::fs::create_dir_all(&temp).map_err(|e| {
            anyhow::anyhow!(
                "cannot create a temporary directory {}: {e}",
                temp.display()
            )
        })?;
    }
    let result = run_all(&args, db.as_deref(), &store, &temp).await;
    if db.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    result
}

async fn run_all(
    args: &CoordArgs,
    db: Option<&str>,
    store: &StoreOptions,
    temp: &std::path::Path,
) -> anyhow::Result<CoordReport> {
    let work = Duration::from_millis(args.task_ms.max(1));
    let mut workload = Workload::independent(args.tasks, work);
    let mut relay = RelayOptions::default();
    if let Some(w) = args.max_wakes {
        relay.sync.max_wakes_per_pass = w.max(1);
    }
    if let Some(t) = args.max_tick_ms {
        relay.max_tick = Duration::from_millis(t.max(1));
    }
    let mut runs = Vec::new();
    let mut backend = String::from("sqlite");
    for (i, &agents) in args.agents.iter().enumerate() {
        let db = match db {
            Some(d) => d.to_string(),
            None => temp.join(format!("coord-{i}.db")).display().to_string(),
        };
        let mut config = vec![(
            "allocation".to_string(),
            args.allocation.as_str().to_string(),
        )];
        match args.allocation {
            AllocationArg::Push => {
                workload.assign_round_robin(&scenario::agent_names(agents));
            }
            AllocationArg::Bid => config.push(("bid-window".into(), "100ms".into())),
            AllocationArg::Pull => {}
        }
        let options = ScenarioOptions {
            db,
            store: store.clone(),
            room: Some(format!(
                "coord-{agents}-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or_default()
            )),
            agents,
            relays: args.relays,
            config,
            failure_rate: 0.0,
            seed: 1,
            timeout: Duration::from_secs(3600),
            stall: Duration::from_secs(60).max(work * 4),
            relay: relay.clone(),
        };
        tracing::info!(agents, "coordination scenario run");
        let report = if args.json {
            scenario::run(&options, &workload, &mut Quiet).await?
        } else {
            let bar = ProgressBar::new(args.tasks as u64);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} {agents:>4} agents [{{bar:30}}] {{pos}}/{{len}} done  {{msg}}"
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            scenario::run(&options, &workload, &mut BenchBar { bar }).await?
        };
        backend = report.backend.clone();
        let target = target_for(agents);
        let meets_targets = report.clean() && target.is_none_or(|t| report.makespan.ratio <= t);
        runs.push(CoordRun {
            agents,
            target,
            meets_targets,
            report,
        });
    }
    let wake = if args.wake_samples > 0 {
        let db = match db {
            Some(d) => d.to_string(),
            None => temp.join("wake.db").display().to_string(),
        };
        let spinner = if args.json {
            ProgressBar::hidden()
        } else {
            ProgressBar::new_spinner()
        };
        spinner.set_message(format!("wake latency: {} probes", args.wake_samples));
        spinner.enable_steady_tick(Duration::from_millis(200));
        let w = scenario::wake_latency(
            &db,
            store,
            args.wake_samples,
            Duration::from_millis(args.wake_gap_ms),
        )
        .await?;
        spinner.finish_and_clear();
        Some(w)
    } else {
        None
    };
    Ok(CoordReport {
        backend,
        tasks: args.tasks,
        task_ms: args.task_ms,
        relays: args.relays,
        allocation: args.allocation.as_str().to_string(),
        max_wakes: args.max_wakes,
        max_tick_ms: args.max_tick_ms,
        runs,
        wake,
    })
}

/// The table.
pub fn render(r: &CoordReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "coordination scenario on {}: {} independent tasks x {} ms, {} relays, allocation {}{}{}",
        r.backend,
        r.tasks,
        r.task_ms,
        r.relays,
        r.allocation,
        r.max_wakes
            .map(|w| format!(", max wakes/pass {w}"))
            .unwrap_or_default(),
        r.max_tick_ms
            .map(|t| format!(", max tick {t} ms"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "{:>6} {:>5} {:>6} {:>4} {:>9} {:>9} {:>6} {:>7} {:>16} {:>13} {:>8} {:>6}",
        "agents",
        "done",
        "missed",
        "dup",
        "makespan",
        "ideal",
        "ratio",
        "target",
        "pickup p50/99",
        "claims won/try",
        "acq ms",
        "conv"
    );
    for run in &r.runs {
        let rep = &run.report;
        let (won, tried, acq_ms) = rep.per_relay.iter().fold((0, 0, 0.0), |(w, t, a), l| {
            (
                w + l.store.task_won,
                t + l.store.task_acquires,
                a + l.store.acquire_mean_ms / rep.per_relay.len().max(1) as f64,
            )
        });
        let dup = rep.duplicates.accepted.max(rep.duplicates.raw_rows);
        let _ = writeln!(
            s,
            "{:>6} {:>5} {:>6} {:>4} {:>9} {:>9} {:>6.3} {:>7} {:>16} {:>13} {:>8.2} {:>6}",
            run.agents,
            rep.done,
            rep.missed,
            dup,
            scenario::secs(rep.makespan.makespan_ms),
            scenario::secs(rep.makespan.ideal_ms),
            rep.makespan.ratio,
            match run.target {
                Some(t) if run.meets_targets => format!("<={t:.2} ok"),
                Some(t) => format!("<={t:.2} MISS"),
                None if run.meets_targets => "-".to_string(),
                None => "MISS".to_string(),
            },
            format!("{:.0}/{:.0} ms", rep.pickup.p50_ms, rep.pickup.p99_ms),
            format!("{won}/{tried}"),
            acq_ms,
            if rep.converged { "yes" } else { "NO" }
        );
        if let Some(why) = &rep.stopped_early {
            let _ = writeln!(s, "       stopped early: {why}");
        }
    }
    if let Some(w) = &r.wake {
        let _ = writeln!(
            s,
            "wake latency on {} ({} probes at idle, {} lost): append->arrival p50 {:.2} ms p99 {:.2} ms; commit->arrival p50 {:.2} ms p99 {:.2} ms; append alone p50 {:.2} ms",
            w.backend,
            w.samples,
            w.lost,
            w.append_to_arrival.p50_ms,
            w.append_to_arrival.p99_ms,
            w.commit_to_arrival.p50_ms,
            w.commit_to_arrival.p99_ms,
            w.append.p50_ms
        );
    }
    s
}
