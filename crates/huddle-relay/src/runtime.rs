//! The relay: an event loop around the pure [`Synchronizer`] and an executor of its
//! intents.
//!
//! ```text
//!  Subscription ─ rows ─┐                       ┌─ Acquire ──> store.acquire ──> ClaimResult ─┐
//!  reconcile clock ─────┼─> Synchronizer.handle ┼─ Append  ──> store.append[_fenced]          │
//!  feedback channel <───┼───────────────────────┼─ StartTurn > driver.run ─────> TurnEnded ───┤
//!  shutdown token ──────┘                       ├─ Renew/Release ─> store ─────> ClaimLost ───┘
//!                                               └─ Cancel ──> the turn's cancellation token
//! ```
//!
//! One relay folds each room once, however many agents it hosts. Intents of one
//! `handle` call are performed in order, except that acquisitions are started without
//! waiting (their outcome comes back as an event and nothing later in the same output
//! depends on it). A fenced append that is refused skips the turns that depended on
//! it and reports the claim lost.
//!
//! Every turn gets a start deadline (plan 0029): half the lease of its claims, counted
//! from the moment *before* the relay last asked the store for them (the acquire, or a
//! renewal made just before the start), so it falls well inside every lease however
//! long the store took to answer. The driver starts nothing after it (the exec
//! driver's child checks it between fork and exec): a relay paused or starved at any
//! point between confirming its claims and starting the agent reports the turn as
//! not started instead of running it after its lease may have lapsed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::config::binding::{signing_refusal, UnsignedWriter};
use huddle_core::config::{refusal, BoundElsewhere, RoomConfig};
use huddle_core::guards::TurnRequest as GuardTurn;
use huddle_core::protocol::TurnActivity;
use huddle_core::sync::{
    ChainedAcquire, ClaimAnswer, ClaimEpoch, ClaimKey, ClaimOutcome, ClaimRef, Event, Intent,
    LocalAgent, ReplyGate, SyncOptions, Synchronizer, TurnId, TurnOutcome as CoreOutcome,
    TurnStart, TurnWork,
};
use huddle_core::{
    render_related_context, select_related, ContextRules, Fold, Interaction, InteractionId,
    NewInteraction, Position, Role, Timestamp, Verb,
};
use huddle_core::{GuardFold, Verdict};
use huddle_store::{Acquired, ClaimRequest, Fence, ReadStep, Store, StoreError, Subscription};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::commands::{CommandHandler, Step, SYSTEM_ACTOR};
use crate::driver::{Driver, TurnOutcome, TurnRequest};
use crate::identity::{Identity, IdentityError};
use crate::metrics::{AcquireResult, RelayMetrics, TurnEnd, WorkKind};

/// Recent messages kept per room for related context.
const CONTEXT_WINDOW: usize = 200;

/// An agent this relay speaks for.
#[derive(Clone)]
pub struct HostedAgent {
    /// Key, capabilities and priority, as the synchronizer sees it.
    pub local: LocalAgent,
    /// Display name.
    pub name: String,
    /// How its turns run.
    pub driver: Arc<dyn Driver>,
}

/// Relay tuning that is not room config.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    /// Rows per read-forward step (default 500).
    pub read_batch: usize,
    /// Longest wait between reconcile ticks (default 250 ms).
    pub max_tick: Duration,
    /// Synchronizer tuning.
    pub sync: SyncOptions,
    /// How long shutdown waits for turns to end (default 10 s).
    pub shutdown_grace: Duration,
    /// Time between the relay's `relay.heartbeat` rows (default 30 s; one is written
    /// at start). Liveness itself is the `relay/<id>` lease, renewed every 2 s.
    pub heartbeat_every: Duration,
    /// Where the relay keeps the snapshot of its folds (plan 0063): it resumes from
    /// it at start and rewrites it as it goes. `None`: every start reads from the
    /// first row.
    pub snapshot: Option<std::path::PathBuf>,
    /// Rows folded between two snapshots written while the relay runs (at most one a
    /// minute, and only while it is idle).
    pub snapshot_every_rows: u64,
    /// The shortest time between two snapshots written while the relay runs
    /// (default 60 s).
    pub snapshot_min_interval: Duration,
    /// How long a task turn's result waits for other task turns of the relay to end,
    /// so their results share one write (plan 0081; default 2 ms). Results never
    /// wait when no other task turn runs; zero: never.
    pub batch_hold: Duration,
    /// How many batches of task results and claim acquisitions may be in flight at
    /// once (plan 0087; 1 – [`MAX_BATCHES_IN_FLIGHT`], default 1 here; `huddle relay`
    /// defaults to [`default_batches_in_flight`] of its backend, plan 0091). More
    /// than one overlaps the relay's statements: worth it where the database works on
    /// two at once (docs/benchmarks.md).
    pub batches_in_flight: usize,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            read_batch: 500,
            max_tick: Duration::from_millis(250),
            sync: SyncOptions::default(),
            shutdown_grace: Duration::from_secs(10),
            heartbeat_every: Duration::from_secs(30),
            snapshot: None,
            snapshot_every_rows: crate::snapshot::DEFAULT_EVERY_ROWS,
            snapshot_min_interval: Duration::from_secs(60),
            batch_hold: DEFAULT_BATCH_HOLD,
            batches_in_flight: 1,
        }
    }
}

/// How long a task result waits for others by default ([`RelayOptions::batch_hold`]).
pub const DEFAULT_BATCH_HOLD: Duration = Duration::from_millis(2);

/// The most batches a relay may keep in flight ([`RelayOptions::batches_in_flight`]).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// The batches a relay on `database` (a store URL) keeps in flight unless configured
/// (plan 0091): two on Postgres, whose server works on two statements at once (one
/// relay ran a third to two fifths more tasks a second with two; three relays sharing
/// two cores with the server, the same), one on SQLite, whose one writer runs them one
/// after the other anyway (two ran about a tenth fewer there).
pub fn default_batches_in_flight(database: &str) -> usize {
    match huddle_store::parse_url(database) {
        Ok(huddle_store::Backend::Postgres(_)) => 2,
        _ => 1,
    }
}

/// What a relay reports when it stops: enough to check that relays converged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RelaySummary {
    /// Relay id.
    pub relay: String,
    /// Cursor reached.
    pub cursor: String,
    /// Hash of the board fold (hex).
    pub board_hash: String,
    /// Hash of the task DAG fold (hex).
    pub tasks_hash: String,
    /// Turns started by this relay.
    pub turns_started: u64,
    /// Turns that replied.
    pub turns_replied: u64,
    /// Turns that failed or were cancelled.
    pub turns_failed: u64,
    /// Turns not started, and not counted in `turns_started`: their start deadline
    /// had passed (the relay was paused or starved between confirming the claims and
    /// starting the agent), or the claims could not be confirmed. Their work is
    /// offered again.
    pub turns_not_started: u64,
    /// Fenced appends refused (claims lost between decision and write).
    pub fenced_refusals: u64,
    /// Ledger rows skipped as corrupt or foreign.
    pub skipped_rows: u64,
    /// Rows (and skipped rows) the relay's reader delivered: rows of the rooms it
    /// serves only, however many rows other rooms hold.
    pub rows_read: u64,
    /// Writes that failed because the database was unavailable and were retried.
    pub writes_retried: u64,
    /// Results given up unwritten (the database stayed away past the shutdown grace,
    /// or refused the write for good).
    pub results_lost: u64,
    /// Owner commands not executed: no signature, or one that does not verify against
    /// the room owner's key.
    pub unsigned_commands: u64,
    /// `task.created` rows no verified owner command produced, ignored.
    pub unauthorized_rows: u64,
    /// Rows written as a bound agent by a writer it is not bound to, ignored.
    pub misbound_rows: u64,
    /// `room.created` / `room.key_rotated` / `config.set` rows the config fold ignored
    /// (a second creation, a forged rotation, a hand-written config).
    pub ignored_config_rows: u64,
    /// Rows ignored because their room requires signatures and they are not signed by
    /// a registered key of their writer (`!config require-signatures`).
    pub unsigned_rows: u64,
    /// Rows ignored because they name a writer with registered keys and are not signed
    /// by one of them (`!config relay-keys`).
    pub forged_writer_rows: u64,
    /// Rows of owner-command results this relay sent to the ledger (a copy another
    /// relay already wrote is not stored twice). Results the ledger already held when
    /// the relay caught up at start are not sent again.
    pub command_rows_sent: u64,
    /// Rows the relay did not read because it resumed from its snapshot (0 when it
    /// read from the first row).
    pub rows_resumed: u64,
    /// Snapshots of its folds it began writing (a write that fails is logged).
    pub snapshots_written: u64,
    /// Its agents' idle time between turns (plan 0083).
    pub agent_idle: crate::metrics::IdleGaps,
}

/// Why a relay stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The store failed in a way retrying does not fix.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The relay id is held by another live process.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// A hosted room's owner bound a hosted agent to other writers.
    #[error("refusing to host this agent")]
    BoundElsewhere(#[from] BoundElsewhere),
    /// A hosted room would ignore every row this relay writes (it requires
    /// signatures, or registers keys for this writer, and the relay does not sign
    /// with one of them).
    #[error("refusing to write in this room")]
    UnsignedWriter(#[from] UnsignedWriter),
    /// A room the relay is configured to serve was archived by its owner: nothing
    /// can be written there again.
    #[error(
        "room {room:?} was archived by its owner {owner} ({rows} rows exported and removed); \
         it can no longer be served: remove it from `rooms` in the relay's configuration"
    )]
    RoomArchived {
        /// The room.
        room: String,
        /// Who archived it.
        owner: String,
        /// How many rows its archive holds.
        rows: u64,
    },
}

/// A turn this relay is running.
struct LiveTurn {
    /// Cancels the driver's turn.
    token: CancellationToken,
    /// The claims it runs under.
    claims: Vec<ClaimRef>,
    /// One of them was lost: whatever the turn returns is not written.
    lost: bool,
    /// What it is for, and when the relay started it (for the metrics).
    work: WorkKind,
    started: Instant,
}

/// Results that come back to the event loop from performed intents.
#[derive(Debug)]
enum Feedback {
    Claim(ClaimOutcome),
    /// The answer to the resources of a task claim `(key, epoch)`.
    Resources {
        key: String,
        epoch: ClaimEpoch,
        answer: huddle_core::sync::ResourcesAnswer,
    },
    /// The store confirmed `(key, epoch)` for a lease counted from `lease.from`.
    Confirmed {
        key: String,
        epoch: ClaimEpoch,
        lease: Lease,
    },
    Lost {
        key: String,
        epoch: ClaimEpoch,
        fenced: bool,
    },
    TurnEnded {
        turn: TurnId,
        outcome: CoreOutcome,
        tokens: u64,
        activity: TurnActivity,
    },
    Failed(StoreError),
    /// A write failed and is being retried.
    WriteRetried,
    /// A result could not be written and was given up.
    ResultLost,
    /// Rows of owner-command results sent to the store.
    CommandRowsSent(u64),
}

/// What the relay knows of a claim it holds: the store granted or renewed it for
/// `ttl` in answer to a call made at `from` (this process's monotonic clock), so the
/// lease lasts at least until `from + ttl` unless it is released.
#[derive(Clone, Copy, Debug)]
struct Lease {
    from: Instant,
    ttl: Duration,
}

impl Lease {
    /// The latest start this lease vouches for: half-way through it.
    fn start_by(&self) -> Instant {
        self.from + self.ttl / 2
    }
}

/// A relay: one process's host for its agents.
pub struct Relay {
    store: Arc<dyn Store>,
    relay_id: String,
    rooms: Vec<String>,
    agents: BTreeMap<String, HostedAgent>,
    options: RelayOptions,
    metrics: RelayMetrics,
}

struct Loop {
    store: Arc<dyn Store>,
    sync: Synchronizer,
    agents: Arc<BTreeMap<String, HostedAgent>>,
    turns: HashMap<TurnId, LiveTurn>,
    feedback: mpsc::UnboundedSender<Feedback>,
    commands: CommandHandler,
    summary: RelaySummary,
    /// Recent messages per room: the bounded look-back window for related context.
    recent: HashMap<String, VecDeque<Interaction>>,
    /// Database time minus local time, µs, as of the last tick.
    clock_offset: i64,
    /// Recent ticks: when the clock reading returned (local) and what it read.
    ticks: VecDeque<(Instant, Timestamp)>,
    /// The coverage last told to the synchronizer ([`Event::Covered`]), and the
    /// coverage a fresh read was last asked for.
    covered: Option<Timestamp>,
    refreshed_for: Option<Timestamp>,
    clock_base: Instant,
    /// Outputs being performed (their writes may be retrying).
    inflight: tokio::task::JoinSet<()>,
    /// Task results and claim acquisitions waiting to go as one batch (plan 0081).
    batch: crate::batch::Batch,
    /// How many batches are being performed now (each task that performs one
    /// counts itself out when it ends).
    batches_now: Arc<std::sync::atomic::AtomicUsize>,
    /// The most batches performed at once ([`RelayOptions::batches_in_flight`],
    /// plan 0087).
    batches_at_most: usize,
    batch_hold: Duration,
    /// The turn preparations of turn starts that went into the waiting batch (a pass
    /// that had to keep its order).
    batch_starts: HashMap<TurnId, TurnPrep>,
    /// The leases of claims this relay won, by key and epoch: the start deadline of
    /// a turn is computed from them.
    leases: HashMap<(String, ClaimEpoch), Lease>,
    /// Cancelled when the relay stops waiting for in-flight writes.
    give_up: CancellationToken,
    /// The rooms it serves.
    rooms: Vec<String>,
    /// Recent messages per thread: the `<thread>` block of prompts.
    threads: huddle_core::thread::ThreadWindow,
    /// What the relay measures of itself.
    metrics: RelayMetrics,
    /// While the relay first catches up: the results of owner commands it derived,
    /// not written yet (see [`HeldResults`]).
    held: Option<HeldResults>,
    /// The snapshot file it keeps, when configured.
    snap: Option<SnapshotKeeper>,
    /// The last row of each owner command's results a write of this relay waits
    /// for (another relay holds the command's result claim): woken when read.
    results_awaited: HashMap<InteractionId, Arc<tokio::sync::Notify>>,
    /// Cancelled when the relay starts to stop: writes that only wait for another
    /// relay's end then.
    stopping: CancellationToken,
    /// Ends when the last owner-command results handed to a write are done: the next
    /// write waits for it (results in command order).
    command_writes: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// What a relay knows of the snapshot it keeps (plan 0063).
struct SnapshotKeeper {
    path: std::path::PathBuf,
    fingerprint: String,
    every_rows: u64,
    min_interval: Duration,
    /// Rows folded from the first row (those of the snapshot resumed from included).
    rows: u64,
    rows_at_last: u64,
    last_saved: Option<Instant>,
    /// The last row folded.
    last_row: Option<(InteractionId, Position)>,
    /// `room.archived` rows of the rooms it was configured to serve.
    archived: Vec<Interaction>,
    /// The write under way, off the event loop.
    writing: Option<tokio::task::JoinHandle<()>>,
    /// The last read step reached the end of the ledger.
    at_head: bool,
}

/// Owner-command results derived during the first catch-up, held until the relay has
/// checked that it may serve its rooms, and dropped as the ledger shows them already
/// written (a relay catching up on old history re-derives every command's results;
/// nearly all of them are there already).
#[derive(Default)]
struct HeldResults {
    rows: Vec<Option<NewInteraction>>,
    index: HashMap<InteractionId, usize>,
}

impl HeldResults {
    fn hold(&mut self, appends: Vec<NewInteraction>) {
        for row in appends {
            self.index.insert(row.id(), self.rows.len());
            self.rows.push(Some(row));
        }
    }

    /// `id` is in the ledger: no need to write it.
    fn written(&mut self, id: &InteractionId) {
        if let Some(i) = self.index.remove(id) {
            self.rows[i] = None;
        }
    }

    fn into_rows(self) -> Vec<NewInteraction> {
        self.rows.into_iter().flatten().collect()
    }
}

impl Relay {
    /// A relay over `store` speaking for `agents` in `rooms`.
    pub fn new(
        store: Arc<dyn Store>,
        relay_id: impl Into<String>,
        rooms: Vec<String>,
        agents: Vec<HostedAgent>,
        options: RelayOptions,
    ) -> Self {
        let relay_id = relay_id.into();
        Relay {
            store,
            metrics: RelayMetrics::new(&relay_id),
            relay_id,
            rooms,
            agents: agents
                .into_iter()
                .map(|a| (a.local.key.clone(), a))
                .collect(),
            options,
        }
    }

    /// The relay's metrics: a handle sharing the counts the running relay records
    /// (`huddle relay --metrics` serves its [`RelayMetrics::encode`]).
    pub fn metrics(&self) -> RelayMetrics {
        self.metrics.clone()
    }

    /// Runs until `shutdown` is cancelled and every turn has ended, then returns what
    /// it folded. Transient database errors are retried with a short back-off.
    pub async fn run(self, shutdown: CancellationToken) -> Result<RelaySummary, RelayError> {
        let locals: Vec<LocalAgent> = self.agents.values().map(|a| a.local.clone()).collect();
        let sync = Synchronizer::new(self.relay_id.clone(), self.rooms.clone(), locals.clone())
            .with_options(self.options.sync.clone())
            .with_reply_gate(Box::new(GuardGate::default()));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut lp = Loop {
            store: self.store.clone(),
            sync,
            agents: Arc::new(self.agents),
            turns: HashMap::new(),
            feedback: tx,
            commands: CommandHandler::new(self.rooms.clone()),
            summary: RelaySummary {
                relay: self.relay_id.clone(),
                ..Default::default()
            },
            recent: HashMap::new(),
            clock_offset: 0,
            ticks: VecDeque::new(),
            covered: None,
            refreshed_for: None,
            clock_base: Instant::now(),
            inflight: tokio::task::JoinSet::new(),
            batch: crate::batch::Batch::default(),
            batches_now: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            batches_at_most: self
                .options
                .batches_in_flight
                .clamp(1, MAX_BATCHES_IN_FLIGHT),
            batch_hold: self.options.batch_hold,
            batch_starts: HashMap::new(),
            leases: HashMap::new(),
            give_up: CancellationToken::new(),
            rooms: self.rooms.clone(),
            threads: Default::default(),
            metrics: self.metrics.clone(),
            held: Some(HeldResults::default()),
            snap: None,
            results_awaited: HashMap::new(),
            stopping: shutdown.clone(),
            command_writes: None,
        };
        let mut cursor = Position::START;
        if let Some(path) = self.options.snapshot.clone() {
            let fingerprint = crate::snapshot::fingerprint(
                &self.relay_id,
                &self.rooms,
                &locals,
                &self.options.sync,
            );
            lp.snap = Some(SnapshotKeeper {
                path,
                fingerprint,
                every_rows: self.options.snapshot_every_rows.max(1),
                min_interval: self.options.snapshot_min_interval,
                rows: 0,
                rows_at_last: 0,
                last_saved: None,
                last_row: None,
                archived: Vec::new(),
                writing: None,
                at_head: false,
            });
            if let Some(at) = lp.resume().await {
                cursor = at;
                if let Some(archived) = lp
                    .snap
                    .as_ref()
                    .and_then(|k| archived_room(&self.rooms, &k.archived))
                {
                    return Err(archived);
                }
            }
        }
        let ledger: Arc<dyn huddle_store::Ledger> = self.store.clone();
        // The read-forward runs in a task of its own: no other event can abort or
        // starve a read in flight (the loop only receives finished steps).
        let mut reader =
            Subscription::for_rooms(ledger, self.rooms.clone(), cursor, self.options.read_batch)
                .spawn(4, Duration::from_millis(200));
        let started = Instant::now();
        let mut caught_up_once = false;
        // Cancelled by the caller's shutdown, or when every room the relay serves has
        // been archived.
        let shutdown = shutdown.child_token();
        // Catch up with the rooms it serves before anything else: the start-up checks
        // read the owners' config from the fold this read builds (history is read
        // once), and nothing is decided before the first tick below. A database that
        // is away at start (restarting, failing over) is waited for.
        while !caught_up_once {
            tokio::select! {
                step = reader.recv() => match step {
                    Ok(step) => {
                        if let Some(archived) = archived_room(&lp.rooms, &step.batch.rows) {
                            return Err(archived);
                        }
                        lp.read_step(step, &mut cursor, started, &mut caught_up_once, &shutdown)
                            .await;
                    }
                    Err(e) => lp.transient(e).await?,
                },
                _ = shutdown.cancelled() => {
                    info!(relay = %lp.summary.relay, "shutting down before catching up");
                    lp.summary.agent_idle = lp.metrics.idle_gaps();
                    return Ok(lp.summary);
                }
            }
        }
        let writer = self.store.writer().unwrap_or_else(|| self.relay_id.clone());
        let hosted = lp.agents.keys().map(String::as_str);
        check_bindings(
            lp.commands.config(),
            &self.rooms,
            hosted,
            &writer,
            self.store.signer(),
        )?;
        let mut snapshot_now = false;
        if let Some(held) = lp.held.take() {
            let rows = held.into_rows();
            if !rows.is_empty() {
                info!(
                    rows = rows.len(),
                    "writing owner-command results missing from the ledger"
                );
                lp.write_command_results(rows);
            } else {
                // Caught up, nothing done yet (no row the fold asked for is still being
                // written): the state is the fold of the rows alone. Written once the
                // relay id is ours (a second process refused beside a live one writes
                // nothing).
                snapshot_now = lp.inflight.is_empty()
                    && lp.batch.is_empty()
                    && lp
                        .snap
                        .as_ref()
                        .is_some_and(|k| k.rows > k.rows_at_last || lp.summary.rows_resumed == 0);
            }
        }
        // One live process per relay id: refuse to start beside another.
        let mut delay = RETRY_FIRST;
        let mut identity = loop {
            match Identity::take(self.store.as_ref(), &self.relay_id).await {
                Err(IdentityError::Store(e)) if e.is_retryable() => {
                    warn!(error = %e, "database unavailable at start; retrying");
                    tokio::time::sleep(jittered(delay)).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
                other => break other?,
            }
        };
        if snapshot_now {
            lp.save_snapshot(cursor);
        }
        // First tick before anything: no decision is made before the synchronizer
        // knows the database time.
        loop {
            match lp.tick().await {
                Err(e) if e.is_retryable() => {
                    warn!(error = %e, "database unavailable at start; retrying");
                    tokio::time::sleep(jittered(delay)).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
                other => break other?,
            }
        }
        let mut beat = 0u64;
        lp.heartbeat(identity.instance(), cursor, beat).await;
        let mut next_beat = Instant::now() + self.options.heartbeat_every;
        let mut stopping = false;
        let mut stop_deadline: Option<tokio::time::Instant> = None;
        // Ticks fall due at an absolute time, at least every `max_tick` after the
        // last one however many other events arrive (a relative sleep re-armed on
        // every pass would starve the tick, and with it the relay id's renewal, under
        // a steady stream of events).
        let mut last_tick = tokio::time::Instant::now();
        loop {
            if lp.wants_fresh_read() {
                reader.refresh();
            }
            let tick_at = (tokio::time::Instant::now()
                + lp.until_next_wakeup(self.options.max_tick))
            .min(last_tick + self.options.max_tick);
            let batch_due = lp.batch_due();
            tokio::select! {
                step = reader.recv(), if !stopping => {
                    match step {
                        Ok(step) => {
                            lp.read_step(step, &mut cursor, started, &mut caught_up_once, &shutdown)
                                .await;
                        }
                        Err(e) => lp.transient(e).await?,
                    }
                }
                Some(fb) = rx.recv() => {
                    // Feedback that arrived together is handled with one scheduling
                    // pass (a batch of claims answered at once starts its turns at
                    // once instead of one pass per answer).
                    let mut events: Vec<Event> = lp.feedback_event(fb).into_iter().collect();
                    while events.len() < FEEDBACK_BATCH {
                        match rx.try_recv() {
                            Ok(fb) => events.extend(lp.feedback_event(fb)),
                            Err(_) => break,
                        }
                    }
                    if !events.is_empty() && lp.handle_all(events) {
                        break;
                    }
                }
                Some(_) = lp.inflight.join_next(), if !lp.inflight.is_empty() => {
                    lp.send_batch(false);
                }
                _ = tokio::time::sleep_until(batch_due.unwrap_or(tick_at)), if batch_due.is_some() => {
                    lp.send_batch(false);
                }
                _ = tokio::time::sleep_until(tick_at) => {
                    last_tick = tokio::time::Instant::now();
                    if let Err(e) = lp.tick().await {
                        warn!(error = %e, "reconcile tick failed");
                    }
                    // A quiet room reads nothing more: its snapshot is taken on a tick.
                    lp.maybe_snapshot(cursor);
                    match identity.keep(lp.store.as_ref()).await {
                        Ok(()) => {}
                        Err(IdentityError::Store(e)) => warn!(error = %e, "relay id renewal failed"),
                        Err(e) => {
                            // Another process runs as this relay now: stop acting at once.
                            for t in lp.turns.values() {
                                t.token.cancel();
                            }
                            return Err(e.into());
                        }
                    }
                    if !stopping && Instant::now() >= next_beat {
                        beat += 1;
                        lp.heartbeat(identity.instance(), cursor, beat).await;
                        next_beat = Instant::now() + self.options.heartbeat_every;
                    }
                    if let Some(deadline) = stop_deadline {
                        if tokio::time::Instant::now() > deadline {
                            warn!(turns = lp.turns.len(), "shutdown grace over; turns abandoned");
                            break;
                        }
                    }
                }
                _ = shutdown.cancelled(), if !stopping => {
                    info!(relay = %lp.summary.relay, "shutting down");
                    stopping = true;
                    stop_deadline = Some(tokio::time::Instant::now() + self.options.shutdown_grace);
                    if lp.handle(Event::Shutdown) {
                        break;
                    }
                }
            }
        }
        // Every result the turns produced is written before the relay reports: wait for
        // the outputs still in flight (their writes may be retrying) until the grace
        // ends, then give up on the rest (counted as lost).
        let grace_end = stop_deadline
            .unwrap_or_else(|| tokio::time::Instant::now() + self.options.shutdown_grace);
        lp.send_batch(true);
        while !lp.inflight.is_empty() {
            match tokio::time::timeout_at(grace_end, lp.inflight.join_next()).await {
                Ok(_) => lp.send_batch(true),
                Err(_) => {
                    lp.give_up.cancel();
                    loop {
                        lp.send_batch(true);
                        if lp.inflight.join_next().await.is_none() {
                            break;
                        }
                    }
                }
            }
        }
        while let Ok(fb) = rx.try_recv() {
            match fb {
                Feedback::ResultLost => {
                    lp.summary.results_lost += 1;
                    lp.metrics.result_lost();
                }
                Feedback::WriteRetried => {
                    lp.summary.writes_retried += 1;
                    lp.metrics.write_retried();
                }
                Feedback::CommandRowsSent(n) => lp.summary.command_rows_sent += n,
                _ => {}
            }
        }
        if lp.summary.results_lost > 0 {
            warn!(lost = lp.summary.results_lost, "results were not written");
        }
        // A clean stop with nothing of its own under way: keep the state for the next
        // start (the final read below feeds the synchronizer alone).
        if lp.idle() && lp.snap.as_ref().is_some_and(|k| k.rows > k.rows_at_last) {
            lp.save_snapshot(cursor);
        }
        lp.snapshot_written().await;
        // Fold everything committed so far, so relays stopped after a run can be
        // compared by their state hashes.
        drop(reader);
        let ledger: Arc<dyn huddle_store::Ledger> = self.store.clone();
        let mut sub =
            Subscription::for_rooms(ledger, self.rooms.clone(), cursor, self.options.read_batch);
        loop {
            match sub.poll_once().await {
                Ok(batch) if batch.rows.is_empty() && batch.skipped.is_empty() => break,
                Ok(batch) => {
                    lp.summary.skipped_rows += batch.skipped.len() as u64;
                    lp.metrics.read(batch.rows.len(), batch.skipped.len());
                    lp.sync.handle(Event::Ledger {
                        rows: batch.rows,
                        caught_up: false,
                    });
                }
                Err(e) => {
                    warn!(error = %e, "final catch-up read failed");
                    break;
                }
            }
        }
        lp.summary.cursor = sub.cursor().to_string();
        identity.release(lp.store.as_ref()).await;
        lp.summary.board_hash = hex::encode(lp.sync.board().state_hash());
        lp.summary.tasks_hash = hex::encode(lp.sync.tasks().state_hash());
        let authority = lp.commands.authority();
        lp.summary.unsigned_commands = authority.unsigned_commands();
        lp.summary.unauthorized_rows = authority.unauthorized_rows();
        lp.summary.misbound_rows = authority.misbound_rows();
        lp.summary.ignored_config_rows = authority.config().ignored_rows();
        lp.summary.unsigned_rows = authority.unsigned_rows();
        lp.summary.forged_writer_rows = authority.forged_writer_rows();
        if lp.summary.unsigned_rows + lp.summary.forged_writer_rows > 0 {
            warn!(
                unsigned_rows = lp.summary.unsigned_rows,
                forged_writer_rows = lp.summary.forged_writer_rows,
                "rows without a registered writer's signature were ignored"
            );
        }
        if lp.summary.misbound_rows > 0 {
            warn!(
                misbound_rows = lp.summary.misbound_rows,
                "rows written as a bound agent by another writer were ignored"
            );
        }
        if lp.summary.unsigned_commands + lp.summary.unauthorized_rows > 0 {
            warn!(
                unsigned_commands = lp.summary.unsigned_commands,
                unauthorized_rows = lp.summary.unauthorized_rows,
                ignored_config_rows = lp.summary.ignored_config_rows,
                "rows without a valid owner signature were ignored"
            );
        }
        lp.summary.agent_idle = lp.metrics.idle_gaps();
        Ok(lp.summary)
    }
}

/// The guards (turn cap, cooldown, rate cap, hops) as the synchronizer's reply gate:
/// it folds every message it is asked about and checks it at its database time.
#[derive(Default)]
struct GuardGate {
    guards: GuardFold,
}

impl ReplyGate for GuardGate {
    fn admit(&mut self, message: &Interaction, config: &RoomConfig) -> bool {
        self.guards.apply(message);
        match self
            .guards
            .check(&GuardTurn::for_message(message, message.at), config)
        {
            Verdict::Allow => true,
            Verdict::Deny(reason) => {
                debug!(room = %message.room, message = %message.id.short(), ?reason, "guard denied a reply");
                false
            }
        }
    }

    fn save(&self) -> Vec<u8> {
        huddle_core::sync::to_cbor(&self.guards)
    }

    fn load(&mut self, state: &[u8]) -> Result<(), String> {
        self.guards = huddle_core::sync::from_cbor(state).map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Loop {
    /// Restores the snapshot the relay keeps, when there is one it can trust, and
    /// returns where to read on from; `None` (read from the first row) otherwise, with
    /// the reason logged.
    async fn resume(&mut self) -> Option<Position> {
        let k = self.snap.as_ref()?;
        let (path, fingerprint) = (k.path.clone(), k.fingerprint.clone());
        let shown = path.display().to_string();
        let started = Instant::now();
        let read = tokio::task::spawn_blocking(move || crate::snapshot::read(&path, &fingerprint))
            .await
            .ok()?;
        let restored = match read {
            Ok(snap) => match snap.check_ledger(self.store.as_ref()).await {
                Ok(()) => self.restore(snap),
                Err(reason) => Err(reason),
            },
            Err(reason) => Err(reason),
        };
        match restored {
            Ok((cursor, rows)) => {
                info!(
                    path = %shown,
                    %cursor,
                    rows,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "resumed from the snapshot of its folds"
                );
                Some(cursor)
            }
            Err(crate::snapshot::Refused::Missing(_)) => {
                info!(path = %shown, "no snapshot yet; reading the rooms from the first row");
                None
            }
            Err(reason) => {
                warn!(path = %shown, %reason, "not resuming from the snapshot; reading the rooms from the first row");
                None
            }
        }
    }

    /// Puts a trusted snapshot's state in place; returns its cursor and rows. Each
    /// restore decodes before it changes anything, so a failure leaves the relay as
    /// fresh as it was.
    fn restore(
        &mut self,
        snap: crate::snapshot::Snapshot,
    ) -> Result<(Position, u64), crate::snapshot::Refused> {
        let undecodable =
            |e: huddle_core::sync::StateError| crate::snapshot::Refused::Decode(e.to_string());
        self.commands
            .restore_state(&snap.state.commands)
            .map_err(undecodable)?;
        if let Err(e) = self.sync.restore_state(&snap.state.sync) {
            self.commands = CommandHandler::new(self.rooms.clone());
            return Err(undecodable(e));
        }
        self.threads = snap.state.threads;
        self.recent = snap.state.recent.into_iter().collect();
        self.summary.rows_resumed = snap.rows;
        self.summary.cursor = snap.cursor.to_string();
        if let Some(k) = self.snap.as_mut() {
            k.rows = snap.rows;
            k.rows_at_last = snap.rows;
            k.last_row = snap.last;
            k.archived = snap.state.archived;
        }
        Ok((snap.cursor, snap.rows))
    }

    /// Writes a snapshot when enough rows were folded since the last one and nothing
    /// of the relay's own is under way (the state is then what the rows made of it).
    fn maybe_snapshot(&mut self, cursor: Position) {
        let Some(k) = self.snap.as_ref() else {
            return;
        };
        // The first of this run as soon as it is idle (the one at start is skipped when
        // owner-command results were still to be written), then every `every_rows`.
        if !k.at_head {
            return;
        }
        let due = match k.last_saved {
            None => k.rows > k.rows_at_last,
            Some(t) => k.rows - k.rows_at_last >= k.every_rows && t.elapsed() >= k.min_interval,
        };
        if due && self.idle() {
            self.save_snapshot(cursor);
        }
    }

    /// Nothing of this relay's own under way: no turn, claim or unconfirmed write in
    /// the synchronizer, no output being performed, no held command results.
    fn idle(&self) -> bool {
        self.sync.is_idle()
            && self.turns.is_empty()
            && self.inflight.is_empty()
            && self.batch.is_empty()
            && self.held.is_none()
    }

    /// Writes the snapshot of the folds as of `cursor`, off the event loop (skipped
    /// while the previous one is still being written).
    fn save_snapshot(&mut self, cursor: Position) {
        let Some(k) = self.snap.as_mut() else {
            return;
        };
        if k.writing.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let state = crate::snapshot::RelayState {
            sync: self.sync.save_state(),
            commands: self.commands.save_state(),
            threads: self.threads.clone(),
            recent: self
                .recent
                .iter()
                .map(|(room, w)| (room.clone(), w.clone()))
                .collect(),
            archived: k.archived.clone(),
        };
        let snapshot = crate::snapshot::Snapshot {
            cursor,
            last: k.last_row,
            rows: k.rows,
            state,
        };
        k.rows_at_last = k.rows;
        k.last_saved = Some(Instant::now());
        self.summary.snapshots_written += 1;
        let (path, fingerprint) = (k.path.clone(), k.fingerprint.clone());
        k.writing = Some(tokio::task::spawn_blocking(
            move || match crate::snapshot::write(&path, &fingerprint, &snapshot) {
                Ok(bytes) => info!(
                    path = %path.display(),
                    cursor = %snapshot.cursor,
                    rows = snapshot.rows,
                    bytes,
                    "wrote the snapshot of its folds"
                ),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "could not write the snapshot of its folds")
                }
            },
        ));
    }

    /// Waits for the snapshot being written, if any.
    async fn snapshot_written(&mut self) {
        if let Some(h) = self.snap.as_mut().and_then(|k| k.writing.take()) {
            let _ = h.await;
        }
    }

    async fn transient(&mut self, e: StoreError) -> Result<(), RelayError> {
        if e.is_retryable() {
            warn!(error = %e, "database unavailable; retrying");
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(())
        } else {
            Err(e.into())
        }
    }

    fn db_now_estimate(&self) -> Timestamp {
        Timestamp(self.clock_base.elapsed().as_micros() as i64 + self.clock_offset)
    }

    fn until_next_wakeup(&self, max: Duration) -> Duration {
        match self.sync.next_wakeup() {
            Some(at) => {
                let left = at - self.db_now_estimate();
                Duration::from_micros(left.clamp(1_000, max.as_micros() as i64) as u64)
            }
            None => max,
        }
    }

    /// Writes one `relay.heartbeat` per hosted room, off the event loop (bounded in
    /// time, so a slow database never holds up the relay): the agents, the version and
    /// how many committed rows lie past `cursor` (at most [`BEHIND_PROBE`]). A heartbeat
    /// that cannot be written is logged and skipped; the next one follows.
    async fn heartbeat(&mut self, instance: &str, cursor: Position, beat: u64) {
        let agents: Vec<String> = self.agents.keys().cloned().collect();
        let batch: Vec<NewInteraction> = self
            .rooms
            .iter()
            .map(|room| {
                let body = huddle_core::protocol::RelayHeartbeatBody {
                    relay: self.summary.relay.clone(),
                    instance: instance.to_string(),
                    beat,
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    agents: agents.clone(),
                    behind: 0,
                };
                NewInteraction::new(
                    room.as_str(),
                    Verb::RelayHeartbeat,
                    self.summary.relay.as_str(),
                    Role::System,
                    body.to_body(),
                )
            })
            .collect();
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let rooms = self.rooms.clone();
        tokio::spawn(async move {
            let write = async {
                let behind = match store.read_rooms(&rooms, cursor, BEHIND_PROBE).await {
                    Ok(b) => (b.rows.len() + b.skipped.len()) as u64,
                    Err(e) => {
                        debug!(error = %e, "could not read ahead for the heartbeat");
                        0
                    }
                };
                let batch: Vec<NewInteraction> = batch
                    .into_iter()
                    .map(|mut row| {
                        row.body["behind"] = serde_json::Value::from(behind);
                        row
                    })
                    .collect();
                let rows = batch.len();
                match store.append(batch).await {
                    Ok(_) => {
                        metrics.appended(rows, false);
                        debug!(beat, behind, "heartbeat written");
                    }
                    Err(e) => warn!(beat, error = %e, "heartbeat not written"),
                }
            };
            if tokio::time::timeout(Duration::from_secs(10), write)
                .await
                .is_err()
            {
                warn!(beat, "heartbeat not written in time");
            }
        });
    }

    async fn tick(&mut self) -> Result<(), StoreError> {
        // Leases long over are of no use for a start deadline (a live turn's are
        // renewed, so they stay fresh).
        self.leases
            .retain(|_, l| l.from.elapsed() < l.ttl.saturating_mul(2));
        let now = self.store.now().await?;
        self.ticks.push_back((Instant::now(), now));
        while self.ticks.len() > 16 {
            self.ticks.pop_front();
        }
        self.clock_offset = now.as_micros() - self.clock_base.elapsed().as_micros() as i64;
        self.handle(Event::Tick { now });
        Ok(())
    }

    /// A caught-up read that began at `began` has been folded: it covers every row
    /// committed before the latest tick whose clock reading had returned by then.
    fn covered(&mut self, began: Option<Instant>) {
        let Some(began) = began else { return };
        let as_of = self
            .ticks
            .iter()
            .filter(|(read_at, _)| *read_at <= began)
            .map(|(_, t)| *t)
            .max();
        if let Some(as_of) = as_of.filter(|t| self.covered.is_none_or(|c| *t > c)) {
            self.covered = Some(as_of);
            self.handle(Event::Covered { as_of });
        }
    }

    /// Whether the synchronizer waits for a view covering a time the relay's clock
    /// has passed, and no fresh read was asked for it yet.
    fn wants_fresh_read(&mut self) -> bool {
        let Some(wanted) = self.sync.awaiting_coverage() else {
            return false;
        };
        let clock = self.ticks.back().map(|(_, t)| *t);
        let due = clock.is_some_and(|t| t >= wanted)
            && self.covered.is_none_or(|c| c < wanted)
            && self
                .refreshed_for
                .is_none_or(|r| clock.is_some_and(|t| t > r));
        if due {
            self.refreshed_for = clock;
        }
        due
    }

    /// Folds one step of the read-forward.
    async fn read_step(
        &mut self,
        step: ReadStep,
        cursor: &mut Position,
        started: Instant,
        caught_up_once: &mut bool,
        shutdown: &CancellationToken,
    ) {
        let ReadStep {
            batch,
            caught_up,
            began,
            woken,
        } = step;
        self.summary.skipped_rows += batch.skipped.len() as u64;
        self.summary.rows_read += (batch.rows.len() + batch.skipped.len()) as u64;
        self.metrics.read(batch.rows.len(), batch.skipped.len());
        if let Some(woken) = woken.filter(|_| !batch.rows.is_empty()) {
            self.metrics.woke(woken.elapsed());
        }
        for s in &batch.skipped {
            debug!(position = %s.position, reason = %s.reason, "skipped a ledger row");
        }
        *cursor = batch.next;
        self.summary.cursor = cursor.to_string();
        if let Some(k) = self.snap.as_mut() {
            k.rows += (batch.rows.len() + batch.skipped.len()) as u64;
            if let Some(r) = batch.rows.last() {
                k.last_row = Some((r.id, r.position));
            }
            k.at_head = caught_up;
        }
        self.ledger(batch.rows, caught_up).await;
        self.maybe_snapshot(*cursor);
        if caught_up {
            self.covered(began);
            if !*caught_up_once {
                *caught_up_once = true;
                info!(
                    rows = self.summary.rows_read,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "caught up with the rooms it serves"
                );
            }
        }
        if self.rooms.is_empty() && !shutdown.is_cancelled() {
            warn!("every room this relay serves was archived; stopping");
            shutdown.cancel();
        }
    }

    async fn ledger(&mut self, rows: Vec<Interaction>, caught_up: bool) {
        // A served room archived by its owner (while this relay ran: one archived
        // before it started is refused at start) takes no more rows: stop serving it.
        for row in rows.iter().filter(|r| r.verb == Verb::RoomArchived) {
            if let Some(i) = self.rooms.iter().position(|r| *r == row.room) {
                if let Some(k) = self.snap.as_mut() {
                    k.archived.push(row.clone());
                }
                warn!(room = %row.room, owner = %row.actor, "the room was archived by its owner; this relay no longer serves it");
                self.rooms.remove(i);
            }
        }
        // A window of recent messages per served room (memory independent of the
        // rooms in the ledger that this relay does not serve). Rows that later rows of
        // the same batch push out are not copied.
        let messages: Vec<&Interaction> = rows
            .iter()
            .filter(|r| r.verb == Verb::MessagePosted && self.sync.serves(&r.room))
            .collect();
        self.threads.observe_all(&messages);
        let keep =
            huddle_core::thread::last_of_each(&messages, CONTEXT_WINDOW, |r| Some(r.room.as_str()));
        for (row, keep) in messages.into_iter().zip(keep) {
            if !keep {
                continue;
            }
            let window = self.recent.entry(row.room.clone()).or_default();
            window.push_back(row.clone());
            while window.len() > CONTEXT_WINDOW {
                window.pop_front();
            }
        }
        // Owner commands are executed by every relay: their results are deterministic
        // content, written by the one relay that wins the command's result claim
        // (plan 0090); the others wait for them here.
        let seen: Vec<InteractionId> = match self.held {
            Some(_) => rows.iter().map(|r| r.id).collect(),
            None => Vec::new(),
        };
        if !self.results_awaited.is_empty() {
            for row in &rows {
                if let Some(seen) = self.results_awaited.remove(&row.id) {
                    seen.notify_one();
                }
            }
        }
        let observed = self.commands.observe(rows);
        if !observed.appends.is_empty() {
            self.write_command_results(observed.appends);
        }
        if let Some(held) = self.held.as_mut() {
            for id in &seen {
                held.written(id);
            }
        }
        let mut ended_with_rows = false;
        let last = observed.steps.len();
        for (i, step) in observed.steps.into_iter().enumerate() {
            ended_with_rows = false;
            match step {
                Step::Rows(rows) => {
                    self.handle(Event::Ledger {
                        rows,
                        caught_up: caught_up && i + 1 == last,
                    });
                    ended_with_rows = true;
                }
                Step::Config {
                    room,
                    thread,
                    config,
                } => {
                    self.handle(Event::Config {
                        room,
                        thread,
                        config,
                    });
                }
                Step::Stop {
                    room,
                    command,
                    stop,
                } => {
                    info!(room = %room, agent = ?stop.agent, thread = ?stop.thread, command = %command.short(), "the owner stops running turns");
                    self.handle(Event::Stop {
                        room,
                        agent: stop.agent,
                        thread: stop.thread,
                        command,
                    });
                }
                Step::Watch { room, watch } => {
                    self.handle(Event::Watch {
                        room,
                        thread: watch.thread,
                        agent: watch.agent,
                        watch: watch.watch,
                    });
                }
            }
        }
        if !ended_with_rows {
            self.handle(Event::Ledger {
                rows: Vec::new(),
                caught_up,
            });
        }
    }

    /// Writes the results of owner commands: one write per command, elected among the
    /// relays by the command's result claim (plan 0090, [`Executor::write_command_result`]).
    /// The last row of each command's results is filed in `results_awaited`, so a
    /// relay waiting for another to write them learns from its reader when they are in.
    ///
    /// Commands are handled one after the other, in ledger order (each call's writes
    /// start once the previous call's have ended): a relay turns to a command only
    /// when the previous one's results are in the ledger (written here, read, or
    /// closed by their writer), so whichever relays write them, commands' results —
    /// their replies above all — are in the ledger in the order of the commands.
    fn write_command_results(&mut self, appends: Vec<NewInteraction>) {
        if let Some(held) = self.held.as_mut() {
            return held.hold(appends);
        }
        let mut groups: Vec<Vec<NewInteraction>> = Vec::new();
        for row in appends {
            match groups.last_mut() {
                Some(g) if g[0].parent == row.parent => g.push(row),
                _ => groups.push(vec![row]),
            }
        }
        let groups: Vec<_> = groups
            .into_iter()
            .map(|group| {
                let seen = match (group[0].parent, group.last()) {
                    (Some(_), Some(last)) => {
                        let seen = Arc::new(tokio::sync::Notify::new());
                        self.results_awaited.insert(last.id(), seen.clone());
                        Some(seen)
                    }
                    _ => None,
                };
                (group, seen)
            })
            .collect();
        let exec = self.executor();
        let stopping = self.stopping.clone();
        let (done, next) = tokio::sync::oneshot::channel::<()>();
        let previous = self.command_writes.replace(next);
        self.inflight.spawn(async move {
            if let Some(previous) = previous {
                // Ended (or dropped, if it failed): either way, this one's turn.
                let _ = previous.await;
            }
            for (group, seen) in groups {
                exec.write_command_result(group, seen, stopping.clone())
                    .await;
            }
            drop(done);
        });
    }

    fn executor(&self) -> Executor {
        Executor {
            store: self.store.clone(),
            relay: self.summary.relay.clone(),
            agents: self.agents.clone(),
            feedback: self.feedback.clone(),
            give_up: self.give_up.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The synchronizer event a piece of feedback from the executor or a turn
    /// becomes, after its effects on the relay's own tables (none for feedback that
    /// only updates those tables or the counts).
    fn feedback_event(&mut self, fb: Feedback) -> Option<Event> {
        Some(match fb {
            Feedback::Claim(c) => Event::ClaimResult(c),
            Feedback::Resources { key, epoch, answer } => {
                Event::ResourcesResult { key, epoch, answer }
            }
            Feedback::Confirmed { key, epoch, lease } => {
                self.leases.insert((key, epoch), lease);
                return None;
            }
            Feedback::Lost { key, epoch, fenced } => {
                if fenced {
                    self.summary.fenced_refusals += 1;
                }
                self.metrics.claim_lost(&key, fenced);
                self.leases.remove(&(key.clone(), epoch));
                for t in self.turns.values_mut() {
                    if t.claims.iter().any(|c| c.key == key && c.epoch == epoch) {
                        t.lost = true;
                    }
                }
                Event::ClaimLost { key, epoch }
            }
            Feedback::TurnEnded {
                turn,
                outcome,
                tokens,
                activity,
            } => {
                let ended = self.turns.remove(&turn);
                let lost = ended.as_ref().is_some_and(|t| t.lost);
                for c in ended.iter().flat_map(|t| &t.claims) {
                    self.leases.remove(&(c.key.clone(), c.epoch));
                }
                let end = match &outcome {
                    // A reply under a lost claim is never written: the turn
                    // failed, whatever the agent answered.
                    CoreOutcome::Replied { .. } if !lost => {
                        self.summary.turns_replied += 1;
                        TurnEnd::Replied
                    }
                    CoreOutcome::NotStarted { .. } => {
                        self.summary.turns_started = self.summary.turns_started.saturating_sub(1);
                        self.summary.turns_not_started += 1;
                        TurnEnd::NotStarted
                    }
                    other => {
                        self.summary.turns_failed += 1;
                        match other {
                            CoreOutcome::Replied { .. } => TurnEnd::Lost,
                            CoreOutcome::Cancelled => TurnEnd::Cancelled,
                            _ => TurnEnd::Failed,
                        }
                    }
                };
                if let Some(t) = &ended {
                    let ran = (end != TurnEnd::NotStarted).then(|| t.started.elapsed());
                    self.metrics.turn_ended(t.work, end, ran);
                }
                Event::TurnEnded {
                    turn,
                    outcome,
                    tokens,
                    activity,
                }
            }
            Feedback::Failed(e) => {
                warn!(error = %e, "a store operation failed");
                return None;
            }
            Feedback::WriteRetried => {
                self.summary.writes_retried += 1;
                self.metrics.write_retried();
                return None;
            }
            Feedback::ResultLost => {
                self.summary.results_lost += 1;
                self.metrics.result_lost();
                return None;
            }
            Feedback::CommandRowsSent(n) => {
                self.summary.command_rows_sent += n;
                return None;
            }
        })
    }

    /// Feeds an event; performs the intents. Returns true when the relay may stop.
    fn handle_all(&mut self, events: Vec<Event>) -> bool {
        let intents = self.sync.handle_all(events);
        let stopped = intents.iter().any(|i| matches!(i, Intent::Stopped));
        self.spawn_intents(intents);
        stopped
    }

    fn handle(&mut self, event: Event) -> bool {
        let intents = self.sync.handle(event);
        let stopped = intents.iter().any(|i| matches!(i, Intent::Stopped));
        self.spawn_intents(intents);
        stopped
    }

    /// The `<related-context>` block for a reply turn in a thread: the most related
    /// messages of sibling threads, from the bounded window of recent messages.
    fn related_context(&self, start: &TurnStart) -> Option<String> {
        let TurnWork::Reply(brief) = &start.work else {
            return None;
        };
        let window: Vec<Interaction> = self.recent.get(&start.room)?.iter().cloned().collect();
        let target = window.iter().find(|m| m.id == brief.id)?;
        let rules = ContextRules::default();
        let picked = select_related(target, &window, &rules);
        let text = render_related_context(&picked, &rules);
        (!text.is_empty()).then_some(text)
    }

    /// The `<thread>` block of a turn: what was said in its thread (a task's: the
    /// room's top level) since the agent last spoke there, within the room's
    /// `thread-context` budget.
    fn thread_context(&self, start: &TurnStart) -> Option<String> {
        let answering = match &start.work {
            TurnWork::Reply(m) => Some(m.id),
            TurnWork::Task(_) | TurnWork::Review(_) => None,
        };
        let budget = self
            .sync
            .config(&start.room, start.thread.as_deref())
            .thread_context_bytes as usize;
        self.threads.block(
            &start.room,
            start.thread.as_deref(),
            &start.agent,
            answering,
            budget,
        )
    }

    fn spawn_intents(&mut self, intents: Vec<Intent>) {
        if intents.is_empty() {
            return;
        }
        // Start turns and cancellations here, where the turn table lives; everything
        // that talks to the store runs in order on a task of its own.
        let mut ordered: Vec<Intent> = Vec::with_capacity(intents.len());
        for intent in intents {
            match intent {
                Intent::Cancel { turn } => {
                    if let Some(t) = self.turns.get(&turn) {
                        t.token.cancel();
                    }
                }
                Intent::Stopped => {}
                other => ordered.push(other),
            }
        }
        if ordered.is_empty() {
            return;
        }
        // Turn tokens are created now so a Cancel in a later output finds them; the
        // related context is chosen here, where the window of recent messages lives.
        let mut starts: HashMap<TurnId, TurnPrep> = HashMap::new();
        for intent in &ordered {
            if let Intent::Release { key, epoch, .. } = intent {
                self.leases.remove(&(key.clone(), *epoch));
            }
            if let Intent::StartTurn(start) = intent {
                let token = CancellationToken::new();
                let work = match &start.work {
                    TurnWork::Reply(_) => WorkKind::Reply,
                    TurnWork::Task(_) => WorkKind::Task,
                    TurnWork::Review(_) => WorkKind::Review,
                };
                let replaced = self.turns.insert(
                    start.turn.clone(),
                    LiveTurn {
                        token: token.clone(),
                        claims: start.claims.clone(),
                        lost: false,
                        work,
                        started: Instant::now(),
                    },
                );
                if let Some(old) = replaced {
                    // Not expected (turn ids are unique); keeps the running gauge true.
                    self.metrics.turn_ended(old.work, TurnEnd::Cancelled, None);
                }
                self.metrics.turn_started(work);
                let leases = start
                    .claims
                    .iter()
                    .map(|c| self.leases.get(&(c.key.clone(), c.epoch)).copied())
                    .collect();
                // The prompt's context blocks: related threads, then this thread.
                let related = [self.related_context(start), self.thread_context(start)]
                    .into_iter()
                    .flatten()
                    .reduce(|a, b| format!("{a}{b}"));
                starts.insert(
                    start.turn.clone(),
                    TurnPrep {
                        token,
                        related,
                        leases,
                    },
                );
                self.summary.turns_started += 1;
            }
        }
        let ordered = self.batch.take(ordered, tokio::time::Instant::now());
        let kept: std::collections::HashSet<&TurnId> = ordered
            .iter()
            .filter_map(|i| match i {
                Intent::StartTurn(s) => Some(&s.turn),
                _ => None,
            })
            .collect();
        let (starts, waiting): (HashMap<_, _>, HashMap<_, _>) =
            starts.into_iter().partition(|(t, _)| kept.contains(t));
        self.batch_starts.extend(waiting);
        if !ordered.is_empty() {
            let exec = self.executor();
            self.inflight
                .spawn(async move { exec.perform(ordered, starts).await });
        }
        self.send_batch(false);
    }

    /// When the waiting batch is due, if one waits and fewer batches than allowed
    /// ([`RelayOptions::batches_in_flight`]) are in flight.
    fn batch_due(&self) -> Option<tokio::time::Instant> {
        if self.batch.is_empty()
            || self.batches_now.load(std::sync::atomic::Ordering::Acquire) >= self.batches_at_most
        {
            return None;
        }
        let task_turns = self.turns.values().any(|t| t.work == WorkKind::Task);
        self.batch.due(self.batch_hold, task_turns)
    }

    /// Sends the waiting batch when it is due (`now`: at once, at shutdown) and fewer
    /// batches than allowed are in flight.
    fn send_batch(&mut self, now: bool) {
        use std::sync::atomic::Ordering;
        if self.batches_now.load(Ordering::Acquire) >= self.batches_at_most || self.batch.is_empty()
        {
            return;
        }
        if !now
            && self
                .batch_due()
                .is_some_and(|due| due > tokio::time::Instant::now())
        {
            return;
        }
        let intents = self.batch.drain();
        let starts = std::mem::take(&mut self.batch_starts);
        self.batches_now.fetch_add(1, Ordering::AcqRel);
        let in_flight = self.batches_now.clone();
        let exec = self.executor();
        self.inflight.spawn(async move {
            exec.perform(intents, starts).await;
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// First and longest wait between retries of a write that failed because the
/// database was unavailable.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Waits out `delay` (jittered) before a write or read is tried again, or until the
/// relay gives up; the next wait is twice as long, up to [`RETRY_MAX`].
async fn back_off(delay: &mut Duration, give_up: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(jittered(*delay)) => {}
        _ = give_up.cancelled() => {}
    }
    *delay = (*delay * 2).min(RETRY_MAX);
}

/// How long a relay holds the claim to write an owner command's results
/// (`cmdresult/<room>/<command>`, plan 0090); the others wait for the rows at most
/// this long before trying to take it over.
const COMMAND_RESULT_LEASE: Duration = Duration::from_secs(10);
/// How many leases of another holder a relay waits out before writing an owner
/// command's results itself anyway (they dedupe).
const COMMAND_RESULT_WAITS: u32 = 3;

/// Most pieces of feedback handled with one scheduling pass.
const FEEDBACK_BATCH: usize = 512;

/// Longest a turn's end waits for its progress notes to be written.
const PROGRESS_DRAIN: Duration = Duration::from_secs(2);

/// Most rows a heartbeat reads past the relay's cursor to tell how far behind it is.
const BEHIND_PROBE: usize = 1_000;

/// What the event loop hands the executor for a turn it starts: its cancellation
/// token, its related context and what the relay knows of its claims' leases (in the
/// order of `TurnStart::claims`).
#[derive(Default)]
struct TurnPrep {
    token: CancellationToken,
    related: Option<String>,
    leases: Vec<Option<Lease>>,
}

/// Whether a turn may start, and until when.
enum Vouched {
    /// Every claim is held; the agent must start before this moment.
    Until(Instant),
    /// A claim is no longer held (reported as lost).
    Lost,
    /// The claims could not be confirmed (the store failed); nothing starts.
    Unknown(String),
}

/// `d` plus up to a quarter of it, so relays that lost the database together do not
/// retry in lockstep. The jitter comes from the clock's sub-microsecond noise: it needs
/// to be uncorrelated between processes, not unpredictable.
/// Refuses to host an agent that a hosted room's owner bound to writers other than
/// `writer` (`!config agents`), and to join a room that would ignore every row this
/// relay writes, signed by `signer` or unsigned (`!config relay-keys`,
/// `require-signatures`): every reader would ignore what this relay writes. `config`
/// is the owners' config folded from each hosted room's history.
fn check_bindings<'a>(
    config: &huddle_core::config::ConfigFold,
    rooms: &[String],
    agents: impl Iterator<Item = &'a str> + Clone,
    writer: &str,
    signer: Option<huddle_core::keys::WriterKey>,
) -> Result<(), RelayError> {
    for room in rooms {
        let config = config.effective(room, None);
        signing_refusal(&config, room, writer, signer.as_ref())?;
        for agent in agents.clone() {
            refusal(&config, room, agent, writer)?;
        }
    }
    Ok(())
}

/// The refusal to serve a room its owner archived, when `rows` hold its
/// `room.archived` row.
fn archived_room(rooms: &[String], rows: &[Interaction]) -> Option<RelayError> {
    let row = rows
        .iter()
        .find(|r| r.verb == Verb::RoomArchived && rooms.contains(&r.room))?;
    let body: Option<huddle_core::protocol::RoomArchivedBody> =
        serde_json::from_value(row.body.clone()).ok();
    Some(RelayError::RoomArchived {
        room: row.room.clone(),
        owner: row.actor.clone(),
        rows: body.map_or(0, |b| b.rows),
    })
}

fn jittered(d: Duration) -> Duration {
    let noise = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos() as u64)
        .unwrap_or(0);
    let quarter = (d.as_micros() as u64 / 4).max(1);
    d + Duration::from_micros(noise % quarter)
}

/// Performs one output of intents against the store and the drivers.
struct Executor {
    store: Arc<dyn Store>,
    /// The relay's id: the actor of the lots it writes.
    relay: String,
    agents: Arc<BTreeMap<String, HostedAgent>>,
    feedback: mpsc::UnboundedSender<Feedback>,
    /// Cancelled when the relay stops waiting for its writes (end of shutdown grace).
    give_up: CancellationToken,
    metrics: RelayMetrics,
}

impl Executor {
    async fn perform(self, intents: Vec<Intent>, mut starts: HashMap<TurnId, TurnPrep>) {
        let intents = match self.results_with_handoff(intents).await {
            Some(rest) => rest,
            None => return,
        };
        let mut refused: Vec<ClaimRef> = Vec::new();
        // Consecutive acquires go to the store as one batch (one round trip, one
        // commit), sent before the next intent, as each single acquire was.
        let mut acquires: Vec<PendingAcquire> = Vec::new();
        // Consecutive turn results (appends that close their claims) are written
        // concurrently: each is its own transaction under its own turn's claims, and
        // none refers to another, so the order they commit in does not matter.
        let mut results: Vec<(Vec<ClaimRef>, Vec<NewInteraction>)> = Vec::new();
        // The hand-offs sent: the output is performed once they are answered (a
        // batch's successor waits for them, plan 0081).
        let mut handoffs = Vec::new();
        for intent in intents {
            if !matches!(intent, Intent::Acquire { .. }) && !acquires.is_empty() {
                handoffs.push(self.acquire_all(std::mem::take(&mut acquires)));
            }
            let is_result =
                matches!(&intent, Intent::Append { close: true, fences, .. } if !fences.is_empty());
            if !is_result && !results.is_empty() {
                refused.extend(self.append_results(std::mem::take(&mut results)).await);
            }
            match intent {
                Intent::Acquire { .. } => {
                    acquires.extend(PendingAcquire::of(intent));
                    continue;
                }
                Intent::Append { fences, batch, .. } if is_result => {
                    results.push((fences, batch));
                    continue;
                }
                Intent::Append {
                    fences,
                    close,
                    batch,
                } => {
                    refused.extend(self.append_intent(fences, close, batch).await);
                }
                Intent::StartTurn(start) => {
                    let prep = starts.remove(&start.turn).unwrap_or_default();
                    let vouched = if start.claims.iter().any(|c| refused.contains(c)) {
                        // Its fenced append was refused: the turn never runs.
                        Vouched::Lost
                    } else {
                        self.vouch(&start.claims, &prep.leases, start.agent.as_str())
                            .await
                    };
                    let outcome = match vouched {
                        Vouched::Until(by) => {
                            self.start_turn(*start, prep.token, prep.related, by);
                            continue;
                        }
                        Vouched::Lost => CoreOutcome::Cancelled,
                        Vouched::Unknown(reason) => CoreOutcome::NotStarted { reason },
                    };
                    let _ = self.feedback.send(Feedback::TurnEnded {
                        turn: start.turn.clone(),
                        outcome,
                        tokens: 0,
                        activity: TurnActivity::default(),
                    });
                }
                Intent::Renew {
                    key,
                    holder,
                    epoch,
                    ttl,
                } => match self.renew(&key, &holder, epoch, ttl).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        log_lost_claim(
                            &*self.store,
                            "claim lost at renewal",
                            &key,
                            &holder,
                            None,
                            epoch,
                        )
                        .await;
                        let _ = self.feedback.send(Feedback::Lost {
                            key,
                            epoch,
                            fenced: false,
                        });
                    }
                    Err(e) => {
                        // Unknown: the next reconcile pass renews again; the lease
                        // lapses by itself if the database stays away.
                        warn!(key, error = %e, "renew failed");
                    }
                },
                Intent::Release { key, holder, epoch } => {
                    if let Err(e) = self.store.release(&key, &holder, epoch).await {
                        warn!(key, error = %e, "release failed; the lease will lapse");
                    }
                }
                Intent::AcquireResources {
                    room,
                    holder,
                    wanted,
                    ttl,
                    key,
                    epoch,
                } => {
                    let answer = self.acquire_uses(&room, &holder, &wanted, ttl).await;
                    let _ = self
                        .feedback
                        .send(Feedback::Resources { key, epoch, answer });
                }
                Intent::Cancel { .. } | Intent::Stopped => {}
            }
        }
        if !results.is_empty() {
            self.append_results(results).await;
        }
        if !acquires.is_empty() {
            handoffs.push(self.acquire_all(acquires));
        }
        for h in handoffs {
            let _ = h.await;
        }
    }

    /// A batch of task results then acquisitions (plan 0081) whose results make one
    /// write (one lot, or one result alone) goes as one store call with the hand-off
    /// (plan 0082); returns `None` when it did, else the intents untouched. When the
    /// results' write is refused (a claim lost) or fails for good, the hand-off goes
    /// alone and the results are then written as before (lot, then one by one).
    async fn results_with_handoff(&self, intents: Vec<Intent>) -> Option<Vec<Intent>> {
        let split = intents
            .iter()
            .position(|i| matches!(i, Intent::Acquire { .. }))
            .unwrap_or(intents.len());
        let shaped = split > 0
            && split < intents.len()
            && intents[..split].iter().all(|i| {
                matches!(i, Intent::Append { close: true, fences, batch }
                    if !fences.is_empty() && crate::lots::lottable(batch))
            })
            && intents[split..]
                .iter()
                .all(|i| matches!(i, Intent::Acquire { .. }));
        if !shaped {
            return Some(intents);
        }
        // Whether the batch can go as one call is decided on the intents as they are
        // (the acquires' keys, how the results pack); only then are they taken apart,
        // their rows moved, not copied.
        let mut acquires: Vec<PendingAcquire> = intents[split..]
            .iter()
            .filter_map(PendingAcquire::without_rows)
            .collect();
        let Some((requests, slots)) = batch_requests(&acquires) else {
            return Some(intents);
        };
        let (mut lots, left) = {
            let writes: Vec<&[NewInteraction]> = intents[..split]
                .iter()
                .filter_map(|i| match i {
                    Intent::Append { batch, .. } => Some(batch.as_slice()),
                    _ => None,
                })
                .collect();
            crate::lots::pack(&writes, &self.relay, self.store.limits())
        };
        enum One {
            Lot(Box<crate::lots::Lot>),
            Alone(usize),
        }
        let one = match (lots.len(), left.as_slice()) {
            (1, []) => One::Lot(Box::new(lots.remove(0))),
            (0, [i]) => One::Alone(*i),
            _ => return Some(intents),
        };
        let mut intents = intents;
        for (a, intent) in acquires.iter_mut().zip(intents.split_off(split)) {
            if let Intent::Acquire { write, .. } = intent {
                a.write = write;
            }
        }
        let results: Vec<(Vec<ClaimRef>, Vec<NewInteraction>)> = intents
            .into_iter()
            .filter_map(|i| match i {
                Intent::Append { fences, batch, .. } => Some((fences, batch)),
                _ => None,
            })
            .collect();
        let first = match &one {
            One::Lot(lot) => {
                let fences = lot
                    .members
                    .iter()
                    .flat_map(|&i| results[i].0.iter().map(Fence::from))
                    .collect();
                (fences, vec![lot.row.clone()])
            }
            One::Alone(i) => (
                results[*i].0.iter().map(Fence::from).collect(),
                results[*i].1.clone(),
            ),
        };
        let first = huddle_store::FencedWrite {
            fences: first.0,
            close: true,
            rows: first.1,
        };
        let _queued = self.metrics.outbox_entry();
        let answer = (
            &*self.store,
            &self.feedback,
            &self.metrics,
            self.relay.as_str(),
            &self.give_up,
        );
        let written = answer_acquires(answer, &acquires, &requests, &slots, Some(first)).await;
        if !written {
            match one {
                One::Lot(lot) => {
                    self.append_lot(&results, *lot).await;
                }
                One::Alone(i) => {
                    let (fences, batch) = results[i].clone();
                    self.append_intent(fences, true, batch).await;
                }
            }
        }
        None
    }

    /// Writes turn results concurrently; returns the claims of those refused.
    async fn append_results(
        &self,
        results: Vec<(Vec<ClaimRef>, Vec<NewInteraction>)>,
    ) -> Vec<ClaimRef> {
        // Task turns' results of one room go as one lot (plan 0080) under all their
        // claims, closing them; the rest, and a lot's results when the lot is refused
        // (one of its claims lost), one write each.
        let (lots, left) = {
            let writes: Vec<&[NewInteraction]> = results.iter().map(|r| r.1.as_slice()).collect();
            crate::lots::pack(&writes, &self.relay, self.store.limits())
        };
        let lone = futures::future::join_all(
            left.into_iter()
                .map(|i| self.append_intent(results[i].0.clone(), true, results[i].1.clone())),
        );
        let packed =
            futures::future::join_all(lots.into_iter().map(|lot| self.append_lot(&results, lot)));
        let (lone, packed) = futures::future::join(lone, packed).await;
        lone.into_iter().chain(packed).flatten().collect()
    }

    /// Writes a lot of turn results (`lot.members` index `results`) under all their
    /// claims, closing them; when it is refused, each result on its own. Returns the
    /// fences of the writes refused or failed for good, as [`Self::append_intent`].
    async fn append_lot(
        &self,
        results: &[(Vec<ClaimRef>, Vec<NewInteraction>)],
        lot: crate::lots::Lot,
    ) -> Vec<ClaimRef> {
        let fences: Vec<Fence> = lot
            .members
            .iter()
            .flat_map(|&i| results[i].0.iter().map(Fence::from))
            .collect();
        match self.append_retrying(&fences, true, vec![lot.row]).await {
            Ok(()) => Vec::new(),
            Err(e) => {
                debug!(error = %e, results = lot.members.len(), "a lot of results was refused; writing them one by one");
                let each = lot
                    .members
                    .iter()
                    .map(|&i| self.append_intent(results[i].0.clone(), true, results[i].1.clone()));
                futures::future::join_all(each)
                    .await
                    .into_iter()
                    .flatten()
                    .collect()
            }
        }
    }

    /// Performs one append intent; returns its fences when the write was refused or
    /// failed for good (every turn that depended on it is skipped).
    async fn append_intent(
        &self,
        fences: Vec<ClaimRef>,
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Vec<ClaimRef> {
        let actor = batch.first().map(|r| r.actor.clone());
        let store_fences: Vec<Fence> = fences.iter().map(Fence::from).collect();
        match self.append_retrying(&store_fences, close, batch).await {
            Ok(()) => Vec::new(),
            Err(StoreError::Fenced { key, holder, epoch }) => {
                log_lost_claim(
                    &*self.store,
                    "fenced append refused",
                    &key,
                    &holder,
                    actor.as_deref(),
                    epoch,
                )
                .await;
                let _ = self.feedback.send(Feedback::Lost {
                    key,
                    epoch,
                    fenced: true,
                });
                fences
            }
            Err(e) => {
                warn!(error = %e, "append failed for good; the result is not written");
                let _ = self.feedback.send(Feedback::ResultLost);
                for f in &fences {
                    let _ = self.feedback.send(Feedback::Lost {
                        key: f.key.clone(),
                        epoch: f.epoch,
                        fenced: false,
                    });
                }
                let _ = self.feedback.send(Feedback::Failed(e));
                fences
            }
        }
    }

    /// Sends acquires (each with the one chained after it, if any) to the store as
    /// one batch in a task of its own, and answers each with a claim result. A batch
    /// the store cannot take in key order as given (a chained key sorting before its
    /// first, or one key twice) goes as one batch per acquire instead.
    fn acquire_all(&self, acquires: Vec<PendingAcquire>) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        let feedback = self.feedback.clone();
        let metrics = self.metrics.clone();
        let relay = self.relay.clone();
        let give_up = self.give_up.clone();
        tokio::spawn(async move {
            let answer = (&*store, &feedback, &metrics, relay.as_str(), &give_up);
            match batch_requests(&acquires) {
                Some((requests, slots)) => {
                    answer_acquires(answer, &acquires, &requests, &slots, None).await;
                }
                None => {
                    for mut one in acquires {
                        // A lone acquire always goes; one whose chained key does not
                        // sort after it goes without the chain (answered `then: None`,
                        // so the synchronizer asks for that claim separately).
                        let (requests, slots) = match batch_requests(std::slice::from_ref(&one)) {
                            Some(b) => b,
                            None => {
                                one.then = None;
                                one.write = None;
                                lone_request(&one)
                            }
                        };
                        answer_acquires(answer, &[one], &requests, &slots, None).await;
                    }
                }
            }
        })
    }

    /// Takes a task's `[uses ...]` resources in one store call that does not wait;
    /// the event loop learns each won holding's lease (counted from before the call).
    async fn acquire_uses(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> huddle_core::sync::ResourcesAnswer {
        use huddle_core::sync::ResourcesAnswer;
        let from = Instant::now();
        match self
            .store
            .acquire_resources(room, holder, wanted, ttl)
            .await
        {
            Ok(huddle_store::ResourcesAcquired::Won(held)) => {
                for h in &held {
                    let _ = self.feedback.send(Feedback::Confirmed {
                        key: h.key.clone(),
                        epoch: h.epoch,
                        lease: Lease { from, ttl },
                    });
                }
                ResourcesAnswer::Won(held)
            }
            Ok(huddle_store::ResourcesAcquired::Blocked(blocked)) => {
                let until = blocked
                    .iter()
                    .map(|b| b.by.expires_at)
                    .min()
                    .unwrap_or(huddle_core::Timestamp(0));
                if let Some(b) = blocked.first() {
                    debug!(room, holder, resource = %b.by.name, held_by = %b.by.holder, mode = %b.by.mode, "a task's resources are taken; it waits");
                }
                ResourcesAnswer::Blocked { until }
            }
            Err(e) => {
                warn!(room, holder, error = %e, "taking a task's resources failed");
                let _ = self.feedback.send(Feedback::Failed(e));
                ResourcesAnswer::Failed
            }
        }
    }

    /// Renews `(key, holder, epoch)` for `ttl`; when it is renewed, the event loop
    /// learns the new lease (counted from before the call).
    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: ClaimEpoch,
        ttl: Duration,
    ) -> Result<Option<huddle_store::ClaimState>, StoreError> {
        let from = Instant::now();
        let renewed = self.store.renew(key, holder, epoch, ttl).await?;
        if renewed.is_some() {
            let _ = self.feedback.send(Feedback::Confirmed {
                key: key.to_string(),
                epoch,
                lease: Lease { from, ttl },
            });
        }
        Ok(renewed)
    }

    /// Until when the relay can vouch for `claims` (with what it knows of their
    /// `leases`): the earliest half-lease of them all, when that leaves at least a
    /// quarter of a lease to start the agent in. Otherwise (the claims were won a
    /// while ago: the relay was paused, starved, or the turn waited) each is renewed
    /// first and the deadline counted from before the renewals. A claim that is no
    /// longer held is reported lost. A store error vouches for nothing: starting work
    /// the relay cannot vouch for is worse than offering it again.
    async fn vouch(&self, claims: &[ClaimRef], leases: &[Option<Lease>], agent: &str) -> Vouched {
        let known: Option<Vec<Lease>> = leases.iter().copied().collect();
        let Some(known) = known.filter(|k| k.len() == claims.len() && !k.is_empty()) else {
            warn!(
                agent,
                "a turn's claims have no known lease; not starting it"
            );
            return Vouched::Unknown("the relay knows no lease for its claims".into());
        };
        let by = known.iter().map(Lease::start_by).min();
        let headroom = known.iter().map(|l| l.ttl / 4).min().unwrap_or_default();
        if let Some(by) = by.filter(|by| *by >= Instant::now() + headroom) {
            return Vouched::Until(by);
        }
        let from = Instant::now();
        for (c, lease) in claims.iter().zip(&known) {
            match self.renew(&c.key, &c.holder, c.epoch, lease.ttl).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    log_lost_claim(
                        &*self.store,
                        "claim lost before the turn started",
                        &c.key,
                        &c.holder,
                        Some(agent),
                        c.epoch,
                    )
                    .await;
                    let _ = self.feedback.send(Feedback::Lost {
                        key: c.key.clone(),
                        epoch: c.epoch,
                        fenced: false,
                    });
                    return Vouched::Lost;
                }
                Err(e) => {
                    warn!(error = %e, agent, "could not confirm a turn's claims; not starting it");
                    return Vouched::Unknown(format!("its claims could not be confirmed: {e}"));
                }
            }
        }
        let ttl = known.iter().map(|l| l.ttl).min().unwrap_or_default();
        Vouched::Until(from + ttl / 2)
    }

    /// The outbox: appends `batch` (under `fence` when given), retrying with capped
    /// exponential back-off while the database is unavailable, until it is written,
    /// refused for good (a lost fence, an invalid row) or the relay gives up at the end
    /// of its shutdown grace. Appends are idempotent, so a retry after an ambiguous
    /// commit never writes twice. Batches over the store's limit are written in
    /// chunks (only unfenced batches can be that large: owner-command results).
    async fn append_retrying(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Result<(), StoreError> {
        let _queued = self.metrics.outbox_entry();
        let max = self.store.limits().max_batch.max(1);
        let chunks: Vec<Vec<NewInteraction>> = if fences.is_empty() && batch.len() > max {
            batch.chunks(max).map(|c| c.to_vec()).collect()
        } else {
            vec![batch]
        };
        for chunk in chunks {
            let mut delay = RETRY_FIRST;
            let mut attempt = 0u32;
            loop {
                let result = if fences.is_empty() {
                    self.store.append(chunk.clone()).await
                } else {
                    self.store.append_under(fences, close, chunk.clone()).await
                };
                match result {
                    Ok(_) => {
                        self.metrics.appended(chunk.len(), !fences.is_empty());
                        break;
                    }
                    Err(e) if e.is_retryable() && !self.give_up.is_cancelled() => {
                        attempt += 1;
                        if attempt == 1 {
                            let _ = self.feedback.send(Feedback::WriteRetried);
                        }
                        warn!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "append failed; retrying");
                        back_off(&mut delay, &self.give_up).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Writes one owner command's results unless another relay does (plan 0090): the
    /// relays elect the writer with the claim `cmdresult/<room>/<command>`. Won: write
    /// them, the last chunk closing the claim. Closed: they are in. Held by another:
    /// wait for their last row to be read (`seen`), for the holder's lease to lapse
    /// (then try again) or for the relay to stop; after [`COMMAND_RESULT_WAITS`] such
    /// waits, write them anyway (they dedupe), so a holder that never writes cannot
    /// withhold them.
    async fn write_command_result(
        &self,
        group: Vec<NewInteraction>,
        seen: Option<Arc<tokio::sync::Notify>>,
        stopping: CancellationToken,
    ) {
        let (Some(command), Some(seen)) = (group[0].parent, seen) else {
            return self.send_command_rows(group, None).await;
        };
        let key = huddle_core::protocol::command_result_key(&group[0].room, &command);
        let mut waits = 0;
        let fence = loop {
            let answer = match self.acquire_retrying(&key).await {
                Ok(answer) => answer,
                Err(e) => {
                    // Not a claim this store will grant (nor a database that is
                    // away: that is retried): write without it.
                    warn!(key, error = %e, "the claim of an owner command's results could not be taken; writing them without it");
                    break None;
                }
            };
            let held = match answer {
                Acquired::Won(state) => {
                    break Some(Fence {
                        key: state.key,
                        holder: state.holder,
                        epoch: state.epoch,
                    })
                }
                Acquired::Closed { .. } => return,
                Acquired::HeldBy(held) => held,
            };
            if waits == COMMAND_RESULT_WAITS {
                warn!(key, holder = %held.holder, "another relay has held the claim of an owner command's results for several leases without writing them; writing them");
                break None;
            }
            waits += 1;
            let left = match self.store.now().await {
                Ok(now) => {
                    Duration::from_micros(held.expires_at.0.saturating_sub(now.0).max(0) as u64)
                }
                Err(_) => COMMAND_RESULT_LEASE,
            };
            let wait = left.min(COMMAND_RESULT_LEASE) + Duration::from_millis(10);
            debug!(key, holder = %held.holder, wait_ms = wait.as_millis() as u64, "another relay writes an owner command's results");
            tokio::select! {
                _ = seen.notified() => return,
                _ = stopping.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        };
        self.send_command_rows(group, fence).await;
    }

    /// Takes the result claim `key` for this relay, retrying while the database is
    /// away (until the relay gives up its writes).
    async fn acquire_retrying(&self, key: &str) -> Result<Acquired, StoreError> {
        let mut delay = RETRY_FIRST;
        loop {
            match self
                .store
                .acquire(key, &self.relay, COMMAND_RESULT_LEASE)
                .await
            {
                Err(e) if e.is_retryable() && !self.give_up.is_cancelled() => {
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "taking a claim failed; retrying");
                    back_off(&mut delay, &self.give_up).await;
                }
                other => return other,
            }
        }
    }

    /// Sends one command's result rows: chunked when larger than a batch, the last
    /// chunk under `fence` and closing it when given. A result that cannot be written
    /// is answered with a notice to the command's author instead of vanishing.
    async fn send_command_rows(&self, mut group: Vec<NewInteraction>, fence: Option<Fence>) {
        let _ = self
            .feedback
            .send(Feedback::CommandRowsSent(group.len() as u64));
        let command = group[0].parent;
        let (room, thread) = (group[0].room.clone(), group[0].thread.clone());
        let rows = group.len();
        let max = self.store.limits().max_batch.max(1);
        let last = group.split_off(group.len() - 1 - (group.len() - 1) % max);
        let mut result = match group.is_empty() {
            true => Ok(()),
            false => self.append_retrying(&[], false, group).await,
        };
        if result.is_ok() {
            result = match &fence {
                Some(f) => {
                    match self
                        .append_retrying(std::slice::from_ref(f), true, last.clone())
                        .await
                    {
                        // The lease lapsed and another relay took the claim over: it
                        // writes them too; these dedupe.
                        Err(StoreError::Fenced { .. }) => {
                            self.append_retrying(&[], false, last).await
                        }
                        other => other,
                    }
                }
                None => self.append_retrying(&[], false, last).await,
            };
        }
        let Err(e) = result else { return };
        warn!(room, rows, error = %e, "the result of an owner command could not be written");
        let _ = self.feedback.send(Feedback::ResultLost);
        let Some(command) = command else { return };
        let mut notice = NewInteraction::new(
            room,
            Verb::MessagePosted,
            SYSTEM_ACTOR,
            Role::System,
            serde_json::json!({
                "text": format!("this command was not carried out: its result could not be written ({e})")
            }),
        )
        .with_parent(command);
        notice.thread = thread;
        let fences: Vec<Fence> = fence.into_iter().collect();
        let close = !fences.is_empty();
        if let Err(e) = self.append_retrying(&fences, close, vec![notice]).await {
            warn!(error = %e, "the notice about a failed owner command could not be written either");
        }
    }

    fn start_turn(
        &self,
        start: TurnStart,
        token: CancellationToken,
        related: Option<String>,
        start_by: Instant,
    ) {
        let Some(agent) = self.agents.get(&start.agent) else {
            let _ = self.feedback.send(Feedback::TurnEnded {
                turn: start.turn.clone(),
                outcome: CoreOutcome::Failed {
                    reason: format!("agent {} is not hosted here", start.agent),
                },
                tokens: 0,
                activity: TurnActivity::default(),
            });
            return;
        };
        let driver = agent.driver.clone();
        let feedback = self.feedback.clone();
        let mut request = turn_request(&start, related.as_deref());
        let (sink, notes) = crate::driver::ProgressSink::channel();
        request.progress = sink;
        let progress = tokio::spawn(write_progress(
            self.store.clone(),
            self.metrics.clone(),
            start.clone(),
            notes,
        ));
        request.start_by = Some(start_by);
        let stall =
            (start.stall_timeout_ms > 0).then(|| Duration::from_millis(start.stall_timeout_ms));
        self.metrics.agent_busy(&start.agent);
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let outcome = run_watched(driver, request, token, stall).await;
            // A turn that never started leaves no end to measure the next gap from.
            if !matches!(outcome, TurnOutcome::NotStarted) {
                metrics.agent_free(&start.agent);
            }
            // Every note the turn sent is written before its outcome is (progress
            // never lands after the reply), unless writing them hangs.
            let abort = progress.abort_handle();
            if tokio::time::timeout(PROGRESS_DRAIN, progress)
                .await
                .is_err()
            {
                abort.abort();
            }
            let (outcome, tokens, activity) = match outcome {
                TurnOutcome::Replied {
                    text,
                    tokens,
                    activity,
                } => (CoreOutcome::Replied { text }, tokens, activity),
                TurnOutcome::Failed {
                    reason,
                    tokens,
                    activity,
                } => (CoreOutcome::Failed { reason }, tokens, activity),
                TurnOutcome::Cancelled => (CoreOutcome::Cancelled, 0, TurnActivity::default()),
                TurnOutcome::NotStarted => {
                    info!(room = %start.room, agent = %start.agent, turn = %start.turn.0, epoch = start.epoch.get(), "turn not started: its start deadline had passed (the relay was paused or starved)");
                    let reason = "its start deadline had passed (the relay was paused or starved after it last confirmed the claims)".to_string();
                    (
                        CoreOutcome::NotStarted { reason },
                        0,
                        TurnActivity::default(),
                    )
                }
            };
            let _ = feedback.send(Feedback::TurnEnded {
                turn: start.turn,
                outcome,
                tokens,
                activity,
            });
        });
    }
}

/// Runs a turn under the stall watchdog: with a `stall` timeout, a turn whose driver
/// reports no activity ([`ProgressSink::beat`](crate::driver::ProgressSink::beat))
/// for that long is cancelled, and once the driver has stopped it is reported failed
/// (`stalled: ...`), so its work is retried like any failed turn.
async fn run_watched(
    driver: Arc<dyn crate::driver::Driver>,
    request: crate::driver::TurnRequest,
    token: CancellationToken,
    stall: Option<Duration>,
) -> TurnOutcome {
    let Some(stall) = stall else {
        return driver.run(request, token).await;
    };
    let sink = request.progress.clone();
    let watched = token.child_token();
    let mut run = std::pin::pin!(driver.run(request, watched.clone()));
    let step = (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            outcome = &mut run => return outcome,
            _ = tokio::time::sleep(step) => {
                if sink.idle_for().is_some_and(|idle| idle >= stall) && !token.is_cancelled() {
                    watched.cancel();
                    let outcome = run.await;
                    if matches!(outcome, TurnOutcome::Cancelled) {
                        info!(stall_ms = stall.as_millis() as u64, "turn stalled: cancelled");
                        return TurnOutcome::failed(
                            format!(
                                "stalled: no activity for {}",
                                huddle_core::config::format_duration(stall.as_millis() as u64)
                            ),
                            0,
                        );
                    }
                    return outcome;
                }
            }
        }
    }
}

/// An acquire the executor has yet to send.
struct PendingAcquire {
    key: String,
    holder: String,
    /// The relay the claim is taken to drive the holder's turn for (plan 0094).
    driver: Option<String>,
    ttl: Duration,
    then: Option<ChainedAcquire>,
    /// Rows to write with the claims when won at the epochs they carry.
    write: Option<huddle_core::sync::WriteIfWon>,
}

impl PendingAcquire {
    /// The store request for this acquire (without its chain), with its driver.
    fn request(&self) -> ClaimRequest {
        let mut r = ClaimRequest::new(self.key.clone(), self.holder.clone(), self.ttl);
        r.driver = self.driver.clone();
        r
    }

    /// [`Self::of`] an intent looked at in place, without the rows it writes when won
    /// (`write: None`; the caller moves them in once it keeps the acquire).
    fn without_rows(intent: &Intent) -> Option<PendingAcquire> {
        match intent {
            Intent::Acquire {
                key,
                holder,
                driver,
                ttl,
                then,
                ..
            } => Some(PendingAcquire {
                key: key.clone(),
                holder: holder.clone(),
                driver: driver.clone(),
                ttl: *ttl,
                then: then.clone(),
                write: None,
            }),
            _ => None,
        }
    }

    /// The acquire an `Intent::Acquire` asks for (`None` for any other intent).
    fn of(intent: Intent) -> Option<PendingAcquire> {
        let mut a = Self::without_rows(&intent)?;
        if let Intent::Acquire { write, .. } = intent {
            a.write = write;
        }
        Some(a)
    }
}

/// A batch's store requests, and for each acquire the index of its request and of its
/// chained one's.
type AcquireBatch = (Vec<ClaimRequest>, Vec<(usize, Option<usize>)>);

/// The store requests for `acquires`, in key order, and for each acquire the index of
/// its request and of its chained one's. `None` when the keys cannot go in one batch
/// (a key twice, or a chained key not after its first).
fn batch_requests(acquires: &[PendingAcquire]) -> Option<AcquireBatch> {
    // (request, acquire index, chained?)
    let mut items: Vec<(ClaimRequest, usize, bool)> = Vec::new();
    for (i, a) in acquires.iter().enumerate() {
        items.push((a.request(), i, false));
        if let Some(c) = &a.then {
            items.push((
                ClaimRequest::new(c.key.clone(), c.holder.clone(), c.ttl),
                i,
                true,
            ));
        }
    }
    items.sort_by(|x, y| x.0.key.as_bytes().cmp(y.0.key.as_bytes()));
    if items.windows(2).any(|w| w[0].0.key == w[1].0.key) {
        return None;
    }
    let mut slots: Vec<(Option<usize>, Option<usize>)> = vec![(None, None); acquires.len()];
    for (pos, (_, i, chained)) in items.iter().enumerate() {
        if *chained {
            slots[*i].1 = Some(pos);
        } else {
            slots[*i].0 = Some(pos);
        }
    }
    let mut requests = Vec::with_capacity(items.len());
    for (mut r, i, chained) in items {
        if chained {
            let first = slots[i].0?;
            if first >= requests.len() {
                return None;
            }
            r = r.after(first);
        }
        requests.push(r);
    }
    let slots = slots
        .into_iter()
        .map(|(first, then)| first.map(|f| (f, then)))
        .collect::<Option<Vec<_>>>()?;
    Some((requests, slots))
}

/// The request of an acquire sent alone, without its chain.
fn lone_request(a: &PendingAcquire) -> AcquireBatch {
    (vec![a.request()], vec![(0, None)])
}

/// The conditional appends of a hand-off with those of one room's fresh tasks packed
/// into one lot (plan 0080), conditional on every claim of its tasks; each with the
/// indices into `single` it stands for.
fn lot_handoffs(
    single: &[(usize, huddle_store::ConditionalAppend)],
    relay: &str,
    limits: &huddle_core::Limits,
) -> Vec<(Vec<usize>, huddle_store::ConditionalAppend)> {
    let (lots, left) = {
        let writes: Vec<&[NewInteraction]> =
            single.iter().map(|(_, c)| c.rows.as_slice()).collect();
        crate::lots::pack(&writes, relay, limits)
    };
    let mut out: Vec<(Vec<usize>, huddle_store::ConditionalAppend)> = lots
        .into_iter()
        .map(|lot| {
            let when_won = lot
                .members
                .iter()
                .flat_map(|&m| single[m].1.when_won.iter().copied())
                .collect();
            (
                lot.members,
                huddle_store::ConditionalAppend {
                    when_won,
                    rows: vec![lot.row],
                },
            )
        })
        .collect();
    out.extend(left.into_iter().map(|m| (vec![m], single[m].1.clone())));
    out
}

/// Whether the lot `id` is in the ledger, asking again while the database is away.
/// Asked after a re-sent hand-off whose last send did not write the lot: the send
/// before it has finished by then (the last one took the same claims' row locks), so
/// the answer is final. (A refusal for good, or a relay giving up at shutdown, counts
/// as absent: its rows are then written as rows.)
async fn lot_in_ledger(store: &dyn Store, id: InteractionId, give_up: &CancellationToken) -> bool {
    let mut delay = RETRY_FIRST;
    loop {
        match store.get(id).await {
            Ok(found) => return found.is_some(),
            Err(e) if e.is_retryable() && !give_up.is_cancelled() => {
                warn!(error = %e, "reading whether a hand-off's lot is in failed; asking again");
                back_off(&mut delay, give_up).await;
            }
            Err(e) => {
                warn!(error = %e, "could not read whether a hand-off's lot is in");
                return false;
            }
        }
    }
}

/// Sends one batch and answers every acquire in it (a failed batch answers each
/// `Failed`: nobody is known to hold them, and a later pass may try again).
async fn answer_acquires(
    (store, feedback, metrics, relay, give_up): (
        &dyn Store,
        &mpsc::UnboundedSender<Feedback>,
        &RelayMetrics,
        &str,
        &CancellationToken,
    ),
    acquires: &[PendingAcquire],
    requests: &[ClaimRequest],
    slots: &[(usize, Option<usize>)],
    mut first: Option<huddle_store::FencedWrite>,
) -> bool {
    // Before the call: the leases the store grants run from later.
    let from = Instant::now();
    // A fresh task's claim rows go in the same store call, written only when both of
    // its claims are won at the epochs the rows carry (plan 0058); the rows of
    // several fresh tasks of one room go as one lot, written only when every one of
    // their claims is (plan 0080; when one is lost, nothing of it is written, and the
    // won tasks' rows are written as rows right after).
    let single: Vec<(usize, huddle_store::ConditionalAppend)> = acquires
        .iter()
        .zip(slots)
        .enumerate()
        .filter_map(|(i, (a, (first, then)))| {
            let w = a.write.as_ref()?;
            let mut when_won = vec![(*first, w.epoch)];
            match (then, w.then_epoch) {
                (Some(t), Some(e)) => when_won.push((*t, e)),
                (None, None) => {}
                // A write conditional on a chained claim not taken (or the other
                // way round) is not sent; the rows are appended once it is won.
                _ => return None,
            }
            Some((
                i,
                huddle_store::ConditionalAppend {
                    when_won,
                    rows: w.batch.clone(),
                },
            ))
        })
        .collect();
    let conditional = lot_handoffs(&single, relay, store.limits());
    let lots = conditional.iter().any(|(members, _)| members.len() > 1);
    let mut written = vec![false; acquires.len()];
    // Lots not written because one of their tasks' claims was lost.
    let mut unwritten: Vec<&[usize]> = Vec::new();
    let mut delay = RETRY_FIRST;
    let mut retried = false;
    // A write sent ahead of the hand-off in the same call (plan 0082), until it is
    // written or refused for good; whether it was written.
    let mut first_written = false;
    let result = loop {
        let result = if let Some(f) = &first {
            let appends = conditional.iter().map(|(_, c)| c.clone()).collect();
            match store
                .append_then_hand_off(f.clone(), requests, appends)
                .await
            {
                Ok((_, h)) => {
                    first_written = true;
                    metrics.appended(f.rows.len(), true);
                    Ok(h)
                }
                Err(e) if e.is_retryable() && !give_up.is_cancelled() => Err(e),
                Err(e) => {
                    // Refused (one of its claims lost) or failed for good: nothing of
                    // the call was done (or, where the store makes two calls, the
                    // hand-off was not); the hand-off goes alone, the write after it.
                    debug!(error = %e, "a write sent with a hand-off was not written; the hand-off goes alone");
                    first = None;
                    continue;
                }
            }
        } else if conditional.is_empty() {
            store
                .acquire_batch(requests)
                .await
                .map(|acquired| huddle_store::Handoff {
                    acquired,
                    appended: Vec::new(),
                })
        } else {
            let appends = conditional.iter().map(|(_, c)| c.clone()).collect();
            store.acquire_and_append(requests, appends).await
        };
        match result {
            // A call that carries a lot is sent again, identical, until its outcome
            // is known: it may have committed, and its tasks' rows must then never
            // be written in another grouping (a second copy of an item would be
            // read; an identical lot deduplicates). A refusal for good committed
            // nothing; a relay shutting down reads the ledger afresh when it starts.
            Err(e) if (lots || first.is_some()) && e.is_retryable() && !give_up.is_cancelled() => {
                if first.is_some() && !retried {
                    // A turn's result is among what is retried (the relay's count).
                    let _ = feedback.send(Feedback::WriteRetried);
                }
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "a hand-off failed; sending it again");
                back_off(&mut delay, give_up).await;
                retried = true;
            }
            other => break other,
        }
    };
    // Lots of a re-sent call not written by the last send: an earlier send may have
    // written them before one of their claims was lost.
    let mut unsure: Vec<(&[usize], InteractionId)> = Vec::new();
    let result = result.map(|h| {
        for ((members, c), done) in conditional.iter().zip(&h.appended) {
            if done.is_some() {
                for m in members {
                    written[single[*m].0] = true;
                }
                metrics.appended(c.rows.len(), true);
            } else if members.len() > 1 && retried {
                unsure.push((members, c.rows[0].id()));
            } else if members.len() > 1 {
                unwritten.push(members);
            }
        }
        h.acquired
    });
    if result.is_ok() {
        for (members, id) in unsure {
            if lot_in_ledger(store, id, give_up).await {
                for m in members {
                    written[single[*m].0] = true;
                }
            } else {
                unwritten.push(members);
            }
        }
    }
    if let Ok(acquired) = &result {
        // The tasks of such a lot whose claims were won as expected: their rows go in
        // one more write, as rows (a retry of it by the synchronizer deduplicates),
        // rather than one write per task later.
        for members in unwritten {
            let mut fences = Vec::new();
            let mut rows = Vec::new();
            let mut held = Vec::new();
            for &m in members {
                if let Some(f) = huddle_store::conditions_hold(&single[m].1, requests, acquired) {
                    fences.extend(f);
                    rows.extend(single[m].1.rows.iter().cloned());
                    held.push(single[m].0);
                }
            }
            if held.is_empty() {
                continue;
            }
            let n = rows.len();
            match store.append_under(&fences, false, rows).await {
                Ok(_) => {
                    metrics.appended(n, true);
                    for i in held {
                        written[i] = true;
                    }
                }
                Err(e) => debug!(error = %e, "a hand-off's rows are left to the synchronizer"),
            }
        }
    }
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            for a in acquires {
                debug!(key = a.key, error = %e, "acquire failed");
                metrics.acquired(&a.key, AcquireResult::Failed);
                if let Some(c) = &a.then {
                    metrics.acquired(&c.key, AcquireResult::Failed);
                }
                let _ = feedback.send(Feedback::Claim(ClaimOutcome::new(
                    a.key.clone(),
                    a.holder.clone(),
                    ClaimAnswer::Failed,
                )));
            }
            let _ = feedback.send(Feedback::Failed(e));
            return first_written;
        }
    };
    let answer = |a: &Acquired, key: &str, holder: &str, ttl: Duration| {
        metrics.acquired(
            key,
            match a {
                Acquired::Won(_) => AcquireResult::Won,
                Acquired::HeldBy(_) => AcquireResult::Held,
                Acquired::Closed { .. } => AcquireResult::Closed,
            },
        );
        if let Acquired::Closed { by, .. } = a {
            debug!(key, holder, closed_by = %by.short(), "claim is closed: the work is finished");
        }
        if let Acquired::Won(s) = a {
            let _ = feedback.send(Feedback::Confirmed {
                key: key.to_string(),
                epoch: s.epoch,
                lease: Lease { from, ttl },
            });
        }
        match a {
            Acquired::Won(s) => ClaimAnswer::Won {
                epoch: s.epoch,
                expires_at: s.expires_at,
            },
            Acquired::HeldBy(s) => ClaimAnswer::Lost {
                epoch: s.epoch,
                expires_at: s.expires_at,
            },
            Acquired::Closed { .. } => ClaimAnswer::Closed,
        }
    };
    for (n, (a, (first, then))) in acquires.iter().zip(slots).enumerate() {
        let Some(Some(got)) = out.get(*first) else {
            metrics.acquired(&a.key, AcquireResult::Failed);
            let _ = feedback.send(Feedback::Claim(ClaimOutcome::new(
                a.key.clone(),
                a.holder.clone(),
                ClaimAnswer::Failed,
            )));
            continue;
        };
        let chained = then
            .and_then(|t| out.get(t))
            .and_then(|c| c.as_ref())
            .and_then(|c| {
                let ch = a.then.as_ref()?;
                Some(answer(c, &ch.key, &ch.holder, ch.ttl))
            });
        let _ = feedback.send(Feedback::Claim(ClaimOutcome {
            key: a.key.clone(),
            holder: a.holder.clone(),
            answer: answer(got, &a.key, &a.holder, a.ttl),
            then: chained,
            written: written[n],
        }));
    }
    first_written
}

/// Writes a turn's progress notes as `turn.progress` rows, fenced by the turn's claims
/// (not closing them), until the driver drops its sink. At most
/// [`MAX_PROGRESS_NOTES`](huddle_core::protocol::MAX_PROGRESS_NOTES) per turn; a note
/// refused by its fence (the claim was lost) ends the writing, and a note the database
/// could not take is skipped: progress is advice, the reply is what counts.
async fn write_progress(
    store: Arc<dyn Store>,
    metrics: RelayMetrics,
    start: TurnStart,
    mut notes: mpsc::UnboundedReceiver<String>,
) {
    use huddle_core::protocol::{TurnProgressBody, MAX_PROGRESS_NOTES};
    let fences: Vec<Fence> = start.claims.iter().map(Fence::from).collect();
    let mut seq = 0u32;
    let mut dropped = 0u32;
    while let Some(text) = notes.recv().await {
        if seq >= MAX_PROGRESS_NOTES {
            dropped += 1;
            continue;
        }
        seq += 1;
        let body = TurnProgressBody::new(
            &start.turn.0,
            start.subject.clone(),
            start.epoch,
            seq,
            &text,
        );
        let mut row = NewInteraction::new(
            start.room.as_str(),
            Verb::TurnProgress,
            start.agent.as_str(),
            Role::Agent,
            serde_json::to_value(&body).unwrap_or_default(),
        );
        if let TurnWork::Reply(m) = &start.work {
            row = row.with_parent(m.id);
        }
        row.thread = start.thread.clone();
        match store.append_under(&fences, false, vec![row]).await {
            Ok(_) => {
                metrics.appended(1, true);
                debug!(turn = %start.turn, seq, "progress note written");
            }
            Err(StoreError::Fenced { .. }) => {
                metrics.fenced_refusal();
                debug!(turn = %start.turn, "progress note refused: the turn's claim is gone");
                break;
            }
            Err(e) => warn!(turn = %start.turn, error = %e, "progress note not written"),
        }
    }
    if dropped > 0 {
        info!(turn = %start.turn, dropped, "progress notes over the per-turn cap were dropped");
    }
}

/// Logs a lost claim at `info`: the task or message it elected, the agent, the epoch
/// this relay held and the holder and epoch the claim is at now.
async fn log_lost_claim(
    store: &dyn Store,
    what: &'static str,
    key: &str,
    holder: &str,
    agent: Option<&str>,
    epoch: ClaimEpoch,
) {
    let now = match store.list_claims(key).await {
        Ok(rows) => rows.into_iter().find(|c| c.state.key == key),
        Err(_) => None,
    };
    let now_epoch = now.as_ref().map(|c| c.state.epoch.get());
    let now_holder = now.as_ref().map(|c| c.state.holder.as_str());
    // Reply and task claims are held by the agent; drive claims by the relay (a
    // message's names the agent in its key).
    let held_by_agent = agent.or(Some(holder)).map(str::to_string);
    let (task, message, agent) = match ClaimKey::parse(key) {
        Some(ClaimKey::Task { task, .. } | ClaimKey::Review { task, .. }) => {
            (Some(task), None, held_by_agent)
        }
        Some(ClaimKey::TaskDrive { task, .. } | ClaimKey::ReviewDrive { task, .. }) => {
            (Some(task), None, agent.map(str::to_string))
        }
        Some(ClaimKey::Reply { message, .. }) => (None, Some(message.short()), held_by_agent),
        Some(ClaimKey::DirectedReply { message, agent, .. }) => {
            (None, Some(message.short()), Some(agent))
        }
        Some(ClaimKey::Drive {
            message,
            agent: driven,
            ..
        }) => (None, Some(message.short()), Some(driven)),
        None => (None, None, agent.map(str::to_string)),
    };
    info!(
        key,
        task,
        message,
        agent,
        holder,
        epoch = epoch.get(),
        now_epoch,
        now_holder,
        "{what}"
    );
}

/// Builds the driver's request: the `<coordination>` block first (when it changed),
/// then the `<related-context>` block (when there is one), then the message or task.
pub fn turn_request(start: &TurnStart, related: Option<&str>) -> TurnRequest {
    let mut prompt = String::new();
    for block in [start.coordination.as_deref(), related]
        .into_iter()
        .flatten()
    {
        prompt.push_str(block);
        if !block.ends_with('\n') {
            prompt.push('\n');
        }
    }
    let effect_key = match &start.work {
        TurnWork::Reply(m) => {
            huddle_core::protocol::message_effect_key(&start.room, &m.id, &start.agent)
        }
        TurnWork::Task(t) => {
            huddle_core::protocol::task_round_effect_key(&start.room, &t.id, t.rejections)
        }
        // The review's own effects (a comment, an approval) are its reviewer's, once
        // per round.
        TurnWork::Review(r) => {
            huddle_core::protocol::review_effect_key(&start.room, &r.id, r.round)
        }
    };
    let trace = match &start.work {
        TurnWork::Reply(m) => m.trace,
        TurnWork::Task(t) => t.trace,
        TurnWork::Review(r) => r.trace,
    }
    .map(|t| t.to_string())
    .unwrap_or_default();
    let trace_attr = if trace.is_empty() {
        String::new()
    } else {
        format!(" trace=\"{trace}\"")
    };
    let (task, attempt, review) = match &start.work {
        TurnWork::Reply(m) => {
            prompt.push_str(&format!(
                "<message from=\"{}\" role=\"{}\" effect-key=\"{effect_key}\"{trace_attr}>\n{}\n</message>\n",
                m.author, m.role, m.text
            ));
            (None, 1, false)
        }
        TurnWork::Task(t) => {
            // The attempt's deadline, counted from its claim (`[due ...]`).
            let due = t
                .due_ms
                .map(|ms| format!(" due-ms=\"{ms}\""))
                .unwrap_or_default();
            prompt.push_str(&format!(
                "<task id=\"{}\" attempt=\"{}\" of=\"{}\" effect-key=\"{effect_key}\"{trace_attr}{due}>\n{}\n",
                t.id, t.attempt, t.max_attempts, t.label
            ));
            push_deps(&mut prompt, &t.deps);
            if let Some(c) = &t.compensates {
                // A compensation: what it undoes, and what that task reported.
                prompt.push_str(&format!(
                    "<compensates id=\"{}\" label=\"{}\">{}</compensates>\n",
                    c.id,
                    c.label,
                    c.result.as_deref().unwrap_or("")
                ));
            }
            if let Some(f) = &t.feedback {
                // The work was sent back: what the reviewer said, and what it judged.
                prompt.push_str(&format!(
                    "<review-feedback from=\"{}\" round=\"{}\">\n{}\n",
                    f.reviewer, t.rejections, f.text
                ));
                if let Some(r) = &f.rejected_result {
                    prompt.push_str(&format!("<rejected-result>{r}</rejected-result>\n"));
                }
                prompt.push_str("</review-feedback>\n");
            }
            prompt.push_str("</task>\n");
            (Some(t.id.clone()), t.attempt, false)
        }
        TurnWork::Review(r) => {
            prompt.push_str(&format!(
                "<review task=\"{}\" round=\"{}\" of=\"{}\" submitted-by=\"{}\" effect-key=\"{effect_key}\"{trace_attr}>\n\
                 <task-label>{}</task-label>\n",
                r.id, r.round, r.rounds, r.submitted_by, r.label
            ));
            push_deps(&mut prompt, &r.deps);
            if let Some(f) = &r.feedback {
                prompt.push_str(&format!("<previous-feedback>{f}</previous-feedback>\n"));
            }
            prompt.push_str(&format!(
                "<result>{}</result>\n\
                 Review this work. Answer ACCEPT on the first line to accept it, or REJECT \
                 followed by what must change (the feedback goes back to the worker).\n\
                 </review>\n",
                r.result.as_deref().unwrap_or("")
            ));
            (Some(r.id.clone()), r.round, true)
        }
    };
    TurnRequest {
        room: start.room.clone(),
        thread: start.thread.clone(),
        agent: start.agent.clone(),
        task,
        epoch: Some(start.epoch),
        attempt,
        prompt,
        effect_key,
        trace,
        review,
        progress: Default::default(),
        start_by: None,
    }
}

/// The `<dependency>` lines of a task or review prompt.
fn push_deps(prompt: &mut String, deps: &[huddle_core::sync::DepResult]) {
    for d in deps {
        prompt.push_str(&format!(
            "<dependency id=\"{}\" label=\"{}\">{}</dependency>\n",
            d.id,
            d.label,
            d.result.as_deref().unwrap_or("")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::tasks::TaskCompletedBody;
    use huddle_store::memory::MemoryStore;
    use huddle_store::{Claims, Ledger, StoreOptions};
    use std::sync::atomic::Ordering;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn two_batches_in_flight_by_default_on_postgres_only() {
        assert_eq!(default_batches_in_flight("postgres://u@h/db"), 2);
        assert_eq!(default_batches_in_flight("postgresql://u@h/db"), 2);
        assert_eq!(default_batches_in_flight("sqlite:///tmp/h.db"), 1);
        assert_eq!(default_batches_in_flight("./huddle.db"), 1);
        assert_eq!(default_batches_in_flight("sqlite::memory:"), 1);
    }

    fn executor(store: Arc<dyn Store>) -> (Executor, mpsc::UnboundedReceiver<Feedback>) {
        let (feedback, rx) = mpsc::unbounded_channel();
        let exec = Executor {
            store,
            relay: "relay-t".into(),
            agents: Arc::new(BTreeMap::new()),
            feedback,
            give_up: CancellationToken::new(),
            metrics: RelayMetrics::new("relay-t"),
        };
        (exec, rx)
    }

    /// Takes task `task`'s claim for `agent`; its fence and its two result rows.
    async fn turn(
        store: &dyn Store,
        task: &str,
        agent: &str,
    ) -> (Vec<ClaimRef>, Vec<NewInteraction>) {
        let key = format!("task/r/{task}");
        let Acquired::Won(c) = store.acquire(&key, agent, TTL).await.expect("acquire") else {
            panic!("{key} is free");
        };
        let completed = NewInteraction::new(
            "r",
            Verb::TaskCompleted,
            agent,
            Role::Agent,
            TaskCompletedBody {
                task: task.into(),
                epoch: c.epoch,
                result: Some(format!("{task} done")),
                tokens: None,
                generation: 0,
            }
            .to_body(),
        );
        let replied = NewInteraction::new(
            "r",
            Verb::TurnReplied,
            agent,
            Role::Agent,
            serde_json::json!({ "turn": format!("{task}-turn") }),
        );
        let fence = ClaimRef {
            key,
            holder: agent.into(),
            epoch: c.epoch,
        };
        (vec![fence], vec![completed, replied])
    }

    /// `claim` (held by `holder`) is released and taken by `eve`: lost to its turn.
    async fn hand_to_eve(store: &dyn Store, claim: &ClaimRef, holder: &str) {
        assert!(store
            .release(&claim.key, holder, claim.epoch)
            .await
            .expect("release"));
        assert!(store
            .acquire(&claim.key, "eve", TTL)
            .await
            .expect("acquire")
            .won());
    }

    async fn stored_verbs(store: &dyn Store) -> Vec<Verb> {
        let batch = store
            .read_room_rows("r", Position::START, 100)
            .await
            .expect("read");
        batch.rows.iter().map(|r| r.verb).collect()
    }

    /// Results of turns that end together go as one lot that closes every claim; when
    /// one claim was lost, the lot is refused and each result is written on its own:
    /// the held ones land, the lost one is reported, nothing is written twice.
    #[tokio::test]
    async fn results_ending_together_go_as_one_lot_or_one_by_one() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreOptions::default()));
        let (exec, _rx) = executor(store.clone());
        let a = turn(&*store, "t1", "ann").await;
        let b = turn(&*store, "t2", "bob").await;
        let want: Vec<InteractionId> = a.1.iter().chain(&b.1).map(NewInteraction::id).collect();
        let refused = exec.append_results(vec![a.clone(), b.clone()]).await;
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(stored_verbs(&*store).await, vec![Verb::TaskLot]);
        let read = store
            .read_room("r", Position::START, 100)
            .await
            .expect("read");
        assert_eq!(read.rows.iter().map(|r| r.id).collect::<Vec<_>>(), want);
        for f in a.0.iter().chain(&b.0) {
            let again = store.acquire(&f.key, "zed", TTL).await.expect("acquire");
            assert!(
                matches!(again, Acquired::Closed { .. }),
                "{} closed by the lot",
                f.key
            );
        }

        // t4's claim is released and taken by someone else before the results are
        // written: the lot is refused, t3's result lands alone, t4's is reported.
        let c = turn(&*store, "t3", "cy").await;
        let d = turn(&*store, "t4", "dee").await;
        hand_to_eve(&*store, &d.0[0], "dee").await;
        let refused = exec.append_results(vec![c.clone(), d.clone()]).await;
        assert_eq!(refused, d.0, "the lost claim's result is reported");
        assert_eq!(
            stored_verbs(&*store).await,
            vec![Verb::TaskLot, Verb::TaskCompleted, Verb::TurnReplied]
        );
        let read = store
            .read_room("r", Position::START, 100)
            .await
            .expect("read");
        let ids: Vec<InteractionId> = read.rows.iter().map(|r| r.id).collect();
        let mut want = want;
        want.extend(c.1.iter().map(NewInteraction::id));
        assert_eq!(ids, want);
    }

    /// A store whose first `lose` hand-off calls are performed and then answered as
    /// if the connection dropped before the answer came; before that answer, the
    /// claim `steal` (key, holder) goes to `zed`, as if it lapsed and was re-taken.
    struct LostAnswers {
        inner: MemoryStore,
        lose: std::sync::atomic::AtomicU32,
        steal: Option<(String, String)>,
        /// Calls of `append_then_hand_off` (each makes the two calls in turn).
        combined: std::sync::atomic::AtomicU32,
    }

    #[async_trait::async_trait]
    impl huddle_store::Ledger for LostAnswers {
        fn limits(&self) -> &huddle_core::Limits {
            self.inner.limits()
        }
        async fn append(
            &self,
            batch: Vec<NewInteraction>,
        ) -> huddle_store::Result<Vec<huddle_store::Appended>> {
            self.inner.append(batch).await
        }
        async fn append_under(
            &self,
            fences: &[Fence],
            close: bool,
            batch: Vec<NewInteraction>,
        ) -> huddle_store::Result<Vec<huddle_store::Appended>> {
            self.inner.append_under(fences, close, batch).await
        }
        async fn read_forward(
            &self,
            after: Position,
            limit: usize,
        ) -> huddle_store::Result<huddle_store::ReadBatch> {
            self.inner.read_forward(after, limit).await
        }
        async fn read_room_rows(
            &self,
            room: &str,
            after: Position,
            limit: usize,
        ) -> huddle_store::Result<huddle_store::ReadBatch> {
            self.inner.read_room_rows(room, after, limit).await
        }
        async fn get(
            &self,
            id: InteractionId,
        ) -> huddle_store::Result<Option<huddle_core::Interaction>> {
            self.inner.get(id).await
        }
        fn doorbell(&self) -> huddle_store::Doorbell {
            self.inner.doorbell()
        }
        async fn now(&self) -> huddle_store::Result<huddle_core::Timestamp> {
            self.inner.now().await
        }
        fn poll_interval(&self) -> Duration {
            self.inner.poll_interval()
        }
    }

    #[async_trait::async_trait]
    impl huddle_store::Claims for LostAnswers {
        async fn acquire_request(
            &self,
            request: &huddle_store::ClaimRequest,
        ) -> huddle_store::Result<Acquired> {
            self.inner.acquire_request(request).await
        }
        async fn renew(
            &self,
            key: &str,
            holder: &str,
            epoch: huddle_store::Epoch,
            ttl: Duration,
        ) -> huddle_store::Result<Option<huddle_store::ClaimState>> {
            self.inner.renew(key, holder, epoch, ttl).await
        }
        async fn release(
            &self,
            key: &str,
            holder: &str,
            epoch: huddle_store::Epoch,
        ) -> huddle_store::Result<bool> {
            self.inner.release(key, holder, epoch).await
        }
        async fn list_claims(
            &self,
            prefix: &str,
        ) -> huddle_store::Result<Vec<huddle_store::ClaimRow>> {
            self.inner.list_claims(prefix).await
        }
        async fn acquire_resources(
            &self,
            room: &str,
            holder: &str,
            wanted: &[huddle_core::resources::Wanted],
            ttl: Duration,
        ) -> huddle_store::Result<huddle_store::resources::ResourcesAcquired> {
            self.inner
                .acquire_resources(room, holder, wanted, ttl)
                .await
        }
    }

    #[async_trait::async_trait]
    impl Store for LostAnswers {
        fn backend_name(&self) -> &'static str {
            self.inner.backend_name()
        }
        async fn acquire_and_append(
            &self,
            requests: &[ClaimRequest],
            appends: Vec<huddle_store::ConditionalAppend>,
        ) -> huddle_store::Result<huddle_store::Handoff> {
            let done = self.inner.acquire_and_append(requests, appends).await?;
            if self
                .lose
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
            {
                return Ok(done);
            }
            if let Some((key, holder)) = &self.steal {
                let held = self.inner.list_claims(key).await?;
                let epoch = held
                    .iter()
                    .find(|c| &c.state.key == key)
                    .map(|c| c.state.epoch);
                let epoch = epoch.expect("the claim to steal was taken");
                assert!(self.inner.release(key, holder, epoch).await?);
                assert!(self.inner.acquire(key, "zed", TTL).await?.won());
            }
            Err(StoreError::Unavailable("the answer was lost".into()))
        }
        async fn append_then_hand_off(
            &self,
            first: huddle_store::FencedWrite,
            requests: &[ClaimRequest],
            appends: Vec<huddle_store::ConditionalAppend>,
        ) -> huddle_store::Result<(Vec<huddle_store::Appended>, huddle_store::Handoff)> {
            self.combined.fetch_add(1, Ordering::SeqCst);
            let written = self
                .append_under(&first.fences, first.close, first.rows)
                .await?;
            Ok((written, self.acquire_and_append(requests, appends).await?))
        }
        async fn archive_room(
            &self,
            request: huddle_store::ArchiveRequest,
        ) -> huddle_store::Result<huddle_store::ArchiveOutcome> {
            self.inner.archive_room(request).await
        }
        async fn prune_claims(
            &self,
            older_than: Duration,
        ) -> huddle_store::Result<huddle_store::PrunedClaims> {
            self.inner.prune_claims(older_than).await
        }
    }

    /// The acquire of fresh task `task` for `agent`, driven by this relay, carrying its
    /// `task.claimed` and `turn.prompted` to write when it is won at epoch 1.
    fn fresh_handoff(task: &str, agent: &str) -> PendingAcquire {
        use huddle_core::protocol::{Subject, TurnPromptedBody};
        use huddle_core::tasks::TaskClaimedBody;
        let first = ClaimEpoch::FIRST;
        let claimed = TaskClaimedBody {
            task: task.into(),
            epoch: first,
            attempt: 1,
            generation: 0,
        };
        let prompted = TurnPromptedBody {
            turn: format!("t/r/{task}/{agent}/1.1"),
            subject: Subject::task(task.to_string(), None),
            epoch: first,
            drive_epoch: first,
        };
        let row = |verb, body| NewInteraction::new("r", verb, agent, Role::Agent, body);
        PendingAcquire {
            key: format!("task/r/{task}"),
            holder: agent.into(),
            driver: Some("relay-t".into()),
            ttl: TTL,
            then: None,
            write: Some(huddle_core::sync::WriteIfWon {
                epoch: first,
                then_epoch: None,
                batch: vec![
                    row(Verb::TaskClaimed, claimed.to_body()),
                    row(
                        Verb::TurnPrompted,
                        serde_json::to_value(&prompted).expect("a body"),
                    ),
                ],
            }),
        }
    }

    /// A hand-off of two fresh tasks goes as one lot; when the answer to a call that
    /// wrote it is lost, the call is sent again, identical, and the lot deduplicates:
    /// both turns are answered as written and every item is read once. When one of
    /// its claims went to someone else before the second send, the lot the first
    /// wrote is found in the ledger: the other task's rows are not written again.
    #[tokio::test]
    async fn a_hand_off_lot_whose_answer_is_lost_is_written_once() {
        for steal in [false, true] {
            let store = Arc::new(LostAnswers {
                inner: MemoryStore::new(StoreOptions::default()),
                lose: std::sync::atomic::AtomicU32::new(1),
                steal: steal.then(|| ("task/r/t2".to_string(), "bob".to_string())),
                combined: std::sync::atomic::AtomicU32::new(0),
            });
            let (exec, mut rx) = executor(store.clone());
            let sent = [fresh_handoff("t1", "ann"), fresh_handoff("t2", "bob")];
            let want: Vec<InteractionId> = sent
                .iter()
                .flat_map(|a| a.write.as_ref().map(|w| w.batch.clone()))
                .flatten()
                .map(|r| r.id())
                .collect();
            exec.acquire_all(sent.into());
            let mut answers = BTreeMap::new();
            while answers.len() < 2 {
                let next = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                    .await
                    .expect("answers in time")
                    .expect("the executor is alive");
                if let Feedback::Claim(c) = next {
                    answers.insert(c.key.clone(), c);
                }
            }
            let t1 = &answers["task/r/t1"];
            assert!(
                matches!(t1.answer, ClaimAnswer::Won { .. }) && t1.written,
                "steal {steal}: {t1:?}"
            );
            let t2 = &answers["task/r/t2"];
            if steal {
                assert!(matches!(t2.answer, ClaimAnswer::Lost { .. }), "{t2:?}");
            } else {
                assert!(
                    matches!(t2.answer, ClaimAnswer::Won { .. }) && t2.written,
                    "{t2:?}"
                );
            }
            assert_eq!(
                stored_verbs(&*store).await,
                vec![Verb::TaskLot],
                "steal {steal}"
            );
            let read = store
                .read_room("r", Position::START, 100)
                .await
                .expect("read");
            let ids: Vec<InteractionId> = read.rows.iter().map(|r| r.id).collect();
            assert_eq!(ids, want, "steal {steal}: each item once, in order");
        }
    }

    fn acquire_intent(a: PendingAcquire) -> Intent {
        let task = a.key.trim_start_matches("task/r/").to_string();
        Intent::Acquire {
            purpose: huddle_core::sync::ClaimPurpose::Task {
                room: "r".into(),
                task,
                agent: a.holder.clone(),
                generation: 0,
            },
            key: a.key,
            holder: a.holder,
            driver: a.driver,
            ttl: a.ttl,
            then: a.then,
            write: a.write,
        }
    }

    /// A batch of task results and a hand-off (plan 0081) is one store call (plan
    /// 0082): the results' lot closes their claims, the hand-off's lot is written with
    /// its claims, and a lost answer sends the call again, identical — every item is
    /// read once. When one result's claim went to someone else first, the hand-off
    /// goes alone and the results are written as before: the other result alone, the
    /// lost one reported.
    #[tokio::test]
    async fn results_and_a_hand_off_go_as_one_call_or_fall_back() {
        for steal in [false, true] {
            let store = Arc::new(LostAnswers {
                inner: MemoryStore::new(StoreOptions::default()),
                lose: std::sync::atomic::AtomicU32::new(u32::from(!steal)),
                steal: None,
                combined: std::sync::atomic::AtomicU32::new(0),
            });
            let (exec, mut rx) = executor(store.clone());
            let a = turn(&*store, "d1", "cy").await;
            let b = turn(&*store, "d2", "dee").await;
            if steal {
                hand_to_eve(&*store, &b.0[0], "dee").await;
            }
            let handed = [fresh_handoff("t1", "ann"), fresh_handoff("t2", "bob")];
            let mut want: Vec<InteractionId> = Vec::new();
            if !steal {
                want.extend(a.1.iter().chain(&b.1).map(NewInteraction::id));
            }
            want.extend(
                handed
                    .iter()
                    .flat_map(|h| h.write.as_ref().map(|w| w.batch.clone()))
                    .flatten()
                    .map(|r| r.id()),
            );
            if steal {
                want.extend(a.1.iter().map(NewInteraction::id));
            }
            let result = |t: &(Vec<ClaimRef>, Vec<NewInteraction>)| Intent::Append {
                fences: t.0.clone(),
                close: true,
                batch: t.1.clone(),
            };
            let intents = vec![
                result(&a),
                result(&b),
                acquire_intent(fresh_handoff("t1", "ann")),
                acquire_intent(fresh_handoff("t2", "bob")),
            ];
            exec.perform(intents, HashMap::new()).await;
            assert_eq!(
                store.combined.load(Ordering::SeqCst),
                if steal { 1 } else { 2 }
            );
            let mut answers = BTreeMap::new();
            let mut lost = Vec::new();
            while let Ok(fb) = rx.try_recv() {
                match fb {
                    Feedback::Claim(c) => {
                        answers.insert(c.key.clone(), c);
                    }
                    Feedback::Lost { key, .. } => lost.push(key),
                    _ => {}
                }
            }
            for t in ["task/r/t1", "task/r/t2"] {
                let c = &answers[t];
                assert!(
                    matches!(c.answer, ClaimAnswer::Won { .. }) && c.written,
                    "steal {steal}: {c:?}"
                );
            }
            let expected_verbs = if steal {
                vec![Verb::TaskLot, Verb::TaskCompleted, Verb::TurnReplied]
            } else {
                vec![Verb::TaskLot, Verb::TaskLot]
            };
            assert_eq!(stored_verbs(&*store).await, expected_verbs, "steal {steal}");
            assert_eq!(
                lost,
                if steal {
                    vec![b.0[0].key.clone()]
                } else {
                    Vec::new()
                }
            );
            let read = store
                .read_room("r", Position::START, 100)
                .await
                .expect("read");
            let ids: Vec<InteractionId> = read.rows.iter().map(|r| r.id).collect();
            assert_eq!(ids, want, "steal {steal}: each item once, in order");
            let closed = store
                .acquire(&a.0[0].key, "zed", TTL)
                .await
                .expect("acquire");
            assert!(
                matches!(closed, Acquired::Closed { .. }),
                "d1's result closed its claim"
            );
        }
    }

    /// A snapshot whose last row folded is an item of a lot (not a row of its own) is
    /// still recognised in the ledger (a CI run saw a relay refuse its own snapshot
    /// after its last write was a lot); an id found nowhere is refused.
    #[tokio::test]
    async fn a_snapshot_whose_last_row_is_a_lot_item_is_recognised() {
        use crate::snapshot::{Refused, Snapshot};
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreOptions::default()));
        let (exec, _rx) = executor(store.clone());
        let a = turn(&*store, "t1", "ann").await;
        let b = turn(&*store, "t2", "bob").await;
        assert!(exec.append_results(vec![a, b]).await.is_empty());
        assert_eq!(stored_verbs(&*store).await, vec![Verb::TaskLot]);
        let read = store
            .read_forward(Position::START, 100)
            .await
            .expect("read");
        let last = read.rows.last().expect("the lot's items");
        let snapshot = |id: InteractionId| Snapshot {
            cursor: read.next,
            last: Some((id, last.position)),
            rows: read.rows.len() as u64,
            state: Default::default(),
        };
        snapshot(last.id)
            .check_ledger(&*store)
            .await
            .expect("the lot's last item is in the ledger");
        assert!(matches!(
            snapshot(InteractionId([9; 32])).check_ledger(&*store).await,
            Err(Refused::LedgerMissing(_))
        ));
    }
}
