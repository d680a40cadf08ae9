//! SQLite backend (the embedded default).

use crate::{Result, StoreError, StoreOptions};

/// The SQLite store (being built).
pub struct SqliteStore;

impl SqliteStore {
    /// Opens (creating if needed) and migrates the database at `path`.
    pub async fn open(_path: &str, _options: StoreOptions) -> Result<Self> {
        Err(StoreError::Config(
            "the SQLite backend is not built yet".into(),
        ))
    }
}
