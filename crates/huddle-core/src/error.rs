//! Errors of the model layer.

use thiserror::Error;

/// What can be wrong with an interaction or a stored row.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// An id that is not 32 bytes / 64 hex digits.
    #[error("bad interaction id: {0}")]
    BadId(String),
    /// A verb outside the protocol.
    #[error("unknown verb {0:?} (see docs/protocol.md for the verbs)")]
    UnknownVerb(String),
    /// A role other than owner / human / agent / system.
    #[error("unknown role {0:?} (expected owner, human, agent or system)")]
    BadRole(String),
    /// A body that is not valid JSON.
    #[error("body is not valid JSON: {0}")]
    BadBody(String),
    /// A `task.lot` row whose items are not a list of allowed task-turn rows.
    #[error("bad task.lot: {0}")]
    BadLot(String),
    /// A row whose stored id is not the hash of its content.
    #[error("stored id {stored} does not match the content hash {computed}")]
    IdMismatch {
        /// Stored id, hex.
        stored: String,
        /// Recomputed id, hex.
        computed: String,
    },
    /// A body over the size limit.
    #[error("body is {size} bytes; the limit is {max} bytes")]
    BodyTooLarge {
        /// Canonical size.
        size: usize,
        /// Limit.
        max: usize,
    },
    /// Too many causes.
    #[error("{got} causes; the limit is {max}")]
    TooManyCauses {
        /// Given.
        got: usize,
        /// Limit.
        max: usize,
    },
    /// A bad room / thread / actor name.
    #[error("{what} {reason}")]
    BadName {
        /// Which field.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A row whose writer signature (`sig` column) is malformed or does not verify.
    #[error("bad row signature: {0}")]
    BadSignature(String),
    /// A position that is not `major:minor`.
    #[error("bad position {0:?} (expected MAJOR:MINOR)")]
    BadPosition(String),
}
