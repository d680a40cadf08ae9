//! The owner's authority: which rows speak for the room owner.
//!
//! [`OwnerAuthority`] is the fold every reader that acts on owner rows goes through
//! (the relay, `huddle tasks`, the end-to-end harness). It wraps the
//! [`ConfigFold`] (owners, owner keys, overlays) and decides what the other folds may
//! see:
//!
//! - an owner command (a `message.posted` by the owner whose text starts with a
//!   command word) counts only when it is signed by the room's current owner key;
//!   other ones are counted in [`OwnerAuthority::unsigned_commands`];
//! - for each verified command it derives the rows every relay appends for it
//!   ([`derived_rows`]) and authorizes exactly those ids;
//! - a `task.created` or `config.set` is admitted ([`OwnerAuthority::admits`]) only
//!   when it is one of those rows. Hand-written ones, whatever their `actor` and
//!   `role`, are not: a forged `task.created` is counted in
//!   [`OwnerAuthority::unauthorized_rows`], a forged `config.set` in the config
//!   fold's `ignored_rows`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{command_word, derived_rows, owner_command_with, ParseContext};
use crate::config::ConfigFold;
use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId};
use crate::verbs::Verb;

/// Owners, keys, verified commands and the rows they authorize; see the module
/// documentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OwnerAuthority {
    config: ConfigFold,
    /// Ids of the rows verified owner commands produce.
    authorized: BTreeSet<InteractionId>,
    /// Task ids of each room's admitted `task.created` rows.
    tasks: BTreeMap<String, BTreeSet<String>>,
    unsigned: u64,
    unauthorized: u64,
}

impl OwnerAuthority {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// The config fold, fed only admitted rows.
    pub fn config(&self) -> &ConfigFold {
        &self.config
    }

    /// Whether the other folds may see `row`: a `task.created` or `config.set` only
    /// when a verified owner command produced exactly it; every other row is
    /// admitted (its own fold judges it).
    pub fn admits(&self, row: &Interaction) -> bool {
        match row.verb {
            Verb::TaskCreated | Verb::ConfigSet => self.authorized.contains(&row.id),
            _ => true,
        }
    }

    /// Whether a task with this id was created in the room by a verified command.
    pub fn task_exists(&self, room: &str, task: &str) -> bool {
        self.tasks.get(room).is_some_and(|t| t.contains(task))
    }

    /// How many owner command messages were not executed because their signature is
    /// missing or does not verify against the room's owner key.
    pub fn unsigned_commands(&self) -> u64 {
        self.unsigned
    }

    /// How many `task.created` rows no verified owner command produced (forged or
    /// hand-written), ignored.
    pub fn unauthorized_rows(&self) -> u64 {
        self.unauthorized
    }

    fn message(&mut self, i: &Interaction) {
        let Some(text) = i.body.get("text").and_then(|t| t.as_str()) else {
            return;
        };
        if command_word(text).is_none() || !self.config.is_owner(&i.room, &i.actor, i.role) {
            return;
        }
        if !self.config.signed_by_owner(i) {
            self.unsigned += 1;
            return;
        }
        let task_exists = |id: &str| self.task_exists(&i.room, id);
        let ctx = ParseContext {
            task_exists: &task_exists,
        };
        let Some(Ok(command)) = owner_command_with(i.role, text, &ctx) else {
            return; // a rejected command produces only a reply
        };
        let ids: Vec<InteractionId> = derived_rows(i, &command, &self.config)
            .iter()
            .map(|r| r.id())
            .collect();
        self.authorized.extend(ids);
    }

    fn task_created(&mut self, i: &Interaction) {
        if !self.authorized.contains(&i.id) {
            self.unauthorized += 1;
            return;
        }
        if let Some(task) = i.body.get("task").and_then(|t| t.as_str()) {
            self.tasks
                .entry(i.room.clone())
                .or_default()
                .insert(task.to_string());
        }
    }
}

impl Fold for OwnerAuthority {
    fn apply(&mut self, row: &Interaction) {
        match row.verb {
            Verb::MessagePosted => self.message(row),
            Verb::TaskCreated => self.task_created(row),
            _ => {}
        }
        if self.admits(row) {
            self.config.apply(row);
        } else if row.verb == Verb::ConfigSet {
            self.config.count_ignored();
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}
