//! `coord.note` bodies and the subjects turns and presence are about.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::ClaimEpoch;
use super::fields::parse_body;
use crate::id::InteractionId;

/// What a turn or a presence is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Subject {
    /// `message`, `task` or `review`.
    pub kind: SubjectKind,
    /// The message id (64 hex digits) or the task id.
    pub id: String,
    /// A short human label (a task's label), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl Subject {
    /// A message subject.
    pub fn message(id: InteractionId) -> Self {
        Subject {
            kind: SubjectKind::Message,
            id: id.to_hex(),
            label: None,
        }
    }

    /// A task subject.
    pub fn task(id: impl Into<String>, label: Option<String>) -> Self {
        Subject {
            kind: SubjectKind::Task,
            id: id.into(),
            label,
        }
    }

    /// A review subject: reviewing task `id`'s submission.
    pub fn review(id: impl Into<String>, label: Option<String>) -> Self {
        Subject {
            kind: SubjectKind::Review,
            id: id.into(),
            label,
        }
    }

    /// `message:<id>`, `task:<id>` or `review:<id>`: the key of the subject in the board.
    pub fn key(&self) -> String {
        format!("{}:{}", self.kind.as_str(), self.id)
    }
}

/// The kind of a [`Subject`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubjectKind {
    /// Answering a message.
    Message,
    /// Working on a task.
    Task,
    /// Reviewing a task's submission (`[review @agent]`).
    Review,
}

impl SubjectKind {
    /// `message`, `task` or `review`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SubjectKind::Message => "message",
            SubjectKind::Task => "task",
            SubjectKind::Review => "review",
        }
    }
}

/// An agent's presence state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PresenceState {
    /// In a turn, on a subject.
    Working,
    /// Not working.
    Idle,
    /// Finished its last subject.
    Done,
    /// Its last subject failed.
    Failed,
}

impl PresenceState {
    /// The lowercase name.
    pub fn as_str(&self) -> &'static str {
        match self {
            PresenceState::Working => "working",
            PresenceState::Idle => "idle",
            PresenceState::Done => "done",
            PresenceState::Failed => "failed",
        }
    }
}

/// Body of `coord.note`, tagged by `kind`.
///
/// - `{"kind":"presence","state":"working","on":{"kind":"task","id":"api"},"note":".."}`
///   (actor = the agent whose presence it is)
/// - `{"kind":"designation","message":"<64 hex>","agent":"bo","epoch":3}` (actor = the
///   agent that won `reply/<room>/<message>` at `epoch`; appended fenced by it)
/// - `{"kind":"notice","about":"task-abandoned","to":"owner","task":"api","text":".."}`
///   (role `system` or `owner` only; notices from anyone else are ignored)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CoordNoteBody {
    /// An agent says what it is doing.
    Presence(PresenceBody),
    /// An agent took a message.
    Designation(DesignationBody),
    /// A notice for the room (the owner above all).
    Notice(NoticeBody),
}

impl CoordNoteBody {
    /// Decodes and checks a body.
    pub fn parse(body: &Value) -> Option<Self> {
        let b: Self = parse_body(body)?;
        let ok = match &b {
            CoordNoteBody::Presence(p) => p.note.as_ref().is_none_or(|n| n.len() <= 4096),
            CoordNoteBody::Designation(d) => !d.agent.is_empty() && d.epoch.is_valid(),
            CoordNoteBody::Notice(n) => !n.about.is_empty() && n.text.len() <= 16 * 1024,
        };
        ok.then_some(b)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A presence note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresenceBody {
    /// The state.
    pub state: PresenceState,
    /// What it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Subject>,
    /// Free text (at most 4 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A designation note: `agent` took `message` under the reply claim at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesignationBody {
    /// The message taken.
    pub message: InteractionId,
    /// The agent that took it (must be the note's actor).
    pub agent: String,
    /// The reply claim's epoch.
    pub epoch: ClaimEpoch,
}

/// A notice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeBody {
    /// What it is about, e.g. [`NoticeBody::TASK_ABANDONED`].
    pub about: String,
    /// Who should read it (`owner`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The task concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The text shown.
    pub text: String,
}

impl NoticeBody {
    /// `about` of the notice that a task failed for good.
    pub const TASK_ABANDONED: &'static str = "task-abandoned";
    /// An attempt ran past its task's deadline (`[due ...]`) and was failed.
    pub const TASK_OVERDUE: &'static str = "task-overdue";
    /// A task can never run: a dependency failed for good.
    pub const TASK_BLOCKED: &'static str = "task-blocked";
    /// A ready task no agent of the room can take: nobody declares what it needs.
    pub const TASK_UNSTAFFED: &'static str = "task-unstaffed";
    /// The room's token budget is spent: no new task is claimed.
    pub const BUDGET_SPENT: &'static str = "budget-spent";
}
