//! # huddle-core
//!
//! The pure heart of huddle: the interaction model and its canonical encoding, the
//! wire vocabulary, the folds, policies, owner-command parsers and synchronization
//! decisions. Nothing here does I/O, spawns tasks or reads a clock: time and identity
//! are passed in, so every decision is tested without a database.
//!
//! The modules form layers; each imports only from the layers before it:
//!
//! 1. the record: [`error`], [`limits`], [`id`], [`keys`] (Ed25519 keys, writers' row
//!    signatures), [`canonical`], [`verbs`], [`model`], [`fold`], [`signing`];
//! 2. the wire vocabulary: [`protocol`] (bodies, claim keys and epochs, names);
//! 3. the folds: [`config`], [`tasks`], [`approval`], [`lease`], [`budget`], [`context`],
//!    shared [`resources`] (names, the conflict rule, path [`glob`]s) and versioned
//!    [`shared_state`], the
//!    coordination patterns [`decision`] and [`barrier`] (on the shared [`pattern`]),
//!    then [`board`] (which shows the task summary) and [`guards`] (which read the
//!    config); [`thread`] (the `<thread>` block's window);
//! 4. the decisions on top of them: [`policy`], [`commands`];
//! 5. the relay's state machine: [`sync`];
//! 6. views that read messages as relays do: [`relays`] (relay presence and the named
//!    agents a room waits for).
//!
//! ```
//! use huddle_core::{NewInteraction, Role, Verb};
//! let a = NewInteraction::new("lobby", Verb::MessagePosted, "ana", Role::Human,
//!     serde_json::json!({"text": "hello"}));
//! let b = a.clone();
//! assert_eq!(a.id(), b.id()); // identical content is the same interaction
//! ```
#![warn(missing_docs)]

pub mod approval;
pub mod archive;
pub mod barrier;
pub mod board;
pub mod budget;
pub mod canonical;
pub mod commands;
pub mod config;
pub mod context;
pub mod decision;
pub mod error;
pub mod fold;
pub mod glob;
pub mod guards;
pub mod id;
pub mod keys;
pub mod lease;
pub mod limits;
pub mod model;
pub mod pacing;
pub mod pattern;
pub mod policy;
pub mod protocol;
pub mod relays;
pub mod resources;
#[cfg(test)]
mod robustness;
pub mod shared_state;
pub mod signing;
pub mod sync;
pub mod tasks;
#[cfg(test)]
mod testing;
pub mod thread;
pub mod verbs;

pub use barrier::{BarrierFold, BarrierRules, BarrierStatus};
pub use budget::{BudgetFold, BudgetStatus};
pub use commands::{
    command_rows, owner_command, owner_command_in, seed_room, CommandError, OwnerAuthority,
    OwnerCommand,
};
pub use config::ConfigFold;
pub use context::{render_related_context, select_related, ContextRules, RelatedContext};
pub use decision::{DecisionFold, DecisionRules, DecisionStatus};
pub use error::ModelError;
pub use fold::{hash_state, Fold};
pub use guards::{GuardFold, Verdict};
pub use lease::{DirectiveCheck, LeaseFold, LeaseRules, LeaseStatus};
pub use limits::Limits;
pub use model::{
    validate_name, Interaction, InteractionId, NewInteraction, Position, RawRow, Role, Timestamp,
};
pub use verbs::Verb;

pub use board::{Board, CoordinationBlock, CoordinationDelivery, PatternLines};
pub use protocol::{ClaimEpoch, ClaimRef};
pub use sync::{Event, Intent, LocalAgent, Synchronizer};
pub use tasks::{Task, TaskDag, TaskStatus};
