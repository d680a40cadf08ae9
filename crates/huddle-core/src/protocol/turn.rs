//! `turn.*` bodies, and the token use every turn reports.

use serde::{Deserialize, Serialize};

use super::claims::ClaimEpoch;
use super::coord::Subject;
use super::fields::truncate_text;
use crate::id::InteractionId;

/// Body of `turn.prompted` (actor = the agent; fenced by the drive claim).
///
/// `{"turn":"t/lobby/api/bo/4/9","subject":{"kind":"task","id":"api"},"epoch":4,"drive_epoch":9}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnPromptedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn is about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim (`reply/..` or `task/..`).
    pub epoch: ClaimEpoch,
    /// Epoch of the drive claim (`drive/..`, `reviewdrive/..`; for a task turn the task
    /// claim's own, since it names its driver relay — plan 0094; `taskdrive/..` before).
    pub drive_epoch: ClaimEpoch,
}

/// Body of `turn.replied` (actor = the agent; fenced by the claim of the turn).
///
/// `{"turn":"..","subject":{..},"epoch":4,"tokens":1200,"reply":"<64 hex>"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRepliedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn was about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim.
    pub epoch: ClaimEpoch,
    /// Tokens the turn used.
    #[serde(default)]
    pub tokens: u64,
    /// The id of the `message.posted` that carries the reply, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<InteractionId>,
    /// What the agent did during the turn, when its driver reports it.
    #[serde(default, skip_serializing_if = "TurnActivity::is_empty")]
    pub activity: TurnActivity,
}

/// Body of `turn.failed` (actor = the agent).
///
/// `{"turn":"..","subject":{..},"epoch":4,"reason":"exit status 1","tokens":10}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFailedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn was about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim.
    pub epoch: ClaimEpoch,
    /// Why it failed.
    #[serde(default)]
    pub reason: String,
    /// Tokens the turn used.
    #[serde(default)]
    pub tokens: u64,
    /// What the agent did before the turn failed, when its driver reports it.
    #[serde(default, skip_serializing_if = "TurnActivity::is_empty")]
    pub activity: TurnActivity,
}

/// Most entries each list of a [`TurnActivity`] keeps.
pub const MAX_ACTIVITY_ENTRIES: usize = 32;
/// Longest text (bytes) an activity entry keeps.
pub const MAX_ACTIVITY_TEXT: usize = 160;

/// What an agent did during a turn, as its driver saw it: the tool calls it made (the
/// last status each reached), its latest plan and the permission requests answered for
/// it. Bounded ([`MAX_ACTIVITY_ENTRIES`] per list, [`MAX_ACTIVITY_TEXT`] bytes per
/// text), so a busy turn still fits a row; `tool_calls` counts every call.
///
/// `{"tool_calls":2,"tools":[{"title":"Read a.rs","kind":"read","status":"completed"}],
///   "plan":[{"content":"read","status":"completed"}],
///   "permissions":[{"tool":"Edit a.rs","kind":"edit","answer":"reject-once"}]}`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnActivity {
    /// How many tool calls the agent made (all of them, not only those kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tool_calls: u64,
    /// The first [`MAX_ACTIVITY_ENTRIES`] tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolCallEntry>,
    /// The agent's latest plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<PlanEntry>,
    /// Permission requests and how the relay answered them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<PermissionEntry>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One tool call of a turn.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallEntry {
    /// What the agent said the call does.
    pub title: String,
    /// Its kind (`read`, `edit`, `execute`, ...).
    #[serde(default)]
    pub kind: String,
    /// The last status it reached (`pending`, `in_progress`, `completed`, `failed`).
    #[serde(default)]
    pub status: String,
}

/// One step of an agent's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// The step.
    pub content: String,
    /// Its status (`pending`, `in_progress`, `completed`).
    #[serde(default)]
    pub status: String,
}

/// A permission request the relay answered during a turn.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionEntry {
    /// The tool call asking.
    pub tool: String,
    /// Its kind.
    #[serde(default)]
    pub kind: String,
    /// The option chosen (`allow-once`, `reject-once`, ...) or `cancelled`.
    pub answer: String,
}

impl TurnActivity {
    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.tool_calls == 0
            && self.tools.is_empty()
            && self.plan.is_empty()
            && self.permissions.is_empty()
    }

    /// Notes a tool call `id` (or an update of it): a call seen before has its title,
    /// kind or status replaced by what the update carries; a new one is counted and kept
    /// while there is room. `seen` maps call ids to their index in `tools` (or `None`
    /// for a call counted but not kept).
    pub fn note_tool_call(
        &mut self,
        seen: &mut std::collections::HashMap<String, Option<usize>>,
        id: &str,
        title: Option<&str>,
        kind: Option<&str>,
        status: Option<&str>,
    ) {
        let slot = match seen.get(id) {
            Some(slot) => *slot,
            None => {
                self.tool_calls += 1;
                let slot = (self.tools.len() < MAX_ACTIVITY_ENTRIES).then(|| {
                    self.tools.push(ToolCallEntry::default());
                    self.tools.len() - 1
                });
                seen.insert(id.to_string(), slot);
                slot
            }
        };
        let Some(entry) = slot.and_then(|i| self.tools.get_mut(i)) else {
            return;
        };
        if let Some(t) = title {
            entry.title = truncate_text(t, MAX_ACTIVITY_TEXT);
        }
        if let Some(k) = kind {
            entry.kind = truncate_text(k, MAX_ACTIVITY_TEXT);
        }
        if let Some(s) = status {
            entry.status = truncate_text(s, MAX_ACTIVITY_TEXT);
        }
    }

    /// Replaces the plan with the agent's latest one.
    pub fn set_plan<'a>(&mut self, steps: impl IntoIterator<Item = (&'a str, &'a str)>) {
        self.plan = steps
            .into_iter()
            .take(MAX_ACTIVITY_ENTRIES)
            .map(|(content, status)| PlanEntry {
                content: truncate_text(content, MAX_ACTIVITY_TEXT),
                status: truncate_text(status, MAX_ACTIVITY_TEXT),
            })
            .collect();
    }

    /// Records a permission answer (the first [`MAX_ACTIVITY_ENTRIES`] are kept).
    pub fn note_permission(&mut self, tool: &str, kind: &str, answer: &str) {
        if self.permissions.len() < MAX_ACTIVITY_ENTRIES {
            self.permissions.push(PermissionEntry {
                tool: truncate_text(tool, MAX_ACTIVITY_TEXT),
                kind: truncate_text(kind, MAX_ACTIVITY_TEXT),
                answer: truncate_text(answer, MAX_ACTIVITY_TEXT),
            });
        }
    }
}

/// The part of a `turn.replied` / `turn.failed` body the budget fold reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsageBody {
    /// Tokens the turn used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensBody>,
}

/// Tokens used by one turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokensBody {
    /// A total.
    Total(u64),
    /// Input and output separately; their sum counts.
    Split {
        /// Prompt tokens.
        input: u64,
        /// Completion tokens.
        output: u64,
    },
}

impl TokensBody {
    /// The total.
    pub fn total(&self) -> u64 {
        match *self {
            TokensBody::Total(n) => n,
            TokensBody::Split { input, output } => input.saturating_add(output),
        }
    }
}

/// Longest progress note kept, in bytes.
pub const MAX_PROGRESS_BYTES: usize = 2_048;
/// Most progress notes one turn writes; later ones are dropped (counted in the log).
pub const MAX_PROGRESS_NOTES: u32 = 64;

/// Body of `turn.progress` (actor = the agent): an interim note of a running turn
/// ("still working: 3 of 5 files read"). Fenced by the turn's claims like its
/// `turn.prompted`, never closing them; it is not the reply and never answers the
/// message or completes the task. `seq` counts the turn's notes from 1, so repeating
/// the same text is a new note.
///
/// `{"turn":"r/lobby/1a2b../ann/3.7","subject":{"kind":"message","id":".."},"epoch":3,"seq":1,"text":"reading the logs"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnProgressBody {
    /// The turn id (empty for an agent acting for itself through MCP, which has none).
    #[serde(default)]
    pub turn: String,
    /// What the turn is about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim.
    pub epoch: ClaimEpoch,
    /// The note's number within its turn (1-based).
    pub seq: u32,
    /// The note (at most [`MAX_PROGRESS_BYTES`]).
    pub text: String,
}

impl TurnProgressBody {
    /// A note with its text trimmed and truncated to [`MAX_PROGRESS_BYTES`].
    pub fn new(turn: &str, subject: Subject, epoch: ClaimEpoch, seq: u32, text: &str) -> Self {
        TurnProgressBody {
            turn: turn.to_string(),
            subject,
            epoch,
            seq,
            text: truncate_text(text.trim(), MAX_PROGRESS_BYTES),
        }
    }
}
