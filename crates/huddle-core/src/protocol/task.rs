//! `task.*` bodies and the names they may use.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::ClaimEpoch;
use super::fields::{parse_body, to_value};

/// Attempts per task when `task.created` does not say (the `max-attempts` default).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The most attempts a task may be given, whatever its body says.
pub const MAX_ATTEMPTS_CAP: u32 = 100;
/// Longest task id, in bytes.
pub const MAX_TASK_ID_BYTES: usize = 128;
/// Longest task label, in bytes.
pub const MAX_LABEL_BYTES: usize = 4096;
/// Most dependencies of one task.
pub const MAX_DEPS: usize = 1000;
/// Most entries in a task's `needs` or a bid's `capabilities`.
pub const MAX_CAPABILITIES: usize = 64;
/// Longest capability name, in bytes.
pub const MAX_CAPABILITY_BYTES: usize = 64;
/// Longest `result` or `reason` text kept in the fold, in bytes (longer is truncated).
pub const MAX_RESULT_BYTES: usize = 16 * 1024;
/// A task's priority when `task.created` does not say (lower goes first).
pub const DEFAULT_TASK_PRIORITY: u32 = 100;
/// The largest task priority (larger values are clamped).
pub const MAX_TASK_PRIORITY: u32 = 1_000;
/// The largest relative size of a task (larger values are clamped; the default is 1).
pub const MAX_TASK_SIZE: u32 = 1_000_000;
/// The longest time an attempt may be given (`[due ...]`), ms: 7 days (longer values
/// are clamped).
pub const MAX_TASK_DUE_MS: u64 = 7 * 24 * 3_600_000;
/// The shortest time an attempt may be given (`[due ...]`), ms: 1 s.
pub const MIN_TASK_DUE_MS: u64 = 1_000;

/// Whether `id` is a valid task id: 1..=128 bytes of `[A-Za-z0-9_-]`.
pub fn valid_task_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_TASK_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` is a valid capability name: 1..=64 bytes, no white space or control
/// characters.
pub fn valid_capability(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CAPABILITY_BYTES
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Body of `task.created` (role `owner` or `system`).
///
/// `{"task":"api","label":"Build the API","deps":["db"],"assignee":"bo","needs":["rust"],"max_attempts":3}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCreatedBody {
    /// Task id, `[A-Za-z0-9_-]{1,128}`, unique in the room.
    pub task: String,
    /// What to do; non-empty, at most 4 KiB.
    pub label: String,
    /// Ids of tasks that must be done first (may name tasks created later).
    #[serde(default)]
    pub deps: Vec<String>,
    /// The agent that should do it under `push` allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<String>,
    /// Capabilities an agent must declare to take the task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
    /// Attempts before the task fails for good (default 3, clamped to 1..=100). The
    /// writer copies the room's `max-attempts` here so the fold never depends on
    /// config that changes later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Scheduling priority, lower first (default 100, clamped to 0..=1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Relative cost (default 1, clamped to 1..=1,000,000): the task's weight on the
    /// critical path of its chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// The longest chain of sizes from this task through the tasks of its command
    /// that wait for it (its own size included), as the command's parser computed it:
    /// the critical-path part of its frontier rank. Absent: its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<u64>,
    /// How long each attempt may take, ms, counted from its claim (`[due 30m]`,
    /// clamped to 1 s..=7 days); an attempt still running then is cancelled and
    /// failed. Absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<u64>,
    /// Shared resources the task's turn holds while it runs (`[uses ...]`): taken all
    /// together, as the agent, before the task is claimed; renewed with the turn and
    /// released when it ends. Checked by the task fold (a bad name or mode makes the
    /// whole row malformed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<TaskUse>,
    /// A review gate (`[review @lead]`): a completion is a submission that `agent`
    /// accepts or rejects, at most `rounds` times rejected before the task fails for
    /// good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<TaskReview>,
    /// `[undo LABEL]`: the compensation of the task, run (as the task `<task>--undo`)
    /// if, after it completed, a task of its chain fails for good or is cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
}

/// The suffix of a compensation task's id (`charge--undo` compensates `charge`);
/// reserved: no `task.created` may use it.
pub const UNDO_SUFFIX: &str = "--undo";

/// The id of the compensation of `task`.
pub fn undo_id(task: &str) -> String {
    format!("{task}{UNDO_SUFFIX}")
}

/// The review gate of a task: `{"agent":"lead","rounds":3}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReview {
    /// The reviewer (an agent key).
    pub agent: String,
    /// Rejections allowed before the task fails for good (1..=20; the writer copies
    /// the clause's value or the room's `review-rounds`).
    pub rounds: u32,
}

/// The most review rounds a task may be given, whatever its body says.
pub const MAX_REVIEW_ROUNDS: u32 = 20;
/// Review rounds when neither the clause nor the room says (`review-rounds`).
pub const DEFAULT_REVIEW_ROUNDS: u32 = 3;

/// One resource of a task's `uses`: `{"name":"file:docs/**","mode":"exclusive"}`
/// (`mode`: `exclusive`, `shared` or `permits-N`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUse {
    /// The resource name, `kind:rest`.
    pub name: String,
    /// How it is taken.
    pub mode: String,
}

impl TaskCreatedBody {
    /// Decodes and checks a body: valid ids, no self-dependency, sizes in bounds.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        let ok = valid_task_id(&b.task)
            && !b.label.trim().is_empty()
            && b.label.len() <= MAX_LABEL_BYTES
            && b.deps.len() <= MAX_DEPS
            && b.deps.iter().all(|d| valid_task_id(d) && *d != b.task)
            && b.needs.len() <= MAX_CAPABILITIES
            && b.needs.iter().all(|n| valid_capability(n))
            && b.assignee.as_deref().is_none_or(|a| !a.is_empty())
            && !b.task.ends_with(UNDO_SUFFIX)
            && b.undo.as_ref().is_none_or(|u| {
                !u.trim().is_empty()
                    && u.len() <= MAX_LABEL_BYTES
                    && b.task.len() + UNDO_SUFFIX.len() <= MAX_TASK_ID_BYTES
            })
            && b.review.as_ref().is_none_or(|r| {
                super::valid_name(&r.agent)
                    && !r.agent.contains(|c: char| c.is_whitespace() || c == '@')
                    && r.rounds >= 1
            });
        ok.then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.bid` (actor = the bidding agent; not fenced).
///
/// `{"task":"api","attempt":1,"capabilities":["rust"],"load":0}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskBidBody {
    /// Task id.
    pub task: String,
    /// The attempt the bid is for: the task's attempts used so far + 1.
    pub attempt: u32,
    /// Capabilities the bidder declares.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// The bidder's current load (turns in flight and tasks held).
    #[serde(default)]
    pub load: u32,
    /// An explicit decline: the agent will not take this attempt. Not a bid (it never
    /// wins and is sent no `task.rejected`); absent means false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub decline: bool,
}

impl TaskBidBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        let ok = valid_task_id(&b.task)
            && b.attempt >= 1
            && b.capabilities.len() <= MAX_CAPABILITIES
            && b.capabilities.iter().all(|c| valid_capability(c));
        ok.then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.rejected` (actor = the agent that claimed the task; appended fenced by
/// that claim, in the batch of its `task.claimed` or later for late bids).
///
/// `{"task":"api","attempt":1,"agent":"cy","winner":"bo"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRejectedBody {
    /// Task id.
    pub task: String,
    /// The attempt the losing bid was for.
    pub attempt: u32,
    /// The losing bidder.
    pub agent: String,
    /// The agent that claimed the task.
    pub winner: String,
}

impl TaskRejectedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        (valid_task_id(&b.task) && !b.agent.is_empty()).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.claimed` (actor = the claiming agent; appended fenced by
/// `task/<room>/<task>` held by that agent at `epoch`).
///
/// `{"task":"api","epoch":7,"attempt":1}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskClaimedBody {
    /// Task id.
    pub task: String,
    /// The claim's epoch (fencing token).
    pub epoch: ClaimEpoch,
    /// The attempt this claim starts, as the claimant computed it (informational: the
    /// fold counts attempts itself).
    pub attempt: u32,
    /// The task's generation the claim was for (0, absent, until the owner's `!retry`;
    /// the fold refuses a row of another generation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
}

impl TaskClaimedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        (valid_task_id(&b.task) && b.epoch.is_valid()).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.completed` (actor = the owner; fenced by the task claim).
///
/// `{"task":"api","epoch":7,"result":"done: 3 endpoints","tokens":1200}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCompletedBody {
    /// Task id.
    pub task: String,
    /// The epoch of the claim the work was done under.
    pub epoch: ClaimEpoch,
    /// A short result (kept up to 16 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Tokens the turn used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// The task's generation the claim was for (0, absent, until the owner's `!retry`;
    /// the fold refuses a row of another generation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
}

impl TaskCompletedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        valid_task_id(&b.task).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.failed` and `task.released` (actor = the owner; fenced by the task
/// claim). Both give the attempt back; `failed` says it went wrong, `released` that
/// the owner stopped (e.g. its relay shut down).
///
/// `{"task":"api","epoch":7,"reason":"exit status 1"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEndedBody {
    /// Task id.
    pub task: String,
    /// The epoch of the claim the attempt ran under.
    pub epoch: ClaimEpoch,
    /// Why (kept up to 16 KiB).
    #[serde(default)]
    pub reason: String,
    /// The task's generation the claim was for (0, absent, until the owner's `!retry`;
    /// the fold refuses a row of another generation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
}

impl TaskEndedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        valid_task_id(&b.task).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A reviewer's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The work is accepted: the task is done.
    Accept,
    /// The work is sent back with feedback: another attempt.
    Reject,
}

impl Verdict {
    /// `accept` or `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accept => "accept",
            Verdict::Reject => "reject",
        }
    }

    /// Reads a verdict word (`accept`/`accepted`/`approve`, `reject`/`rejected`,
    /// any case).
    pub fn parse_word(word: &str) -> Option<Verdict> {
        match word.to_ascii_lowercase().as_str() {
            "accept" | "accepted" | "approve" | "approved" => Some(Verdict::Accept),
            "reject" | "rejected" => Some(Verdict::Reject),
            _ => None,
        }
    }

    /// The verdict a review turn's reply gives: its first non-blank line starts with
    /// `ACCEPT` or `REJECT` (any case, optionally followed by `:`, `-` or white
    /// space); what follows on that line and the lines after it is the feedback
    /// (trimmed). `None` when the reply gives no verdict.
    pub fn from_reply(text: &str) -> Option<(Verdict, String)> {
        let text = text.trim_start();
        let end = text
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(text.len());
        let verdict = Verdict::parse_word(&text[..end])?;
        let rest = text[end..].trim_start_matches([' ', '\t', ':', '-', '.', '!', ',']);
        Some((verdict, rest.trim().to_string()))
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of `task.reviewed` (actor = the task's reviewer; fenced by the review claim
/// `review/<room>/<task>[/<generation>]` held by the reviewer at `epoch`, and closing
/// it): the verdict on the task's submission of that generation.
///
/// `{"task":"api","epoch":1,"verdict":"reject","feedback":"add tests"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReviewedBody {
    /// Task id.
    pub task: String,
    /// The epoch of the review claim.
    pub epoch: ClaimEpoch,
    /// Accept or reject.
    pub verdict: Verdict,
    /// What the reviewer says (for a rejection: what must change; kept up to 16 KiB).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub feedback: String,
    /// The task's generation the submission was made in (absent = 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
}

impl TaskReviewedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        (valid_task_id(&b.task) && b.epoch.is_valid()).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.retried` (the owner's `!retry`; role owner, derived from the signed
/// command, parent = the command): an abandoned or cancelled task gets `attempts` more
/// attempts and a new generation (claimed under fresh keys).
///
/// `{"task":"api","attempts":3}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRetriedBody {
    /// Task id.
    pub task: String,
    /// The fresh budget: attempts it may use from now (1..=100).
    pub attempts: u32,
}

impl TaskRetriedBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        (valid_task_id(&b.task) && (1..=MAX_ATTEMPTS_CAP).contains(&b.attempts)).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}

/// Body of `task.cancelled` (the owner's `!cancel`; role owner, derived from the
/// signed command, parent = the command): the task will not run; with `dependants`,
/// neither will any task that waits for it, directly or not.
///
/// `{"task":"api","dependants":true}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCancelledBody {
    /// Task id.
    pub task: String,
    /// Whether every task that waits for it is cancelled too.
    #[serde(default)]
    pub dependants: bool,
}

impl TaskCancelledBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        valid_task_id(&b.task).then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        to_value(self)
    }
}
