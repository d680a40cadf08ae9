//! The `!delegate` parser: one task per line, all or nothing.
//!
//! ```text
//! !delegate
//! spec: write the spec
//! api: build the API [after spec] @ana
//! ui: build the UI [after spec]
//! ship: ship it [after api, ui]
//! ```
//!
//! The exact grammar is in `docs/protocol/commands.md`. In short: `id: label`, then
//! at the very end of the line, in any order and each at most once, the bracketed
//! clauses `[after dep1, dep2]`, `[needs cap1, cap2]`, `[priority N]`, `[size N]`,
//! `[attempts N]`, `[due 30m]`, `[uses RESOURCE [MODE], ...]`, `[review @agent [rounds
//! N]]`, `[undo LABEL]` (a `:` may follow the keyword) and an `@assignee`. Only the
//! bracketed forms are clauses, so a label that merely ends in the word "after"
//! ("clean up after") is just a label; a bracket whose first word is no keyword
//! (`[WIP]`) stays in the label, and a clause anywhere else is an error, so a label is
//! never silently misread.
//!
//! The parser also gives each task its critical path within the plan (`path`): its
//! size plus the longest path among the plan's tasks that wait for it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;

use serde::Serialize;

use crate::config::{check_agent_name, parse_duration, shorten};
use crate::protocol::task::{
    valid_capability, MAX_ATTEMPTS_CAP, MAX_CAPABILITIES, MAX_CAPABILITY_BYTES, MAX_TASK_DUE_MS,
    MAX_TASK_PRIORITY, MAX_TASK_SIZE, MIN_TASK_DUE_MS,
};
use crate::resources::{ordered, Mode, ResourceName, Wanted};

/// Most tasks one `!delegate` may create.
pub const MAX_TASKS: usize = 1_000;
/// Largest owner command, in bytes (256 KiB).
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;
/// Longest task id, in bytes.
pub const MAX_ID_BYTES: usize = 64;
/// Most errors reported for one command (the rest are counted).
pub const MAX_REPORTED_ERRORS: usize = 10;

/// One task of a [`DelegatePlan`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskSpec {
    /// The task id, `[A-Za-z0-9_-]{1,64}`.
    pub id: String,
    /// What to do (never empty).
    pub label: String,
    /// Ids of the tasks this one waits for: sorted, without duplicates. They are
    /// tasks of the same plan or (with [`parse_delegate_with`]) tasks that already
    /// exist in the room.
    pub deps: Vec<String>,
    /// The agent the task is pushed to (without the `@`), if any.
    pub assignee: Option<String>,
    /// Capabilities an agent must declare to take it (`[needs a, b]`): sorted, without
    /// duplicates.
    pub needs: Vec<String>,
    /// `[priority N]`: lower goes first (absent: the default, 100).
    pub priority: Option<u32>,
    /// `[size N]`: relative cost (absent: 1).
    pub size: Option<u32>,
    /// `[attempts N]`: attempts before it fails for good (absent: the room's
    /// `max-attempts`).
    pub attempts: Option<u32>,
    /// `[due 30m]`: how long each attempt may run, ms, from its claim (absent: no
    /// deadline).
    pub due_ms: Option<u64>,
    /// `[uses file:docs/**, slot:build permits-2]`: resources its turn holds while it
    /// runs, in the global order (the mode defaults to exclusive).
    pub uses: Vec<Wanted>,
    /// `[review @lead rounds 2]`: the reviewer who accepts or rejects its work, and
    /// the rejections it may have (absent: the room's `review-rounds`).
    pub review: Option<ReviewSpec>,
    /// `[undo refund the card]`: the compensation to run if a task that waits for it
    /// fails for good or is cancelled after it completed (a saga).
    pub undo: Option<String>,
    /// Its critical path in the plan: its size plus the longest path among the plan's
    /// tasks that wait for it.
    pub path: u64,
    /// The line of the message the task was written on (1-based).
    pub line: usize,
}

/// A task's review gate as written: `[review @lead]`, `[review lead rounds 2]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReviewSpec {
    /// The reviewer (without the `@`).
    pub agent: String,
    /// `rounds N`: rejections before the task fails for good (absent: the room's
    /// `review-rounds`).
    pub rounds: Option<u32>,
}

/// A parsed `!delegate`: its tasks in dependency order. Every task comes after the
/// tasks it waits for; at each step the earliest-written task whose dependencies are
/// all placed comes next. The same text always gives the same plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DelegatePlan {
    /// The tasks.
    pub tasks: Vec<TaskSpec>,
}

impl DelegatePlan {
    /// A one-line summary for the reply, e.g. `Created 3 tasks: a, b, c.`
    pub fn summary(&self) -> String {
        let ids: Vec<&str> = self.tasks.iter().map(|t| t.id.as_str()).collect();
        created_summary(&ids)
    }
}

/// The `Created N tasks: a, b, c.` line for these task ids (the first 20 named).
pub fn created_summary(ids: &[&str]) -> String {
    let shown = if ids.len() > 20 {
        format!("{}, … ({} more)", ids[..20].join(", "), ids.len() - 20)
    } else {
        ids.join(", ")
    };
    let noun = if ids.len() == 1 { "task" } else { "tasks" };
    format!("Created {} {noun}: {shown}.", ids.len())
}

/// One problem in a `!delegate`, with the line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelegateError {
    /// The 1-based line of the message; `None` for a problem of the whole command.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: DelegateErrorKind,
}

/// What is wrong with a `!delegate` line or command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DelegateErrorKind {
    /// The command is over [`MAX_COMMAND_BYTES`].
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// More than [`MAX_TASKS`] tasks (reported on the first line over).
    TooManyTasks,
    /// No task lines at all.
    NoTasks,
    /// A line without `:` after the id.
    MissingColon,
    /// A task id outside `[A-Za-z0-9_-]{1,64}`.
    BadId {
        /// The id as written (shortened).
        id: String,
        /// Why.
        reason: &'static str,
    },
    /// Nothing left of the label once the clauses are taken off.
    EmptyLabel {
        /// The task.
        id: String,
    },
    /// A label with a control character.
    BadLabel {
        /// The task.
        id: String,
    },
    /// A bracketed clause (`[after ...]`, `[needs ...]`, ...) that is not at the end
    /// of the line, or given twice.
    MisplacedClause {
        /// The task.
        id: String,
        /// The clause's keyword.
        keyword: &'static str,
    },
    /// A malformed `[needs ...]`, `[priority N]`, `[size N]` or `[attempts N]`.
    BadClause {
        /// The task.
        id: String,
        /// Why.
        reason: String,
    },
    /// A malformed `[after ...]` clause.
    BadDeps {
        /// The task.
        id: String,
        /// Why.
        reason: String,
    },
    /// A malformed `@assignee`.
    BadAssignee {
        /// The task.
        id: String,
        /// Why.
        reason: String,
    },
    /// The id was already defined earlier in the command.
    DuplicateId {
        /// The id.
        id: String,
        /// Where it was first defined.
        first_line: usize,
    },
    /// The id is already a task of the room.
    AlreadyExists {
        /// The id.
        id: String,
    },
    /// A dependency that is neither in the command nor an existing task.
    UnknownDep {
        /// The task.
        id: String,
        /// The unknown dependency.
        dep: String,
    },
    /// A task that lists itself in `[after ...]`.
    SelfDep {
        /// The task.
        id: String,
    },
    /// Tasks that wait for each other in a circle: `path` starts and ends with the
    /// same id, each waiting for the next.
    Cycle {
        /// The cycle.
        path: Vec<String>,
    },
}

const SHAPE: &str = "`id: label [after dep1, dep2] [@agent]`";

impl fmt::Display for DelegateErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DelegateErrorKind::*;
        match self {
            TooLarge { bytes } => write!(
                f,
                "the command is {bytes} bytes; the limit is {MAX_COMMAND_BYTES} bytes \
                 (256 KiB): split it into several !delegate messages"
            ),
            TooManyTasks => write!(
                f,
                "more than {MAX_TASKS} tasks in one command: split it into several \
                 !delegate messages"
            ),
            NoTasks => write!(f, "no tasks: write one task per line as {SHAPE}"),
            MissingColon => write!(f, "expected {SHAPE}, but there is no `:` after the id"),
            BadId { id, reason } => write!(f, "bad task id `{id}`: {reason}"),
            EmptyLabel { id } => write!(f, "task `{id}` has an empty label"),
            BadLabel { id } => write!(f, "task `{id}`: the label contains a control character"),
            MisplacedClause { id, keyword } => write!(
                f,
                "task `{id}`: `[{keyword} ...]` must come at the end of the line (only \
                 other clauses and `@agent` may follow it), and only once"
            ),
            BadClause { id, reason } => write!(f, "task `{id}`: {reason}"),
            BadDeps { id, reason } => write!(f, "task `{id}`: {reason}"),
            BadAssignee { id, reason } => write!(f, "task `{id}`: {reason}"),
            DuplicateId { id, first_line } => write!(
                f,
                "duplicate task id `{id}` (first defined on line {first_line})"
            ),
            AlreadyExists { id } => write!(
                f,
                "task id `{id}` already exists in this room; choose another id"
            ),
            UnknownDep { id, dep } => write!(
                f,
                "task `{id}` waits for `{dep}`, which is not a task in this command or \
                 the room"
            ),
            SelfDep { id } => write!(f, "task `{id}` waits for itself"),
            Cycle { path } => write!(
                f,
                "dependency cycle {} (each task waits for the next, so none can start)",
                path.join(" -> ")
            ),
        }
    }
}

impl fmt::Display for DelegateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

/// Every problem found in a rejected `!delegate` (the first
/// [`MAX_REPORTED_ERRORS`], sorted by line). Nothing of the command is applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct DelegateErrors {
    /// The problems reported.
    pub errors: Vec<DelegateError>,
    /// How many more were found but not listed.
    pub omitted: usize,
}

impl DelegateErrors {
    fn single(line: Option<usize>, kind: DelegateErrorKind) -> Self {
        DelegateErrors {
            errors: vec![DelegateError { line, kind }],
            omitted: 0,
        }
    }

    /// The first problem (there is always at least one).
    pub fn first(&self) -> Option<&DelegateError> {
        self.errors.first()
    }
}

impl fmt::Display for DelegateErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "!delegate rejected, no task was created:")?;
        for e in &self.errors {
            write!(f, "\n- {e}")?;
        }
        if self.omitted > 0 {
            write!(f, "\n- … and {} more", self.omitted)?;
        }
        Ok(())
    }
}

/// Parses a `!delegate` message (the leading `!delegate` word is optional), with no
/// existing tasks in the room.
pub fn parse_delegate(message: &str) -> Result<DelegatePlan, DelegateErrors> {
    parse_delegate_with(message, &|_| false)
}

/// Parses a `!delegate` message where `task_exists` says which task ids the room
/// already has: a new task may wait for them, and may not reuse their ids.
pub fn parse_delegate_with(
    message: &str,
    task_exists: &dyn Fn(&str) -> bool,
) -> Result<DelegatePlan, DelegateErrors> {
    if message.len() > MAX_COMMAND_BYTES {
        return Err(DelegateErrors::single(
            None,
            DelegateErrorKind::TooLarge {
                bytes: message.len(),
            },
        ));
    }
    let mut errors: Vec<DelegateError> = Vec::new();
    let mut tasks: Vec<TaskSpec> = Vec::new();
    // Ids of every line whose id was readable, even if the rest was not, so a
    // broken line does not also make its dependents report "unknown task".
    let mut seen_ids: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = 0usize;
    let mut command_seen = false;

    for (index, raw) in message.split('\n').enumerate() {
        let line_no = index + 1;
        let mut line = raw.strip_suffix('\r').unwrap_or(raw).trim();
        if !command_seen && !line.is_empty() {
            command_seen = true;
            if let Some(rest) = strip_command_word(line) {
                line = rest.trim();
            }
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        count += 1;
        if count > MAX_TASKS {
            errors.push(DelegateError {
                line: Some(line_no),
                kind: DelegateErrorKind::TooManyTasks,
            });
            break;
        }
        let line = strip_bullet(line);
        let (id, parsed) = parse_task_line(line);
        if let Some(id) = &id {
            if let Some(first_line) = seen_ids.get(id) {
                errors.push(DelegateError {
                    line: Some(line_no),
                    kind: DelegateErrorKind::DuplicateId {
                        id: id.clone(),
                        first_line: *first_line,
                    },
                });
                continue;
            }
            seen_ids.insert(id.clone(), line_no);
            if task_exists(id) {
                errors.push(DelegateError {
                    line: Some(line_no),
                    kind: DelegateErrorKind::AlreadyExists { id: id.clone() },
                });
                continue;
            }
        }
        match parsed {
            Ok(mut spec) => {
                spec.line = line_no;
                tasks.push(spec);
            }
            Err(kind) => errors.push(DelegateError {
                line: Some(line_no),
                kind,
            }),
        }
    }

    if count == 0 {
        return Err(DelegateErrors::single(None, DelegateErrorKind::NoTasks));
    }

    // Dependencies: no self-loops, nothing unknown.
    for t in &tasks {
        for dep in &t.deps {
            let kind = if dep == &t.id {
                DelegateErrorKind::SelfDep { id: t.id.clone() }
            } else if seen_ids.contains_key(dep) || task_exists(dep) {
                continue;
            } else {
                DelegateErrorKind::UnknownDep {
                    id: t.id.clone(),
                    dep: dep.clone(),
                }
            };
            errors.push(DelegateError {
                line: Some(t.line),
                kind,
            });
        }
    }

    if errors.is_empty() {
        match order_tasks(tasks) {
            Ok(mut ordered) => {
                critical_paths(&mut ordered);
                return Ok(DelegatePlan { tasks: ordered });
            }
            Err(cycles) => errors = cycles,
        }
    }
    errors.sort_by_key(|e| e.line);
    let omitted = errors.len().saturating_sub(MAX_REPORTED_ERRORS);
    errors.truncate(MAX_REPORTED_ERRORS);
    Err(DelegateErrors { errors, omitted })
}

/// If `line` starts with the `!delegate` word, the rest of it.
fn strip_command_word(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("!delegate")?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then_some(rest)
}

/// Drops a Markdown list bullet (`- `, `* `, `+ `): ids never contain spaces, so a
/// dash followed by white space cannot be the start of an id.
fn strip_bullet(line: &str) -> &str {
    for bullet in ['-', '*', '+', '•'] {
        if let Some(rest) = line.strip_prefix(bullet) {
            if rest.starts_with(char::is_whitespace) {
                return rest.trim_start();
            }
        }
    }
    line
}

/// Checks a task id; the reason when it is bad.
fn id_problem(id: &str) -> Option<&'static str> {
    if id.ends_with(crate::protocol::task::UNDO_SUFFIX) {
        Some("ids ending in `--undo` are the compensations of `[undo ...]`; choose another")
    } else if id.is_empty() {
        Some("the id is empty")
    } else if id.len() > MAX_ID_BYTES {
        Some("ids are at most 64 bytes")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Some("ids use only letters, digits, `_` and `-`")
    } else {
        None
    }
}

/// Parses one task line (already trimmed, bullet removed). Returns the id when it
/// was readable, and the task or the problem.
fn parse_task_line(line: &str) -> (Option<String>, Result<TaskSpec, DelegateErrorKind>) {
    let Some((id_text, rest)) = line.split_once(':') else {
        return (None, Err(DelegateErrorKind::MissingColon));
    };
    let id_text = id_text.trim();
    if let Some(reason) = id_problem(id_text) {
        let err = DelegateErrorKind::BadId {
            id: shorten(id_text),
            reason,
        };
        return (None, Err(err));
    }
    let id = id_text.to_string();
    let result = parse_task_rest(&id, rest.trim());
    (Some(id), result)
}

fn parse_task_rest(id: &str, rest: &str) -> Result<TaskSpec, DelegateErrorKind> {
    let mut label = rest;
    let mut assignee: Option<&str> = None;
    let mut clauses = Clauses::default();
    let mut seen: BTreeSet<Keyword> = BTreeSet::new();
    // The clauses sit at the end of the line, in any order, each at most once.
    loop {
        if assignee.is_none() {
            if let Some((head, who)) = trailing_assignee(label) {
                assignee = Some(who);
                label = head;
                continue;
            }
        }
        if let Some((head, keyword, inner)) = trailing_clause(label) {
            if !seen.insert(keyword) {
                return Err(DelegateErrorKind::MisplacedClause {
                    id: id.to_string(),
                    keyword: keyword.word(),
                });
            }
            clauses.read(id, keyword, inner)?;
            label = head;
            continue;
        }
        break;
    }
    if let Some(keyword) = contained_clause(label) {
        return Err(DelegateErrorKind::MisplacedClause {
            id: id.to_string(),
            keyword: keyword.word(),
        });
    }
    if assignee.is_some() && trailing_assignee(label).is_some() {
        return Err(DelegateErrorKind::BadAssignee {
            id: id.to_string(),
            reason: "more than one @agent at the end of the line; a task has at most one \
                     assignee"
                .into(),
        });
    }
    let assignee = match assignee {
        None => None,
        Some(who) => {
            check_agent_name(who).map_err(|reason| DelegateErrorKind::BadAssignee {
                id: id.to_string(),
                reason: format!("bad assignee `@{}`: {reason}", shorten(who)),
            })?;
            Some(who.to_string())
        }
    };
    if label.is_empty() {
        return Err(DelegateErrorKind::EmptyLabel { id: id.to_string() });
    }
    if label.chars().any(|c| c.is_control() && c != '\t') {
        return Err(DelegateErrorKind::BadLabel { id: id.to_string() });
    }
    let size = clauses.size.unwrap_or(1);
    Ok(TaskSpec {
        id: id.to_string(),
        label: label.to_string(),
        deps: clauses.deps,
        assignee,
        needs: clauses.needs,
        priority: clauses.priority,
        size: clauses.size,
        attempts: clauses.attempts,
        due_ms: clauses.due_ms,
        uses: clauses.uses,
        review: clauses.review,
        undo: clauses.undo,
        path: u64::from(size),
        line: 0,
    })
}

/// The keyword of a bracketed clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Keyword {
    After,
    Needs,
    Priority,
    Size,
    Attempts,
    Due,
    Uses,
    Review,
    Undo,
}

impl Keyword {
    const ALL: [Keyword; 9] = [
        Keyword::After,
        Keyword::Needs,
        Keyword::Priority,
        Keyword::Size,
        Keyword::Attempts,
        Keyword::Due,
        Keyword::Uses,
        Keyword::Review,
        Keyword::Undo,
    ];

    fn word(self) -> &'static str {
        match self {
            Keyword::After => "after",
            Keyword::Needs => "needs",
            Keyword::Priority => "priority",
            Keyword::Size => "size",
            Keyword::Attempts => "attempts",
            Keyword::Due => "due",
            Keyword::Uses => "uses",
            Keyword::Review => "review",
            Keyword::Undo => "undo",
        }
    }
}

/// What the bracketed clauses of a line said.
#[derive(Default)]
struct Clauses {
    deps: Vec<String>,
    needs: Vec<String>,
    priority: Option<u32>,
    size: Option<u32>,
    attempts: Option<u32>,
    due_ms: Option<u64>,
    uses: Vec<Wanted>,
    review: Option<ReviewSpec>,
    undo: Option<String>,
}

impl Clauses {
    /// Reads the text after `keyword` of one clause.
    fn read(&mut self, id: &str, keyword: Keyword, inner: &str) -> Result<(), DelegateErrorKind> {
        match keyword {
            Keyword::After => self.deps = parse_deps(id, inner)?,
            Keyword::Needs => self.needs = parse_needs(id, inner)?,
            Keyword::Priority => {
                self.priority = Some(parse_number(id, keyword, inner, 0, MAX_TASK_PRIORITY)?)
            }
            Keyword::Size => self.size = Some(parse_number(id, keyword, inner, 1, MAX_TASK_SIZE)?),
            Keyword::Attempts => {
                self.attempts = Some(parse_number(id, keyword, inner, 1, MAX_ATTEMPTS_CAP)?)
            }
            Keyword::Due => self.due_ms = Some(parse_due(id, inner)?),
            Keyword::Uses => self.uses = parse_uses(id, inner)?,
            Keyword::Review => self.review = Some(parse_review(id, inner)?),
            Keyword::Undo => self.undo = Some(parse_undo(id, inner)?),
        }
        Ok(())
    }
}

/// `label [kw ...]` -> (`label`, the keyword, what follows it) when the line ends
/// with a bracketed clause whose first word is a keyword.
fn trailing_clause(s: &str) -> Option<(&str, Keyword, &str)> {
    let body = s.strip_suffix(']')?;
    let open = body.rfind('[')?;
    let (keyword, rest) = keyword_word(&body[open + 1..])?;
    Some((s[..open].trim_end(), keyword, rest))
}

/// If `inner` starts with a clause keyword (any case, then `:`, white space, a comma
/// or the end), the keyword and what follows it (after the `:`).
fn keyword_word(inner: &str) -> Option<(Keyword, &str)> {
    let t = inner.trim_start();
    Keyword::ALL.into_iter().find_map(|k| {
        let w = k.word();
        let head = t.get(..w.len())?;
        if !head.eq_ignore_ascii_case(w) {
            return None;
        }
        let rest = &t[w.len()..];
        if let Some(after_colon) = rest.strip_prefix(':') {
            return Some((k, after_colon));
        }
        (rest.is_empty() || rest.starts_with(|c: char| c.is_whitespace() || c == ','))
            .then_some((k, rest))
    })
}

/// The keyword of a clause that appears anywhere in `s`.
fn contained_clause(s: &str) -> Option<Keyword> {
    s.match_indices('[')
        .find_map(|(i, _)| keyword_word(&s[i + 1..]).map(|(k, _)| k))
}

fn parse_needs(id: &str, inner: &str) -> Result<Vec<String>, DelegateErrorKind> {
    let mut needs = BTreeSet::new();
    for cap in inner.split(|c: char| c == ',' || c.is_whitespace()) {
        if cap.is_empty() {
            continue;
        }
        if !valid_capability(cap) || cap.contains(['[', ']']) {
            return Err(DelegateErrorKind::BadClause {
                id: id.to_string(),
                reason: format!(
                    "bad capability `{}` in `[needs ...]`: at most {MAX_CAPABILITY_BYTES} \
                     bytes, no brackets or control characters",
                    shorten(cap)
                ),
            });
        }
        needs.insert(cap.to_string());
    }
    if needs.is_empty() {
        return Err(DelegateErrorKind::BadClause {
            id: id.to_string(),
            reason: "`[needs]` names no capability; write `[needs rust, sql]` or drop the \
                     clause"
                .into(),
        });
    }
    if needs.len() > MAX_CAPABILITIES {
        return Err(DelegateErrorKind::BadClause {
            id: id.to_string(),
            reason: format!("more than {MAX_CAPABILITIES} capabilities in `[needs ...]`"),
        });
    }
    Ok(needs.into_iter().collect())
}

/// `file:docs/**, api:github shared, slot:build permits 2`: comma-separated resources,
/// each a name and an optional mode (`exclusive`, the default; `shared`; `permits N`
/// or `permits-N`), checked and put in the global order.
fn parse_uses(id: &str, inner: &str) -> Result<Vec<Wanted>, DelegateErrorKind> {
    let bad = |reason: String| DelegateErrorKind::BadClause {
        id: id.to_string(),
        reason,
    };
    let mut wanted = Vec::new();
    for item in inner.split(',') {
        let words: Vec<&str> = item.split_whitespace().collect();
        let Some((name, mode_words)) = words.split_first() else {
            continue;
        };
        if name.contains(['[', ']']) {
            return Err(bad(format!(
                "bad resource `{}` in `[uses ...]`: no brackets in a resource name",
                shorten(name)
            )));
        }
        let name = ResourceName::parse(name).map_err(|e| bad(format!("`[uses ...]`: {e}")))?;
        let mode = match mode_words {
            [] => Mode::Exclusive,
            [m] if m.eq_ignore_ascii_case("permits") => {
                return Err(bad(format!(
                    "`[uses ...]`: resource {name}: `permits` needs a number, e.g. `{name} \
                     permits 2`"
                )))
            }
            [m, n] if m.eq_ignore_ascii_case("permits") => Mode::parse(&format!("permits-{n}"))
                .map_err(|e| bad(format!("`[uses ...]`: resource {name}: {e}")))?,
            [m] => Mode::parse(&m.to_ascii_lowercase())
                .map_err(|e| bad(format!("`[uses ...]`: resource {name}: {e}")))?,
            _ => {
                return Err(bad(format!(
                    "`[uses ...]`: resource {name}: write at most a mode after the name \
                     (exclusive, shared or permits N), and separate resources with commas"
                )))
            }
        };
        wanted.push(Wanted { name, mode });
    }
    if wanted.is_empty() {
        return Err(bad(
            "`[uses]` names no resource; write `[uses file:docs/**]` or drop the clause".into(),
        ));
    }
    ordered(wanted).map_err(|e| bad(format!("`[uses ...]`: {e}")))
}

/// A whole number in `lo..=hi` (the only word of a `[priority N]`, `[size N]` or
/// `[attempts N]` clause).
fn parse_number(
    id: &str,
    keyword: Keyword,
    inner: &str,
    lo: u32,
    hi: u32,
) -> Result<u32, DelegateErrorKind> {
    let text = inner.trim();
    let bad = || DelegateErrorKind::BadClause {
        id: id.to_string(),
        reason: format!(
            "`[{} {}]`: expected a whole number from {lo} to {hi}",
            keyword.word(),
            shorten(text)
        ),
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(bad()),
    }
}

/// The duration of a `[due ...]` clause, ms: `90s`, `30m`, `2h`, `1h30m` (the
/// `!config` duration grammar), from 1 s to 7 days.
/// The compensation's label: free text, not empty, no control characters, at most
/// [`MAX_LABEL_BYTES`](crate::protocol::task::MAX_LABEL_BYTES).
fn parse_undo(id: &str, inner: &str) -> Result<String, DelegateErrorKind> {
    let label = inner.trim();
    let bad = |reason: &str| DelegateErrorKind::BadClause {
        id: id.to_string(),
        reason: format!("`[undo ...]`: {reason}"),
    };
    if label.is_empty() {
        return Err(bad(
            "say what undoes the task, e.g. `[undo refund the card]`",
        ));
    }
    if label.chars().any(|c| c.is_control() && c != '\t') {
        return Err(bad("the label contains a control character"));
    }
    if label.len() > crate::protocol::task::MAX_LABEL_BYTES {
        return Err(bad("the label is over 4 KiB"));
    }
    Ok(label.to_string())
}

/// `@lead`, `lead`, `@lead rounds 2`, `@lead, rounds: 2`.
fn parse_review(id: &str, inner: &str) -> Result<ReviewSpec, DelegateErrorKind> {
    let bad = |reason: String| DelegateErrorKind::BadClause {
        id: id.to_string(),
        reason,
    };
    let shape = "write `[review @agent]` or `[review @agent rounds N]`";
    let words: Vec<&str> = inner
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    let (who, rest) = match words.split_first() {
        Some((who, rest)) => (who.strip_prefix('@').unwrap_or(who), rest),
        None => return Err(bad(format!("`[review]` names no reviewer; {shape}"))),
    };
    check_agent_name(who).map_err(|reason| {
        bad(format!(
            "bad reviewer `{}` in `[review ...]`: {reason}",
            shorten(who)
        ))
    })?;
    let rounds = match rest {
        [] => None,
        [word, n] | [word, n, ..] if word.trim_end_matches(':').eq_ignore_ascii_case("rounds") => {
            if rest.len() > 2 {
                return Err(bad(format!(
                    "`[review ...]`: unexpected `{}` after the rounds; {shape}",
                    shorten(rest[2])
                )));
            }
            let max = crate::protocol::task::MAX_REVIEW_ROUNDS;
            match n.parse::<u32>() {
                Ok(v) if (1..=max).contains(&v) => Some(v),
                _ => {
                    return Err(bad(format!(
                        "`[review ... rounds {}]`: rounds is a whole number from 1 to {max}",
                        shorten(n)
                    )))
                }
            }
        }
        [other, ..] => {
            return Err(bad(format!(
                "`[review ...]`: unexpected `{}` (one reviewer per task); {shape}",
                shorten(other)
            )))
        }
    };
    Ok(ReviewSpec {
        agent: who.to_string(),
        rounds,
    })
}

fn parse_due(id: &str, inner: &str) -> Result<u64, DelegateErrorKind> {
    let text = inner.trim();
    let bad = || DelegateErrorKind::BadClause {
        id: id.to_string(),
        reason: format!(
            "`[due {}]`: expected a duration such as 90s, 30m or 2h, from 1s to 7 days",
            shorten(text)
        ),
    };
    match parse_duration(text) {
        Ok(ms) if (MIN_TASK_DUE_MS..=MAX_TASK_DUE_MS).contains(&ms) => Ok(ms),
        _ => Err(bad()),
    }
}

/// `label @who` -> (`label`, `who`) when the last white-space separated token
/// starts with `@`.
fn trailing_assignee(s: &str) -> Option<(&str, &str)> {
    let (head, last) = match s.rfind(char::is_whitespace) {
        Some(i) => (&s[..i], &s[i..]),
        None => ("", s),
    };
    let who = last.trim().strip_prefix('@')?;
    // `[review @lead]` ends in a clause, not an assignee.
    if who.ends_with(']') {
        return None;
    }
    Some((head.trim_end(), who))
}

fn parse_deps(id: &str, inner: &str) -> Result<Vec<String>, DelegateErrorKind> {
    let mut deps = BTreeSet::new();
    for dep in inner.split(|c: char| c == ',' || c.is_whitespace()) {
        if dep.is_empty() {
            continue;
        }
        if let Some(reason) = id_problem(dep) {
            return Err(DelegateErrorKind::BadDeps {
                id: id.to_string(),
                reason: format!("bad dependency id `{}`: {reason}", shorten(dep)),
            });
        }
        deps.insert(dep.to_string());
    }
    if deps.is_empty() {
        return Err(DelegateErrorKind::BadDeps {
            id: id.to_string(),
            reason: "`[after]` names no task; write `[after a, b]` or drop the clause".into(),
        });
    }
    Ok(deps.into_iter().collect())
}

/// Sets each task's `path`: its size plus the longest `path` among the plan's tasks
/// that wait for it. `tasks` is in dependency order, so one pass from the end sees
/// every dependant before the task it waits for.
fn critical_paths(tasks: &mut [TaskSpec]) {
    let index: BTreeMap<String, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.clone(), i))
        .collect();
    // longest[i]: the longest path among the dependants of task i seen so far.
    let mut longest = vec![0u64; tasks.len()];
    for i in (0..tasks.len()).rev() {
        let t = &mut tasks[i];
        t.path = u64::from(t.size.unwrap_or(1)).saturating_add(longest[i]);
        let path = t.path;
        for d in &t.deps {
            if let Some(&j) = index.get(d) {
                longest[j] = longest[j].max(path);
            }
        }
    }
}

/// Orders the tasks so every task comes after the tasks of the plan it waits for
/// (Kahn's algorithm, taking the earliest line among the ready ones), or names every
/// cycle.
fn order_tasks(tasks: Vec<TaskSpec>) -> Result<Vec<TaskSpec>, Vec<DelegateError>> {
    let index: BTreeMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    // deps_of[i]: plan-internal dependencies; dependents[j]: who waits for j.
    let deps_of: Vec<Vec<usize>> = tasks
        .iter()
        .map(|t| {
            t.deps
                .iter()
                .filter_map(|d| index.get(d.as_str()).copied())
                .collect()
        })
        .collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, deps) in deps_of.iter().enumerate() {
        for &d in deps {
            dependents[d].push(i);
        }
    }
    let mut waiting: Vec<usize> = deps_of.iter().map(Vec::len).collect();
    let mut ready: BinaryHeap<Reverse<usize>> = waiting
        .iter()
        .enumerate()
        .filter(|(_, w)| **w == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(tasks.len());
    let mut done = vec![false; tasks.len()];
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        done[i] = true;
        for &j in &dependents[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.push(Reverse(j));
            }
        }
    }
    if order.len() == tasks.len() {
        let mut slots: Vec<Option<TaskSpec>> = tasks.into_iter().map(Some).collect();
        return Ok(order.into_iter().filter_map(|i| slots[i].take()).collect());
    }

    // Every task left waits for another task left, so walking "waits for" from any
    // of them must come back to a task already on the walk: that is a cycle.
    let mut errors = Vec::new();
    let mut reported = vec![false; tasks.len()];
    for start in 0..tasks.len() {
        if done[start] || reported[start] {
            continue;
        }
        let mut path: Vec<usize> = Vec::new();
        let mut on_path: BTreeMap<usize, usize> = BTreeMap::new();
        let mut node = start;
        let cycle = loop {
            if reported[node] {
                break None; // leads into a cycle already named
            }
            if let Some(&at) = on_path.get(&node) {
                break Some(path[at..].to_vec());
            }
            on_path.insert(node, path.len());
            path.push(node);
            match deps_of[node].iter().find(|&&d| !done[d]) {
                Some(&next) => node = next,
                None => break None, // cannot happen: every task left waits
            }
        };
        for &n in &path {
            reported[n] = true;
        }
        if let Some(mut cycle) = cycle {
            // Start the cycle at its earliest line, and close it.
            let first = cycle
                .iter()
                .enumerate()
                .min_by_key(|(_, &n)| n)
                .map(|(i, _)| i)
                .unwrap_or(0);
            cycle.rotate_left(first);
            let line = tasks[cycle[0]].line;
            let mut path: Vec<String> = cycle.iter().map(|&n| tasks[n].id.clone()).collect();
            path.push(path[0].clone());
            errors.push(DelegateError {
                line: Some(line),
                kind: DelegateErrorKind::Cycle { path },
            });
        }
    }
    if errors.is_empty() {
        // Unreachable by the argument above; still never accept a plan that does
        // not order.
        let path = (0..tasks.len())
            .filter(|&i| !done[i])
            .map(|i| tasks[i].id.clone())
            .collect();
        errors.push(DelegateError {
            line: None,
            kind: DelegateErrorKind::Cycle { path },
        });
    }
    Err(errors)
}
