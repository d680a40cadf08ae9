//! Recording agents and the history checker of the fault battery (plan 0015).
//!
//! A recording agent is an exec agent running [`RECORDING_AGENT`]: every real
//! execution appends a `start` line and an `end` line to a side-effect log
//! (`O_APPEND`, one write per line):
//!
//! ```text
//! start task/t042 a10 7 2 1717000000123456 4242
//! end msg/tok-0007 a21 3 1 1717000000223456 4243
//! ```
//!
//! fields: phase, work (`task/<id>` or `msg/<token>`), agent, epoch (`-` when none),
//! attempt, wall-clock µs, pid. A message turn has no `HUDDLE_TASK`; the script names
//! it by the `tok-N` token the test put in the message text, read from the last
//! `<message from=...>` block of the prompt (the one being answered; context blocks
//! come before it).
//!
//! [`check`] folds the ledger and the side-effect log into a [`HistoryReport`]: counts,
//! re-executions, and every violation of *exactly once*. It is a pure function of its
//! [`History`], so `tests/fault_battery.rs` unit-tests it on synthetic histories.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use huddle_core::sync::addressing::{self, Eligible};
use huddle_core::tasks::TaskCompletedBody;
use huddle_core::{Fold, Interaction, InteractionId, Role, TaskDag, Verb};

use super::relays::RelaySummary;

/// The recording agent: `sh <script> <side-effect log> <sleep seconds>`.
pub const RECORDING_AGENT: &str = r#"log="$1"
nap="${2:-0}"
prompt=$(cat)
if [ -n "$HUDDLE_TASK" ]; then
  work="task/$HUDDLE_TASK"
else
  tok=$(printf '%s\n' "$prompt" | awk '
    /<message from=/ { body = ""; inside = 1; next }
    inside && /<\/message>/ { inside = 0; last = body; next }
    inside { body = body " " $0 }
    END { print last }' | grep -o 'tok-[0-9][0-9]*' | tail -n 1)
  work="msg/${tok:-none}"
fi
line="$work $HUDDLE_AGENT ${HUDDLE_EPOCH:--} ${HUDDLE_ATTEMPT:-0}"
printf 'start %s %s %s\n' "$line" "$(date +%s%6N)" "$$" >> "$log"
sleep "$nap"
printf 'end %s %s %s\n' "$line" "$(date +%s%6N)" "$$" >> "$log"
echo 'huddle-tokens: 1' >&2
printf 'done %s by %s\n' "$work" "$HUDDLE_AGENT""#;

/// The token a test puts in message `n`'s text, so recording agents can name it.
pub fn message_token(n: usize) -> String {
    format!("tok-{n}")
}

/// What an execution worked on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Work {
    /// A task, by id.
    Task(String),
    /// A message, by the token in its text.
    Message(String),
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Work::Task(t) => write!(f, "task/{t}"),
            Work::Message(m) => write!(f, "msg/{m}"),
        }
    }
}

/// Start or end of an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The agent began.
    Start,
    /// The agent finished (the relay may still fail to write the result).
    End,
}

/// One line of the side-effect log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SideEffect {
    /// Start or end.
    pub phase: Phase,
    /// What it worked on.
    pub work: Work,
    /// The agent.
    pub agent: String,
    /// The claim epoch the relay passed, if any.
    pub epoch: Option<i64>,
    /// The attempt the relay passed.
    pub attempt: u32,
    /// Wall clock, µs since the Unix epoch.
    pub time_us: i64,
    /// The agent process.
    pub pid: u32,
}

impl SideEffect {
    /// Parses one line; the error names what is wrong.
    pub fn parse(line: &str) -> Result<SideEffect, String> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [phase, work, agent, epoch, attempt, time_us, pid] = f[..] else {
            return Err(format!("expected 7 fields: {line:?}"));
        };
        let phase = match phase {
            "start" => Phase::Start,
            "end" => Phase::End,
            _ => return Err(format!("unknown phase in {line:?}")),
        };
        let work = if let Some(t) = work.strip_prefix("task/") {
            Work::Task(t.to_string())
        } else if let Some(m) = work.strip_prefix("msg/") {
            Work::Message(m.to_string())
        } else {
            return Err(format!("unknown work in {line:?}"));
        };
        let num = |what: &str, v: &str| -> Result<i64, String> {
            v.parse().map_err(|_| format!("bad {what} in {line:?}"))
        };
        Ok(SideEffect {
            phase,
            work,
            agent: agent.to_string(),
            epoch: if epoch == "-" {
                None
            } else {
                Some(num("epoch", epoch)?)
            },
            attempt: u32::try_from(num("attempt", attempt)?).map_err(|e| e.to_string())?,
            time_us: num("time", time_us)?,
            pid: u32::try_from(num("pid", pid)?).map_err(|e| e.to_string())?,
        })
    }
}

/// Parses a whole side-effect log. A torn or foreign line is an error: the agents
/// write whole lines with `O_APPEND`, so one means the recording itself is broken.
pub fn parse_side_effects(text: &str) -> Result<Vec<SideEffect>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(SideEffect::parse)
        .collect()
}

/// Reads and parses the side-effect log at `path` (absent: empty).
pub fn read_side_effects(path: &Path) -> Vec<SideEffect> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    parse_side_effects(&text).unwrap_or_else(|e| panic!("side-effect log {}: {e}", path.display()))
}

/// The faults a battery injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL of a relay (restarted later).
    Kill9,
    /// SIGSTOP ... SIGCONT of a relay.
    Pause,
    /// `pg_ctl restart -m fast`.
    PgRestartFast,
    /// `pg_ctl stop -m immediate` then start.
    PgRestartImmediate,
    /// `pg_terminate_backend` of every session of the database.
    TerminateBackends,
    /// The proxy of one relay reset every connection.
    DropConnections,
    /// One relay's link black-holed, then healed.
    BlackHole,
    /// One relay's link delayed.
    Delay,
}

impl FaultKind {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill-9",
            FaultKind::Pause => "pause",
            FaultKind::PgRestartFast => "pg-restart-fast",
            FaultKind::PgRestartImmediate => "pg-restart-immediate",
            FaultKind::TerminateBackends => "terminate-backends",
            FaultKind::DropConnections => "drop-connections",
            FaultKind::BlackHole => "black-hole",
            FaultKind::Delay => "delay",
        }
    }

    /// Whether this fault may make work run again: the relay running a turn is gone
    /// (killed) or cut off (paused, partitioned) past the claim TTL between the turn
    /// and its write. Database outages are not in the list: a relay retries its
    /// writes, so an outage shorter than the TTL must not repeat work.
    pub fn may_repeat_work(self) -> bool {
        matches!(
            self,
            FaultKind::Kill9 | FaultKind::Pause | FaultKind::BlackHole
        )
    }
}

/// One injected fault: kind, the relay it hit (`None`: all of them) and when
/// (wall-clock µs; a kill has `from_us == to_us`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// Which relay, or every relay.
    pub relay: Option<String>,
    /// Start, µs.
    pub from_us: i64,
    /// End, µs.
    pub to_us: i64,
}

impl Fault {
    /// Whether it hit `relay` at some moment in `[from, to]`.
    pub fn hits(&self, relay: &str, from: i64, to: i64) -> bool {
        self.relay.as_deref().is_none_or(|r| r == relay) && self.from_us <= to && self.to_us >= from
    }
}

/// Everything [`check`] looks at.
pub struct History<'a> {
    /// The room.
    pub room: &'a str,
    /// Every ledger row, in ledger order (other rooms are ignored).
    pub rows: &'a [Interaction],
    /// The side-effect log.
    pub side_effects: &'a [SideEffect],
    /// The tasks the test created.
    pub tasks: &'a BTreeSet<String>,
    /// The addressed messages the test posted: token -> message id.
    pub messages: &'a BTreeMap<String, InteractionId>,
    /// Agent -> the relay hosting it.
    pub hosts: &'a BTreeMap<String, String>,
    /// The faults injected.
    pub faults: &'a [Fault],
    /// The relays' summaries at the end.
    pub summaries: &'a [RelaySummary],
    /// The board and task hashes the test folds itself, if known.
    pub expected_hashes: Option<(String, String)>,
    /// A start this close after a row's `at` is not "after the commit": `at` is the
    /// writing transaction's start, the commit comes a little later.
    pub commit_slack_us: i64,
    /// The database admits one writer at a time (SQLite): a relay stopped in the middle
    /// of a write holds every other relay's writes, their lease renewals included, so
    /// a pause of *any* relay may let another relay's leases lapse and its work be
    /// taken over and repeated.
    pub one_writer: bool,
}

/// A break of *exactly once*.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A task has no accepted completion.
    TaskNotCompleted {
        /// The task.
        task: String,
    },
    /// More than one `task.completed` row for a task.
    TaskCompletedTwice {
        /// The task.
        task: String,
        /// `actor@epoch` of each row, and whether the fold accepted it.
        rows: Vec<(String, i64, bool)>,
    },
    /// An accepted completion no recorded execution of the task stands behind.
    CompletedWithoutExecution {
        /// The task.
        task: String,
    },
    /// An execution started after the work's result was committed.
    StartedAfterResult {
        /// The work.
        work: Work,
        /// Who ran it.
        agent: String,
        /// Epoch it ran under.
        epoch: Option<i64>,
        /// How long after the committed result it started, µs.
        late_us: i64,
    },
    /// An addressed message nobody answered.
    MessageLost {
        /// The token.
        token: String,
    },
    /// More than one agent reply to one message.
    MessageAnsweredTwice {
        /// The token.
        token: String,
        /// The repliers, in ledger order.
        repliers: Vec<String>,
    },
    /// Work ran again with no fault that may repeat work in between.
    UnexplainedReexecution {
        /// The work.
        work: Work,
        /// `(agent, epoch, attempt)` of every start, in time order.
        starts: Vec<(String, Option<i64>, u32)>,
    },
    /// One interaction id read more than once: a row written again beside a lot that
    /// carries it as an item (identical rows deduplicate; a row and an item do not).
    ReadTwice {
        /// The id, short.
        id: String,
        /// How many times it was read.
        times: usize,
    },
    /// The relays' fold hashes differ (from each other or from the test's fold).
    HashesDiffer {
        /// What differs.
        detail: String,
    },
}

impl Violation {
    /// The invariant broken, for counting.
    pub fn invariant(&self) -> &'static str {
        match self {
            Violation::TaskNotCompleted { .. } => "task never completed",
            Violation::TaskCompletedTwice { .. } => "task completed twice",
            Violation::CompletedWithoutExecution { .. } => "completion without execution",
            Violation::StartedAfterResult { .. } => "execution started after result committed",
            Violation::MessageLost { .. } => "message never answered",
            Violation::MessageAnsweredTwice { .. } => "message answered twice",
            Violation::UnexplainedReexecution { .. } => {
                "re-execution without a kill/pause/partition"
            }
            Violation::ReadTwice { .. } => "interaction read twice",
            Violation::HashesDiffer { .. } => "fold hashes differ",
        }
    }
}

/// A work item that ran more than once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reexecution {
    /// The work.
    pub work: Work,
    /// How many times it started.
    pub starts: usize,
    /// The fault that explains each repeat (`None`: unexplained).
    pub explained_by: Vec<Option<FaultKind>>,
}

/// What [`check`] found.
#[derive(Clone, Debug, Default)]
pub struct HistoryReport {
    /// Tasks the test created.
    pub tasks: usize,
    /// Tasks with an accepted completion.
    pub tasks_completed: usize,
    /// `task.completed` rows of the room.
    pub raw_completions: usize,
    /// Those the fold refused.
    pub refused_completions: usize,
    /// Addressed messages the test posted.
    pub messages: usize,
    /// Messages with at least one agent reply.
    pub messages_answered: usize,
    /// Agent replies to those messages.
    pub agent_replies: usize,
    /// Task executions started.
    pub task_starts: usize,
    /// Message executions started.
    pub message_starts: usize,
    /// Executions that started and never recorded an end.
    pub unfinished: usize,
    /// Work that ran more than once.
    pub reexecutions: Vec<Reexecution>,
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Every violation.
    pub violations: Vec<Violation>,
}

impl HistoryReport {
    /// Repeats beyond the first start, over all work.
    pub fn extra_starts(&self) -> usize {
        self.reexecutions.iter().map(|r| r.starts - 1).sum()
    }

    /// Violations counted by invariant.
    pub fn by_invariant(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.invariant()).or_default() += 1;
        }
        m
    }

    /// Repeats counted by the fault that explains them.
    pub fn repeats_by_cause(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for r in &self.reexecutions {
            for e in &r.explained_by {
                *m.entry(e.map_or("unexplained", FaultKind::name))
                    .or_default() += 1;
            }
        }
        m
    }
}

impl fmt::Display for HistoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "history report")?;
        writeln!(
            f,
            "  tasks: {} created, {} completed, {} completion rows ({} refused by the fold)",
            self.tasks, self.tasks_completed, self.raw_completions, self.refused_completions
        )?;
        writeln!(
            f,
            "  messages: {} addressed, {} answered, {} agent replies",
            self.messages, self.messages_answered, self.agent_replies
        )?;
        writeln!(
            f,
            "  executions: {} task starts ({:.3} per task), {} message starts, {} unfinished",
            self.task_starts,
            self.task_starts as f64 / self.tasks.max(1) as f64,
            self.message_starts,
            self.unfinished
        )?;
        writeln!(
            f,
            "  re-executions: {} extra starts over {} items, by cause {:?}",
            self.extra_starts(),
            self.reexecutions.len(),
            self.repeats_by_cause()
        )?;
        writeln!(f, "  faults: {:?}", self.faults)?;
        writeln!(
            f,
            "  violations: {} {:?}",
            self.violations.len(),
            self.by_invariant()
        )?;
        for v in self.violations.iter().take(40) {
            writeln!(f, "    {v:?}")?;
        }
        if self.violations.len() > 40 {
            writeln!(f, "    ... and {} more", self.violations.len() - 40)?;
        }
        Ok(())
    }
}

/// The test's messages that name several agents (each answers once), with the
/// agents named, read the way relays read them: mentions of the hosted agents, minus
/// the author.
fn messages_naming_several(h: &History<'_>) -> BTreeMap<String, Vec<String>> {
    let known: BTreeSet<String> = h.hosts.keys().cloned().collect();
    let by_id: BTreeMap<InteractionId, &Interaction> = h.rows.iter().map(|r| (r.id, r)).collect();
    h.messages
        .iter()
        .filter_map(|(token, id)| {
            let row = by_id.get(id)?;
            let text = row
                .body
                .get("text")
                .and_then(|t| t.as_str())
                .unwrap_or_default();
            let to = addressing::address(text, &[], None, &known);
            match addressing::eligible(&row.actor, row.role, text, &to, false) {
                Eligible::Agents(list) if list.len() >= 2 => Some((token.clone(), list)),
                _ => None,
            }
        })
        .collect()
}

/// Checks a history; see the module documentation.
pub fn check(h: &History<'_>) -> HistoryReport {
    let mut report = HistoryReport {
        tasks: h.tasks.len(),
        messages: h.messages.len(),
        ..Default::default()
    };
    for f in h.faults {
        *report.faults.entry(f.kind.name()).or_default() += 1;
    }

    // Completions: fold the DAG in ledger order; a completion is accepted when the
    // task is held by its actor at its epoch just before it.
    let mut dag = TaskDag::new();
    let mut completions: BTreeMap<&str, Vec<(String, i64, bool, i64)>> = BTreeMap::new();
    let mut replies: BTreeMap<InteractionId, Vec<&Interaction>> = BTreeMap::new();
    let mut read: BTreeMap<InteractionId, usize> = BTreeMap::new();
    for r in h.rows {
        if r.room != h.room {
            continue;
        }
        *read.entry(r.id).or_default() += 1;
        if r.verb == Verb::TaskCompleted {
            report.raw_completions += 1;
            if let Some(b) = TaskCompletedBody::parse(&r.body) {
                let accepted = dag
                    .task(h.room, &b.task)
                    .is_some_and(|t| t.is_held_by(&r.actor, b.epoch));
                if !accepted {
                    report.refused_completions += 1;
                }
                if let Some(task) = h.tasks.get(&b.task) {
                    completions.entry(task.as_str()).or_default().push((
                        r.actor.clone(),
                        b.epoch.get(),
                        accepted,
                        r.at.as_micros(),
                    ));
                }
            }
        }
        if r.verb == Verb::MessagePosted && r.role == Role::Agent {
            if let Some(p) = r.parent {
                replies.entry(p).or_default().push(r);
            }
        }
        dag.apply(r);
    }

    for (id, times) in read.into_iter().filter(|(_, n)| *n > 1) {
        report.violations.push(Violation::ReadTwice {
            id: id.short(),
            times,
        });
    }

    // When each piece of work's result was committed (the first accepted completion,
    // the first reply).
    let mut result_at: BTreeMap<Work, i64> = BTreeMap::new();
    for task in h.tasks {
        let rows = completions.get(task.as_str()).cloned().unwrap_or_default();
        match rows.iter().find(|c| c.2) {
            Some(c) => {
                report.tasks_completed += 1;
                result_at.insert(Work::Task(task.clone()), c.3);
            }
            None => report
                .violations
                .push(Violation::TaskNotCompleted { task: task.clone() }),
        }
        if rows.len() > 1 {
            report.violations.push(Violation::TaskCompletedTwice {
                task: task.clone(),
                rows: rows.iter().map(|c| (c.0.clone(), c.1, c.2)).collect(),
            });
        }
    }
    // Messages naming several agents are answered once by each of them (plan 0026):
    // each named agent's part is a piece of work of its own, `<token>@<agent>`.
    let each = messages_naming_several(h);
    for (token, id) in h.messages {
        let rs = replies.get(id).cloned().unwrap_or_default();
        report.agent_replies += rs.len();
        if let Some(named) = each.get(token) {
            let mut whole = true;
            for agent in named {
                let part = format!("{token}@{agent}");
                let mine: Vec<&&Interaction> = rs.iter().filter(|r| &r.actor == agent).collect();
                match mine.first() {
                    Some(first) => {
                        result_at.insert(Work::Message(part.clone()), first.at.as_micros());
                    }
                    None => {
                        whole = false;
                        report.violations.push(Violation::MessageLost {
                            token: part.clone(),
                        });
                    }
                }
                if mine.len() > 1 {
                    report.violations.push(Violation::MessageAnsweredTwice {
                        token: part,
                        repliers: mine.iter().map(|r| r.actor.clone()).collect(),
                    });
                }
            }
            let strangers: Vec<String> = rs
                .iter()
                .filter(|r| !named.contains(&r.actor))
                .map(|r| r.actor.clone())
                .collect();
            if !strangers.is_empty() {
                report.violations.push(Violation::MessageAnsweredTwice {
                    token: token.clone(),
                    repliers: strangers,
                });
            }
            if whole {
                report.messages_answered += 1;
            }
            continue;
        }
        match rs.first() {
            Some(first) => {
                report.messages_answered += 1;
                result_at.insert(Work::Message(token.clone()), first.at.as_micros());
            }
            None => report.violations.push(Violation::MessageLost {
                token: token.clone(),
            }),
        }
        if rs.len() > 1 {
            report.violations.push(Violation::MessageAnsweredTwice {
                token: token.clone(),
                repliers: rs.iter().map(|r| r.actor.clone()).collect(),
            });
        }
    }

    // Executions.
    let mut starts: BTreeMap<Work, Vec<&SideEffect>> = BTreeMap::new();
    let mut ended: BTreeSet<(u32, Work)> = BTreeSet::new();
    let work_of = |e: &SideEffect| match &e.work {
        Work::Message(token) if each.contains_key(token) => {
            Work::Message(format!("{token}@{}", e.agent))
        }
        w => w.clone(),
    };
    for e in h.side_effects {
        match e.phase {
            Phase::Start => starts.entry(work_of(e)).or_default().push(e),
            Phase::End => {
                ended.insert((e.pid, work_of(e)));
            }
        }
    }
    for (work, list) in &mut starts {
        list.sort_by_key(|e| e.time_us);
        match work {
            Work::Task(_) => report.task_starts += list.len(),
            Work::Message(_) => report.message_starts += list.len(),
        }
        report.unfinished += list
            .iter()
            .filter(|e| !ended.contains(&(e.pid, work.clone())))
            .count();
        if let Some(&done) = result_at.get(work) {
            for e in list.iter() {
                let late = e.time_us - done;
                if late > h.commit_slack_us {
                    report.violations.push(Violation::StartedAfterResult {
                        work: (*work).clone(),
                        agent: e.agent.clone(),
                        epoch: e.epoch,
                        late_us: late,
                    });
                }
            }
        }
        if list.len() > 1 {
            let explained_by: Vec<Option<FaultKind>> = (1..list.len())
                .map(|i| explain(h, &list[..i], list[i].time_us))
                .collect();
            if explained_by.iter().any(Option::is_none) {
                report.violations.push(Violation::UnexplainedReexecution {
                    work: work.clone(),
                    starts: list
                        .iter()
                        .map(|e| (e.agent.clone(), e.epoch, e.attempt))
                        .collect(),
                });
            }
            report.reexecutions.push(Reexecution {
                work: work.clone(),
                starts: list.len(),
                explained_by,
            });
        }
    }
    for task in h.tasks {
        let work = Work::Task(task.clone());
        if result_at.contains_key(&work) && !starts.contains_key(&work) {
            report
                .violations
                .push(Violation::CompletedWithoutExecution { task: task.clone() });
        }
    }

    // Fold hashes.
    if let Some(first) = h.summaries.first() {
        for s in h.summaries {
            if (&s.board_hash, &s.tasks_hash) != (&first.board_hash, &first.tasks_hash) {
                report.violations.push(Violation::HashesDiffer {
                    detail: format!(
                        "relay {} board {} tasks {} vs relay {} board {} tasks {}",
                        s.relay,
                        s.board_hash,
                        s.tasks_hash,
                        first.relay,
                        first.board_hash,
                        first.tasks_hash
                    ),
                });
            }
        }
        if let Some((board, tasks)) = &h.expected_hashes {
            if (&first.board_hash, &first.tasks_hash) != (board, tasks) {
                report.violations.push(Violation::HashesDiffer {
                    detail: format!(
                        "relay {} board {} tasks {} vs the test's fold board {board} tasks {tasks}",
                        first.relay, first.board_hash, first.tasks_hash
                    ),
                });
            }
        }
    }
    report
}

/// A fault that may repeat work and hit the relay of one of the earlier executions
/// between its start and this repeat.
fn explain(h: &History<'_>, earlier: &[&SideEffect], repeat_us: i64) -> Option<FaultKind> {
    earlier.iter().find_map(|e| {
        let relay = h.hosts.get(&e.agent)?;
        h.faults
            .iter()
            .find(|f| {
                f.kind.may_repeat_work()
                    && (f.hits(relay, e.time_us, repeat_us)
                        || (h.one_writer
                            && f.kind == FaultKind::Pause
                            && f.from_us <= repeat_us
                            && f.to_us >= e.time_us))
            })
            .map(|f| f.kind)
    })
}
