//! Arguments and results of the agent operations: plain serde types with JSON
//! schemas, so a tool server can publish them as they are.
//!
//! No argument names an actor: who acts is the session's agent.

use huddle_core::tasks::{Task, TaskSummary};
use huddle_core::{ClaimEpoch, Interaction, Timestamp};
use huddle_store::Appended;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Arguments of `read`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReadArgs {
    /// Cursor from a previous `read` (`next`); without it, the newest `limit`
    /// interactions of the room.
    #[serde(default)]
    pub after: Option<String>,
    /// Only interactions of this thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// Most interactions returned (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
    /// When nothing new is there, wait up to this long (ms, at most 60000) for
    /// something to arrive.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// One interaction as an agent sees it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct InteractionView {
    /// Content id (hex).
    pub id: String,
    /// Its position; a cursor that reads after it.
    pub cursor: String,
    /// Database time of the append (µs since the Unix epoch).
    #[schemars(with = "i64")]
    pub at: Timestamp,
    /// Thread, if any.
    pub thread: Option<String>,
    /// Verb (`message.posted`, `task.completed`, ...).
    pub verb: String,
    /// Who.
    pub actor: String,
    /// `owner`, `human`, `agent` or `system`.
    pub role: String,
    /// The interaction it answers or follows (hex id).
    pub parent: Option<String>,
    /// The body.
    pub body: Value,
}

impl From<&Interaction> for InteractionView {
    fn from(i: &Interaction) -> Self {
        InteractionView {
            id: i.id.to_string(),
            cursor: i.position.to_string(),
            at: i.at,
            thread: i.thread.clone(),
            verb: i.verb.to_string(),
            actor: i.actor.clone(),
            role: i.role.as_str().to_string(),
            parent: i.parent.map(|p| p.to_string()),
            body: i.body.clone(),
        }
    }
}

/// Result of `read`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadResult {
    /// Interactions in ledger order.
    pub interactions: Vec<InteractionView>,
    /// Pass as `after` to read what comes next.
    pub next: String,
    /// The `<thread>` block of the thread read (the room's top level without
    /// `thread`): its messages since you last spoke there, newest last, within the
    /// room's `thread-context` budget; absent when there is nothing new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_context: Option<String>,
}

/// Arguments of `post`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct PostArgs {
    /// The message. `@name` mentions address agents as in the room.
    pub text: String,
    /// Thread to post in.
    #[serde(default)]
    pub thread: Option<String>,
    /// Id (hex) of the message this answers.
    #[serde(default)]
    pub reply_to: Option<String>,
    /// Agents addressed explicitly (besides `@name` in the text).
    #[serde(default)]
    pub mentions: Vec<String>,
    /// A key of your choosing: a retry with the same key never posts twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// An interim progress note on the message `reply_to`, which you are answering
    /// now ("still reading the logs"): recorded as `turn.progress`, shown on the board
    /// and in `tail`, never your reply (post the reply later without `progress`).
    #[serde(default)]
    pub progress: bool,
}

/// Result of a write.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Written {
    /// The id (hex) of the interaction now in the ledger.
    pub id: String,
    /// False when the same write was already there (a retry).
    pub inserted: bool,
}

/// Counts of the room's tasks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct SummaryView {
    /// All tasks.
    pub total: usize,
    /// Completed.
    pub done: usize,
    /// Held by an agent.
    pub claimed: usize,
    /// Ready to be claimed.
    pub ready: usize,
    /// Waiting for dependencies.
    pub waiting: usize,
    /// Can never run (a dependency failed for good).
    pub blocked: usize,
    /// Failed for good.
    pub abandoned: usize,
}

impl From<TaskSummary> for SummaryView {
    fn from(s: TaskSummary) -> Self {
        SummaryView {
            total: s.total,
            done: s.done,
            claimed: s.claimed,
            ready: s.ready,
            waiting: s.waiting,
            blocked: s.blocked,
            abandoned: s.abandoned,
        }
    }
}

/// Result of `board`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BoardResult {
    /// The `<coordination>` block a driven agent is shown (the board minus you), if
    /// there is anything to show.
    pub coordination: Option<String>,
    /// The board as data: owner, agents, presence, designations, notices.
    pub board: Value,
    /// Task counts.
    pub tasks: SummaryView,
}

/// One task.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskView {
    /// Task id.
    pub id: String,
    /// What to do.
    pub label: String,
    /// `open`, `claimed`, `submitted` (in review), `done`, `abandoned` or
    /// `cancelled`.
    pub status: String,
    /// Open with every dependency done.
    pub ready: bool,
    /// Current owner (last owner once done).
    pub owner: Option<String>,
    /// Epoch of the latest claim.
    #[schemars(with = "Option<i64>")]
    pub epoch: Option<ClaimEpoch>,
    /// Attempts started.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Dependencies.
    pub deps: Vec<String>,
    /// Assignee under `push` allocation.
    pub assignee: Option<String>,
    /// Capabilities needed.
    pub needs: Vec<String>,
    /// The completion's result.
    pub result: Option<String>,
    /// Reason of the last failure or release.
    pub last_reason: Option<String>,
    /// Its reviewer (`[review @agent]`): a completion is a submission the reviewer
    /// accepts or rejects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviewer: Option<String>,
    /// Rejections so far, and the most allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_rounds: Option<(u32, u32)>,
    /// The reviewer's feedback on the last rejected submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// For a compensation: the task it undoes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
}

impl TaskView {
    /// The view of `t`; `ready` as the fold derives it.
    pub fn of(t: &Task, ready: bool) -> Self {
        TaskView {
            id: t.id.clone(),
            label: t.label.clone(),
            status: status_name(t),
            ready,
            owner: t.owner.clone(),
            epoch: t.epoch,
            attempts: t.attempts,
            max_attempts: t.max_attempts,
            deps: t.deps.clone(),
            assignee: t.assignee.clone(),
            needs: t.needs.clone(),
            result: t.result.clone(),
            last_reason: t.last_reason.clone(),
            reviewer: t.review.as_ref().map(|r| r.agent.clone()),
            review_rounds: t.review.as_ref().map(|r| (t.rejections, r.rounds)),
            feedback: t.feedback.clone(),
            compensates: t.compensates.clone(),
        }
    }
}

/// A task's status as the views spell it (`open`, `claimed`, `done`, `abandoned`).
pub fn status_name(t: &Task) -> String {
    serde_json::to_value(t.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The [`Written`] of a one-row append.
pub(crate) fn written(out: &[Appended]) -> crate::Result<Written> {
    let a = out.first().ok_or_else(|| {
        crate::AgentError::BadArgument("nothing was written (an empty append)".into())
    })?;
    Ok(Written {
        id: a.id.to_string(),
        inserted: a.inserted,
    })
}

/// Result of `tasks`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TasksResult {
    /// Counts.
    pub summary: SummaryView,
    /// Ready tasks you may claim now (policy and capabilities), by id.
    pub ready_for_you: Vec<String>,
    /// Tasks you hold.
    pub yours: Vec<String>,
    /// Submissions waiting for your verdict (`task_review`), by id.
    #[serde(default)]
    pub to_review: Vec<String>,
    /// Every task, by id.
    pub tasks: Vec<TaskView>,
}

/// Arguments of `task_claim`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ClaimArgs {
    /// The task to claim; without it, the best ready task for you.
    #[serde(default)]
    pub task: Option<String>,
    /// Without `task`: when nothing is claimable, wait up to this long (ms, at most
    /// 60000) for work.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// A dependency's outcome.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DependencyView {
    /// Task id.
    pub id: String,
    /// Its label.
    pub label: String,
    /// What its completion reported.
    pub result: Option<String>,
}

/// A claim this agent holds.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ClaimedTask {
    /// The task.
    pub task: TaskView,
    /// The claim's epoch: the fencing token of every write about this task.
    #[schemars(with = "i64")]
    pub epoch: ClaimEpoch,
    /// The attempt this claim is.
    pub attempt: u32,
    /// When the lease lapses unless renewed (database clock, µs).
    #[schemars(with = "i64")]
    pub expires_at: Timestamp,
    /// The lease length (the room's `claim-ttl`): call `task_renew` well within it.
    pub lease_ms: u64,
    /// True when you already held this claim (a retried call): nothing new was
    /// written.
    pub resumed: bool,
    /// Results of the task's dependencies.
    pub dependencies: Vec<DependencyView>,
    /// The task's effect key: the same for every attempt of this task, by any agent,
    /// different for every other task. Pass it to external systems as the
    /// idempotency key of the task's side effects.
    pub effect_key: String,
    /// The task's trace: the id of the command that created it (`huddle trace ROOM
    /// ID` prints what it caused). Empty when unknown.
    #[serde(default)]
    pub trace: String,
    /// When its reviewer sent the last submission back: what the reviewer said and the
    /// rejected result. Address it in this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_feedback: Option<FeedbackView>,
    /// For a compensation (`[undo ...]` of another task): the task it undoes, with its
    /// result. Undo what that task did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensates: Option<DependencyView>,
}

/// A reviewer's feedback on a rejected submission.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct FeedbackView {
    /// The reviewer.
    pub reviewer: String,
    /// The review round that rejected it (1-based).
    pub round: u32,
    /// What must change.
    pub feedback: String,
    /// The rejected result.
    pub rejected_result: Option<String>,
}

/// Arguments of `task_review`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ReviewArgs {
    /// Task id: a task submitted for your review.
    pub task: String,
    /// `accept` (the task is done) or `reject` (it goes back with your feedback).
    pub verdict: String,
    /// What must change (for a rejection) or a comment; kept up to 16 KiB.
    #[serde(default)]
    pub feedback: Option<String>,
}

/// Result of `task_review`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReviewWritten {
    /// Task id.
    pub task: String,
    /// The verdict written.
    pub verdict: String,
    /// The row now in the ledger.
    pub written: Written,
    /// The task's status afterwards (`done`, `open` for another attempt with your
    /// feedback, `abandoned` when that was the last round).
    pub status: String,
}

/// Result of `task_claim`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ClaimResult {
    /// The task claimed, or none when nothing is claimable for you now.
    pub claimed: Option<ClaimedTask>,
    /// Why nothing was claimed.
    pub reason: Option<String>,
    /// True when no task can ever become claimable again (all done, abandoned or
    /// blocked): stop asking.
    pub settled: bool,
}

/// Arguments of `task_renew`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct RenewArgs {
    /// Task id.
    pub task: String,
    /// The claim's epoch (default: the one the room records for you).
    #[serde(default)]
    #[schemars(with = "Option<i64>")]
    pub epoch: Option<ClaimEpoch>,
}

/// A lease after renewal.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct LeaseView {
    /// Task id.
    pub task: String,
    /// Epoch.
    #[schemars(with = "i64")]
    pub epoch: ClaimEpoch,
    /// New expiry (database clock, µs).
    #[schemars(with = "i64")]
    pub expires_at: Timestamp,
    /// The lease length.
    pub lease_ms: u64,
}

/// Arguments of `task_complete`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct CompleteArgs {
    /// Task id.
    pub task: String,
    /// A short result (kept up to 16 KiB), shown to the tasks that depend on this one.
    #[serde(default)]
    pub result: Option<String>,
    /// The claim's epoch (default: the one the room records for you).
    #[serde(default)]
    #[schemars(with = "Option<i64>")]
    pub epoch: Option<ClaimEpoch>,
    /// A key of your choosing: a retry with the same key never writes twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Arguments of `task_fail` and `task_release`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct GiveBackArgs {
    /// Task id.
    pub task: String,
    /// Why (kept up to 16 KiB).
    #[serde(default)]
    pub reason: Option<String>,
    /// The claim's epoch (default: the one the room records for you).
    #[serde(default)]
    #[schemars(with = "Option<i64>")]
    pub epoch: Option<ClaimEpoch>,
    /// A key of your choosing: a retry with the same key never writes twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Result of `task_complete`, `task_fail` and `task_release`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskWritten {
    /// Task id.
    pub task: String,
    /// The epoch written under.
    #[schemars(with = "i64")]
    pub epoch: ClaimEpoch,
    /// The row now in the ledger.
    pub written: Written,
    /// The task's status afterwards (`done`, `open` for another attempt, `abandoned`).
    pub status: String,
}
