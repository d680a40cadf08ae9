//! What can go wrong, said so that an agent knows what to do next.

use huddle_core::{ClaimEpoch, Timestamp};
use huddle_store::StoreError;

/// An operation's refusal. Every message says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// An argument is malformed.
    #[error("bad argument: {0}")]
    BadArgument(String),
    /// The room has no `room.created`.
    #[error("room {0:?} does not exist in this database; ask its owner to create it (`huddle room create {0} --owner ID`)")]
    NoRoom(String),
    /// No task with this id in the room.
    #[error("no task {0:?} in this room; call `tasks` to see the task ids")]
    NoTask(String),
    /// The task cannot be claimed now (done, abandoned, waiting, not this agent's).
    #[error("task {task:?} cannot be claimed: {why}")]
    NotClaimable {
        /// Task id.
        task: String,
        /// Why, with what to do.
        why: String,
    },
    /// The task cannot be bid on now (the room does not allocate by bids, the window
    /// is closed, the task is not ready, or the agent lacks a needed capability).
    #[error("task {task:?} cannot be bid on: {why}")]
    NotBiddable {
        /// Task id.
        task: String,
        /// Why, with what to do.
        why: String,
    },
    /// Another agent holds the task's claim.
    #[error("task {task:?} is held by {holder} at epoch {epoch} until {expires_at} µs (database clock); pick another task or try again after the lease lapses")]
    HeldBy {
        /// Task id.
        task: String,
        /// The holder.
        holder: String,
        /// Its epoch.
        epoch: ClaimEpoch,
        /// When its lease lapses unless renewed.
        expires_at: Timestamp,
    },
    /// The task is not waiting for this agent's review (another reviewer, no review
    /// gate, or no submission in review).
    #[error("task {task:?} cannot be reviewed by you: {why}")]
    NotReviewable {
        /// Task id.
        task: String,
        /// Why, with what to do.
        why: String,
    },
    /// This agent does not hold the task (never claimed it, or lost it).
    #[error("you do not hold task {task:?}: {why}")]
    NotHolder {
        /// Task id.
        task: String,
        /// Why, with what to do.
        why: String,
    },
    /// The message already has its one reply, or another agent is writing it.
    #[error("message {message} already has its reply: {why}; a message gets one reply (post in its thread without reply_to to add to the conversation)")]
    ReplyTaken {
        /// The message replied to.
        message: String,
        /// Who holds or closed its reply claim.
        why: String,
    },
    /// A write under a claim was refused: the claim lapsed or moved on. Nothing was
    /// recorded.
    #[error("stale claim: {0}")]
    LeaseLost(String),
    /// The store failed (database away, ...). Retrying the same call (with the same
    /// `idempotency_key`) is safe.
    #[error("the database failed: {0}; retrying the same call is safe")]
    Store(#[from] StoreError),
    /// No decision with this id in the room.
    #[error("no decision {0:?} in this room; propose it first, or check the id")]
    NoDecision(String),
    /// No barrier for this phase in the room.
    #[error("no barrier {0:?} in this room; open it with barrier_open first, or check the phase")]
    NoBarrier(String),
    /// A decision id or barrier phase is already used in the room.
    #[error("{what} {name:?} already exists in this room (opened by {by}); pick another name")]
    NameTaken {
        /// `decision` or `barrier`.
        what: &'static str,
        /// The id or phase.
        name: String,
        /// Who opened it.
        by: String,
    },
    /// This agent is not among the voters or the roster.
    #[error("you are not a {what} of {name:?} (listed: {listed}); nothing was written")]
    NotListed {
        /// `voter` or `roster member`.
        what: &'static str,
        /// The decision id or barrier phase.
        name: String,
        /// Who is listed.
        listed: String,
    },
    /// This agent already voted otherwise; a first vote is final.
    #[error("you already voted {option:?} on decision {id:?}; a first vote is final")]
    AlreadyVoted {
        /// The decision id.
        id: String,
        /// The counted vote.
        option: String,
    },
    /// The deadline or timeout passed.
    #[error(
        "too late for {what}: it closed at {deadline} µs (database clock); nothing was written"
    )]
    TooLate {
        /// What was tried.
        what: String,
        /// The deadline.
        deadline: Timestamp,
    },
    /// Another agent holds the lease.
    #[error("lease {name:?} is held by {holder} at epoch {epoch} until {expires_at} µs (database clock); follow its directives, or try again after it lapses")]
    LeaseTaken {
        /// The lease.
        name: String,
        /// The holder.
        holder: String,
        /// Its epoch.
        epoch: ClaimEpoch,
        /// When it lapses unless renewed.
        expires_at: Timestamp,
    },
    /// This agent is not one of the room's `delegators`.
    #[error("you may not create tasks in this room: the room owner allows only its `delegators` ({delegators}); ask the owner to post `!config delegators <you>,...`, or ask a delegator to create the tasks")]
    NotDelegator {
        /// Who may delegate.
        delegators: String,
    },
    /// No approval request with this id in the room.
    #[error("no approval request {0:?} in this room; use the id approval_request returned")]
    NoApproval(String),
    /// A `!delegate` plan with problems; nothing was created.
    #[error("{0}")]
    BadPlan(String),
    /// The room's owner bound this agent to other writers (`!config agents`).
    #[error("{0}")]
    BoundElsewhere(#[from] huddle_core::config::BoundElsewhere),
    /// The room would ignore every row this session writes: it requires signatures
    /// (or registers keys for this writer) and the session does not sign with a
    /// registered key.
    #[error("{0}")]
    UnsignedWriter(#[from] huddle_core::config::binding::UnsignedWriter),
    /// This agent never held the lease.
    #[error("you do not hold lease {name:?}; take it with lease_acquire first")]
    NotLeaseHolder {
        /// The lease.
        name: String,
    },
    /// Resources are held by others; nothing was taken.
    #[error("resources are held by others, so nothing was taken: {held}; wait for them (wait_ms), or take fewer")]
    ResourcesBusy {
        /// What blocks what: each holding with its holder, mode and expiry.
        held: String,
    },
    /// This agent holds no live holding of the resource.
    #[error("you do not hold resource {name:?} (it lapsed, or was never taken); take it with resource_acquire")]
    NotResourceHolder {
        /// The resource.
        name: String,
    },
    /// A put on a version that is no longer current; nothing was written.
    #[error("key {key:?} is at version {current}, not {read}: nothing was written; its value is {value}. Apply your change to that value and put again with if_version {current}")]
    StaleVersion {
        /// The key.
        key: String,
        /// The version the put was based on.
        read: u64,
        /// The current version.
        current: u64,
        /// The current value, as JSON text.
        value: String,
    },
}

impl AgentError {
    /// A short machine-readable code for the error.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::BadArgument(_) => "bad_argument",
            AgentError::NoRoom(_) => "no_room",
            AgentError::NoTask(_) => "no_task",
            AgentError::NotClaimable { .. } => "not_claimable",
            AgentError::NotBiddable { .. } => "not_biddable",
            AgentError::HeldBy { .. } => "held_by_other",
            AgentError::NotHolder { .. } => "not_holder",
            AgentError::NotReviewable { .. } => "not_reviewable",
            AgentError::ReplyTaken { .. } => "reply_taken",
            AgentError::LeaseLost(_) => "stale_claim",
            AgentError::Store(_) => "store",
            AgentError::NoDecision(_) => "no_decision",
            AgentError::NoBarrier(_) => "no_barrier",
            AgentError::NameTaken { .. } => "name_taken",
            AgentError::NotListed { .. } => "not_listed",
            AgentError::AlreadyVoted { .. } => "already_voted",
            AgentError::TooLate { .. } => "too_late",
            AgentError::LeaseTaken { .. } => "lease_held",
            AgentError::NotLeaseHolder { .. } => "not_lease_holder",
            AgentError::NotDelegator { .. } => "not_delegator",
            AgentError::BadPlan(_) => "bad_plan",
            AgentError::NoApproval(_) => "no_approval",
            AgentError::BoundElsewhere(_) => "bound_elsewhere",
            AgentError::UnsignedWriter(_) => "unsigned_writer",
            AgentError::ResourcesBusy { .. } => "resources_busy",
            AgentError::NotResourceHolder { .. } => "not_resource_holder",
            AgentError::StaleVersion { .. } => "stale_version",
        }
    }
}

/// Result of an agent operation.
pub type Result<T> = std::result::Result<T, AgentError>;
