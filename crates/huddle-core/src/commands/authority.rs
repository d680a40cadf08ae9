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
//! - a `!delegate` posted by an agent (role `agent`) counts like the owner's when the
//!   agent is one of the effective `delegators` of the room (or thread) at that
//!   point of the ledger; its `task.created` rows (actor = the agent, role `agent`)
//!   are authorized the same way. Other agents' ones are counted in
//!   [`OwnerAuthority::undelegated_commands`];
//! - a verified `!approve ID` / `!deny ID` answers the room's pending approval
//!   request `ID` ([`OwnerAuthority::approvals`]; `approval.requested` rows open
//!   them); the first answer stands;
//! - first of all, the row's writer must be proven where the room asks for it (the
//!   room-wide keys `relay-keys` and `require-signatures`,
//!   [`crate::config::binding::writer_proof`]): a row whose writer (`relay`) has
//!   registered keys counts only when signed by one of them (else it is counted in
//!   [`OwnerAuthority::forged_writer_rows`]); in a room that requires signatures a row
//!   not signed by a registered key of its writer is counted in
//!   [`OwnerAuthority::unsigned_rows`]. Neither is applied to any fold nor admitted.
//!   Exempt, whoever stored them: rows that carry a valid owner signature by the
//!   owner (owner commands, key rotations, signed owner messages), and the
//!   `task.created` / `config.set` rows authorized below (their content is fixed by
//!   an admitted command);
//! - a row written as an agent the room owner bound to writers (the room-wide
//!   `agents` key, [`crate::config::binding`]) by a writer it is not bound to — actor
//!   = the agent, role `agent`, `relay` not among its writers in the room's config at
//!   that point of the ledger — is not applied to any fold nor admitted, and is
//!   counted in [`OwnerAuthority::misbound_rows`];
//! - a `task.created` or `config.set` is admitted ([`OwnerAuthority::admits`]) only
//!   when it is one of those rows. Hand-written ones, whatever their `actor` and
//!   `role`, are not: a forged `task.created` is counted in
//!   [`OwnerAuthority::unauthorized_rows`], a forged `config.set` in the config
//!   fold's `ignored_rows`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{
    command_word, derived_rows, owner_command_with, parse_delegate_with, CommandWord, OwnerCommand,
    ParseContext,
};
use crate::approval::{ApprovalAnswer, Approvals};
use crate::config::binding::{misbound, writer_proof, WriterProof};
use crate::config::{ConfigFold, ConfigKey, ConfigValue};
use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, Role};
use crate::verbs::Verb;

/// Owners, keys, verified commands and the rows they authorize; see the module
/// documentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct OwnerAuthority {
    config: ConfigFold,
    /// Ids of the rows verified owner commands produce.
    authorized: BTreeSet<InteractionId>,
    /// Task ids of each room's admitted `task.created` rows.
    tasks: BTreeMap<String, BTreeSet<String>>,
    unsigned: u64,
    unauthorized: u64,
    /// Agents' `!delegate` messages from non-delegators.
    undelegated: u64,
    /// Approval requests and the owner's verified answers.
    approvals: Approvals,
    /// Rows written as a bound agent by a writer it is not bound to.
    misbound: u64,
    /// Rows not signed by a registered writer key in a room that requires it.
    unsigned_rows: u64,
    /// Rows naming a writer with registered keys, not signed by one of them.
    forged_writer: u64,
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

    /// Whether the other folds may see `row`: not when it is written as a bound
    /// agent by a writer the agent is not bound to; a `task.created` or `config.set`
    /// only when a verified owner command produced exactly it; every other row is
    /// admitted (its own fold judges it).
    pub fn admits(&self, row: &Interaction) -> bool {
        if self.writer_refusal(row).is_some() || self.misbound(row) {
            return false;
        }
        match row.verb {
            Verb::TaskCreated | Verb::ConfigSet | Verb::TaskRetried | Verb::TaskCancelled => {
                self.authorized.contains(&row.id)
            }
            _ => true,
        }
    }

    /// Approval requests and the owner's verified answers ([`crate::approval`]).
    pub fn approvals(&self) -> &Approvals {
        &self.approvals
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

    /// How many rows written as a bound agent (actor = the agent, role `agent`) by a
    /// writer the agent is not bound to were ignored.
    pub fn misbound_rows(&self) -> u64 {
        self.misbound
    }

    /// How many rows were ignored because the room requires signatures and they are
    /// not signed by a key registered for their writer (nor signed by the owner, nor
    /// derived from an admitted command).
    pub fn unsigned_rows(&self) -> u64 {
        self.unsigned_rows
    }

    /// How many rows were ignored because their writer (`relay`) has registered keys
    /// in the room and they are not signed by one of them: rows stored under a
    /// signing writer's name by someone else.
    pub fn forged_writer_rows(&self) -> u64 {
        self.forged_writer
    }

    /// Whether `row` is written as a bound agent by a writer it is not bound to, by
    /// the room's `agents` now.
    fn misbound(&self, row: &Interaction) -> bool {
        if row.role != Role::Agent {
            return false;
        }
        match self.config.room_setting(&row.room, ConfigKey::Agents) {
            Some(ConfigValue::Bindings(list)) => misbound(list, row),
            _ => false,
        }
    }

    /// Why `row` does not count by the room's `relay-keys` and `require-signatures`
    /// now, if it does not: its writer is not proven and it is not exempt (see the
    /// module documentation).
    fn writer_refusal(&self, row: &Interaction) -> Option<WriterProof> {
        let keys = match self.config.room_setting(&row.room, ConfigKey::RelayKeys) {
            Some(ConfigValue::WriterKeys(keys)) => keys.as_slice(),
            _ => &[],
        };
        let required = matches!(
            self.config
                .room_setting(&row.room, ConfigKey::RequireSignatures),
            Some(ConfigValue::Flag(true))
        );
        if keys.is_empty() && !required {
            return None;
        }
        let proof = writer_proof(keys, required, &row.relay, row.signer.as_ref());
        (!proof.passes() && !self.exempt(row)).then_some(proof)
    }

    /// Rows that count whoever stored them: those a valid owner signature covers, and
    /// the `task.created` / `config.set` rows an admitted command derived.
    fn exempt(&self, row: &Interaction) -> bool {
        let derived = matches!(
            row.verb,
            Verb::TaskCreated | Verb::ConfigSet | Verb::TaskRetried | Verb::TaskCancelled
        ) && self.authorized.contains(&row.id);
        derived || (row.role == Role::Owner && self.config.signed_by_owner(row))
    }

    fn message(&mut self, i: &Interaction) {
        let Some(text) = i.body.get("text").and_then(|t| t.as_str()) else {
            return;
        };
        let Some(word) = command_word(text) else {
            return;
        };
        if i.role == Role::Agent && word == CommandWord::Delegate {
            return self.agent_delegate(i, text);
        }
        if !self.config.is_owner(&i.room, &i.actor, i.role) {
            return;
        }
        if !self.config.signed_by_owner(i) {
            self.unsigned += 1;
            return;
        }
        let task_exists = |id: &str| self.task_exists(&i.room, id);
        let approval = |id: &str| self.approvals.status(&i.room, id);
        let ctx = ParseContext {
            task_exists: &task_exists,
            approval: &approval,
            thread: i.thread.as_deref(),
        };
        let Some(Ok(command)) = owner_command_with(i.role, text, &ctx) else {
            return; // a rejected command produces only a reply
        };
        if let OwnerCommand::Approval(a) = &command {
            let answer = ApprovalAnswer {
                status: a.verdict,
                by: i.actor.clone(),
                reason: a.reason.clone(),
                at: i.at,
                message: i.id,
            };
            self.approvals.answer(&i.room, &a.id, answer);
            return;
        }
        let ids: Vec<InteractionId> = derived_rows(i, &command, &self.config)
            .iter()
            .map(|r| r.id())
            .collect();
        self.authorized.extend(ids);
    }

    /// A `!delegate` posted by an agent: it counts when the agent is one of the
    /// effective `delegators` where it posted, at this point of the ledger; its tasks
    /// are then authorized exactly like an owner's.
    fn agent_delegate(&mut self, i: &Interaction, text: &str) {
        let thread = i.thread.as_deref();
        if !self
            .config
            .effective(&i.room, thread)
            .may_delegate(&i.actor)
        {
            self.undelegated += 1;
            return;
        }
        let task_exists = |id: &str| self.task_exists(&i.room, id);
        let Ok(plan) = parse_delegate_with(text, &task_exists) else {
            return;
        };
        let ids: Vec<InteractionId> = derived_rows(i, &OwnerCommand::Delegate(plan), &self.config)
            .iter()
            .map(|r| r.id())
            .collect();
        self.authorized.extend(ids);
    }

    /// How many `!delegate` messages of agents were not executed because the agent
    /// is not one of the room's `delegators` there and then.
    pub fn undelegated_commands(&self) -> u64 {
        self.undelegated
    }

    fn task_created(&mut self, i: &Interaction) {
        if !self.authorized.contains(&i.id) {
            self.unauthorized += 1;
            return;
        }
        if let Some(task) = i.body.get("task").and_then(|t| t.as_str()) {
            let known = self.tasks.entry(i.room.clone()).or_default();
            known.insert(task.to_string());
            // Its compensation (`[undo ...]`) is a task the owner may retry or cancel.
            if i.body.get("undo").is_some_and(|u| u.is_string()) {
                known.insert(crate::protocol::task::undo_id(task));
            }
        }
    }
}

impl Fold for OwnerAuthority {
    fn apply(&mut self, row: &Interaction) {
        match self.writer_refusal(row) {
            Some(WriterProof::ForgedWriter) => {
                self.forged_writer += 1;
                return;
            }
            Some(_) => {
                self.unsigned_rows += 1;
                return;
            }
            None => {}
        }
        if self.misbound(row) {
            self.misbound += 1;
            return;
        }
        match row.verb {
            Verb::MessagePosted => self.message(row),
            Verb::TaskCreated => self.task_created(row),
            Verb::ApprovalRequested => self.approvals.request(row),
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
