//! Postgres backend.

use crate::{Result, StoreError, StoreOptions};

/// The Postgres store (being built).
pub struct PgStore;

impl PgStore {
    /// Connects and migrates.
    pub async fn connect(_url: &str, _options: StoreOptions) -> Result<Self> {
        Err(StoreError::Config(
            "the Postgres backend is not built yet".into(),
        ))
    }
}
