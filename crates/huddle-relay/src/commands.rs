//! Owner commands as the relay executes them, and the room config they change.
//!
//! Every relay folds the ledger and turns each owner `!delegate` / `!config` into the
//! same interactions: `task.created` rows, a `config.set` row and a reply message,
//! each with the command message as parent. Their content is deterministic, so when
//! several relays append them the ledger keeps one copy (identical content is the same
//! interaction). Only the room owner's messages are parsed; agent text never is.

use std::collections::{BTreeMap, BTreeSet};

use huddle_core::commands::{get_reply, help_text, ConfigCommand, ParseContext};
use huddle_core::config::RoomConfig;
use huddle_core::tasks::TaskCreatedBody;
use huddle_core::{
    owner_command_in, ConfigFold, Fold, Interaction, NewInteraction, OwnerCommand, Role, Verb,
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
    config: ConfigFold,
    tasks: BTreeMap<String, BTreeSet<String>>,
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
            config: ConfigFold::new(),
            tasks: BTreeMap::new(),
        }
    }

    /// The config fold.
    pub fn config(&self) -> &ConfigFold {
        &self.config
    }

    /// Folds `rows` (in ledger order): splits them around config changes and
    /// executes owner commands.
    pub fn observe(&mut self, rows: Vec<Interaction>) -> Observed {
        let mut out = Observed::default();
        let mut pending: Vec<Interaction> = Vec::new();
        for row in rows {
            self.config.apply(&row);
            if row.verb == Verb::TaskCreated {
                if let Some(task) = row.body.get("task").and_then(|t| t.as_str()) {
                    self.tasks
                        .entry(row.room.clone())
                        .or_default()
                        .insert(task.to_string());
                }
            }
            let hosted = self.rooms.contains(&row.room);
            if hosted && row.verb == Verb::ConfigSet {
                let room = row.room.clone();
                let thread = row.thread.clone();
                pending.push(row);
                out.steps.push(Step::Rows(std::mem::take(&mut pending)));
                out.steps.push(Step::Config {
                    config: self.config.effective(&room, None),
                    room: room.clone(),
                    thread: None,
                });
                if let Some(t) = thread {
                    out.steps.push(Step::Config {
                        config: self.config.effective(&room, Some(&t)),
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
        let existing = self.tasks.get(&row.room);
        let task_exists = |id: &str| existing.is_some_and(|s| s.contains(id));
        let ctx = ParseContext {
            task_exists: &task_exists,
        };
        let Some(parsed) = owner_command_in(row, &self.config, &ctx) else {
            return Vec::new();
        };
        let thread = row.thread.as_deref();
        let mut out = Vec::new();
        let reply = match parsed {
            Err(e) => e.to_string(),
            Ok(OwnerCommand::Delegate(plan)) => {
                let max_attempts = self.config.effective(&row.room, thread).max_attempts;
                for t in &plan.tasks {
                    let body = TaskCreatedBody {
                        task: t.id.clone(),
                        label: t.label.clone(),
                        deps: t.deps.clone(),
                        assignee: t.assignee.clone(),
                        needs: Vec::new(),
                        max_attempts: Some(max_attempts),
                    };
                    let body = serde_json::to_value(&body).unwrap_or_else(|_| json!({}));
                    let mut created = NewInteraction::new(
                        row.room.clone(),
                        Verb::TaskCreated,
                        row.actor.clone(),
                        Role::Owner,
                        body,
                    )
                    .with_parent(row.id);
                    created.thread = row.thread.clone();
                    out.push(created);
                }
                plan.summary()
            }
            Ok(OwnerCommand::Config(ConfigCommand::Help { key })) => help_text(key),
            Ok(OwnerCommand::Config(ConfigCommand::Get { target, key })) => {
                get_reply(&self.config, &row.room, thread, target, key)
            }
            Ok(OwnerCommand::Config(ConfigCommand::Change(change))) => {
                out.push(change.to_interaction(&row.room, thread, &row.actor, row.id));
                change.reply_text(thread)
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
