//! `huddle board` and `huddle tasks`: a room's folded state, from any machine that
//! can read the ledger.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::bail;
use huddle_core::board::Subject;
use huddle_core::tasks::{BlockedBy, TaskSummary};
use huddle_core::{ClaimEpoch, ConfigFold, Position, TaskStatus, Timestamp};
use huddle_sim::render::clip;
use huddle_sim::Tally;
use huddle_store::{Store, StoreOptions, Subscription};
use serde::Serialize;

use crate::ledger_cmds;
use crate::output::format_time;

/// Writes `text` to standard output; a closed pipe (`| head`) is not an error.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Everything the room views (`huddle board`, `huddle tasks`, the dashboard) are
/// built from: the room's rows that the relays act on (a `task.created` or
/// `config.set` no signed owner command produced is left out, as the relays leave it
/// out) folded through the task tally, the config, the relays' heartbeats and the
/// patterns (decisions, barriers, leases, resources, shared state). The CLI folds one
/// from the start of the room; `huddle serve` keeps one per room and folds new rows
/// into it as they come (plan 0055), so both build their views from the same state.
pub struct RoomState {
    admitted: Admitted,
    /// The report fold: task DAG, board, per-agent counts.
    pub tally: Tally,
    /// The room's config (room and thread overlays).
    pub config: ConfigFold,
    /// Each relay's latest heartbeat.
    pub relays: huddle_core::relays::RelayFold,
    /// Decisions, barriers, leases, resources and shared state.
    pub patterns: huddle_agent::Patterns,
}

impl RoomState {
    /// An empty state of `room`.
    pub fn new(room: &str) -> RoomState {
        RoomState {
            admitted: Admitted::new(room),
            tally: Tally::new(room),
            config: ConfigFold::new(),
            relays: huddle_core::relays::RelayFold::new(),
            patterns: huddle_agent::Patterns::new(),
        }
    }

    /// The room.
    pub fn room(&self) -> &str {
        &self.admitted.room
    }

    /// Folds `rows` in ledger order (rows of other rooms are ignored); whether any
    /// changed the state.
    pub fn fold(&mut self, rows: &[huddle_core::Interaction]) -> bool {
        let mut moved = false;
        for r in rows {
            if self.admitted.admits(r) {
                self.tally.apply(r);
                huddle_core::Fold::apply(&mut self.config, r);
                huddle_core::Fold::apply(&mut self.relays, r);
                huddle_core::Fold::apply(&mut self.patterns, r);
                moved = true;
            }
        }
        moved
    }

    /// Fails when the room was never created (no `room.created` folded yet).
    pub fn created(&self) -> anyhow::Result<()> {
        self.admitted.created()
    }

    /// The room's owners and keys as the relays' owner authority folds them (only
    /// verified rotations count): whom to sign a command for.
    pub fn authority(&self) -> &ConfigFold {
        self.admitted.authority.config()
    }
}

/// The state of `room` folded from its first row; fails when the room was never
/// created.
pub async fn room_state(store: &dyn Store, room: &str) -> anyhow::Result<RoomState> {
    let mut state = RoomState::new(room);
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 5000).await?;
        state.fold(&batch.rows);
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    state.created()?;
    Ok(state)
}

/// Passes every row of `room` the relays would act on to `apply`, in ledger order;
/// fails when the room was never created.
pub async fn fold_admitted(
    store: &dyn Store,
    room: &str,
    mut apply: impl FnMut(&huddle_core::Interaction),
) -> anyhow::Result<()> {
    let mut admitted = Admitted::new(room);
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 5000).await?;
        for r in &batch.rows {
            if admitted.admits(r) {
                apply(r);
            }
        }
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    admitted.created()
}

/// Which rows of a room the relays act on, row by row in ledger order: the owner
/// authority's judgement, and whether the room was ever created.
struct Admitted {
    room: String,
    authority: huddle_core::OwnerAuthority,
    created: bool,
    /// The room's `room.archived` row, if its owner archived it.
    archived: Option<huddle_core::Interaction>,
}

impl Admitted {
    fn new(room: &str) -> Self {
        Admitted {
            room: room.to_string(),
            authority: huddle_core::OwnerAuthority::new(),
            created: false,
            archived: None,
        }
    }

    /// Folds `r` into the authority; whether it is a row of the room the relays act on.
    fn admits(&mut self, r: &huddle_core::Interaction) -> bool {
        if r.room != self.room {
            return false;
        }
        self.created |= r.verb == huddle_core::Verb::RoomCreated;
        if r.verb == huddle_core::Verb::RoomArchived {
            self.archived = Some(r.clone());
        }
        huddle_core::Fold::apply(&mut self.authority, r);
        self.authority.admits(r)
    }

    /// Fails when the room was never created.
    fn created(&self) -> anyhow::Result<()> {
        let room = &self.room;
        if let (false, Some(row)) = (self.created, &self.archived) {
            bail!("{}", crate::archive_cmds::archived_note(room, row));
        }
        if !self.created {
            bail!("room {room:?} does not exist in this database (create it with `huddle room create {room} --owner NAME`)");
        }
        Ok(())
    }
}

/// One agent on the board.
#[derive(Debug, Serialize)]
pub struct BoardAgent {
    /// Agent key.
    pub agent: String,
    /// `working`, `idle`, `done`, `failed`.
    pub state: String,
    /// What it is on.
    pub on: Option<Subject>,
    /// Since when (database time); `None` while no presence is known.
    pub since: Option<Timestamp>,
    /// Declared capabilities.
    pub capabilities: Vec<String>,
    /// Completions accepted from it.
    pub tasks_done: u64,
    /// Turns it was prompted for.
    pub turns: u64,
    /// Its failed turns.
    pub failed_turns: u64,
    /// Tokens of its turns.
    pub tokens: u64,
    /// Its latest progress or presence note.
    pub note: Option<String>,
    /// `online` / `offline (relay r0 down)` by its relays' leases; `None` when no
    /// relay heartbeat lists it.
    pub hosting: Option<String>,
}

/// A designation: who took a message.
#[derive(Debug, Serialize)]
pub struct BoardDesignation {
    /// Message id (hex).
    pub message: String,
    /// The agent that took it.
    pub agent: String,
    /// The reply claim's epoch.
    pub epoch: ClaimEpoch,
    /// When.
    pub at: Timestamp,
}

/// A notice for the owner.
#[derive(Debug, Serialize)]
pub struct BoardNotice {
    /// What about.
    pub about: String,
    /// Task concerned.
    pub task: Option<String>,
    /// Text.
    pub text: String,
    /// When.
    pub at: Timestamp,
}

/// `huddle board --json`.
#[derive(Debug, Serialize)]
pub struct BoardView {
    /// Room.
    pub room: String,
    /// Owner.
    pub owner: Option<String>,
    /// Task counts.
    pub tasks: TaskSummary,
    /// Agents, by key.
    pub agents: Vec<BoardAgent>,
    /// Designations, oldest first.
    pub designations: Vec<BoardDesignation>,
    /// Notices, oldest first.
    pub notices: Vec<BoardNotice>,
    /// Turns in flight: (subject, turn, agent).
    pub open_turns: Vec<(String, String, String)>,
    /// Messages whose named agents owe an answer but no live relay hosts them.
    pub waiting_on_absent: Vec<crate::status_cmds::AbsentWait>,
    /// Shared resources held now (the database's view), by resource.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<huddle_agent::resource_views::HoldingView>,
    /// Shared state: every key with its current version, by key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<huddle_agent::resource_views::StateView>,
    /// Agents the circuit breaker benched now (`breaker`), and until when.
    pub benched: Vec<huddle_core::board::BenchedLine>,
    /// Tasks that cannot make progress as things stand, and why.
    pub stuck: Vec<huddle_core::pacing::StuckTask>,
}

fn board_view(t: &Tally) -> BoardView {
    let room = &t.room;
    let b = t.board.room(room);
    let mut keys: Vec<String> = Vec::new();
    if let Some(b) = b {
        keys.extend(b.agents.keys().cloned());
        keys.extend(b.presence.keys().cloned());
    }
    keys.sort();
    keys.dedup();
    let agents = keys
        .into_iter()
        .map(|agent| {
            let p = b.and_then(|b| b.presence.get(&agent));
            let tally = t.agents.get(&agent).cloned().unwrap_or_default();
            BoardAgent {
                state: p.map_or("unknown", |p| p.state.as_str()).to_string(),
                on: p.and_then(|p| p.on.clone()),
                since: p.map(|p| p.since),
                capabilities: b
                    .and_then(|b| b.agents.get(&agent))
                    .map(|a| a.capabilities.clone())
                    .unwrap_or_default(),
                tasks_done: tally.tasks_done,
                turns: tally.turns,
                failed_turns: tally.failed_turns,
                tokens: tally.tokens,
                note: p.and_then(|p| p.note.clone()),
                hosting: None,
                agent,
            }
        })
        .collect();
    let mut designations: Vec<BoardDesignation> = b
        .map(|b| {
            b.designations
                .iter()
                .map(|(m, d)| BoardDesignation {
                    message: m.clone(),
                    agent: d.agent.clone(),
                    epoch: d.epoch,
                    at: d.at,
                })
                .collect()
        })
        .unwrap_or_default();
    designations.sort_by(|x, y| (x.at, &x.message).cmp(&(y.at, &y.message)));
    let mut notices: Vec<BoardNotice> = b
        .map(|b| {
            b.notices
                .values()
                .map(|n| BoardNotice {
                    about: n.about.clone(),
                    task: n.task.clone(),
                    text: n.text.clone(),
                    at: n.at,
                })
                .collect()
        })
        .unwrap_or_default();
    notices.sort_by_key(|n| n.at);
    BoardView {
        room: room.clone(),
        owner: b.and_then(|b| b.owner.clone()),
        tasks: t.dag.summary(room),
        agents,
        designations,
        notices,
        open_turns: b
            .map(|b| {
                b.open_turns()
                    .into_iter()
                    .map(|(s, turn, a)| (s.to_string(), turn.to_string(), a.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        waiting_on_absent: Vec::new(),
        resources: Vec::new(),
        state: Vec::new(),
        benched: Vec::new(),
        stuck: huddle_core::pacing::stuck_tasks(&t.dag, room, b),
    }
}

fn summary_line(s: &TaskSummary) -> String {
    format!(
        "{} tasks: {} done, {} claimed, {}{} ready, {} waiting, {} blocked, {} abandoned{}",
        s.total,
        s.done,
        s.claimed,
        if s.submitted > 0 {
            format!("{} in review, ", s.submitted)
        } else {
            String::new()
        },
        s.ready,
        s.waiting,
        s.blocked,
        s.abandoned,
        if s.cancelled > 0 {
            format!(", {} cancelled", s.cancelled)
        } else {
            String::new()
        }
    )
}

fn describe(on: &Option<Subject>) -> String {
    match on {
        None => String::new(),
        Some(s) => match &s.label {
            Some(l) => format!("{} {} \"{}\"", s.kind.as_str(), s.id, clip(l, 50)),
            None if s.id.chars().count() > 16 => {
                format!(
                    "{} {}",
                    s.kind.as_str(),
                    s.id.chars().take(12).collect::<String>()
                )
            }
            None => format!("{} {}", s.kind.as_str(), s.id),
        },
    }
}

/// `huddle board --room R [--json]`
pub async fn board(db: &str, options: StoreOptions, room: &str, json: bool) -> anyhow::Result<()> {
    let store = ledger_cmds::open(db, options).await?;
    let view = board_view_of(&*store, room).await?;
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&view)?));
    }
    emit(&board_text(&view))
}

/// The board of `room` as `huddle board --json` prints it (and `huddle serve`
/// answers it); fails when the room was never created.
pub async fn board_view_of(store: &dyn Store, room: &str) -> anyhow::Result<BoardView> {
    let state = room_state(store, room).await?;
    board_view_from(store, &state).await
}

/// The board of a folded room: [`board_core`] with the live relays and the database
/// clock read now, plus the shared resources held now and the shared state.
pub async fn board_view_from(store: &dyn Store, state: &RoomState) -> anyhow::Result<BoardView> {
    let live = crate::status_cmds::live_relays(store).await?;
    let now = store.now().await?;
    let mut view = board_core(state, &live, now);
    shared_view(store, state, &mut view).await?;
    Ok(view)
}

/// The board of a folded room without its shared resources and state: presence with
/// hosting (from the relays with a live lease, `live`), waits on absent agents, the
/// circuit breaker's bench at `now`.
pub fn board_core(
    state: &RoomState,
    live: &std::collections::BTreeSet<String>,
    now: Timestamp,
) -> BoardView {
    let room = state.room();
    let config = state.config.effective(room, None);
    let mut view = board_view(&state.tally);
    if let Some(rr) = state.relays.room(room) {
        for a in &mut view.agents {
            a.hosting = crate::status_cmds::hosting_word(&rr.hosting(&a.agent, live));
        }
        let group_one = config.group_reply == huddle_core::config::GroupReply::One;
        view.waiting_on_absent = crate::status_cmds::absent_waits(rr, live, group_one);
    }
    view.benched = huddle_core::pacing::benched(state.tally.board.room(room), &config, now);
    view
}

/// The text of `huddle board`.
fn board_text(view: &BoardView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "room {} (owner {}) — {}",
        view.room,
        view.owner.as_deref().unwrap_or("?"),
        summary_line(&view.tasks)
    );
    let _ = writeln!(
        out,
        "\n{:<12} {:<8} {:>5} {:>6} {:>8}  {:<23}  on",
        "agent", "state", "done", "failed", "tokens", "since"
    );
    for a in &view.agents {
        // An agent whose relays are all down is offline, whatever it was doing: what
        // it held is being re-taken once its leases lapse.
        let offline = a
            .hosting
            .as_deref()
            .is_some_and(|h| h.starts_with("offline"));
        let state = if offline { "offline" } else { a.state.as_str() };
        let mut on = describe(&a.on);
        if offline && a.state == "working" && !on.is_empty() {
            on = format!("{on} (being re-taken)");
        }
        if let Some(n) = a.note.as_deref().filter(|_| !offline) {
            on = format!("{on} — {}", clip(n, 60));
        }
        if let Some(h) = a.hosting.as_deref().filter(|_| offline) {
            on = format!("{on} [{h}]");
        }
        let _ = writeln!(
            out,
            "{:<12} {:<8} {:>5} {:>6} {:>8}  {:<23}  {}",
            a.agent,
            state,
            a.tasks_done,
            a.failed_turns,
            a.tokens,
            a.since.map_or_else(|| "-".to_string(), format_time),
            on.trim_start_matches(" — ")
        );
    }
    if !view.stuck.is_empty() {
        let _ = writeln!(out, "\nstuck tasks ({}):", view.stuck.len());
        for t in view.stuck.iter().take(20) {
            let _ = writeln!(out, "  {}: {}", t.task, t.reason);
        }
        if view.stuck.len() > 20 {
            let _ = writeln!(out, "  … and {} more", view.stuck.len() - 20);
        }
    }
    if !view.benched.is_empty() {
        let _ = writeln!(
            out,
            "\nbenched by the circuit breaker ({}):",
            view.benched.len()
        );
        for b in &view.benched {
            let _ = writeln!(
                out,
                "  {} ({} failed turns in a row) until {}",
                b.agent,
                b.failed,
                format_time(b.until)
            );
        }
    }
    if !view.waiting_on_absent.is_empty() {
        let _ = writeln!(
            out,
            "\nwaiting on absent agents ({}):",
            view.waiting_on_absent.len()
        );
        for w in view.waiting_on_absent.iter().rev().take(10) {
            let who: Vec<String> = w
                .absent
                .iter()
                .map(|(a, why)| format!("{a} ({why})"))
                .collect();
            let _ = writeln!(
                out,
                "  message {} from {} at {} waits on {}",
                w.message.chars().take(12).collect::<String>(),
                w.author,
                format_time(w.at),
                who.join(", ")
            );
        }
    }
    if view.agents.is_empty() {
        let _ = writeln!(out, "(no agents yet)");
    }
    if !view.designations.is_empty() {
        let _ = writeln!(
            out,
            "\ndesignations ({}; latest 10):",
            view.designations.len()
        );
        for d in view.designations.iter().rev().take(10) {
            let _ = writeln!(
                out,
                "  message {} taken by {} (epoch {}) at {}",
                d.message.chars().take(12).collect::<String>(),
                d.agent,
                d.epoch,
                format_time(d.at)
            );
        }
    }
    if !view.notices.is_empty() {
        let _ = writeln!(out, "\nnotices ({}):", view.notices.len());
        for n in view.notices.iter().rev().take(10) {
            let _ = writeln!(out, "  {} {}: {}", format_time(n.at), n.about, n.text);
        }
    }
    if !view.open_turns.is_empty() {
        let _ = writeln!(out, "\nturns in flight ({}):", view.open_turns.len());
        for (s, _, a) in view.open_turns.iter().take(20) {
            let _ = writeln!(out, "  {a} on {s}");
        }
    }
    if !view.resources.is_empty() {
        let _ = writeln!(out, "\nresources held ({}):", view.resources.len());
        for h in &view.resources {
            let _ = writeln!(
                out,
                "  {} {} by {} (epoch {}) until {}",
                h.name,
                h.mode,
                h.holder,
                h.epoch,
                format_time(h.expires_at)
            );
        }
    }
    if !view.state.is_empty() {
        let _ = writeln!(out, "\nshared state ({} keys):", view.state.len());
        for v in &view.state {
            let value = v.value.to_string();
            let value: String = value.chars().take(80).collect();
            let _ = writeln!(
                out,
                "  {} = {} (version {} by {})",
                v.key,
                value,
                v.version,
                v.by.as_deref().unwrap_or("?")
            );
        }
    }
    out
}

/// Adds the room's held resources (the claims table) and shared state (its fold).
async fn shared_view(
    store: &dyn Store,
    state: &RoomState,
    view: &mut BoardView,
) -> anyhow::Result<()> {
    let room = state.room();
    let mut held = huddle_store::resources::live_holdings(store, room).await?;
    held.sort_by(|a, b| (&a.name, &a.holder).cmp(&(&b.name, &b.holder)));
    view.resources = held.iter().map(Into::into).collect();
    let shared = state.patterns.shared_state();
    view.state = shared
        .list(room)
        .into_iter()
        .map(|(k, _)| huddle_agent::state_view_of(shared, room, k, false))
        .collect();
    Ok(())
}

/// One task as `huddle tasks` shows it.
#[derive(Debug, Serialize)]
pub struct TaskLine {
    /// Id.
    pub id: String,
    /// Label.
    pub label: String,
    /// `open`, `claimed`, `submitted` (in review), `done`, `abandoned`, `cancelled`.
    pub status: TaskStatus,
    /// Open with every dependency done.
    pub ready: bool,
    /// Current (or last) owner.
    pub owner: Option<String>,
    /// Epoch of the latest accepted claim.
    pub epoch: Option<ClaimEpoch>,
    /// Attempts started.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Dependencies.
    pub deps: Vec<String>,
    /// The `push` assignee.
    pub assignee: Option<String>,
    /// Capabilities an agent must declare to take it.
    pub needs: Vec<String>,
    /// Scheduling priority, lower first.
    pub priority: u32,
    /// Relative cost.
    pub size: u32,
    /// Its critical path (its size plus the longest chain of sizes of the tasks of its
    /// `!delegate` that wait for it).
    pub path: u64,
    /// Resources its turn holds while it runs (`[uses ...]`), as `name mode`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<String>,
    /// Completions accepted by the fold (1 when done).
    pub completions: u32,
    /// Last failure reason.
    pub last_reason: Option<String>,
    /// What its completion reported.
    pub result: Option<String>,
    /// For a task that can never run: each dependency that cannot finish, and why
    /// (`missing`, `abandoned`, `cancelled`, `blocked`). Empty otherwise.
    pub blocked_by: Vec<BlockedBy>,
    /// `[due D]`: how long each attempt may run from its claim, ms.
    pub due_ms: Option<u64>,
    /// A claimed task with a deadline: when its current attempt is overdue.
    pub due_at: Option<Timestamp>,
    /// A task given back: the earliest time its next attempt may start (its back-off,
    /// `retry-backoff`), the same on every relay.
    pub retry_at: Option<Timestamp>,
    /// `[review @agent]`: its reviewer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reviewer: Option<String>,
    /// Rejections by its reviewer so far.
    #[serde(skip_serializing_if = "is_zero")]
    pub rejections: u32,
    /// Rejections allowed before it fails for good (with a reviewer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub review_rounds: Option<u32>,
    /// The reviewer's feedback on the last rejected submission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// `[undo ...]`: what undoes it, if a task of its chain fails after it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
    /// A compensation: the task it undoes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `huddle tasks --json`.
#[derive(Debug, Serialize)]
pub struct TasksView {
    /// Room.
    pub room: String,
    /// Counts.
    pub summary: TaskSummary,
    /// The ready frontier in the order it is handed out: priority (lower first),
    /// critical path (longer first), id.
    pub ready: Vec<String>,
    /// Every task, sorted by id.
    pub tasks: Vec<TaskLine>,
    /// Task interactions the fold refused (stale epochs, forgeries, malformed).
    pub refused: u64,
    /// Malformed task bodies.
    pub malformed: u64,
}

/// The task DAG of a folded room, as `huddle tasks --json` prints it.
pub fn tasks_view_from(state: &RoomState) -> TasksView {
    tasks_view(&state.tally, &state.config)
}

fn tasks_view(t: &Tally, config: &ConfigFold) -> TasksView {
    let room = &t.room;
    let config = config.effective(room, None);
    let completions = t.completions_per_task(true);
    let ready: Vec<String> = t
        .dag
        .ready_frontier(room)
        .into_iter()
        .map(|x| x.id.clone())
        .collect();
    let tasks = t
        .dag
        .room(room)
        .map(|r| {
            r.tasks
                .values()
                .map(|x| TaskLine {
                    id: x.id.clone(),
                    label: x.label.clone(),
                    status: x.status,
                    ready: t.dag.is_ready(room, &x.id),
                    owner: x.owner.clone(),
                    epoch: x.epoch,
                    attempts: x.attempts,
                    max_attempts: x.max_attempts,
                    deps: x.deps.clone(),
                    assignee: x.assignee.clone(),
                    needs: x.needs.clone(),
                    priority: x.priority,
                    size: x.size,
                    path: x.path,
                    uses: uses_text(&x.uses),
                    completions: completions.get(x.id.as_str()).copied().unwrap_or(0),
                    last_reason: x.last_reason.clone(),
                    result: x.result.clone(),
                    blocked_by: t.dag.blocked_by(room, &x.id),
                    due_ms: x.due_ms,
                    due_at: huddle_core::pacing::attempt_due(x),
                    retry_at: huddle_core::pacing::retry_at(&config, room, x),
                    reviewer: x.review.as_ref().map(|r| r.agent.clone()),
                    rejections: x.rejections,
                    review_rounds: x.review.as_ref().map(|r| r.rounds),
                    feedback: x.feedback.clone(),
                    undo: x.undo.clone(),
                    compensates: x.compensates.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let (refused, malformed) = t
        .dag
        .room(room)
        .map_or((0, 0), |r| (r.refusals.refused, r.refusals.malformed));
    TasksView {
        room: room.clone(),
        summary: t.dag.summary(room),
        ready,
        tasks,
        refused,
        malformed,
    }
}

/// A task's `[uses ...]` as `name mode` each (`file:src/** exclusive`).
pub fn uses_text(uses: &[huddle_core::resources::Wanted]) -> Vec<String> {
    uses.iter()
        .map(|w| format!("{} {}", w.name, w.mode))
        .collect()
}

/// What a task's line says after its label: the `!delegate` clauses that differ from
/// the defaults (` [needs rust] [priority 5] [size 3]`), what blocks it
/// (` (blocked by: a abandoned)`), and a done task's result on one line (` => ...`).
fn annotations(t: &TaskLine) -> String {
    let mut s = String::new();
    if !t.needs.is_empty() {
        let _ = write!(s, " [needs {}]", t.needs.join(", "));
    }
    if t.priority != huddle_core::tasks::DEFAULT_TASK_PRIORITY {
        let _ = write!(s, " [priority {}]", t.priority);
    }
    if t.size != 1 {
        let _ = write!(s, " [size {}]", t.size);
    }
    if let Some(ms) = t.due_ms {
        let _ = write!(s, " [due {}]", huddle_core::config::format_duration(ms));
    }
    if !t.uses.is_empty() {
        let _ = write!(s, " [uses {}]", t.uses.join(", "));
    }
    if let Some(r) = &t.reviewer {
        let _ = write!(
            s,
            " [review @{r}, {} of {} rejected]",
            t.rejections,
            t.review_rounds.unwrap_or(0)
        );
    }
    if let Some(u) = &t.undo {
        let _ = write!(s, " [undo {}]", clip(u, 40));
    }
    if let Some(c) = &t.compensates {
        let _ = write!(s, " (compensates {c})");
    }
    if t.status == TaskStatus::Submitted {
        let _ = write!(
            s,
            " (waiting for {}'s verdict)",
            t.reviewer.as_deref().unwrap_or("the reviewer")
        );
    }
    if let Some(at) = t.due_at {
        let _ = write!(s, " (attempt due by {})", format_time(at));
    }
    if let Some(at) = t.retry_at {
        let _ = write!(
            s,
            " (back-off: attempt {} not before {})",
            t.attempts + 1,
            format_time(at)
        );
    }
    if !t.blocked_by.is_empty() {
        let why: Vec<String> = t
            .blocked_by
            .iter()
            .map(|b| format!("{} {}", b.task, b.reason.as_str()))
            .collect();
        let _ = write!(s, " (blocked by: {})", why.join(", "));
    }
    if let (TaskStatus::Done, Some(result)) = (t.status, &t.result) {
        let line = result.split_whitespace().collect::<Vec<_>>().join(" ");
        let _ = write!(s, " => {}", clip(&line, 60));
    }
    s
}

/// `huddle tasks --room R [--json]`
pub async fn tasks(db: &str, options: StoreOptions, room: &str, json: bool) -> anyhow::Result<()> {
    let store = ledger_cmds::open(db, options).await?;
    let view = tasks_view_of(&*store, room).await?;
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&view)?));
    }
    emit(&tasks_text(&view))
}

/// The task DAG of `room` as `huddle tasks --json` prints it (and `huddle serve`
/// answers it); fails when the room was never created.
pub async fn tasks_view_of(store: &dyn Store, room: &str) -> anyhow::Result<TasksView> {
    let state = room_state(store, room).await?;
    Ok(tasks_view_from(&state))
}

/// Shortest time between two redraws of `tasks --watch`.
const WATCH_REDRAW: std::time::Duration = std::time::Duration::from_millis(300);

/// `huddle tasks --room R --watch`: the table, drawn again whenever the room's rows
/// change it (at most every [`WATCH_REDRAW`]), until Ctrl-C. On a terminal each
/// drawing replaces the last; otherwise drawings follow one another, each after a
/// blank line. New rows are folded as they arrive (woken like `tail --follow`), not
/// re-read from the start.
pub async fn tasks_watch(db: &str, options: StoreOptions, room: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let store = ledger_cmds::open(db, options).await?;
    let mut w = RoomState::new(room);
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 5000).await?;
        w.fold(&batch.rows);
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    w.created()?;
    let terminal = std::io::stdout().is_terminal();
    let mut last = String::new();
    let mut draw = |w: &RoomState| -> anyhow::Result<()> {
        let text = tasks_text(&tasks_view_from(w));
        if text == last {
            return Ok(());
        }
        if terminal {
            emit(&format!("\x1b[2J\x1b[H{text}"))?;
        } else {
            emit(&format!(
                "{}{text}",
                if last.is_empty() { "" } else { "\n" }
            ))?;
        }
        last = text;
        Ok(())
    };
    draw(&w)?;
    let ledger: Arc<dyn huddle_store::Ledger> = store;
    let mut sub = Subscription::for_rooms(ledger, vec![room.to_string()], cursor, 1000);
    let mut dirty = false;
    let mut next_draw = tokio::time::Instant::now();
    loop {
        tokio::select! {
            batch = sub.next() => match batch {
                Ok(batch) => dirty |= w.fold(&batch.rows),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "database unavailable; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.into()),
            },
            _ = tokio::time::sleep_until(next_draw), if dirty => {
                draw(&w)?;
                dirty = false;
                next_draw = tokio::time::Instant::now() + WATCH_REDRAW;
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// The text of `huddle tasks`.
fn tasks_text(view: &TasksView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "room {} — {}", view.room, summary_line(&view.summary));
    let frontier = if view.ready.is_empty() {
        "(empty)".to_string()
    } else if view.ready.len() > 20 {
        format!(
            "{}, … ({} more)",
            view.ready[..20].join(", "),
            view.ready.len() - 20
        )
    } else {
        view.ready.join(", ")
    };
    let _ = writeln!(out, "ready frontier: {frontier}");
    if view.refused + view.malformed > 0 {
        let _ = writeln!(
            out,
            "refused task interactions: {} (malformed {})",
            view.refused, view.malformed
        );
    }
    let _ = writeln!(
        out,
        "\n{:<16} {:<9} {:<12} {:>5} {:>8}  label",
        "id", "status", "owner", "epoch", "attempts"
    );
    for t in &view.tasks {
        let status = match (t.status, t.ready) {
            (TaskStatus::Open, true) => "ready",
            (TaskStatus::Open, false) if !t.blocked_by.is_empty() => "blocked",
            (TaskStatus::Open, false) => "waiting",
            (TaskStatus::Claimed, _) => "claimed",
            (TaskStatus::Submitted, _) => "submitted",
            (TaskStatus::Done, _) => "done",
            (TaskStatus::Abandoned, _) => "abandoned",
            (TaskStatus::Cancelled, _) => "cancelled",
        };
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:<12} {:>5} {:>4}/{:<3}  {}{}",
            t.id,
            status,
            t.owner.as_deref().unwrap_or("-"),
            t.epoch.map_or("-".to_string(), |e| e.to_string()),
            t.attempts,
            t.max_attempts,
            clip(&t.label, 60),
            annotations(t)
        );
    }
    out
}
