//! `huddle trace`: the causal tree of a message, owner command or task.
//!
//! Built from the rows every relay acts on (`state_cmds::fold_admitted`: forged or
//! unsigned rows a room ignores are left out, as the relays leave them out). A row's
//! children are the rows naming it as `parent` or in `caused_by`; a task created in the
//! tree gets its own timeline — every row about the task (claims, turns, progress,
//! completion, failures, releases) in ledger order — and a last line saying where it
//! stopped and why.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use huddle_core::protocol::carried_turn;
use huddle_core::{Interaction, InteractionId, TaskStatus, Timestamp, Verb};
use huddle_sim::Tally;
use huddle_store::StoreOptions;
use serde::Serialize;

use crate::{ledger_cmds, output, state_cmds};

/// Deepest causal chain printed (a hostile ledger can make chains long; cycles cannot
/// exist, ids being hashes of the content that names them, but are guarded anyway).
const MAX_DEPTH: usize = 64;

/// One node of the tree.
#[derive(Debug, Serialize)]
pub struct TraceNode {
    /// The interaction id.
    pub id: String,
    /// Its verb.
    pub verb: String,
    /// Who acted, and as what.
    pub actor: String,
    /// `owner`, `human`, `agent` or `system`.
    pub role: String,
    /// The writer (relay id; database role on Postgres).
    pub relay: String,
    /// The thread, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// Database time, µs since the Unix epoch.
    pub at_us: i64,
    /// Milliseconds after the trace's root.
    pub offset_ms: f64,
    /// The claim epoch the row was written under, when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Milliseconds since the turn it ends started (`turn.replied` / `turn.failed`), or
    /// since the claim it completes (`task.completed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<f64>,
    /// The row on one line (as `huddle tail` shows it).
    pub what: String,
    /// Rows it caused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<TraceNode>,
    /// For a `task.created`: the task's life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskTrace>,
}

/// A task's life in the trace.
#[derive(Debug, Serialize)]
pub struct TaskTrace {
    /// The task id.
    pub task: String,
    /// When every dependency was done (µs), if it became ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_at_us: Option<i64>,
    /// Every row about the task, in ledger order.
    pub timeline: Vec<TraceNode>,
    /// Its status now (`done`, `abandoned`, `claimed`, `ready`, `waiting`).
    pub status: String,
    /// Where it stopped and why, in words.
    pub stopped: String,
    /// Its compensation (`[undo ...]`), when a failure of its chain started it: the
    /// task `<id>--undo`, which no row creates (the fold does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Box<TaskTrace>>,
}

/// The whole trace.
#[derive(Debug, Serialize)]
pub struct Trace {
    /// The room.
    pub room: String,
    /// What was traced: `message` (an interaction) or `task`.
    pub kind: &'static str,
    /// The root.
    pub root: TraceNode,
}

/// `huddle trace --room ROOM ID`: ID is a task id of the room, else an interaction id
/// (or a unique prefix of at least 6 hex digits).
pub async fn trace(
    db: &str,
    options: StoreOptions,
    room: &str,
    wanted: &str,
    json: bool,
) -> anyhow::Result<()> {
    let store = ledger_cmds::open(db, options).await?;
    let mut tally = Tally::new(room);
    let mut rows: Vec<Interaction> = Vec::new();
    state_cmds::fold_admitted(&*store, room, |r| {
        tally.apply(r);
        rows.push(r.clone());
    })
    .await?;
    let tree = Tree::new(&rows, &tally, room);
    let trace = if let Some(t) = tally.dag.task(room, wanted) {
        // A compensation is traced from the task it undoes.
        let created_as = t.compensates.as_deref().unwrap_or(wanted);
        let created = rows
            .iter()
            .find(|r| r.verb == Verb::TaskCreated && task_of(r).as_deref() == Some(created_as))
            .ok_or_else(|| anyhow::anyhow!("task {wanted} has no task.created row"))?;
        Trace {
            room: room.to_string(),
            kind: "task",
            root: tree.node(created, created.at, 0, &mut BTreeSet::new()),
        }
    } else {
        let root = resolve(&rows, room, wanted)?;
        Trace {
            room: room.to_string(),
            kind: "message",
            root: tree.node(root, root.at, 0, &mut BTreeSet::new()),
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&trace)?);
        return Ok(());
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "trace of {} {} in room {}",
        trace.kind,
        if trace.kind == "task" {
            wanted.to_string()
        } else {
            trace.root.id.clone()
        },
        output::indented(room)
    );
    render(&mut out, &trace.root, 0);
    print!("{out}");
    Ok(())
}

/// The row `wanted` names: a full id or a unique prefix of at least 6 hex digits.
fn resolve<'a>(
    rows: &'a [Interaction],
    room: &str,
    wanted: &str,
) -> anyhow::Result<&'a Interaction> {
    let w = wanted.trim().to_ascii_lowercase();
    if w.len() < 6 || !w.chars().all(|c| c.is_ascii_hexdigit()) {
        anyhow::bail!(
            "{wanted:?} is neither a task of room {room} nor an interaction id (64 hex \
             digits as `huddle tail` prints them, or a prefix of at least 6)"
        );
    }
    let found: Vec<&Interaction> = rows
        .iter()
        .filter(|r| r.id.to_string().starts_with(&w))
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => anyhow::bail!("room {room} has no task {wanted} and no interaction {w}…"),
        many => anyhow::bail!(
            "{w} is the start of {} interactions in room {room}; give more digits",
            many.len()
        ),
    }
}

/// The task a row is about: `body.task`, or a turn's task subject.
fn task_of(r: &Interaction) -> Option<String> {
    if let Some(t) = r.body.get("task").and_then(|t| t.as_str()) {
        return Some(t.to_string());
    }
    let s = r.body.get("subject")?;
    (s.get("kind")?.as_str()? == "task").then(|| s.get("id")?.as_str().map(String::from))?
}

/// The indexes a trace is drawn from.
struct Tree<'a> {
    room: &'a str,
    tally: &'a Tally,
    /// Rows caused by each id, in ledger order.
    children: HashMap<InteractionId, Vec<&'a Interaction>>,
    /// Rows about each task, in ledger order.
    about: BTreeMap<String, Vec<&'a Interaction>>,
    /// Start time of each turn id (its `turn.prompted`).
    turn_started: HashMap<String, Timestamp>,
    /// Time each task (at each epoch) was claimed.
    claimed_at: HashMap<(String, u64), Timestamp>,
}

impl<'a> Tree<'a> {
    fn new(rows: &'a [Interaction], tally: &'a Tally, room: &'a str) -> Tree<'a> {
        let mut children: HashMap<InteractionId, Vec<&Interaction>> = HashMap::new();
        let mut about: BTreeMap<String, Vec<&Interaction>> = BTreeMap::new();
        let mut turn_started = HashMap::new();
        let mut claimed_at = HashMap::new();
        for r in rows {
            let mut causes: Vec<InteractionId> = r.parent.into_iter().collect();
            causes.extend(r.caused_by.iter().copied());
            causes.dedup();
            for c in causes {
                children.entry(c).or_default().push(r);
            }
            if let Some(t) = task_of(r) {
                if r.verb != Verb::TaskCreated {
                    about.entry(t.clone()).or_default().push(r);
                }
                if r.verb == Verb::TaskClaimed {
                    if let Some(e) = epoch(r) {
                        claimed_at.entry((t, e)).or_insert(r.at);
                    }
                }
            }
            // A turn starts with its `turn.prompted`, or the `task.claimed` carrying it.
            if let Some((Verb::TurnPrompted, body)) = carried_turn(r.verb, &r.body) {
                if let Some(turn) = body.get("turn").and_then(|t| t.as_str()) {
                    turn_started.entry(turn.to_string()).or_insert(r.at);
                }
            }
        }
        Tree {
            room,
            tally,
            children,
            about,
            turn_started,
            claimed_at,
        }
    }

    fn node(
        &self,
        r: &Interaction,
        origin: Timestamp,
        depth: usize,
        seen: &mut BTreeSet<InteractionId>,
    ) -> TraceNode {
        seen.insert(r.id);
        let mut node = self.leaf(r, origin);
        if let (Verb::TaskCreated, Some(t)) = (r.verb, task_of(r)) {
            let timeline: Vec<TraceNode> = self
                .about
                .get(&t)
                .into_iter()
                .flatten()
                .map(|row| {
                    seen.insert(row.id);
                    self.leaf(row, origin)
                })
                .collect();
            let mut trace = self.task_trace(&t, timeline);
            let undo = huddle_core::tasks::undo_id(&t);
            if self.tally.dag.task(self.room, &undo).is_some() {
                let steps: Vec<TraceNode> = self
                    .about
                    .get(&undo)
                    .into_iter()
                    .flatten()
                    .map(|row| {
                        seen.insert(row.id);
                        self.leaf(row, origin)
                    })
                    .collect();
                trace.compensation = Some(Box::new(self.task_trace(&undo, steps)));
            }
            node.task = Some(trace);
        }
        if depth < MAX_DEPTH {
            for child in self.children.get(&r.id).into_iter().flatten() {
                if !seen.contains(&child.id) {
                    node.children
                        .push(self.node(child, origin, depth + 1, seen));
                }
            }
        }
        node
    }

    fn leaf(&self, r: &Interaction, origin: Timestamp) -> TraceNode {
        let took = match (r.verb, carried_turn(r.verb, &r.body)) {
            (Verb::TaskCompleted, _) => task_of(r)
                .zip(epoch(r))
                .and_then(|k| self.claimed_at.get(&k)),
            (_, Some((Verb::TurnReplied | Verb::TurnFailed, body))) => body
                .get("turn")
                .and_then(|t| t.as_str())
                .and_then(|t| self.turn_started.get(t)),
            _ => None,
        };
        TraceNode {
            id: r.id.to_string(),
            verb: r.verb.as_str().to_string(),
            actor: r.actor.clone(),
            role: r.role.to_string(),
            relay: r.relay.clone(),
            thread: r.thread.clone(),
            at_us: r.at.as_micros(),
            offset_ms: ms_between(origin, r.at),
            epoch: epoch(r),
            took_ms: took.map(|t| ms_between(*t, r.at)),
            what: match r.body.get("text").and_then(|t| t.as_str()) {
                Some(text) => output::indented(text),
                None => output::summary(&r.body),
            },
            children: Vec::new(),
            task: None,
        }
    }

    fn task_trace(&self, id: &str, timeline: Vec<TraceNode>) -> TaskTrace {
        let dag = &self.tally.dag;
        let Some(t) = dag.task(self.room, id) else {
            return TaskTrace {
                compensation: None,
                task: id.to_string(),
                ready_at_us: None,
                timeline,
                status: "refused".into(),
                stopped: "the task was not created (its task.created row was refused)".into(),
            };
        };
        let deps: Vec<_> = t.deps.iter().map(|d| (d, dag.task(self.room, d))).collect();
        let all_done = deps
            .iter()
            .all(|(_, d)| d.is_some_and(|d| d.status == TaskStatus::Done));
        let ready_at = all_done.then(|| {
            deps.iter()
                .filter_map(|(_, d)| d.and_then(|d| d.done_at))
                .chain([t.created_at])
                .max()
                .unwrap_or(t.created_at)
                .as_micros()
        });
        let (status, stopped) = match t.status {
            TaskStatus::Done => (
                "done",
                format!(
                    "done by {} after {} attempt(s){}",
                    t.owner.as_deref().unwrap_or("?"),
                    t.attempts,
                    t.result
                        .as_deref()
                        .map(|r| format!(": {}", first_line(r)))
                        .unwrap_or_default()
                ),
            ),
            TaskStatus::Abandoned => (
                "abandoned",
                format!(
                    "abandoned after {} attempt(s): {}",
                    t.attempts,
                    t.last_reason.as_deref().unwrap_or("no reason recorded")
                ),
            ),
            TaskStatus::Cancelled => (
                "cancelled",
                t.last_reason
                    .clone()
                    .unwrap_or_else(|| "cancelled by the owner".into()),
            ),
            TaskStatus::Submitted => (
                "submitted",
                format!(
                    "submitted by {}, waiting for {}'s verdict",
                    t.owner.as_deref().unwrap_or("?"),
                    t.review
                        .as_ref()
                        .map_or("the reviewer", |r| r.agent.as_str())
                ),
            ),
            TaskStatus::Claimed => (
                "claimed",
                format!(
                    "running: claimed by {} at epoch {}",
                    t.owner.as_deref().unwrap_or("?"),
                    t.epoch.map(|e| e.0).unwrap_or(0)
                ),
            ),
            TaskStatus::Open if all_done => (
                "ready",
                format!(
                    "ready, not taken yet ({} attempt(s) so far{})",
                    t.attempts,
                    t.last_reason
                        .as_deref()
                        .map(|r| format!("; last failure: {r}"))
                        .unwrap_or_default()
                ),
            ),
            // Open with a dependency not done.
            _ => {
                let waiting: Vec<String> = deps
                    .iter()
                    .filter(|(_, d)| !d.is_some_and(|d| d.status == TaskStatus::Done))
                    .map(|(name, d)| match d {
                        None => format!("{name} (never created)"),
                        Some(d) => format!("{name} ({})", status_word(d.status)),
                    })
                    .collect();
                ("waiting", format!("waiting for {}", waiting.join(", ")))
            }
        };
        TaskTrace {
            compensation: None,
            task: id.to_string(),
            ready_at_us: ready_at,
            timeline,
            status: status.into(),
            stopped: output::indented(&stopped),
        }
    }
}

fn status_word(s: TaskStatus) -> &'static str {
    s.as_str()
}

fn epoch(r: &Interaction) -> Option<u64> {
    r.body.get("epoch").and_then(|e| e.as_u64())
}

fn ms_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_micros() - from.as_micros()) as f64 / 1000.0
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn seconds(ms: f64) -> String {
    format!("{:+.3}s", ms / 1000.0)
}

fn render(out: &mut String, n: &TraceNode, depth: usize) {
    let pad = "  ".repeat(depth);
    let took = n
        .took_ms
        .map(|t| format!(" (took {:.3}s)", t / 1000.0))
        .unwrap_or_default();
    let epoch = n.epoch.map(|e| format!(" epoch {e}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{pad}{} {} ({}) via {} {}{epoch}{took}: {}",
        seconds(n.offset_ms),
        output::indented(&n.actor),
        n.role,
        output::indented(&n.relay),
        n.verb,
        n.what.replace("\n    ", &format!("\n{pad}      "))
    );
    if let Some(t) = &n.task {
        let _ = writeln!(out, "{pad}  task {}:", t.task);
        if let Some(at) = t.ready_at_us {
            let _ = writeln!(
                out,
                "{pad}    {} ready",
                seconds(n.offset_ms + (at - n.at_us) as f64 / 1000.0)
            );
        }
        for step in &t.timeline {
            render(out, step, depth + 2);
        }
        let _ = writeln!(out, "{pad}    → {}", t.stopped);
        if let Some(c) = &t.compensation {
            let _ = writeln!(out, "{pad}  compensated by {}:", c.task);
            for step in &c.timeline {
                render(out, step, depth + 2);
            }
            let _ = writeln!(out, "{pad}    → {}", c.stopped);
        }
    }
    for c in &n.children {
        render(out, c, depth + 1);
    }
}
