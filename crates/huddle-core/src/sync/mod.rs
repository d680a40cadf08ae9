//! Synchronization decisions: the relay's logic as a sans-I/O state machine.
//!
//! A [`Synchronizer`] runs inside one relay and speaks for the agents that relay
//! hosts. The relay feeds it [`Event`]s and performs the [`Intent`]s it returns; the
//! synchronizer never touches a database, a clock, a process or a socket.
//!
//! ```text
//!   ledger rows ─┐                        ┌─> Acquire   (claims.acquire)      ─> Event::ClaimResult
//!   ticks       ─┤                        ├─> Append    (ledger.append[_fenced])
//!   claim results┼─> Synchronizer::handle ┼─> StartTurn (driver)             ─> Event::TurnEnded
//!   turn endings ┤                        ├─> Renew     (claims.renew)        ─> Event::ClaimLost on failure
//!   lost claims ─┤                        ├─> Release   (claims.release)
//!   shutdown    ─┘                        ├─> Cancel    (kill the turn)       ─> Event::TurnEnded(Cancelled)
//!                                         └─> Stopped   (all turns ended after Shutdown)
//! ```
//!
//! # How a relay drives it
//!
//! 1. Build it with [`Synchronizer::new`] (relay id, rooms, local agents), optionally
//!    [`Synchronizer::with_options`] and [`Synchronizer::with_reply_gate`].
//! 2. Send `Tick { now }` with the **database** clock before anything else: no decision
//!    is made before the first tick (so a relay replaying old history never answers
//!    yesterday's messages).
//! 3. Feed every read-forward batch as `Ledger { rows, caught_up }`, with `caught_up`
//!    true when the read returned fewer rows than asked, including an empty first
//!    read. Decisions wait for a caught-up batch, so a relay never acts on a half-read
//!    ledger. Rows of rooms the relay does not serve are ignored.
//! 4. Whenever the effective config of a room or thread changes (the config fold),
//!    send `Config`. Rooms without one use [`RoomConfig::default`].
//! 5. Send `Tick { now }` at [`Synchronizer::next_wakeup`] (at the latest): that is
//!    when the next responder delay, bid window or reconcile pass falls due.
//!    After the rows of a caught-up read that began once the database clock read `T`
//!    (a tick taken before the read started), send `Covered { as_of: T }`: a closed
//!    bid window is decided only on a view that covers it
//!    ([`Synchronizer::awaiting_coverage`] names the time waited for).
//! 6. Perform the intents **in order**. `Acquire` is answered with
//!    `ClaimResult`; a refused renew or a refused fenced append with `ClaimLost`; a
//!    turn that ends (replied, failed, or cancelled after `Cancel`) with `TurnEnded`;
//!    a turn the relay could not start while it could still vouch for its claims with
//!    `TurnEnded(NotStarted)` (its claims are then released).
//!    When a fenced `Append` is refused, skip any later `StartTurn` in the same output
//!    whose [`TurnStart::claims`] contain that fence, and send `ClaimLost`.
//! 7. On shutdown send `Shutdown`, keep performing intents and feeding turn endings
//!    until [`Intent::Stopped`].
//!
//! # What it decides
//!
//! - **Reply election.** On an addressed `message.posted` (mentions, then reply-to,
//!   then broadcast; see [`addressing`]) each eligible local agent waits its
//!   responder delay ([`crate::policy::responder_delay_ms`]), then one local agent
//!   contends for `reply/<room>/<message>` (holder = agent). The winner appends a
//!   designation (fenced) and contends for `drive/<room>/<agent>/<message>` (holder =
//!   relay); the drive winner appends `turn.prompted` (fenced) and starts the turn.
//! - **Scheduling.** Ready tasks are allocated by [`crate::policy::claim_right`]:
//!   `task/<room>/<task>` (holder = agent, driver = this relay: one claim elects both,
//!   plan 0094), then `task.claimed` (+ `task.rejected` for every losing bidder) and
//!   `turn.prompted`, fenced by the task claim, and the turn. At most
//!   [`SyncOptions::max_wakes_per_pass`] claims or bids per pass.
//! - **Completion.** A turn that replies appends `task.completed` fenced by the task
//!   claim `(agent, epoch)`; a failed or cancelled turn appends `task.failed`
//!   (`task.released` during shutdown) and releases its claims; a turn whose claim was
//!   lost appends only `turn.failed`, never a completion.
//! - **Reconcile** (every claim TTL / 4): renew the claims of live turns only; try to
//!   re-take claimed tasks and taken-but-unanswered messages that no local turn is
//!   running (the store grants them only once the lease lapsed, including the former
//!   holder's own); bid windows close on the way.
//! - **Presence** is captured by the turn and task verbs it appends; the board folds it.
//!
//! Agent text is data: it is carried into bodies and prompts, and read only to find
//! `@mentions`. Nothing here routes it anywhere that executes.

pub mod addressing;
mod api;
mod snapshot;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::board::{Board, CoordinationDelivery};
use crate::budget::BudgetFold;
use crate::config::{Allocation, RoomConfig};
use crate::fold::Fold;
use crate::model::{Interaction, InteractionId, NewInteraction, Role, Timestamp};
use crate::policy::{
    bids_decide_until, bids_on_sight, capable, claim_right, losing_bidders, responder_delay_ms,
    retake_right, ClaimRight, ResponderCandidate,
};
use crate::protocol::task::{
    TaskBidBody, TaskClaimedBody, TaskCompletedBody, TaskEndedBody, TaskRejectedBody,
    TaskReviewedBody, Verdict, MAX_RESULT_BYTES,
};
use crate::protocol::{
    hash_parts, parse_body, truncate_text, AgentRegisteredBody, CoordNoteBody, DesignationBody,
    MessageBody, NoticeBody, Subject, SubjectKind, TurnActivity, TurnFailedBody, TurnPromptedBody,
    TurnRepliedBody, DEFAULT_PRIORITY,
};
use crate::tasks::{FrontierRank, TaskDag, TaskStatus};
use crate::verbs::Verb;

/// Claim keys and epochs are protocol vocabulary; re-exported here, where the relay
/// meets them.
pub use crate::protocol::claims::{
    directed_reply_key, drive_key, reply_key, reply_key_for, review_key, reviewdrive_key, task_key,
    task_key_at, taskdrive_key, taskdrive_key_at, ClaimEpoch, ClaimKey, ClaimRef,
};
pub use addressing::{Addressing, Eligible};
pub use api::{
    AdmitAll, ChainedAcquire, ClaimAnswer, ClaimOutcome, ClaimPurpose, DepResult, Event, Intent,
    LocalAgent, MessageBrief, ReplyGate, ResourcesAnswer, ReviewBrief, ReviewFeedback, SyncOptions,
    TaskBrief, TurnId, TurnOutcome, TurnStart, TurnWork, WriteIfWon,
};
pub use snapshot::{from_cbor, to_cbor, StateError};

// ---------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------

/// A message that may still need an answer.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct OpenMessage {
    thread: Option<String>,
    author: String,
    role: Role,
    at: Timestamp,
    text: String,
    eligible: Eligible,
    /// Agents whose reply turn on it failed.
    failed: BTreeSet<String>,
    /// The highest reply-claim epoch of a failed turn: designations up to it are void.
    failed_upto: Option<ClaimEpoch>,
    /// Failed turns on it, by turn id (noted when the turn ends here and again when
    /// its `turn.failed` is folded).
    failed_turns: BTreeSet<String>,
    /// It names several agents: each answers once, under its own reply claim.
    each: bool,
    /// Agents that answered it (`each` messages).
    answered: BTreeSet<String>,
    /// The hops an agent's reply to it carries when the reply addresses another
    /// agent (`None`: its own hops are malformed, so no hops are carried on).
    next_hops: Option<u64>,
    /// Failed turns per agent (`each` messages: a named agent's part is nobody else's,
    /// so it tries again, up to `max_failures`).
    failed_by: BTreeMap<String, BTreeSet<String>>,
    max_failures: u32,
}

impl OpenMessage {
    /// Whether `agent` still owes its own answer to an `each` message: not answered,
    /// and fewer failed turns on it than the limit.
    fn owed_by(&self, agent: &str) -> bool {
        self.eligible.contains(agent)
            && !self.answered.contains(agent)
            && self
                .failed_by
                .get(agent)
                .is_none_or(|t| t.len() < self.max_failures as usize)
    }

    fn note_failure(&mut self, agent: &str, turn: &str, epoch: ClaimEpoch) {
        self.failed.insert(agent.to_string());
        self.failed_upto = Some(self.failed_upto.map_or(epoch, |e| e.max(epoch)));
        self.failed_turns.insert(turn.to_string());
        self.failed_by
            .entry(agent.to_string())
            .or_default()
            .insert(turn.to_string());
    }
}

/// Task claims `(key, epoch)` under which a turn ended here (`Synchronizer::finished`),
/// by key, so the scheduling walk asks about a task without building a tuple.
#[derive(Clone, Debug, Default)]
struct EndedTurns(std::collections::HashMap<String, Vec<ClaimEpoch>>);

impl EndedTurns {
    fn insert(&mut self, key: &str, epoch: ClaimEpoch) {
        let epochs = match self.0.get_mut(key) {
            Some(e) => e,
            None => self.0.entry(key.to_string()).or_default(),
        };
        if !epochs.contains(&epoch) {
            epochs.push(epoch);
        }
    }

    fn contains(&self, key: &str, epoch: ClaimEpoch) -> bool {
        self.0.get(key).is_some_and(|e| e.contains(&epoch))
    }

    fn epochs(&self, key: &str) -> Option<&[ClaimEpoch]> {
        self.0.get(key).map(Vec::as_slice)
    }

    fn remove(&mut self, key: &str, epoch: ClaimEpoch) {
        if let Some(epochs) = self.0.get_mut(key) {
            epochs.retain(|e| *e != epoch);
            if epochs.is_empty() {
                self.0.remove(key);
            }
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, ClaimEpoch) -> bool) {
        self.0.retain(|key, epochs| {
            epochs.retain(|e| keep(key, *e));
            !epochs.is_empty()
        });
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A write that finished work (a reply, a task's completion or failure), appended but
/// not yet read back. Its claims may have lapsed before it was written (the relay was
/// paused between the turn and the write): if the store refuses it, the work is not
/// finished, and what this relay noted as finished is undone.
#[derive(Clone, Debug)]
struct Unconfirmed {
    claims: Vec<ClaimRef>,
    undo: Undo,
}

#[derive(Clone, Debug)]
enum Undo {
    /// The task's lease is not to be resumed (`Synchronizer::finished`).
    Task { key: String, epoch: ClaimEpoch },
    /// The review's verdict was written (`Synchronizer::reviews_finished`).
    Review { key: String },
    /// The message was noted as answered by `agent`; `before` is its state then.
    Reply {
        room: String,
        message: InteractionId,
        agent: String,
        before: Option<Box<OpenMessage>>,
    },
}

/// A claim being acquired (`epoch: None`) or held by this relay.
#[derive(Clone, Debug)]
struct Slot {
    holder: String,
    purpose: ClaimPurpose,
    epoch: Option<ClaimEpoch>,
}

#[derive(Clone, Debug)]
enum LiveWork {
    Reply {
        message: InteractionId,
        /// What the reply carries as `hops` if it addresses another agent.
        next_hops: Option<u64>,
    },
    Task {
        task: String,
    },
    Review {
        task: String,
    },
}

/// A turn held ahead: started when its agent's running turn ends (plan 0084).
#[derive(Clone, Debug)]
struct Parked {
    start: Box<TurnStart>,
    live: LiveTurn,
    /// Its claim rows were not written with its claims but appended after (plan
    /// 0085): it starts only once the view shows them, so its result can never be
    /// written before them (a write that would then be refused, its claims closed).
    rows_pending: bool,
}

#[derive(Clone, Debug)]
struct LiveTurn {
    agent: String,
    room: String,
    thread: Option<String>,
    subject: Subject,
    work: LiveWork,
    exclusive: ClaimRef,
    /// The claim that elects this relay to drive the turn: a reply's or review's
    /// drive claim; for a task turn the task claim itself, taken with this relay as
    /// its driver (plan 0094).
    drive: ClaimRef,
    /// The resources of a task's `[uses ...]` its turn holds (renewed with it,
    /// released when it ends).
    uses: Vec<ClaimRef>,
    lost: bool,
    cancel_sent: bool,
    /// Why the owner stopped it (`!stop`), or why its deadline did, if one did.
    stopped: Option<String>,
    /// Its attempt ran past the task's deadline (`stopped` says so).
    overdue: bool,
}

impl LiveTurn {
    /// The distinct claims the turn runs under ([`turn_claims`]).
    fn claims(&self) -> Vec<ClaimRef> {
        turn_claims(&self.exclusive, &self.drive)
    }
}

/// The distinct claims of a turn: its exclusive claim, then its drive claim when that
/// is another claim (a task turn runs under its task claim alone, plan 0094).
fn turn_claims(exclusive: &ClaimRef, drive: &ClaimRef) -> Vec<ClaimRef> {
    let mut claims = vec![exclusive.clone()];
    if drive.key != exclusive.key {
        claims.push(drive.clone());
    }
    claims
}

/// A task whose claim is won (with this relay as its driver): what
/// [`Synchronizer::drive_task_won`] starts a turn from, kept while the turn waits for
/// something — its `[uses ...]` resources being taken ([`Intent::AcquireResources`]),
/// or a view that covers the time its claims were won.
#[derive(Clone, Debug)]
struct WonTake {
    room: String,
    task: String,
    generation: u32,
    agent: String,
    task_epoch: ClaimEpoch,
}

/// What [`Synchronizer::claim_rows`] gives: the rows of a task claim and its turn.
struct ClaimRows {
    /// `task.claimed`, then the `task.rejected` of losing bidders.
    claimed: Vec<NewInteraction>,
    /// The rejections among them, as `rejections_sent` keys.
    rejected: Vec<(String, String, u32, String)>,
    /// The turn's `turn.prompted`.
    prompted: NewInteraction,
    turn: TurnId,
    subject: Subject,
}

/// The rows that record a claim (`task.claimed` and the rejections) and the turn's
/// start still to write beside them: `turn.prompted`, or nothing in a room with
/// `compact-turns on` (plan 0095), where `task.claimed` carries the turn's start.
fn claim_and_start(
    mut claimed: Vec<NewInteraction>,
    prompted: NewInteraction,
    compact: bool,
) -> (Vec<NewInteraction>, Option<NewInteraction>) {
    match claimed.first_mut().filter(|_| compact) {
        Some(row) => {
            let body = std::mem::take(&mut row.body);
            row.body = crate::protocol::carry_turn(body, prompted.body);
            (claimed, None)
        }
        None => (claimed, Some(prompted)),
    }
}

/// A relay's own rank for a task id (FNV-1a of both): deterministic per relay,
/// different across relays.
fn spread_rank(relay: &[u8], task: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in relay.iter().chain(&[0u8]).chain(task) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// How many written notices a relay remembers so as not to queue them again.
const REMEMBERED_NOTICES: usize = 4_096;

/// Shortest time between two settle checks, µs.
const SETTLE_CHECK_US: i64 = 1_000_000;

/// How long a ready task whose `needs` no registered agent declares waits before the
/// owner is told (agents registering as their relays start get this long), µs.
const UNSTAFFED_GRACE_US: i64 = 5_000_000;

/// Where a ready task sits in this relay's walk of a room's frontier: the frontier
/// rank first (the room's scheduling order), then this relay's own [`spread_rank`],
/// then the id. Relays walking a frontier longer than their free agents in their own
/// orders spread over different tasks instead of all contending for the first ones.
type WalkKey = (FrontierRank, u64, String);

/// How long to wait before retrying a claim whose holder's attempt already failed in
/// the ledger (it is releasing the claim), µs.
const RELEASE_BACK_OFF_US: i64 = 200_000;

/// The synchronization state machine of one relay. See the [module docs](self).
pub struct Synchronizer {
    relay: String,
    rooms: BTreeSet<String>,
    agents: BTreeMap<String, LocalAgent>,
    options: SyncOptions,
    gate: Box<dyn ReplyGate>,
    default_config: RoomConfig,
    configs: BTreeMap<(String, Option<String>), RoomConfig>,
    board: Board,
    /// Shared resources as their holders recorded them, for the `<coordination>` block.
    resources: crate::resources::ResourceFold,
    dag: TaskDag,
    /// Ready tasks given back at least once: they may be waiting out a back-off
    /// ([`crate::pacing::retry_at`]), whose end is a wakeup. Kept in step with the DAG
    /// fold's changes; an entry whose back-off is over is dropped by the next pass.
    backing_off: BTreeSet<(String, String)>,
    /// Failed turns of local agents that ended here and count for the circuit
    /// breaker, not yet read back: `(room, agent)` → turn → when it ended. Added to
    /// the board's streak, so an agent is benched at its Nth failure, not one turn
    /// later; dropped as each row is folded (or, never read back, after a lease).
    unfolded_failures: BTreeMap<(String, String), BTreeMap<String, Timestamp>>,
    /// Each room's ready tasks in this relay's walk order, kept in step with the DAG
    /// fold's changes (see [`WalkKey`]).
    walk: BTreeMap<String, BTreeSet<WalkKey>>,
    /// The walk key of each ready task, by (room, task).
    walk_keys: BTreeMap<(String, String), WalkKey>,
    budget: BudgetFold,
    delivery: CoordinationDelivery,
    messages: BTreeMap<(String, InteractionId), OpenMessage>,
    /// The author and trace (the first message of its reply chain) of each
    /// remembered message: one map, so a catch-up inserts and evicts once per message.
    remembered: BTreeMap<InteractionId, Remembered>,
    author_order: VecDeque<InteractionId>,
    claims: BTreeMap<String, Slot>,
    turns: BTreeMap<TurnId, LiveTurn>,
    held_elsewhere: BTreeMap<String, Timestamp>,
    /// Tasks whose resources are being taken, by task claim key.
    pending_uses: BTreeMap<String, WonTake>,
    /// Tasks whose claims were won over an attempt this relay's view may not show
    /// the end of, by task claim key, with the database time they were won at: each
    /// waits for a view covering that time before anything is written under them
    /// ([`Synchronizer::drive_task_won`]).
    awaiting_view: BTreeMap<String, (WonTake, Timestamp)>,
    /// Next tasks held ahead (plan 0084, `lease-ahead`), by agent: the turn each
    /// starts when the agent's running turn ends, its claims held and renewed.
    ahead: BTreeMap<String, std::collections::VecDeque<Parked>>,
    /// Resources won for a task claim `(key, epoch)` whose turn has not started yet.
    uses_won: BTreeMap<(String, ClaimEpoch), Vec<crate::resources::Holding>>,
    /// Task claim keys backing off because their resources were taken, by room: a
    /// `resource.released` row in the room ends the back-off early.
    resource_waits: BTreeMap<String, BTreeSet<String>>,
    /// Agents following a thread (`!watch`), by (room, thread).
    watchers: BTreeMap<(String, String), BTreeSet<String>>,
    /// Claims an acquire found closed: their work is finished, so they are never
    /// tried again (the fold shows why once it reads the closing row).
    closed: BTreeSet<String>,
    /// The last failed or released attempt per task key: `(agent, epoch, at)`. The
    /// agent that just failed a task gives others the first chance at the retry,
    /// and a claim found still held at that epoch is about to be released.
    returned: BTreeMap<String, (String, ClaimEpoch, Timestamp)>,
    bids_sent: BTreeSet<(String, String, u32, String)>,
    rejections_sent: BTreeSet<(String, String, u32, String)>,
    notices_sent: BTreeSet<(String, String)>,
    /// Notices that a message will not be answered, not yet written (by id).
    pending_notices: BTreeMap<InteractionId, NewInteraction>,
    /// Such notices already written or folded, the most recent [`REMEMBERED_NOTICES`]:
    /// never queued again.
    notices_done: (BTreeSet<InteractionId>, VecDeque<InteractionId>),
    /// Owner notices about stuck work (a task blocked by a dependency that failed for
    /// good, a task nobody can take, a spent budget), not yet written, by row id. Their
    /// content depends only on the ledger, so every relay queues the same rows.
    pending_stuck: BTreeMap<InteractionId, NewInteraction>,
    /// Stuck-work notices written here or folded: never queued again.
    stuck_noticed: BTreeSet<InteractionId>,
    /// Ready tasks with `needs`, by room: checked for a capable registered agent at
    /// the settle cadence.
    needs_watch: BTreeSet<(String, String)>,
    /// Per room: the latest `room.settled` folded or written.
    settled: BTreeMap<String, crate::protocol::RoomSettledBody>,
    /// Rooms whose tasks or turns moved since the last settle check.
    unsettled: BTreeSet<String>,
    /// When the next settle check may run: it reads the whole DAG, so at most once
    /// per [`SETTLE_CHECK_US`], not on every event.
    next_settle_check: Option<Timestamp>,
    /// The `task.rejected` keys of a fresh task's hand-off rows ([`WriteIfWon`]), by
    /// task claim key, until its claim result says whether they were written.
    prewrite_rejections: BTreeMap<String, Vec<(String, String, u32, String)>>,
    /// Task claims `(key, epoch)` whose turn ended here: never resumed, even while the
    /// fold has not yet caught up with the completion or failure appended for them.
    finished: EndedTurns,
    /// Review claim keys whose verdict this relay wrote: never reviewed again, even
    /// while the fold has not yet read the verdict.
    reviews_finished: BTreeSet<String>,
    /// Ending writes not yet read back (see [`Unconfirmed`]).
    unconfirmed: Vec<Unconfirmed>,
    registered: bool,
    now: Option<Timestamp>,
    caught_up: bool,
    /// Every row committed before this database time has been folded
    /// ([`Event::Covered`]).
    covered: Option<Timestamp>,
    /// The earliest bid window that closed but cannot be decided yet: the view does
    /// not cover it ([`Synchronizer::awaiting_coverage`]).
    coverage_wanted: Option<Timestamp>,
    next_reconcile: Option<Timestamp>,
    shutting_down: bool,
    stopped_sent: bool,
}

impl fmt::Debug for Synchronizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Synchronizer")
            .field("relay", &self.relay)
            .field("rooms", &self.rooms)
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .field("now", &self.now)
            .field("caught_up", &self.caught_up)
            .field("claims", &self.claims.len())
            .field("turns", &self.turns.len())
            .field("shutting_down", &self.shutting_down)
            .finish()
    }
}

fn ms_to_us(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000)
}

impl Synchronizer {
    /// A synchronizer for relay `relay` (its id: the holder of drive claims), hosting
    /// `agents` in every one of `rooms`. Interactions of other rooms are ignored.
    pub fn new<R, S>(relay: impl Into<String>, rooms: R, agents: Vec<LocalAgent>) -> Self
    where
        R: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Synchronizer {
            relay: relay.into(),
            rooms: rooms.into_iter().map(Into::into).collect(),
            agents: agents.into_iter().map(|a| (a.key.clone(), a)).collect(),
            options: SyncOptions::default(),
            gate: Box::new(AdmitAll),
            default_config: RoomConfig::default(),
            configs: BTreeMap::new(),
            board: Board::new(),
            resources: Default::default(),
            dag: {
                let mut dag = TaskDag::new();
                dag.track_changes();
                dag
            },
            backing_off: BTreeSet::new(),
            unfolded_failures: BTreeMap::new(),
            walk: BTreeMap::new(),
            walk_keys: BTreeMap::new(),
            budget: BudgetFold::new(),
            delivery: CoordinationDelivery::new(),
            messages: BTreeMap::new(),
            remembered: BTreeMap::new(),
            author_order: VecDeque::new(),
            claims: BTreeMap::new(),
            turns: BTreeMap::new(),
            held_elsewhere: BTreeMap::new(),
            pending_uses: BTreeMap::new(),
            awaiting_view: BTreeMap::new(),
            ahead: BTreeMap::new(),
            uses_won: BTreeMap::new(),
            resource_waits: BTreeMap::new(),
            watchers: BTreeMap::new(),
            closed: BTreeSet::new(),
            returned: BTreeMap::new(),
            bids_sent: BTreeSet::new(),
            rejections_sent: BTreeSet::new(),
            notices_sent: BTreeSet::new(),
            pending_notices: BTreeMap::new(),
            notices_done: (BTreeSet::new(), VecDeque::new()),
            pending_stuck: BTreeMap::new(),
            stuck_noticed: BTreeSet::new(),
            needs_watch: BTreeSet::new(),
            settled: BTreeMap::new(),
            unsettled: BTreeSet::new(),
            next_settle_check: None,
            finished: EndedTurns::default(),
            prewrite_rejections: BTreeMap::new(),
            reviews_finished: BTreeSet::new(),
            unconfirmed: Vec::new(),
            registered: false,
            now: None,
            caught_up: false,
            covered: None,
            coverage_wanted: None,
            next_reconcile: None,
            shutting_down: false,
            stopped_sent: false,
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: SyncOptions) -> Self {
        self.options = options;
        self
    }

    /// Installs the gate consulted before any agent may answer a message.
    pub fn with_reply_gate(mut self, gate: Box<dyn ReplyGate>) -> Self {
        self.gate = gate;
        self
    }

    /// Nothing of this relay's own is under way: no turn, no claim held or being
    /// taken, no resources being taken, no ending write not yet read back. Its state
    /// is then what the rows made of it ([`Synchronizer::save_state`]).
    pub fn is_idle(&self) -> bool {
        self.turns.is_empty()
            && self.claims.is_empty()
            && self.pending_uses.is_empty()
            && self.uses_won.is_empty()
            && self.unconfirmed.iter().all(|u| match &u.undo {
                // Read back: the fold shows the outcome this write recorded.
                Undo::Task { key, epoch } => outcome_read(&self.dag, key, *epoch),
                Undo::Review { key } => !still_in_review(&self.dag, key),
                Undo::Reply { .. } => false,
            })
    }

    /// This relay's id.
    pub fn relay_id(&self) -> &str {
        &self.relay
    }

    /// Whether this relay serves `room` (rows of other rooms are ignored).
    pub fn serves(&self, room: &str) -> bool {
        self.rooms.contains(room)
    }

    /// The local agents, by key.
    pub fn agents(&self) -> &BTreeMap<String, LocalAgent> {
        &self.agents
    }

    /// The board folded so far (this relay's rooms).
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// The task DAG folded so far (this relay's rooms).
    pub fn tasks(&self) -> &TaskDag {
        &self.dag
    }

    /// The effective config of a room (`thread: None`) or thread.
    pub fn config(&self, room: &str, thread: Option<&str>) -> &RoomConfig {
        effective_config(&self.configs, &self.default_config, room, thread)
    }

    /// Turns this relay is running: `(turn, agent, room)`.
    pub fn live_turns(&self) -> Vec<(&TurnId, &str, &str)> {
        self.turns
            .iter()
            .map(|(id, t)| (id, t.agent.as_str(), t.room.as_str()))
            .collect()
    }

    /// The latest database time seen (from ticks and folded rows).
    pub fn now(&self) -> Option<Timestamp> {
        self.now
    }

    /// A closed bid window that waits for a read covering it (database time): who
    /// claims the task depends on every bid placed in the window, so nobody claims
    /// until an [`Event::Covered`] at or after this time arrives. The relay answers
    /// with a fresh read once its clock is past it.
    pub fn awaiting_coverage(&self) -> Option<Timestamp> {
        match (self.coverage_wanted, self.earliest_awaiting_view()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the room is quiescent: no task ready or claimed, no turn in flight in
    /// the ledger, and nothing in flight on this relay (turns or claim acquisitions).
    /// Tasks blocked behind an abandoned dependency do not keep a room busy.
    pub fn is_quiescent(&self, room: &str) -> bool {
        self.dag.is_settled(room)
            && self
                .board
                .room(room)
                .is_none_or(|b| b.open_turns().is_empty())
            && !self.turns.values().any(|t| t.room == room)
            && !self.claims.values().any(|s| s.purpose.room() == room)
    }

    /// When the relay should send the next [`Event::Tick`] at the latest (database
    /// time): the next reconcile pass, responder delay or bid window. `None` before
    /// the first tick.
    pub fn next_wakeup(&self) -> Option<Timestamp> {
        let now = self.now?;
        let mut best = self.wakeup_before_bid_windows(now);
        let mut consider = |t: Timestamp| {
            if t > now && t < best {
                best = t;
            }
        };
        if self.caught_up && !self.shutting_down {
            for room in &self.rooms {
                let config = self.config(room, None);
                if config.allocation != Allocation::Bid {
                    // Only bid windows change a ready task's claim right by themselves.
                    continue;
                }
                // Found through the readiness-time index, not a walk of the frontier:
                // a bid window closes `window` after readiness, and a winner's turn to
                // claim ends one window later.
                let window = ms_to_us(config.bid_window_ms);
                let open_from = now.saturating_sub(window).saturating_add(1);
                if let Some((since, _)) = self.dag.ready_since_from(room, open_from).next() {
                    consider(since.saturating_add(window));
                }
                let won_from = open_from.saturating_sub(window);
                for (since, t) in self.dag.ready_since_from(room, won_from) {
                    if since >= open_from {
                        break;
                    }
                    let right = claim_right(config, t, since, now);
                    if let Some(at) = right.changes_at(config, since) {
                        consider(at);
                        break;
                    }
                }
            }
        }
        Some(best)
    }

    /// The next wake-up from everything but the bid windows of ready tasks (which
    /// [`Self::next_wakeup`] finds through the readiness-time index): the next
    /// reconcile pass, responder delays, takes waiting for a view, back-offs,
    /// benches and attempt deadlines.
    pub(crate) fn wakeup_before_bid_windows(&self, now: Timestamp) -> Timestamp {
        let mut best = self.next_reconcile.unwrap_or(now);
        let mut consider = |t: Timestamp| {
            if t > now && t < best {
                best = t;
            }
        };
        if self.caught_up && !self.shutting_down {
            for ((room, id), m) in &self.messages {
                if m.each {
                    // Each named agent contends at once for its own claim.
                    continue;
                }
                if self.claims.contains_key(&reply_key(room, id)) || self.is_taken(room, id, m) {
                    continue;
                }
                for (due, _) in self.reply_dues(room, m) {
                    consider(due);
                }
            }
            // Won claims waiting for a view that covers their time: a tick at that
            // time (passed already: at once), after which the relay reads afresh.
            if let Some(at) = self.earliest_awaiting_view() {
                consider(at);
            }
            // The ends of back-offs, benches and attempt deadlines.
            for (room, task) in &self.backing_off {
                if let Some(t) = self.dag.task(room, task) {
                    if let Some(at) = crate::pacing::retry_at(self.config(room, None), room, t) {
                        consider(at);
                    }
                }
            }
            for room in &self.rooms {
                for a in self.agents.keys() {
                    if let Some(until) = self.benched_until(room, a) {
                        consider(until);
                    }
                }
            }
            for t in self.turns.values() {
                if let Some(at) = self.attempt_due(t) {
                    consider(at);
                }
            }
        }
        best
    }

    /// Handles one event and returns what to do, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Intent> {
        self.handle_all(std::iter::once(event))
    }

    /// Handles events that arrived together, then runs one scheduling pass over the
    /// state they leave (rather than one pass per event: a relay whose hundred claims
    /// are answered at once schedules once, not a hundred times). Returns what to do,
    /// in order: each event's own intents in arrival order, then the pass's.
    pub fn handle_all(&mut self, events: impl IntoIterator<Item = Event>) -> Vec<Intent> {
        let mut out = Vec::new();
        let mut wants_pass = false;
        for event in events {
            wants_pass |= self.apply_event(event, &mut out);
        }
        // Held turns of agents no longer at work start: at their running turn's end,
        // or once their rows are read back (plans 0084, 0085).
        if !self.ahead.is_empty() {
            let idle: Vec<String> = self
                .ahead
                .keys()
                .filter(|a| !self.turns.values().any(|t| &t.agent == *a))
                .cloned()
                .collect();
            for agent in idle {
                self.start_ahead(&agent, &mut out);
            }
        }
        if wants_pass {
            self.pass(&mut out);
        }
        if self.shutting_down
            && self.turns.is_empty()
            && self.pending_uses.is_empty()
            && !self.stopped_sent
        {
            self.stopped_sent = true;
            out.push(Intent::Stopped);
        }
        out
    }

    /// Applies one event's direct effects; false when it cannot change what a pass
    /// would decide.
    fn apply_event(&mut self, event: Event, out: &mut Vec<Intent>) -> bool {
        match event {
            Event::Ledger { rows, caught_up } => {
                for row in &rows {
                    self.fold(row, out);
                }
                self.follow_frontier();
                self.caught_up = caught_up;
            }
            Event::Tick { now } => {
                self.now = Some(self.now.map_or(now, |n| n.max(now)));
                if self.next_reconcile.is_none_or(|at| now >= at) {
                    self.reconcile(now, out);
                }
            }
            Event::Covered { as_of } => {
                self.covered = Some(self.covered.map_or(as_of, |c| c.max(as_of)));
                let takes = self.view_covers_takes(as_of, out);
                // Otherwise only a bid decision waits for coverage.
                if !takes && self.coverage_wanted.is_none_or(|w| w > as_of) {
                    return false;
                }
            }
            Event::ClaimResult(r) => self.on_claim_result(r, out),
            Event::TurnEnded {
                turn,
                outcome,
                tokens,
                activity,
            } => self.on_turn_ended(&turn, outcome, tokens, activity, out),
            Event::ClaimLost { key, epoch } => self.on_claim_lost(&key, epoch, out),
            Event::ResourcesResult { key, epoch, answer } => {
                self.on_resources(&key, epoch, answer, out)
            }
            Event::Stop {
                room,
                agent,
                thread,
                command,
            } => self.on_stop(&room, agent.as_deref(), thread.as_deref(), command, out),
            Event::Watch {
                room,
                thread,
                agent,
                watch,
            } => {
                let w = self.watchers.entry((room, thread)).or_default();
                if watch {
                    w.insert(agent);
                } else {
                    w.remove(&agent);
                }
            }
            Event::Config {
                room,
                thread,
                config,
            } => {
                self.configs.insert((room, thread), config);
                // A shorter claim TTL takes effect at once: renewals and re-takes must
                // not wait for a pass scheduled under the old TTL (a relay's first
                // pass is scheduled before it has read the room's config).
                if let (Some(now), Some(at)) = (self.now, self.next_reconcile) {
                    let due = now.saturating_add(ms_to_us(self.reconcile_interval_ms()));
                    if due < at {
                        self.next_reconcile = Some(due);
                    }
                }
            }
            Event::Shutdown => {
                self.shutting_down = true;
                // Won claims that wait for a view start nothing now: let them go.
                for (tkey, (p, _)) in std::mem::take(&mut self.awaiting_view) {
                    self.release_unused_take(&tkey, &p, out);
                }
                for p in std::mem::take(&mut self.ahead).into_values().flatten() {
                    self.drop_parked(p, out);
                }
                for (id, t) in self.turns.iter_mut() {
                    if !t.cancel_sent {
                        t.cancel_sent = true;
                        out.push(Intent::Cancel { turn: id.clone() });
                    }
                }
            }
        }
        true
    }

    // -----------------------------------------------------------------------------
    // Folding
    // -----------------------------------------------------------------------------

    fn fold(&mut self, row: &Interaction, out: &mut Vec<Intent>) {
        if !self.rooms.contains(&row.room) {
            return;
        }
        self.board.apply(row);
        self.resources.apply(row);
        if row.verb == Verb::ResourceReleased {
            // Resources given back: the tasks that waited for them may try again.
            for key in self.resource_waits.remove(&row.room).unwrap_or_default() {
                self.held_elsewhere.remove(&key);
            }
        }
        self.dag.apply(row);
        self.budget.apply(row);
        if let Some(now) = self.now {
            self.now = Some(now.max(row.at));
        }
        if matches!(
            row.verb,
            Verb::TaskCreated
                | Verb::TaskClaimed
                | Verb::TaskCompleted
                | Verb::TaskFailed
                | Verb::TaskReleased
                | Verb::TaskReviewed
                | Verb::TurnPrompted
                | Verb::TurnReplied
                | Verb::TurnFailed
        ) {
            self.unsettled.insert(row.room.clone());
        }
        if row.role == Role::Agent {
            // A turn's end: its `turn.*` row or the task row carrying it (plan 0095).
            if let Some((Verb::TurnReplied | Verb::TurnFailed, body)) =
                crate::protocol::carried_turn(row.verb, &row.body)
            {
                self.fold_turn_end(&row.room, &row.actor, body);
            }
        }
        match row.verb {
            Verb::RoomSettled if row.role == Role::System => {
                if let Some(b) = parse_body::<crate::protocol::RoomSettledBody>(&row.body) {
                    self.settled.insert(row.room.clone(), b);
                }
            }
            Verb::MessagePosted => {
                self.remember_author(row);
                // A notice already written (by any relay) needs no second append,
                // and its message is given up everywhere.
                self.pending_notices.remove(&row.id);
                if row.role == Role::System && row.body.get("unanswered").is_some() {
                    self.notice_done(row.id);
                    // One named agent's part given up leaves the others' open.
                    if let Some(p) = row.parent.filter(|_| row.body.get("agent").is_none()) {
                        self.messages.remove(&(row.room.clone(), p));
                    }
                }
                // An agent's answer written by the agent itself (MCP) answers too.
                if row.role == Role::Agent {
                    if let Some(p) = row.parent {
                        self.answered(&row.room, p, &row.actor);
                    }
                }
                self.consider_message(row);
            }
            Verb::TurnReplied => {
                if let Some(b) = parse_body::<TurnRepliedBody>(&row.body) {
                    if let Some(id) = message_subject(&b.subject) {
                        self.answered(&row.room, id, &row.actor);
                    }
                }
            }
            Verb::TurnFailed => {
                if let Some(b) = parse_body::<TurnFailedBody>(&row.body) {
                    if let Some(id) = message_subject(&b.subject) {
                        let max = self
                            .config(&row.room, row.thread.as_deref())
                            .max_reply_failures;
                        let key = (row.room.clone(), id);
                        let mut each = false;
                        if let Some(m) = self.messages.get_mut(&key) {
                            m.note_failure(&row.actor, &b.turn, b.epoch);
                            each = m.each;
                            let why = failure_notice(m, &row.actor, max);
                            let thread = m.thread.clone();
                            if let Some(why) = why {
                                self.notice_unanswered(&row.room, thread, id, &why);
                            }
                            if !each && m_failed_out(&self.messages, &key, max) {
                                self.messages.remove(&key);
                            }
                        }
                        self.drop_if_all_answered(&key);
                        // The failed holder released the reply claim before writing
                        // this row: a back-off taken while it held the claim (until
                        // its lease would lapse) no longer applies.
                        self.held_elsewhere
                            .remove(&reply_key_for(&row.room, &id, &row.actor, each));
                    }
                }
            }
            Verb::TaskFailed | Verb::TaskReleased => {
                if let Some(b) = TaskEndedBody::parse(&row.body) {
                    let key = task_key_at(&row.room, &b.task, b.generation);
                    // Its holder releases the claim right after this row: a back-off
                    // taken while it held the claim no longer applies.
                    self.held_elsewhere.remove(&key);
                    self.returned
                        .insert(key, (row.actor.clone(), b.epoch, row.at));
                }
            }
            Verb::TaskReviewed => {
                if let Some(b) = TaskReviewedBody::parse(&row.body) {
                    // Folded: the fold now says whether it is still in review.
                    self.reviews_finished
                        .remove(&review_key(&row.room, &b.task, b.generation));
                }
            }
            Verb::CoordNote if matches!(row.role, Role::System | Role::Owner) => {
                if let Some(CoordNoteBody::Notice(n)) = CoordNoteBody::parse(&row.body) {
                    if is_stuck_notice(&n.about) {
                        self.stuck_noticed.insert(row.id);
                        self.pending_stuck.remove(&row.id);
                    }
                }
            }
            Verb::TaskBid => self.reject_late_bid(row, out),
            Verb::TaskCancelled => self.stop_cancelled(&row.room, &row.actor, out),
            _ => {}
        }
    }

    /// Brings the walk orders in step with the tasks the DAG fold touched, and notes
    /// what became stuck among them.
    fn follow_frontier(&mut self) {
        for (room, task) in self.dag.take_changes() {
            let key = (room, task);
            self.note_if_blocked(&key.0, &key.1);
            let needs_someone = self.dag.is_ready(&key.0, &key.1)
                && self
                    .dag
                    .task(&key.0, &key.1)
                    .is_some_and(|t| !t.needs.is_empty());
            if needs_someone {
                self.needs_watch.insert(key.clone());
            } else {
                self.needs_watch.remove(&key);
            }
            let returned = self.dag.is_ready(&key.0, &key.1)
                && self
                    .dag
                    .task(&key.0, &key.1)
                    .is_some_and(|t| t.returned_at.is_some());
            if returned {
                self.backing_off.insert(key.clone());
            } else {
                self.backing_off.remove(&key);
            }
            if let Some(old) = self.walk_keys.remove(&key) {
                if let Some(w) = self.walk.get_mut(&key.0) {
                    w.remove(&old);
                }
            }
            if let Some(fk) = self.dag.frontier_key(&key.0, &key.1) {
                let wk = (
                    fk.rank.clone(),
                    spread_rank(self.relay.as_bytes(), key.1.as_bytes()),
                    key.1.clone(),
                );
                self.walk
                    .entry(key.0.clone())
                    .or_default()
                    .insert(wk.clone());
                self.walk_keys.insert(key, wk);
            }
        }
    }

    /// Queues the owner notice for `task` when a dependency of it failed for good (one
    /// notice per dependency and its attempts: a retried dependency that fails again
    /// is told again). Costs the task's dependencies; called for changed tasks only.
    fn note_if_blocked(&mut self, room: &str, task: &str) {
        let blockers: Vec<String> = self
            .dag
            .blocked_by(room, task)
            .into_iter()
            .filter(|b| b.reason == crate::tasks::BlockReason::Abandoned)
            .map(|b| b.task)
            .collect();
        let Some(t) = self.dag.task(room, task) else {
            return;
        };
        let label = truncate_text(&t.label, 120);
        for dep in blockers {
            let attempts = self.dag.task(room, &dep).map_or(0, |d| d.attempts);
            let text = format!(
                "task {task} ({label}) cannot run: it waits for {dep}, which failed for good \
                 after {attempts} attempt(s). `!retry {dep}` runs {dep} again; `!cancel {task}` \
                 gives {task} up."
            );
            self.queue_stuck(room, NoticeBody::TASK_BLOCKED, Some(task), text);
        }
    }

    /// Queues a stuck-work notice to the owner unless it was written or folded.
    fn queue_stuck(&mut self, room: &str, about: &str, task: Option<&str>, text: String) {
        let body = CoordNoteBody::Notice(NoticeBody {
            about: about.to_string(),
            to: Some("owner".to_string()),
            task: task.map(str::to_string),
            text,
        });
        let row = NewInteraction::new(
            room,
            Verb::CoordNote,
            crate::protocol::SYSTEM_ACTOR,
            Role::System,
            body.to_body(),
        );
        let id = row.id();
        if !self.stuck_noticed.contains(&id) {
            self.pending_stuck.insert(id, row);
        }
    }

    /// Ready tasks with `needs` that no agent registered in the room declares, ready
    /// for longer than [`UNSTAFFED_GRACE_US`]: each gets one owner notice. Walks only
    /// the ready tasks that have `needs`.
    fn note_unstaffed(&mut self, now: Timestamp) {
        let mut found: Vec<(String, String, String)> = Vec::new();
        for (room, task) in &self.needs_watch {
            let Some(t) = self.dag.task(room, task) else {
                continue;
            };
            let since = self.dag.ready_since(room, task).unwrap_or(now);
            if now.micros_since(since) < UNSTAFFED_GRACE_US {
                continue;
            }
            let capable = self.board.room(room).is_some_and(|b| {
                b.agents
                    .values()
                    .any(|a| t.needs.iter().all(|n| a.capabilities.contains(n)))
            });
            if !capable {
                let text = format!(
                    "task {task} ({}) cannot start: it needs {} and no agent registered in \
                     this room declares {}. Start an agent with `capabilities = [...]` \
                     covering it, or `!cancel {task}`.",
                    truncate_text(&t.label, 120),
                    t.needs.join(", "),
                    if t.needs.len() == 1 { "it" } else { "them all" }
                );
                found.push((room.clone(), task.clone(), text));
            }
        }
        for (room, task, text) in found {
            self.queue_stuck(&room, NoticeBody::TASK_UNSTAFFED, Some(&task), text);
        }
    }

    fn write_stuck(&mut self, out: &mut Vec<Intent>) {
        if self.pending_stuck.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending_stuck);
        self.stuck_noticed.extend(pending.keys().copied());
        out.push(Intent::Append {
            fences: Vec::new(),
            close: false,
            batch: pending.into_values().collect(),
        });
    }

    /// `agent` answered message `id`: a message naming several agents stays open
    /// until each local one of them answered (or failed); any other is finished.
    fn answered(&mut self, room: &str, id: InteractionId, agent: &str) {
        self.unconfirmed.retain(|u| {
            !matches!(&u.undo, Undo::Reply { room: r, message, agent: a, .. }
                if r == room && *message == id && a == agent)
        });
        let key = (room.to_string(), id);
        match self.messages.get_mut(&key) {
            Some(m) if m.each => {
                m.answered.insert(agent.to_string());
            }
            Some(_) => {
                self.messages.remove(&key);
                return;
            }
            None => return,
        }
        self.drop_if_all_answered(&key);
    }

    /// Forgets a message naming several agents once no local agent owes it an answer.
    fn drop_if_all_answered(&mut self, key: &(String, InteractionId)) {
        let done = self
            .messages
            .get(key)
            .is_some_and(|m| m.each && !self.agents.keys().any(|a| m.owed_by(a)));
        if done {
            self.messages.remove(key);
        }
    }

    fn remember_author(&mut self, row: &Interaction) {
        let trace = row
            .parent
            .and_then(|p| self.remembered.get(&p).map(|r| r.trace))
            .unwrap_or(row.id);
        let remembered = Remembered {
            author: row.actor.clone(),
            trace,
        };
        if self.remembered.insert(row.id, remembered).is_none() {
            self.author_order.push_back(row.id);
        }
        while self.author_order.len() > self.options.remembered_authors {
            if let Some(old) = self.author_order.pop_front() {
                self.remembered.remove(&old);
            }
        }
    }

    /// Agents registered in a room so far (in ledger order). Addressing uses only
    /// these, never this relay's own agents, so every relay reads a message's
    /// addressing the same way.
    fn registered_agents(&self, room: &str) -> BTreeSet<String> {
        self.board
            .room(room)
            .map(|b| b.agents.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Registered agents and local ones (the responder candidates of a broadcast).
    fn known_agents(&self, room: &str) -> BTreeSet<String> {
        let mut known = self.registered_agents(room);
        known.extend(self.agents.keys().cloned());
        known
    }

    fn consider_message(&mut self, row: &Interaction) {
        let body: MessageBody = parse_body(&row.body).unwrap_or_default();
        let parent_author = row
            .parent
            .and_then(|p| self.remembered.get(&p))
            .map(|r| r.author.clone());
        let addressing = addressing::address_in_room(
            &body.text,
            &body.mentions,
            parent_author.as_deref(),
            &self.board.capabilities(&row.room),
        );
        // Borrowed from its own field, so the gate (another field) may be borrowed
        // mutably beside it: no copy of the config per message.
        let config = effective_config(
            &self.configs,
            &self.default_config,
            &row.room,
            row.thread.as_deref(),
        );
        let eligible = addressing::eligible(
            &row.actor,
            row.role,
            &body.text,
            &addressing,
            config.require_mention,
        );
        if !self.agents.keys().any(|a| eligible.contains(a)) {
            return;
        }
        if !self.gate.admit(row, config) {
            return;
        }
        let each = addressing::answers_each(
            &eligible,
            &body.text,
            &body.mentions,
            &self.registered_agents(&row.room),
            config.group_reply,
        );
        self.messages.insert(
            (row.room.clone(), row.id),
            OpenMessage {
                thread: row.thread.clone(),
                author: row.actor.clone(),
                role: row.role,
                at: row.at,
                text: body.text,
                each,
                eligible,
                failed: BTreeSet::new(),
                failed_upto: None,
                failed_turns: BTreeSet::new(),
                answered: BTreeSet::new(),
                next_hops: crate::guards::next_hops(&row.body),
                failed_by: BTreeMap::new(),
                max_failures: config.max_reply_failures.max(1),
            },
        );
    }

    /// A bid folded for a task one of our agents already holds for that attempt: tell
    /// the bidder it lost.
    fn reject_late_bid(&mut self, row: &Interaction, out: &mut Vec<Intent>) {
        let Some(b) = TaskBidBody::parse(&row.body).filter(|b| !b.decline) else {
            return;
        };
        let Some(t) = self.dag.task(&row.room, &b.task) else {
            return;
        };
        let (Some(owner), Some(epoch)) = (t.owner.clone(), t.epoch) else {
            return;
        };
        let live = self.turns.values().any(|lt| {
            matches!(&lt.work, LiveWork::Task { task } if *task == b.task)
                && lt.room == row.room
                && lt.exclusive.epoch == epoch
                && !lt.lost
        });
        if !live || t.status != TaskStatus::Claimed || b.attempt != t.attempts || row.actor == owner
        {
            return;
        }
        let key = (
            row.room.clone(),
            b.task.clone(),
            b.attempt,
            row.actor.clone(),
        );
        if !self.rejections_sent.insert(key) {
            return;
        }
        out.push(Intent::Append {
            fences: vec![ClaimRef {
                key: self.tkey(&row.room, &b.task),
                holder: owner.clone(),
                epoch,
            }],
            close: false,
            batch: vec![rejection(&row.room, &owner, &b.task, b.attempt, &row.actor)],
        });
    }

    // -----------------------------------------------------------------------------
    // Passes
    // -----------------------------------------------------------------------------

    /// Stops this relay's running turns of tasks of `room` the owner cancelled: each
    /// ends without a completion (the fold refuses one now anyway) and its
    /// `turn.failed` says why.
    fn stop_cancelled(&mut self, room: &str, by: &str, out: &mut Vec<Intent>) {
        for (id, t) in self.turns.iter_mut() {
            let (LiveWork::Task { task } | LiveWork::Review { task }) = &t.work else {
                continue;
            };
            let cancelled = t.room == room
                && self
                    .dag
                    .task(room, task)
                    .is_some_and(|x| x.status == TaskStatus::Cancelled);
            if cancelled && !t.cancel_sent {
                t.cancel_sent = true;
                t.stopped = Some(format!(
                    "cancelled: the owner {by} cancelled task {task} (!cancel)"
                ));
                out.push(Intent::Cancel { turn: id.clone() });
            }
        }
    }

    /// Whether this relay is already acquiring or holding the task's claim `key` (one
    /// claim a task turn, plan 0094: a second acquisition could not be told apart from
    /// the first).
    fn task_busy(&self, key: &str) -> bool {
        self.claims.contains_key(key)
    }

    /// Whether a turn under task claim `key` ended here and the fold does not show
    /// its outcome yet ([`outcome_read`]): its task is not to be taken again, whatever
    /// the view shows meanwhile (ready, its claim not read yet; or claimed by the
    /// agent with no turn of it running), or the claim would be asked for while the
    /// result that closes it is on its way, and the store grants a live claim to its
    /// own holder: a second execution under the same lease.
    /// `key` is the claim key of `task` of `room` at its generation in the view.
    fn ended_here(&self, room: &str, task: &str, key: &str) -> bool {
        let Some(epochs) = self.finished.epochs(key) else {
            return false;
        };
        let t = self.dag.task(room, task);
        let generation = t.map_or(0, |t| t.generation);
        epochs.iter().any(|e| !outcome_read_of(t, generation, *e))
    }

    /// The generation of `task` in `room` (0 for an unknown task).
    fn generation(&self, room: &str, task: &str) -> u32 {
        self.dag.task(room, task).map_or(0, |t| t.generation)
    }

    /// The task claim key of `task`'s current generation.
    fn tkey(&self, room: &str, task: &str) -> String {
        task_key_at(room, task, self.generation(room, task))
    }

    /// Which local agents (in `self.agents` order) have a live turn or a claim in
    /// flight or held: computed once per scheduling pass instead of scanning turns and
    /// claims per task and agent, without copying a name (a pass runs after every
    /// event, so this is on every event's path).
    fn busy_flags(&self) -> Vec<bool> {
        let busy: BTreeSet<&str> = self
            .turns
            .values()
            .map(|t| t.agent.as_str())
            .chain(self.claims.values().map(|s| s.purpose.agent()))
            .collect();
        self.agents
            .keys()
            .map(|k| busy.contains(k.as_str()))
            .collect()
    }

    /// How many more tasks each agent may take ahead in `room` (plans 0084, 0085):
    /// for an agent that runs one task turn of the room, not lost or being cancelled,
    /// and holds no claim but that turn's and those of the turns it holds ahead (none
    /// in flight), `depth` less the turns it holds ahead; 0 for every other agent.
    /// One count per agent, in the agents' order (as [`Self::busy_flags`]).
    fn ahead_room(&self, room: &str, depth: usize) -> Vec<usize> {
        let mut running: BTreeMap<&str, (usize, Option<&LiveTurn>)> = BTreeMap::new();
        for t in self.turns.values() {
            let e = running.entry(t.agent.as_str()).or_default();
            e.0 += 1;
            e.1 = Some(t);
        }
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for s in self.claims.values() {
            *held.entry(s.purpose.agent()).or_default() += 1;
        }
        self.agents
            .values()
            .map(|a| {
                let Some((1, Some(t))) = running.get(a.key.as_str()).copied() else {
                    return 0;
                };
                let parked = self.parked(&a.key);
                let open = t.room == room
                    && matches!(t.work, LiveWork::Task { .. })
                    && !t.lost
                    && !t.cancel_sent
                    // One claim a task turn (plan 0094), and its resources.
                    && held.get(a.key.as_str()).copied().unwrap_or(0)
                        == 1 + t.uses.len() + parked;
                if open {
                    depth.saturating_sub(parked)
                } else {
                    0
                }
            })
            .collect()
    }

    fn busy(&self, agent: &str) -> bool {
        self.turns.values().any(|t| t.agent == agent)
            || self.claims.values().any(|s| s.purpose.agent() == agent)
    }

    /// A turn ending of an agent read back: it is in the board's streak now.
    fn fold_turn_end(&mut self, room: &str, agent: &str, body: &serde_json::Value) {
        let key = (room.to_string(), agent.to_string());
        let Some(pending) = self.unfolded_failures.get_mut(&key) else {
            return;
        };
        if let Some(turn) = body.get("turn").and_then(serde_json::Value::as_str) {
            pending.remove(turn);
        }
        if pending.is_empty() {
            self.unfolded_failures.remove(&key);
        }
    }

    /// `agent`'s failed turns in a row in `room`: the board's streak plus its failures
    /// that ended here and are not read back yet.
    fn streak(&self, room: &str, agent: &str) -> Option<crate::board::FailStreak> {
        let folded = self
            .board
            .room(room)
            .and_then(|b| b.failing.get(agent))
            .copied();
        let Some(p) = self
            .unfolded_failures
            .get(&(room.to_string(), agent.to_string()))
        else {
            return folded;
        };
        let last = p.values().max().copied().unwrap_or(Timestamp::MIN);
        let mut s = folded.unwrap_or(crate::board::FailStreak { failed: 0, last });
        s.failed = s
            .failed
            .saturating_add(u32::try_from(p.len()).unwrap_or(u32::MAX));
        s.last = s.last.max(last);
        Some(s)
    }

    /// Until when the circuit breaker benches `agent` in `room`, if it does.
    fn benched_until(&self, room: &str, agent: &str) -> Option<Timestamp> {
        let s = self.streak(room, agent)?;
        crate::pacing::benched_until(self.config(room, None), &s)
    }

    /// Whether the circuit breaker benched `agent` in `room` now
    /// ([`crate::pacing::benched_until`]).
    fn benched(&self, room: &str, agent: &str) -> bool {
        matches!((self.now, self.benched_until(room, agent)), (Some(now), Some(until)) if now < until)
    }

    /// The room's benched agents now, for the `<coordination>` block.
    fn benched_lines(&self, room: &str) -> Vec<crate::board::BenchedLine> {
        match self.now {
            Some(now) => {
                crate::pacing::benched(self.board.room(room), self.config(room, None), now)
            }
            None => Vec::new(),
        }
    }

    /// When a live task turn's attempt is overdue (its task's `[due ...]`).
    fn attempt_due(&self, t: &LiveTurn) -> Option<Timestamp> {
        let LiveWork::Task { task } = &t.work else {
            return None;
        };
        let task = self.dag.task(&t.room, task)?;
        // Only the attempt this turn runs: a re-taken claim is another attempt.
        if task.epoch != Some(t.exclusive.epoch) {
            return None;
        }
        crate::pacing::attempt_due(task)
    }

    /// Cancels every live task turn whose attempt is past its deadline; the turn's end
    /// fails the attempt with an `overdue` reason (and a notice to the owner), and the
    /// task follows its retry policy.
    fn cancel_overdue(&mut self, now: Timestamp, out: &mut Vec<Intent>) {
        let overdue: Vec<(TurnId, String)> = self
            .turns
            .iter()
            .filter(|(_, t)| t.stopped.is_none() && !t.cancel_sent && !t.lost)
            .filter_map(|(id, t)| {
                self.attempt_due(t).filter(|d| now >= *d)?;
                let LiveWork::Task { task } = &t.work else {
                    return None;
                };
                let ms = self
                    .dag
                    .task(&t.room, task)
                    .and_then(|x| x.due_ms)
                    .unwrap_or(0);
                Some((
                    id.clone(),
                    format!(
                        "overdue: attempt not finished within its deadline ({} from its claim)",
                        crate::config::format_duration(ms)
                    ),
                ))
            })
            .collect();
        for (id, why) in overdue {
            if let Some(t) = self.turns.get_mut(&id) {
                t.stopped = Some(why);
                t.overdue = true;
                t.cancel_sent = true;
                out.push(Intent::Cancel { turn: id });
            }
        }
    }

    /// How long to leave a claim found held at `epoch` alone: until its lease lapses,
    /// unless that epoch's attempt already failed in the ledger (its holder is
    /// releasing it), then only a moment.
    fn back_off_until(&self, key: &str, epoch: ClaimEpoch, expires_at: Timestamp) -> Timestamp {
        match (self.returned.get(key), self.now) {
            (Some((_, failed_epoch, _)), Some(now)) if *failed_epoch >= epoch => {
                expires_at.min(now.saturating_add(RELEASE_BACK_OFF_US))
            }
            _ => expires_at,
        }
    }

    fn held_elsewhere(&self, key: &str, now: Timestamp) -> bool {
        self.closed.contains(key)
            || self
                .held_elsewhere
                .get(key)
                .is_some_and(|until| *until > now)
    }

    /// Whether a message is taken by a designation that no failure voided.
    fn is_taken(&self, room: &str, id: &InteractionId, m: &OpenMessage) -> bool {
        match self.board.designation(room, id) {
            Some(d) => m.failed_upto.is_none_or(|f| d.epoch > f),
            None => false,
        }
    }

    /// For each free eligible local agent: when it may contend for the message.
    fn reply_dues(&self, room: &str, m: &OpenMessage) -> Vec<(Timestamp, String)> {
        let config = self.config(room, m.thread.as_deref());
        let everyone: Vec<(String, u32)> = match &m.eligible {
            Eligible::Everyone { .. } => self
                .known_agents(room)
                .into_iter()
                .filter(|a| m.eligible.contains(a))
                .map(|a| {
                    let p = self.priority_of(room, &a);
                    (a, p)
                })
                .collect(),
            Eligible::Agents(list) => list
                .iter()
                .map(|a| (a.clone(), self.priority_of(room, a)))
                .collect(),
        };
        let candidates: Vec<ResponderCandidate<'_>> = everyone
            .iter()
            .filter(|(a, _)| !m.failed.contains(a))
            .map(|(a, p)| ResponderCandidate {
                agent: a,
                priority: *p,
            })
            .collect();
        // A broadcast in a watched thread goes to its watchers first: they contend at
        // once, the others one responder window later.
        let watchers: Vec<&String> = match (&m.eligible, &m.thread) {
            (Eligible::Everyone { .. }, Some(t)) => self
                .watchers
                .get(&(room.to_string(), t.clone()))
                .map(|w| {
                    w.iter()
                        .filter(|a| candidates.iter().any(|c| c.agent == a.as_str()))
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        self.agents
            .keys()
            .filter(|a| {
                m.eligible.contains(a)
                    && !m.failed.contains(*a)
                    && !self.busy(a)
                    && !self.benched(room, a)
            })
            .map(|a| {
                let delay = if watchers.is_empty() {
                    responder_delay_ms(config, a, &candidates)
                } else if watchers.contains(&a) {
                    0
                } else {
                    config.responder_window_ms
                };
                (m.at.saturating_add(ms_to_us(delay)), a.clone())
            })
            .collect()
    }

    fn priority_of(&self, room: &str, agent: &str) -> u32 {
        if let Some(a) = self.agents.get(agent) {
            return a.priority;
        }
        self.board
            .room(room)
            .and_then(|b| b.agents.get(agent))
            .map_or(DEFAULT_PRIORITY, |p| p.priority)
    }

    fn ttl(&self, room: &str) -> Duration {
        Duration::from_millis(self.config(room, None).claim_ttl_ms.max(1))
    }

    fn acquire(
        &mut self,
        key: String,
        holder: String,
        purpose: ClaimPurpose,
        out: &mut Vec<Intent>,
    ) {
        self.acquire_with(key, holder, purpose, (None, None, None), out);
    }

    /// Acquires a task claim for `agent`, driven by this relay (plan 0094: the claim's
    /// driver elects the relay that runs the turn, so one claim is taken a task
    /// turn). For a task no claim of this generation was ever accepted for (`fresh`,
    /// from the ready frontier), the store call also writes its `task.claimed` and
    /// `turn.prompted` when the claim is won at the first epoch (plan 0058): the
    /// hand-off is one round trip. Otherwise they are appended once it is won.
    fn acquire_task(
        &mut self,
        room: &str,
        task: &str,
        agent: String,
        fresh: bool,
        out: &mut Vec<Intent>,
    ) {
        let generation = self.generation(room, task);
        let key = task_key_at(room, task, generation);
        let write = self
            .dag
            .task(room, task)
            .filter(|t| {
                fresh
                    && t.status == TaskStatus::Open
                    && t.epoch.is_none()
                    && t.uses.is_empty()
                    && t.attempts < t.max_attempts
            })
            .cloned()
            .map(|t| {
                let first = ClaimEpoch::FIRST;
                let rows = self.claim_rows(room, &t, &agent, (first, first), t.next_attempt());
                let compact = self.config(room, None).compact_turns;
                self.prewrite_rejections.insert(key.clone(), rows.rejected);
                let (mut batch, prompted) = claim_and_start(rows.claimed, rows.prompted, compact);
                batch.extend(prompted);
                WriteIfWon {
                    epoch: first,
                    then_epoch: None,
                    batch,
                }
            });
        let purpose = ClaimPurpose::Task {
            room: room.to_string(),
            task: task.to_string(),
            agent: agent.clone(),
            generation,
        };
        let driver = Some(self.relay.clone());
        self.acquire_with(key, agent, purpose, (driver, None, write), out);
    }

    /// The rows that record a claim of `t` by `agent` at `(task_epoch, drive_epoch)`
    /// starting `attempt`: `task.claimed` and a `task.rejected` for every losing bidder
    /// not told yet, and the turn's `turn.prompted`; with the turn's id and subject.
    fn claim_rows(
        &self,
        room: &str,
        t: &crate::tasks::Task,
        agent: &str,
        (task_epoch, drive_epoch): (ClaimEpoch, ClaimEpoch),
        attempt: u32,
    ) -> ClaimRows {
        let task = &t.id;
        let generation = t.generation;
        let claimed = TaskClaimedBody {
            task: task.clone(),
            epoch: task_epoch,
            attempt,
            generation,
        };
        let mut rows = vec![NewInteraction::new(
            room,
            Verb::TaskClaimed,
            agent,
            Role::Agent,
            claimed.to_body(),
        )];
        let mut rejected = Vec::new();
        for loser in losing_bidders(t, agent) {
            let k = (room.to_string(), task.clone(), attempt, loser.to_string());
            if !self.rejections_sent.contains(&k) {
                rows.push(rejection(room, agent, task, attempt, loser));
                rejected.push(k);
            }
        }
        // A retried task's epochs start again under its fresh keys: its generation
        // keeps turn ids apart.
        let turn = TurnId(if generation == 0 {
            format!("t/{room}/{task}/{agent}/{task_epoch}.{drive_epoch}")
        } else {
            format!("t/{room}/{task}/{agent}/{task_epoch}.{drive_epoch}.g{generation}")
        });
        let subject = Subject::task(task.clone(), Some(truncate_text(&t.label, 200)));
        let prompted = TurnPromptedBody {
            turn: turn.0.clone(),
            subject: subject.clone(),
            epoch: task_epoch,
            drive_epoch,
        };
        let prompted = NewInteraction::new(
            room,
            Verb::TurnPrompted,
            agent,
            Role::Agent,
            serde_json::to_value(&prompted).unwrap_or_default(),
        );
        ClaimRows {
            claimed: rows,
            rejected,
            prompted,
            turn,
            subject,
        }
    }

    /// Asks for claim `key` for `holder` (for `driver`, when it drives the turn), with
    /// an acquire chained after it and rows written with it, when given.
    fn acquire_with(
        &mut self,
        key: String,
        holder: String,
        purpose: ClaimPurpose,
        (driver, then, write): (Option<String>, Option<ChainedAcquire>, Option<WriteIfWon>),
        out: &mut Vec<Intent>,
    ) {
        let ttl = self.ttl(purpose.room());
        self.claims.insert(
            key.clone(),
            Slot {
                holder: holder.clone(),
                purpose: purpose.clone(),
                epoch: None,
            },
        );
        out.push(Intent::Acquire {
            key,
            holder,
            driver,
            ttl,
            purpose,
            then,
            write,
        });
    }

    /// The decisions that follow from the folded state at `now`.
    fn pass(&mut self, out: &mut Vec<Intent>) {
        if self.shutting_down || !self.caught_up {
            return;
        }
        let Some(now) = self.now else {
            return;
        };
        self.register(out);
        self.notify_owners(out);
        self.cancel_overdue(now, out);
        let config = |r: &str| {
            self.configs
                .get(&(r.to_string(), None))
                .unwrap_or(&self.default_config)
        };
        let dag = &self.dag;
        self.backing_off.retain(|(room, task)| {
            dag.task(room, task)
                .is_some_and(|t| crate::pacing::backing_off(config(room), room, t, now))
        });
        // Re-takes first: those tasks and messages have waited longest.
        self.retake_replies(now, out);
        self.elect_replies(now, out);
        let retakes = self.retake_tasks(now, out);
        let reviews = self.schedule_reviews(now, out);
        self.schedule_tasks(now, retakes + reviews, out);
        // Notices queued by this pass and by the rows just folded.
        self.write_notices(out);
        self.note_settled(out);
        self.write_stuck(out);
    }

    /// A room whose tasks or turns moved and that is now quiescent (nothing ready,
    /// claimed or running, nothing in flight here) gets one `room.settled` with its
    /// task counts, unless the last one already says exactly that.
    fn note_settled(&mut self, out: &mut Vec<Intent>) {
        let Some(now) = self.now else {
            return;
        };
        if self.next_settle_check.is_some_and(|at| now < at)
            || (self.unsettled.is_empty() && self.needs_watch.is_empty())
        {
            return;
        }
        self.next_settle_check = Some(now.saturating_add(SETTLE_CHECK_US));
        if !self.needs_watch.is_empty() {
            self.note_unstaffed(now);
        }
        if self.unsettled.is_empty() {
            return;
        }
        let rooms: Vec<String> = self.unsettled.iter().cloned().collect();
        let mut batch = Vec::new();
        for room in rooms {
            // Cheap checks first: while work runs here the room is not settled.
            if self.turns.values().any(|t| t.room == room)
                || self.claims.values().any(|s| s.purpose.room() == room)
            {
                continue;
            }
            self.unsettled.remove(&room);
            if !self.is_quiescent(&room) {
                continue;
            }
            let s = self.dag.summary(&room);
            let body = crate::protocol::RoomSettledBody {
                total: s.total,
                done: s.done,
                abandoned: s.abandoned,
                blocked: s.blocked,
            };
            if s.total == 0 || self.settled.get(&room) == Some(&body) {
                continue;
            }
            self.settled.insert(room.clone(), body);
            batch.push(NewInteraction::new(
                room.as_str(),
                Verb::RoomSettled,
                crate::protocol::SYSTEM_ACTOR,
                Role::System,
                serde_json::to_value(body).unwrap_or_default(),
            ));
        }
        if !batch.is_empty() {
            out.push(Intent::Append {
                fences: Vec::new(),
                close: false,
                batch,
            });
        }
    }

    /// Queues the notice to a message's author that it will not be answered, and why
    /// (written at the next pass). Its content is the same on every relay, so the
    /// ledger keeps one; once folded it gives the message up everywhere.
    fn notice_unanswered(
        &mut self,
        room: &str,
        thread: Option<String>,
        message: InteractionId,
        why: &(Option<String>, String),
    ) {
        let mut body = serde_json::json!({ "text": why.1, "unanswered": message.to_hex() });
        if let Some(agent) = &why.0 {
            body["agent"] = serde_json::Value::from(agent.as_str());
        }
        let mut row = NewInteraction::new(
            room,
            Verb::MessagePosted,
            crate::protocol::SYSTEM_ACTOR,
            Role::System,
            body,
        )
        .with_parent(message);
        row.thread = thread;
        let id = row.id();
        if !self.notices_done.0.contains(&id) {
            self.pending_notices.insert(id, row);
        }
    }

    fn notice_done(&mut self, id: InteractionId) {
        let (set, order) = &mut self.notices_done;
        if set.insert(id) {
            order.push_back(id);
        }
        while order.len() > REMEMBERED_NOTICES {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
    }

    fn write_notices(&mut self, out: &mut Vec<Intent>) {
        if self.pending_notices.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending_notices);
        for id in pending.keys() {
            self.notice_done(*id);
        }
        let batch: Vec<NewInteraction> = pending.into_values().collect();
        out.push(Intent::Append {
            fences: Vec::new(),
            close: false,
            batch,
        });
    }

    fn register(&mut self, out: &mut Vec<Intent>) {
        if self.registered {
            return;
        }
        self.registered = true;
        let mut batch = Vec::new();
        for room in &self.rooms {
            for a in self.agents.values() {
                let body = AgentRegisteredBody {
                    capabilities: a.capabilities.clone(),
                    priority: Some(a.priority),
                };
                batch.push(NewInteraction::new(
                    room.as_str(),
                    Verb::AgentRegistered,
                    a.key.as_str(),
                    Role::Agent,
                    serde_json::to_value(&body).unwrap_or_default(),
                ));
            }
        }
        if !batch.is_empty() {
            out.push(Intent::Append {
                fences: Vec::new(),
                close: false,
                batch,
            });
        }
    }

    fn notify_owners(&mut self, out: &mut Vec<Intent>) {
        let mut batch = Vec::new();
        for room in &self.rooms {
            for t in self.dag.notices_due(room) {
                if self.notices_sent.insert((room.clone(), t.id.clone())) {
                    if let Some(n) = self.dag.abandon_notice(room, &t.id) {
                        batch.push(n);
                    }
                }
            }
        }
        if !batch.is_empty() {
            out.push(Intent::Append {
                fences: Vec::new(),
                close: false,
                batch,
            });
        }
    }

    fn elect_replies(&mut self, now: Timestamp, out: &mut Vec<Intent>) {
        let keys: Vec<(String, InteractionId)> = self.messages.keys().cloned().collect();
        for (room, id) in keys {
            let Some(m) = self.messages.get(&(room.clone(), id)) else {
                continue;
            };
            let horizon_ms = self.config(&room, m.thread.as_deref()).reply_horizon_ms;
            if now.micros_since(m.at) > ms_to_us(horizon_ms) {
                // A turn still running on it (here or anywhere) may yet answer: wait
                // for it to end before giving the message up.
                let running = self.turns.values().any(|t| {
                    t.room == room
                        && matches!(&t.work, LiveWork::Reply { message, .. } if *message == id)
                }) || self.board.room(&room).is_some_and(|b| {
                    b.turns
                        .get(&Subject::message(id).key())
                        .is_some_and(|t| t.is_open())
                });
                if running {
                    continue;
                }
                let why = if m.each {
                    format!(
                        "Not every agent this message names answered it within the reply \
                         horizon ({}); it is no longer offered to them.",
                        crate::config::format_duration(horizon_ms)
                    )
                } else {
                    format!(
                        "Nobody answered this message within the reply horizon ({}); it is \
                         no longer offered to agents.",
                        crate::config::format_duration(horizon_ms)
                    )
                };
                let thread = m.thread.clone();
                self.messages.remove(&(room.clone(), id));
                self.notice_unanswered(&room, thread, id, &(None, why));
                continue;
            }
            if m.each {
                self.elect_each(now, &room, id, out);
                continue;
            }
            let key = reply_key(&room, &id);
            if self.claims.contains_key(&key)
                || self.held_elsewhere(&key, now)
                || self.is_taken(&room, &id, m)
            {
                continue;
            }
            let best = self
                .reply_dues(&room, m)
                .into_iter()
                .filter(|(due, _)| *due <= now)
                .min();
            if let Some((_, agent)) = best {
                let purpose = ClaimPurpose::Reply {
                    room: room.clone(),
                    thread: m.thread.clone(),
                    message: id,
                    agent: agent.clone(),
                    each: false,
                };
                self.acquire(key, agent, purpose, out);
            }
        }
    }

    /// A message naming several agents: every free local named agent that still owes
    /// its answer contends for its own reply claim, at once (the part is nobody
    /// else's, so no responder policy orders them).
    fn elect_each(&mut self, now: Timestamp, room: &str, id: InteractionId, out: &mut Vec<Intent>) {
        let Some(m) = self.messages.get(&(room.to_string(), id)) else {
            return;
        };
        let thread = m.thread.clone();
        let owing: Vec<String> = self
            .agents
            .keys()
            .filter(|a| m.owed_by(a) && !self.busy(a) && !self.benched(room, a))
            .filter(|a| {
                let key = directed_reply_key(room, &id, a);
                !self.claims.contains_key(&key) && !self.held_elsewhere(&key, now)
            })
            .cloned()
            .collect();
        for agent in owing {
            let purpose = ClaimPurpose::Reply {
                room: room.to_string(),
                thread: thread.clone(),
                message: id,
                agent: agent.clone(),
                each: true,
            };
            self.acquire(directed_reply_key(room, &id, &agent), agent, purpose, out);
        }
    }

    /// Whether `agent` has a bid out that has not been settled (the task is still
    /// waiting for that attempt's claim), other than for `except`.
    fn outstanding_bid(&self, agent: &str, except: Option<(&str, &str)>) -> bool {
        self.bids_sent.iter().any(|(room, task, attempt, a)| {
            a == agent
                && except != Some((room.as_str(), task.as_str()))
                && self
                    .dag
                    .task(room, task)
                    .is_some_and(|t| t.next_attempt() == *attempt)
                && self.dag.is_ready(room, task)
        })
    }

    fn schedule_tasks(&mut self, now: Timestamp, already: usize, out: &mut Vec<Intent>) {
        self.coverage_wanted = None;
        let cap = self.options.max_wakes_per_pass;
        let mut wakes = already;
        let rooms: Vec<String> = self.rooms.iter().cloned().collect();
        let mut busy = self.busy_flags();
        for room in rooms {
            let config = self.config(&room, None).clone();
            // A spent room budget stops new task claims (turns already running finish).
            if !self.budget.budget_allows_new_claims(&room, config.budget) {
                if let (Some(budget), true) = (config.budget, self.dag.frontier_len(&room) > 0) {
                    let text = format!(
                        "the room's token budget of {budget} tokens is spent: ready tasks are \
                         not claimed until the owner raises it (`!config budget N` or \
                         `!config budget unlimited`)."
                    );
                    self.queue_stuck(&room, NoticeBody::BUDGET_SPENT, None, text);
                }
                continue;
            }
            // With more ready tasks than free local agents, walk the frontier in this
            // relay's own order, so relays spread over different tasks instead of all
            // contending for the first ones; otherwise in the fold's frontier order.
            // Either way the walk reads the indexes and stops as soon as every free
            // agent has something or the pass's cap is reached.
            // The free local agents, kept as the walk hands tasks out: the walk stops
            // when none is left, and picks among them only (not every agent per task).
            let mut free: Vec<(usize, &LocalAgent, bool)> = self
                .agents
                .values()
                .enumerate()
                .filter(|(i, _)| !busy[*i])
                .map(|(i, a)| (i, a, false))
                .collect();
            // After every free agent (never ahead of one): agents at work on one task
            // turn of this room, with no claim in flight, may take their next tasks up
            // to the room's lease depth (plans 0084, 0085), one entry a task, flagged,
            // in rounds (every such agent's first task ahead before anyone's second).
            if config.lease_ahead {
                let room_for = self.ahead_room(&room, config.lease_depth as usize);
                let deepest = room_for.iter().copied().max().unwrap_or(0);
                for round in 0..deepest {
                    free.extend(
                        self.agents
                            .values()
                            .enumerate()
                            .filter(|(i, _)| room_for[*i] > round)
                            .map(|(i, a)| (i, a, true)),
                    );
                }
            }
            let spreading = self.dag.frontier_len(&room) > free.len();
            let order: Box<dyn Iterator<Item = &str> + '_> = if spreading {
                Box::new(
                    self.walk
                        .get(&room)
                        .into_iter()
                        .flatten()
                        .map(|(_, _, id)| id.as_str()),
                )
            } else {
                Box::new(self.dag.frontier(&room).map(|t| t.id.as_str()))
            };
            let grace_us = (config.responder_window_ms as i64).saturating_mul(1000);
            let mut bidding: Vec<String> = Vec::new();
            let mut chosen: Vec<(String, String)> = Vec::new();
            let mut capped = false;
            // The room's resource holdings as the ledger shows them, built once per
            // pass, when a task that uses resources first asks.
            let mut holdings: Option<Vec<crate::resources::Holding>> = None;
            for id in order {
                if wakes >= cap {
                    capped = true;
                    break;
                }
                if free.is_empty() {
                    // Nobody here can take anything: the rest of the frontier is
                    // only for bids (none from busy agents either).
                    break;
                }
                let key = self.tkey(&room, id);
                if self.task_busy(&key)
                    || self.held_elsewhere(&key, now)
                    || self.ended_here(&room, id, &key)
                {
                    continue;
                }
                let (Some(task), Some(since)) =
                    (self.dag.task(&room, id), self.dag.ready_since(&room, id))
                else {
                    continue;
                };
                // A given-back task waits out its back-off, on every relay alike.
                if crate::pacing::backing_off(&config, &room, task, now) {
                    continue;
                }
                let right = claim_right(&config, task, since, now);
                if let ClaimRight::Bidding { .. } = right {
                    bidding.push(id.to_string());
                    continue;
                }
                // A closed bid window is decided on a view that holds every bid placed
                // in it: a lagging read must not mistake "not read yet" for "no bids".
                if let Some(closed) = bids_decide_until(&config, since) {
                    if self.covered.is_none_or(|c| c < closed) {
                        self.coverage_wanted =
                            Some(self.coverage_wanted.map_or(closed, |w| w.min(closed)));
                        continue;
                    }
                }
                // The agent whose attempt just failed waits one responder window,
                // so an idle agent elsewhere gets the retry first; alone, it retries.
                let benched = self
                    .returned
                    .get(&key)
                    .filter(|(_, _, at)| now < at.saturating_add(grace_us))
                    .map(|(agent, _, _)| agent.as_str());
                let live: &[crate::resources::Holding] = if task.uses.is_empty() {
                    &[]
                } else {
                    holdings.get_or_insert_with(|| self.live_holdings(&room, now))
                };
                let pick = free.iter().position(|(_, a, ahead)| {
                    right.allows(&a.key, &a.capabilities, task)
                        && (task.uses.is_empty() || !*ahead)
                        && crate::resources::blockers(&a.key, &task.uses, live).is_empty()
                        && !self.outstanding_bid(&a.key, Some((&room, id)))
                        && benched != Some(a.key.as_str())
                        && !self.benched(&room, &a.key)
                });
                if let Some(i) = pick {
                    let (at, a, ahead) = free.remove(i);
                    busy[at] = true;
                    chosen.push((id.to_string(), a.key.clone()));
                    // Tasks taken ahead are bounded by the agents and the lease depth,
                    // not by the pass's cap (plan 0085).
                    if !ahead {
                        wakes += 1;
                    }
                }
            }
            for (id, agent) in chosen {
                self.acquire_task(&room, &id, agent, true, out);
            }
            if capped {
                return;
            }
            if bidding.is_empty() || !bids_on_sight(&config) {
                continue;
            }
            // Each free agent with no bid out bids on one open window: the one that
            // hashes lowest with its key, so agents on different relays spread out.
            let agents: Vec<LocalAgent> = self.agents.values().cloned().collect();
            for (i, a) in agents.into_iter().enumerate() {
                if wakes >= cap {
                    return;
                }
                if busy[i] || self.outstanding_bid(&a.key, None) || self.benched(&room, &a.key) {
                    continue;
                }
                let pick = bidding
                    .iter()
                    .filter_map(|id| self.dag.task(&room, id))
                    .filter(|t| {
                        capable(&t.needs, &a.capabilities)
                            && !self.bids_sent.contains(&(
                                room.clone(),
                                t.id.clone(),
                                t.next_attempt(),
                                a.key.clone(),
                            ))
                            && !t.bids.contains_key(&a.key)
                    })
                    .min_by_key(|t| spread(&a.key, &room, &t.id));
                let Some(t) = pick else {
                    continue;
                };
                let attempt = t.next_attempt();
                let body = TaskBidBody {
                    task: t.id.clone(),
                    attempt,
                    capabilities: a.capabilities.clone(),
                    load: self.load_of(&a.key),
                    decline: false,
                };
                let id = t.id.clone();
                out.push(Intent::Append {
                    fences: Vec::new(),
                    close: false,
                    batch: vec![NewInteraction::new(
                        room.as_str(),
                        Verb::TaskBid,
                        a.key.as_str(),
                        Role::Agent,
                        body.to_body(),
                    )],
                });
                self.bids_sent
                    .insert((room.clone(), id, attempt, a.key.clone()));
                wakes += 1;
            }
        }
    }

    /// An agent's declared load: turns it runs here plus tasks the ledger says it holds
    /// (but whose turn has not already ended here).
    fn load_of(&self, agent: &str) -> u32 {
        let turns = self.turns.values().filter(|t| t.agent == agent).count();
        let held: usize = self
            .rooms
            .iter()
            .map(|r| {
                self.dag
                    .claimed(r)
                    .iter()
                    .filter(|t| t.owner.as_deref() == Some(agent))
                    .filter(|t| {
                        !t.epoch.is_some_and(|e| {
                            self.finished
                                .contains(&task_key_at(r, &t.id, t.generation), e)
                        })
                    })
                    .count()
            })
            .sum();
        u32::try_from(turns + held).unwrap_or(u32::MAX)
    }

    // -----------------------------------------------------------------------------
    // Reconcile
    // -----------------------------------------------------------------------------

    /// Time between reconcile passes: the shortest claim TTL of the rooms, over four.
    fn reconcile_interval_ms(&self) -> u64 {
        self.rooms
            .iter()
            .map(|r| self.config(r, None).claim_ttl_ms / 4)
            .min()
            .unwrap_or(self.default_config.claim_ttl_ms / 4)
            .max(1)
    }

    fn reconcile(&mut self, now: Timestamp, out: &mut Vec<Intent>) {
        let interval = self.reconcile_interval_ms();
        self.next_reconcile = Some(now.saturating_add(ms_to_us(interval)));
        // Renew only the claims of turns that are alive, or held ahead (plan 0084).
        for t in self
            .turns
            .values()
            .chain(self.ahead.values().flatten().map(|p| &p.live))
        {
            if t.lost {
                continue;
            }
            let ttl = Duration::from_millis(self.config(&t.room, None).claim_ttl_ms.max(1));
            for c in t.claims().iter().chain(&t.uses) {
                out.push(Intent::Renew {
                    key: c.key.clone(),
                    holder: c.holder.clone(),
                    epoch: c.epoch,
                    ttl,
                });
            }
        }
        self.held_elsewhere.retain(|_, until| *until > now);
        // A failure whose row never came back (its write was refused) is forgotten
        // after a lease.
        let lease_us = ms_to_us(self.default_config.claim_ttl_ms.max(interval * 4));
        self.unfolded_failures.retain(|_, turns| {
            turns.retain(|_, at| now.micros_since(*at) < lease_us);
            !turns.is_empty()
        });
        let dag = &self.dag;
        self.rejections_sent.retain(|(room, task, attempt, _)| {
            dag.task(room, task)
                .is_some_and(|t| t.status == TaskStatus::Claimed && t.attempts == *attempt)
        });
        // Kept until the fold shows the turn's outcome, not merely until it stops
        // showing the claim: it may not have read the claim yet.
        self.finished
            .retain(|key, epoch| !outcome_read(dag, key, epoch));
        self.bids_sent.retain(|(room, task, attempt, _)| {
            dag.task(room, task)
                .is_some_and(|t| t.next_attempt() == *attempt && t.status == TaskStatus::Open)
        });
        self.reviews_finished
            .retain(|key| still_in_review(dag, key));
        let finished = &self.finished;
        let reviews_finished = &self.reviews_finished;
        self.unconfirmed.retain(|u| match &u.undo {
            Undo::Task { key, epoch } => finished.contains(key, *epoch),
            Undo::Review { key } => reviews_finished.contains(key),
            Undo::Reply { .. } => true,
        });
        // Re-takes and bid-window closes happen in the pass that follows every event.
    }

    /// Claimed tasks no local turn runs: try to take them; the store grants the claim
    /// only once the owner's lease lapsed (or to the owner itself). A refusal backs
    /// the key off until the holder's lease would lapse, so each claimed task is
    /// probed about once per lease. Returns how many acquisitions it started.
    fn retake_tasks(&mut self, now: Timestamp, out: &mut Vec<Intent>) -> usize {
        let cap = self.options.max_wakes_per_pass;
        let mut wakes = 0usize;
        let rooms: Vec<String> = self.rooms.iter().cloned().collect();
        for room in rooms {
            let config = self.config(&room, None).clone();
            let ttl_us = ms_to_us(config.claim_ttl_ms.max(1));
            // The cheap refusals first, before a task is looked up: another relay's
            // claim younger than a lease (see below) is not even visited — the room
            // index files claims by owner and by claim time (plan 0089) — and a task
            // whose turn runs or is held ahead here (its claims held: plans 0084,
            // 0085) is not probed. (With deep lease-ahead most of the claimed set is
            // held somewhere; a pass runs after every event.)
            let running: std::collections::HashSet<&str> = self
                .turns
                .values()
                .chain(self.ahead.values().flatten().map(|p| &p.live))
                .filter(|lt| lt.room == room)
                .filter_map(|lt| match &lt.work {
                    LiveWork::Task { task } => Some(task.as_str()),
                    _ => None,
                })
                .collect();
            // Then the checks that need the claim key, still before copying anything
            // of the task: a claim in flight or held here, our own turn under this
            // very lease just ended (its completion or failure is on its way into the
            // fold), another relay's live claim.
            let claimed: Vec<(String, Option<String>)> = self
                .dag
                .claimed_for_retake(
                    &room,
                    now,
                    ttl_us,
                    self.agents.keys().map(String::as_str),
                    |id| running.contains(id),
                )
                .into_iter()
                .filter(|t| {
                    let remote = t
                        .owner
                        .as_ref()
                        .is_some_and(|o| !self.agents.contains_key(o));
                    !(remote
                        && t.claimed_at
                            .is_some_and(|at| now < at.saturating_add(ttl_us)))
                })
                .filter_map(|t| {
                    let key = task_key_at(&room, &t.id, t.generation);
                    let skip = self.task_busy(&key)
                        || self.ended_here(&room, &t.id, &key)
                        || self.held_elsewhere(&key, now);
                    (!skip).then(|| (t.id.clone(), t.owner.clone()))
                })
                .collect();
            drop(running);
            for (id, owner) in claimed {
                let Some(task) = self.dag.task(&room, &id) else {
                    continue;
                };
                let remote_owner = owner.as_ref().is_some_and(|o| !self.agents.contains_key(o));
                if remote_owner
                    && task
                        .claimed_at
                        .is_some_and(|at| now < at.saturating_add(ttl_us))
                {
                    // Another relay's agent took it less than a lease ago: its lease
                    // cannot have lapsed yet (it was acquired before the claim row
                    // was written), so a probe now could only be refused. The first
                    // probe waits for the lease to be able to lapse; a pass follows
                    // within a reconcile tick. (A local owner's own claim is probed at
                    // once: the store grants it to the same holder, which is how a
                    // restarted relay resumes.)
                    continue;
                }
                let right = retake_right(&config, task);
                let owner_here = owner
                    .filter(|o| {
                        self.agents.contains_key(o) && !self.busy(o) && !self.benched(&room, o)
                    })
                    .filter(|o| {
                        self.agents
                            .get(o)
                            .is_some_and(|a| right.allows(&a.key, &a.capabilities, task))
                    });
                let chosen = owner_here.or_else(|| {
                    self.agents
                        .values()
                        .find(|a| {
                            right.allows(&a.key, &a.capabilities, task)
                                && !self.busy(&a.key)
                                && !self.benched(&room, &a.key)
                        })
                        .map(|a| a.key.clone())
                });
                if let Some(agent) = chosen {
                    if wakes >= cap {
                        return wakes;
                    }
                    self.acquire_task(&room, &id, agent, false, out);
                    wakes += 1;
                }
            }
        }
        wakes
    }

    /// Submitted tasks whose reviewer this relay hosts, free and not benched: contend
    /// for the review claim with this relay's review drive claim chained after it. The
    /// room index keeps the submitted tasks, so a pass walks only those. A review
    /// claim held elsewhere backs off until its lease would lapse (then it is re-taken
    /// here if its holder died). Returns how many acquisitions it started.
    fn schedule_reviews(&mut self, now: Timestamp, out: &mut Vec<Intent>) -> usize {
        let cap = self.options.max_wakes_per_pass;
        let mut wakes = 0usize;
        // Built when the first review is wanted: most passes have none.
        let mut busy: Option<Vec<bool>> = None;
        let rooms: Vec<String> = self.rooms.iter().cloned().collect();
        for room in rooms {
            let wanted: Vec<(String, u32, String)> = self
                .dag
                .in_review(&room)
                .filter_map(|t| {
                    let reviewer = &t.review.as_ref()?.agent;
                    self.agents
                        .contains_key(reviewer)
                        .then(|| (t.id.clone(), t.generation, reviewer.clone()))
                })
                .collect();
            for (task, generation, reviewer) in wanted {
                if wakes >= cap {
                    return wakes;
                }
                let key = review_key(&room, &task, generation);
                let dkey = reviewdrive_key(&room, &task, generation);
                let busy = busy.get_or_insert_with(|| self.busy_flags());
                // `wanted` holds only reviewers this relay hosts.
                let Some(at) = self.agents.keys().position(|k| *k == reviewer) else {
                    continue;
                };
                if busy[at]
                    || self.benched(&room, &reviewer)
                    || self.claims.contains_key(&key)
                    || self.claims.contains_key(&dkey)
                    || self.held_elsewhere(&key, now)
                    || self.reviews_finished.contains(&key)
                {
                    continue;
                }
                busy[at] = true;
                let then = ChainedAcquire {
                    key: dkey,
                    holder: self.relay.clone(),
                    ttl: self.ttl(&room),
                };
                let purpose = ClaimPurpose::Review {
                    room: room.clone(),
                    task,
                    agent: reviewer.clone(),
                    generation,
                };
                self.acquire_with(key, reviewer, purpose, (None, Some(then), None), out);
                wakes += 1;
            }
        }
        wakes
    }

    /// Messages taken by an agent whose answer never came and that no local turn
    /// runs: contend again; the store grants the reply claim only once it lapsed.
    fn retake_replies(&mut self, now: Timestamp, out: &mut Vec<Intent>) {
        let keys: Vec<(String, InteractionId)> = self.messages.keys().cloned().collect();
        for (room, id) in keys {
            let Some(m) = self.messages.get(&(room.clone(), id)) else {
                continue;
            };
            if m.each || !self.is_taken(&room, &id, m) {
                continue;
            }
            let running = self.turns.values().any(|lt| {
                lt.room == room
                    && matches!(&lt.work, LiveWork::Reply { message, .. } if *message == id)
            });
            let key = reply_key(&room, &id);
            if running || self.claims.contains_key(&key) || self.held_elsewhere(&key, now) {
                continue;
            }
            let designated = self.board.designation(&room, &id).map(|d| d.agent.clone());
            let free = |a: &str| {
                self.agents.contains_key(a)
                    && m.eligible.contains(a)
                    && !m.failed.contains(a)
                    && !self.busy(a)
            };
            let chosen = designated
                .filter(|d| free(d))
                .or_else(|| self.agents.keys().find(|a| free(a)).cloned());
            if let Some(agent) = chosen {
                let purpose = ClaimPurpose::Reply {
                    room: room.clone(),
                    thread: m.thread.clone(),
                    message: id,
                    agent: agent.clone(),
                    each: false,
                };
                self.acquire(key, agent, purpose, out);
            }
        }
    }

    // -----------------------------------------------------------------------------
    // Claim outcomes
    // -----------------------------------------------------------------------------

    fn forget(&mut self, key: &str) {
        self.claims.remove(key);
    }

    /// Forgets `key` only if this relay holds it at `epoch` (a newer acquisition of
    /// the same key is left alone).
    fn forget_at(&mut self, key: &str, epoch: ClaimEpoch) {
        if self.held_at(key, epoch) {
            self.claims.remove(key);
        }
    }

    fn held_at(&self, key: &str, epoch: ClaimEpoch) -> bool {
        self.claims.get(key).is_some_and(|s| s.epoch == Some(epoch))
    }

    fn on_claim_result(&mut self, r: ClaimOutcome, out: &mut Vec<Intent>) {
        let Some(slot) = self.claims.get(&r.key) else {
            return;
        };
        if slot.holder != r.holder || slot.epoch.is_some() {
            return;
        }
        let purpose = slot.purpose.clone();
        if let ClaimPurpose::Task { .. } = purpose {
            // The hand-off's rejections are sent if its rows were written.
            if let Some(sent) = self.prewrite_rejections.remove(&r.key) {
                if r.written {
                    self.rejections_sent.extend(sent);
                }
            }
        }
        if r.answer == ClaimAnswer::Closed {
            // Finished work: whatever this relay's view says, it never runs again.
            // A closed drive claim closes the exclusive one it was for as well.
            self.forget(&r.key);
            self.closed.insert(r.key.clone());
            if matches!(
                purpose,
                ClaimPurpose::DriveReply { .. } | ClaimPurpose::DriveReview { .. }
            ) {
                let k = purpose.exclusive_key();
                self.forget(&k);
                self.closed.insert(k);
            }
            return;
        }
        let won = r.answer.won().filter(|_| !self.shutting_down);
        let Some(epoch) = won else {
            // Lost (or no longer wanted): back off until the holder's lease would lapse.
            // A won claim is simply left to lapse: it may be shared with another relay
            // hosting the same agent, so it is never released blindly.
            // A lost drive claim means another relay drives this agent's turn: the
            // exclusive claim backs off as long.
            self.forget(&r.key);
            let exclusive = match &purpose {
                ClaimPurpose::DriveReply { reply_epoch, .. } => {
                    Some((purpose.exclusive_key(), *reply_epoch))
                }
                ClaimPurpose::DriveReview { review_epoch, .. } => {
                    Some((purpose.exclusive_key(), *review_epoch))
                }
                _ => None,
            };
            // Only the exclusive claim this drive was for, not a newer acquisition.
            let exclusive = exclusive
                .filter(|(k, e)| self.held_at(k, *e))
                .map(|(k, _)| k);
            if let Some(k) = &exclusive {
                self.forget(k);
            }
            for k in std::iter::once(r.key.clone()).chain(exclusive) {
                match r.answer {
                    ClaimAnswer::Lost { epoch, expires_at } => {
                        let until = self.back_off_until(&k, epoch, expires_at);
                        self.held_elsewhere.insert(k, until);
                    }
                    // Nobody is known to hold it: no back-off, a later pass retries.
                    ClaimAnswer::Failed => {
                        self.held_elsewhere.remove(&k);
                    }
                    ClaimAnswer::Won { .. } | ClaimAnswer::Closed => {}
                }
            }
            return;
        };
        if let Some(s) = self.claims.get_mut(&r.key) {
            s.epoch = Some(epoch);
        }
        match purpose {
            ClaimPurpose::Reply {
                room,
                thread,
                message,
                agent,
                each,
            } => self.reply_won(room, thread, message, agent, each, epoch, out),
            ClaimPurpose::DriveReply {
                room,
                thread,
                message,
                agent,
                reply_epoch,
                each,
            } => self.drive_reply_won(
                room,
                thread,
                message,
                agent,
                each,
                (reply_epoch, epoch),
                out,
            ),
            ClaimPurpose::Task {
                room,
                task,
                agent,
                generation,
            } => {
                let won_at = self.won_at(&room, r.answer);
                let won = (epoch, r.written, won_at);
                self.task_won(room, (task, generation), agent, won, out)
            }
            ClaimPurpose::Review {
                room,
                task,
                agent,
                generation,
            } => self.review_won(room, (task, generation), agent, r.then, out),
            ClaimPurpose::DriveReview {
                room,
                task,
                agent,
                review_epoch,
                generation,
            } => self.drive_review_won(room, (task, generation), agent, review_epoch, epoch, out),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reply_won(
        &mut self,
        room: String,
        thread: Option<String>,
        message: InteractionId,
        agent: String,
        each: bool,
        epoch: ClaimEpoch,
        out: &mut Vec<Intent>,
    ) {
        let key = reply_key_for(&room, &message, &agent, each);
        let open = self
            .messages
            .get(&(room.clone(), message))
            .is_some_and(|m| !each || m.owed_by(&agent));
        if !open {
            // Answered or given up meanwhile; leave the claim to lapse.
            self.forget(&key);
            return;
        }
        // A designation elects the one answerer; each named agent answers for itself.
        let noted = each
            || self
                .board
                .designation(&room, &message)
                .is_some_and(|d| d.agent == agent && d.epoch == epoch);
        if !noted {
            let note = CoordNoteBody::Designation(DesignationBody {
                message,
                agent: agent.clone(),
                epoch,
            });
            let mut row = NewInteraction::new(
                room.as_str(),
                Verb::CoordNote,
                agent.as_str(),
                Role::Agent,
                note.to_body(),
            )
            .with_parent(message);
            row.thread = thread.clone();
            out.push(Intent::Append {
                fences: vec![ClaimRef {
                    key: key.clone(),
                    holder: agent.clone(),
                    epoch,
                }],
                close: false,
                batch: vec![row],
            });
        }
        let dkey = drive_key(&room, &agent, &message);
        let purpose = ClaimPurpose::DriveReply {
            room,
            thread,
            message,
            agent,
            reply_epoch: epoch,
            each,
        };
        self.acquire(dkey, self.relay.clone(), purpose, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn drive_reply_won(
        &mut self,
        room: String,
        thread: Option<String>,
        message: InteractionId,
        agent: String,
        each: bool,
        (reply_epoch, drive_epoch): (ClaimEpoch, ClaimEpoch),
        out: &mut Vec<Intent>,
    ) {
        let rkey = reply_key_for(&room, &message, &agent, each);
        let dkey = drive_key(&room, &agent, &message);
        let open = self
            .messages
            .get(&(room.clone(), message))
            .filter(|m| !each || m.owed_by(&agent))
            .cloned();
        let Some(m) = open.filter(|_| self.held_at(&rkey, reply_epoch)) else {
            self.forget_at(&rkey, reply_epoch);
            self.forget(&dkey);
            return;
        };
        let turn = TurnId(format!(
            "r/{room}/{}/{agent}/{reply_epoch}.{drive_epoch}",
            message.short()
        ));
        let subject = Subject::message(message);
        let exclusive = ClaimRef {
            key: rkey,
            holder: agent.clone(),
            epoch: reply_epoch,
        };
        let drive = ClaimRef {
            key: dkey,
            holder: self.relay.clone(),
            epoch: drive_epoch,
        };
        let prompted = TurnPromptedBody {
            turn: turn.0.clone(),
            subject: subject.clone(),
            epoch: reply_epoch,
            drive_epoch,
        };
        let mut row = NewInteraction::new(
            room.as_str(),
            Verb::TurnPrompted,
            agent.as_str(),
            Role::Agent,
            serde_json::to_value(&prompted).unwrap_or_default(),
        )
        .with_parent(message);
        row.thread = thread.clone();
        out.push(Intent::Append {
            fences: vec![exclusive.clone(), drive.clone()],
            close: false,
            batch: vec![row],
        });
        let trace = self
            .remembered
            .get(&message)
            .map(|r| r.trace)
            .or(Some(message));
        let work = TurnWork::Reply(MessageBrief {
            trace,
            id: message,
            author: m.author.clone(),
            role: m.role,
            text: m.text.clone(),
        });
        self.start_turn(
            turn,
            agent,
            room,
            thread,
            subject,
            work,
            LiveWork::Reply {
                message,
                next_hops: m.next_hops,
            },
            exclusive,
            drive,
            Vec::new(),
            out,
        );
    }

    /// The time a claim answered `answer` in `room` was won (database time): its
    /// expiry less the room's lease.
    fn won_at(&self, room: &str, answer: ClaimAnswer) -> Option<Timestamp> {
        match answer {
            ClaimAnswer::Won { expires_at, .. } => {
                Some(expires_at.saturating_sub(ms_to_us(self.ttl(room).as_millis() as u64)))
            }
            _ => None,
        }
    }

    /// The task claim was won at `epoch`, with this relay as its driver (plan 0094):
    /// the turn is this relay's to run. `written`: its rows were written with it;
    /// `won_at`: when (database time).
    fn task_won(
        &mut self,
        room: String,
        (task, generation): (String, u32),
        agent: String,
        (epoch, written, won_at): (ClaimEpoch, bool, Option<Timestamp>),
        out: &mut Vec<Intent>,
    ) {
        let key = task_key_at(&room, &task, generation);
        let alive = self.dag.task(&room, &task).is_some_and(|t| {
            matches!(t.status, TaskStatus::Open | TaskStatus::Claimed) && t.generation == generation
        });
        if !alive {
            self.forget(&key);
            return;
        }
        let take = WonTake {
            room,
            task,
            generation,
            agent,
            task_epoch: epoch,
        };
        self.drive_task_won(take, (written, won_at), out);
    }

    fn drive_task_won(
        &mut self,
        take: WonTake,
        (prewritten, won_at): (bool, Option<Timestamp>),
        out: &mut Vec<Intent>,
    ) {
        let (generation, task_epoch) = (take.generation, take.task_epoch);
        let (room, task, agent) = (&take.room, &take.task, &take.agent);
        let tkey = task_key_at(room, task, generation);
        let Some(t) = self
            .dag
            .task(room, task)
            .filter(|t| t.generation == generation && self.held_at(&tkey, task_epoch))
            .cloned()
        else {
            self.drop_uses_won(room, agent, &tkey, task_epoch, out);
            self.forget_at(&tkey, task_epoch);
            return;
        };
        let exclusive = ClaimRef {
            key: tkey.clone(),
            holder: agent.clone(),
            epoch: task_epoch,
        };
        // The task claim is the drive claim too: its driver is this relay.
        let drive = exclusive.clone();
        // Resuming a lease the ledger already records (a restarted relay, or another
        // relay hosting the same agent went away): no new claim to append.
        let resuming =
            t.is_held_by(agent, task_epoch) && !self.finished.contains(&tkey, task_epoch);
        let fresh = !resuming
            && t.epoch.is_none_or(|e| task_epoch > e)
            && (t.status == TaskStatus::Claimed || self.dag.is_ready(room, task));
        if !resuming && !fresh {
            self.drop_uses_won(room, agent, &tkey, task_epoch, out);
            self.forget_at(&tkey, task_epoch);
            return;
        }
        if fresh && !prewritten {
            // Won over an attempt the view may not show the end of: the claim was
            // taken at an epoch other than the one after the view's (an acquisition
            // the view has not read), or over a claim the view shows held. That
            // attempt may have failed and been released just before: its failure,
            // committed before the release, decides the back-off. So the decision
            // waits for a view covering the time the claims were won; in that view
            // an epoch gap left by no row (claims won and let go unused) is only that.
            let settled = t.status == TaskStatus::Open
                && task_epoch == t.epoch.map_or(ClaimEpoch::FIRST, ClaimEpoch::next);
            let wait = won_at.filter(|at| !settled && self.covered.is_none_or(|c| c < *at));
            // A given-back task waits out its back-off, whoever decided to take it
            // and on whatever view: no attempt starts before its retry time.
            let config = self.config(room, None);
            let backing_off = wait.is_none()
                && self
                    .now
                    .is_some_and(|now| crate::pacing::backing_off(config, room, &t, now));
            if wait.is_some() || backing_off {
                match wait {
                    Some(at) => {
                        self.awaiting_view.insert(tkey, (take, at));
                    }
                    None => self.release_unused_take(&tkey, &take, out),
                }
                return;
            }
        }
        // A task with `[uses ...]` takes its resources, all or nothing, before anything
        // is written under its claims: a task that cannot have them uses no attempt.
        let abandoning = fresh && t.status == TaskStatus::Claimed && t.attempts >= t.max_attempts;
        let uses = if t.uses.is_empty() || abandoning {
            Vec::new()
        } else if let Some(held) = self.uses_won.remove(&(tkey.clone(), task_epoch)) {
            held
        } else {
            let ttl = Duration::from_millis(self.config(room, None).claim_ttl_ms.max(1));
            out.push(Intent::AcquireResources {
                room: room.clone(),
                holder: agent.clone(),
                wanted: t.uses.clone(),
                ttl,
                key: tkey.clone(),
                epoch: task_epoch,
            });
            self.pending_uses.insert(tkey, take);
            return;
        };
        let WonTake {
            room, task, agent, ..
        } = take;
        let use_refs: Vec<ClaimRef> = uses
            .iter()
            .map(|h| ClaimRef {
                key: h.key.clone(),
                holder: h.holder.clone(),
                epoch: h.epoch,
            })
            .collect();
        let attempt = if resuming {
            t.attempts
        } else {
            t.next_attempt()
        };
        // Turn ids keep their `<task epoch>.<drive epoch>` form: one claim, one epoch.
        let ClaimRows {
            claimed,
            rejected,
            prompted,
            turn,
            subject,
        } = self.claim_rows(&room, &t, &agent, (task_epoch, task_epoch), attempt);
        let (mut batch, prompted) = if fresh {
            if t.status == TaskStatus::Claimed && t.attempts >= t.max_attempts {
                let batch = claimed.into_iter().take(1).collect();
                // The lapsed attempt was the last: this claim records that the task
                // failed for good (the fold abandons it); nothing is started.
                // It finishes the task: the claims close with it.
                out.push(Intent::Append {
                    fences: vec![exclusive.clone()],
                    close: true,
                    batch,
                });
                out.push(Intent::Release {
                    key: exclusive.key,
                    holder: exclusive.holder,
                    epoch: exclusive.epoch,
                });
                self.forget_at(&tkey, task_epoch);
                return;
            }
            self.rejections_sent.extend(rejected);
            let compact = self.config(&room, None).compact_turns;
            claim_and_start(claimed, prompted, compact)
        } else {
            (Vec::new(), Some(prompted))
        };
        if !uses.is_empty() {
            batch.push(uses_row(
                &room,
                &agent,
                Verb::ResourceAcquired,
                &use_refs,
                Some(&uses),
                Some(format!("task {task}")),
                Duration::from_millis(self.config(&room, None).claim_ttl_ms.max(1)),
            ));
        }
        batch.extend(prompted);
        // A hand-off's rows written with its claims (one round trip) are in the
        // ledger, whether the view has read them (the turn looks resumed) or not:
        // nothing is appended before the turn starts. Nor when a resumed turn's
        // `turn.prompted` is in the view: its rows may be items of a lot (plan 0080),
        // which an identical row would not deduplicate against.
        let recorded = resuming
            && self
                .board
                .room(&room)
                .and_then(|b| b.prompted_turn(&subject.key()))
                == Some(turn.0.as_str());
        let written = uses.is_empty() && (prewritten || recorded);
        if !written {
            out.push(Intent::Append {
                fences: turn_claims(&exclusive, &drive)
                    .into_iter()
                    .chain(use_refs.iter().cloned())
                    .collect(),
                close: false,
                batch,
            });
        }
        let deps = self.dep_results(&room, &t);
        let trace = t
            .command
            .map(|c| self.remembered.get(&c).map_or(c, |r| r.trace));
        let feedback = match (&t.review, &t.feedback) {
            (Some(r), Some(text)) if t.rejections > 0 => Some(ReviewFeedback {
                reviewer: r.agent.clone(),
                text: text.clone(),
                rejected_result: t.rejected_result.clone(),
            }),
            _ => None,
        };
        let work = TurnWork::Task(TaskBrief {
            trace,
            id: task.clone(),
            label: t.label.clone(),
            attempt,
            max_attempts: t.max_attempts,
            needs: t.needs.clone(),
            deps,
            due_ms: t.due_ms,
            rejections: t.rejections,
            feedback,
            compensates: t.compensates.as_ref().map(|c| {
                let undone = self.dag.task(&room, c);
                DepResult {
                    id: c.clone(),
                    label: undone.map(|x| x.label.clone()).unwrap_or_default(),
                    result: undone.and_then(|x| x.result.clone()),
                }
            }),
        });
        let held = (!written).then(|| (agent.clone(), turn.clone()));
        self.start_turn(
            turn,
            agent,
            room,
            None,
            subject,
            work,
            LiveWork::Task { task },
            exclusive,
            drive,
            use_refs,
            out,
        );
        // Held ahead with its rows appended now rather than written with its claims:
        // it waits for them to be read back before it starts (plan 0085).
        if let Some((agent, turn)) = held {
            if let Some(p) = self
                .ahead
                .get_mut(&agent)
                .and_then(|q| q.back_mut())
                .filter(|p| p.start.turn == turn)
            {
                p.rows_pending = true;
            }
        }
    }

    /// Whether `task` of `room` is still waiting for the verdict on the submission of
    /// `generation`.
    fn in_review_at(&self, room: &str, task: &str, generation: u32) -> bool {
        self.dag
            .task(room, task)
            .is_some_and(|t| t.status == TaskStatus::Submitted && t.generation == generation)
    }

    /// The review claim was won; `drive` is the answer to the review drive claim
    /// chained after it, when the relay took both in one call.
    fn review_won(
        &mut self,
        room: String,
        (task, generation): (String, u32),
        agent: String,
        drive: Option<ClaimAnswer>,
        out: &mut Vec<Intent>,
    ) {
        let key = review_key(&room, &task, generation);
        let dkey = reviewdrive_key(&room, &task, generation);
        let epoch = self.claims.get(&key).and_then(|s| s.epoch);
        let alive = self.in_review_at(&room, &task, generation);
        let (true, Some(review_epoch)) = (alive, epoch) else {
            self.forget(&key);
            if let Some(ClaimAnswer::Won { epoch, .. }) = drive {
                out.push(Intent::Release {
                    key: dkey,
                    holder: self.relay.clone(),
                    epoch,
                });
            }
            return;
        };
        let purpose = ClaimPurpose::DriveReview {
            room,
            task,
            agent,
            review_epoch,
            generation,
        };
        match drive {
            Some(answer) => {
                self.claims.insert(
                    dkey.clone(),
                    Slot {
                        holder: self.relay.clone(),
                        purpose,
                        epoch: None,
                    },
                );
                let outcome = ClaimOutcome::new(dkey, self.relay.clone(), answer);
                self.on_claim_result(outcome, out);
            }
            None => self.acquire(dkey, self.relay.clone(), purpose, out),
        }
    }

    /// Both review claims are held: record the prompt and start the review turn.
    fn drive_review_won(
        &mut self,
        room: String,
        (task, generation): (String, u32),
        agent: String,
        review_epoch: ClaimEpoch,
        drive_epoch: ClaimEpoch,
        out: &mut Vec<Intent>,
    ) {
        let rkey = review_key(&room, &task, generation);
        let dkey = reviewdrive_key(&room, &task, generation);
        let t = self
            .dag
            .task(&room, &task)
            .filter(|_| {
                self.in_review_at(&room, &task, generation)
                    && self.held_at(&rkey, review_epoch)
                    && !self.reviews_finished.contains(&rkey)
            })
            .cloned();
        let Some(t) = t else {
            self.forget_at(&rkey, review_epoch);
            self.forget(&dkey);
            return;
        };
        let exclusive = ClaimRef {
            key: rkey,
            holder: agent.clone(),
            epoch: review_epoch,
        };
        let drive = ClaimRef {
            key: dkey,
            holder: self.relay.clone(),
            epoch: drive_epoch,
        };
        let turn = TurnId(format!(
            "v/{room}/{task}/{agent}/{review_epoch}.{drive_epoch}.g{generation}"
        ));
        let subject = Subject::review(task.clone(), Some(truncate_text(&t.label, 200)));
        let prompted = TurnPromptedBody {
            turn: turn.0.clone(),
            subject: subject.clone(),
            epoch: review_epoch,
            drive_epoch,
        };
        out.push(Intent::Append {
            fences: vec![exclusive.clone(), drive.clone()],
            close: false,
            batch: vec![NewInteraction::new(
                room.as_str(),
                Verb::TurnPrompted,
                agent.as_str(),
                Role::Agent,
                serde_json::to_value(&prompted).unwrap_or_default(),
            )],
        });
        let deps = self.dep_results(&room, &t);
        let trace = t
            .command
            .map(|c| self.remembered.get(&c).map_or(c, |r| r.trace));
        let work = TurnWork::Review(ReviewBrief {
            id: task.clone(),
            label: t.label.clone(),
            round: t.rejections.saturating_add(1),
            rounds: t.review.as_ref().map_or(1, |r| r.rounds),
            submitted_by: t.owner.clone().unwrap_or_default(),
            result: t.result.clone(),
            deps,
            feedback: t.feedback.clone().filter(|f| !f.is_empty()),
            trace,
        });
        self.start_turn(
            turn,
            agent,
            room,
            None,
            subject,
            work,
            LiveWork::Review { task },
            exclusive,
            drive,
            Vec::new(),
            out,
        );
    }

    /// A task's dependencies with their labels and results, for prompts.
    fn dep_results(&self, room: &str, t: &crate::tasks::Task) -> Vec<DepResult> {
        t.deps
            .iter()
            .map(|d| {
                let dep = self.dag.task(room, d);
                DepResult {
                    id: d.clone(),
                    label: dep.map(|x| x.label.clone()).unwrap_or_default(),
                    result: dep.and_then(|x| x.result.clone()),
                }
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn start_turn(
        &mut self,
        turn: TurnId,
        agent: String,
        room: String,
        thread: Option<String>,
        subject: Subject,
        work: TurnWork,
        live: LiveWork,
        exclusive: ClaimRef,
        drive: ClaimRef,
        uses: Vec<ClaimRef>,
        out: &mut Vec<Intent>,
    ) {
        // The block is looked at no more than once per refresh interval per agent
        // (plan 0092): a turn started sooner gets none, as when it has not changed.
        let now = self.now.unwrap_or(Timestamp(0));
        let every_us =
            i64::try_from(self.options.coordination_refresh.as_micros()).unwrap_or(i64::MAX);
        let coordination = if self.delivery.due(&room, &agent, now, every_us) {
            let held = crate::board::resource_lines(&self.resources, &room, self.now);
            let block = self.board.coordination_with(
                &room,
                &agent,
                Some(self.dag.summary(&room)),
                crate::board::PatternLines {
                    resources: held,
                    benched: self.benched_lines(&room),
                    ..Default::default()
                },
            );
            self.delivery.take_fresh(&room, &agent, block.as_ref(), now)
        } else {
            None
        };
        let start = Box::new(TurnStart {
            turn: turn.clone(),
            agent: agent.clone(),
            room: room.clone(),
            thread: thread.clone(),
            subject: subject.clone(),
            work,
            epoch: exclusive.epoch,
            claims: turn_claims(&exclusive, &drive)
                .into_iter()
                .chain(uses.iter().cloned())
                .collect(),
            coordination,
            stall_timeout_ms: self.config(&room, thread.as_deref()).stall_timeout_ms,
        });
        let live = LiveTurn {
            agent,
            room,
            thread,
            subject,
            work: live,
            exclusive,
            drive,
            uses,
            lost: false,
            cancel_sent: false,
            stopped: None,
            overdue: false,
        };
        // A task taken ahead for an agent still at work (plan 0084) waits for the
        // agent's running turn to end.
        if matches!(live.work, LiveWork::Task { .. })
            && self.config(&live.room, None).lease_ahead
            && (self.turns.values().any(|t| t.agent == live.agent)
                || self.ahead.contains_key(&live.agent))
        {
            self.ahead
                .entry(live.agent.clone())
                .or_default()
                .push_back(Parked {
                    start,
                    live,
                    rows_pending: false,
                });
            return;
        }
        out.push(Intent::StartTurn(start));
        self.turns.insert(turn, live);
    }

    /// The oldest turn `agent` holds ahead, once it has no running turn: started when
    /// its claims are still held at their epochs, its task still open to it, the agent
    /// not benched and the relay not stopping; otherwise its claims are let go, nothing
    /// ran, and the next one is tried (plans 0084, 0085).
    fn start_ahead(&mut self, agent: &str, out: &mut Vec<Intent>) {
        while let Some(head) = self.ahead.get(agent).and_then(|q| q.front()) {
            // Rows appended after its claims were won: it waits until they are read.
            if head.rows_pending && !self.prompt_recorded(&head.live, &head.start.turn) {
                return;
            }
            let Some(p) = self.ahead.get_mut(agent).and_then(|q| q.pop_front()) else {
                break;
            };
            if self.try_start_parked(agent, p, out) {
                break;
            }
        }
        if self.ahead.get(agent).is_some_and(|q| q.is_empty()) {
            self.ahead.remove(agent);
        }
    }

    /// Whether the view shows `turn` as the latest prompted turn of `live`'s subject.
    fn prompt_recorded(&self, live: &LiveTurn, turn: &TurnId) -> bool {
        self.board
            .room(&live.room)
            .and_then(|b| b.prompted_turn(&live.subject.key()))
            == Some(turn.0.as_str())
    }

    /// How many turns `agent` holds ahead.
    fn parked(&self, agent: &str) -> usize {
        self.ahead.get(agent).map_or(0, |q| q.len())
    }

    /// Starts the held turn `p` of `agent`, or lets its claims go; whether it started.
    fn try_start_parked(&mut self, agent: &str, p: Parked, out: &mut Vec<Intent>) -> bool {
        let LiveWork::Task { task } = &p.live.work else {
            self.drop_parked(p, out);
            return false;
        };
        let alive = self.dag.task(&p.live.room, task).is_some_and(|t| {
            matches!(t.status, TaskStatus::Open | TaskStatus::Claimed)
                && t.epoch.is_none_or(|e| e <= p.live.exclusive.epoch)
        });
        let held = self.held_at(&p.live.exclusive.key, p.live.exclusive.epoch)
            && self.held_at(&p.live.drive.key, p.live.drive.epoch);
        // Benched meanwhile (its running turn tripped the breaker): it takes no work.
        let benched = self.benched(&p.live.room, agent);
        if !alive || !held || benched || self.shutting_down {
            self.drop_parked(p, out);
            return false;
        }
        let turn = p.start.turn.clone();
        out.push(Intent::StartTurn(p.start));
        self.turns.insert(turn, p.live);
        true
    }

    /// Lets a held-ahead turn's claims go (it never started).
    fn drop_parked(&mut self, p: Parked, out: &mut Vec<Intent>) {
        self.give_back_uses(&p.live.room, &p.live.agent, &p.live.uses, true, out);
        for c in p.live.claims().iter().rev() {
            self.forget_at(&c.key, c.epoch);
            out.push(Intent::Release {
                key: c.key.clone(),
                holder: c.holder.clone(),
                epoch: c.epoch,
            });
        }
    }

    // -----------------------------------------------------------------------------
    // Turn endings and lost claims
    // -----------------------------------------------------------------------------

    fn on_turn_ended(
        &mut self,
        turn: &TurnId,
        outcome: TurnOutcome,
        tokens: u64,
        activity: TurnActivity,
        out: &mut Vec<Intent>,
    ) {
        let Some(lt) = self.turns.remove(turn) else {
            return;
        };
        // A review turn's reply must give a verdict; one that does not is a failed turn.
        let outcome = match (&lt.work, outcome) {
            (LiveWork::Review { .. }, TurnOutcome::Replied { text })
                if Verdict::from_reply(&text).is_none() =>
            {
                TurnOutcome::Failed {
                    reason: format!(
                        "no verdict: a review's reply starts with ACCEPT or REJECT (then \
                         the feedback); it began with {:?}",
                        truncate_text(text.trim(), 80)
                    ),
                }
            }
            (_, outcome) => outcome,
        };
        // Its agent has stopped: the resources it held for the task go back first.
        // A turn whose claims were lost may have lost them on its very first write
        // (the claim row and the acquisition): then no acquisition records them.
        let recorded = !lt.lost
            || lt.uses.iter().all(|c| {
                crate::resources::parse_resource_key(&c.key).is_some_and(|(room, _, _, name)| {
                    self.resources.records(room, &c.holder, &name, c.epoch)
                })
            });
        self.give_back_uses(&lt.room, &lt.agent, &lt.uses, recorded, out);
        self.forget_at(&lt.exclusive.key, lt.exclusive.epoch);
        self.forget_at(&lt.drive.key, lt.drive.epoch);
        // A turn that never started (its start deadline passed): nothing ran.
        let not_started = matches!(outcome, TurnOutcome::NotStarted { .. });
        match &lt.work {
            // A turn that ended under its claim appends its completion or failure: never
            // resume that lease, even before the fold shows the outcome.
            LiveWork::Task { .. } if !lt.lost && !not_started => {
                self.finished.insert(&lt.exclusive.key, lt.exclusive.epoch);
                self.unconfirmed.push(Unconfirmed {
                    claims: lt.claims(),
                    undo: Undo::Task {
                        key: lt.exclusive.key.clone(),
                        epoch: lt.exclusive.epoch,
                    },
                });
            }
            // A verdict is on its way: never review this submission again here.
            LiveWork::Review { .. }
                if !lt.lost && matches!(outcome, TurnOutcome::Replied { .. }) =>
            {
                self.reviews_finished.insert(lt.exclusive.key.clone());
                self.unconfirmed.push(Unconfirmed {
                    claims: lt.claims(),
                    undo: Undo::Review {
                        key: lt.exclusive.key.clone(),
                    },
                });
            }
            LiveWork::Reply { message, .. }
                if !matches!(outcome, TurnOutcome::Replied { .. }) || lt.lost =>
            {
                let max = self
                    .config(&lt.room, lt.thread.as_deref())
                    .max_reply_failures as usize;
                let key = (lt.room.clone(), *message);
                if let Some(m) = self.messages.get_mut(&key) {
                    m.note_failure(&lt.agent, &turn.0, lt.exclusive.epoch);
                    // The same notice the fold of this turn's failure would queue: the
                    // message may be gone by then.
                    let why = failure_notice(m, &lt.agent, max as u32);
                    let thread = m.thread.clone();
                    if let Some(why) = why {
                        self.notice_unanswered(&lt.room, thread, *message, &why);
                    }
                    if self
                        .messages
                        .get(&key)
                        .is_some_and(|m| !m.each && m.failed_turns.len() >= max)
                    {
                        self.messages.remove(&key);
                    }
                }
                self.drop_if_all_answered(&key);
            }
            _ => {}
        }
        let epoch = lt.exclusive.epoch;
        let failed_row = |reason: String| {
            let body = TurnFailedBody {
                turn: turn.0.clone(),
                subject: lt.subject.clone(),
                epoch,
                reason: truncate_text(&reason, MAX_RESULT_BYTES),
                tokens,
                activity: activity.clone(),
            };
            let mut row = NewInteraction::new(
                lt.room.as_str(),
                Verb::TurnFailed,
                lt.agent.as_str(),
                Role::Agent,
                serde_json::to_value(&body).unwrap_or_default(),
            );
            row.thread = lt.thread.clone();
            row
        };
        let release_both = |out: &mut Vec<Intent>| {
            for c in lt.claims().iter().rev() {
                out.push(Intent::Release {
                    key: c.key.clone(),
                    holder: c.holder.clone(),
                    epoch: c.epoch,
                });
            }
        };
        let reason = match &outcome {
            TurnOutcome::Replied { .. } => "the claim was lost before the turn ended".to_string(),
            TurnOutcome::Failed { reason } => reason.clone(),
            TurnOutcome::Cancelled if lt.stopped.is_some() => {
                lt.stopped.clone().unwrap_or_default()
            }
            TurnOutcome::Cancelled if lt.lost => "cancelled: the claim was lost".to_string(),
            TurnOutcome::Cancelled if self.shutting_down => {
                "cancelled: relay shutting down".to_string()
            }
            TurnOutcome::Cancelled => "cancelled".to_string(),
            TurnOutcome::NotStarted { reason } => format!("not started: {reason}"),
        };
        // The circuit breaker counts this ending at once, before its row is read back.
        let streak_key = (lt.room.clone(), lt.agent.clone());
        if matches!(outcome, TurnOutcome::Replied { .. }) && !lt.lost {
            self.unfolded_failures.remove(&streak_key);
        } else if crate::board::counts_against_agent(&reason) {
            if let Some(now) = self.now {
                self.unfolded_failures
                    .entry(streak_key)
                    .or_default()
                    .insert(turn.0.clone(), now);
            }
        }
        if not_started {
            // Nothing is written under its claims (no task.failed: no attempt ran);
            // both are let go (a no-op for one already lost), so the work is offered
            // again at once, to any relay, this one included.
            out.push(Intent::Append {
                fences: Vec::new(),
                close: false,
                batch: vec![failed_row(reason)],
            });
            release_both(out);
            return;
        }
        if lt.lost {
            // Nothing may be written under a lost claim; record only that the turn failed.
            out.push(Intent::Append {
                fences: Vec::new(),
                close: false,
                batch: vec![failed_row(reason)],
            });
            return;
        }
        match (&lt.work, outcome) {
            (LiveWork::Reply { message, next_hops }, TurnOutcome::Replied { text }) => {
                let text = truncate_text(text.trim_end(), self.options.max_reply_bytes);
                // A reply that addresses another agent is one more agent-to-agent
                // step: it carries its hops, so `max-hops` ends the chain.
                let known = self.registered_agents(&lt.room);
                let addresses_agent = addressing::mentions_in(&text, &known)
                    .iter()
                    .any(|a| *a != lt.agent)
                    || !addressing::group_mentions_in(&text).is_empty();
                let body = MessageBody {
                    hops: next_hops.filter(|_| addresses_agent),
                    // From the turn: a retried write of this reply is the same row.
                    nonce: Some(crate::protocol::nonce_from(turn.0.as_bytes())),
                    text,
                    mentions: Vec::new(),
                };
                let mut reply = NewInteraction::new(
                    lt.room.as_str(),
                    Verb::MessagePosted,
                    lt.agent.as_str(),
                    Role::Agent,
                    serde_json::to_value(&body).unwrap_or_default(),
                )
                .with_parent(*message);
                reply.thread = lt.thread.clone();
                let replied = TurnRepliedBody {
                    turn: turn.0.clone(),
                    subject: lt.subject.clone(),
                    epoch,
                    tokens,
                    reply: Some(reply.id()),
                    activity,
                };
                let mut replied_row = NewInteraction::new(
                    lt.room.as_str(),
                    Verb::TurnReplied,
                    lt.agent.as_str(),
                    Role::Agent,
                    serde_json::to_value(&replied).unwrap_or_default(),
                )
                .with_parent(*message);
                replied_row.thread = lt.thread.clone();
                let before = self
                    .messages
                    .get(&(lt.room.clone(), *message))
                    .cloned()
                    .map(Box::new);
                self.answered(&lt.room, *message, &lt.agent);
                self.unconfirmed.push(Unconfirmed {
                    claims: lt.claims(),
                    undo: Undo::Reply {
                        room: lt.room.clone(),
                        message: *message,
                        agent: lt.agent.clone(),
                        before,
                    },
                });
                // The reply finishes the message for this agent: fenced by the reply
                // claim and the drive claim, and closing both, so no relay (however
                // stale its view) can ever answer it again.
                out.push(Intent::Append {
                    fences: lt.claims(),
                    close: true,
                    batch: vec![reply, replied_row],
                });
            }
            (LiveWork::Review { task }, TurnOutcome::Replied { text }) => {
                // (A reply without a verdict was made a failure above.)
                let Some((verdict, feedback)) = Verdict::from_reply(&text) else {
                    return;
                };
                let reviewed = TaskReviewedBody {
                    task: task.clone(),
                    epoch,
                    verdict,
                    feedback: truncate_text(&feedback, MAX_RESULT_BYTES),
                    generation: key_generation(&lt.exclusive.key),
                };
                let replied = TurnRepliedBody {
                    turn: turn.0.clone(),
                    subject: lt.subject.clone(),
                    epoch,
                    tokens,
                    reply: None,
                    activity,
                };
                // Fenced by the review claim and its drive claim, closing both: the
                // submission is judged once, whatever any stale relay believes.
                out.push(Intent::Append {
                    fences: lt.claims(),
                    close: true,
                    batch: vec![
                        NewInteraction::new(
                            lt.room.as_str(),
                            Verb::TaskReviewed,
                            lt.agent.as_str(),
                            Role::Agent,
                            reviewed.to_body(),
                        ),
                        NewInteraction::new(
                            lt.room.as_str(),
                            Verb::TurnReplied,
                            lt.agent.as_str(),
                            Role::Agent,
                            serde_json::to_value(&replied).unwrap_or_default(),
                        ),
                    ],
                });
            }
            (LiveWork::Reply { .. } | LiveWork::Review { .. }, _) => {
                if let (LiveWork::Review { task }, Some(now)) = (&lt.work, self.now) {
                    // The review is offered again after the room's retry back-off
                    // (here; the breaker paces a reviewer that keeps failing).
                    let config = self.config(&lt.room, None);
                    let ms = crate::pacing::retry_backoff_ms(config, &lt.room, task, 1);
                    self.held_elsewhere
                        .insert(lt.exclusive.key.clone(), now.saturating_add(ms_to_us(ms)));
                }
                // The reply claim goes first: other relays contend for it as soon as
                // they read `turn.failed`, and one still held then would make them
                // back off for a whole lease. The failure is fenced by the drive
                // claim, which is released after it.
                let c = &lt.exclusive;
                out.push(Intent::Release {
                    key: c.key.clone(),
                    holder: c.holder.clone(),
                    epoch: c.epoch,
                });
                out.push(Intent::Append {
                    fences: vec![lt.drive.clone()],
                    close: false,
                    batch: vec![failed_row(reason)],
                });
                let c = &lt.drive;
                out.push(Intent::Release {
                    key: c.key.clone(),
                    holder: c.holder.clone(),
                    epoch: c.epoch,
                });
            }
            (LiveWork::Task { task }, TurnOutcome::Replied { text }) => {
                let done = TaskCompletedBody {
                    task: task.clone(),
                    epoch,
                    result: Some(truncate_text(text.trim_end(), MAX_RESULT_BYTES)),
                    tokens: Some(tokens),
                    generation: key_generation(&lt.exclusive.key),
                };
                let replied = TurnRepliedBody {
                    turn: turn.0.clone(),
                    subject: lt.subject.clone(),
                    epoch,
                    tokens,
                    reply: None,
                    activity,
                };
                let batch = self.task_turn_end(
                    &lt,
                    (Verb::TaskCompleted, done.to_body()),
                    (
                        Verb::TurnReplied,
                        serde_json::to_value(&replied).unwrap_or_default(),
                    ),
                );
                // Fenced by the task claim, whose driver is this relay (the same agent
                // on two relays completes once), and closing it: a finished task is
                // never acquired again, by any relay, however stale its view.
                out.push(Intent::Append {
                    fences: lt.claims(),
                    close: true,
                    batch,
                });
            }
            (LiveWork::Task { task }, _) => {
                let verb = if self.shutting_down {
                    Verb::TaskReleased
                } else {
                    Verb::TaskFailed
                };
                let ended = TaskEndedBody {
                    task: task.clone(),
                    epoch,
                    reason: truncate_text(&reason, MAX_RESULT_BYTES),
                    generation: key_generation(&lt.exclusive.key),
                };
                // The last allowed attempt failing abandons the task: that closes it.
                let last = verb == Verb::TaskFailed
                    && self
                        .dag
                        .task(&lt.room, task)
                        .is_some_and(|t| t.attempts >= t.max_attempts);
                let batch = self.task_turn_end(
                    &lt,
                    (verb, ended.to_body()),
                    (Verb::TurnFailed, failed_row(reason).body),
                );
                out.push(Intent::Append {
                    fences: lt.claims(),
                    close: last,
                    batch,
                });
                release_both(out);
                if lt.overdue {
                    // The owner hears of it (one row, whichever relay writes it: the
                    // text depends only on the task and the attempt).
                    let attempt = self.dag.task(&lt.room, task).map_or(0, |t| t.attempts);
                    let body = CoordNoteBody::Notice(crate::protocol::NoticeBody {
                        about: crate::protocol::NoticeBody::TASK_OVERDUE.to_string(),
                        to: Some("owner".to_string()),
                        task: Some(task.clone()),
                        text: format!(
                            "task {task}: attempt {attempt} by {} was cancelled and failed: {}",
                            lt.agent,
                            lt.stopped.as_deref().unwrap_or("overdue")
                        ),
                    });
                    out.push(Intent::Append {
                        fences: Vec::new(),
                        close: false,
                        batch: vec![NewInteraction::new(
                            lt.room.as_str(),
                            Verb::CoordNote,
                            crate::protocol::SYSTEM_ACTOR,
                            Role::System,
                            body.to_body(),
                        )],
                    });
                }
            }
        }
    }

    /// The rows that end task turn `lt`: its task row (`verb`, `body`) and its turn
    /// row, or, in a room with `compact-turns on` (plan 0095), the task row carrying
    /// the turn's end.
    fn task_turn_end(
        &self,
        lt: &LiveTurn,
        (verb, body): (Verb, serde_json::Value),
        (turn_verb, turn_body): (Verb, serde_json::Value),
    ) -> Vec<NewInteraction> {
        let row = |verb, body| {
            NewInteraction::new(lt.room.as_str(), verb, lt.agent.as_str(), Role::Agent, body)
        };
        if self.config(&lt.room, None).compact_turns {
            vec![row(verb, crate::protocol::carry_turn(body, turn_body))]
        } else {
            vec![row(verb, body), row(turn_verb, turn_body)]
        }
    }

    fn on_stop(
        &mut self,
        room: &str,
        agent: Option<&str>,
        thread: Option<&str>,
        command: InteractionId,
        out: &mut Vec<Intent>,
    ) {
        for (id, t) in self.turns.iter_mut() {
            let matches = t.room == room
                && agent.is_none_or(|a| a == t.agent)
                && thread.is_none_or(|th| t.thread.as_deref() == Some(th));
            if !matches || t.stopped.is_some() {
                continue;
            }
            t.stopped = Some(format!("stopped by the owner (!stop {})", command.short()));
            if !t.cancel_sent {
                t.cancel_sent = true;
                out.push(Intent::Cancel { turn: id.clone() });
            }
        }
    }

    /// The answer to the resources of a task whose claims were won (`key`, `epoch`:
    /// the task claim). Won: the task goes on to its claim row and turn. Blocked or
    /// failed: both claims are let go with nothing written (no attempt used), and a
    /// blocked task waits until the first blocking holding would lapse or a
    /// `resource.released` row arrives in the room.
    fn on_resources(
        &mut self,
        key: &str,
        epoch: ClaimEpoch,
        answer: ResourcesAnswer,
        out: &mut Vec<Intent>,
    ) {
        let Some(p) = self
            .pending_uses
            .get(key)
            .filter(|p| p.task_epoch == epoch)
            .cloned()
        else {
            // Nobody waits for these any more: give back whatever was taken.
            if let ResourcesAnswer::Won(held) = answer {
                if let Some((room, holder)) = held.first().and_then(|h| {
                    crate::resources::parse_resource_key(&h.key)
                        .map(|(r, _, _, _)| (r.to_string(), h.holder.clone()))
                }) {
                    let refs = holding_refs(&held);
                    self.give_back_uses(&room, &holder, &refs, false, out);
                }
            }
            return;
        };
        self.pending_uses.remove(key);
        let tkey = task_key_at(&p.room, &p.task, p.generation);
        match answer {
            ResourcesAnswer::Won(held) if !self.shutting_down => {
                self.uses_won.insert((tkey, epoch), held);
                self.drive_task_won(p, (false, None), out);
                return;
            }
            ResourcesAnswer::Won(held) => {
                let refs = holding_refs(&held);
                self.give_back_uses(&p.room, &p.agent, &refs, false, out);
            }
            ResourcesAnswer::Blocked { until } => {
                self.held_elsewhere.insert(tkey.clone(), until);
                self.resource_waits
                    .entry(p.room.clone())
                    .or_default()
                    .insert(tkey.clone());
            }
            ResourcesAnswer::Failed => {}
        }
        self.release_unused_take(&tkey, &p, out);
    }

    /// The earliest time a won task claim waits for a view to cover.
    fn earliest_awaiting_view(&self) -> Option<Timestamp> {
        self.awaiting_view.values().map(|(_, at)| *at).min()
    }

    /// Takes up the won claims that waited for a view covering `as_of` (every row
    /// committed before it is folded now); true when there were any.
    fn view_covers_takes(&mut self, as_of: Timestamp, out: &mut Vec<Intent>) -> bool {
        let ready: Vec<String> = self
            .awaiting_view
            .iter()
            .filter(|(_, (_, at))| *at <= as_of)
            .map(|(k, _)| k.clone())
            .collect();
        for tkey in &ready {
            if let Some((p, at)) = self.awaiting_view.remove(tkey) {
                self.drive_task_won(p, (false, Some(at)), out);
            }
        }
        !ready.is_empty()
    }

    /// Lets go of a task's won claims (and resources) with nothing written under them:
    /// no attempt was used, and a later pass decides again.
    fn release_unused_take(&mut self, tkey: &str, p: &WonTake, out: &mut Vec<Intent>) {
        self.drop_uses_won(&p.room, &p.agent, tkey, p.task_epoch, out);
        out.push(Intent::Release {
            key: tkey.to_string(),
            holder: p.agent.clone(),
            epoch: p.task_epoch,
        });
        self.forget_at(tkey, p.task_epoch);
    }

    /// Gives back resources won for a task claim whose turn will not start.
    fn drop_uses_won(
        &mut self,
        room: &str,
        agent: &str,
        tkey: &str,
        epoch: ClaimEpoch,
        out: &mut Vec<Intent>,
    ) {
        if let Some(held) = self.uses_won.remove(&(tkey.to_string(), epoch)) {
            let refs = holding_refs(&held);
            self.give_back_uses(room, agent, &refs, false, out);
        }
    }

    /// Releases `uses` (resource claims held by `agent`), then records
    /// `resource.released`: that row also wakes the tasks other relays hold back for
    /// these resources. Holdings no `resource.acquired` row records (`recorded` false:
    /// taken for a task whose turn then did not start) are released with the reason
    /// [`crate::resources::UNUSED_HOLDINGS`], so no release is left unexplained.
    fn give_back_uses(
        &self,
        room: &str,
        agent: &str,
        uses: &[ClaimRef],
        recorded: bool,
        out: &mut Vec<Intent>,
    ) {
        if uses.is_empty() {
            return;
        }
        for c in uses {
            out.push(Intent::Release {
                key: c.key.clone(),
                holder: c.holder.clone(),
                epoch: c.epoch,
            });
        }
        out.push(Intent::Append {
            fences: Vec::new(),
            close: false,
            batch: vec![uses_row(
                room,
                agent,
                Verb::ResourceReleased,
                uses,
                None,
                (!recorded).then(|| crate::resources::UNUSED_HOLDINGS.to_string()),
                Duration::ZERO,
            )],
        });
    }

    /// The resource holdings of `room` live at `now`, as the ledger's `resource.*` rows
    /// show them: a pass contends only for tasks whose `uses` they leave free for the
    /// agent (the store decides for real when the resources are taken).
    fn live_holdings(&self, room: &str, now: Timestamp) -> Vec<crate::resources::Holding> {
        self.resources
            .held(room, now)
            .into_iter()
            .map(|h| crate::resources::Holding {
                key: crate::resources::resource_key(room, &h.holder, h.mode, &h.name),
                holder: h.holder,
                name: h.name,
                mode: h.mode,
                epoch: h.epoch,
                expires_at: h.expires_at,
            })
            .collect()
    }

    fn on_claim_lost(&mut self, key: &str, epoch: ClaimEpoch, out: &mut Vec<Intent>) {
        // A turn held ahead under this claim never starts.
        let mut lost = Vec::new();
        for q in self.ahead.values_mut() {
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(q).into_iter().partition(|p| {
                p.live
                    .claims()
                    .iter()
                    .any(|c| c.key == key && c.epoch == epoch)
            });
            *q = kept.into();
            lost.extend(gone);
        }
        self.ahead.retain(|_, q| !q.is_empty());
        for p in lost {
            self.drop_parked(p, out);
        }
        for (id, t) in self.turns.iter_mut() {
            let uses = t
                .claims()
                .iter()
                .chain(&t.uses)
                .any(|c| c.key == key && c.epoch == epoch);
            if uses {
                t.lost = true;
                if !t.cancel_sent {
                    t.cancel_sent = true;
                    out.push(Intent::Cancel { turn: id.clone() });
                }
            }
        }
        if self.claims.get(key).is_some_and(|s| s.epoch == Some(epoch)) {
            self.forget(key);
        }
        // An ending write under this claim was refused: the work is not finished.
        // (A loss reported after the write did land, a renewal of the claim it closed,
        // undoes nothing lasting: the next acquire finds the claim closed.)
        let (undone, kept): (Vec<Unconfirmed>, Vec<Unconfirmed>) =
            std::mem::take(&mut self.unconfirmed)
                .into_iter()
                .partition(|u| u.claims.iter().any(|c| c.key == key && c.epoch == epoch));
        self.unconfirmed = kept;
        for u in undone {
            match u.undo {
                Undo::Task { key, epoch } => {
                    self.finished.remove(&key, epoch);
                }
                Undo::Review { key } => {
                    self.reviews_finished.remove(&key);
                }
                Undo::Reply {
                    room,
                    message,
                    agent,
                    before,
                } => match self.messages.get_mut(&(room.clone(), message)) {
                    Some(m) => {
                        m.answered.remove(&agent);
                    }
                    None => {
                        if let Some(m) = before {
                            self.messages.insert((room, message), *m);
                        }
                    }
                },
            }
        }
    }
}

/// The generation a task claim key is for (0 for any other key).
fn key_generation(key: &str) -> u32 {
    match ClaimKey::parse(key) {
        Some(
            ClaimKey::Task { generation, .. }
            | ClaimKey::TaskDrive { generation, .. }
            | ClaimKey::Review { generation, .. }
            | ClaimKey::ReviewDrive { generation, .. },
        ) => generation,
        _ => 0,
    }
}

fn holding_refs(held: &[crate::resources::Holding]) -> Vec<ClaimRef> {
    held.iter()
        .map(|h| ClaimRef {
            key: h.key.clone(),
            holder: h.holder.clone(),
            epoch: h.epoch,
        })
        .collect()
}

/// The `resource.acquired` (with `held`: the holdings won) or `resource.released` row
/// of a task's `[uses ...]`, written by `agent`.
fn uses_row(
    room: &str,
    agent: &str,
    verb: Verb,
    uses: &[ClaimRef],
    held: Option<&[crate::resources::Holding]>,
    reason: Option<String>,
    ttl: Duration,
) -> NewInteraction {
    use crate::resources::{parse_resource_key, HeldBody, ResourceRowBody};
    let resources = uses
        .iter()
        .filter_map(|c| {
            let (_, _, mode, name) = parse_resource_key(&c.key)?;
            Some(HeldBody {
                name,
                mode,
                epoch: c.epoch,
            })
        })
        .collect();
    let body = ResourceRowBody {
        resources,
        ttl_ms: held.map(|_| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        expires_at: held.and_then(|h| h.iter().map(|h| h.expires_at).min()),
        reason,
    };
    NewInteraction::new(
        room,
        verb,
        agent,
        Role::Agent,
        serde_json::to_value(&body).unwrap_or_default(),
    )
}

/// Whether a notice's `about` is one of the stuck-work notices relays write.
fn is_stuck_notice(about: &str) -> bool {
    [
        NoticeBody::TASK_BLOCKED,
        NoticeBody::TASK_UNSTAFFED,
        NoticeBody::BUDGET_SPENT,
    ]
    .contains(&about)
}

/// The notice a failed reply turn of `agent` on `m` calls for, if any: for a message
/// naming several agents, that this agent will not answer; otherwise, once `max`
/// turns failed, that nobody will. The text depends only on the ledger and the room's
/// config, so every relay writes the same row.
fn failure_notice(m: &OpenMessage, agent: &str, max: u32) -> Option<(Option<String>, String)> {
    if m.each {
        Some((
            Some(agent.to_string()),
            format!(
                "{agent} could not answer this message: its reply turn failed (its \
                 turn.failed row says why)."
            ),
        ))
    } else if m.failed_turns.len() >= max as usize {
        Some((
            None,
            format!(
                "Nobody could answer this message: {max} reply turns failed (their \
                 turn.failed rows say why); it is no longer offered to agents."
            ),
        ))
    } else {
        None
    }
}

/// Whether a message has had `max` failed reply turns.
fn m_failed_out(
    messages: &BTreeMap<(String, InteractionId), OpenMessage>,
    key: &(String, InteractionId),
    max: u32,
) -> bool {
    messages
        .get(key)
        .is_some_and(|m| m.failed_turns.len() >= max as usize)
}

fn message_subject(s: &Subject) -> Option<InteractionId> {
    if s.kind == SubjectKind::Message {
        s.id.parse().ok()
    } else {
        None
    }
}

fn rejection(room: &str, winner: &str, task: &str, attempt: u32, loser: &str) -> NewInteraction {
    let body = TaskRejectedBody {
        task: task.to_string(),
        attempt,
        agent: loser.to_string(),
        winner: winner.to_string(),
    };
    NewInteraction::new(
        room,
        Verb::TaskRejected,
        winner,
        Role::Agent,
        body.to_body(),
    )
}

/// A deterministic pseudo-random rank of a task for an agent, so agents on different
/// relays bid on different tasks first.
fn spread(agent: &str, room: &str, task: &str) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&hash_parts(&[agent, room, task]).as_bytes()[..8]);
    out
}

/// Whether the fold shows the outcome of the turn that ran under task claim `key` at
/// `epoch`: the task finished, failed or was released at that epoch, was claimed at a
/// later one or moved on to a later generation (or is gone). Not while the fold still
/// shows it claimed at that epoch — nor while it has not read that claim yet: a turn
/// may end before its relay reads the claim rows written with its claims.
fn outcome_read(dag: &TaskDag, key: &str, epoch: ClaimEpoch) -> bool {
    let Some(ClaimKey::Task {
        room,
        task,
        generation,
    }) = ClaimKey::parse(key)
    else {
        return true;
    };
    outcome_read_of(dag.task(&room, &task), generation, epoch)
}

/// [`outcome_read`] of the task `t` (as the fold shows it, if at all), for its claim
/// of `generation` at `epoch`.
fn outcome_read_of(t: Option<&crate::tasks::Task>, generation: u32, epoch: ClaimEpoch) -> bool {
    t.is_none_or(|t| {
        t.generation > generation
            || t.epoch
                .is_some_and(|e| e > epoch || (e == epoch && t.status != TaskStatus::Claimed))
    })
}

/// Whether review claim `key`'s task is still waiting for its verdict in the fold.
fn still_in_review(dag: &TaskDag, key: &str) -> bool {
    match ClaimKey::parse(key) {
        Some(ClaimKey::Review {
            room,
            task,
            generation,
        }) => dag
            .task(&room, &task)
            .is_some_and(|t| t.status == TaskStatus::Submitted && t.generation == generation),
        _ => false,
    }
}

/// What a relay remembers of a recent message.
#[derive(serde::Serialize, serde::Deserialize)]
struct Remembered {
    author: String,
    /// The first message of its reply chain.
    trace: InteractionId,
}

/// The effective config of a room (`thread: None`) or thread among `configs`.
fn effective_config<'a>(
    configs: &'a BTreeMap<(String, Option<String>), RoomConfig>,
    default: &'a RoomConfig,
    room: &str,
    thread: Option<&str>,
) -> &'a RoomConfig {
    if let Some(t) = thread {
        if let Some(c) = configs.get(&(room.to_string(), Some(t.to_string()))) {
            return c;
        }
    }
    configs.get(&(room.to_string(), None)).unwrap_or(default)
}
