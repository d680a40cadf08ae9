//! The coordination board: per room, who is doing what, who took which message, and
//! notices for the owner; rendered into the `<coordination>` block at the top of a
//! turn's prompt, once per change.
//!
//! The board folds `coord.note`, `agent.registered`, `room.created`, the turn verbs
//! (`turn.prompted`, `turn.replied`, `turn.failed`) and the task verbs that move an
//! agent (`task.claimed`, `task.completed`, `task.failed`, `task.released`).
//!
//! Determinism: an agent's presence is taken only from interactions that agent wrote
//! (actor = agent, role `agent`), so it follows that actor's own order. Everything
//! several actors may write about one thing (a message's designation, a subject's open
//! turn) is merged by the claim epoch, a total order that does not depend on arrival.
//! The state holds no ledger positions. Folding any interleaving that keeps each
//! actor's order and the causal order therefore gives the same state hash.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, Role, Timestamp};
use crate::protocol::task::{valid_capability, valid_task_id, MAX_CAPABILITIES};
use crate::protocol::{carried_turn, parse_body, truncate_text, ClaimEpoch};
use crate::tasks::TaskSummary;
use crate::verbs::Verb;

pub use crate::protocol::coord::{
    CoordNoteBody, DesignationBody, NoticeBody, PresenceBody, PresenceState, Subject, SubjectKind,
};
pub use crate::protocol::room::{
    AgentRegisteredBody, MessageBody, RoomCreatedBody, DEFAULT_PRIORITY,
};
pub use crate::protocol::turn::{
    TurnFailedBody, TurnProgressBody, TurnPromptedBody, TurnRepliedBody,
};

/// The verbs the board folds.
const FOLDED: &[Verb] = &[
    Verb::RoomCreated,
    Verb::AgentRegistered,
    Verb::CoordNote,
    Verb::TurnPrompted,
    Verb::TurnReplied,
    Verb::TurnFailed,
    Verb::TaskClaimed,
    Verb::TaskCompleted,
    Verb::TaskFailed,
    Verb::TaskReleased,
    Verb::TurnProgress,
];

/// Most designations shown in a `<coordination>` block (the most recent).
pub const RENDER_DESIGNATIONS: usize = 10;
/// Most notices shown in a `<coordination>` block (the most recent).
pub const RENDER_NOTICES: usize = 5;
/// Most other agents listed in a `<coordination>` block: those whose presence changed
/// last; the rest are counted by state. A turn's block then costs the same in a room
/// of 300 agents as in one of 30, and so does the prompt.
pub const RENDER_AGENTS: usize = 24;

// ---------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------

/// An agent's latest presence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    /// The state.
    pub state: PresenceState,
    /// What it is about.
    pub on: Option<Subject>,
    /// Free text from a presence note.
    pub note: Option<String>,
    /// Since when (database time of the interaction that set it).
    pub since: Timestamp,
}

/// Who took a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Designation {
    /// The agent.
    pub agent: String,
    /// The reply claim's epoch.
    pub epoch: ClaimEpoch,
    /// When it was noted.
    pub at: Timestamp,
}

/// What an agent declared when it registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentProfile {
    /// Capabilities, sorted and de-duplicated.
    pub capabilities: Vec<String>,
    /// Rank under `role-priority` (lower first).
    pub priority: u32,
}

/// A notice shown on the board.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// What it is about.
    pub about: String,
    /// The task concerned.
    pub task: Option<String>,
    /// The text.
    pub text: String,
    /// When it was noted.
    pub at: Timestamp,
}

/// The latest turn of one subject, merged by the subject's claim epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectTurns {
    /// The prompted turn with the highest epoch: `(epoch, turn id, agent)`.
    pub prompted: Option<(ClaimEpoch, String, String)>,
    /// The highest epoch of an ended turn.
    pub ended: Option<ClaimEpoch>,
    /// When the subject's latest turn row was written (database time): a closed
    /// subject is kept for [`CLOSED_TURN_WINDOW_US`] after it.
    pub last: Timestamp,
}

impl Default for SubjectTurns {
    fn default() -> Self {
        SubjectTurns {
            prompted: None,
            ended: None,
            last: Timestamp(0),
        }
    }
}

impl SubjectTurns {
    /// Whether the latest prompted turn has not ended.
    pub fn is_open(&self) -> bool {
        match &self.prompted {
            Some((e, _, _)) => self.ended.is_none_or(|end| end < *e),
            None => false,
        }
    }
}

/// The board of one room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomBoard {
    /// The owner named by `room.created`.
    pub owner: Option<String>,
    /// Registered agents.
    pub agents: BTreeMap<String, AgentProfile>,
    /// Latest presence per agent.
    pub presence: BTreeMap<String, Presence>,
    /// Designation per message (hex id).
    pub designations: BTreeMap<String, Designation>,
    /// Notices by interaction id (hex).
    pub notices: BTreeMap<String, Notice>,
    /// Turns per subject key (`task:<id>`, `message:<hex>`).
    pub turns: BTreeMap<String, SubjectTurns>,
    /// Coordination bodies that did not fit their schema.
    pub malformed: u64,
    /// Per agent, its failed turns since its last successful one (the circuit
    /// breaker's input, [`crate::pacing`]); agents with none are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failing: BTreeMap<String, FailStreak>,
    /// `designations` ordered by `(at, key)`, for the block's newest lines: derived,
    /// never serialized (state hashes and snapshots are unchanged), rebuilt at the
    /// first designation folded after a snapshot was read.
    #[serde(skip)]
    recent: RecentDesignations,
    /// The closed subjects of `turns` by their last row: derived, never serialized,
    /// built at the first turn row folded after a snapshot was read.
    #[serde(skip)]
    closed: ClosedTurns,
}

/// The closed subjects of a room's turns ordered by `(last row, key)`, and the newest
/// turn row's time (see [`RoomBoard`]); `None` until built. Always equal to another:
/// it is derived from the map beside it, which the comparison covers.
#[derive(Clone, Debug, Default)]
struct ClosedTurns(Option<(std::collections::BTreeSet<(Timestamp, String)>, Timestamp)>);

impl PartialEq for ClosedTurns {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ClosedTurns {}

/// How long after its last turn row a room's board keeps a subject whose turns have
/// all ended, µs, counted back from the room's newest turn row: as long as a
/// designation ([`DESIGNATION_WINDOW_US`]). Only open turns are read (who is working
/// on what); without a window every task and every answered message would stay on
/// every relay's board, and in its snapshots, for the life of the room. Open subjects
/// are kept however old.
pub const CLOSED_TURN_WINDOW_US: i64 = DESIGNATION_WINDOW_US;

/// The designations of a room in time order (see [`RoomBoard`]). Always equal to
/// another: it is derived from the map beside it, which the comparison covers.
#[derive(Clone, Debug, Default)]
struct RecentDesignations(std::collections::BTreeSet<(Timestamp, String)>);

impl PartialEq for RecentDesignations {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RecentDesignations {}

/// How far back from its newest designation a room's board keeps designations, µs:
/// the longest `reply-horizon` (24 hours). A designation matters while its message is
/// open — who answers it — and a message is given up once older than the horizon
/// (a turn still running on it holds the reply claim, which is what excludes others);
/// older designations would only make every relay's memory grow with the
/// conversation (~100 bytes per answered message).
pub const DESIGNATION_WINDOW_US: i64 = 24 * 3600 * 1_000_000;

/// Designations looked at, newest first, for the block's lines when the reader made
/// the newest ones itself: older ones are long answered.
const DESIGNATIONS_SCANNED: usize = 1_000;

/// An agent's failed turns in a row: counted from its own `turn.failed` rows (those
/// [`counts_against_agent`]), reset by its next `turn.replied`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailStreak {
    /// Failed turns in a row.
    pub failed: u32,
    /// When the last of them was written (database time).
    pub last: Timestamp,
}

/// Whether a failed turn with this reason counts against its agent for the circuit
/// breaker: not a turn that never started (the relay was late), not one cut short by
/// a lost claim, a relay shutting down or the owner's `!stop` — those say nothing of
/// the agent. The reasons are the relay's own texts, so every reader agrees.
pub fn counts_against_agent(reason: &str) -> bool {
    !(reason.starts_with("not started")
        || reason.starts_with("cancelled")
        || reason.starts_with("stopped by the owner")
        || reason == "the claim was lost before the turn ended")
}

impl RoomBoard {
    /// The newest [`RENDER_DESIGNATIONS`] designations not made by `reader`, newest
    /// first: from the time-ordered index (a walk back over at most
    /// [`DESIGNATIONS_SCANNED`] of them), or, before the index is built (a board read
    /// from a snapshot), in one pass over the map.
    fn newest_designations(&self, reader: &str) -> Vec<(String, Designation)> {
        if self.recent.0.len() != self.designations.len() {
            return self.newest_designations_in_one_pass(reader);
        }
        self.recent
            .0
            .iter()
            .rev()
            .take(DESIGNATIONS_SCANNED)
            .filter_map(|(_, key)| self.designations.get_key_value(key))
            .filter(|(_, d)| d.agent != reader)
            .take(RENDER_DESIGNATIONS)
            .map(|(m, d)| (m.clone(), d.clone()))
            .collect()
    }

    /// [`RoomBoard::newest_designations`] without the index: one pass over the map.
    fn newest_designations_in_one_pass(&self, reader: &str) -> Vec<(String, Designation)> {
        newest(
            self.designations.iter().filter(|(_, d)| d.agent != reader),
            RENDER_DESIGNATIONS,
            |d| d.at,
        )
        .into_iter()
        .map(|(m, d)| (m.clone(), d.clone()))
        .collect()
    }

    /// The id of the latest prompted turn of subject `key` (the highest epoch), while
    /// the board keeps the subject.
    pub fn prompted_turn(&self, key: &str) -> Option<&str> {
        self.turns
            .get(key)
            .and_then(|t| t.prompted.as_ref())
            .map(|(_, turn, _)| turn.as_str())
    }

    /// Turns in flight (prompted, not ended), as `(subject key, turn id, agent)`.
    pub fn open_turns(&self) -> Vec<(&str, &str, &str)> {
        self.turns
            .iter()
            .filter(|(_, t)| t.is_open())
            .filter_map(|(k, t)| {
                t.prompted
                    .as_ref()
                    .map(|(_, turn, agent)| (k.as_str(), turn.as_str(), agent.as_str()))
            })
            .collect()
    }

    /// Folds a turn row written at `at` into subject `key`'s record with `update`,
    /// then drops the closed subjects whose last row lies more than
    /// [`CLOSED_TURN_WINDOW_US`] before the room's newest turn row (a row older than
    /// that for a subject already dropped makes a closed record that goes at once).
    fn turn_row(&mut self, key: String, at: Timestamp, update: impl FnOnce(&mut SubjectTurns)) {
        let (closed, newest) = self.closed.0.get_or_insert_with(|| {
            // Read from a snapshot (the index is not stored): build it.
            let closed = self
                .turns
                .iter()
                .filter(|(_, t)| !t.is_open())
                .map(|(k, t)| (t.last, k.clone()))
                .collect();
            let newest = self.turns.values().map(|t| t.last).max().unwrap_or(at);
            (closed, newest)
        });
        let entry = self.turns.entry(key.clone()).or_default();
        if !entry.is_open() {
            closed.remove(&(entry.last, key.clone()));
        }
        update(entry);
        entry.last = entry.last.max(at);
        if !entry.is_open() {
            closed.insert((entry.last, key));
        }
        *newest = (*newest).max(at);
        let cutoff = newest.saturating_sub(CLOSED_TURN_WINDOW_US);
        while closed.first().is_some_and(|(last, _)| *last < cutoff) {
            if let Some((_, old)) = closed.pop_first() {
                self.turns.remove(&old);
            }
        }
    }

    /// Moves `agent`'s [`FailStreak`] by one of its own turn endings (`replied`, or
    /// failed with `body`'s reason) at `at`.
    fn note_streak(&mut self, agent: &str, at: Timestamp, replied: bool, body: &Value) {
        if replied {
            self.failing.remove(agent);
            return;
        }
        let counts = body
            .get("reason")
            .and_then(Value::as_str)
            .is_none_or(counts_against_agent);
        if counts {
            let s = self.failing.entry(agent.to_string()).or_insert(FailStreak {
                failed: 0,
                last: at,
            });
            s.failed = s.failed.saturating_add(1);
            s.last = s.last.max(at);
        }
    }

    fn set_presence(
        &mut self,
        agent: &str,
        state: PresenceState,
        on: Option<Subject>,
        at: Timestamp,
    ) {
        self.presence.insert(
            agent.to_string(),
            Presence {
                state,
                on,
                note: None,
                since: at,
            },
        );
    }

    fn apply(&mut self, i: &Interaction) {
        match i.verb {
            Verb::RoomCreated if self.owner.is_none() => {
                let b: RoomCreatedBody = parse_body(&i.body).unwrap_or_default();
                self.owner = Some(b.owner.unwrap_or_else(|| i.actor.clone()));
            }
            Verb::AgentRegistered if i.role == Role::Agent => {
                let Some(b) = parse_body::<AgentRegisteredBody>(&i.body) else {
                    self.malformed += 1;
                    return;
                };
                let mut caps: Vec<String> = b
                    .capabilities
                    .into_iter()
                    .filter(|c| valid_capability(c))
                    .take(MAX_CAPABILITIES)
                    .collect();
                caps.sort();
                caps.dedup();
                self.agents.insert(
                    i.actor.clone(),
                    AgentProfile {
                        capabilities: caps,
                        priority: b.priority.unwrap_or(DEFAULT_PRIORITY),
                    },
                );
                self.set_presence(&i.actor, PresenceState::Idle, None, i.at);
            }
            Verb::CoordNote => self.note(i),
            // A progress note keeps the agent working on its subject and says how it
            // goes; it ends nothing.
            Verb::TurnProgress if i.role == Role::Agent => {
                let Some(b) = parse_body::<TurnProgressBody>(&i.body) else {
                    self.malformed += 1;
                    return;
                };
                let on = self
                    .presence
                    .get(&i.actor)
                    .and_then(|p| p.on.clone())
                    .filter(|s| s.key() == b.subject.key())
                    .unwrap_or(b.subject);
                self.presence.insert(
                    i.actor.clone(),
                    Presence {
                        state: PresenceState::Working,
                        on: Some(on),
                        note: Some(truncate_text(&b.text, 200)),
                        since: i.at,
                    },
                );
            }
            Verb::TaskClaimed | Verb::TaskCompleted | Verb::TaskFailed | Verb::TaskReleased
                if i.role == Role::Agent =>
            {
                let Some(task) = i.body.get("task").and_then(Value::as_str) else {
                    return;
                };
                if !valid_task_id(task) {
                    return;
                }
                let state = match i.verb {
                    Verb::TaskClaimed => PresenceState::Working,
                    Verb::TaskCompleted => PresenceState::Done,
                    Verb::TaskFailed => PresenceState::Failed,
                    _ => PresenceState::Idle,
                };
                // Keep the label a turn.prompted may already have given the subject.
                let label = self
                    .presence
                    .get(&i.actor)
                    .and_then(|p| p.on.as_ref())
                    .filter(|s| s.kind == SubjectKind::Task && s.id == task)
                    .and_then(|s| s.label.clone());
                self.set_presence(&i.actor, state, Some(Subject::task(task, label)), i.at);
            }
            _ => {}
        }
        // A turn's start or end: a `turn.*` row, or the task row carrying it (plan
        // 0095), read after the task row's own effect as if it followed it.
        if i.role == Role::Agent {
            if let Some((verb, body)) = carried_turn(i.verb, &i.body) {
                self.apply_turn(i, verb, body);
            }
        }
    }

    /// A turn's `turn.prompted` / `turn.replied` / `turn.failed` (`verb`, `body`)
    /// by agent `i.actor`, at `i.at`.
    fn apply_turn(&mut self, i: &Interaction, verb: Verb, body: &Value) {
        match verb {
            Verb::TurnPrompted => {
                let Some(b) = parse_body::<TurnPromptedBody>(body) else {
                    self.malformed += 1;
                    return;
                };
                let cand = (b.epoch, b.turn.clone(), i.actor.clone());
                self.turn_row(b.subject.key(), i.at, |entry| {
                    if entry.prompted.as_ref().is_none_or(|p| cand > *p) {
                        entry.prompted = Some(cand);
                    }
                });
                self.set_presence(&i.actor, PresenceState::Working, Some(b.subject), i.at);
            }
            _ => {
                let replied = verb == Verb::TurnReplied;
                let parsed = if replied {
                    parse_body::<TurnRepliedBody>(body).map(|b| (b.subject, b.epoch))
                } else {
                    parse_body::<TurnFailedBody>(body).map(|b| (b.subject, b.epoch))
                };
                let Some((subject, epoch)) = parsed else {
                    self.malformed += 1;
                    return;
                };
                self.note_streak(&i.actor, i.at, replied, body);
                self.turn_row(subject.key(), i.at, |entry| {
                    entry.ended = Some(entry.ended.map_or(epoch, |e| e.max(epoch)));
                });
                let state = if replied {
                    PresenceState::Done
                } else {
                    PresenceState::Failed
                };
                self.set_presence(&i.actor, state, Some(subject), i.at);
            }
        }
    }

    fn note(&mut self, i: &Interaction) {
        let Some(note) = CoordNoteBody::parse(&i.body) else {
            self.malformed += 1;
            return;
        };
        match note {
            CoordNoteBody::Presence(p) if i.role == Role::Agent => {
                self.presence.insert(
                    i.actor.clone(),
                    Presence {
                        state: p.state,
                        on: p.on,
                        note: p.note,
                        since: i.at,
                    },
                );
            }
            CoordNoteBody::Designation(d) if d.agent == i.actor => {
                if self.recent.0.len() != self.designations.len() {
                    // Read from a snapshot (the index is not stored): build it.
                    self.recent.0 = self
                        .designations
                        .iter()
                        .map(|(k, d)| (d.at, k.clone()))
                        .collect();
                }
                // Only the window behind the newest designation is kept. A message's
                // designations come in epoch order in time too (each is fenced by its
                // reply claim, taken after the previous epoch's lapsed), so what is
                // kept is the same in any order the notes are folded: per message
                // the best designation, if it lies in the window.
                let newest = self.recent.0.last().map_or(i.at, |(at, _)| (*at).max(i.at));
                let cutoff = newest.saturating_sub(DESIGNATION_WINDOW_US);
                while self.recent.0.first().is_some_and(|(at, _)| *at < cutoff) {
                    if let Some((_, old)) = self.recent.0.pop_first() {
                        self.designations.remove(&old);
                    }
                }
                let key = d.message.to_hex();
                let better = i.at >= cutoff
                    && match self.designations.get(&key) {
                        Some(cur) => (d.epoch, &d.agent) > (cur.epoch, &cur.agent),
                        None => true,
                    };
                if better {
                    if let Some(old) = self.designations.insert(
                        key.clone(),
                        Designation {
                            agent: d.agent,
                            epoch: d.epoch,
                            at: i.at,
                        },
                    ) {
                        self.recent.0.remove(&(old.at, key.clone()));
                    }
                    self.recent.0.insert((i.at, key));
                }
            }
            // Notices reach every agent's prompt: only huddle and the owner post them.
            CoordNoteBody::Notice(n) if matches!(i.role, Role::System | Role::Owner) => {
                self.notices.insert(
                    i.id.to_hex(),
                    Notice {
                        about: n.about,
                        task: n.task,
                        text: n.text,
                        at: i.at,
                    },
                );
            }
            _ => {}
        }
    }
}

/// The board fold over every room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Board {
    rooms: BTreeMap<String, RoomBoard>,
}

impl Board {
    /// An empty board.
    pub fn new() -> Self {
        Self::default()
    }

    /// A room's board.
    pub fn room(&self, room: &str) -> Option<&RoomBoard> {
        self.rooms.get(room)
    }

    /// The room's registered agents with their capabilities (addressing's view: who
    /// `@name` and `@@capability` can reach).
    pub fn capabilities(&self, room: &str) -> std::collections::BTreeMap<String, Vec<String>> {
        self.room(room)
            .map(|b| {
                b.agents
                    .iter()
                    .map(|(a, p)| (a.clone(), p.capabilities.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Rooms with a board, sorted.
    pub fn rooms(&self) -> impl Iterator<Item = &str> {
        self.rooms.keys().map(String::as_str)
    }

    /// Who took `message`, if anyone.
    pub fn designation(&self, room: &str, message: &InteractionId) -> Option<&Designation> {
        self.rooms.get(room)?.designations.get(&message.to_hex())
    }

    /// The `<coordination>` block for `reader` in `room`: the board minus the reader
    /// (its own presence and the messages it took), plus the room's task summary when
    /// given. `None` when there is nothing to show.
    pub fn coordination(
        &self,
        room: &str,
        reader: &str,
        tasks: Option<TaskSummary>,
    ) -> Option<CoordinationBlock> {
        self.coordination_with(room, reader, tasks, PatternLines::default())
    }

    /// [`Board::coordination`] with the room's coordination patterns: open decisions
    /// (and those escalated to the owner), open barriers, the coordinator lease and
    /// pending approval requests, each list cut to a few lines.
    pub fn coordination_with(
        &self,
        room: &str,
        reader: &str,
        tasks: Option<TaskSummary>,
        patterns: PatternLines,
    ) -> Option<CoordinationBlock> {
        let mut view = CoordinationView::build(self.rooms.get(room), room, reader, tasks);
        view.patterns = patterns.cut();
        if view.is_empty() {
            return None;
        }
        // The version is the hash of the text itself: it changes exactly when the text
        // does, and costs one pass over the text instead of a canonical encoding of the
        // view (which was most of a turn start's cost).
        let text = view.render();
        let version = *blake3::hash(text.as_bytes()).as_bytes();
        Some(CoordinationBlock { text, version })
    }
}

impl Fold for Board {
    fn apply(&mut self, interaction: &Interaction) {
        if FOLDED.contains(&interaction.verb) {
            self.rooms
                .entry(interaction.room.clone())
                .or_default()
                .apply(interaction);
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

// ---------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------

/// A rendered `<coordination>` block and the version of what it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinationBlock {
    /// The text, starting `<coordination room="..">` and ending `</coordination>`.
    pub text: String,
    /// A hash of what the block shows; changes exactly when the text would.
    pub version: [u8; 32],
}

/// Lines of each pattern list the block shows at most.
pub const RENDER_PATTERN_LINES: usize = 5;

/// The coordination patterns of a room, as the `<coordination>` block shows them
/// ([`Board::coordination_with`]): already summarised by the reader of the pattern
/// folds, since the board itself does not fold them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PatternLines {
    /// Open decisions, and decisions escalated to the owner.
    pub decisions: Vec<DecisionLine>,
    /// Barriers still waiting.
    pub barriers: Vec<BarrierLine>,
    /// The coordinator lease, while someone holds it.
    pub coordinator: Option<LeaseLine>,
    /// Approval requests the owner has not answered.
    pub approvals: Vec<ApprovalLine>,
    /// Shared resources held (files, APIs, build slots), by resource.
    pub resources: Vec<ResourceLine>,
    /// Agents the circuit breaker benched, until when ([`crate::pacing::benched`]).
    pub benched: Vec<BenchedLine>,
}

/// An agent benched by the circuit breaker: offered no work until `until`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchedLine {
    /// The agent.
    pub agent: String,
    /// Its failed turns in a row.
    pub failed: u32,
    /// Until when it is benched.
    pub until: Timestamp,
}

/// Resource holdings the block shows at most (the rest are counted).
pub const RENDER_RESOURCE_LINES: usize = 12;

impl PatternLines {
    fn cut(mut self) -> Self {
        self.decisions.truncate(RENDER_PATTERN_LINES);
        self.barriers.truncate(RENDER_PATTERN_LINES);
        self.approvals.truncate(RENDER_PATTERN_LINES);
        self
    }

    fn is_empty(&self) -> bool {
        self.decisions.is_empty()
            && self.barriers.is_empty()
            && self.coordinator.is_none()
            && self.approvals.is_empty()
            && self.resources.is_empty()
            && self.benched.is_empty()
    }
}

/// What the block shows of `room`'s held resources at `now` (every recorded holding
/// when the time is not known yet), by resource then holder.
pub fn resource_lines(
    fold: &crate::resources::ResourceFold,
    room: &str,
    now: Option<Timestamp>,
) -> Vec<ResourceLine> {
    fold.held(room, now.unwrap_or(Timestamp::MIN))
        .into_iter()
        .map(|h| ResourceLine {
            name: h.name.to_string(),
            holder: h.holder,
            mode: h.mode.as_text(),
            until: h.expires_at,
        })
        .collect()
}

/// A held resource in the block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResourceLine {
    /// The resource (`file:src/**`, `api:github`, ...).
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// `exclusive`, `shared` or `permits-N`.
    pub mode: String,
    /// Until when, unless renewed.
    pub until: Timestamp,
}

/// A decision in the block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionLine {
    /// Its id.
    pub id: String,
    /// `open` or `escalated`.
    pub status: String,
    /// The question.
    pub question: String,
    /// Voters who have not voted (open ones).
    pub waiting_for: Vec<String>,
    /// When voting closes.
    pub deadline: Timestamp,
}

/// A waiting barrier in the block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BarrierLine {
    /// Its phase.
    pub phase: String,
    /// Who has not checked in.
    pub missing: Vec<String>,
    /// When it times out.
    pub deadline: Timestamp,
}

/// The held coordinator lease in the block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeaseLine {
    /// The lease's name.
    pub name: String,
    /// Its holder.
    pub holder: String,
    /// Its epoch (directives carry it).
    pub epoch: u64,
    /// Until when, unless renewed.
    pub until: Timestamp,
}

/// A pending approval request in the block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApprovalLine {
    /// Its id.
    pub id: String,
    /// Who asked.
    pub by: String,
    /// What for.
    pub action: String,
}

/// What a reader is shown: the board minus the reader. Serialised to version it.
#[derive(Debug, Serialize)]
struct CoordinationView {
    room: String,
    owner: Option<String>,
    agents: Vec<(String, Presence)>,
    /// Agents not listed, by state (in [`PresenceState`] order).
    more_agents: Vec<(&'static str, usize)>,
    taken: Vec<(String, Designation)>,
    notices: Vec<Notice>,
    tasks: Option<TaskSummary>,
    patterns: PatternLines,
}

/// The `n` newest of `items` by `(at, key)`, newest first (ties: the greater key
/// first), in one pass that keeps only `n` of them.
fn newest<'a, V>(
    items: impl Iterator<Item = (&'a String, &'a V)>,
    n: usize,
    at: impl Fn(&V) -> Timestamp,
) -> Vec<(&'a String, &'a V)> {
    let mut kept: Vec<(&'a String, &'a V)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return kept;
    }
    let rank = |x: &(&'a String, &'a V)| (at(x.1), x.0);
    for item in items {
        if kept.len() == n && rank(&item) <= rank(&kept[n - 1]) {
            continue;
        }
        let at_pos = kept.partition_point(|k| rank(k) > rank(&item));
        kept.insert(at_pos, item);
        kept.truncate(n);
    }
    kept
}

impl CoordinationView {
    fn build(
        board: Option<&RoomBoard>,
        room: &str,
        reader: &str,
        tasks: Option<TaskSummary>,
    ) -> Self {
        let mut view = CoordinationView {
            room: room.to_string(),
            owner: None,
            agents: Vec::new(),
            more_agents: Vec::new(),
            taken: Vec::new(),
            notices: Vec::new(),
            tasks: tasks.filter(|t| t.total > 0),
            patterns: PatternLines::default(),
        };
        let Some(b) = board else {
            return view;
        };
        view.owner = b.owner.clone();
        let mut peers: Vec<(&String, &Presence)> = b
            .presence
            .iter()
            .filter(|(a, _)| a.as_str() != reader)
            .collect();
        if peers.len() > RENDER_AGENTS {
            // The most recently changed first; the rest counted, not listed.
            peers.select_nth_unstable_by(RENDER_AGENTS - 1, |x, y| {
                (y.1.since, y.0).cmp(&(x.1.since, x.0))
            });
            let mut counts = [0usize; 4];
            for (_, p) in &peers[RENDER_AGENTS..] {
                counts[p.state as usize] += 1;
            }
            view.more_agents = [
                PresenceState::Working,
                PresenceState::Idle,
                PresenceState::Done,
                PresenceState::Failed,
            ]
            .into_iter()
            .map(|s| (s.as_str(), counts[s as usize]))
            .filter(|(_, n)| *n > 0)
            .collect();
            peers.truncate(RENDER_AGENTS);
            peers.sort_by(|x, y| x.0.cmp(y.0));
        }
        view.agents = peers
            .into_iter()
            .map(|(a, p)| (a.clone(), p.clone()))
            .collect();
        // Only the newest few are shown: picked in one pass, without copying or
        // sorting a room's whole history (a room that answered 50,000 messages made
        // every turn start copy and sort 50,000 designations; plan 0069).
        view.taken = b.newest_designations(reader);
        view.notices = newest(b.notices.iter(), RENDER_NOTICES, |n| n.at)
            .into_iter()
            .map(|(_, n)| n.clone())
            .collect();
        view
    }

    fn is_empty(&self) -> bool {
        self.agents.is_empty()
            && self.taken.is_empty()
            && self.notices.is_empty()
            && self.tasks.is_none()
            && self.patterns.is_empty()
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "<coordination room=\"{}\">", Clean(&self.room, 256));
        if let Some(o) = &self.owner {
            let _ = writeln!(out, "owner: {}", Clean(o, 256));
        }
        if !self.agents.is_empty() {
            out.push_str("agents:\n");
            for (agent, p) in &self.agents {
                let _ = write!(out, "- {}: {}", Clean(agent, 256), p.state.as_str());
                if let Some(on) = &p.on {
                    let _ = write!(out, " on {}", Describe(on));
                }
                let _ = write!(out, " since {}", Iso(p.since));
                if let Some(n) = &p.note {
                    let _ = write!(out, " ({})", Clean(n, 200));
                }
                out.push('\n');
            }
            if !self.more_agents.is_empty() {
                let total: usize = self.more_agents.iter().map(|(_, n)| n).sum();
                let by_state: Vec<String> = self
                    .more_agents
                    .iter()
                    .map(|(s, n)| format!("{n} {s}"))
                    .collect();
                let _ = writeln!(out, "- and {total} more: {}", by_state.join(", "));
            }
        }
        if !self.patterns.benched.is_empty() {
            out.push_str("benched:\n");
            for b in &self.patterns.benched {
                let _ = writeln!(
                    out,
                    "- {}: {} failed turns in a row; offered no work until {}",
                    Clean(&b.agent, 256),
                    b.failed,
                    Iso(b.until)
                );
            }
        }
        if !self.taken.is_empty() {
            out.push_str("taken:\n");
            for (message, d) in &self.taken {
                let _ = writeln!(
                    out,
                    "- message {} by {}",
                    short_hex(message),
                    Clean(&d.agent, 256)
                );
            }
        }
        if let Some(t) = &self.tasks {
            let _ = writeln!(
                out,
                "tasks: {} total, {} done, {} claimed, {} ready, {} waiting, {} blocked, {} failed for good",
                t.total, t.done, t.claimed, t.ready, t.waiting, t.blocked, t.abandoned
            );
        }
        self.render_patterns(&mut out);
        if !self.notices.is_empty() {
            out.push_str("notices:\n");
            for n in &self.notices {
                let _ = writeln!(out, "- {}", Clean(&n.text, 600));
            }
        }
        out.push_str("</coordination>\n");
        out
    }
}

impl CoordinationView {
    fn render_patterns(&self, out: &mut String) {
        let p = &self.patterns;
        let names = |v: &[String]| {
            let shown: Vec<String> = v.iter().take(8).map(|n| clean(n, 64)).collect();
            let more = v.len().saturating_sub(8);
            match more {
                0 => shown.join(", "),
                n => format!("{}, +{n}", shown.join(", ")),
            }
        };
        if !p.decisions.is_empty() {
            out.push_str("decisions:\n");
            for d in &p.decisions {
                let _ = write!(out, "- {} ({})", Clean(&d.id, 64), Clean(&d.status, 16));
                if !d.question.is_empty() {
                    let _ = write!(out, " \"{}\"", Clean(&d.question, 120));
                }
                if d.status == "open" {
                    if !d.waiting_for.is_empty() {
                        let _ = write!(out, " waiting for {}", names(&d.waiting_for));
                    }
                    let _ = write!(out, "; closes {}", Iso(d.deadline));
                } else {
                    out.push_str(": the owner decides");
                }
                out.push('\n');
            }
        }
        if !p.barriers.is_empty() {
            out.push_str("barriers:\n");
            for b in &p.barriers {
                let _ = writeln!(
                    out,
                    "- {} waiting for {}; times out {}",
                    Clean(&b.phase, 64),
                    names(&b.missing),
                    Iso(b.deadline)
                );
            }
        }
        if let Some(l) = &p.coordinator {
            let _ = writeln!(
                out,
                "lease {}: {} at epoch {} until {}",
                Clean(&l.name, 64),
                Clean(&l.holder, 256),
                l.epoch,
                Iso(l.until)
            );
        }
        if !p.resources.is_empty() {
            out.push_str("resources held:\n");
            for r in p.resources.iter().take(RENDER_RESOURCE_LINES) {
                let _ = writeln!(
                    out,
                    "- {} {} by {} until {}",
                    Clean(&r.name, 200),
                    Clean(&r.mode, 24),
                    Clean(&r.holder, 256),
                    Iso(r.until)
                );
            }
            if p.resources.len() > RENDER_RESOURCE_LINES {
                let _ = writeln!(out, "- +{} more", p.resources.len() - RENDER_RESOURCE_LINES);
            }
        }
        if !p.approvals.is_empty() {
            out.push_str("approvals pending:\n");
            for a in &p.approvals {
                let _ = writeln!(
                    out,
                    "- {} by {}: {}",
                    Clean(&a.id, 64),
                    Clean(&a.by, 256),
                    Clean(&a.action, 160)
                );
            }
        }
    }
}

/// Remembers, per room and reader, the version of the last `<coordination>` block
/// delivered, so each change is delivered once, and when the block was last looked
/// at, so it is rendered at most once per refresh interval (plan 0092).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinationDelivery {
    last: BTreeMap<String, BTreeMap<String, Seen>>,
}

/// What a reader was last shown in a room, and when its block was last looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    version: Option<[u8; 32]>,
    looked: Timestamp,
}

impl CoordinationDelivery {
    /// A tracker that has delivered nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `reader`'s block in `room` is to be looked at again at `now`: never
    /// looked at, or last looked at `every_us` or more before `now`.
    pub fn due(&self, room: &str, reader: &str, now: Timestamp, every_us: i64) -> bool {
        self.last
            .get(room)
            .and_then(|r| r.get(reader))
            .is_none_or(|s| now >= s.looked.saturating_add(every_us))
    }

    /// Returns the block's text if its version differs from the last one delivered
    /// to `reader` in `room`, and records it as delivered; `None` when unchanged (or
    /// when there is no block). Either way `now` is recorded as the last look.
    pub fn take_fresh(
        &mut self,
        room: &str,
        reader: &str,
        block: Option<&CoordinationBlock>,
        now: Timestamp,
    ) -> Option<String> {
        let readers = match self.last.get_mut(room) {
            Some(r) => r,
            None => self.last.entry(room.to_string()).or_default(),
        };
        let seen = match readers.get_mut(reader) {
            Some(s) => s,
            None => readers.entry(reader.to_string()).or_insert(Seen {
                version: None,
                looked: now,
            }),
        };
        seen.looked = now;
        let block = block?;
        if seen.version == Some(block.version) {
            return None;
        }
        seen.version = Some(block.version);
        Some(block.text.clone())
    }
}

/// Text from the ledger made safe for a one-line prompt field: control characters
/// become spaces, angle brackets become `‹ ›` (so no text can close the block), and
/// it is cut to `max` bytes.
pub fn clean(text: &str, max: usize) -> String {
    Clean(text, max).to_string()
}

/// [`clean`] as a [`std::fmt::Display`]: written straight into the block, with no
/// copy of the text (the block is rendered at every turn start).
pub struct Clean<'a>(pub &'a str, pub usize);

impl std::fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Clean(text, max) = *self;
        // The mapped text cut at the last character that fits in `max` bytes, as
        // `truncate_text` cuts it; unmapped runs are written as slices.
        let mut used = 0usize;
        let mut run_start = 0usize;
        for (i, c) in text.char_indices() {
            let mapped = match c {
                '<' => Some('‹'),
                '>' => Some('›'),
                c if c.is_control() => Some(' '),
                _ => None,
            };
            let out = mapped.unwrap_or(c);
            if used + out.len_utf8() > max {
                f.write_str(&text[run_start..i])?;
                return Ok(());
            }
            used += out.len_utf8();
            if let Some(m) = mapped {
                f.write_str(&text[run_start..i])?;
                f.write_char(m)?;
                run_start = i + c.len_utf8();
            }
        }
        f.write_str(&text[run_start..])
    }
}

/// A subject as one line of the `<coordination>` block.
struct Describe<'a>(&'a Subject);

impl std::fmt::Display for Describe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let subject = self.0;
        let id = Clean(&subject.id, 128);
        match (subject.kind, &subject.label) {
            (SubjectKind::Message, _) => write!(f, "message {}", short_hex(&subject.id)),
            (SubjectKind::Task, Some(l)) => write!(f, "task {id} \"{}\"", Clean(l, 80)),
            (SubjectKind::Task, None) => write!(f, "task {id}"),
            (SubjectKind::Review, Some(l)) => {
                write!(f, "review of task {id} \"{}\"", Clean(l, 80))
            }
            (SubjectKind::Review, None) => write!(f, "review of task {id}"),
        }
    }
}

/// The first 12 characters of an id, cleaned.
fn short_hex(id: &str) -> Clean<'_> {
    let end = id.char_indices().nth(12).map_or(id.len(), |(i, _)| i);
    Clean(&id[..end], 12)
}

/// Formats microseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn format_timestamp(us: Timestamp) -> String {
    Iso(us).to_string()
}

/// [`format_timestamp`] as a [`std::fmt::Display`], written without a copy.
pub struct Iso(pub Timestamp);

impl std::fmt::Display for Iso {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.0.as_micros().div_euclid(1_000_000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // case tables
mod tests {
    use super::*;
    use crate::model::NewInteraction;
    use crate::testing::{
        claimed, completed, every_pair, hashes_in_two_orders, history_and_order, ix, Ledger,
    };
    use proptest::prelude::*;
    use serde_json::json;

    const T0: Timestamp = Timestamp(1_700_000_000_000_000); // 2023-11-14T22:13:20Z

    fn fold(rows: Vec<NewInteraction>) -> Board {
        let mut l = Ledger::default();
        for (n, r) in rows.into_iter().enumerate() {
            l.push(r, T0 + n as i64 * 1_000_000);
        }
        Board::rebuild(&l.rows)
    }

    fn presence(b: &Board, agent: &str) -> Option<(PresenceState, Option<String>)> {
        b.room("lobby")?
            .presence
            .get(agent)
            .map(|p| (p.state, p.on.as_ref().map(Subject::key)))
    }

    fn note(actor: &str, role: Role, body: Value) -> NewInteraction {
        ix(Verb::CoordNote, actor, role, body)
    }

    fn prompted(agent: &str, task: &str, epoch: i64) -> NewInteraction {
        ix(
            Verb::TurnPrompted,
            agent,
            Role::Agent,
            json!({"turn": format!("{task}-{epoch}"), "subject": {"kind": "task", "id": task, "label": "Build"}, "epoch": epoch, "drive_epoch": 1}),
        )
    }

    fn replied(agent: &str, task: &str, epoch: i64) -> NewInteraction {
        ix(
            Verb::TurnReplied,
            agent,
            Role::Agent,
            json!({"turn": format!("{task}-{epoch}"), "subject": {"kind": "task", "id": task}, "epoch": epoch, "tokens": 3}),
        )
    }

    fn designation(actor: &str, agent: &str, msg: u8, epoch: i64) -> NewInteraction {
        note(
            actor,
            Role::Agent,
            json!({"kind": "designation", "message": InteractionId([msg; 32]).to_hex(), "agent": agent, "epoch": epoch}),
        )
    }

    #[test]
    fn presence_follows_the_agents_own_rows() {
        use PresenceState::*;
        let reg = ix(
            Verb::AgentRegistered,
            "bo",
            Role::Agent,
            json!({"capabilities": ["rust"]}),
        );
        // (rows, expected presence of bo)
        let cases: Vec<(Vec<NewInteraction>, Option<(PresenceState, Option<&str>)>)> = vec![
            (vec![], None),
            (vec![reg.clone()], Some((Idle, None))),
            (
                vec![prompted("bo", "api", 1)],
                Some((Working, Some("task:api"))),
            ),
            (
                vec![prompted("bo", "api", 1), replied("bo", "api", 1)],
                Some((Done, Some("task:api"))),
            ),
            (
                vec![claimed("db", "bo", 1)],
                Some((Working, Some("task:db"))),
            ),
            (
                vec![claimed("db", "bo", 1), completed("db", "bo", 1)],
                Some((Done, Some("task:db"))),
            ),
            (
                vec![note(
                    "bo",
                    Role::Agent,
                    json!({"kind": "presence", "state": "failed"}),
                )],
                Some((Failed, None)),
            ),
            // Someone else's rows never set bo's presence.
            (vec![prompted("cy", "api", 1)], None),
            (
                vec![note(
                    "bo",
                    Role::Human,
                    json!({"kind": "presence", "state": "idle"}),
                )],
                None,
            ),
        ];
        for (i, (rows, want)) in cases.into_iter().enumerate() {
            let b = fold(rows);
            let want = want.map(|(s, on)| (s, on.map(str::to_string)));
            assert_eq!(presence(&b, "bo"), want, "case {i}");
        }
    }

    #[test]
    fn designation_is_the_highest_epoch_from_the_taker_itself() {
        let m = InteractionId([1; 32]);
        let cases: Vec<(Vec<NewInteraction>, Option<(&str, i64)>)> = vec![
            (vec![designation("bo", "bo", 1, 1)], Some(("bo", 1))),
            (vec![designation("cy", "bo", 1, 1)], None),
            (
                vec![designation("bo", "bo", 1, 2), designation("cy", "cy", 1, 1)],
                Some(("bo", 2)),
            ),
            (
                vec![designation("cy", "cy", 1, 1), designation("bo", "bo", 1, 2)],
                Some(("bo", 2)),
            ),
        ];
        for (i, (rows, want)) in cases.into_iter().enumerate() {
            let b = fold(rows);
            let got = b
                .designation("lobby", &m)
                .map(|d| (d.agent.as_str(), d.epoch.get()));
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn open_turns_close_by_epoch() {
        let b = fold(vec![prompted("bo", "api", 1)]);
        assert_eq!(b.room("lobby").unwrap().open_turns().len(), 1);
        let b = fold(vec![prompted("bo", "api", 1), replied("bo", "api", 1)]);
        assert!(b.room("lobby").unwrap().open_turns().is_empty());
        // A re-take's turn supersedes the dead one; its end closes the subject.
        let b = fold(vec![
            prompted("bo", "api", 1),
            prompted("cy", "api", 2),
            replied("cy", "api", 2),
        ]);
        assert!(b.room("lobby").unwrap().open_turns().is_empty());
    }

    #[test]
    fn coordination_block_is_the_board_minus_the_reader() {
        let b = fold(vec![
            ix(
                Verb::RoomCreated,
                "ana",
                Role::Owner,
                json!({"owner": "ana"}),
            ),
            ix(Verb::AgentRegistered, "bo", Role::Agent, json!({})),
            ix(Verb::AgentRegistered, "cy", Role::Agent, json!({})),
            prompted("cy", "api", 1),
            designation("bo", "bo", 0xab, 1),
            note(
                "huddle",
                Role::System,
                json!({"kind": "notice", "about": "task-abandoned", "task": "x", "text": "task x failed </coordination> for good"}),
            ),
        ]);
        let block = b.coordination("lobby", "bo", None).unwrap();
        let want = "<coordination room=\"lobby\">\n\
owner: ana\n\
agents:\n\
- cy: working on task api \"Build\" since 2023-11-14T22:13:23Z\n\
notices:\n\
- task x failed ‹/coordination› for good\n\
</coordination>\n";
        assert_eq!(block.text, want);
        let for_cy = b.coordination("lobby", "cy", None).unwrap();
        assert!(for_cy
            .text
            .contains("- bo: idle since 2023-11-14T22:13:21Z"));
        assert!(for_cy
            .text
            .contains(&format!("- message {} by bo", &"ab".repeat(6))));
        assert_ne!(block.version, for_cy.version);
        // Deterministic: the same board renders the same block.
        assert_eq!(b.coordination("lobby", "bo", None), Some(block));
        // An empty board shows nothing.
        assert_eq!(Board::new().coordination("lobby", "bo", None), None);
    }

    #[test]
    fn a_large_room_lists_the_latest_agents_and_counts_the_rest() {
        // 40 agents register (idle), then the last 10 start working: the block lists
        // the 24 whose presence changed last and counts the other 16 by state.
        let mut rows: Vec<NewInteraction> = (0..40)
            .map(|n| {
                ix(
                    Verb::AgentRegistered,
                    &format!("a{n:02}"),
                    Role::Agent,
                    json!({}),
                )
            })
            .collect();
        rows.extend((30..40).map(|n| prompted(&format!("a{n:02}"), &format!("t{n}"), 1)));
        let b = fold(rows);
        let block = b.coordination("lobby", "a39", None).unwrap().text;
        let listed: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("- "))
            .filter(|l| l.starts_with('a') && !l.starts_with("and "))
            .map(|l| l.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(listed.len(), RENDER_AGENTS, "{block}");
        // The reader is left out; the 9 other working agents and the 15 latest idle
        // ones (a15..a29) are listed, sorted by name.
        let want: Vec<String> = (15..39).map(|n| format!("a{n:02}")).collect();
        assert_eq!(listed, want, "{block}");
        assert!(block.contains("- and 15 more: 15 idle\n"), "{block}");
        // A small room is listed whole, with no count line.
        let small = fold(
            (0..5)
                .map(|n| {
                    ix(
                        Verb::AgentRegistered,
                        &format!("a{n}"),
                        Role::Agent,
                        json!({}),
                    )
                })
                .collect(),
        );
        let text = small.coordination("lobby", "a0", None).unwrap().text;
        assert_eq!(text.matches("\n- a").count(), 4, "{text}");
        assert!(!text.contains("more:"), "{text}");
    }

    #[test]
    fn delivery_is_once_per_change() {
        let t = Timestamp(1_000_000);
        let mut rows = vec![prompted("cy", "api", 1)];
        let mut d = CoordinationDelivery::new();
        let b = fold(rows.clone());
        let block = b.coordination("lobby", "bo", None);
        assert!(d.take_fresh("lobby", "bo", block.as_ref(), t).is_some());
        assert!(d.take_fresh("lobby", "bo", block.as_ref(), t).is_none());
        // Another reader gets its own first delivery.
        let other = b.coordination("lobby", "dee", None);
        assert!(d.take_fresh("lobby", "dee", other.as_ref(), t).is_some());
        // A change of the reader's own presence is not a change for it.
        rows.push(prompted("bo", "db", 1));
        let b = fold(rows.clone());
        assert!(d
            .take_fresh(
                "lobby",
                "bo",
                b.coordination("lobby", "bo", None).as_ref(),
                t
            )
            .is_none());
        // A change of someone else's is.
        rows.push(replied("cy", "api", 1));
        let b = fold(rows);
        assert!(d
            .take_fresh(
                "lobby",
                "bo",
                b.coordination("lobby", "bo", None).as_ref(),
                t
            )
            .is_some());
    }

    #[test]
    fn a_block_is_due_a_refresh_interval_after_the_last_look() {
        let every = 1_000_000;
        let t = Timestamp(5_000_000);
        let mut d = CoordinationDelivery::new();
        // Never looked at: due, whatever the time.
        assert!(d.due("lobby", "bo", t, every));
        let b = fold(vec![prompted("cy", "api", 1)]);
        d.take_fresh(
            "lobby",
            "bo",
            b.coordination("lobby", "bo", None).as_ref(),
            t,
        );
        assert!(!d.due("lobby", "bo", t, every));
        assert!(!d.due("lobby", "bo", t.saturating_add(every - 1), every));
        assert!(d.due("lobby", "bo", t.saturating_add(every), every));
        // Per reader and per room.
        assert!(d.due("lobby", "dee", t, every));
        assert!(d.due("other", "bo", t, every));
        // A look that found no block is a look too.
        d.take_fresh("other", "bo", None, t);
        assert!(!d.due("other", "bo", t, every));
        // An interval of zero: every turn start looks.
        assert!(d.due("lobby", "bo", t, 0));
    }

    /// `Clean` writes exactly what mapping every character and then cutting the
    /// result to `max` bytes at a character boundary gives (how `clean` was written
    /// before it became a `Display`).
    #[test]
    fn clean_maps_then_cuts_at_a_character_boundary() {
        fn reference(text: &str, max: usize) -> String {
            let s: String = text
                .chars()
                .map(|c| match c {
                    '<' => '‹',
                    '>' => '›',
                    c if c.is_control() => ' ',
                    c => c,
                })
                .collect();
            truncate_text(&s, max)
        }
        let texts = [
            "",
            "plain",
            "<b>bold</b>",
            "tab\there\nnew line\u{7}",
            "ünïcödé <é> 漢字",
            "<<<<",
            "a\u{0}b",
            "😀<😀>😀",
        ];
        for text in texts {
            for max in 0..=text.len() * 3 + 2 {
                assert_eq!(
                    Clean(text, max).to_string(),
                    reference(text, max),
                    "{text:?} cut at {max}"
                );
            }
        }
        assert_eq!(short_hex("0123456789abcdef").to_string(), "0123456789ab");
        assert_eq!(short_hex("<ab>").to_string(), "‹ab›");
    }

    #[test]
    fn timestamps_format_as_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (T0.as_micros(), "2023-11-14T22:13:20Z"),
            (951_782_400_000_000, "2000-02-29T00:00:00Z"),
            (-1_000_000, "1969-12-31T23:59:59Z"),
        ];
        for (us, want) in cases {
            assert_eq!(format_timestamp(Timestamp(us)), want);
        }
        assert!(!format_timestamp(Timestamp(i64::MAX)).is_empty());
        assert!(!format_timestamp(Timestamp(i64::MIN)).is_empty());
    }

    #[test]
    fn malformed_bodies_are_ignored_never_panic() {
        let bodies = [
            json!(null),
            json!([]),
            json!({"kind": "presence"}),
            json!({"kind": "presence", "state": "sleeping"}),
            json!({"kind": "designation", "message": "zz", "agent": "bo", "epoch": 1}),
            json!({"kind": "designation", "message": InteractionId([1; 32]).to_hex(), "agent": "", "epoch": 1}),
            json!({"kind": "unknown"}),
            json!({"turn": 1}),
            json!({"capabilities": "rust"}),
            json!({"task": 7}),
            json!({"owner": 7}),
        ];
        let b = fold(every_pair(FOLDED, &bodies, "bo", Role::Agent));
        let r = b.room("lobby").unwrap();
        assert!(r.designations.is_empty() && r.turns.is_empty());
        assert!(r.malformed > 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any interleaving that keeps each actor's order and the causal order gives
        /// the same board state hash.
        #[test]
        fn board_is_interleaving_invariant((history, order) in history_and_order()) {
            let (reference, shuffled) = hashes_in_two_orders::<Board>(&history, &order);
            prop_assert_eq!(reference, shuffled);
        }
    }

    #[test]
    fn a_closed_turn_leaves_the_board_a_window_after_its_last_row_and_an_open_one_stays() {
        let mut l = Ledger::default();
        let mut b = Board::new();
        let keys =
            |b: &Board| -> Vec<String> { b.room("lobby").unwrap().turns.keys().cloned().collect() };
        b.apply(&l.push(prompted("bo", "api", 1), T0));
        b.apply(&l.push(replied("bo", "api", 1), T0 + 1_000_000));
        b.apply(&l.push(prompted("cy", "long", 1), T0));
        // Exactly the window after `api`'s last row: kept.
        let day_on = T0 + 1_000_000 + CLOSED_TURN_WINDOW_US;
        b.apply(&l.push(prompted("bo", "db", 1), day_on));
        assert_eq!(keys(&b), ["task:api", "task:db", "task:long"]);
        // One µs later: `api` (closed) goes, `long` (open a day) stays.
        b.apply(&l.push(prompted("bo", "ui", 1), day_on + 1));
        assert_eq!(keys(&b), ["task:db", "task:long", "task:ui"]);
        let open: Vec<&str> = b
            .room("lobby")
            .unwrap()
            .open_turns()
            .into_iter()
            .map(|(k, _, _)| k)
            .collect();
        assert_eq!(open, ["task:db", "task:long", "task:ui"]);
        // A late row for the dropped subject, older than the window, goes at once.
        b.apply(&l.push(replied("bo", "api", 1), T0 + 1_000_000));
        assert_eq!(keys(&b), ["task:db", "task:long", "task:ui"]);
        // Closing `long` a day after it began keeps it for a window from then.
        b.apply(&l.push(replied("cy", "long", 1), day_on + 2));
        assert_eq!(keys(&b), ["task:db", "task:long", "task:ui"]);
        assert!(!b.room("lobby").unwrap().turns["task:long"].is_open());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Folded in ledger order (turn rows in time order, each subject's prompted
        /// epochs rising), a room keeps every open subject however old and every
        /// closed one whose last row is within [`CLOSED_TURN_WINDOW_US`] of the
        /// newest, with the open turns and last rows a fold without the window
        /// gives; a snapshot taken part way changes nothing.
        #[test]
        fn closed_turns_older_than_the_window_are_dropped(
            events in proptest::collection::vec((0u8..6, proptest::prelude::any::<bool>(), 0u8..4, 0i64..10), 1..80),
            cut in 0usize..80,
        ) {
            const H: i64 = 3_600_000_000;
            let mut epochs = [0i64; 6];
            let mut t = T0;
            let mut rows: Vec<(NewInteraction, Timestamp)> = Vec::new();
            // Without the window: per subject, (prompted, ended, last).
            let mut all: BTreeMap<String, (Option<i64>, Option<i64>, Timestamp)> = BTreeMap::new();
            for (subject, prompt, back, hours) in events {
                t += hours * 4 * H;
                let task = format!("t{subject}");
                let e = &mut epochs[subject as usize];
                let row = if prompt || *e == 0 {
                    *e += 1;
                    prompted("bo", &task, *e)
                } else {
                    replied("bo", &task, (*e - i64::from(back)).max(1))
                };
                let rec = all.entry(format!("task:{task}")).or_insert((None, None, t));
                let epoch = row.body["epoch"].as_i64().unwrap();
                if row.verb == Verb::TurnPrompted {
                    rec.0 = rec.0.max(Some(epoch));
                } else {
                    rec.1 = rec.1.max(Some(epoch));
                }
                rec.2 = t;
                rows.push((row, t));
            }
            let open = |p: Option<i64>, e: Option<i64>| p.is_some_and(|p| e.is_none_or(|e| e < p));
            let newest = rows.iter().map(|r| r.1).max().unwrap();
            let cutoff = newest.saturating_sub(CLOSED_TURN_WINDOW_US);
            let expected: BTreeMap<String, (bool, Option<i64>, Timestamp)> = all
                .into_iter()
                .filter(|(_, (p, e, last))| open(*p, *e) || *last >= cutoff)
                .map(|(k, (p, e, last))| (k, (open(p, e), p.filter(|_| open(p, e)), last)))
                .collect();
            let mut l = Ledger::default();
            let mut b = Board::new();
            for (k, (row, at)) in rows.into_iter().enumerate() {
                b.apply(&l.push(row, at));
                if k == cut {
                    let text = serde_json::to_string(&b).unwrap();
                    let restored: Board = serde_json::from_str(&text).unwrap();
                    proptest::prop_assert_eq!(restored.state_hash(), b.state_hash());
                    b = restored;
                }
            }
            let got: BTreeMap<String, (bool, Option<i64>, Timestamp)> = b
                .room("lobby")
                .unwrap()
                .turns
                .iter()
                .map(|(k, t)| {
                    let p = t.prompted.as_ref().filter(|_| t.is_open()).map(|p| p.0.get());
                    (k.clone(), (t.is_open(), p, t.last))
                })
                .collect();
            proptest::prop_assert_eq!(got, expected);
        }
    }
}

#[cfg(test)]
mod newest_tests {
    use super::*;
    use crate::model::NewInteraction;
    use crate::protocol::{CoordNoteBody, DesignationBody};
    use crate::testing::Ledger;
    use crate::{ClaimEpoch, InteractionId, Role, Verb};

    /// A designation note of `agent` for message `m` at `epoch`.
    fn note(m: u8, agent: &str, epoch: i64) -> NewInteraction {
        NewInteraction::new(
            "lobby",
            Verb::CoordNote,
            agent,
            Role::Agent,
            CoordNoteBody::Designation(DesignationBody {
                message: InteractionId([m; 32]),
                agent: agent.into(),
                epoch: ClaimEpoch(epoch),
            })
            .to_body(),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// The time-ordered index gives the block the same lines as a full pass, as
        /// notes arrive (new messages, better epochs replacing a designation, stale
        /// ones ignored, equal times), and after a snapshot, whose board has no index
        /// until its next note.
        #[test]
        fn the_index_shows_what_a_full_pass_shows(
            notes in proptest::collection::vec((0u8..25, 0usize..3, 1i64..4, 0i64..3), 1..80),
            cut in 0usize..80,
        ) {
            let agents = ["ana", "bo", "cy"];
            let mut l = Ledger::default();
            let mut t = Timestamp(1_000);
            let mut b = Board::new();
            for (k, (m, a, e, dt)) in notes.iter().enumerate() {
                t = Timestamp(t.0 + dt);
                let before = b.room("lobby").map(|r| r.designations.clone());
                b.apply(&l.push(note(*m, agents[*a], *e), t));
                let changed = before.as_ref() != b.room("lobby").map(|r| &r.designations);
                if k == cut {
                    let text = serde_json::to_string(&b).unwrap();
                    let restored: Board = serde_json::from_str(&text).unwrap();
                    proptest::prop_assert_eq!(restored.state_hash(), b.state_hash());
                    b = restored;
                }
                let room = b.room("lobby").unwrap();
                // A note that changed the designations leaves the index in use (on a
                // board read from a snapshot, it is built then).
                if changed && k != cut {
                    proptest::prop_assert_eq!(room.recent.0.len(), room.designations.len());
                }
                for reader in agents {
                    proptest::prop_assert_eq!(
                        room.newest_designations(reader),
                        room.newest_designations_in_one_pass(reader)
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// A room keeps, per message, its best designation if it lies within
        /// [`DESIGNATION_WINDOW_US`] of the room's newest one — whatever order the notes
        /// are folded in (a message's epochs come in time order), and across a
        /// snapshot taken part way.
        #[test]
        fn designations_older_than_the_window_are_dropped_in_any_order(
            plan in proptest::collection::vec((1usize..4, 0i64..30), 1..24),
            order in proptest::collection::vec(proptest::prelude::any::<u32>(), 80),
            cut in 0usize..80,
        ) {
            const H: i64 = 3_600_000_000;
            let agents = ["ana", "bo", "cy"];
            // Entry m: message m gets `n` designations (epochs 1..=n, one agent each)
            // one hour apart from hour h on.
            let mut notes: Vec<(u8, &str, i64, Timestamp)> = Vec::new();
            for (m, (n, h)) in plan.iter().enumerate() {
                for e in 1..=*n {
                    let at = Timestamp(1_000 + (h + e as i64) * H + m as i64);
                    notes.push((m as u8, agents[e % 3], e as i64, at));
                }
            }
            // Expected: per message the highest epoch; kept if within the window.
            let newest = notes.iter().map(|n| n.3).max().unwrap();
            let mut expected: BTreeMap<String, Designation> = BTreeMap::new();
            for (m, a, e, at) in &notes {
                let key = InteractionId([*m; 32]).to_hex();
                if expected.get(&key).is_none_or(|d| d.epoch.0 < *e) {
                    expected.insert(key, Designation { agent: a.to_string(), epoch: ClaimEpoch(*e), at: *at });
                }
            }
            expected.retain(|_, d| d.at >= newest.saturating_sub(DESIGNATION_WINDOW_US));
            // Folded in a shuffled order.
            let mut shuffled: Vec<usize> = (0..notes.len()).collect();
            for (k, r) in order.iter().enumerate().take(notes.len()) {
                let j = k + (*r as usize) % (notes.len() - k);
                shuffled.swap(k, j);
            }
            let mut l = Ledger::default();
            let mut b = Board::new();
            for (k, idx) in shuffled.iter().enumerate() {
                let (m, a, e, at) = notes[*idx];
                b.apply(&l.push(note(m, a, e), at));
                if k == cut {
                    let text = serde_json::to_string(&b).unwrap();
                    b = serde_json::from_str(&text).unwrap();
                }
            }
            let room = b.room("lobby").unwrap();
            proptest::prop_assert_eq!(&room.designations, &expected);
            for reader in agents {
                proptest::prop_assert_eq!(
                    room.newest_designations(reader),
                    room.newest_designations_in_one_pass(reader)
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// The one-pass pick is the full sort's head: newest first by (at, key).
        #[test]
        fn newest_is_the_head_of_the_full_sort(
            items in proptest::collection::btree_map("[a-f]{1,3}", 0i64..20, 0..60),
            n in 0usize..12,
        ) {
            let items: BTreeMap<String, Timestamp> =
                items.into_iter().map(|(k, t)| (k, Timestamp(t))).collect();
            let mut all: Vec<(&String, &Timestamp)> = items.iter().collect();
            all.sort_by(|x, y| (*y.1, y.0).cmp(&(*x.1, x.0)));
            all.truncate(n);
            proptest::prop_assert_eq!(newest(items.iter(), n, |t| *t), all);
        }
    }
}
