//! `huddle bench coord`: the coordination-strategies scenario (300 URLs, fixed work
//! per URL, 6 / 30 / 300 agents over 3 relays) and the wake latency between two
//! store handles.
//!
//! Each agent count runs in a fresh room (on SQLite without `--db`: a fresh database
//! file) through `huddle_sim::coord`, the same runner as `huddle demo`. Targets:
//! duplicates 0, missed 0, makespan ÷ ideal ≤ 1.10 at 30 agents and ≤ 1.25 at 300.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use huddle_sim::coord::{self, CoordOptions, CoordReport, CoordShape, CoordStep, FrontierOrder};
use huddle_sim::{Progress, Quiet, Tally};
use huddle_store::StoreOptions;
use indicatif::{ProgressBar, ProgressStyle};

use crate::demo::AllocationArg;
use crate::scratch::ScratchDir;

/// Flags of `huddle bench coord`.
#[derive(Args, Debug, Clone)]
pub struct CoordArgs {
    /// Agent counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "6,30,300")]
    pub agents: Vec<usize>,
    /// Tasks (URLs; with `--shape chain`, the chain's steps and independent ones).
    #[arg(long, default_value_t = 300)]
    pub tasks: usize,
    /// The DAG: independent tasks, or a chain of `--chain` steps beside independent
    /// ones (where critical-path-first matters).
    #[arg(long, value_enum, default_value_t = ShapeArg::Independent)]
    pub shape: ShapeArg,
    /// Steps of the chain (`--shape chain`).
    #[arg(long, default_value_t = 20)]
    pub chain: usize,
    /// How the frontier is handed out: by critical path (one `!delegate`, the
    /// default) or by id (each task delegated alone, so no path is known).
    #[arg(long, value_enum, default_value_t = OrderArg::CriticalPath)]
    pub order: OrderArg,
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

/// `--shape`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeArg {
    /// Independent tasks.
    Independent,
    /// A chain beside independent tasks.
    Chain,
}

/// `--order`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderArg {
    /// Longest critical path first.
    CriticalPath,
    /// By task id.
    Id,
}

/// A progress bar of tasks done, or a spinner during the wake probes.
struct BenchBar {
    bar: ProgressBar,
}

impl BenchBar {
    fn new(step: CoordStep, tasks: usize) -> Self {
        let bar = match step {
            CoordStep::Run { agents } => {
                let bar = ProgressBar::new(tasks as u64);
                bar.set_style(
                    ProgressStyle::with_template(&format!(
                        "{{spinner}} {agents:>4} agents [{{bar:30}}] {{pos}}/{{len}} done  {{msg}}"
                    ))
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar
            }
            CoordStep::Wake { samples } => {
                let bar = ProgressBar::new_spinner();
                bar.set_message(format!("wake latency: {samples} probes"));
                bar
            }
        };
        bar.enable_steady_tick(Duration::from_millis(200));
        BenchBar { bar }
    }
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

/// Runs the bench; without `--db`, each run gets a fresh SQLite file in a temporary
/// directory.
pub async fn run(
    args: CoordArgs,
    db: Option<String>,
    store: StoreOptions,
) -> anyhow::Result<CoordReport> {
    let scratch = match db {
        Some(_) => None,
        None => Some(ScratchDir::create("huddle-bench-coord")?),
    };
    let database = |name: &str| match &scratch {
        Some(dir) => dir.db(&format!("{name}.db")),
        None => db.clone().unwrap_or_default(),
    };
    let options = CoordOptions {
        shape: match args.shape {
            ShapeArg::Independent => CoordShape::Independent,
            ShapeArg::Chain => CoordShape::Chain { chain: args.chain },
        },
        order: match args.order {
            OrderArg::CriticalPath => FrontierOrder::CriticalPath,
            OrderArg::Id => FrontierOrder::Id,
        },
        agents: args.agents,
        tasks: args.tasks,
        task_work: Duration::from_millis(args.task_ms),
        relays: args.relays,
        allocation: args.allocation.with_window("100ms"),
        store,
        max_wakes: args.max_wakes,
        max_tick: args.max_tick_ms.map(Duration::from_millis),
        wake_samples: args.wake_samples,
        wake_gap: Duration::from_millis(args.wake_gap_ms),
    };
    let tasks = options.tasks;
    let json = args.json;
    let report = coord::run(&options, database, |step| -> Box<dyn Progress> {
        if json {
            Box::new(Quiet)
        } else {
            Box::new(BenchBar::new(step, tasks))
        }
    })
    .await?;
    Ok(report)
}
