//! `huddle demo`: simulated agents in several relays work a delegated task DAG, with
//! a live view of the fold and a report at the end.
//!
//! The work is done by `huddle_sim`; this module picks the database, turns the
//! flags into a scenario, draws the progress display and prints the report.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, ValueEnum};
use huddle_relay::RelayOptions;
use huddle_sim::{render, Allocation, Progress, Quiet, ScenarioOptions, Tally, Workload};
use huddle_store::StoreOptions;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::scratch::ScratchDir;
use crate::state_cmds::emit;

/// How ready tasks are allocated (`!config allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AllocationArg {
    /// Any free agent claims a ready task.
    Pull,
    /// The owner's plan names an assignee per task (round-robin); only it claims.
    Push,
    /// Agents bid during the bid window; the best bid claims.
    Bid,
}

impl AllocationArg {
    /// The allocation, with `bid_window` under `bid`.
    pub fn with_window(self, bid_window: &str) -> Allocation {
        match self {
            AllocationArg::Pull => Allocation::Pull,
            AllocationArg::Push => Allocation::Push,
            AllocationArg::Bid => Allocation::Bid {
                window: bid_window.to_string(),
            },
        }
    }
}

/// Who answers an addressed message (`!config responder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ResponderArg {
    /// The first claim wins.
    Race,
    /// `responder-agent` first.
    Designated,
    /// By role rank.
    RolePriority,
}

impl ResponderArg {
    fn as_str(self) -> &'static str {
        match self {
            ResponderArg::Race => "race",
            ResponderArg::Designated => "designated",
            ResponderArg::RolePriority => "role-priority",
        }
    }
}

/// Flags of `huddle demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Simulated agents.
    #[arg(long, default_value_t = 6)]
    pub agents: usize,
    /// In-process relays, each with its own database handle; agents are spread
    /// round-robin.
    #[arg(long, default_value_t = 3)]
    pub relays: usize,
    /// Tasks in the delegated DAG (a market-research pipeline).
    #[arg(long, default_value_t = 300)]
    pub tasks: usize,
    /// Task allocation, set with `!config` before delegating.
    #[arg(long, value_enum, default_value_t = AllocationArg::Pull)]
    pub allocation: AllocationArg,
    /// Responder policy, set with `!config` before delegating.
    #[arg(long, value_enum, default_value_t = ResponderArg::Race)]
    pub responder: ResponderArg,
    /// Bid window under `--allocation bid` (`!config bid-window`).
    #[arg(long, default_value = "200ms")]
    pub bid_window: String,
    /// Claim lease (`!config claim-ttl`): a few multiples of the longest task, so a
    /// lapsed claim is re-taken quickly.
    #[arg(long, default_value = "5s")]
    pub claim_ttl: String,
    /// Attempts per task before it fails for good (`!config max-attempts`).
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// Probability that a simulated turn fails (each attempt rolls again).
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Milliseconds of one unit of work; tasks take 0.4 - 5 units.
    #[arg(long, default_value_t = 150)]
    pub turn_ms: u64,
    /// Seed of the DAG and of the simulated agents.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Room name [default: demo, or demo-N when taken].
    #[arg(long)]
    pub room: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Machine-readable report on stdout, no progress display.
    #[arg(long)]
    pub json: bool,
}

/// Runs the demo; fails (after printing the report) when a task was missed or
/// completed twice.
pub async fn run(args: DemoArgs, db: Option<String>, store: StoreOptions) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.failure_rate) {
        bail!(
            "--failure-rate must be within 0.0..=1.0, got {}",
            args.failure_rate
        );
    }
    if args.tasks == 0 || args.tasks > 10_000 {
        bail!("--tasks must be within 1..=10000, got {}", args.tasks);
    }
    if args.agents == 0 || args.relays == 0 {
        bail!("--agents and --relays must be at least 1");
    }
    let (db, temp) = match db {
        Some(db) => (db, None),
        None => {
            let t = ScratchDir::create("huddle-demo")?;
            (t.db("huddle.db"), Some(t))
        }
    };
    let mut workload = Workload::pipeline(
        args.tasks,
        args.seed,
        Duration::from_millis(args.turn_ms.max(1)),
    );
    let allocation = args.allocation.with_window(&args.bid_window);
    let mut config = vec![
        ("allocation".to_string(), allocation.name().to_string()),
        ("responder".to_string(), args.responder.as_str().to_string()),
        ("max-attempts".to_string(), args.max_attempts.to_string()),
        ("claim-ttl".to_string(), args.claim_ttl.clone()),
    ];
    allocation.configure(&mut workload, args.agents, &mut config);
    let options = ScenarioOptions {
        db: db.clone(),
        store,
        room: args.room.clone(),
        agents: args.agents,
        relays: args.relays,
        config,
        failure_rate: args.failure_rate,
        seed: args.seed,
        timeout: Duration::from_secs(args.timeout.max(1)),
        stall: Duration::from_secs(60).max(workload.longest_task() * 4),
        relay: RelayOptions::default(),
    };
    let report = if args.json {
        huddle_sim::run(&options, &workload, &mut Quiet).await?
    } else {
        let mut view = LiveView::new(args.tasks, args.agents);
        eprintln!(
            "huddle demo: {} tasks, {} agents on {} relays, database {}",
            args.tasks,
            args.agents,
            args.relays,
            if temp.is_some() {
                format!("{db} (temporary; pass --db to keep it)")
            } else {
                db.clone()
            }
        );
        huddle_sim::run(&options, &workload, &mut view).await?
    };
    if args.json {
        emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        let mut text = render::scenario(&report);
        if temp.is_none() {
            text.push_str(&format!(
                "\n  inspect: huddle --db {db} board --room {r}   |   huddle --db {db} tasks --room {r}\n",
                r = report.room
            ));
        }
        emit(&text)?;
    }
    if !report.clean() {
        bail!(
            "{} task(s) missed, {} completed more than once",
            report.missed,
            report.duplicated_tasks()
        );
    }
    Ok(())
}

/// Board lines shown at most.
const BOARD_LINES: usize = 12;

/// The live display: a progress bar of tasks done, the fold's counts, and one line
/// per agent (who works on what).
struct LiveView {
    _multi: MultiProgress,
    phase: ProgressBar,
    tasks: ProgressBar,
    board: Vec<ProgressBar>,
    more: Option<ProgressBar>,
}

impl LiveView {
    fn new(tasks: usize, agents: usize) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let phase = multi.add(ProgressBar::new_spinner());
        phase.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        phase.enable_steady_tick(Duration::from_millis(120));
        let bar = multi.add(ProgressBar::new(tasks as u64));
        bar.set_style(
            ProgressStyle::with_template("  [{bar:40}] {pos}/{len} done  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let line = ProgressStyle::with_template("  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        let board = (0..agents.min(BOARD_LINES))
            .map(|_| {
                let b = multi.add(ProgressBar::new_spinner());
                b.set_style(line.clone());
                b
            })
            .collect();
        let more = (agents > BOARD_LINES).then(|| {
            let b = multi.add(ProgressBar::new_spinner());
            b.set_style(line.clone());
            b
        });
        LiveView {
            _multi: multi,
            phase,
            tasks: bar,
            board,
            more,
        }
    }
}

impl Progress for LiveView {
    fn phase(&mut self, text: &str) {
        self.phase.set_message(text.to_string());
    }

    fn update(&mut self, tally: &Tally, relay_of: &BTreeMap<String, String>) {
        self.tasks
            .set_position(tally.dag.summary(&tally.room).done as u64);
        self.tasks.set_message(render::task_counts(tally));
        let mut working = 0usize;
        let mut lines = Vec::new();
        for (agent, relay) in relay_of {
            let Some((line, busy)) = render::agent_status(tally, agent, relay) else {
                return;
            };
            working += usize::from(busy);
            lines.push(line);
        }
        for (bar, line) in self.board.iter().zip(&lines) {
            bar.set_message(line.clone());
        }
        if let Some(more) = &self.more {
            more.set_message(format!(
                "… and {} more agents ({working} working in all)",
                lines.len().saturating_sub(BOARD_LINES)
            ));
        }
    }

    fn finish(&mut self) {
        for b in self.board.iter().chain(self.more.iter()) {
            b.finish_and_clear();
        }
        self.tasks.finish();
        self.phase.finish_and_clear();
    }
}
