//! `turn.*` bodies, and the token use every turn reports.
//!
//! A task turn's start and end may be carried by the task's own rows instead of
//! `turn.*` rows of their own (plan 0095): `task.claimed` carries the
//! `turn.prompted` body in its `turn` member, `task.completed` the `turn.replied`
//! body, `task.failed` / `task.released` the `turn.failed` body. [`carried_turn`]
//! reads either form, so no fold decodes both by itself.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::ClaimEpoch;
use super::coord::Subject;
use super::fields::truncate_text;
use crate::id::InteractionId;
use crate::verbs::Verb;

/// The member of a task row that carries its turn's body (plan 0095).
pub const TURN_MEMBER: &str = "turn";

/// The turn row a row of verb `verb` and body `body` stands for, as its verb and
/// body: a `turn.prompted` / `turn.replied` / `turn.failed` row itself, or a task row
/// carrying its turn in its [`TURN_MEMBER`] object (`task.claimed` →
/// `turn.prompted`, `task.completed` → `turn.replied`, `task.failed` and
/// `task.released` → `turn.failed`). Readers take the carried body as they take a
/// `turn.*` row's body from the same actor, role, room, thread and time. `None` for
/// any other row, and for a task row whose `turn` is absent or not an object (the row
/// still counts as the task's).
pub fn carried_turn(verb: Verb, body: &Value) -> Option<(Verb, &Value)> {
    let as_turn = match verb {
        Verb::TurnPrompted | Verb::TurnReplied | Verb::TurnFailed => return Some((verb, body)),
        Verb::TaskClaimed => Verb::TurnPrompted,
        Verb::TaskCompleted => Verb::TurnReplied,
        Verb::TaskFailed | Verb::TaskReleased => Verb::TurnFailed,
        _ => return None,
    };
    body.get(TURN_MEMBER)
        .filter(|t| t.is_object())
        .map(|t| (as_turn, t))
}

/// `task_body` with the turn row's body `turn` carried in it ([`carried_turn`] reads
/// it back): the task row of a task turn written in two rows (plan 0095).
pub fn carry_turn(mut task_body: Value, turn: Value) -> Value {
    if let Value::Object(m) = &mut task_body {
        m.insert(TURN_MEMBER.to_string(), turn);
    }
    task_body
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::Board;
    use crate::budget::BudgetFold;
    use crate::fold::Fold;
    use crate::model::{Interaction, Role};
    use crate::tasks::TaskDag;
    use crate::testing::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The task verb whose row carries a turn row of `verb`.
    fn carrier_of(verb: Verb) -> &'static [Verb] {
        match verb {
            Verb::TurnPrompted => &[Verb::TaskClaimed],
            Verb::TurnReplied => &[Verb::TaskCompleted],
            Verb::TurnFailed => &[Verb::TaskFailed, Verb::TaskReleased],
            _ => &[],
        }
    }

    /// A history in both forms, as a relay writes them: every turn row that follows
    /// its task row (same agent, task and epoch; only `task.rejected` rows between)
    /// is written at the task row's time (one append) in the four-row form, and
    /// carried by the task row in the two-row form. Rows keep their positions.
    fn both_forms(rows: &[Interaction]) -> (Vec<Interaction>, Vec<Interaction>, usize) {
        let mut four: Vec<Interaction> = Vec::new();
        let mut two: Vec<Interaction> = Vec::new();
        let mut carried = 0;
        for row in rows {
            let carrier = (row.role == Role::Agent)
                .then(|| {
                    two.iter()
                        .rposition(|r| r.actor == row.actor && r.verb != Verb::TaskRejected)
                })
                .flatten()
                .filter(|&k| {
                    let t = &two[k];
                    carrier_of(row.verb).contains(&t.verb)
                        && t.body.get(TURN_MEMBER).is_none()
                        && t.body["task"] == row.body["subject"]["id"]
                        && t.body["epoch"] == row.body["epoch"]
                        && two[k + 1..].iter().all(|r| r.verb == Verb::TaskRejected)
                });
            match carrier {
                Some(k) => {
                    let at = two[k].at;
                    two[k].body = carry_turn(two[k].body.clone(), row.body.clone());
                    let mut turn = row.clone();
                    turn.at = at;
                    four.push(turn);
                    carried += 1;
                }
                None => {
                    four.push(row.clone());
                    two.push(row.clone());
                }
            }
        }
        (four, two, carried)
    }

    fn hashes(rows: &[Interaction]) -> [[u8; 32]; 3] {
        [
            Board::rebuild(rows).state_hash(),
            BudgetFold::rebuild(rows).state_hash(),
            TaskDag::rebuild(rows).state_hash(),
        ]
    }

    proptest! {
        /// The board, the budget and the task DAG reach the same state from a room
        /// written with four rows a task turn and from the same room written with two.
        #[test]
        fn two_row_task_turns_fold_to_the_state_of_four(
            n_tasks in 1usize..8,
            n_agents in 1usize..4,
            choices in prop::collection::vec(any::<u8>(), 1..200),
        ) {
            let history = gen_history(n_tasks, n_agents, &choices);
            let (four, two, _) = both_forms(&linearize(&history, &[]));
            prop_assert_eq!(hashes(&four), hashes(&two));
        }
    }

    #[test]
    fn the_forms_compared_differ_in_rows() {
        // The property above compares forms that really differ: a history with
        // claims and completions has turns carried.
        let history = gen_history(4, 2, &(0u8..=255).collect::<Vec<_>>());
        let (four, two, carried) = both_forms(&linearize(&history, &[]));
        assert!(carried >= 4, "{carried} turns carried");
        assert_eq!(four.len(), two.len() + carried);
        let board = Board::rebuild(&two);
        let room = board.room(&two[0].room).unwrap();
        assert!(
            room.turns.values().any(|t| t.prompted.is_some()),
            "turns started from task rows"
        );
    }

    #[test]
    fn a_task_row_with_a_malformed_turn_still_counts_as_the_tasks() {
        let mut l = Ledger::default();
        l.push(created("api", &[]), crate::model::Timestamp(1));
        let plain = claimed("api", "bo", 1);
        for bad in [json!("t/lobby/api/bo/1.1"), json!({"turn": 7}), json!(null)] {
            let mut row = plain.clone();
            row.body["turn"] = bad.clone();
            let mut with = l.clone();
            with.push(row, crate::model::Timestamp(2));
            let mut without = l.clone();
            without.push(plain.clone(), crate::model::Timestamp(2));
            assert_eq!(
                TaskDag::rebuild(&with.rows).state_hash(),
                TaskDag::rebuild(&without.rows).state_hash(),
                "{bad}"
            );
            let b = Board::rebuild(&with.rows);
            let room = b.room(&with.rows[0].room).unwrap();
            assert!(room.turns.is_empty(), "{bad}: no turn started");
            assert_eq!(
                room.presence.get("bo").map(|p| p.state),
                Some(crate::protocol::PresenceState::Working),
                "{bad}"
            );
        }
        // The carried body is read for the verbs that carry one, never for others.
        let body = json!({"task": "api", "turn": {"turn": "x"}});
        assert!(carried_turn(Verb::TaskCreated, &body).is_none());
        assert!(carried_turn(Verb::TaskReviewed, &body).is_none());
        assert_eq!(
            carried_turn(Verb::TaskReleased, &body).map(|(v, _)| v),
            Some(Verb::TurnFailed)
        );
    }
}
