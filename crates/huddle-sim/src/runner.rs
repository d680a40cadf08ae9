//! Running a scenario: in-process relays hosting simulated agents, each relay on its
//! own store handle, an owner handle that posts `!config` and `!delegate`, and an
//! observer handle whose subscription feeds a [`Tally`] and the progress display.
//!
//! ```text
//!   owner handle ── room.created, !config, !delegate ──┐
//!   relay-0 handle ── Relay(agents 0, 3, ...) ─────────┤
//!   relay-1 handle ── Relay(agents 1, 4, ...) ─────────┼── one ledger (SQLite file or Postgres)
//!   relay-2 handle ── Relay(agents 2, 5, ...) ─────────┤
//!   observer handle ── Subscription -> Tally (fold) ───┘──> progress, report
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::signing::OwnerSecret;
use huddle_core::sync::LocalAgent;
use huddle_core::{InteractionId, NewInteraction, Position, Role, Timestamp, Verb};
use huddle_relay::{HostedAgent, Relay, RelayOptions, RelaySummary};
use huddle_store::{Ledger, Store, StoreOptions, Subscription};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::driver::WorkloadDriver;
use crate::error::{Result, SimError};
use crate::meter::{Meter, MeteredStore};
use crate::report::{report, RelayLine, ReportInput, ScenarioReport};
use crate::tally::Tally;
use crate::workload::{agent_names, Workload};

/// The owner of scenario rooms.
pub const OWNER: &str = "owner";

/// How long the agents of a run have to register.
const REGISTRATION_LIMIT: Duration = Duration::from_secs(60);

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

/// How ready tasks are allocated (`!config allocation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Any free agent claims a ready task.
    Pull,
    /// The owner's plan names an assignee per task (round-robin); only it claims.
    Push,
    /// Agents bid during the bid window; the best bid claims.
    Bid {
        /// `!config bid-window`, e.g. `200ms`.
        window: String,
    },
}

impl Allocation {
    /// The `!config allocation` value.
    pub fn name(&self) -> &'static str {
        match self {
            Allocation::Pull => "pull",
            Allocation::Push => "push",
            Allocation::Bid { .. } => "bid",
        }
    }

    /// Prepares a run with `agents` agents for this allocation: push assigns the
    /// workload's tasks round-robin, bid adds its window to `config` (the
    /// `allocation` key itself is the caller's, so it can order the keys).
    pub fn configure(
        &self,
        workload: &mut Workload,
        agents: usize,
        config: &mut Vec<(String, String)>,
    ) {
        match self {
            Allocation::Pull => {}
            Allocation::Push => workload.assign_round_robin(&agent_names(agents)),
            Allocation::Bid { window } => config.push(("bid-window".into(), window.clone())),
        }
    }
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

/// Picks a free room name: `demo`, `demo-2`, ...
async fn free_room(store: &dyn Store, base: &str) -> Result<String> {
    let mut taken = BTreeSet::new();
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

/// A store handle on `db` that writes as `relay`.
pub(crate) async fn open_handle(
    db: &str,
    store: &StoreOptions,
    relay: &str,
) -> Result<Arc<dyn Store>> {
    let mut store = store.clone();
    store.relay = relay.to_string();
    huddle_store::open(db, store)
        .await
        .map_err(|source| SimError::Open {
            db: db.to_string(),
            source,
        })
}

/// Watches the room through its own handle.
struct Watch {
    sub: Subscription,
    tally: Tally,
}

impl Watch {
    /// Reads what is there without waiting.
    async fn drain(&mut self) -> Result<bool> {
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
    ) -> Result<bool> {
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
    ) -> Result<String> {
        let mut reply: Option<String> = None;
        let mut applied = false;
        let room = self.tally.room.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let batch = match tokio::time::timeout_at(deadline, self.sub.next()).await {
                Err(_) => return Err(SimError::NoAnswer(limit)),
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
                return Err(SimError::Refused(text.clone()));
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
) -> Result<ScenarioReport> {
    if options.agents == 0 || options.relays == 0 {
        return Err(SimError::Invalid(
            "--agents and --relays must be at least 1".into(),
        ));
    }
    if workload.tasks.is_empty() {
        return Err(SimError::Invalid("the workload has no tasks".into()));
    }
    let wall = Instant::now();
    progress.phase("opening the database");
    let owner = open_handle(&options.db, &options.store, "demo-owner").await?;
    let backend = owner.backend_name().to_string();
    let room = match &options.room {
        Some(r) => r.clone(),
        None => free_room(&*owner, "demo").await?,
    };
    let observer = open_handle(&options.db, &options.store, "demo-observer").await?;
    let ledger: Arc<dyn Ledger> = observer.clone();
    // Start the watch at the end of the ledger: earlier rows are other rooms'.
    let mut watch = Watch {
        sub: Subscription::new(ledger, Position::START, 2000),
        tally: Tally::new(&room),
    };
    watch.drain().await?;

    // The owner's key lives only in this run: it signs the scenario's commands.
    let owner_key = fresh_owner_key()?;
    owner
        .append(vec![NewInteraction::new(
            room.as_str(),
            Verb::RoomCreated,
            OWNER,
            Role::Owner,
            json!({ "owner": OWNER, "key": owner_key.public().to_hex() }),
        )])
        .await
        .map_err(|source| SimError::Step {
            what: "creating the room",
            source,
        })?;
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
        let inner = open_handle(&options.db, &options.store, &relay_id).await?;
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
    let result = drive(
        options,
        workload,
        progress,
        &mut watch,
        (&owner, &owner_key),
        &relay_of,
    )
    .await;
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

/// A new random owner key.
fn fresh_owner_key() -> Result<OwnerSecret> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| SimError::Randomness(e.to_string()))?;
    Ok(OwnerSecret::from_seed(seed))
}

/// Posts the config and the DAG and waits until the room settles. Returns the
/// database time of the first `!delegate` and why it stopped early, if it did.
async fn drive(
    options: &ScenarioOptions,
    workload: &Workload,
    progress: &mut dyn Progress,
    watch: &mut Watch,
    (owner, owner_key): (&Arc<dyn Store>, &OwnerSecret),
    relay_of: &BTreeMap<String, String>,
) -> Result<(Option<Timestamp>, Option<String>)> {
    let agents = options.agents;
    let registered = watch
        .until(REGISTRATION_LIMIT, |t| t.registered() >= agents)
        .await?;
    if !registered {
        return Err(SimError::NotRegistered {
            registered: watch.tally.registered(),
            expected: agents,
            limit: REGISTRATION_LIMIT,
        });
    }
    progress.update(&watch.tally, relay_of);
    let room = watch.tally.room.clone();
    let post = |text: String| {
        owner_key.sign(NewInteraction::new(
            room.as_str(),
            Verb::MessagePosted,
            OWNER,
            Role::Owner,
            json!({ "text": text }),
        ))
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
            .ok_or(SimError::Ledger("append returned nothing"))?;
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
            .ok_or(SimError::Ledger("append returned nothing"))?;
        if delegate_at.is_none() {
            let row = owner
                .get(id)
                .await?
                .ok_or(SimError::Ledger("the !delegate message vanished"))?;
            delegate_at = Some(row.at);
        }
        let reply = watch
            .command_outcome(id, Verb::TaskCreated, Duration::from_secs(60))
            .await?;
        debug!(reply, "delegated");
    }
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
