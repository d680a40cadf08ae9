//! # huddle-relay
//!
//! The runtime that hosts agents: an event loop that feeds ledger batches, ticks and
//! turn endings to the pure decisions of `huddle-core`, and an executor that performs
//! the resulting intents against a store. Drivers run the agent turns.
#![warn(missing_docs)]

mod batch;
pub mod commands;
pub mod config;
pub mod driver;
pub mod identity;
mod lots;
pub mod metrics;
pub mod runtime;
pub mod snapshot;

pub use metrics::RelayMetrics;
pub use runtime::{HostedAgent, Relay, RelayError, RelayOptions, RelaySummary};
