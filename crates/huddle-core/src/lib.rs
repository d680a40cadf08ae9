//! # huddle-core
//!
//! The pure heart of huddle: the interaction model and its canonical encoding, and
//! (as they land) the folds, policies, owner-command parsers and synchronization
//! decisions. Nothing here does I/O, spawns tasks or reads a clock: time and identity
//! are passed in, so every decision is tested without a database.
//!
//! ```
//! use huddle_core::{NewInteraction, Role, Verb};
//! let a = NewInteraction::new("lobby", Verb::MessagePosted, "ana", Role::Human,
//!     serde_json::json!({"text": "hello"}));
//! let b = a.clone();
//! assert_eq!(a.id(), b.id()); // identical content is the same interaction
//! ```
#![warn(missing_docs)]

pub mod board;
pub mod canonical;
pub mod config;
pub mod error;
pub mod fold;
pub mod limits;
pub mod model;
pub mod policy;
pub mod sync;
pub mod tasks;
pub mod verbs;

pub use error::ModelError;
pub use fold::{hash_state, Fold};
pub use limits::Limits;
pub use model::{
    validate_name, Interaction, InteractionId, NewInteraction, Position, RawRow, Role, Timestamp,
};
pub use verbs::Verb;

pub use board::{Board, CoordinationBlock, CoordinationDelivery};
pub use sync::{ClaimEpoch, ClaimRef, Event, Intent, LocalAgent, Synchronizer};
pub use tasks::{Task, TaskDag, TaskStatus};
