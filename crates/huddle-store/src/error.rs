//! Store errors.

use huddle_core::ModelError;
use thiserror::Error;

/// What a store operation can fail with.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The interaction was refused before any write (bad name, oversized body, ...).
    #[error("refused: {0}")]
    Invalid(#[from] ModelError),
    /// A batch over the configured maximum.
    #[error("batch of {got} interactions; the limit is {max}")]
    BatchTooLarge {
        /// Given.
        got: usize,
        /// Limit.
        max: usize,
    },
    /// A fenced append whose claim is no longer `(holder, epoch)` or has lapsed.
    #[error(
        "fenced append refused: claim {key:?} is no longer held by {holder:?} at epoch {epoch}"
    )]
    Fenced {
        /// Claim key.
        key: String,
        /// The holder the writer presented.
        holder: String,
        /// The epoch the writer presented.
        epoch: crate::traits::Epoch,
    },
    /// The database could not be reached or the connection broke; retrying later may
    /// succeed.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A bad database URL or option.
    #[error("bad store configuration: {0}")]
    Config(String),
    /// A migration failed or the schema is from an unknown version.
    #[error("migration: {0}")]
    Migration(String),
    /// An archive of a room was refused; nothing was changed.
    #[error("room {room:?} was not archived: {reason}")]
    ArchiveRefused {
        /// The room.
        room: String,
        /// Why.
        reason: crate::traits::ArchiveRefusal,
    },
    /// Any other database error.
    #[error("database error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Result alias.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
