//! The synchronizer's vocabulary: what a relay configures ([`LocalAgent`],
//! [`SyncOptions`], [`ReplyGate`]), the [`Event`]s it feeds in and the [`Intent`]s it
//! performs.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::RoomConfig;
use crate::model::{Interaction, InteractionId, NewInteraction, Role, Timestamp};
use crate::protocol::{ClaimEpoch, ClaimRef, Subject, TurnActivity, DEFAULT_PRIORITY};

// ---------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------

/// An agent hosted by this relay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalAgent {
    /// The agent key (its actor name in the ledger).
    pub key: String,
    /// Declared capabilities (matched against tasks' `needs`).
    pub capabilities: Vec<String>,
    /// Rank under `role-priority` (lower answers first).
    pub priority: u32,
}

impl LocalAgent {
    /// An agent with no capabilities and the default priority.
    pub fn new(key: impl Into<String>) -> Self {
        LocalAgent {
            key: key.into(),
            capabilities: Vec::new(),
            priority: DEFAULT_PRIORITY,
        }
    }

    /// Sets the capabilities (sorted, de-duplicated).
    pub fn with_capabilities<I, S>(mut self, caps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut c: Vec<String> = caps.into_iter().map(Into::into).collect();
        c.sort();
        c.dedup();
        self.capabilities = c;
        self
    }

    /// Sets the `role-priority` rank.
    pub fn with_priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }
}

/// Tuning of the synchronizer that is not room config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncOptions {
    /// Most task claims and bids started per pass (default 16); the rest of the
    /// frontier drains on later passes.
    pub max_wakes_per_pass: usize,
    /// Longest reply text appended, in bytes (default 64 KiB; longer is truncated).
    pub max_reply_bytes: usize,
    /// How many message authors are remembered for reply-to addressing (default 65,536).
    pub remembered_authors: usize,
    /// Shortest time between two looks at an agent's `<coordination>` block in a room
    /// (default 1 s; plan 0092): a turn started sooner gets no block, as when it has
    /// not changed, and the first turn after it gets the block if it changed. Zero
    /// looks at every turn start.
    pub coordination_refresh: std::time::Duration,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            max_wakes_per_pass: 16,
            max_reply_bytes: 64 * 1024,
            remembered_authors: 65_536,
            coordination_refresh: std::time::Duration::from_secs(1),
        }
    }
}

/// Decides whether agents may answer a message at all (the guards: turn caps, rate
/// caps, hops). Called once per `message.posted` as it is folded; the default admits
/// everything.
pub trait ReplyGate: Send {
    /// Whether agents may answer `message` under `config`.
    fn admit(&mut self, message: &Interaction, config: &RoomConfig) -> bool;

    /// The gate's own state, encoded, for a saved synchronizer state (plan 0063):
    /// empty when it keeps none.
    fn save(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Restores what [`ReplyGate::save`] returned.
    fn load(&mut self, _state: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

/// The [`ReplyGate`] that admits every message.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdmitAll;

impl ReplyGate for AdmitAll {
    fn admit(&mut self, _message: &Interaction, _config: &RoomConfig) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------------
// Events and intents
// ---------------------------------------------------------------------------------

/// A turn's id: unique per (subject, agent, claim epochs), so a relay that restarts
/// and resumes the same lease produces the same id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TurnId(pub String);

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TurnOutcome {
    /// The agent answered; `text` is the reply (a message reply, or a task's result).
    Replied {
        /// The reply.
        text: String,
    },
    /// The turn failed (non-zero exit, timeout, driver error).
    Failed {
        /// Why.
        reason: String,
    },
    /// The turn was stopped after [`Intent::Cancel`].
    Cancelled,
    /// The turn never started: the relay could no longer vouch for its claims when
    /// the agent was to start (its start deadline passed; the relay was paused or
    /// starved). Nothing ran, so nothing is written under its claims: they are
    /// released and the work is taken again (as after a lapsed lease).
    NotStarted {
        /// Why.
        reason: String,
    },
}

/// The answer to an [`Intent::Acquire`], as the store's `acquire` returned it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimOutcome {
    /// The key acquired.
    pub key: String,
    /// The holder the acquire was for.
    pub holder: String,
    /// What the store answered.
    pub answer: ClaimAnswer,
    /// The answer to the acquire chained after this one ([`Intent::Acquire`]'s
    /// `then`), when it was tried: only after this one was won, in the same store
    /// call. `None` when there was none or it was not tried (the synchronizer then
    /// asks for it separately if it still wants it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<ClaimAnswer>,
    /// Whether the rows of [`Intent::Acquire`]'s `write` were written with the
    /// claims, in the same store call. `false` when there were none, when the claims
    /// were not won at the epochs the rows carry, or when the relay does not write
    /// them: the synchronizer then appends what is needed itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub written: bool,
}

impl ClaimOutcome {
    /// The answer to a lone acquire (nothing chained).
    pub fn new(key: impl Into<String>, holder: impl Into<String>, answer: ClaimAnswer) -> Self {
        ClaimOutcome {
            key: key.into(),
            holder: holder.into(),
            answer,
            then: None,
            written: false,
        }
    }
}

/// An acquire to try right after another one is won, in the same store call
/// ([`Intent::Acquire`]'s `then`): a task's drive claim after its task claim, so a
/// hand-off takes both in one round trip. Its key sorts after the first one's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainedAcquire {
    /// Claim key.
    pub key: String,
    /// Holder.
    pub holder: String,
    /// Lease length.
    pub ttl: Duration,
}

/// Rows to write in the store call that takes a claim (and the one chained after it,
/// if any) ([`Intent::Acquire`]'s `write`), only when they are won at exactly `epoch`
/// (and `then_epoch`): a fresh task's `task.claimed` and `turn.prompted` written with
/// its claim, one round trip for the hand-off. A claim never taken before is won at
/// [`ClaimEpoch::FIRST`], which is what the rows carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriteIfWon {
    /// The epoch the claim must be won at.
    pub epoch: ClaimEpoch,
    /// The epoch the chained claim must be won at, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then_epoch: Option<ClaimEpoch>,
    /// The rows, written under the claims.
    pub batch: Vec<NewInteraction>,
}

/// What the store answered an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimAnswer {
    /// The holder holds the claim now.
    Won {
        /// The holder's epoch.
        epoch: ClaimEpoch,
        /// When the lease lapses (database time).
        expires_at: Timestamp,
    },
    /// Someone else holds it.
    Lost {
        /// The current holder's epoch.
        epoch: ClaimEpoch,
        /// When its lease lapses (database time).
        expires_at: Timestamp,
    },
    /// The claim is closed: the work it stood for is finished and nobody may take it
    /// again.
    Closed,
    /// The acquire failed without an answer (the store was away): nobody is known to
    /// hold the claim, and a later pass may try again.
    Failed,
}

impl ClaimAnswer {
    /// The holder's epoch when it won.
    pub fn won(&self) -> Option<ClaimEpoch> {
        match self {
            ClaimAnswer::Won { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }
}

/// What the store answered an [`Intent::AcquireResources`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResourcesAnswer {
    /// Every resource is held now: one holding per wanted resource, in order.
    Won(Vec<crate::resources::Holding>),
    /// Nothing was taken: another holder's holdings are in the way; the first of them
    /// lapses at `until` (database time) unless renewed.
    Blocked {
        /// The earliest expiry among the blocking holdings.
        until: Timestamp,
    },
    /// The call failed without an answer (the store was away).
    Failed,
}

/// What the relay tells the synchronizer.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Interactions read forward, in ledger order. `caught_up` is true when the read
    /// reached the end of what is committed (fewer rows than asked).
    Ledger {
        /// The rows.
        rows: Vec<Interaction>,
        /// Whether the reader has caught up.
        caught_up: bool,
    },
    /// Time passes: `now` is the database clock (µs). Send one at start, and at
    /// [`Synchronizer::next_wakeup`](super::Synchronizer::next_wakeup).
    Tick {
        /// Database time.
        now: Timestamp,
    },
    /// Every row committed before database time `as_of` has been folded: send after
    /// the rows of a caught-up read that began once the database clock was at
    /// `as_of` or later (a tick's clock reading taken before the read started). A
    /// closed bid window is decided only when this covers it.
    Covered {
        /// The database time the view covers.
        as_of: Timestamp,
    },
    /// The outcome of an [`Intent::Acquire`].
    ClaimResult(ClaimOutcome),
    /// A turn started by [`Intent::StartTurn`] ended.
    TurnEnded {
        /// The turn.
        turn: TurnId,
        /// How it ended.
        outcome: TurnOutcome,
        /// Tokens it used.
        tokens: u64,
        /// What the agent did, as its driver reported it (written into the turn's
        /// record).
        activity: TurnActivity,
    },
    /// The owner's `!stop`: cancel this relay's running turns in `room` (only
    /// `agent`'s, only in `thread`, when given). They end without a completion, their
    /// claims are released and their `turn.failed` says why.
    Stop {
        /// The room.
        room: String,
        /// Only this agent's turns.
        agent: Option<String>,
        /// Only turns in this thread.
        thread: Option<String>,
        /// The `!stop` message (named in the reason).
        command: InteractionId,
    },
    /// The owner's `!watch` / `!unwatch`: `agent` follows `thread` (or stops).
    Watch {
        /// The room.
        room: String,
        /// The thread.
        thread: String,
        /// The agent.
        agent: String,
        /// Follow (`true`) or stop following.
        watch: bool,
    },
    /// A claim is no longer held at `epoch`: a renew returned nothing, or a fenced
    /// append under it was refused.
    ClaimLost {
        /// The key.
        key: String,
        /// The epoch that was lost.
        epoch: ClaimEpoch,
    },
    /// The answer to an [`Intent::AcquireResources`] for the task claim `(key, epoch)`.
    ResourcesResult {
        /// The task claim key the resources were for.
        key: String,
        /// Its epoch.
        epoch: ClaimEpoch,
        /// What the store answered.
        answer: ResourcesAnswer,
    },
    /// The effective config of a room (`thread: None`) or a thread changed.
    Config {
        /// Room.
        room: String,
        /// Thread, for a thread overlay.
        thread: Option<String>,
        /// The effective config.
        config: RoomConfig,
    },
    /// Stop: cancel every turn, start nothing new.
    Shutdown,
}

/// Why a claim is acquired, and so what the synchronizer does when it is won.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimPurpose {
    /// `reply/..` for `agent`; when won: append a designation (fenced) and acquire the
    /// drive claim.
    Reply {
        /// Room.
        room: String,
        /// Thread of the message.
        thread: Option<String>,
        /// The message.
        message: InteractionId,
        /// The contending agent.
        agent: String,
        /// Whether the message names several agents, each answering under its own
        /// claim ([`crate::protocol::directed_reply_key`]).
        #[serde(default)]
        each: bool,
    },
    /// `drive/..` for this relay; when won: append `turn.prompted` (fenced) and start
    /// the reply turn.
    DriveReply {
        /// Room.
        room: String,
        /// Thread of the message.
        thread: Option<String>,
        /// The message.
        message: InteractionId,
        /// The agent whose turn it is.
        agent: String,
        /// The epoch of the reply claim won.
        reply_epoch: ClaimEpoch,
        /// As for [`ClaimPurpose::Reply`].
        #[serde(default)]
        each: bool,
    },
    /// `task/..` for `agent`, driven by this relay (the claim's driver, plan 0094);
    /// when won: append `task.claimed` (+ rejections) and `turn.prompted` fenced by it,
    /// and start the task turn.
    Task {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The contending agent.
        agent: String,
        /// The task's generation (its claim keys: `protocol::task_key_at`).
        #[serde(default)]
        generation: u32,
    },
    /// `review/..` for the reviewer `agent`; when won: acquire the review drive claim.
    Review {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The reviewer.
        agent: String,
        /// The task's generation whose submission is reviewed.
        generation: u32,
    },
    /// `reviewdrive/..` for this relay; when won: append `turn.prompted` fenced by the
    /// review claim and start the review turn.
    DriveReview {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The reviewer.
        agent: String,
        /// The epoch of the review claim won.
        review_epoch: ClaimEpoch,
        /// The task's generation whose submission is reviewed.
        generation: u32,
    },
}

impl ClaimPurpose {
    /// The agent the claim is for.
    pub fn agent(&self) -> &str {
        match self {
            ClaimPurpose::Reply { agent, .. }
            | ClaimPurpose::DriveReply { agent, .. }
            | ClaimPurpose::Task { agent, .. }
            | ClaimPurpose::Review { agent, .. }
            | ClaimPurpose::DriveReview { agent, .. } => agent,
        }
    }

    /// The room.
    pub fn room(&self) -> &str {
        match self {
            ClaimPurpose::Reply { room, .. }
            | ClaimPurpose::DriveReply { room, .. }
            | ClaimPurpose::Task { room, .. }
            | ClaimPurpose::Review { room, .. }
            | ClaimPurpose::DriveReview { room, .. } => room,
        }
    }

    /// The exclusive claim this purpose is about: the reply or task claim (for a drive
    /// claim, the one it drives).
    pub fn exclusive_key(&self) -> String {
        match self {
            ClaimPurpose::Reply {
                room,
                message,
                agent,
                each,
                ..
            }
            | ClaimPurpose::DriveReply {
                room,
                message,
                agent,
                each,
                ..
            } => crate::protocol::reply_key_for(room, message, agent, *each),
            ClaimPurpose::Task {
                room,
                task,
                generation,
                ..
            } => crate::protocol::task_key_at(room, task, *generation),
            ClaimPurpose::Review {
                room,
                task,
                generation,
                ..
            }
            | ClaimPurpose::DriveReview {
                room,
                task,
                generation,
                ..
            } => crate::protocol::review_key(room, task, *generation),
        }
    }
}

/// The message a reply turn answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageBrief {
    /// Its id.
    pub id: InteractionId,
    /// Its author.
    pub author: String,
    /// The author's role.
    pub role: Role,
    /// Its text (data, never instructions to huddle).
    pub text: String,
    /// Its trace: the first message of its reply chain (its own id when it answers
    /// nothing this relay remembers).
    #[serde(default)]
    pub trace: Option<InteractionId>,
}

/// A dependency of a task, with its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepResult {
    /// Task id.
    pub id: String,
    /// Its label.
    pub label: String,
    /// What its completion reported.
    pub result: Option<String>,
}

/// The task a task turn works on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskBrief {
    /// Task id.
    pub id: String,
    /// What to do.
    pub label: String,
    /// This attempt's number (1-based).
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Required capabilities.
    pub needs: Vec<String>,
    /// Its dependencies and their results, by id.
    pub deps: Vec<DepResult>,
    /// Its trace: the command that created it.
    #[serde(default)]
    pub trace: Option<InteractionId>,
    /// How long this attempt may run from its claim, ms (`[due ...]`), if limited.
    #[serde(default)]
    pub due_ms: Option<u64>,
    /// Rejections of the task's work by its reviewer so far (its review round is this
    /// plus one).
    #[serde(default)]
    pub rejections: u32,
    /// The reviewer's feedback on the last rejected submission, if one was rejected.
    #[serde(default)]
    pub feedback: Option<ReviewFeedback>,
    /// For a compensation (`[undo ...]`): the task it undoes, with that task's result.
    #[serde(default)]
    pub compensates: Option<DepResult>,
}

/// What a reviewer said of a rejected submission, for the next attempt's prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewFeedback {
    /// The reviewer.
    pub reviewer: String,
    /// The feedback.
    pub text: String,
    /// The rejected result.
    pub rejected_result: Option<String>,
}

/// The submission a review turn judges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewBrief {
    /// Task id.
    pub id: String,
    /// What the task asked for.
    pub label: String,
    /// The review round (1-based: rejections so far plus one).
    pub round: u32,
    /// Rejections allowed before the task fails for good.
    pub rounds: u32,
    /// The agent that submitted the work.
    pub submitted_by: String,
    /// The submitted result.
    pub result: Option<String>,
    /// The task's dependencies and their results.
    pub deps: Vec<DepResult>,
    /// What the reviewer said of the previous round, if it rejected one.
    pub feedback: Option<String>,
    /// Its trace: the command that created the task.
    #[serde(default)]
    pub trace: Option<InteractionId>,
}

/// What a turn is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TurnWork {
    /// Answer a message.
    Reply(MessageBrief),
    /// Work on a task.
    Task(TaskBrief),
    /// Judge a task's submission: accept or reject with feedback.
    Review(ReviewBrief),
}

/// Everything a driver needs to start a turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The turn id (report it back in [`Event::TurnEnded`]).
    pub turn: TurnId,
    /// The agent.
    pub agent: String,
    /// The room.
    pub room: String,
    /// The thread the answer belongs in, if any.
    pub thread: Option<String>,
    /// What the turn is about.
    pub subject: Subject,
    /// The message or task.
    pub work: TurnWork,
    /// The epoch of the exclusive claim (reply or task): `HUDDLE_EPOCH` for drivers.
    pub epoch: ClaimEpoch,
    /// The claims the turn runs under: `[exclusive, drive]`.
    pub claims: Vec<ClaimRef>,
    /// The `<coordination>` block to put first in the prompt, when it changed since it
    /// was last delivered to this agent in this room.
    pub coordination: Option<String>,
    /// The room's `stall-timeout`, ms (0: none): the relay cancels the turn and
    /// reports it failed (`stalled: ...`) once its driver reports no activity for
    /// that long.
    #[serde(default)]
    pub stall_timeout_ms: u64,
}

/// What the synchronizer asks the relay to do. Perform them in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Intent {
    /// Acquire `key` for `holder` for `ttl`; answer with [`Event::ClaimResult`].
    Acquire {
        /// Claim key.
        key: String,
        /// Holder (agent key or relay id).
        holder: String,
        /// The relay that drives the holder's turn under the claim, when it is taken
        /// for one (a task claim, plan 0094): the store keeps a live claim only for the
        /// same holder and driver, so this one claim elects the relay too.
        driver: Option<String>,
        /// Lease length.
        ttl: Duration,
        /// Why, and so what happens when it is won.
        purpose: ClaimPurpose,
        /// A second acquire to try only once this one is won, in the same store
        /// call; its answer comes back in [`ClaimOutcome::then`]. A relay that does
        /// not chain answers `then: None`, and the synchronizer asks again for it.
        then: Option<ChainedAcquire>,
        /// Rows to write with the claims in the same store call when they are won at
        /// the epochs given ([`WriteIfWon`]); [`ClaimOutcome::written`] says whether
        /// they were.
        write: Option<WriteIfWon>,
    },
    /// Append `batch` in one transaction; when `fence` is set, only while that claim is
    /// still held at its epoch (otherwise send [`Event::ClaimLost`]).
    Append {
        /// The claims the batch is written under: every one must still be held at its
        /// epoch when the batch commits, or nothing is written.
        fences: Vec<ClaimRef>,
        /// Whether this write finishes the work: it closes every fenced claim in the
        /// same transaction, so nobody can ever acquire them again.
        close: bool,
        /// The interactions.
        batch: Vec<NewInteraction>,
    },
    /// Start a turn; answer with [`Event::TurnEnded`] when it ends.
    StartTurn(Box<TurnStart>),
    /// Renew the lease of `(key, holder, epoch)`; when that fails send
    /// [`Event::ClaimLost`].
    Renew {
        /// Claim key.
        key: String,
        /// Holder.
        holder: String,
        /// Epoch held.
        epoch: ClaimEpoch,
        /// New lease length.
        ttl: Duration,
    },
    /// Release (expire) `(key, holder, epoch)`.
    Release {
        /// Claim key.
        key: String,
        /// Holder.
        holder: String,
        /// Epoch held.
        epoch: ClaimEpoch,
    },
    /// Take every resource of `wanted` for `holder` in `room`, all or nothing, in one
    /// store call that does not wait (`Claims::acquire_resources`); answer with
    /// [`Event::ResourcesResult`] for `(key, epoch)`, the task claim the resources are
    /// for. A task with `[uses ...]` is started only once they are won.
    AcquireResources {
        /// The room.
        room: String,
        /// Who takes them (the agent).
        holder: String,
        /// What, in the global order.
        wanted: Vec<crate::resources::Wanted>,
        /// Lease length.
        ttl: Duration,
        /// The task claim they are for.
        key: String,
        /// Its epoch.
        epoch: ClaimEpoch,
    },
    /// Stop the turn; it then ends with [`TurnOutcome::Cancelled`].
    Cancel {
        /// The turn.
        turn: TurnId,
    },
    /// After [`Event::Shutdown`]: every turn has ended; the relay may exit.
    Stopped,
}
