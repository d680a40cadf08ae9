//! Owner commands: `!delegate` (seed a task DAG) and `!config` (tune the room).
//!
//! Commands come from owners (DESIGN invariant 8). A message is parsed as a command
//! only when its role is [`Role::Owner`]; with [`owner_command_in`] also only when
//! its actor is the owner `room.created` named **and** it is signed by the room's
//! owner key ([`crate::signing`]). Text that any other actor produces, an agent's
//! reply above all, is data and is never parsed here, whatever it says; so is an
//! owner's command that is not signed.
//!
//! ```
//! use huddle_core::commands::{owner_command, OwnerCommand};
//! use huddle_core::Role;
//!
//! let text = "!delegate\na: write the spec\nb: build it [after a] @ana";
//! let Some(Ok(OwnerCommand::Delegate(plan))) = owner_command(Role::Owner, text) else {
//!     panic!("an owner's !delegate parses");
//! };
//! assert_eq!(plan.tasks[1].deps, vec!["a".to_string()]);
//!
//! // The same text from an agent is just text.
//! assert!(owner_command(Role::Agent, text).is_none());
//! ```
//!
//! The grammar of both commands is documented in `docs/protocol/commands.md`.

mod approve;
mod authority;
mod config_cmd;
mod delegate;
mod lifecycle;
mod stop;
mod target;
#[cfg(test)]
mod tests;
mod watch;

pub use approve::{parse_approval, ApprovalCommand, ApprovalError};
pub use authority::OwnerAuthority;
pub use config_cmd::{
    get_reply, help_text, parse_config, parse_config_in, ConfigChange, ConfigCommand, ConfigError,
    ConfigTarget,
};
pub use delegate::{
    created_summary, parse_delegate, parse_delegate_with, DelegateError, DelegateErrorKind,
    DelegateErrors, DelegatePlan, TaskSpec, MAX_COMMAND_BYTES, MAX_ID_BYTES, MAX_REPORTED_ERRORS,
    MAX_TASKS,
};
pub use lifecycle::{
    parse_cancel, parse_retry, CancelCommand, LifecycleError, RetryCommand, MAX_LIFECYCLE_TASKS,
};
pub use stop::{parse_stop, StopCommand, StopError};
pub use target::TargetError;
pub use watch::{parse_watch, WatchCommand, WatchError};

use crate::config::ConfigFold;
use crate::model::{Interaction, NewInteraction, Role};
use crate::protocol::task::{
    TaskCancelledBody, TaskCreatedBody, TaskRetriedBody, TaskReview, TaskUse,
};
use crate::verbs::Verb;

/// A parsed owner command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerCommand {
    /// `!delegate`: create these tasks.
    Delegate(DelegatePlan),
    /// `!config`: help, get or change.
    Config(ConfigCommand),
    /// `!approve` / `!deny`: answer an approval request.
    Approval(ApprovalCommand),
    /// `!stop`: stop running turns.
    Stop(StopCommand),
    /// `!watch` / `!unwatch`: an agent follows a thread, or stops.
    Watch(WatchCommand),
    /// `!retry`: abandoned or cancelled tasks run again.
    Retry(RetryCommand),
    /// `!cancel`: tasks (and their dependants) will not run.
    Cancel(CancelCommand),
}

/// Why an owner command was rejected. Its `Display` is the reply to post; nothing
/// of a rejected command is applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A rejected `!delegate`, with every problem and its line.
    #[error(transparent)]
    Delegate(#[from] DelegateErrors),
    /// A rejected `!config`.
    #[error("!config rejected, nothing was changed: {0}")]
    Config(#[from] ConfigError),
    /// A rejected `!approve` / `!deny`.
    #[error("not recorded: {0}")]
    Approval(#[from] ApprovalError),
    /// A rejected `!stop`.
    #[error("!stop rejected, nothing was stopped: {0}")]
    Stop(#[from] StopError),
    /// A rejected `!watch` / `!unwatch`.
    #[error("nothing changed: {0}")]
    Watch(#[from] WatchError),
    /// A rejected `!retry` / `!cancel`.
    #[error("nothing changed: {0}")]
    Lifecycle(#[from] LifecycleError),
}

/// Which command a message starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandWord {
    /// `!delegate`.
    Delegate,
    /// `!config`.
    Config,
    /// `!approve`.
    Approve,
    /// `!deny`.
    Deny,
    /// `!stop`.
    Stop,
    /// `!watch`.
    Watch,
    /// `!unwatch`.
    Unwatch,
    /// `!retry`.
    Retry,
    /// `!cancel`.
    Cancel,
}

/// The command word a message starts with (after leading white space), if any:
/// exactly `!delegate`, `!config`, `!approve`, `!deny`, `!stop`, `!watch`, `!unwatch`,
/// `!retry` or `!cancel`,
/// followed by white space or the end. Anything
/// else (`!configure`, `!Config`, `hello !config`) is not a command.
pub fn command_word(text: &str) -> Option<CommandWord> {
    let t = text.trim_start();
    let word_end = t.find(char::is_whitespace).unwrap_or(t.len());
    match &t[..word_end] {
        "!delegate" => Some(CommandWord::Delegate),
        "!config" => Some(CommandWord::Config),
        "!approve" => Some(CommandWord::Approve),
        "!deny" => Some(CommandWord::Deny),
        "!stop" => Some(CommandWord::Stop),
        "!watch" => Some(CommandWord::Watch),
        "!unwatch" => Some(CommandWord::Unwatch),
        "!retry" => Some(CommandWord::Retry),
        "!cancel" => Some(CommandWord::Cancel),
        _ => None,
    }
}

/// What the parsers may know about the room.
#[derive(Clone, Copy)]
pub struct ParseContext<'a> {
    /// Whether a task id already exists in the room (new tasks may wait for it and
    /// may not reuse it).
    pub task_exists: &'a dyn Fn(&str) -> bool,
    /// The status of the room's approval request with this id, if there is one
    /// (`!approve` / `!deny` answer only pending ones).
    pub approval: &'a dyn Fn(&str) -> Option<crate::approval::ApprovalStatus>,
    /// The thread the command was posted in (`!stop` defaults to it).
    pub thread: Option<&'a str>,
}

impl Default for ParseContext<'_> {
    fn default() -> Self {
        ParseContext {
            task_exists: &|_| false,
            approval: &|_| None,
            thread: None,
        }
    }
}

impl std::fmt::Debug for ParseContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParseContext").finish_non_exhaustive()
    }
}

/// Parses `text` as an owner command when `role` is [`Role::Owner`] and the text
/// starts with a command word. `None`: not a command (including every message whose
/// role is not owner); `Some(Err)`: a command with problems, to be answered with the
/// error's text.
pub fn owner_command(role: Role, text: &str) -> Option<Result<OwnerCommand, CommandError>> {
    owner_command_with(role, text, &ParseContext::default())
}

/// [`owner_command`] with what the room already has.
pub fn owner_command_with(
    role: Role,
    text: &str,
    ctx: &ParseContext<'_>,
) -> Option<Result<OwnerCommand, CommandError>> {
    if role != Role::Owner {
        return None;
    }
    Some(match command_word(text)? {
        CommandWord::Delegate => parse_delegate_with(text, ctx.task_exists)
            .map(OwnerCommand::Delegate)
            .map_err(CommandError::from),
        CommandWord::Config => parse_config_in(text, ctx.thread)
            .map(OwnerCommand::Config)
            .map_err(CommandError::from),
        word @ (CommandWord::Approve | CommandWord::Deny) => parse_approval(text, word, ctx)
            .map(OwnerCommand::Approval)
            .map_err(CommandError::from),
        CommandWord::Stop => parse_stop(text, ctx.thread)
            .map(OwnerCommand::Stop)
            .map_err(CommandError::from),
        word @ (CommandWord::Watch | CommandWord::Unwatch) => parse_watch(text, word, ctx.thread)
            .map(OwnerCommand::Watch)
            .map_err(CommandError::from),
        CommandWord::Retry => parse_retry(text, ctx.task_exists)
            .map(OwnerCommand::Retry)
            .map_err(CommandError::from),
        CommandWord::Cancel => parse_cancel(text, ctx.task_exists)
            .map(OwnerCommand::Cancel)
            .map_err(CommandError::from),
    })
}

/// The owner command in a ledger row, if it is one: a `message.posted` whose role
/// is owner, whose actor is the room's owner per `owners` (the config fold tracks
/// `room.created` and key rotations) and whose signature verifies against the room's
/// current owner key, with the command in the body's `text`.
pub fn owner_command_in(
    message: &Interaction,
    owners: &ConfigFold,
    ctx: &ParseContext<'_>,
) -> Option<Result<OwnerCommand, CommandError>> {
    if message.verb != Verb::MessagePosted
        || !owners.is_owner(&message.room, &message.actor, message.role)
    {
        return None;
    }
    let text = message.body.get("text")?.as_str()?;
    command_word(text)?;
    owners.check_signature(message).ok()?;
    owner_command_with(message.role, text, ctx)
}

/// An owner command with the rows every relay appends for it: `message` (the owner's
/// signed `message.posted`) first, then its [`derived_rows`] as read with `config`.
/// For writers that seed a room without a relay (imports, tests); the rows are the
/// ones a relay would write, so [`OwnerAuthority`] admits them. `None` when the text
/// is not a command; `Some(Err)` when the command is rejected.
pub fn command_rows(
    message: NewInteraction,
    config: &ConfigFold,
) -> Option<Result<Vec<NewInteraction>, CommandError>> {
    let text = message.body.get("text")?.as_str()?.to_string();
    let ctx = ParseContext {
        thread: message.thread.as_deref(),
        ..ParseContext::default()
    };
    let command = match owner_command_with(message.role, &text, &ctx)? {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let read = read_back(&message, crate::model::Position::START);
    let derived = derived_rows(&read, &command, config);
    Some(Ok(std::iter::once(message).chain(derived).collect()))
}

/// A delegator agent's `!delegate`: `message` (the agent's `message.posted`, role
/// agent, its text a `!delegate`) first, then the `task.created` rows
/// [`OwnerAuthority`] authorizes for it, as read with `config` and `ctx` (the room's
/// existing tasks). Append them in one batch. The rows count only while the agent is
/// one of the effective `delegators` where it posts; the caller checks that first
/// ([`crate::config::RoomConfig::may_delegate`]) to refuse with a reason. The grammar,
/// limits and errors are the owner's `!delegate`'s.
pub fn delegate_rows(
    message: NewInteraction,
    config: &ConfigFold,
    ctx: &ParseContext<'_>,
) -> Result<Vec<NewInteraction>, DelegateErrors> {
    let text = message
        .body
        .get("text")
        .and_then(|t| t.as_str())
        .unwrap_or_default();
    let plan = parse_delegate_with(text, ctx.task_exists)?;
    let read = read_back(&message, crate::model::Position::START);
    let derived = derived_rows(&read, &OwnerCommand::Delegate(plan), config);
    Ok(std::iter::once(message).chain(derived).collect())
}

/// The rows of a room created by `owner` (holding `key`) and steered by `commands`,
/// each signed and followed by the rows relays append for it ([`command_rows`]), in
/// order: what a room looks like after its owner posted those commands and a relay
/// read them. For seeding rooms without a relay (tests, benchmarks, imports). Fails
/// on the first text that is not an accepted command.
pub fn seed_room(
    room: &str,
    owner: &str,
    key: &crate::signing::OwnerSecret,
    commands: &[&str],
) -> Result<Vec<NewInteraction>, String> {
    let created = NewInteraction::new(
        room,
        Verb::RoomCreated,
        owner,
        Role::Owner,
        serde_json::json!({"owner": owner, "key": key.public().to_hex()}),
    );
    let mut authority = OwnerAuthority::new();
    let mut rows = vec![created];
    // Folded at increasing positions, as a reader of the ledger would see them.
    let mut seq = 0;
    let mut fold = |rows: &[NewInteraction], authority: &mut OwnerAuthority| {
        for r in rows {
            seq += 1;
            let at = crate::model::Position::new(0, seq);
            crate::fold::Fold::apply(authority, &read_back(r, at));
        }
    };
    fold(&rows, &mut authority);
    for text in commands {
        let message = key.sign(NewInteraction::new(
            room,
            Verb::MessagePosted,
            owner,
            Role::Owner,
            serde_json::json!({ "text": text }),
        ));
        let more = match command_rows(message, authority.config()) {
            Some(Ok(more)) => more,
            Some(Err(e)) => return Err(format!("{text:?}: {e}")),
            None => return Err(format!("{text:?} is not an owner command")),
        };
        fold(&more, &mut authority);
        rows.extend(more);
    }
    Ok(rows)
}

/// A row derived from the owner command `message`: its actor and role, the command
/// as parent, in its thread.
fn derived_row(message: &Interaction, verb: Verb, body: serde_json::Value) -> NewInteraction {
    let mut row = NewInteraction::new(
        message.room.clone(),
        verb,
        message.actor.clone(),
        message.role,
        body,
    )
    .with_parent(message.id);
    row.thread = message.thread.clone();
    row
}

/// `n` as a reader sees it at `position`, for folding rows before they are in a
/// ledger (time unknown: zero).
fn read_back(n: &NewInteraction, position: crate::model::Position) -> Interaction {
    let at = crate::model::Timestamp(0);
    Interaction::as_read(n.clone(), n.id(), position, at, "", None)
}

/// The rows an accepted owner command produces besides its reply: one `task.created`
/// per task of a `!delegate` (with its annotations, and the room's effective
/// `max-attempts` unless the line says `[attempts N]`), one
/// `config.set` for a `!config` change; each has the command as parent. Their
/// content is deterministic, so every relay appends the same rows and the config fold
/// authorizes exactly these ids.
pub fn derived_rows(
    message: &Interaction,
    command: &OwnerCommand,
    config: &ConfigFold,
) -> Vec<NewInteraction> {
    let thread = message.thread.as_deref();
    match command {
        OwnerCommand::Delegate(plan) => {
            let effective = config.effective(&message.room, thread);
            let max_attempts = effective.max_attempts;
            let review_rounds = effective.review_rounds;
            plan.tasks
                .iter()
                .map(|t| {
                    let body = TaskCreatedBody {
                        task: t.id.clone(),
                        label: t.label.clone(),
                        deps: t.deps.clone(),
                        assignee: t.assignee.clone(),
                        needs: t.needs.clone(),
                        max_attempts: Some(t.attempts.unwrap_or(max_attempts)),
                        priority: t.priority,
                        size: t.size,
                        // Only when dependants lengthen it: a lone task's path is its
                        // size, and its row stays what it was before paths existed.
                        path: (t.path > u64::from(t.size.unwrap_or(1))).then_some(t.path),
                        due_ms: t.due_ms,
                        uses: t
                            .uses
                            .iter()
                            .map(|w| TaskUse {
                                name: w.name.to_string(),
                                mode: w.mode.as_text(),
                            })
                            .collect(),
                        review: t.review.as_ref().map(|r| TaskReview {
                            agent: r.agent.clone(),
                            rounds: r.rounds.unwrap_or(review_rounds),
                        }),
                        undo: t.undo.clone(),
                    };
                    // The command's role: owner, or agent for a delegator's
                    // `!delegate` ([`delegate_rows`]).
                    derived_row(message, Verb::TaskCreated, body.to_body())
                })
                .collect()
        }
        OwnerCommand::Config(ConfigCommand::Change(change)) => {
            vec![change.to_interaction(&message.room, thread, &message.actor, message.id)]
        }
        // The signed command is the answer itself; nothing is derived.
        OwnerCommand::Config(_)
        | OwnerCommand::Approval(_)
        | OwnerCommand::Stop(_)
        | OwnerCommand::Watch(_) => Vec::new(),
        OwnerCommand::Retry(r) => {
            let attempts = config.effective(&message.room, thread).max_attempts;
            r.tasks
                .iter()
                .map(|t| {
                    let body = TaskRetriedBody {
                        task: t.clone(),
                        attempts,
                    };
                    derived_row(message, Verb::TaskRetried, body.to_body())
                })
                .collect()
        }
        OwnerCommand::Cancel(c) => c
            .tasks
            .iter()
            .map(|t| {
                let body = TaskCancelledBody {
                    task: t.clone(),
                    dependants: c.dependants,
                };
                derived_row(message, Verb::TaskCancelled, body.to_body())
            })
            .collect(),
    }
}
