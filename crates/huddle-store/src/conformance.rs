//! The conformance suite: one written behaviour that every backend runs.
//!
//! A backend's test file implements [`TestBackend`] and invokes
//! [`conformance_tests!`](crate::conformance_tests) with an async constructor; every
//! function below becomes one `#[tokio::test]`.

use std::sync::Arc;

use async_trait::async_trait;
use huddle_core::{NewInteraction, RawRow};

use crate::error::Result;
use crate::traits::Store;

/// An append transaction that has inserted its rows (they hold their sequence
/// numbers) but has not committed yet.
#[async_trait]
pub trait HeldAppend: Send {
    /// Commits the held transaction.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// What the suite needs from a backend beyond the [`Store`] traits.
#[async_trait]
pub trait TestBackend: Send + Sync + 'static {
    /// The store under test (a fresh, migrated, empty database).
    fn store(&self) -> Arc<dyn Store>;
    /// Another independent handle on the same database, as a second relay would open.
    async fn reopen(&self, relay: &str) -> Result<Arc<dyn Store>>;
    /// Starts an append transaction, inserts `batch` and returns without committing.
    async fn hold_append(&self, batch: Vec<NewInteraction>) -> Result<Box<dyn HeldAppend>>;
    /// Inserts a row bypassing every check, as a foreign or broken writer would. Only
    /// the content columns of `row` are used; the database assigns the rest.
    async fn insert_raw(&self, row: RawRow) -> Result<()>;
}
