//! The coordination scenario shared by `huddle demo` and `huddle bench coord`: a
//! workload (a task DAG with known per-task work), simulated agents spread over
//! several in-process relays, each relay with its own store handle, and one report
//! computed from a fold of the ledger.
//!
//! ```text
//!   owner handle ── room.created, !config, !delegate ──┐
//!   relay-0 handle ── Relay(agents 0, 3, ...) ─────────┤
//!   relay-1 handle ── Relay(agents 1, 4, ...) ─────────┼── one ledger (SQLite file or Postgres)
//!   relay-2 handle ── Relay(agents 2, 5, ...) ─────────┤
//!   observer handle ── Subscription -> Tally (fold) ───┘──> progress, report
//! ```
//!
//! Everything in the report comes from the ledger (database clock), except the relay
//! summaries and the store meters, which the relays' own handles count.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_trait::async_trait;
use huddle_core::board::{SubjectKind, TurnFailedBody, TurnRepliedBody};
use huddle_core::sync::LocalAgent;
use huddle_core::tasks::{TaskClaimedBody, TaskCompletedBody};
use huddle_core::{
    Board, Fold, Interaction, InteractionId, Limits, NewInteraction, Position, Role, TaskDag,
    TaskStatus, Timestamp, Verb,
};
use huddle_relay::driver::{Driver, SplitMix64, TurnOutcome, TurnRequest};
use huddle_relay::{HostedAgent, Relay, RelayOptions, RelaySummary};
use huddle_store::{
    Acquired, Appended, ClaimRow, ClaimState, Claims, Doorbell, Epoch, Fence, Ledger, ReadBatch,
    Store, StoreOptions, Subscription,
};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The owner of scenario rooms.
pub const OWNER: &str = "owner";

/// Most tasks one `!delegate` may carry (the parser's limit).
const DELEGATE_CHUNK: usize = 1000;

// ---------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------

/// One task of a workload, with the work a simulated agent spends on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkTask {
    /// Task id.
    pub id: String,
    /// What to do.
    pub label: String,
    /// Tasks that must be done first.
    pub deps: Vec<String>,
    /// How long a simulated agent works on it.
    pub work: Duration,
    /// Tokens a successful turn costs.
    pub tokens: u64,
    /// The `push` assignee, if any.
    pub assignee: Option<String>,
}

/// A task DAG with known work per task, in dependency order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `pipeline` or `independent`.
    pub kind: &'static str,
    /// The tasks; every task comes after its dependencies.
    pub tasks: Vec<WorkTask>,
}

const COMPANIES: &[&str] = &[
    "Acme",
    "Northwind",
    "Globex",
    "Initech",
    "Umbrella",
    "Hooli",
    "Vandelay",
    "Soylent",
    "Tyrell",
    "Cyberdyne",
    "Wonka",
    "Oscorp",
    "Aperture",
    "Monarch",
    "Stark",
    "Wayne",
    "Dunder",
    "Massive",
    "Prestige",
    "Sirius",
];
const SECTORS: &[&str] = &[
    "Analytics",
    "Cloud",
    "Labs",
    "Systems",
    "Data",
    "Networks",
    "Robotics",
    "Health",
    "Pay",
    "Logistics",
];
const SEGMENTS: &[&str] = &[
    "fintech",
    "health",
    "logistics",
    "developer tools",
    "retail",
    "security",
    "data platform",
    "robotics",
];
/// Competitors per segment comparison.
const SEGMENT_SIZE: usize = 8;

fn ms(units: f64, unit: Duration) -> Duration {
    Duration::from_secs_f64((units * unit.as_secs_f64()).max(0.0))
}

impl Workload {
    /// A market-research pipeline of exactly `n` tasks, deterministic from `seed`:
    /// scope → sources / rubric → per competitor fetch → extract → summarize → score
    /// → per-segment comparison → draft → review → publish. Work is `unit` × a
    /// per-stage weight (0.5 – 4) with ±25 % seeded jitter. Fewer than 11 tasks give
    /// independent fetches.
    pub fn pipeline(n: usize, seed: u64, unit: Duration) -> Self {
        let mut rng = SplitMix64::new(seed, "huddle-demo-pipeline");
        let mut tasks = Vec::with_capacity(n);
        let mut push = |id: String, label: String, deps: Vec<String>, weight: f64| {
            let jitter = 0.75 + 0.5 * rng.next_f64();
            let units = weight * jitter;
            tasks.push(WorkTask {
                id,
                label,
                deps,
                work: ms(units, unit),
                tokens: (600.0 * units).round() as u64,
                assignee: None,
            });
        };
        let base = |k: usize| 6 + 4 * k + k.div_ceil(SEGMENT_SIZE);
        let names = company_names(seed, n);
        if n < base(1) {
            for (i, name) in names.iter().enumerate().take(n) {
                push(
                    format!("fetch-{:03}", i + 1),
                    format!("fetch the pricing and product pages of {name}"),
                    Vec::new(),
                    1.0,
                );
            }
            return Workload {
                kind: "pipeline",
                tasks,
            };
        }
        let mut k = 1;
        while base(k + 1) <= n {
            k += 1;
        }
        let extras = n - base(k);
        push(
            "scope".into(),
            "define the research scope and the questions to answer".into(),
            vec![],
            1.0,
        );
        push(
            "sources".into(),
            format!("compile the source list for {k} competitors"),
            vec!["scope".into()],
            1.5,
        );
        push(
            "rubric".into(),
            "draft the scoring rubric (price, features, positioning)".into(),
            vec!["scope".into()],
            1.5,
        );
        for (i, name) in names.iter().enumerate().take(k) {
            let c = i + 1;
            push(
                format!("fetch-{c:03}"),
                format!("fetch the pricing and product pages of {name}"),
                vec!["sources".into()],
                1.0,
            );
            push(
                format!("extract-{c:03}"),
                format!("extract features and prices from the pages of {name}"),
                vec![format!("fetch-{c:03}")],
                1.5,
            );
            push(
                format!("summarize-{c:03}"),
                format!("summarize the positioning of {name} in five bullets"),
                vec![format!("extract-{c:03}")],
                2.0,
            );
            push(
                format!("score-{c:03}"),
                format!("score {name} against the rubric"),
                vec![format!("summarize-{c:03}"), "rubric".into()],
                1.0,
            );
        }
        let segments = k.div_ceil(SEGMENT_SIZE);
        let mut draft_deps = Vec::new();
        for s in 0..segments {
            let members: Vec<String> = (s * SEGMENT_SIZE..((s + 1) * SEGMENT_SIZE).min(k))
                .map(|i| format!("score-{:03}", i + 1))
                .collect();
            let segment = SEGMENTS[s % SEGMENTS.len()];
            let round = s / SEGMENTS.len();
            let label = if round == 0 {
                format!("compare the {segment} segment on price, features and positioning")
            } else {
                format!(
                    "compare the {segment} segment (group {}) on price, features and positioning",
                    round + 1
                )
            };
            let id = format!("compare-{:02}", s + 1);
            draft_deps.push(id.clone());
            push(id, label, members, 2.5);
        }
        for e in 0..extras {
            let id = format!("interview-{}", e + 1);
            draft_deps.push(id.clone());
            push(
                id,
                format!("summarize analyst interview #{}", e + 1),
                vec!["sources".into()],
                2.0,
            );
        }
        push(
            "draft".into(),
            "draft the market report".into(),
            draft_deps,
            4.0,
        );
        push(
            "review".into(),
            "review the report for unsupported claims".into(),
            vec!["draft".into()],
            2.0,
        );
        push(
            "publish".into(),
            "publish the report to the owner".into(),
            vec!["review".into()],
            0.5,
        );
        Workload {
            kind: "pipeline",
            tasks,
        }
    }

    /// The coordination-strategies scenario: `n` independent URLs, each `work` long.
    pub fn independent(n: usize, work: Duration) -> Self {
        let tasks = (1..=n)
            .map(|i| WorkTask {
                id: format!("url-{i:03}"),
                label: format!("fetch and summarize https://competitor-{i:03}.example/pricing"),
                deps: Vec::new(),
                work,
                tokens: 800,
                assignee: None,
            })
            .collect();
        Workload {
            kind: "independent",
            tasks,
        }
    }

    /// Assigns tasks round-robin to `agents` (the plan an orchestrator would push).
    pub fn assign_round_robin(&mut self, agents: &[String]) {
        if agents.is_empty() {
            return;
        }
        for (i, t) in self.tasks.iter_mut().enumerate() {
            t.assignee = Some(agents[i % agents.len()].clone());
        }
    }

    /// Sum of every task's work.
    pub fn total_work(&self) -> Duration {
        self.tasks.iter().map(|t| t.work).sum()
    }

    /// The longest dependency chain, by work.
    pub fn critical_path(&self) -> Duration {
        let mut finish: HashMap<&str, Duration> = HashMap::new();
        let mut best = Duration::ZERO;
        for t in &self.tasks {
            let start = t
                .deps
                .iter()
                .filter_map(|d| finish.get(d.as_str()))
                .max()
                .copied()
                .unwrap_or_default();
            let end = start + t.work;
            best = best.max(end);
            finish.insert(&t.id, end);
        }
        best
    }

    /// The makespan of a greedy list schedule with zero coordination overhead: each
    /// free agent takes the ready task with the smallest id. What the DAG's shape
    /// allows `agents` agents when claiming costs nothing.
    pub fn greedy_makespan(&self, agents: usize) -> Duration {
        let agents = agents.max(1);
        let index: HashMap<&str, usize> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        let mut missing: Vec<usize> = self.tasks.iter().map(|t| t.deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for (i, t) in self.tasks.iter().enumerate() {
            for d in &t.deps {
                if let Some(&j) = index.get(d.as_str()) {
                    dependents[j].push(i);
                }
            }
        }
        let mut ready: std::collections::BTreeSet<(&str, usize)> = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| missing[*i] == 0)
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        // (finish time, task) of running tasks.
        let mut running: std::collections::BTreeSet<(Duration, usize)> = Default::default();
        let mut now = Duration::ZERO;
        let mut free = agents;
        loop {
            while free > 0 {
                let Some(first) = ready.iter().next().copied() else {
                    break;
                };
                ready.remove(&first);
                running.insert((now + self.tasks[first.1].work, first.1));
                free -= 1;
            }
            let Some(next) = running.iter().next().copied() else {
                return now;
            };
            running.remove(&next);
            now = next.0;
            free += 1;
            for &d in &dependents[next.1] {
                missing[d] -= 1;
                if missing[d] == 0 {
                    ready.insert((self.tasks[d].id.as_str(), d));
                }
            }
        }
    }

    /// The `!delegate` messages that create the workload (at most 1,000 tasks each,
    /// in dependency order, so each message only names tasks created before it).
    pub fn delegate_messages(&self) -> Vec<String> {
        self.tasks
            .chunks(DELEGATE_CHUNK)
            .map(|chunk| {
                let mut text = String::from("!delegate\n");
                for t in chunk {
                    text.push_str(&t.id);
                    text.push_str(": ");
                    text.push_str(&t.label);
                    if !t.deps.is_empty() {
                        text.push_str(" [after ");
                        text.push_str(&t.deps.join(", "));
                        text.push(']');
                    }
                    if let Some(a) = &t.assignee {
                        text.push_str(" @");
                        text.push_str(a);
                    }
                    text.push('\n');
                }
                text
            })
            .collect()
    }
}

/// `k` distinct plausible company names, deterministic from `seed`.
fn company_names(seed: u64, k: usize) -> Vec<String> {
    let mut combos: Vec<String> = COMPANIES
        .iter()
        .flat_map(|c| SECTORS.iter().map(move |s| format!("{c} {s}")))
        .collect();
    let mut rng = SplitMix64::new(seed, "huddle-demo-names");
    for i in (1..combos.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        combos.swap(i, j);
    }
    (0..k)
        .map(|i| {
            let name = &combos[i % combos.len()];
            match i / combos.len() {
                0 => name.clone(),
                r => format!("{name} {}", r + 1),
            }
        })
        .collect()
}

/// Agent keys for `n` agents: first names for small groups, numbered beyond.
pub fn agent_names(n: usize) -> Vec<String> {
    const NAMES: &[&str] = &[
        "ada", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ida", "jo", "kai", "liv",
    ];
    if n <= NAMES.len() {
        NAMES[..n].iter().map(|s| s.to_string()).collect()
    } else {
        (1..=n).map(|i| format!("agent-{i:03}")).collect()
    }
}

// ---------------------------------------------------------------------------------
// The simulated agent
// ---------------------------------------------------------------------------------

/// A simulated agent that works each task for the workload's duration, fails with a
/// seeded probability (each attempt rolls again), and reports the task's tokens.
pub struct WorkloadDriver {
    work: Arc<HashMap<String, (Duration, u64)>>,
    failure_rate: f64,
    seed: u64,
    /// Duration of anything that is not a workload task (a message reply).
    other: Duration,
}

impl WorkloadDriver {
    /// A driver for `workload`.
    pub fn new(
        work: Arc<HashMap<String, (Duration, u64)>>,
        failure_rate: f64,
        seed: u64,
        other: Duration,
    ) -> Self {
        WorkloadDriver {
            work,
            failure_rate,
            seed,
            other,
        }
    }

    /// The work table of a workload.
    pub fn table(workload: &Workload) -> Arc<HashMap<String, (Duration, u64)>> {
        Arc::new(
            workload
                .tasks
                .iter()
                .map(|t| (t.id.clone(), (t.work, t.tokens)))
                .collect(),
        )
    }
}

#[async_trait]
impl Driver for WorkloadDriver {
    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome {
        let (work, tokens) = request
            .task
            .as_deref()
            .and_then(|t| self.work.get(t).copied())
            .unwrap_or((self.other, 100));
        let mut rng = SplitMix64::new(
            self.seed,
            &format!("{}|{}", request.agent, request.subject()),
        );
        let fails = rng.next_f64() < self.failure_rate;
        // A failing turn notices part-way through.
        let spent = if fails {
            work.mul_f64(0.25 + 0.5 * rng.next_f64())
        } else {
            work
        };
        tokio::select! {
            _ = cancel.cancelled() => TurnOutcome::Cancelled,
            _ = tokio::time::sleep(spent) => {
                if fails {
                    TurnOutcome::Failed { reason: "simulated failure".into(), tokens: tokens / 2 }
                } else {
                    let what = request.task.as_deref().unwrap_or("the message");
                    TurnOutcome::Replied { text: format!("{} finished {what}", request.agent), tokens }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Store meters
// ---------------------------------------------------------------------------------

/// Counters of what one relay's store handle was asked to do.
#[derive(Default)]
pub struct Meter {
    task_acquires: AtomicU64,
    task_won: AtomicU64,
    drive_acquires: AtomicU64,
    drive_won: AtomicU64,
    other_acquires: AtomicU64,
    acquire_us: AtomicU64,
    fenced_appends: AtomicU64,
    fenced_refused: AtomicU64,
    plain_appends: AtomicU64,
    append_us: AtomicU64,
    renews: AtomicU64,
    releases: AtomicU64,
}

/// A snapshot of a [`Meter`].
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MeterReport {
    /// `task/...` acquisitions (one per claim attempt on a task).
    pub task_acquires: u64,
    /// Of those, won.
    pub task_won: u64,
    /// `taskdrive/...` acquisitions.
    pub drive_acquires: u64,
    /// Of those, won.
    pub drive_won: u64,
    /// Other acquisitions (reply, drive of replies).
    pub other_acquires: u64,
    /// Mean time of one acquisition through this handle, ms (includes waiting for
    /// the handle's writer connection).
    pub acquire_mean_ms: f64,
    /// Fenced appends (claims, completions).
    pub fenced_appends: u64,
    /// Of those, refused by the fence.
    pub fenced_refused: u64,
    /// Unfenced appends (registrations, bids, command results).
    pub plain_appends: u64,
    /// Mean time of one append, ms.
    pub append_mean_ms: f64,
    /// Renewals.
    pub renews: u64,
    /// Releases.
    pub releases: u64,
}

impl Meter {
    fn report(&self) -> MeterReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let acquires =
            get(&self.task_acquires) + get(&self.drive_acquires) + get(&self.other_acquires);
        let appends = get(&self.fenced_appends) + get(&self.plain_appends);
        let mean = |us: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                round2(us as f64 / n as f64 / 1000.0)
            }
        };
        MeterReport {
            task_acquires: get(&self.task_acquires),
            task_won: get(&self.task_won),
            drive_acquires: get(&self.drive_acquires),
            drive_won: get(&self.drive_won),
            other_acquires: get(&self.other_acquires),
            acquire_mean_ms: mean(get(&self.acquire_us), acquires),
            fenced_appends: get(&self.fenced_appends),
            fenced_refused: get(&self.fenced_refused),
            plain_appends: get(&self.plain_appends),
            append_mean_ms: mean(get(&self.append_us), appends),
            renews: get(&self.renews),
            releases: get(&self.releases),
        }
    }
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// A store that counts what passes through it; otherwise the inner store.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    meter: Arc<Meter>,
}

impl MeteredStore {
    /// Wraps `inner`, counting into `meter`.
    pub fn new(inner: Arc<dyn Store>, meter: Arc<Meter>) -> Self {
        MeteredStore { inner, meter }
    }
}

#[async_trait]
impl Ledger for MeteredStore {
    fn limits(&self) -> &Limits {
        self.inner.limits()
    }

    async fn append(&self, batch: Vec<NewInteraction>) -> huddle_store::Result<Vec<Appended>> {
        let t = Instant::now();
        let r = self.inner.append(batch).await;
        self.meter.plain_appends.fetch_add(1, Ordering::Relaxed);
        add_elapsed(&self.meter.append_us, t);
        r
    }

    async fn append_fenced(
        &self,
        fence: &Fence,
        batch: Vec<NewInteraction>,
    ) -> huddle_store::Result<Vec<Appended>> {
        let t = Instant::now();
        let r = self.inner.append_fenced(fence, batch).await;
        self.meter.fenced_appends.fetch_add(1, Ordering::Relaxed);
        if matches!(r, Err(huddle_store::StoreError::Fenced { .. })) {
            self.meter.fenced_refused.fetch_add(1, Ordering::Relaxed);
        }
        add_elapsed(&self.meter.append_us, t);
        r
    }

    async fn read_forward(&self, after: Position, limit: usize) -> huddle_store::Result<ReadBatch> {
        self.inner.read_forward(after, limit).await
    }

    async fn read_room(
        &self,
        room: &str,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<ReadBatch> {
        self.inner.read_room(room, after, limit).await
    }

    async fn get(&self, id: InteractionId) -> huddle_store::Result<Option<Interaction>> {
        self.inner.get(id).await
    }

    fn doorbell(&self) -> Doorbell {
        self.inner.doorbell()
    }

    async fn now(&self) -> huddle_store::Result<Timestamp> {
        self.inner.now().await
    }

    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }
}

#[async_trait]
impl Claims for MeteredStore {
    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> huddle_store::Result<Acquired> {
        let t = Instant::now();
        let r = self.inner.acquire(key, holder, ttl).await;
        add_elapsed(&self.meter.acquire_us, t);
        let won = matches!(r, Ok(Acquired::Won(_)));
        let (calls, wins) = if key.starts_with("task/") {
            (&self.meter.task_acquires, Some(&self.meter.task_won))
        } else if key.starts_with("taskdrive/") {
            (&self.meter.drive_acquires, Some(&self.meter.drive_won))
        } else {
            (&self.meter.other_acquires, None)
        };
        calls.fetch_add(1, Ordering::Relaxed);
        if let Ok(a) = &r {
            let st = a.state();
            debug!(key, holder, won, by = %st.holder, epoch = st.epoch, "acquire");
        }
        if let (true, Some(w)) = (won, wins) {
            w.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> huddle_store::Result<Option<ClaimState>> {
        self.meter.renews.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, holder, epoch, ttl).await
    }

    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> huddle_store::Result<bool> {
        self.meter.releases.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.release(key, holder, epoch).await;
        debug!(key, holder, epoch, released = ?r.as_ref().ok(), "release");
        r
    }

    async fn list_claims(&self, prefix: &str) -> huddle_store::Result<Vec<ClaimRow>> {
        self.inner.list_claims(prefix).await
    }
}

impl Store for MeteredStore {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

// ---------------------------------------------------------------------------------
// The tally: one fold of a room with the counts the report needs
// ---------------------------------------------------------------------------------

/// What one agent did, from the ledger.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct AgentTally {
    /// Completions the task fold accepted from it.
    pub tasks_done: u64,
    /// Turns it was prompted for.
    pub turns: u64,
    /// Turns that failed (including cancelled ones).
    pub failed_turns: u64,
    /// Tokens of all its turns.
    pub tokens: u64,
}

/// An incremental fold of one room: the task DAG, the board, and the counts the
/// report needs. Apply every row of the room in ledger order.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// The room.
    pub room: String,
    /// The task DAG fold.
    pub dag: TaskDag,
    /// The board fold.
    pub board: Board,
    /// `task.completed` rows per task, accepted or not.
    pub raw_completions: BTreeMap<String, u32>,
    /// Completions the fold accepted (the task moved to done), per task.
    pub accepted_completions: BTreeMap<String, u32>,
    /// Task turns that replied (work finished), per task.
    pub worked: BTreeMap<String, u32>,
    /// Per agent.
    pub agents: BTreeMap<String, AgentTally>,
    /// Failed-turn reasons and counts.
    pub failure_reasons: BTreeMap<String, u64>,
    /// Ready → accepted claim, µs, one per accepted claim (includes waiting for a
    /// free agent).
    pub claim_waits_us: Vec<i64>,
    /// Pickup: from the later of "the task is ready" and "the claiming agent is
    /// free" (its last turn ended, or it registered) to the accepted claim, µs. The
    /// coordination cost of one hand-off.
    pub pickups_us: Vec<i64>,
    /// When each agent last became free (database time).
    pub free_since: BTreeMap<String, Timestamp>,
    /// Database time of the first `task.created`.
    pub first_created_at: Option<Timestamp>,
    /// Database time of the last accepted completion.
    pub last_done_at: Option<Timestamp>,
    /// Rows folded.
    pub rows: u64,
}

impl Tally {
    /// An empty tally of `room`.
    pub fn new(room: &str) -> Self {
        Tally {
            room: room.to_string(),
            ..Default::default()
        }
    }

    /// Folds one row (rows of other rooms are ignored).
    pub fn apply(&mut self, row: &Interaction) {
        if row.room != self.room {
            return;
        }
        self.rows += 1;
        let task_id = row
            .body
            .get("task")
            .and_then(|t| t.as_str())
            .map(str::to_string);
        match row.verb {
            Verb::TaskCreated => {
                self.first_created_at.get_or_insert(row.at);
                self.dag.apply(row);
            }
            Verb::TaskClaimed => {
                let since = task_id
                    .as_deref()
                    .and_then(|t| self.dag.ready_since(&self.room, t));
                self.dag.apply(row);
                if let (Some(since), Some(b)) = (since, TaskClaimedBody::parse(&row.body)) {
                    let accepted = self
                        .dag
                        .task(&self.room, &b.task)
                        .is_some_and(|t| t.is_held_by(&row.actor, b.epoch));
                    if accepted {
                        self.claim_waits_us.push((row.at - since).max(0));
                        if let Some(free) = self.free_since.get(&row.actor) {
                            self.pickups_us.push((row.at - since.max(*free)).max(0));
                        }
                    }
                }
            }
            Verb::TaskCompleted => {
                let before = task_id
                    .as_deref()
                    .and_then(|t| self.dag.task(&self.room, t))
                    .map(|t| t.status);
                self.dag.apply(row);
                if let Some(b) = TaskCompletedBody::parse(&row.body) {
                    *self.raw_completions.entry(b.task.clone()).or_default() += 1;
                    let after = self.dag.task(&self.room, &b.task).map(|t| t.status);
                    if before != Some(TaskStatus::Done) && after == Some(TaskStatus::Done) {
                        *self.accepted_completions.entry(b.task).or_default() += 1;
                        self.agents.entry(row.actor.clone()).or_default().tasks_done += 1;
                        self.last_done_at = Some(row.at);
                    }
                }
            }
            Verb::TurnPrompted if row.role == Role::Agent => {
                self.agents.entry(row.actor.clone()).or_default().turns += 1;
            }
            Verb::TurnReplied if row.role == Role::Agent => {
                self.free_since.insert(row.actor.clone(), row.at);
                if let Ok(b) = serde_json::from_value::<TurnRepliedBody>(row.body.clone()) {
                    let a = self.agents.entry(row.actor.clone()).or_default();
                    a.tokens += b.tokens;
                    if b.subject.kind == SubjectKind::Task {
                        *self.worked.entry(b.subject.id).or_default() += 1;
                    }
                }
            }
            Verb::TurnFailed if row.role == Role::Agent => {
                self.free_since.insert(row.actor.clone(), row.at);
                let a = self.agents.entry(row.actor.clone()).or_default();
                a.failed_turns += 1;
                if let Ok(b) = serde_json::from_value::<TurnFailedBody>(row.body.clone()) {
                    a.tokens += b.tokens;
                    *self.failure_reasons.entry(b.reason).or_default() += 1;
                }
            }
            Verb::AgentRegistered if row.role == Role::Agent => {
                self.agents.entry(row.actor.clone()).or_default();
                self.free_since.entry(row.actor.clone()).or_insert(row.at);
            }
            _ => {}
        }
        if row.verb != Verb::TaskCreated
            && row.verb != Verb::TaskClaimed
            && row.verb != Verb::TaskCompleted
        {
            self.dag.apply(row);
        }
        self.board.apply(row);
    }

    /// Agents registered on the board.
    pub fn registered(&self) -> usize {
        self.board.room(&self.room).map_or(0, |b| b.agents.len())
    }

    /// Whether every expected task exists and none is ready or claimed.
    pub fn settled(&self, expected: usize) -> bool {
        let s = self.dag.summary(&self.room);
        s.total >= expected && s.ready == 0 && s.claimed == 0
    }
}

// ---------------------------------------------------------------------------------
// Running a scenario
// ---------------------------------------------------------------------------------

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct ScenarioOptions {
    /// Database URL (SQLite path or `postgres://`).
    pub db: String,
    /// Store options every handle starts from (the relay id is set per handle).
    pub store: StoreOptions,
    /// Room to create; `None` picks `demo`, `demo-2`, ... (the first that is free).
    pub room: Option<String>,
    /// Simulated agents.
    pub agents: usize,
    /// In-process relays; agents are spread round-robin.
    pub relays: usize,
    /// `!config` settings posted before delegating (`key value` pairs).
    pub config: Vec<(String, String)>,
    /// Probability that a turn fails.
    pub failure_rate: f64,
    /// Seed of the simulated agents.
    pub seed: u64,
    /// Give up after this long in total.
    pub timeout: Duration,
    /// Give up when the room has not moved for this long.
    pub stall: Duration,
    /// Relay tuning.
    pub relay: RelayOptions,
}

/// Something that shows a scenario as it runs.
pub trait Progress: Send {
    /// A phase starts (`starting relays`, `delegating`, ...).
    fn phase(&mut self, _text: &str) {}
    /// The fold moved.
    fn update(&mut self, _tally: &Tally, _relay_of: &BTreeMap<String, String>) {}
    /// The run is over (clear the display).
    fn finish(&mut self) {}
}

/// Shows nothing.
pub struct Quiet;

impl Progress for Quiet {}

/// Percentiles of a sample, milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of samples in µs.
    pub fn of_us(samples: &[i64]) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        let mut v = samples.to_vec();
        v.sort_unstable();
        let at = |p: f64| {
            let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
            round2(v[rank - 1] as f64 / 1000.0)
        };
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64 / 1000.0;
        Percentiles {
            n: v.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: round2(*v.last().unwrap_or(&0) as f64 / 1000.0),
            mean_ms: round2(mean),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Per-agent line of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AgentLine {
    /// Agent key.
    pub agent: String,
    /// The relay hosting it.
    pub relay: String,
    /// Completions accepted.
    pub tasks_done: u64,
    /// Turns prompted.
    pub turns: u64,
    /// Turns failed.
    pub failed_turns: u64,
    /// Tokens.
    pub tokens: u64,
}

/// Duplicates, three ways.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Duplicates {
    /// Tasks with more than one completion accepted by the task fold (target 0).
    pub accepted: usize,
    /// Tasks with more than one `task.completed` row in the ledger, accepted or not.
    pub raw_rows: usize,
    /// `task.completed` rows in the ledger.
    pub completed_rows: u64,
    /// Tasks whose work finished more than once (a turn replied, e.g. after its claim
    /// was lost); their extra results were never accepted.
    pub worked_twice: usize,
}

/// Makespan against the ideal.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Makespan {
    /// From the `!delegate` message to the last accepted completion (database clock).
    pub makespan_ms: f64,
    /// max(total work ÷ agents, critical path): a lower bound.
    pub ideal_ms: f64,
    /// Total work ÷ agents.
    pub work_per_agent_ms: f64,
    /// The longest dependency chain.
    pub critical_path_ms: f64,
    /// A greedy schedule of the same DAG with zero coordination overhead.
    pub greedy_ms: f64,
    /// makespan ÷ ideal.
    pub ratio: f64,
    /// makespan ÷ (total work ÷ agents).
    pub ratio_work: f64,
    /// makespan ÷ greedy: the share coordination adds.
    pub ratio_greedy: f64,
    /// Total work ÷ (agents × makespan).
    pub utilisation: f64,
}

/// Turn counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Turns {
    /// Turns prompted.
    pub started: u64,
    /// Turns failed (simulated failures, cancellations).
    pub failed: u64,
    /// Done tasks that needed more than one attempt.
    pub retried_tasks: usize,
    /// Attempts beyond the first, over all tasks.
    pub extra_attempts: u64,
    /// Failure reasons and counts.
    pub reasons: BTreeMap<String, u64>,
}

/// One relay's view at the end.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RelayLine {
    /// What the relay returned.
    pub summary: RelaySummary,
    /// What its store handle counted.
    pub store: MeterReport,
    /// Agents it hosted.
    pub agents: usize,
}

/// Everything a scenario run reports.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ScenarioReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The room.
    pub room: String,
    /// Workload kind.
    pub workload: String,
    /// Agents.
    pub agents: usize,
    /// Relays.
    pub relays: usize,
    /// `!config` applied before delegating.
    pub config: BTreeMap<String, String>,
    /// Turn failure probability.
    pub failure_rate: f64,
    /// Tasks delegated.
    pub tasks: usize,
    /// Tasks done.
    pub done: usize,
    /// Tasks not done (abandoned, blocked behind an abandoned task, or left over).
    pub missed: usize,
    /// Tasks failed for good.
    pub abandoned: usize,
    /// Ids of missed tasks (at most 50).
    pub missed_ids: Vec<String>,
    /// Duplicates.
    pub duplicates: Duplicates,
    /// Makespan.
    pub makespan: Makespan,
    /// Ready → claimed (accepted claims), database clock; includes waiting for a
    /// free agent.
    pub claim_wait: Percentiles,
    /// Pickup: max(task ready, agent free) → claimed; the cost of one hand-off.
    pub pickup: Percentiles,
    /// Turns.
    pub turns: Turns,
    /// Tokens over every turn.
    pub tokens: u64,
    /// Per agent.
    pub per_agent: Vec<AgentLine>,
    /// Per relay.
    pub per_relay: Vec<RelayLine>,
    /// Whether every relay folded the same task and board state as the report.
    pub converged: bool,
    /// Whether the run stopped on a timeout or stall instead of settling.
    pub stopped_early: Option<String>,
    /// Wall time of the whole run, ms.
    pub wall_ms: f64,
}

impl ScenarioReport {
    /// Whether the run met the invariants: every task done exactly once.
    pub fn clean(&self) -> bool {
        self.missed == 0 && self.duplicates.accepted == 0 && self.duplicates.raw_rows == 0
    }
}

/// Picks a free room name: `demo`, `demo-2`, ...
async fn free_room(store: &dyn Store, base: &str) -> anyhow::Result<String> {
    let mut taken = std::collections::BTreeSet::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_forward(cursor, 5000).await?;
        for r in &batch.rows {
            if r.verb == Verb::RoomCreated {
                taken.insert(r.room.clone());
            }
        }
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    let mut n = 1;
    loop {
        let name = if n == 1 {
            base.to_string()
        } else {
            format!("{base}-{n}")
        };
        if !taken.contains(&name) {
            return Ok(name);
        }
        n += 1;
    }
}

async fn open_handle(options: &ScenarioOptions, relay: &str) -> anyhow::Result<Arc<dyn Store>> {
    let mut store = options.store.clone();
    store.relay = relay.to_string();
    huddle_store::open(&options.db, store)
        .await
        .with_context(|| format!("cannot open the database {:?}", options.db))
}

/// Watches the room through its own handle.
struct Watch {
    sub: Subscription,
    tally: Tally,
}

impl Watch {
    /// Reads what is there without waiting.
    async fn drain(&mut self) -> anyhow::Result<bool> {
        let mut moved = false;
        loop {
            let batch = self.sub.poll_once().await?;
            if batch.rows.is_empty() && batch.skipped.is_empty() {
                return Ok(moved);
            }
            for r in &batch.rows {
                self.tally.apply(r);
            }
            moved = true;
        }
    }

    /// Folds until `done(tally)` holds or `limit` passes; false on timeout.
    async fn until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Tally) -> bool,
    ) -> anyhow::Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            self.drain().await?;
            if done(&self.tally) {
                return Ok(true);
            }
            match tokio::time::timeout_at(deadline, self.sub.next()).await {
                Err(_) => return Ok(false),
                Ok(batch) => {
                    for r in &batch?.rows {
                        self.tally.apply(r);
                    }
                }
            }
        }
    }

    /// The system's reply to an owner command, and whether the command took effect.
    async fn command_outcome(
        &mut self,
        command: InteractionId,
        effect: Verb,
        limit: Duration,
    ) -> anyhow::Result<String> {
        let mut reply: Option<String> = None;
        let mut applied = false;
        let room = self.tally.room.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let batch = match tokio::time::timeout_at(deadline, self.sub.next()).await {
                Err(_) => bail!(
                    "no relay answered the owner command within {limit:?}: are the relays running?"
                ),
                Ok(b) => b?,
            };
            for r in &batch.rows {
                self.tally.apply(r);
                if r.room != room || r.parent != Some(command) {
                    continue;
                }
                if r.verb == effect {
                    applied = true;
                }
                if r.verb == Verb::MessagePosted && r.role == Role::System {
                    reply = r
                        .body
                        .get("text")
                        .and_then(|t| t.as_str())
                        .map(str::to_string);
                }
            }
            if let Some(text) = &reply {
                if applied {
                    return Ok(text.clone());
                }
                bail!("the owner command was refused: {text}");
            }
        }
    }
}

/// Runs `workload` as `options` say and reports. The progress display is fed from
/// the fold as rows arrive.
pub async fn run(
    options: &ScenarioOptions,
    workload: &Workload,
    progress: &mut dyn Progress,
) -> anyhow::Result<ScenarioReport> {
    if options.agents == 0 || options.relays == 0 {
        bail!("--agents and --relays must be at least 1");
    }
    if workload.tasks.is_empty() {
        bail!("the workload has no tasks");
    }
    let wall = Instant::now();
    progress.phase("opening the database");
    let owner = open_handle(options, "demo-owner").await?;
    let backend = owner.backend_name().to_string();
    let room = match &options.room {
        Some(r) => r.clone(),
        None => free_room(&*owner, "demo").await?,
    };
    let observer = open_handle(options, "demo-observer").await?;
    let ledger: Arc<dyn Ledger> = observer.clone();
    // Start the watch at the end of the ledger: earlier rows are other rooms'.
    let mut watch = Watch {
        sub: Subscription::new(ledger, Position::START, 2000),
        tally: Tally::new(&room),
    };
    watch.drain().await?;

    owner
        .append(vec![NewInteraction::new(
            room.as_str(),
            Verb::RoomCreated,
            OWNER,
            Role::Owner,
            json!({ "owner": OWNER }),
        )])
        .await
        .context("creating the room")?;
    info!(%room, backend, "scenario room created");

    // Relays, each with its own handle, agents spread round-robin.
    progress.phase("starting relays");
    let names = agent_names(options.agents);
    let table = WorkloadDriver::table(workload);
    let mut relay_of: BTreeMap<String, String> = BTreeMap::new();
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for r in 0..options.relays {
        let relay_id = format!("relay-{r}");
        let agents: Vec<HostedAgent> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % options.relays == r)
            .map(|(_, key)| {
                relay_of.insert(key.clone(), relay_id.clone());
                HostedAgent {
                    local: LocalAgent::new(key.clone()),
                    name: key.clone(),
                    driver: Arc::new(WorkloadDriver::new(
                        table.clone(),
                        options.failure_rate,
                        options.seed,
                        Duration::from_millis(50),
                    )),
                }
            })
            .collect();
        let hosted = agents.len();
        let meter = Arc::new(Meter::default());
        let inner = open_handle(options, &relay_id).await?;
        let store: Arc<dyn Store> = Arc::new(MeteredStore::new(inner, meter.clone()));
        let relay = Relay::new(
            store,
            relay_id.clone(),
            vec![room.clone()],
            agents,
            options.relay.clone(),
        );
        let token = shutdown.clone();
        handles.push((
            relay_id,
            hosted,
            meter,
            tokio::spawn(async move { relay.run(token).await }),
        ));
    }
    // Stop the relays whatever happens next.
    let result = drive(options, workload, progress, &mut watch, &owner, &relay_of).await;
    shutdown.cancel();
    progress.phase("stopping relays");
    let mut per_relay = Vec::new();
    for (relay_id, hosted, meter, handle) in handles {
        let summary = match tokio::time::timeout(Duration::from_secs(30), handle).await {
            Ok(Ok(Ok(s))) => s,
            Ok(Ok(Err(e))) => {
                warn!(relay = %relay_id, error = %e, "relay stopped with an error");
                RelaySummary {
                    relay: relay_id.clone(),
                    ..Default::default()
                }
            }
            Ok(Err(e)) => {
                warn!(relay = %relay_id, error = %e, "relay task failed");
                RelaySummary {
                    relay: relay_id.clone(),
                    ..Default::default()
                }
            }
            Err(_) => {
                warn!(relay = %relay_id, "relay did not stop within 30 s");
                RelaySummary {
                    relay: relay_id.clone(),
                    ..Default::default()
                }
            }
        };
        per_relay.push(RelayLine {
            summary,
            store: meter.report(),
            agents: hosted,
        });
    }
    progress.finish();
    let (delegate_at, stopped_early) = result?;

    // The report: a fresh fold of the whole room, after every relay stopped.
    let mut tally = Tally::new(&room);
    let mut cursor = Position::START;
    loop {
        let batch = observer.read_room(&room, cursor, 5000).await?;
        for r in &batch.rows {
            tally.apply(r);
        }
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    Ok(report(ReportInput {
        backend,
        options,
        workload,
        tally: &tally,
        delegate_at,
        relay_of: &relay_of,
        per_relay,
        stopped_early,
        wall,
    }))
}

/// Posts the config and the DAG and waits until the room settles. Returns the
/// database time of the first `!delegate` and why it stopped early, if it did.
async fn drive(
    options: &ScenarioOptions,
    workload: &Workload,
    progress: &mut dyn Progress,
    watch: &mut Watch,
    owner: &Arc<dyn Store>,
    relay_of: &BTreeMap<String, String>,
) -> anyhow::Result<(Timestamp, Option<String>)> {
    let agents = options.agents;
    let registered = watch
        .until(Duration::from_secs(60), |t| t.registered() >= agents)
        .await?;
    if !registered {
        bail!(
            "only {} of {agents} agents registered within 60 s",
            watch.tally.registered()
        );
    }
    progress.update(&watch.tally, relay_of);
    let room = watch.tally.room.clone();
    let post = |text: String| {
        NewInteraction::new(
            room.as_str(),
            Verb::MessagePosted,
            OWNER,
            Role::Owner,
            json!({ "text": text }),
        )
    };
    if !options.config.is_empty() {
        progress.phase("configuring the room");
        let text = std::iter::once("!config".to_string())
            .chain(options.config.iter().map(|(k, v)| format!("{k} {v}")))
            .collect::<Vec<_>>()
            .join(" ");
        let appended = owner.append(vec![post(text)]).await?;
        let id = appended
            .first()
            .map(|a| a.id)
            .context("append returned nothing")?;
        let reply = watch
            .command_outcome(id, Verb::ConfigSet, Duration::from_secs(30))
            .await?;
        debug!(reply, "config applied");
    }
    progress.phase("delegating");
    let mut delegate_at: Option<Timestamp> = None;
    for text in workload.delegate_messages() {
        let appended = owner.append(vec![post(text)]).await?;
        let id = appended
            .first()
            .map(|a| a.id)
            .context("append returned nothing")?;
        if delegate_at.is_none() {
            let row = owner
                .get(id)
                .await?
                .context("the !delegate message vanished")?;
            delegate_at = Some(row.at);
        }
        let reply = watch
            .command_outcome(id, Verb::TaskCreated, Duration::from_secs(60))
            .await?;
        debug!(reply, "delegated");
    }
    let delegate_at = delegate_at.unwrap_or_default();
    progress.phase("working");
    progress.update(&watch.tally, relay_of);
    let expected = workload.tasks.len();
    let deadline = tokio::time::Instant::now() + options.timeout;
    let mut last_move = tokio::time::Instant::now();
    let mut last_rows = watch.tally.rows;
    loop {
        if watch.tally.settled(expected) {
            return Ok((delegate_at, None));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok((
                delegate_at,
                Some(format!("timed out after {:?}", options.timeout)),
            ));
        }
        if now.duration_since(last_move) >= options.stall {
            return Ok((
                delegate_at,
                Some(format!("nothing happened for {:?}", options.stall)),
            ));
        }
        let wake = deadline.min(last_move + options.stall);
        match tokio::time::timeout_at(wake, watch.sub.next()).await {
            Err(_) => continue,
            Ok(batch) => {
                for r in &batch?.rows {
                    watch.tally.apply(r);
                }
                watch.drain().await?;
            }
        }
        if watch.tally.rows != last_rows {
            last_rows = watch.tally.rows;
            last_move = tokio::time::Instant::now();
            progress.update(&watch.tally, relay_of);
        }
    }
}

struct ReportInput<'a> {
    backend: String,
    options: &'a ScenarioOptions,
    workload: &'a Workload,
    tally: &'a Tally,
    delegate_at: Timestamp,
    relay_of: &'a BTreeMap<String, String>,
    per_relay: Vec<RelayLine>,
    stopped_early: Option<String>,
    wall: Instant,
}

fn report(input: ReportInput<'_>) -> ScenarioReport {
    let ReportInput {
        backend,
        options,
        workload,
        tally,
        delegate_at,
        relay_of,
        per_relay,
        stopped_early,
        wall,
    } = input;
    let room = tally.room.clone();
    let summary = tally.dag.summary(&room);
    let tasks = workload.tasks.len();
    let done = summary.done;
    let missed_ids: Vec<String> = workload
        .tasks
        .iter()
        .filter(|t| {
            tally
                .dag
                .task(&room, &t.id)
                .is_none_or(|x| x.status != TaskStatus::Done)
        })
        .map(|t| t.id.clone())
        .collect();
    let duplicates = Duplicates {
        accepted: tally
            .accepted_completions
            .values()
            .filter(|n| **n > 1)
            .count(),
        raw_rows: tally.raw_completions.values().filter(|n| **n > 1).count(),
        completed_rows: tally.raw_completions.values().map(|n| u64::from(*n)).sum(),
        worked_twice: tally.worked.values().filter(|n| **n > 1).count(),
    };
    let agents = options.agents.max(1);
    let work = workload.total_work().as_secs_f64() * 1000.0;
    let per_agent_ms = work / agents as f64;
    let critical = workload.critical_path().as_secs_f64() * 1000.0;
    let greedy = workload.greedy_makespan(agents).as_secs_f64() * 1000.0;
    let ideal = per_agent_ms.max(critical);
    let makespan_ms = tally
        .last_done_at
        .map(|at| (at - delegate_at).max(0) as f64 / 1000.0)
        .unwrap_or(0.0);
    let ratio = |x: f64| {
        if x > 0.0 {
            round3(makespan_ms / x)
        } else {
            0.0
        }
    };
    let makespan = Makespan {
        makespan_ms: round2(makespan_ms),
        ideal_ms: round2(ideal),
        work_per_agent_ms: round2(per_agent_ms),
        critical_path_ms: round2(critical),
        greedy_ms: round2(greedy),
        ratio: ratio(ideal),
        ratio_work: ratio(per_agent_ms),
        ratio_greedy: ratio(greedy),
        utilisation: if makespan_ms > 0.0 {
            round3(work / (agents as f64 * makespan_ms))
        } else {
            0.0
        },
    };
    let mut retried_tasks = 0;
    let mut extra_attempts = 0u64;
    if let Some(r) = tally.dag.room(&room) {
        for t in r.tasks.values() {
            extra_attempts += u64::from(t.attempts.saturating_sub(1));
            if t.status == TaskStatus::Done && t.attempts > 1 {
                retried_tasks += 1;
            }
        }
    }
    let turns = Turns {
        started: tally.agents.values().map(|a| a.turns).sum(),
        failed: tally.agents.values().map(|a| a.failed_turns).sum(),
        retried_tasks,
        extra_attempts,
        reasons: tally.failure_reasons.clone(),
    };
    let per_agent: Vec<AgentLine> = tally
        .agents
        .iter()
        .map(|(agent, a)| AgentLine {
            agent: agent.clone(),
            relay: relay_of.get(agent).cloned().unwrap_or_default(),
            tasks_done: a.tasks_done,
            turns: a.turns,
            failed_turns: a.failed_turns,
            tokens: a.tokens,
        })
        .collect();
    let tasks_hash = hex(tally.dag.state_hash());
    let board_hash = hex(tally.board.state_hash());
    let converged = per_relay
        .iter()
        .all(|r| r.summary.tasks_hash == tasks_hash && r.summary.board_hash == board_hash);
    ScenarioReport {
        backend,
        room,
        workload: workload.kind.to_string(),
        agents: options.agents,
        relays: options.relays,
        config: options.config.iter().cloned().collect(),
        failure_rate: options.failure_rate,
        tasks,
        done,
        missed: missed_ids.len(),
        abandoned: summary.abandoned,
        missed_ids: missed_ids.into_iter().take(50).collect(),
        duplicates,
        makespan,
        claim_wait: Percentiles::of_us(&tally.claim_waits_us),
        pickup: Percentiles::of_us(&tally.pickups_us),
        turns,
        tokens: tally.agents.values().map(|a| a.tokens).sum(),
        per_agent,
        per_relay,
        converged,
        stopped_early,
        wall_ms: round2(wall.elapsed().as_secs_f64() * 1000.0),
    }
}

fn hex(bytes: [u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Seconds with one decimal from milliseconds.
pub fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// The human form of a report.
pub fn render(r: &ScenarioReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let config = if r.config.is_empty() {
        "defaults".to_string()
    } else {
        r.config
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "room {} on {}: {} tasks ({}), {} agents on {} relays, {config}, failure rate {:.2}",
        r.room, r.backend, r.tasks, r.workload, r.agents, r.relays, r.failure_rate
    );
    if let Some(why) = &r.stopped_early {
        let _ = writeln!(s, "  STOPPED EARLY: {why}");
    }
    let m = &r.makespan;
    let _ = writeln!(
        s,
        "  done        {} / {}   missed {}{}   abandoned {}",
        r.done,
        r.tasks,
        r.missed,
        if r.missed_ids.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                r.missed_ids
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        r.abandoned
    );
    let _ = writeln!(
        s,
        "  duplicates  {} accepted completions   {} tasks with >1 task.completed row ({} rows)   {} tasks worked twice",
        r.duplicates.accepted, r.duplicates.raw_rows, r.duplicates.completed_rows, r.duplicates.worked_twice
    );
    let _ = writeln!(
        s,
        "  makespan    {}   ideal {} = max(work/agents {}, critical path {})   ratio {:.3}",
        secs(m.makespan_ms),
        secs(m.ideal_ms),
        secs(m.work_per_agent_ms),
        secs(m.critical_path_ms),
        m.ratio
    );
    let _ = writeln!(
        s,
        "              vs work/agents {:.3}   vs a zero-overhead greedy schedule ({}) {:.3}   utilisation {:.0} %",
        m.ratio_work,
        secs(m.greedy_ms),
        m.ratio_greedy,
        m.utilisation * 100.0
    );
    let _ = writeln!(
        s,
        "  turns       {} started, {} failed, {} tasks retried ({} extra attempts)",
        r.turns.started, r.turns.failed, r.turns.retried_tasks, r.turns.extra_attempts
    );
    let _ = writeln!(
        s,
        "  claims      pickup (task ready and agent free -> claimed) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms;   ready -> claimed p50 {:.1} ms, p99 {:.1} ms",
        r.pickup.p50_ms, r.pickup.p99_ms, r.pickup.max_ms, r.claim_wait.p50_ms, r.claim_wait.p99_ms
    );
    let _ = writeln!(
        s,
        "  relays      {} (fold hashes {})",
        r.per_relay
            .iter()
            .map(|l| format!(
                "{}: {} agents, {} turns, {}/{} task claims won",
                l.summary.relay,
                l.agents,
                l.summary.turns_started,
                l.store.task_won,
                l.store.task_acquires
            ))
            .collect::<Vec<_>>()
            .join("; "),
        if r.converged { "agree" } else { "DIFFER" }
    );
    let _ = writeln!(s, "  tokens      {}", r.tokens);
    if r.per_agent.len() <= 40 {
        let _ = writeln!(
            s,
            "\n  {:<10} {:<8} {:>6} {:>6} {:>7} {:>8}",
            "agent", "relay", "tasks", "turns", "failed", "tokens"
        );
        for a in &r.per_agent {
            let _ = writeln!(
                s,
                "  {:<10} {:<8} {:>6} {:>6} {:>7} {:>8}",
                a.agent, a.relay, a.tasks_done, a.turns, a.failed_turns, a.tokens
            );
        }
    } else {
        let done: Vec<u64> = r.per_agent.iter().map(|a| a.tasks_done).collect();
        let _ = writeln!(
            s,
            "  per agent   tasks min {} / max {} over {} agents",
            done.iter().min().unwrap_or(&0),
            done.iter().max().unwrap_or(&0),
            done.len()
        );
    }
    s
}

// ---------------------------------------------------------------------------------
// Wake latency
// ---------------------------------------------------------------------------------

/// Append on one handle → arrival in a [`Subscription`] on another.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WakeReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Probes sent.
    pub samples: usize,
    /// Probes that never arrived within 5 s.
    pub lost: usize,
    /// From the start of the append call to the arrival.
    pub append_to_arrival: Percentiles,
    /// From the append call's return (committed) to the arrival.
    pub commit_to_arrival: Percentiles,
    /// The append call alone.
    pub append: Percentiles,
}

/// Measures wake latency on an idle system: `samples` sequential appends on handle A,
/// `gap` apart, each timed until a subscription on handle B yields it.
pub async fn wake_latency(
    db: &str,
    store: &StoreOptions,
    samples: usize,
    gap: Duration,
) -> anyhow::Result<WakeReport> {
    let open = |relay: &str| {
        let mut o = store.clone();
        o.relay = relay.to_string();
        async move {
            huddle_store::open(db, o)
                .await
                .with_context(|| format!("cannot open the database {db:?}"))
        }
    };
    let a = open("wake-a").await?;
    let b = open("wake-b").await?;
    let backend = a.backend_name().to_string();
    let nonce = b.now().await?;
    let room = format!("wake-{nonce}");
    let ledger: Arc<dyn Ledger> = b.clone();
    let mut sub = Subscription::new(ledger, Position::START, 5000);
    loop {
        let batch = sub.poll_once().await?;
        if batch.rows.is_empty() && batch.skipped.is_empty() {
            break;
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let watch_room = room.clone();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let reader = tokio::spawn(async move {
        loop {
            let batch = tokio::select! {
                _ = stopped.cancelled() => return,
                b = sub.next() => b,
            };
            let arrived = Instant::now();
            match batch {
                Ok(batch) => {
                    for r in batch.rows {
                        if r.room != watch_room {
                            continue;
                        }
                        if let Some(n) = r.body.get("probe").and_then(|p| p.as_u64()) {
                            if tx.send((n, arrived)).is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "wake probe subscription failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    let mut total = Vec::new();
    let mut after_commit = Vec::new();
    let mut append = Vec::new();
    let mut lost = 0;
    for i in 0..samples as u64 {
        tokio::time::sleep(gap).await;
        let row = NewInteraction::new(
            room.as_str(),
            Verb::MessagePosted,
            "prober",
            Role::System,
            json!({ "text": "wake probe", "probe": i }),
        );
        let t0 = Instant::now();
        a.append(vec![row]).await?;
        let t1 = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut arrived = None;
        while let Ok(Some((n, at))) = tokio::time::timeout_at(deadline, rx.recv()).await {
            if n == i {
                arrived = Some(at);
                break;
            }
        }
        append.push((t1 - t0).as_micros() as i64);
        match arrived {
            Some(at) => {
                total.push(at.saturating_duration_since(t0).as_micros() as i64);
                after_commit.push(at.saturating_duration_since(t1).as_micros() as i64);
            }
            None => lost += 1,
        }
    }
    stop.cancel();
    let _ = reader.await;
    Ok(WakeReport {
        backend,
        samples,
        lost,
        append_to_arrival: Percentiles::of_us(&total),
        commit_to_arrival: Percentiles::of_us(&after_commit),
        append: Percentiles::of_us(&append),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_has_exactly_n_tasks_in_dependency_order() {
        for n in [1, 5, 10, 11, 14, 15, 40, 99, 300, 1234] {
            let w = Workload::pipeline(n, 7, Duration::from_millis(100));
            assert_eq!(w.tasks.len(), n, "n = {n}");
            let mut seen = std::collections::HashSet::new();
            for t in &w.tasks {
                for d in &t.deps {
                    assert!(seen.contains(d.as_str()), "{} before its dep {d}", t.id);
                }
                assert!(seen.insert(t.id.as_str()), "duplicate id {}", t.id);
            }
        }
    }

    #[test]
    fn pipeline_is_deterministic_from_the_seed() {
        let a = Workload::pipeline(300, 1, Duration::from_millis(100));
        let b = Workload::pipeline(300, 1, Duration::from_millis(100));
        let c = Workload::pipeline(300, 2, Duration::from_millis(100));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn delegate_text_parses_as_one_plan() {
        let w = Workload::pipeline(300, 3, Duration::from_millis(100));
        let msgs = w.delegate_messages();
        assert_eq!(msgs.len(), 1);
        let parsed = huddle_core::owner_command(Role::Owner, &msgs[0]);
        match parsed {
            Some(Ok(huddle_core::OwnerCommand::Delegate(plan))) => {
                assert_eq!(plan.tasks.len(), 300)
            }
            other => panic!("not a delegate plan: {other:?}"),
        }
    }

    #[test]
    fn bounds_of_the_independent_scenario() {
        let w = Workload::independent(300, Duration::from_millis(100));
        assert_eq!(w.total_work(), Duration::from_secs(30));
        assert_eq!(w.critical_path(), Duration::from_millis(100));
        assert_eq!(w.greedy_makespan(6), Duration::from_secs(5));
        assert_eq!(w.greedy_makespan(300), Duration::from_millis(100));
        assert_eq!(w.greedy_makespan(1000), Duration::from_millis(100));
    }

    #[test]
    fn greedy_respects_the_critical_path() {
        let w = Workload::pipeline(300, 1, Duration::from_millis(100));
        let g = w.greedy_makespan(1000);
        assert_eq!(g, w.critical_path());
        assert!(w.greedy_makespan(6) >= w.total_work() / 6);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).map(|x| x * 1000).collect();
        let p = Percentiles::of_us(&v);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
        assert_eq!(Percentiles::of_us(&[]).n, 0);
    }
}
