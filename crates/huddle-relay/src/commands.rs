//! Owner commands as the relay executes them, and the room config they change.
//!
//! Every relay folds the ledger and turns each owner `!delegate` / `!config` into the
//! same interactions: `task.created` rows, a `config.set` row and a reply message,
//! each with the command message as parent. Their content is deterministic, so when
//! several relays append them the ledger keeps one copy (identical content is the same
//! interaction); one relay writes them, elected by the command's result claim (plan
//! 0090, in the runtime). Only the room owner's messages signed by the room's owner key are
//! executed; agent text never is. `task.created` and `config.set` rows that no
//! verified command produced (forged, hand-written) are dropped here, before any
//! other fold sees them, and counted ([`OwnerAuthority`]).
//!
//! A command from anyone else is not executed; its author gets a short system reply
//! saying who may command, at most once per author and room per
//! [`NON_OWNER_REPLY_WINDOW`]. That reply too is a derived row with the command as
//! parent, and the window is measured with the rows' own timestamps in ledger order,
//! so every relay decides alike and the ledger keeps one copy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use huddle_core::commands::{
    command_word, derived_rows, get_reply, help_text, ConfigCommand, ParseContext,
};
use huddle_core::config::RoomConfig;
use huddle_core::{
    owner_command_in, ConfigFold, Fold, Interaction, NewInteraction, OwnerAuthority, OwnerCommand,
    Role, Timestamp, Verb,
};
use serde_json::json;

/// The actor name huddle's own messages are written under.
pub const SYSTEM_ACTOR: &str = "huddle";

/// A person who is not the room's owner and posts `!delegate` / `!config` is told who
/// may command at most once per this window (per room), measured between the
/// commands' own timestamps.
pub const NON_OWNER_REPLY_WINDOW: Duration = Duration::from_secs(10 * 60);

/// One step of what a batch of rows means for the relay, in ledger order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Rows to feed to the synchronizer.
    Rows(Vec<Interaction>),
    /// The owner's `!stop` (signed, verified): cancel the matching running turns.
    Stop {
        /// Room.
        room: String,
        /// The command message.
        command: huddle_core::InteractionId,
        /// Whose turns, in which thread.
        stop: huddle_core::commands::StopCommand,
    },
    /// The owner's `!watch` / `!unwatch` (signed, verified).
    Watch {
        /// Room.
        room: String,
        /// Who follows which thread.
        watch: huddle_core::commands::WatchCommand,
    },
    /// The effective config of a room (`thread: None`) or thread changed.
    Config {
        /// Room.
        room: String,
        /// Thread.
        thread: Option<String>,
        /// The new effective config.
        config: RoomConfig,
    },
}

/// Folds room config and executes owner commands.
pub struct CommandHandler {
    rooms: BTreeSet<String>,
    authority: OwnerAuthority,
    /// When each `(room, author)` who is not the owner was last told who may command.
    told: BTreeMap<(String, String), Timestamp>,
}

/// What [`CommandHandler::observe`] found in a batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Rows and config changes, in ledger order.
    pub steps: Vec<Step>,
    /// Interactions to append: the results of owner commands.
    pub appends: Vec<NewInteraction>,
}

impl CommandHandler {
    /// A handler for the relay's rooms.
    pub fn new(rooms: impl IntoIterator<Item = String>) -> Self {
        CommandHandler {
            rooms: rooms.into_iter().collect(),
            authority: OwnerAuthority::new(),
            told: BTreeMap::new(),
        }
    }

    /// The owner-command authority's state, encoded (plan 0063).
    pub fn save_state(&self) -> Vec<u8> {
        huddle_core::sync::to_cbor(&self.authority)
    }

    /// Restores what [`CommandHandler::save_state`] returned.
    pub fn restore_state(&mut self, bytes: &[u8]) -> Result<(), huddle_core::sync::StateError> {
        self.authority = huddle_core::sync::from_cbor(bytes)?;
        Ok(())
    }

    /// The config fold.
    pub fn config(&self) -> &ConfigFold {
        self.authority.config()
    }

    /// The owner authority, with its counts of ignored rows.
    pub fn authority(&self) -> &OwnerAuthority {
        &self.authority
    }

    /// Folds `rows` (in ledger order): splits them around config changes and
    /// executes owner commands.
    pub fn observe(&mut self, rows: Vec<Interaction>) -> Observed {
        let mut out = Observed::default();
        let mut pending: Vec<Interaction> = Vec::new();
        for row in rows {
            self.authority.apply(&row);
            if !self.authority.admits(&row) {
                tracing::info!(
                    room = %row.room,
                    id = %row.id.short(),
                    verb = %row.verb,
                    actor = %row.actor,
                    "ignoring a row the owner authority does not admit (unsigned, unauthorized or misbound)"
                );
                continue;
            }
            let hosted = self.rooms.contains(&row.room);
            if hosted && row.verb == Verb::ConfigSet {
                let room = row.room.clone();
                let thread = row.thread.clone();
                pending.push(row);
                out.steps.push(Step::Rows(std::mem::take(&mut pending)));
                out.steps.push(Step::Config {
                    config: self.config().effective(&room, None),
                    room: room.clone(),
                    thread: None,
                });
                if let Some(t) = thread {
                    out.steps.push(Step::Config {
                        config: self.config().effective(&room, Some(&t)),
                        room,
                        thread: Some(t),
                    });
                }
                continue;
            }
            if hosted {
                out.appends.extend(self.refuse_non_owner(&row));
                let (appends, step) = self.execute(&row);
                out.appends.extend(appends);
                if let Some(step) = step {
                    pending.push(row);
                    out.steps.push(Step::Rows(std::mem::take(&mut pending)));
                    out.steps.push(step);
                    continue;
                }
            }
            pending.push(row);
        }
        if !pending.is_empty() {
            out.steps.push(Step::Rows(pending));
        }
        out
    }

    /// The reply to a command by someone who may not command, when `row` is one and
    /// its author was not told within [`NON_OWNER_REPLY_WINDOW`] before it.
    fn refuse_non_owner(&mut self, row: &Interaction) -> Option<NewInteraction> {
        if row.verb != Verb::MessagePosted || matches!(row.role, Role::System | Role::Agent) {
            return None;
        }
        let text = row.body.get("text")?.as_str()?;
        command_word(text)?;
        let word = text.split_whitespace().next()?;
        let owner = self.config().owner(&row.room)?.to_string();
        if owner == row.actor {
            return None;
        }
        let key = (row.room.clone(), row.actor.clone());
        let window = i64::try_from(NON_OWNER_REPLY_WINDOW.as_micros()).unwrap_or(i64::MAX);
        if let Some(last) = self.told.get(&key) {
            if row.at.as_micros().saturating_sub(last.as_micros()) < window {
                return None;
            }
        }
        self.told.insert(key, row.at);
        let text = format!(
            "{} was not run: only the room's owner, {owner}, may command room {} (with \
             `huddle post --as {owner}` and the owner's key). Further commands from {} are \
             not answered for {} minutes.",
            word,
            row.room,
            row.actor,
            NON_OWNER_REPLY_WINDOW.as_secs() / 60
        );
        Some(system_reply(row, text))
    }

    /// The interactions an owner command in `row` produces (empty when it is none),
    /// and what the synchronizer must do for a `!stop` or `!watch`.
    fn execute(&self, row: &Interaction) -> (Vec<NewInteraction>, Option<Step>) {
        let task_exists = |id: &str| self.authority.task_exists(&row.room, id);
        let approval = |id: &str| {
            self.authority
                .approvals()
                .status_before(&row.room, id, row.id)
        };
        let ctx = ParseContext {
            task_exists: &task_exists,
            approval: &approval,
            thread: row.thread.as_deref(),
        };
        let Some(parsed) = owner_command_in(row, self.config(), &ctx) else {
            return (Vec::new(), None);
        };
        let step = match &parsed {
            Ok(OwnerCommand::Stop(stop)) => Some(Step::Stop {
                room: row.room.clone(),
                command: row.id,
                stop: stop.clone(),
            }),
            Ok(OwnerCommand::Watch(watch)) => Some(Step::Watch {
                room: row.room.clone(),
                watch: watch.clone(),
            }),
            _ => None,
        };
        let thread = row.thread.as_deref();
        let (mut out, reply) = match &parsed {
            Err(e) => (Vec::new(), e.to_string()),
            Ok(command) => {
                let reply = match command {
                    OwnerCommand::Delegate(plan) => plan.summary(),
                    OwnerCommand::Config(ConfigCommand::Help { key }) => help_text(*key),
                    OwnerCommand::Config(ConfigCommand::Get { target, key }) => {
                        get_reply(self.config(), &row.room, thread, *target, *key)
                    }
                    OwnerCommand::Config(ConfigCommand::Change(change)) => {
                        change.reply_text(thread)
                    }
                    OwnerCommand::Approval(answer) => answer.reply_text(),
                    OwnerCommand::Stop(stop) => stop.reply_text(&row.room),
                    OwnerCommand::Watch(watch) => watch.reply_text(),
                    OwnerCommand::Retry(retry) => {
                        retry.reply_text(self.config().effective(&row.room, thread).max_attempts)
                    }
                    OwnerCommand::Cancel(cancel) => cancel.reply_text(),
                };
                (derived_rows(row, command, self.config()), reply)
            }
        };
        out.push(system_reply(row, reply));
        (out, step)
    }
}

/// huddle's reply to `row`: a system message with `row` as parent, in its thread.
fn system_reply(row: &Interaction, text: String) -> NewInteraction {
    let mut message = NewInteraction::new(
        row.room.clone(),
        Verb::MessagePosted,
        SYSTEM_ACTOR,
        Role::System,
        json!({ "text": text }),
    )
    .with_parent(row.id);
    message.thread = row.thread.clone();
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::signing::OwnerSecret;
    use huddle_core::Position;

    fn at(n: NewInteraction, pos: u64, micros: i64) -> Interaction {
        let id = n.id();
        Interaction::as_read(n, id, Position::new(0, pos), Timestamp(micros), "r", None)
    }

    fn said(actor: &str, role: Role, text: &str) -> NewInteraction {
        NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            actor,
            role,
            json!({ "text": text }),
        )
    }

    fn replies(handler: &mut CommandHandler, row: Interaction) -> Vec<String> {
        handler
            .observe(vec![row])
            .appends
            .iter()
            .filter_map(|a| {
                a.body
                    .get("text")
                    .and_then(|t| t.as_str())
                    .map(String::from)
            })
            .collect()
    }

    #[test]
    fn a_non_owner_is_told_who_may_command_once_per_window() {
        let key = OwnerSecret::from_seed([7; 32]).public();
        let created = NewInteraction::new(
            "lobby",
            Verb::RoomCreated,
            "olga",
            Role::Owner,
            json!({ "owner": "olga", "key": key.to_hex() }),
        );
        let mut h = CommandHandler::new(["lobby".to_string()]);
        assert!(replies(&mut h, at(created, 1, 0)).is_empty());
        let minute = 60_000_000;
        let first = replies(
            &mut h,
            at(said("hank", Role::Human, "!config rate 5"), 2, minute),
        );
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(
            first[0].contains("only the room's owner, olga"),
            "{first:?}"
        );
        assert!(first[0].starts_with("!config was not run"), "{first:?}");
        // Within the window: silence, for any command; another person is told.
        let again = at(said("hank", Role::Human, "!delegate\na: x"), 3, 5 * minute);
        assert!(replies(&mut h, again).is_empty());
        let other = at(said("ivy", Role::Human, "!delegate\na: x"), 4, 6 * minute);
        assert_eq!(replies(&mut h, other).len(), 1);
        // Not commands, agents and the owner's own (unsigned) text get nothing.
        for (who, role, text) in [
            ("hank2", Role::Human, "hello !config"),
            ("ada", Role::Agent, "!config rate 5"),
            ("olga", Role::Owner, "!config rate 5"),
        ] {
            assert!(replies(&mut h, at(said(who, role, text), 5, 7 * minute)).is_empty());
        }
        // After the window, hank is told again.
        let later = at(said("hank", Role::Human, "!config get"), 6, 11 * minute);
        assert_eq!(replies(&mut h, later).len(), 1);
    }
}
