//! The coordination-strategies bench: independent tasks with fixed work, one
//! scenario run per agent count (each in a fresh room, on a database the caller
//! picks), judged against makespan targets, then the wake latency at idle.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use huddle_relay::RelayOptions;
use huddle_store::StoreOptions;
use serde::Serialize;
use tracing::info;

use crate::error::{Result, SimError};
use crate::report::ScenarioReport;
use crate::runner::{self, Allocation, Progress, ScenarioOptions};
use crate::wake::{wake_latency, WakeReport};
use crate::workload::Workload;

/// The DAG a run works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordShape {
    /// Independent tasks (the coordination-strategies scenario).
    Independent,
    /// A chain of `chain` steps beside independent tasks
    /// ([`Workload::chain_and_fan`]): the DAG critical-path-first is measured on.
    Chain {
        /// Steps of the chain (the rest of `tasks` are independent).
        chain: usize,
    },
}

/// The order the owner's plan lets relays hand the frontier out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontierOrder {
    /// One `!delegate`: the parser computes every task's critical path and the
    /// longest goes first.
    CriticalPath,
    /// One `!delegate` per task: no critical path is known, the frontier goes by id.
    Id,
}

impl FrontierOrder {
    /// `critical-path` or `id`.
    pub fn name(self) -> &'static str {
        match self {
            FrontierOrder::CriticalPath => "critical-path",
            FrontierOrder::Id => "id",
        }
    }
}

/// What the bench runs.
#[derive(Clone, Debug)]
pub struct CoordOptions {
    /// The DAG.
    pub shape: CoordShape,
    /// How the frontier is ordered.
    pub order: FrontierOrder,
    /// Agent counts, one run each.
    pub agents: Vec<usize>,
    /// Independent tasks per run.
    pub tasks: usize,
    /// Work per task.
    pub task_work: Duration,
    /// In-process relays (agents spread round-robin).
    pub relays: usize,
    /// Task allocation.
    pub allocation: Allocation,
    /// Store options every handle starts from.
    pub store: StoreOptions,
    /// Diagnosis: the synchronizer's cap on task claims started per pass.
    pub max_wakes: Option<usize>,
    /// Diagnosis: the relay's longest wait between reconcile ticks.
    pub max_tick: Option<Duration>,
    /// Wake-latency probes (0 skips the measurement).
    pub wake_samples: usize,
    /// Pause between wake probes.
    pub wake_gap: Duration,
}

/// What the bench is about to do, for the caller's display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordStep {
    /// A scenario run with this many agents.
    Run {
        /// Agents.
        agents: usize,
    },
    /// The wake-latency probes.
    Wake {
        /// Probes.
        samples: usize,
    },
}

/// One agent count.
#[derive(Clone, Debug, Serialize)]
pub struct CoordRun {
    /// Agents.
    pub agents: usize,
    /// The makespan ÷ ideal target, when there is one.
    pub target: Option<f64>,
    /// Whether the run met every target (0 duplicates, 0 missed, 1.00 turns per task
    /// without failures, ratio).
    pub meets_targets: bool,
    /// The scenario report.
    pub report: ScenarioReport,
}

/// The bench report.
#[derive(Clone, Debug, Serialize)]
pub struct CoordReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// `independent`, or `chain` (with `chain` steps).
    pub shape: String,
    /// Steps of the chain (`chain` shape).
    pub chain: Option<usize>,
    /// `critical-path` or `id`.
    pub order: String,
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

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// Runs the bench. `database` names the database of each step (`coord-0`,
/// `coord-1`, ..., `wake`; the caller may return the same URL for all), and
/// `display` gives the progress display of each step.
pub async fn run(
    options: &CoordOptions,
    database: impl Fn(&str) -> String,
    mut display: impl FnMut(CoordStep) -> Box<dyn Progress>,
) -> Result<CoordReport> {
    if options.agents.is_empty()
        || options.agents.contains(&0)
        || options.tasks == 0
        || options.relays == 0
    {
        return Err(SimError::Invalid(
            "agent counts, --tasks and --relays must be positive".into(),
        ));
    }
    let work = options.task_work.max(Duration::from_millis(1));
    let mut workload = match options.shape {
        CoordShape::Independent => Workload::independent(options.tasks, work),
        CoordShape::Chain { chain } => {
            let chain = chain.clamp(1, options.tasks);
            Workload::chain_and_fan(chain, options.tasks - chain, work)
        }
    };
    workload.one_task_per_command = options.order == FrontierOrder::Id;
    let mut relay = RelayOptions::default();
    if let Some(w) = options.max_wakes {
        relay.sync.max_wakes_per_pass = w.max(1);
    }
    if let Some(t) = options.max_tick {
        relay.max_tick = t.max(Duration::from_millis(1));
    }
    let mut runs = Vec::new();
    let mut backend = String::from("sqlite");
    for (i, &agents) in options.agents.iter().enumerate() {
        let mut config = vec![(
            "allocation".to_string(),
            options.allocation.name().to_string(),
        )];
        options
            .allocation
            .configure(&mut workload, agents, &mut config);
        let scenario = ScenarioOptions {
            db: database(&format!("coord-{i}")),
            store: options.store.clone(),
            room: Some(format!("coord-{agents}-{}", unix_millis())),
            agents,
            relays: options.relays,
            config,
            failure_rate: 0.0,
            seed: 1,
            timeout: Duration::from_secs(3600),
            stall: Duration::from_secs(60).max(work * 4),
            relay: relay.clone(),
        };
        info!(agents, "coordination scenario run");
        let mut progress = display(CoordStep::Run { agents });
        let report = runner::run(&scenario, &workload, &mut *progress).await?;
        backend = report.backend.clone();
        // The targets are the independent scenario's.
        let target = target_for(agents).filter(|_| options.shape == CoordShape::Independent);
        // Without failed turns every task runs exactly once: 1.00 turns per task.
        let once = report.turns.failed > 0 || report.turns_per_task() <= 1.0;
        let meets_targets =
            report.clean() && once && target.is_none_or(|t| report.makespan.ratio <= t);
        runs.push(CoordRun {
            agents,
            target,
            meets_targets,
            report,
        });
    }
    let wake = if options.wake_samples > 0 {
        let mut progress = display(CoordStep::Wake {
            samples: options.wake_samples,
        });
        let w = wake_latency(
            &database("wake"),
            &options.store,
            options.wake_samples,
            options.wake_gap,
        )
        .await;
        progress.finish();
        Some(w?)
    } else {
        None
    };
    Ok(CoordReport {
        backend,
        shape: match options.shape {
            CoordShape::Independent => "independent",
            CoordShape::Chain { .. } => "chain",
        }
        .to_string(),
        chain: match options.shape {
            CoordShape::Chain { chain } => Some(chain),
            CoordShape::Independent => None,
        },
        order: options.order.name().to_string(),
        tasks: options.tasks,
        task_ms: options.task_work.as_millis() as u64,
        relays: options.relays,
        allocation: options.allocation.name().to_string(),
        max_wakes: options.max_wakes,
        max_tick_ms: options.max_tick.map(|t| t.as_millis() as u64),
        runs,
        wake,
    })
}
