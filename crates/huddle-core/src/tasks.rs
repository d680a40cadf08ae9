//! The task DAG fold: `task.*` interactions folded into tasks, attempts, owners and the
//! ready frontier.
//!
//! ```text
//!            task.created (first wins)
//!                  |
//!                  v
//!   +--------> open --(all deps done)--> ready --task.claimed--> claimed --task.completed--> done
//!   |                                                               |   (owner + epoch only)
//!   +------ task.failed / task.released (owner + epoch), attempts < max
//!                                                                   |
//!              attempts exhausted (or the last claim lapsed) ----> abandoned (+ owner notice)
//! ```
//!
//! Rules (documented with every body schema in `docs/protocol/coordination.md`):
//!
//! - Task ids are scoped per room. The first `task.created` for an id wins; only
//!   interactions with role `owner` or `system` create tasks (agent text is never a
//!   command, so an agent cannot seed work).
//! - A `task.claimed` counts when its epoch is greater than every epoch accepted before
//!   for the task and every dependency is done. A claim that supersedes a live one (a
//!   lapsed claim re-taken, possibly by its former holder) ends the previous attempt.
//! - `task.completed`, `task.failed` and `task.released` count only from the current
//!   owner at the current epoch; anything else is refused (counted, state unchanged).
//! - A failed or released attempt returns the task to ready with one more attempt
//!   used; when `max_attempts` are used the task is abandoned ("failed for good") and
//!   an owner notice is due until a `coord.note` notice for it is folded.
//! - Bodies are parsed defensively: a malformed body is counted and ignored.
//!
//! The state holds no ledger positions and every multi-writer field is merged by the
//! claim epoch, so folding any interleaving that keeps each actor's order and the
//! causal order gives the same [`Fold::state_hash`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};

mod index;

use crate::model::{Interaction, NewInteraction, Role, Timestamp};
use crate::protocol::{ClaimEpoch, CoordNoteBody, NoticeBody};
use crate::verbs::Verb;
pub use index::{FrontierKey, FrontierRank, RoomIndex};

pub use crate::protocol::task::{
    undo_id, valid_capability, valid_task_id, TaskBidBody, TaskCancelledBody, TaskClaimedBody,
    TaskCompletedBody, TaskCreatedBody, TaskEndedBody, TaskRejectedBody, TaskRetriedBody,
    TaskReview, TaskReviewedBody, TaskUse, Verdict, DEFAULT_MAX_ATTEMPTS, DEFAULT_REVIEW_ROUNDS,
    DEFAULT_TASK_PRIORITY, MAX_ATTEMPTS_CAP, MAX_CAPABILITIES, MAX_CAPABILITY_BYTES, MAX_DEPS,
    MAX_LABEL_BYTES, MAX_RESULT_BYTES, MAX_REVIEW_ROUNDS, MAX_TASK_DUE_MS, MAX_TASK_ID_BYTES,
    MAX_TASK_PRIORITY, MAX_TASK_SIZE, MIN_TASK_DUE_MS, UNDO_SUFFIX,
};
pub use crate::protocol::{truncate_text, SYSTEM_ACTOR};

/// The verbs that create a room's tasks or change them (`coord.note` notices only
/// mark tasks already known).
const FOLDED: &[Verb] = &[
    Verb::TaskCreated,
    Verb::TaskBid,
    Verb::TaskRejected,
    Verb::TaskClaimed,
    Verb::TaskCompleted,
    Verb::TaskFailed,
    Verb::TaskReleased,
    Verb::TaskRetried,
    Verb::TaskCancelled,
    Verb::TaskReviewed,
];

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn sorted_unique(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

// ---------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------

/// Where a task is in its life. `ready` is derived (open with every dependency done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Not held by anyone; ready when every dependency is done.
    Open,
    /// Held by `owner` at `epoch`.
    Claimed,
    /// Completed by its owner at its epoch.
    Done,
    /// Failed for good after `max_attempts` attempts.
    Abandoned,
    /// Cancelled by the owner (`!cancel`); `!retry` opens it again.
    Cancelled,
    /// Completed by its owner and waiting for its reviewer's verdict
    /// (`[review @agent]`): accepted, it is done; rejected, it is open again.
    Submitted,
}

impl TaskStatus {
    /// The lowercase name (`open`, `claimed`, `done`, `abandoned`, `cancelled`,
    /// `submitted`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Open => "open",
            TaskStatus::Claimed => "claimed",
            TaskStatus::Done => "done",
            TaskStatus::Abandoned => "abandoned",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Submitted => "submitted",
        }
    }
}

/// A bid as the fold keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskBid {
    /// The bidder.
    pub agent: String,
    /// Declared capabilities, sorted and de-duplicated.
    pub capabilities: Vec<String>,
    /// Declared load.
    pub load: u32,
    /// Database time of the bid.
    pub at: Timestamp,
}

fn default_priority() -> u32 {
    DEFAULT_TASK_PRIORITY
}

fn one() -> u32 {
    1
}

fn one_u64() -> u64 {
    1
}

/// One task of a room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Task id.
    pub id: String,
    /// What to do.
    pub label: String,
    /// Dependencies, sorted and de-duplicated.
    pub deps: Vec<String>,
    /// The `push` assignee.
    pub assignee: Option<String>,
    /// Required capabilities, sorted and de-duplicated.
    pub needs: Vec<String>,
    /// Attempts before the task fails for good.
    pub max_attempts: u32,
    /// Scheduling priority, lower first (default 100).
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// Relative cost, at least 1.
    #[serde(default = "one")]
    pub size: u32,
    /// Its critical path: the longest chain of sizes from it through the tasks of its
    /// `!delegate` that wait for it, its own size included (at least `size`).
    #[serde(default = "one_u64")]
    pub path: u64,
    /// How long each attempt may run, ms, from its claim (`[due ...]`); `None`: no
    /// deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<u64>,
    /// Resources its turn holds while it runs (`[uses ...]`), in the global order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<crate::resources::Wanted>,
    /// Its generation: 0, and one more at every owner's `!retry`. A generation is
    /// claimed under its own keys (`protocol::task_key_at`), and rows about the task
    /// count only for its current generation.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
    /// Its review gate (`[review @agent]`), if any: a completion is then a submission
    /// its reviewer accepts or rejects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<TaskReview>,
    /// Rejections by its reviewer so far (review rounds used).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejections: u32,
    /// The reviewer's feedback on the last rejected submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// The result of the last rejected submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_result: Option<String>,
    /// When the current submission was made (status `submitted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<Timestamp>,
    /// Its compensation's label (`[undo ...]`): run as the task `<id>--undo` if a
    /// task of its chain fails for good or is cancelled after it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
    /// For a compensation (created by the fold, never by a row): the task it undoes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
    /// The command that created it (its `task.created` row's parent): the root of its
    /// trace (`HUDDLE_TRACE`, `huddle trace ROOM ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<crate::model::InteractionId>,
    /// Who created it.
    pub created_by: String,
    /// When it was created (database time).
    pub created_at: Timestamp,
    /// Life-cycle status.
    pub status: TaskStatus,
    /// Attempts started so far (accepted claims).
    pub attempts: u32,
    /// The current owner while claimed; the last owner once done or abandoned.
    pub owner: Option<String>,
    /// The epoch of the latest accepted claim; later claims must exceed it.
    pub epoch: Option<ClaimEpoch>,
    /// When the current attempt was claimed.
    pub claimed_at: Option<Timestamp>,
    /// When it was completed.
    pub done_at: Option<Timestamp>,
    /// When an attempt was last given back (failed, released, or lapsed).
    pub returned_at: Option<Timestamp>,
    /// The result of the completion.
    pub result: Option<String>,
    /// The reason of the last failure or release.
    pub last_reason: Option<String>,
    /// Bids for the next attempt (`attempts + 1`), by agent; cleared by a claim.
    pub bids: BTreeMap<String, TaskBid>,
    /// Losing bidders told so, with the attempt they bid for.
    pub rejected: BTreeMap<String, u32>,
    /// Whether the owner notice for an abandoned task has been folded.
    pub notified: bool,
}

impl Task {
    /// The attempt number the next claim starts.
    pub fn next_attempt(&self) -> u32 {
        self.attempts.saturating_add(1)
    }

    /// Whether the current owner at the current epoch is `(agent, epoch)`.
    pub fn is_held_by(&self, agent: &str, epoch: ClaimEpoch) -> bool {
        self.status == TaskStatus::Claimed
            && self.owner.as_deref() == Some(agent)
            && self.epoch == Some(epoch)
    }
}

/// A dependency that keeps a task from ever running ([`TaskDag::blocked_by`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedBy {
    /// The dependency.
    pub task: String,
    /// Why it cannot finish.
    pub reason: BlockReason,
}

/// Why a dependency cannot finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockReason {
    /// No task of the room has that id.
    Missing,
    /// It failed for good.
    Abandoned,
    /// The owner cancelled it.
    Cancelled,
    /// It cannot run itself: one of its own dependencies cannot finish, or it is part
    /// of a dependency cycle (its own `blocked_by` says which).
    Blocked,
}

impl BlockReason {
    /// `missing`, `abandoned`, `cancelled` or `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::Missing => "missing",
            BlockReason::Abandoned => "abandoned",
            BlockReason::Cancelled => "cancelled",
            BlockReason::Blocked => "blocked",
        }
    }
}

/// Counters of what a room's fold refused, for diagnostics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusals {
    /// Bodies that did not fit their schema.
    pub malformed: u64,
    /// Well-formed interactions that did not apply (unknown task, duplicate creation,
    /// creation by a non-owner, stale epoch, not the owner, not ready, ...).
    pub refused: u64,
}

/// The tasks of one room.
///
/// Its [`RoomIndex`] (frontier, timers, claimed set, counts) is derived from `tasks`
/// as rows are folded; it is not serialised (the state hash covers `tasks` and
/// `refusals` only) and a deserialised value rebuilds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RoomTasksState")]
pub struct RoomTasks {
    /// Tasks by id. Read-only outside the fold: the index follows the fold's changes.
    pub tasks: BTreeMap<String, Task>,
    /// What was refused.
    pub refusals: Refusals,
    #[serde(skip)]
    index: RoomIndex,
    /// How many tasks have an `[undo ...]` (a saga walk is skipped when none does).
    #[serde(skip)]
    undoable: usize,
    /// Tasks that failed for good or were cancelled by the row being folded: their
    /// sagas run once it is folded.
    #[serde(skip)]
    sagas_due: Vec<String>,
}

/// The serialised form of [`RoomTasks`].
#[derive(Deserialize)]
struct RoomTasksState {
    tasks: BTreeMap<String, Task>,
    refusals: Refusals,
}

impl From<RoomTasksState> for RoomTasks {
    fn from(s: RoomTasksState) -> Self {
        let index = RoomIndex::from_scratch(&s.tasks);
        let undoable = s.tasks.values().filter(|t| t.undo.is_some()).count();
        RoomTasks {
            tasks: s.tasks,
            refusals: s.refusals,
            index,
            undoable,
            sagas_due: Vec::new(),
        }
    }
}

/// Counts of a room's tasks by derived state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// All tasks.
    pub total: usize,
    /// Completed.
    pub done: usize,
    /// Held by an owner.
    pub claimed: usize,
    /// Open with every dependency done.
    pub ready: usize,
    /// Open, waiting for dependencies that can still finish.
    pub waiting: usize,
    /// Open, but a dependency is abandoned, missing or in a cycle: it can never run.
    pub blocked: usize,
    /// Failed for good.
    pub abandoned: usize,
    /// Cancelled by the owner.
    #[serde(default)]
    pub cancelled: usize,
    /// Submitted, waiting for their reviewer's verdict.
    #[serde(default)]
    pub submitted: usize,
}

/// The task DAG fold over every room.
///
/// Every query is answered from the rooms' indexes: the frontier, the claimed set,
/// the notices due, readiness times and the summary cost what they return, not a scan
/// of the room. With [`TaskDag::track_changes`] the fold also records which tasks each
/// row touched, so a scheduler can keep its own orders in step
/// ([`TaskDag::take_changes`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskDag {
    rooms: BTreeMap<String, RoomTasks>,
    /// `(room, task)` touched since the last [`TaskDag::take_changes`], when tracked.
    #[serde(skip)]
    changes: Option<BTreeSet<(String, String)>>,
}

impl PartialEq for TaskDag {
    fn eq(&self, other: &Self) -> bool {
        self.rooms == other.rooms
    }
}

impl Eq for TaskDag {}

impl TaskDag {
    /// An empty DAG.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts recording the tasks each folded row touches (created, claimed, done,
    /// given back, abandoned, notified, or made ready by a dependency), for
    /// [`TaskDag::take_changes`].
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(BTreeSet::new);
    }

    /// The `(room, task)` pairs touched since the last call, sorted; empty unless
    /// [`TaskDag::track_changes`] was called.
    pub fn take_changes(&mut self) -> Vec<(String, String)> {
        match &mut self.changes {
            Some(c) => std::mem::take(c).into_iter().collect(),
            None => Vec::new(),
        }
    }

    /// Records every task as touched (when tracked): a scheduler restoring a saved DAG
    /// rebuilds its orders from [`TaskDag::take_changes`] as the fold would.
    pub fn touch_all(&mut self) {
        if let Some(c) = &mut self.changes {
            for (room, r) in &self.rooms {
                for task in r.tasks.keys() {
                    c.insert((room.clone(), task.clone()));
                }
            }
        }
    }

    /// Rooms that have task state, sorted.
    pub fn rooms(&self) -> impl Iterator<Item = &str> {
        self.rooms.keys().map(String::as_str)
    }

    /// A room's tasks.
    pub fn room(&self, room: &str) -> Option<&RoomTasks> {
        self.rooms.get(room)
    }

    /// One task.
    pub fn task(&self, room: &str, task: &str) -> Option<&Task> {
        self.rooms.get(room)?.tasks.get(task)
    }

    /// Whether `task` is ready: open and every dependency done.
    pub fn is_ready(&self, room: &str, task: &str) -> bool {
        self.rooms.get(room).is_some_and(|r| r.index.is_ready(task))
    }

    /// The ready frontier of a room: open tasks whose dependencies are all done and
    /// that nobody holds, in frontier order ([`FrontierKey`]: priority, critical path,
    /// id).
    pub fn ready_frontier(&self, room: &str) -> Vec<&Task> {
        self.frontier(room).collect()
    }

    /// The ready frontier as an iterator, in frontier order: take what you need.
    pub fn frontier(&self, room: &str) -> impl Iterator<Item = &Task> + '_ {
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.index.frontier().filter_map(move |k| r.tasks.get(&k.id)))
    }

    /// How many tasks of the room are ready.
    pub fn frontier_len(&self, room: &str) -> usize {
        self.rooms.get(room).map_or(0, |r| r.index.frontier_len())
    }

    /// Why an open `task` can never run: each of its dependencies that cannot finish,
    /// with the reason. Empty unless the task is blocked. Costs its dependencies.
    pub fn blocked_by(&self, room: &str, task: &str) -> Vec<BlockedBy> {
        let Some(r) = self.rooms.get(room) else {
            return Vec::new();
        };
        let Some(t) = r.tasks.get(task).filter(|_| r.index.is_blocked(task)) else {
            return Vec::new();
        };
        t.deps
            .iter()
            .filter_map(|d| {
                let reason = match r.tasks.get(d) {
                    None => BlockReason::Missing,
                    Some(dep) if dep.status == TaskStatus::Abandoned => BlockReason::Abandoned,
                    Some(dep) if dep.status == TaskStatus::Cancelled => BlockReason::Cancelled,
                    Some(_) if r.index.can_finish(d) == Some(false) => BlockReason::Blocked,
                    Some(_) => return None,
                };
                Some(BlockedBy {
                    task: d.clone(),
                    reason,
                })
            })
            .collect()
    }

    /// The frontier key of `task` while it is ready.
    pub fn frontier_key(&self, room: &str, task: &str) -> Option<&FrontierKey> {
        self.rooms.get(room)?.index.frontier_key(task)
    }

    /// Tasks currently held by an owner, sorted by id.
    pub fn claimed(&self, room: &str) -> Vec<&Task> {
        self.claimed_except(room, |_| false).collect()
    }

    /// The claimed tasks of the room but those whose id `skip` picks, looked up only
    /// once past it (a scheduling pass skips the tasks it runs or holds itself).
    pub fn claimed_except<'a>(
        &'a self,
        room: &str,
        skip: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Task> + 'a {
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.index.claimed().map(move |id| (r, id)))
            .filter(move |(_, id)| !skip(id))
            .filter_map(|(r, id)| r.tasks.get(id))
    }

    /// The claimed tasks of the room a re-take pass may probe (plan 0089), sorted by
    /// id, each once: those without an owner or held by an owner `local` names, and
    /// the others only once claimed at least `lease_us` before `now` (or at an unknown
    /// time) — another relay's claim younger than a lease cannot have lapsed — but
    /// those whose id `skip` picks (looked up only past it). Costs what it returns,
    /// plus the local owners' claims: not a walk of the claimed set.
    pub fn claimed_for_retake<'a>(
        &'a self,
        room: &str,
        now: Timestamp,
        lease_us: i64,
        local: impl IntoIterator<Item = &'a str>,
        skip: impl Fn(&str) -> bool,
    ) -> Vec<&'a Task> {
        let Some(r) = self.rooms.get(room) else {
            return Vec::new();
        };
        let mut ids: Vec<&str> = r.index.claimed_by("").collect();
        for owner in local {
            ids.extend(r.index.claimed_by(owner));
        }
        ids.extend(
            r.index
                .claimed_by_time()
                .take_while(|(at, _)| at.is_none_or(|at| now >= at.saturating_add(lease_us)))
                .map(|(_, id)| id),
        );
        ids.retain(|id| !skip(id));
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| r.tasks.get(id)).collect()
    }

    /// When `task` became ready: the latest of its creation, its dependencies'
    /// completions and its last give-back. `None` when it is not ready.
    pub fn ready_since(&self, room: &str, task: &str) -> Option<Timestamp> {
        self.rooms.get(room)?.index.ready_since(task)
    }

    /// Ready tasks of the room that became ready at or after `from`, earliest first
    /// (ties by id): for timers that fall due a fixed time after readiness.
    pub fn ready_since_from(
        &self,
        room: &str,
        from: Timestamp,
    ) -> impl Iterator<Item = (Timestamp, &Task)> + '_ {
        self.rooms.get(room).into_iter().flat_map(move |r| {
            r.index
                .ready_since_from(from)
                .filter_map(move |(at, id)| r.tasks.get(id).map(|t| (at, t)))
        })
    }

    /// Abandoned tasks whose owner notice has not been folded yet, sorted by id.
    pub fn notices_due(&self, room: &str) -> Vec<&Task> {
        self.rooms
            .get(room)
            .map(|r| {
                r.index
                    .notices_due()
                    .filter_map(|id| r.tasks.get(id))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether no task of the room is ready, claimed or in review (the task half of
    /// quiescence).
    pub fn is_settled(&self, room: &str) -> bool {
        let s = self.summary(room);
        s.ready == 0 && s.claimed == 0 && s.submitted == 0
    }

    /// Submitted tasks waiting for their reviewer's verdict, sorted by id.
    pub fn in_review(&self, room: &str) -> impl Iterator<Item = &Task> + '_ {
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.index.in_review().filter_map(move |id| r.tasks.get(id)))
    }

    /// Counts of the room's tasks by derived state.
    pub fn summary(&self, room: &str) -> TaskSummary {
        self.rooms
            .get(room)
            .map(|r| r.index.summary())
            .unwrap_or_default()
    }

    /// The `coord.note` notice that tells the room owner `task` failed for good. Its
    /// content depends only on the folded task, so every relay that appends it writes
    /// the same interaction (the ledger keeps one).
    pub fn abandon_notice(&self, room: &str, task: &str) -> Option<NewInteraction> {
        let t = self.task(room, task)?;
        if t.status != TaskStatus::Abandoned {
            return None;
        }
        let reason = t.last_reason.as_deref().unwrap_or("no reason given");
        let body = CoordNoteBody::Notice(NoticeBody {
            about: NoticeBody::TASK_ABANDONED.to_string(),
            to: Some("owner".to_string()),
            task: Some(t.id.clone()),
            text: format!(
                "task {} ({}) failed for good after {} attempt(s); last: {}",
                t.id,
                truncate_text(&t.label, 200),
                t.attempts,
                truncate_text(reason, 500)
            ),
        });
        Some(NewInteraction::new(
            room,
            Verb::CoordNote,
            SYSTEM_ACTOR,
            Role::System,
            body.to_body(),
        ))
    }
}

impl RoomTasks {
    fn is_ready(&self, t: &Task) -> bool {
        self.index.is_ready(&t.id)
    }

    fn deps_done(&self, t: &Task) -> bool {
        t.deps.iter().all(|d| {
            self.tasks
                .get(d)
                .is_some_and(|d| d.status == TaskStatus::Done)
        })
    }

    /// Re-derives the index entries of task `id` after the fold changed it, and notes
    /// a saga to run when it just failed for good or was cancelled.
    fn touch(&mut self, id: &str) {
        let was_final = self.index.is_final(id);
        self.index.touch(&self.tasks, id);
        if !was_final && self.index.is_final(id) {
            self.sagas_due.push(id.to_string());
        }
    }

    fn refuse(&mut self) {
        self.refusals.refused += 1;
    }

    fn malformed(&mut self) {
        self.refusals.malformed += 1;
    }

    fn apply(&mut self, i: &Interaction) {
        self.dispatch(i);
        for id in std::mem::take(&mut self.sagas_due) {
            self.saga(&id, i.at);
        }
    }

    fn dispatch(&mut self, i: &Interaction) {
        match i.verb {
            Verb::TaskCreated => self.created(i),
            Verb::TaskBid => self.bid(i),
            Verb::TaskRejected => self.rejected(i),
            Verb::TaskClaimed => self.claimed(i),
            Verb::TaskCompleted => self.completed(i),
            Verb::TaskFailed | Verb::TaskReleased => self.given_back(i),
            Verb::TaskRetried => self.retried(i),
            Verb::TaskCancelled => self.cancelled(i),
            Verb::TaskReviewed => self.reviewed(i),
            Verb::CoordNote => self.note(i),
            _ => {}
        }
    }

    fn created(&mut self, i: &Interaction) {
        let Some(b) = TaskCreatedBody::parse(&i.body) else {
            return self.malformed();
        };
        let Some(uses) = wanted_uses(&b.uses) else {
            return self.malformed();
        };
        // Agents' rows are a delegator's `!delegate`: which rows count is the owner
        // authority's call (`commands::OwnerAuthority`), before this fold sees them.
        if !matches!(i.role, Role::Owner | Role::System | Role::Agent)
            || self.tasks.contains_key(&b.task)
        {
            return self.refuse();
        }
        let max_attempts = b
            .max_attempts
            .unwrap_or(DEFAULT_MAX_ATTEMPTS)
            .clamp(1, MAX_ATTEMPTS_CAP);
        let size = b.size.unwrap_or(1).clamp(1, MAX_TASK_SIZE);
        let task = Task {
            id: b.task.clone(),
            label: b.label,
            deps: sorted_unique(b.deps),
            assignee: b.assignee,
            needs: sorted_unique(b.needs),
            max_attempts,
            priority: b
                .priority
                .unwrap_or(DEFAULT_TASK_PRIORITY)
                .min(MAX_TASK_PRIORITY),
            size,
            path: b.path.unwrap_or(0).max(u64::from(size)),
            due_ms: b.due_ms.map(|d| d.clamp(MIN_TASK_DUE_MS, MAX_TASK_DUE_MS)),
            uses,
            generation: 0,
            review: b.review.map(|r| TaskReview {
                agent: r.agent,
                rounds: r.rounds.clamp(1, MAX_REVIEW_ROUNDS),
            }),
            rejections: 0,
            feedback: None,
            rejected_result: None,
            submitted_at: None,
            undo: b.undo.map(|u| u.trim().to_string()),
            compensates: None,
            command: i.parent,
            created_by: i.actor.clone(),
            created_at: i.at,
            status: TaskStatus::Open,
            attempts: 0,
            owner: None,
            epoch: None,
            claimed_at: None,
            done_at: None,
            returned_at: None,
            result: None,
            last_reason: None,
            bids: BTreeMap::new(),
            rejected: BTreeMap::new(),
            notified: false,
        };
        let id = b.task.clone();
        if task.undo.is_some() {
            self.undoable += 1;
        }
        self.tasks.insert(b.task, task);
        self.index.created(&self.tasks, &id);
    }

    /// The saga of a task that just became abandoned or cancelled: every completed
    /// task of its chain (its upstream closure) with an `[undo ...]` and no
    /// compensation yet gets one, the task `<t>--undo`, waiting for the compensations
    /// of the nearest completed-with-undo tasks that wait for `t` within the chain, so
    /// compensations run in reverse order. Rooms without any `undo` pay nothing.
    fn saga(&mut self, failed: &str, at: Timestamp) {
        if self.undoable == 0 {
            return;
        }
        // The chain: `failed` and everything it waits for, directly or not.
        let mut chain: BTreeSet<String> = BTreeSet::new();
        let mut todo = vec![failed.to_string()];
        while let Some(id) = todo.pop() {
            if !chain.insert(id.clone()) {
                continue;
            }
            if let Some(t) = self.tasks.get(&id) {
                todo.extend(t.deps.iter().cloned());
            }
        }
        let compensable = |t: &Task| t.status == TaskStatus::Done && t.undo.is_some();
        // Tasks of the chain whose compensation is made now or exists already.
        let compensated: BTreeSet<String> = chain
            .iter()
            .filter(|id| {
                self.tasks
                    .get(*id)
                    .is_some_and(|t| compensable(t) || self.tasks.contains_key(&undo_id(&t.id)))
            })
            .cloned()
            .collect();
        let new: Vec<String> = compensated
            .iter()
            .filter(|id| !self.tasks.contains_key(&undo_id(id)))
            .cloned()
            .collect();
        for id in new {
            // The nearest compensated tasks that wait for `id` inside the chain.
            let mut deps: BTreeSet<String> = BTreeSet::new();
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut walk = self.index.dependents_of(&id);
            while let Some(d) = walk.pop() {
                if !chain.contains(&d) || !seen.insert(d.clone()) {
                    continue;
                }
                if compensated.contains(&d) {
                    deps.insert(undo_id(&d));
                } else {
                    walk.extend(self.index.dependents_of(&d));
                }
            }
            let Some(t) = self.tasks.get(&id) else {
                continue;
            };
            let undo = t.undo.clone().unwrap_or_default();
            let c = Task {
                id: undo_id(&id),
                label: truncate_text(&format!("undo {id}: {undo}"), MAX_LABEL_BYTES),
                deps: deps.into_iter().collect(),
                assignee: None,
                needs: t.needs.clone(),
                max_attempts: t.max_attempts,
                priority: t.priority,
                size: t.size,
                path: u64::from(t.size),
                due_ms: t.due_ms,
                uses: t.uses.clone(),
                generation: 0,
                review: None,
                rejections: 0,
                feedback: None,
                rejected_result: None,
                submitted_at: None,
                undo: None,
                compensates: Some(id.clone()),
                command: t.command,
                created_by: SYSTEM_ACTOR.to_string(),
                created_at: at,
                status: TaskStatus::Open,
                attempts: 0,
                owner: None,
                epoch: None,
                claimed_at: None,
                done_at: None,
                returned_at: None,
                result: None,
                last_reason: None,
                bids: BTreeMap::new(),
                rejected: BTreeMap::new(),
                notified: false,
            };
            let cid = c.id.clone();
            self.tasks.insert(cid.clone(), c);
            self.index.created(&self.tasks, &cid);
        }
    }

    fn bid(&mut self, i: &Interaction) {
        let Some(b) = TaskBidBody::parse(&i.body) else {
            return self.malformed();
        };
        let ready = match self.tasks.get(&b.task) {
            Some(t) => self.is_ready(t) && b.attempt == t.next_attempt(),
            None => false,
        };
        if !ready {
            return self.refuse();
        }
        if b.decline {
            // A decline is the agent's answer, not a bid: nothing to award.
            return;
        }
        if let Some(t) = self.tasks.get_mut(&b.task) {
            // The first bid of each agent for an attempt counts.
            t.bids.entry(i.actor.clone()).or_insert_with(|| TaskBid {
                agent: i.actor.clone(),
                capabilities: sorted_unique(b.capabilities),
                load: b.load,
                at: i.at,
            });
        }
    }

    fn rejected(&mut self, i: &Interaction) {
        let Some(b) = TaskRejectedBody::parse(&i.body) else {
            return self.malformed();
        };
        match self.tasks.get_mut(&b.task) {
            Some(t) if t.owner.as_deref() == Some(i.actor.as_str()) && b.attempt == t.attempts => {
                let e = t.rejected.entry(b.agent).or_insert(b.attempt);
                *e = (*e).max(b.attempt);
            }
            _ => self.refuse(),
        }
    }

    fn claimed(&mut self, i: &Interaction) {
        let Some(b) = TaskClaimedBody::parse(&i.body) else {
            return self.malformed();
        };
        let acceptable = match self.tasks.get(&b.task) {
            Some(t) => {
                matches!(t.status, TaskStatus::Open | TaskStatus::Claimed)
                    && b.generation == t.generation
                    && t.epoch.is_none_or(|e| b.epoch > e)
                    && self.deps_done(t)
            }
            None => false,
        };
        let Some(t) = self.tasks.get_mut(&b.task).filter(|_| acceptable) else {
            return self.refuse();
        };
        t.epoch = Some(b.epoch);
        t.bids.clear();
        if t.status == TaskStatus::Claimed {
            // A later claim supersedes a live one: the previous holder's lease lapsed
            // and it was re-taken, so the previous attempt is over.
            t.returned_at = Some(t.returned_at.map_or(i.at, |r| r.max(i.at)));
            t.last_reason = Some("claim lapsed and was re-taken".to_string());
        }
        if t.attempts >= t.max_attempts {
            t.status = TaskStatus::Abandoned;
            t.owner = None;
        } else {
            t.attempts += 1;
            t.status = TaskStatus::Claimed;
            t.owner = Some(i.actor.clone());
            t.claimed_at = Some(i.at);
        }
        self.touch(&b.task);
    }

    fn completed(&mut self, i: &Interaction) {
        let Some(b) = TaskCompletedBody::parse(&i.body) else {
            return self.malformed();
        };
        match self.tasks.get_mut(&b.task) {
            Some(t) if t.is_held_by(&i.actor, b.epoch) && b.generation == t.generation => {
                t.result = b.result.map(|r| truncate_text(&r, MAX_RESULT_BYTES));
                if t.review.is_some() {
                    // A submission: its reviewer decides (the owner stays the
                    // submitter).
                    t.status = TaskStatus::Submitted;
                    t.submitted_at = Some(i.at);
                } else {
                    t.status = TaskStatus::Done;
                    t.done_at = Some(i.at);
                }
                self.touch(&b.task);
            }
            _ => self.refuse(),
        }
    }

    fn given_back(&mut self, i: &Interaction) {
        let Some(b) = TaskEndedBody::parse(&i.body) else {
            return self.malformed();
        };
        match self.tasks.get_mut(&b.task) {
            Some(t) if t.is_held_by(&i.actor, b.epoch) && b.generation == t.generation => {
                t.returned_at = Some(i.at);
                t.last_reason = Some(truncate_text(&b.reason, MAX_RESULT_BYTES));
                t.status = if t.attempts >= t.max_attempts {
                    TaskStatus::Abandoned
                } else {
                    t.owner = None;
                    TaskStatus::Open
                };
                self.touch(&b.task);
            }
            _ => self.refuse(),
        }
    }

    /// The owner's `!retry`: an abandoned or cancelled task is open again, with
    /// `attempts` more attempts and a new generation (fresh claim keys: the old ones
    /// are closed or stale). Anything else is refused.
    fn retried(&mut self, i: &Interaction) {
        let Some(b) = TaskRetriedBody::parse(&i.body) else {
            return self.malformed();
        };
        if !matches!(i.role, Role::Owner | Role::System) {
            return self.refuse();
        }
        match self.tasks.get_mut(&b.task) {
            Some(t) if matches!(t.status, TaskStatus::Abandoned | TaskStatus::Cancelled) => {
                t.status = TaskStatus::Open;
                t.generation = t.generation.saturating_add(1);
                t.max_attempts = t.attempts.saturating_add(b.attempts);
                t.epoch = None;
                t.owner = None;
                t.claimed_at = None;
                t.bids.clear();
                t.notified = false;
                t.returned_at = Some(t.returned_at.map_or(i.at, |r| r.max(i.at)));
                t.last_reason = Some(format!("retried by {} (!retry)", i.actor));
                self.touch(&b.task);
            }
            _ => self.refuse(),
        }
    }

    /// The reviewer's verdict on a submission: accepted, the task is done with the
    /// submitted result; rejected, it is open again as a new generation (fresh claim
    /// keys: the submission closed the old ones) with one more attempt allowed, unless
    /// that was the last round: then it is abandoned. Only from the task's reviewer,
    /// while it is submitted, at its generation.
    fn reviewed(&mut self, i: &Interaction) {
        let Some(b) = TaskReviewedBody::parse(&i.body) else {
            return self.malformed();
        };
        let Some(t) = self.tasks.get_mut(&b.task) else {
            return self.refuse();
        };
        let from_reviewer = t
            .review
            .as_ref()
            .is_some_and(|r| r.agent == i.actor && i.role == Role::Agent);
        if !from_reviewer || t.status != TaskStatus::Submitted || b.generation != t.generation {
            return self.refuse();
        }
        let feedback = truncate_text(b.feedback.trim(), MAX_RESULT_BYTES);
        match b.verdict {
            Verdict::Accept => {
                t.status = TaskStatus::Done;
                t.done_at = Some(i.at);
            }
            Verdict::Reject => {
                t.rejections = t.rejections.saturating_add(1);
                let rounds = t.review.as_ref().map_or(1, |r| r.rounds);
                let said = if feedback.is_empty() {
                    "no feedback".to_string()
                } else {
                    truncate_text(&feedback, 500)
                };
                t.rejected_result = t.result.take();
                t.feedback = Some(feedback);
                t.submitted_at = None;
                t.last_reason = Some(format!(
                    "rejected by {} (review round {} of {rounds}): {said}",
                    i.actor, t.rejections
                ));
                if t.rejections >= rounds {
                    t.status = TaskStatus::Abandoned;
                } else {
                    t.status = TaskStatus::Open;
                    t.generation = t.generation.saturating_add(1);
                    // A rejection does not use the failure budget.
                    t.max_attempts = t.max_attempts.saturating_add(1);
                    t.epoch = None;
                    t.owner = None;
                    t.claimed_at = None;
                    t.bids.clear();
                    t.returned_at = Some(t.returned_at.map_or(i.at, |r| r.max(i.at)));
                }
            }
        }
        self.touch(&b.task);
    }

    /// The owner's `!cancel`: the task (and with `dependants` every task that waits
    /// for it, directly or not) is cancelled unless done. A task claimed at the time
    /// is cancelled too: its relay stops the turn, and its ending rows are refused.
    fn cancelled(&mut self, i: &Interaction) {
        let Some(b) = TaskCancelledBody::parse(&i.body) else {
            return self.malformed();
        };
        if !matches!(i.role, Role::Owner | Role::System) || !self.tasks.contains_key(&b.task) {
            return self.refuse();
        }
        let mut todo = vec![b.task.clone()];
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut changed = false;
        while let Some(id) = todo.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            if b.dependants {
                todo.extend(self.index.dependents_of(&id));
            }
            let Some(t) = self.tasks.get_mut(&id) else {
                continue;
            };
            if matches!(t.status, TaskStatus::Done | TaskStatus::Cancelled) {
                continue;
            }
            t.status = TaskStatus::Cancelled;
            t.owner = None;
            t.bids.clear();
            t.last_reason = Some(if id == b.task {
                format!("cancelled by {} (!cancel)", i.actor)
            } else {
                format!(
                    "cancelled by {} with {} (!cancel ... with dependants)",
                    i.actor, b.task
                )
            });
            changed = true;
            self.touch(&id);
        }
        if !changed {
            self.refuse();
        }
    }

    fn note(&mut self, i: &Interaction) {
        if !matches!(i.role, Role::System | Role::Owner) {
            return;
        }
        if let Some(CoordNoteBody::Notice(n)) = CoordNoteBody::parse(&i.body) {
            if n.about == NoticeBody::TASK_ABANDONED {
                if let Some(id) = n.task {
                    if let Some(t) = self.tasks.get_mut(&id) {
                        t.notified = true;
                        self.touch(&id);
                    }
                }
            }
        }
    }
}

/// A task's `uses` as resources in the global order; `None` when a name or mode is
/// malformed, one is named twice, or there are too many.
pub fn wanted_uses(uses: &[TaskUse]) -> Option<Vec<crate::resources::Wanted>> {
    use crate::resources::{ordered, Mode, ResourceName, Wanted};
    if uses.is_empty() {
        return Some(Vec::new());
    }
    let wanted = uses
        .iter()
        .map(|u| {
            Some(Wanted {
                name: ResourceName::parse(&u.name).ok()?,
                mode: Mode::parse(&u.mode).ok()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    ordered(wanted).ok()
}

impl Fold for TaskDag {
    fn apply(&mut self, interaction: &Interaction) {
        let room = if FOLDED.contains(&interaction.verb) {
            let tracked = self.changes.is_some();
            let r = self.rooms.entry(interaction.room.clone()).or_default();
            if tracked {
                r.index.keep_journal();
            }
            r
        } else if interaction.verb == Verb::CoordNote {
            match self.rooms.get_mut(&interaction.room) {
                Some(r) => r,
                None => return,
            }
        } else {
            return;
        };
        room.apply(interaction);
        if let Some(changes) = &mut self.changes {
            for id in room.index.take_journal() {
                changes.insert((interaction.room.clone(), id));
            }
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // case tables
mod tests {
    use super::*;
    use crate::testing::{
        bid, claimed, completed, created, every_pair, failed, gen_history, hashes_in_two_orders,
        history_and_order, ix, linearize, Ledger,
    };
    use proptest::prelude::*;
    use serde_json::json;

    /// Folds `rows` (at = 1 s, 2 s, ...) and returns the DAG.
    fn fold(rows: Vec<NewInteraction>) -> TaskDag {
        let mut l = Ledger::default();
        for (n, r) in rows.into_iter().enumerate() {
            l.push(r, Timestamp((n as i64 + 1) * 1_000_000));
        }
        TaskDag::rebuild(&l.rows)
    }

    fn frontier(dag: &TaskDag) -> Vec<&str> {
        dag.ready_frontier("lobby")
            .into_iter()
            .map(|t| t.id.as_str())
            .collect()
    }

    fn status(dag: &TaskDag, id: &str) -> Option<TaskStatus> {
        dag.task("lobby", id).map(|t| t.status)
    }

    fn refused(dag: &TaskDag) -> u64 {
        dag.room("lobby").map_or(0, |r| r.refusals.refused)
    }

    #[test]
    fn frontier_follows_dependencies_and_is_sorted() {
        // (history, expected frontier)
        let cases: Vec<(Vec<NewInteraction>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![created("b", &[]), created("a", &[])], vec!["a", "b"]),
            (vec![created("a", &[]), created("b", &["a"])], vec!["a"]),
            (
                vec![
                    created("a", &[]),
                    created("b", &["a"]),
                    claimed("a", "bo", 1),
                ],
                vec![],
            ),
            (
                vec![
                    created("a", &[]),
                    created("b", &["a"]),
                    claimed("a", "bo", 1),
                    completed("a", "bo", 1),
                ],
                vec!["b"],
            ),
            // A dependency created later is still a dependency.
            (vec![created("b", &["a"])], vec![]),
            (vec![created("b", &["a"]), created("a", &[])], vec!["a"]),
            // Failure returns the task to the frontier.
            (
                vec![
                    created("a", &[]),
                    claimed("a", "bo", 1),
                    failed("a", "bo", 1),
                ],
                vec!["a"],
            ),
        ];
        for (i, (rows, want)) in cases.into_iter().enumerate() {
            let dag = fold(rows);
            assert_eq!(frontier(&dag), want, "case {i}");
        }
    }

    #[test]
    fn frontier_goes_by_priority_then_critical_path_then_id() {
        let task = |id: &str, extra: serde_json::Value| {
            let mut body = json!({"task": id, "label": "x"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            ix(Verb::TaskCreated, "ana", Role::Owner, body)
        };
        let dag = fold(vec![
            task("a", json!({})),
            task("b", json!({"path": 5, "size": 1})),
            task("c", json!({"size": 3})),
            task("d", json!({"priority": 7})),
            task("e", json!({"priority": 7, "path": 2})),
            task("f", json!({"priority": 100_000, "size": 9})),
        ]);
        // Priority 7 first (the longer path of e before d), then the default 100 by
        // path (b 5, c 3, a 1); f's priority is clamped to 1000 and goes last.
        assert_eq!(frontier(&dag), ["e", "d", "b", "c", "a", "f"]);
        let f = dag.task("lobby", "f").unwrap();
        assert_eq!((f.priority, f.size, f.path), (MAX_TASK_PRIORITY, 9, 9));
        // A path hint below the size is the size.
        let a = dag.task("lobby", "a").unwrap();
        assert_eq!((a.priority, a.size, a.path), (DEFAULT_TASK_PRIORITY, 1, 1));
    }

    #[test]
    fn blocked_tasks_name_what_blocks_them() {
        let dag = fold(vec![
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "x", "max_attempts": 1}),
            ),
            claimed("a", "bo", 1),
            failed("a", "bo", 1),
            created("b", &["a"]),
            created("c", &["b", "x", "ok"]),
            created("ok", &[]),
            created("d", &["e"]),
            created("e", &["d"]),
            created("w", &["ok"]),
        ]);
        let by = |id: &str| -> Vec<(String, &str)> {
            dag.blocked_by("lobby", id)
                .into_iter()
                .map(|b| (b.task, b.reason.as_str()))
                .collect()
        };
        let pairs = |v: &[(&str, &'static str)]| -> Vec<(String, &'static str)> {
            v.iter().map(|(t, r)| (t.to_string(), *r)).collect()
        };
        assert_eq!(status(&dag, "a"), Some(TaskStatus::Abandoned));
        assert_eq!(by("b"), pairs(&[("a", "abandoned")]));
        assert_eq!(by("c"), pairs(&[("b", "blocked"), ("x", "missing")]));
        // A cycle: each waits for one that cannot finish.
        assert_eq!(by("d"), pairs(&[("e", "blocked")]));
        assert_eq!(by("e"), pairs(&[("d", "blocked")]));
        // Waiting, ready, abandoned or unknown tasks are not blocked.
        for id in ["w", "ok", "a", "nope"] {
            assert!(by(id).is_empty(), "{id}");
        }
        assert_eq!(dag.summary("lobby").blocked, 4);
    }

    #[test]
    fn creation_first_wins_and_only_owners_system_or_delegators_create() {
        let dag = fold(vec![
            created("a", &[]),
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "other"}),
            ),
            ix(
                Verb::TaskCreated,
                "bo",
                Role::Agent,
                json!({"task": "z", "label": "evil"}),
            ),
            ix(
                Verb::TaskCreated,
                "hu",
                Role::Human,
                json!({"task": "y", "label": "not owner"}),
            ),
            ix(
                Verb::TaskCreated,
                "huddle",
                Role::System,
                json!({"task": "s", "label": "sys"}),
            ),
        ]);
        assert_eq!(dag.task("lobby", "a").unwrap().label, "do a");
        // An agent's row is a delegator's task: readers fold it only when the owner
        // authority admitted it (`commands::OwnerAuthority`).
        assert!(dag.task("lobby", "z").is_some());
        assert!(dag.task("lobby", "y").is_none());
        assert!(dag.task("lobby", "s").is_some());
        assert_eq!(refused(&dag), 2);
    }

    #[test]
    fn completion_counts_only_from_owner_at_current_epoch() {
        // (extra rows after `a` is claimed by bo at epoch 2, expected status, refused)
        let cases: Vec<(Vec<NewInteraction>, TaskStatus, u64)> = vec![
            (vec![completed("a", "bo", 2)], TaskStatus::Done, 0),
            (vec![completed("a", "cy", 2)], TaskStatus::Claimed, 1),
            (vec![completed("a", "bo", 1)], TaskStatus::Claimed, 1),
            (vec![completed("a", "bo", 3)], TaskStatus::Claimed, 1),
            (vec![failed("a", "cy", 2)], TaskStatus::Claimed, 1),
            // Re-taken by cy at 3: bo's late completion no longer counts, cy's does.
            (
                vec![claimed("a", "cy", 3), completed("a", "bo", 2)],
                TaskStatus::Claimed,
                1,
            ),
            (
                vec![claimed("a", "cy", 3), completed("a", "cy", 3)],
                TaskStatus::Done,
                0,
            ),
            // A second completion is refused.
            (
                vec![completed("a", "bo", 2), completed("a", "bo", 2)],
                TaskStatus::Done,
                1,
            ),
            // A stale claim is refused.
            (vec![claimed("a", "cy", 2)], TaskStatus::Claimed, 1),
        ];
        for (i, (extra, want, want_refused)) in cases.into_iter().enumerate() {
            let mut rows = vec![created("a", &[]), claimed("a", "bo", 2)];
            rows.extend(extra);
            let dag = fold(rows);
            assert_eq!(status(&dag, "a"), Some(want), "case {i}");
            assert_eq!(refused(&dag), want_refused, "case {i}");
        }
    }

    #[test]
    fn claims_need_a_ready_task() {
        let dag = fold(vec![
            claimed("ghost", "bo", 1),
            created("a", &[]),
            created("b", &["a"]),
            claimed("b", "bo", 1),
        ]);
        assert_eq!(status(&dag, "b"), Some(TaskStatus::Open));
        assert_eq!(refused(&dag), 2);
    }

    #[test]
    fn attempts_run_out_and_the_owner_is_told() {
        let mut rows = vec![ix(
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            json!({"task": "a", "label": "flaky", "max_attempts": 2}),
        )];
        rows.extend([claimed("a", "bo", 1), failed("a", "bo", 1)]);
        let dag = fold(rows.clone());
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (t.status, t.attempts, t.next_attempt()),
            (TaskStatus::Open, 1, 2)
        );
        assert!(dag.notices_due("lobby").is_empty());

        rows.extend([claimed("a", "cy", 2), failed("a", "cy", 2)]);
        let dag = fold(rows.clone());
        assert_eq!(status(&dag, "a"), Some(TaskStatus::Abandoned));
        assert!(frontier(&dag).is_empty());
        assert_eq!(dag.notices_due("lobby").len(), 1);
        let notice = dag.abandon_notice("lobby", "a").unwrap();
        assert_eq!(notice.actor, SYSTEM_ACTOR);
        assert!(notice.body["text"].as_str().unwrap().contains("2 attempt"));

        rows.push(notice);
        let dag = fold(rows);
        assert!(dag.notices_due("lobby").is_empty());
    }

    #[test]
    fn a_retake_on_the_last_attempt_abandons() {
        let dag = fold(vec![
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "x", "max_attempts": 1}),
            ),
            claimed("a", "bo", 1),
            claimed("a", "cy", 2),
        ]);
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!((t.status, t.owner.clone()), (TaskStatus::Abandoned, None));
    }

    #[test]
    fn a_retake_starts_a_new_attempt() {
        let dag = fold(vec![
            created("a", &[]),
            claimed("a", "bo", 1),
            claimed("a", "bo", 2),
        ]);
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (t.attempts, t.epoch, t.owner.as_deref()),
            (2, Some(ClaimEpoch(2)), Some("bo"))
        );
    }

    #[test]
    fn bids_count_only_for_the_next_attempt_of_a_ready_task() {
        let dag = fold(vec![
            created("a", &[]),
            created("b", &["a"]),
            bid("a", "bo", 1, &["rust"], 0),
            bid("a", "bo", 1, &["go"], 5),
            bid("a", "cy", 2, &[], 0),
            bid("b", "cy", 1, &[], 0),
        ]);
        let a = dag.task("lobby", "a").unwrap();
        assert_eq!(a.bids.keys().collect::<Vec<_>>(), vec!["bo"]);
        assert_eq!(a.bids["bo"].capabilities, vec!["rust"]);
        assert_eq!(refused(&dag), 2);

        // A decline is accepted and is not a bid.
        let dag = fold(vec![
            created("a", &[]),
            ix(
                Verb::TaskBid,
                "cy",
                Role::Agent,
                json!({"task": "a", "attempt": 1, "load": 0, "decline": true}),
            ),
            bid("a", "bo", 1, &[], 3),
        ]);
        let a = dag.task("lobby", "a").unwrap();
        assert_eq!(a.bids.keys().collect::<Vec<_>>(), vec!["bo"]);
        assert_eq!(refused(&dag), 0);

        let dag = fold(vec![
            created("a", &[]),
            bid("a", "bo", 1, &[], 0),
            bid("a", "cy", 1, &[], 0),
            claimed("a", "bo", 1),
            ix(
                Verb::TaskRejected,
                "bo",
                Role::Agent,
                json!({"task": "a", "attempt": 1, "agent": "cy", "winner": "bo"}),
            ),
        ]);
        let a = dag.task("lobby", "a").unwrap();
        assert!(a.bids.is_empty());
        assert_eq!(a.rejected.get("cy"), Some(&1));
    }

    #[test]
    fn summary_and_ready_since() {
        let mut l = Ledger::default();
        l.push(created("a", &[]), Timestamp(10));
        l.push(created("b", &["a"]), Timestamp(20));
        l.push(created("c", &["x"]), Timestamp(30));
        l.push(created("d", &["d2"]), Timestamp(31));
        l.push(
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "d2", "label": "x", "max_attempts": 1}),
            ),
            Timestamp(32),
        );
        l.push(claimed("d2", "bo", 1), Timestamp(33));
        l.push(failed("d2", "bo", 1), Timestamp(34));
        l.push(claimed("a", "bo", 1), Timestamp(40));
        l.push(completed("a", "bo", 1), Timestamp(50));
        let dag = TaskDag::rebuild(&l.rows);
        assert_eq!(
            dag.summary("lobby"),
            TaskSummary {
                total: 5,
                done: 1,
                claimed: 0,
                ready: 1,
                waiting: 0,
                blocked: 2,
                abandoned: 1,
                cancelled: 0,
                submitted: 0,
            }
        );
        assert_eq!(dag.ready_since("lobby", "b"), Some(Timestamp(50)));
        assert_eq!(dag.ready_since("lobby", "c"), None);
        assert!(!dag.is_settled("lobby"));
    }

    #[test]
    fn malformed_bodies_are_ignored_never_panic() {
        let bodies = [
            json!(null),
            json!(42),
            json!("text"),
            json!([1, 2]),
            json!({}),
            json!({"task": 1}),
            json!({"task": "a/b", "label": "x"}),
            json!({"task": "", "label": "x"}),
            json!({"task": "a", "label": "   "}),
            json!({"task": "a", "label": "x", "deps": ["a"]}),
            json!({"task": "a", "label": "x", "deps": "b"}),
            json!({"task": "a", "epoch": "seven"}),
            json!({"task": "a", "epoch": -1, "attempt": 1}),
            json!({"task": "a", "epoch": 1e300}),
            json!({"task": "a", "attempt": 0}),
            json!({"task": "a".repeat(500), "label": "x"}),
            json!({"task": "a", "label": "x".repeat(5000)}),
        ];
        let verbs = [FOLDED, &[Verb::CoordNote]].concat();
        let dag = fold(every_pair(&verbs, &bodies, "ana", Role::Owner));
        assert!(dag.room("lobby").unwrap().tasks.is_empty());
        assert!(dag.room("lobby").unwrap().refusals.malformed > 0);
    }

    #[test]
    fn rebuild_equals_incremental() {
        let h = gen_history(8, 3, &(0..200u8).collect::<Vec<_>>());
        let rows = linearize(&h, &[]);
        let mut inc = TaskDag::new();
        for r in &rows {
            inc.apply(r);
        }
        assert_eq!(inc, TaskDag::rebuild(&rows));
        assert_eq!(inc.state_hash(), TaskDag::rebuild(&rows).state_hash());
    }

    // -- The incremental index against a from-scratch recomputation -------------

    /// The queries as the fold answered them before it kept an index: full scans of
    /// the room's tasks, the reference the indexed answers must equal.
    mod naive {
        use super::super::*;

        pub fn deps_done(r: &RoomTasks, t: &Task) -> bool {
            t.deps
                .iter()
                .all(|d| r.tasks.get(d).is_some_and(|d| d.status == TaskStatus::Done))
        }

        pub fn is_ready(r: &RoomTasks, t: &Task) -> bool {
            t.status == TaskStatus::Open && deps_done(r, t)
        }

        pub fn frontier(r: &RoomTasks) -> Vec<String> {
            let mut ready: Vec<&Task> = r.tasks.values().filter(|t| is_ready(r, t)).collect();
            ready.sort_by_key(|t| (t.priority, std::cmp::Reverse(t.path), t.id.clone()));
            ready.into_iter().map(|t| t.id.clone()).collect()
        }

        pub fn ready_since(r: &RoomTasks, t: &Task) -> Option<Timestamp> {
            if !is_ready(r, t) {
                return None;
            }
            let mut since = t.created_at;
            for d in &t.deps {
                if let Some(done) = r.tasks.get(d).and_then(|d| d.done_at) {
                    since = since.max(done);
                }
            }
            Some(t.returned_at.map_or(since, |b| since.max(b)))
        }

        pub fn summary(r: &RoomTasks) -> TaskSummary {
            // Least fixpoint of "can finish", by rounds (no shared code with the
            // index's work list).
            let mut ok: BTreeSet<&str> = BTreeSet::new();
            loop {
                let before = ok.len();
                for t in r.tasks.values() {
                    if !matches!(t.status, TaskStatus::Abandoned | TaskStatus::Cancelled)
                        && t.deps.iter().all(|d| ok.contains(d.as_str()))
                    {
                        ok.insert(t.id.as_str());
                    }
                }
                if ok.len() == before {
                    break;
                }
            }
            let mut s = TaskSummary {
                total: r.tasks.len(),
                ..TaskSummary::default()
            };
            for t in r.tasks.values() {
                match t.status {
                    TaskStatus::Done => s.done += 1,
                    TaskStatus::Claimed => s.claimed += 1,
                    TaskStatus::Submitted => s.submitted += 1,
                    TaskStatus::Abandoned => s.abandoned += 1,
                    TaskStatus::Cancelled => s.cancelled += 1,
                    TaskStatus::Open if is_ready(r, t) => s.ready += 1,
                    TaskStatus::Open if ok.contains(t.id.as_str()) => s.waiting += 1,
                    TaskStatus::Open => s.blocked += 1,
                }
            }
            s
        }
    }

    /// Asserts every indexed answer of room `lobby` equals the scan's.
    fn check_index(dag: &TaskDag) -> Result<(), TestCaseError> {
        let Some(r) = dag.room("lobby") else {
            prop_assert!(dag.ready_frontier("lobby").is_empty());
            return Ok(());
        };
        prop_assert_eq!(&r.index, &RoomIndex::from_scratch(&r.tasks));
        let ids = |v: Vec<&Task>| v.into_iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        prop_assert_eq!(ids(dag.ready_frontier("lobby")), naive::frontier(r));
        prop_assert_eq!(dag.frontier_len("lobby"), naive::frontier(r).len());
        prop_assert_eq!(dag.summary("lobby"), naive::summary(r));
        // Exactly the blocked tasks name what blocks them.
        let blocked = r
            .tasks
            .keys()
            .filter(|id| !dag.blocked_by("lobby", id).is_empty())
            .count();
        prop_assert_eq!(blocked, naive::summary(r).blocked);
        let claimed: Vec<String> = r
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::Claimed)
            .map(|t| t.id.clone())
            .collect();
        prop_assert_eq!(ids(dag.claimed("lobby")), claimed);
        // A re-take pass's candidates (plan 0089): the claimed set walked and filtered.
        let owners: Vec<&str> = r
            .tasks
            .values()
            .filter_map(|t| t.owner.as_deref())
            .collect();
        let times: Vec<Timestamp> = r.tasks.values().filter_map(|t| t.claimed_at).collect();
        for local in [
            Vec::new(),
            owners.iter().take(1).copied().collect::<Vec<_>>(),
        ] {
            let edges = [Timestamp(0), Timestamp(i64::MAX)];
            for now in times.iter().take(4).copied().chain(edges) {
                for lease in [0i64, 1, 1_000_000] {
                    let walked: Vec<String> = r
                        .tasks
                        .values()
                        .filter(|t| t.status == TaskStatus::Claimed)
                        .filter(|t| match &t.owner {
                            None => true,
                            Some(o) => {
                                local.contains(&o.as_str())
                                    || t.claimed_at
                                        .is_none_or(|at| now >= at.saturating_add(lease))
                            }
                        })
                        .map(|t| t.id.clone())
                        .collect();
                    let found =
                        dag.claimed_for_retake("lobby", now, lease, local.iter().copied(), |_| {
                            false
                        });
                    prop_assert_eq!(ids(found), walked.clone());
                    // Skipping one id leaves exactly the others.
                    if let Some(first) = walked.first() {
                        let found = dag.claimed_for_retake(
                            "lobby",
                            now,
                            lease,
                            local.iter().copied(),
                            |id| id == first,
                        );
                        prop_assert_eq!(ids(found), walked[1..].to_vec());
                    }
                }
            }
        }
        let due: Vec<String> = r
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::Abandoned && !t.notified)
            .map(|t| t.id.clone())
            .collect();
        prop_assert_eq!(ids(dag.notices_due("lobby")), due);
        let in_review: Vec<String> = r
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::Submitted)
            .map(|t| t.id.clone())
            .collect();
        prop_assert_eq!(
            dag.in_review("lobby")
                .map(|t| t.id.clone())
                .collect::<Vec<_>>(),
            in_review
        );
        let mut by_since: Vec<(Timestamp, String)> = Vec::new();
        for t in r.tasks.values() {
            let since = naive::ready_since(r, t);
            prop_assert_eq!(dag.ready_since("lobby", &t.id), since);
            prop_assert_eq!(dag.is_ready("lobby", &t.id), naive::is_ready(r, t));
            if let Some(s) = since {
                by_since.push((s, t.id.clone()));
            }
        }
        by_since.sort();
        let indexed: Vec<(Timestamp, String)> = dag
            .ready_since_from("lobby", Timestamp::MIN)
            .map(|(at, t)| (at, t.id.clone()))
            .collect();
        prop_assert_eq!(indexed, by_since);
        let s = naive::summary(r);
        prop_assert_eq!(
            dag.is_settled("lobby"),
            s.ready == 0 && s.claimed == 0 && s.submitted == 0
        );
        Ok(())
    }

    /// Arbitrary task rows over a few ids: dependencies on tasks created later or
    /// never, cycles, claims at any epoch (stale, superseding, on unready tasks),
    /// completions, failures and releases from anyone, notices, a small
    /// `max_attempts`. Most rows are refused; what applies exercises every path.
    fn arbitrary_rows() -> impl Strategy<Value = Vec<NewInteraction>> {
        let id = || (0u8..6).prop_map(|n| format!("t{n}"));
        let agent = || (0u8..3).prop_map(|n| format!("a{n}"));
        let row = prop_oneof![
            3 => (id(), prop::collection::vec(id(), 0..3), 1u32..4, 0u32..3, 0u64..4, 0u32..3)
                .prop_map(|(t, deps, max, priority, path, review)| {
                let deps: Vec<String> = deps.into_iter().filter(|d| *d != t).collect();
                let mut body = json!({"task": t, "label": "x", "deps": deps, "max_attempts": max,
                           "priority": priority, "size": 1 + path % 2, "path": path});
                if review > 0 {
                    body["review"] = json!({"agent": "a0", "rounds": review});
                }
                if path % 2 == 0 {
                    body["undo"] = json!("put it back");
                }
                ix(Verb::TaskCreated, "ana", Role::Owner, body)
            }),
            2 => (id(), agent(), 1i64..4, any::<bool>(), 0u32..3).prop_map(|(t, a, e, ok, g)| ix(
                Verb::TaskReviewed,
                &a,
                Role::Agent,
                json!({"task": t, "epoch": e, "verdict": if ok { "accept" } else { "reject" },
                       "feedback": "f", "generation": g}),
            )),
            4 => (id(), agent(), 1i64..8).prop_map(|(t, a, e)| claimed(&t, &a, e)),
            3 => (id(), agent(), 1i64..8).prop_map(|(t, a, e)| completed(&t, &a, e)),
            2 => (id(), agent(), 1i64..8).prop_map(|(t, a, e)| failed(&t, &a, e)),
            1 => (id(), agent(), 1i64..8).prop_map(|(t, a, e)| ix(
                Verb::TaskReleased,
                &a,
                Role::Agent,
                json!({"task": t, "epoch": e, "reason": "shutdown"}),
            )),
            1 => (id(), 1u32..3).prop_map(|(t, n)| ix(
                Verb::TaskRetried,
                "ana",
                Role::Owner,
                json!({"task": t, "attempts": n}),
            )),
            1 => (id(), any::<bool>()).prop_map(|(t, d)| ix(
                Verb::TaskCancelled,
                "ana",
                Role::Owner,
                json!({"task": t, "dependants": d}),
            )),
            1 => (id(), agent(), 1i64..8, 1u32..3).prop_map(|(t, a, e, g)| ix(
                Verb::TaskClaimed,
                &a,
                Role::Agent,
                json!({"task": t, "epoch": e, "attempt": 1, "generation": g}),
            )),
            1 => (id(), agent(), 1i64..8, 1u32..3).prop_map(|(t, a, e, g)| ix(
                Verb::TaskCompleted,
                &a,
                Role::Agent,
                json!({"task": t, "epoch": e, "result": "r", "generation": g}),
            )),
            1 => id().prop_map(|t| ix(
                Verb::CoordNote,
                "huddle",
                Role::System,
                json!({"kind": "notice", "about": NoticeBody::TASK_ABANDONED, "to": "owner", "task": t, "text": "x"}),
            )),
        ];
        prop::collection::vec(row, 0..80)
    }

    fn retried(task: &str, attempts: u32) -> NewInteraction {
        ix(
            Verb::TaskRetried,
            "ana",
            Role::Owner,
            json!({"task": task, "attempts": attempts}),
        )
    }

    fn cancelled(task: &str, dependants: bool) -> NewInteraction {
        ix(
            Verb::TaskCancelled,
            "ana",
            Role::Owner,
            json!({"task": task, "dependants": dependants}),
        )
    }

    fn of_generation(mut n: NewInteraction, generation: u32) -> NewInteraction {
        n.body["generation"] = generation.into();
        n
    }

    #[test]
    fn a_retried_task_runs_again_as_a_new_generation() {
        let dag = fold(vec![
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "x", "max_attempts": 1}),
            ),
            created("b", &["a"]),
            claimed("a", "bo", 4),
            failed("a", "bo", 4),
        ]);
        assert_eq!(status(&dag, "a"), Some(TaskStatus::Abandoned));
        let mut rows = vec![
            ix(
                Verb::TaskCreated,
                "ana",
                Role::Owner,
                json!({"task": "a", "label": "x", "max_attempts": 1}),
            ),
            created("b", &["a"]),
            claimed("a", "bo", 4),
            failed("a", "bo", 4),
            // An agent cannot retry; a retry of a task that is not abandoned does nothing.
            ix(
                Verb::TaskRetried,
                "bo",
                Role::Agent,
                json!({"task": "a", "attempts": 2}),
            ),
            retried("b", 2),
            retried("a", 2),
        ];
        let dag = fold(rows.clone());
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (t.status, t.generation, t.max_attempts, t.attempts, t.epoch),
            (TaskStatus::Open, 1, 3, 1, None)
        );
        assert_eq!(frontier(&dag), vec!["a"]);
        assert!(dag.blocked_by("lobby", "b").is_empty(), "b waits again");
        assert_eq!(dag.room("lobby").unwrap().refusals.refused, 2);
        // A row of the old generation is refused; the new generation's claims count,
        // from epoch 1 again (its claim key is new).
        rows.push(claimed("a", "cy", 1));
        rows.push(of_generation(claimed("a", "cy", 1), 1));
        rows.push(completed("a", "cy", 1));
        rows.push(of_generation(completed("a", "cy", 1), 1));
        let dag = fold(rows);
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!((t.status, t.attempts), (TaskStatus::Done, 2));
        assert_eq!(frontier(&dag), vec!["b"]);
    }

    fn reviewed_task(id: &str, reviewer: &str, rounds: u32) -> NewInteraction {
        ix(
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            json!({"task": id, "label": "write it", "max_attempts": 2,
                   "review": {"agent": reviewer, "rounds": rounds}}),
        )
    }

    fn verdict(task: &str, by: &str, ok: bool, feedback: &str, generation: u32) -> NewInteraction {
        ix(
            Verb::TaskReviewed,
            by,
            Role::Agent,
            json!({"task": task, "epoch": 1, "verdict": if ok { "accept" } else { "reject" },
                   "feedback": feedback, "generation": generation}),
        )
    }

    #[test]
    fn a_submission_waits_for_its_reviewer_and_acceptance_makes_it_done() {
        let rows = vec![
            reviewed_task("a", "lead", 3),
            created("b", &["a"]),
            claimed("a", "bo", 1),
            completed("a", "bo", 1),
        ];
        let dag = fold(rows.clone());
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(t.status, TaskStatus::Submitted);
        assert_eq!(t.result.as_deref(), Some("ok"));
        assert!(frontier(&dag).is_empty(), "b waits for the verdict");
        assert_eq!(dag.summary("lobby").submitted, 1);
        assert!(
            !dag.is_settled("lobby"),
            "a room with a task in review is busy"
        );
        assert_eq!(
            dag.in_review("lobby")
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>(),
            vec!["a"]
        );
        // Only the reviewer, only at the task's generation, only once.
        let mut more = rows.clone();
        more.push(verdict("a", "bo", true, "", 0));
        more.push(verdict("a", "lead", true, "", 3));
        more.push(ix(
            Verb::TaskReviewed,
            "lead",
            Role::Owner,
            json!({"task": "a", "epoch": 1, "verdict": "accept"}),
        ));
        let dag = fold(more.clone());
        assert_eq!(status(&dag, "a"), Some(TaskStatus::Submitted));
        assert_eq!(refused(&dag), 3);
        more.push(verdict("a", "lead", true, "fine", 0));
        more.push(verdict("a", "lead", false, "no, wait", 0));
        let dag = fold(more);
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (t.status, t.result.as_deref()),
            (TaskStatus::Done, Some("ok"))
        );
        assert_eq!(frontier(&dag), vec!["b"]);
        assert_eq!(refused(&dag), 4, "the late second verdict is refused");
        // A task without a review gate is done at its completion; a verdict is refused.
        let dag = fold(vec![
            created("c", &[]),
            claimed("c", "bo", 1),
            completed("c", "bo", 1),
            verdict("c", "lead", false, "x", 0),
        ]);
        assert_eq!(status(&dag, "c"), Some(TaskStatus::Done));
        assert_eq!(refused(&dag), 1);
    }

    #[test]
    fn a_rejection_opens_a_new_generation_and_the_last_round_abandons() {
        let mut rows = vec![
            reviewed_task("a", "lead", 2),
            claimed("a", "bo", 1),
            completed("a", "bo", 1),
            verdict("a", "lead", false, "add tests", 0),
        ];
        let dag = fold(rows.clone());
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (
                t.status,
                t.generation,
                t.rejections,
                t.attempts,
                t.max_attempts,
                t.epoch
            ),
            (TaskStatus::Open, 1, 1, 1, 3, None),
            "open again as generation 1, the rejection costing no failure budget"
        );
        assert_eq!(t.feedback.as_deref(), Some("add tests"));
        assert_eq!(t.rejected_result.as_deref(), Some("ok"));
        assert_eq!(t.result, None);
        assert_eq!(frontier(&dag), vec!["a"]);
        // Generation 0's rows no longer count; generation 1's do, from epoch 1.
        rows.push(completed("a", "bo", 1));
        rows.push(of_generation(claimed("a", "cy", 1), 1));
        rows.push(of_generation(completed("a", "cy", 1), 1));
        let dag = fold(rows.clone());
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!(
            (t.status, t.attempts, t.owner.as_deref()),
            (TaskStatus::Submitted, 2, Some("cy"))
        );
        // The second rejection is the last round: the task fails for good, and the
        // owner's notice names the reviewer and the feedback.
        rows.push(verdict("a", "lead", false, "still no tests", 1));
        let dag = fold(rows);
        let t = dag.task("lobby", "a").unwrap();
        assert_eq!((t.status, t.rejections), (TaskStatus::Abandoned, 2));
        let notice = dag.abandon_notice("lobby", "a").expect("a notice is due");
        let text = notice.body["text"].as_str().unwrap_or_default().to_string();
        assert!(
            text.contains("rejected by lead") && text.contains("still no tests"),
            "{text}"
        );
    }

    fn undoable(id: &str, deps: &[&str]) -> NewInteraction {
        ix(
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            json!({"task": id, "label": format!("do {id}"), "deps": deps,
                   "undo": format!("revert {id}"), "max_attempts": 1}),
        )
    }

    #[test]
    fn a_chain_failing_for_good_compensates_its_completed_steps_in_reverse() {
        // a -> b -> c -> d; b has no undo; d fails for good.
        let mut rows = vec![
            undoable("a", &[]),
            created("b", &["a"]),
            undoable("c", &["b"]),
            undoable("d", &["c"]),
            // Off the chain: done with an undo, never compensated.
            undoable("x", &[]),
        ];
        for t in ["a", "b", "c", "x"] {
            rows.push(claimed(t, "bo", 1));
            rows.push(completed(t, "bo", 1));
        }
        rows.push(claimed("d", "bo", 1));
        let before = fold(rows.clone());
        assert_eq!(
            before.summary("lobby").total,
            5,
            "no compensation before a failure"
        );
        rows.push(failed("d", "bo", 1));
        let dag = fold(rows.clone());
        assert_eq!(status(&dag, "d"), Some(TaskStatus::Abandoned));
        let c = dag.task("lobby", "c--undo").expect("c is compensated");
        let a = dag.task("lobby", "a--undo").expect("a is compensated");
        assert!(dag.task("lobby", "b--undo").is_none(), "b has no undo");
        assert!(dag.task("lobby", "d--undo").is_none(), "d never completed");
        assert!(
            dag.task("lobby", "x--undo").is_none(),
            "x is not in d's chain"
        );
        assert_eq!(c.compensates.as_deref(), Some("c"));
        assert_eq!(c.label, "undo c: revert c");
        assert!(c.deps.is_empty(), "the last completed step is undone first");
        assert_eq!(
            a.deps,
            vec!["c--undo".to_string()],
            "reverse order, skipping b"
        );
        assert_eq!(frontier(&dag), vec!["c--undo"]);
        // Undoing c lets a's compensation start; each runs once.
        rows.push(claimed("c--undo", "cy", 1));
        rows.push(completed("c--undo", "cy", 1));
        let dag = fold(rows.clone());
        assert_eq!(frontier(&dag), vec!["a--undo"]);
        // A second failure in the chain makes no second compensation.
        rows.push(ix(
            Verb::TaskCancelled,
            "ana",
            Role::Owner,
            json!({"task": "c", "dependants": false}),
        ));
        let dag = fold(rows);
        assert_eq!(dag.summary("lobby").total, 7);
    }

    #[test]
    fn a_cancelled_task_compensates_its_chain_too() {
        let rows = vec![
            undoable("reserve", &[]),
            undoable("charge", &["reserve"]),
            created("ship", &["charge"]),
            claimed("reserve", "bo", 1),
            completed("reserve", "bo", 1),
            claimed("charge", "bo", 1),
            completed("charge", "bo", 1),
            ix(
                Verb::TaskCancelled,
                "ana",
                Role::Owner,
                json!({"task": "ship", "dependants": false}),
            ),
        ];
        let dag = fold(rows);
        assert_eq!(frontier(&dag), vec!["charge--undo"]);
        assert_eq!(
            dag.task("lobby", "reserve--undo").unwrap().deps,
            vec!["charge--undo".to_string()]
        );
        // A created task may not use the reserved suffix.
        let dag = fold(vec![ix(
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            json!({"task": "x--undo", "label": "sneaky"}),
        )]);
        assert!(dag.task("lobby", "x--undo").is_none());
    }

    #[test]
    fn cancelling_stops_a_task_and_with_dependants_its_chain() {
        let base = vec![
            created("a", &[]),
            created("b", &["a"]),
            created("c", &["b"]),
            created("d", &[]),
            claimed("d", "bo", 1),
            completed("d", "bo", 1),
        ];
        let mut rows = base.clone();
        rows.push(cancelled("a", false));
        let dag = fold(rows);
        assert_eq!(status(&dag, "a"), Some(TaskStatus::Cancelled));
        assert_eq!(
            dag.blocked_by("lobby", "b"),
            vec![BlockedBy {
                task: "a".into(),
                reason: BlockReason::Cancelled
            }]
        );
        assert_eq!(dag.summary("lobby").cancelled, 1);
        let mut rows = base.clone();
        rows.push(claimed("a", "bo", 1));
        rows.push(cancelled("a", true));
        // A done task stays done; a second cancel changes nothing.
        rows.push(cancelled("d", true));
        rows.push(cancelled("a", true));
        // The running attempt's ending is refused.
        rows.push(completed("a", "bo", 1));
        let dag = fold(rows.clone());
        for id in ["a", "b", "c"] {
            assert_eq!(status(&dag, id), Some(TaskStatus::Cancelled), "{id}");
        }
        assert_eq!(status(&dag, "d"), Some(TaskStatus::Done));
        assert_eq!(dag.room("lobby").unwrap().refusals.refused, 3);
        assert!(dag.is_settled("lobby"));
        // Retrying the head opens it; its dependants stay cancelled until retried.
        rows.push(retried("a", 1));
        let dag = fold(rows);
        assert_eq!(frontier(&dag), vec!["a"]);
        assert_eq!(status(&dag, "b"), Some(TaskStatus::Cancelled));
    }

    #[test]
    fn the_index_is_left_out_of_the_state_hash() {
        let dag = fold(vec![
            created("a", &[]),
            created("b", &["a"]),
            claimed("a", "bo", 1),
        ]);
        let r = dag.room("lobby").unwrap();
        let plain = json!({"rooms": {"lobby": {"tasks": r.tasks, "refusals": r.refusals}}});
        assert_eq!(dag.state_hash(), hash_state(&plain));
    }

    #[test]
    fn a_deserialised_dag_rebuilds_its_index() {
        let dag = fold(vec![
            created("a", &[]),
            created("b", &["a"]),
            created("c", &["zz"]),
            claimed("a", "bo", 1),
            completed("a", "bo", 1),
        ]);
        let text = serde_json::to_string(&dag).unwrap();
        let back: TaskDag = serde_json::from_str(&text).unwrap();
        assert_eq!(back, dag);
        assert_eq!(frontier(&back), vec!["b"]);
        assert_eq!(back.summary("lobby"), dag.summary("lobby"));
    }

    #[test]
    fn changes_name_the_tasks_a_row_touched() {
        let mut l = Ledger::default();
        let mut dag = TaskDag::new();
        dag.track_changes();
        for r in [
            created("a", &[]),
            created("b", &["a"]),
            created("c", &["a"]),
        ] {
            dag.apply(&l.push(r, Timestamp(1)));
        }
        let names = |v: Vec<(String, String)>| v.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
        assert_eq!(names(dag.take_changes()), vec!["a", "b", "c"]);
        assert!(dag.take_changes().is_empty());
        dag.apply(&l.push(claimed("a", "bo", 1), Timestamp(2)));
        assert_eq!(names(dag.take_changes()), vec!["a"]);
        // Completing `a` makes both dependents ready: they are changes too.
        dag.apply(&l.push(completed("a", "bo", 1), Timestamp(3)));
        assert_eq!(names(dag.take_changes()), vec!["a", "b", "c"]);
        // A refused row changes nothing.
        dag.apply(&l.push(completed("a", "bo", 1), Timestamp(4)));
        assert!(dag.take_changes().is_empty());
        // Untracked: nothing is kept.
        let mut quiet = TaskDag::new();
        quiet.apply(&l.push(created("z", &[]), Timestamp(5)));
        assert!(quiet.take_changes().is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// After every row of an arbitrary history, the incrementally kept index
        /// equals the one computed from scratch, and every indexed query (frontier,
        /// claimed, notices, readiness times, summary, settledness) equals a scan.
        #[test]
        fn the_index_equals_a_recomputation_after_every_row(rows in arbitrary_rows()) {
            let mut l = Ledger::default();
            let mut dag = TaskDag::new();
            for (n, r) in rows.into_iter().enumerate() {
                // Times go back now and then: readiness is the latest of several.
                let at = Timestamp(((n as i64 * 7919) % 97) * 1_000);
                dag.apply(&l.push(r, at));
                check_index(&dag)?;
            }
        }

        /// The same over generated task histories (in any causal interleaving), where
        /// most rows apply.
        #[test]
        fn the_index_follows_generated_histories((history, order) in history_and_order()) {
            let mut dag = TaskDag::new();
            for r in &linearize(&history, &order) {
                dag.apply(r);
                check_index(&dag)?;
            }
        }


        /// Any interleaving that keeps each actor's order and the causal order gives
        /// the same task DAG state hash (the board's: in `board`).
        #[test]
        fn folds_are_interleaving_invariant((history, order) in history_and_order()) {
            let (reference, shuffled) = hashes_in_two_orders::<TaskDag>(&history, &order);
            prop_assert_eq!(reference, shuffled);
        }

        /// After every prefix of every interleaving, no task on the ready frontier has
        /// a dependency that is not done, and the frontier is sorted.
        #[test]
        fn frontier_never_holds_an_unfinished_dependency(
            n_tasks in 1usize..10,
            n_agents in 1usize..4,
            choices in prop::collection::vec(any::<u8>(), 1..150),
            order in prop::collection::vec(any::<u16>(), 1..64),
        ) {
            let rows = linearize(&gen_history(n_tasks, n_agents, &choices), &order);
            let mut dag = TaskDag::new();
            for r in &rows {
                dag.apply(r);
                let f = dag.ready_frontier("lobby");
                for t in &f {
                    prop_assert_eq!(t.status, TaskStatus::Open);
                    for d in &t.deps {
                        prop_assert_eq!(status(&dag, d), Some(TaskStatus::Done));
                    }
                }
                let ids: Vec<&str> = f.iter().map(|t| t.id.as_str()).collect();
                let mut sorted = ids.clone();
                sorted.sort();
                prop_assert_eq!(ids, sorted);
            }
        }

        /// A completion from anyone but the current owner at the current epoch never
        /// changes any task, wherever it lands.
        #[test]
        fn forged_or_stale_completions_change_nothing(
            n_tasks in 1usize..8,
            choices in prop::collection::vec(any::<u8>(), 1..120),
            cut in any::<prop::sample::Index>(),
            task in any::<prop::sample::Index>(),
            forger in 0usize..4,
            epoch_shift in -2i64..3,
        ) {
            let rows = linearize(&gen_history(n_tasks, 3, &choices), &[]);
            let k = cut.index(rows.len() + 1);
            let mut dag = TaskDag::rebuild(&rows[..k]);
            let ids: Vec<String> = dag
                .room("lobby")
                .map(|r| r.tasks.keys().cloned().collect())
                .unwrap_or_default();
            let id = if ids.is_empty() { "t0".to_string() } else { ids[task.index(ids.len())].clone() };
            let t = dag.task("lobby", &id).cloned();
            let cur = t.as_ref().and_then(|t| t.epoch).map_or(0, ClaimEpoch::get);
            let agent = format!("a{forger}");
            let forged_epoch = cur + epoch_shift;
            let is_owner_at_epoch =
                t.as_ref().is_some_and(|t| t.is_held_by(&agent, ClaimEpoch(forged_epoch)));
            prop_assume!(!is_owner_at_epoch);
            let tasks = |d: &TaskDag| d.room("lobby").map(|r| r.tasks.clone()).unwrap_or_default();
            let before = tasks(&dag);
            let forged = crate::testing::materialize(
                completed(&id, &agent, forged_epoch),
                crate::model::Position::new(9, 9),
                Timestamp(i64::MAX / 2),
            );
            dag.apply(&forged);
            prop_assert_eq!(tasks(&dag), before);
        }
    }
}
