//! Owner commands as the relay executes them, and the room config they change.
//!
//! Every relay folds the ledger and turns each owner `!delegate` / `!config` into the
//! same interactions: `task.created` rows, a `config.set` row and a reply message,
//! each with the command message as parent. Their content is deterministic, so when
//! several relays append them the ledger keeps one copy (identical content is the same
//! interaction). Only the room owner's messages signed by the room's owner key are
//! executed; agent text never is. `task.created` and `config.set` rows that no
//! verified command produced (forged, hand-written) are dropped here, before any
//! other fold sees them, and counted ([`OwnerAuthority`]).

use std::collections::BTreeSet;

use huddle_core::commands::{derived_rows, get_reply, help_text, ConfigCommand, ParseContext};
use huddle_core::config::RoomConfig;
use huddle_core::{
    owner_command_in, ConfigFold, Fold, Interaction, NewInteraction, OwnerAuthority, OwnerCommand,
    Role, Verb,
};
use serde_json::json;

/// The actor name huddle's own messages are written under.
pub const SYSTEM_ACTOR: &str = "huddle";

/// One step of what a batch of rows means for the relay, in ledger order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Rows to feed to the synchronizer.
    Rows(Vec<Interaction>),
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
        }
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
                out.appends.extend(self.execute(&row));
            }
            pending.push(row);
        }
        if !pending.is_empty() {
            out.steps.push(Step::Rows(pending));
        }
        out
    }

    /// The interactions an owner command in `row` produces (empty when it is none).
    fn execute(&self, row: &Interaction) -> Vec<NewInteraction> {
        let task_exists = |id: &str| self.authority.task_exists(&row.room, id);
        let approval = |id: &str| {
            self.authority
                .approvals()
                .status_before(&row.room, id, row.id)
        };
        let ctx = ParseContext {
            task_exists: &task_exists,
            approval: &approval,
        };
        let Some(parsed) = owner_command_in(row, self.config(), &ctx) else {
            return Vec::new();
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
                };
                (derived_rows(row, command, self.config()), reply)
            }
        };
        let mut message = NewInteraction::new(
            row.room.clone(),
            Verb::MessagePosted,
            SYSTEM_ACTOR,
            Role::System,
            json!({ "text": reply }),
        )
        .with_parent(row.id);
        message.thread = row.thread.clone();
        out.push(message);
        out
    }
}
