//! What can go wrong while running a scenario.

use std::time::Duration;

use huddle_store::StoreError;

/// An error of a scenario run. Store errors keep their cause as the source.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The options cannot describe a run (no agents, no tasks, ...).
    #[error("{0}")]
    Invalid(String),
    /// A store handle could not be opened.
    #[error("cannot open the database {db:?}")]
    Open {
        /// The database URL.
        db: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// A step of the run failed in the store.
    #[error("{what}")]
    Step {
        /// What the run was doing.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: StoreError,
    },
    /// Any other store error.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger did not hold what the run had just appended.
    #[error("{0}")]
    Ledger(&'static str),
    /// Not every agent registered in time.
    #[error("only {registered} of {expected} agents registered within {limit:?}")]
    NotRegistered {
        /// Agents that registered.
        registered: usize,
        /// Agents started.
        expected: usize,
        /// How long the run waited.
        limit: Duration,
    },
    /// The system gave no randomness for the owner's key.
    #[error("cannot generate the owner's key: {0}")]
    Randomness(String),
    /// No relay answered an owner command.
    #[error("no relay answered the owner command within {0:?}: are the relays running?")]
    NoAnswer(Duration),
    /// The relays answered an owner command with a refusal.
    #[error("the owner command was refused: {0}")]
    Refused(String),
}

/// The result of a scenario step.
pub type Result<T, E = SimError> = std::result::Result<T, E>;
