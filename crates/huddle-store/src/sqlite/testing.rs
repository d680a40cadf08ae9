//! [`TestBackend`] for SQLite: what the conformance suite (and other crates' tests)
//! need beyond the store traits.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{NewInteraction, RawRow};
use rusqlite::{params, Connection};
use tempfile::TempDir;

use super::conn::{now_us, open_connection, ConnKind};
use super::{joined, ledger, SqliteStore};
use crate::conformance::{HeldAppend, TestBackend, Writers};
use crate::error::{Result, StoreError};
use crate::traits::Store;
use crate::StoreOptions;

/// A fresh, migrated SQLite database file in its own temporary directory, removed
/// when the backend is dropped.
pub struct SqliteTestBackend {
    store: Arc<SqliteStore>,
    path: PathBuf,
    options: StoreOptions,
    // Declared last so the directory outlives the store's connections.
    _dir: TempDir,
}

impl SqliteTestBackend {
    /// A new database with default options, except: relay `"conformance"`, and a
    /// 60 s fallback poll, so a subscription that wakes within the suite's deadlines
    /// was woken by the doorbell (local or `data_version`), not by polling.
    pub async fn new() -> Result<Self> {
        Self::with_options(StoreOptions {
            relay: "conformance".into(),
            poll_interval: Duration::from_secs(60),
            ..StoreOptions::default()
        })
        .await
    }

    /// A new database opened with `options`.
    pub async fn with_options(options: StoreOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("huddle-sqlite-")
            .tempdir()
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot create a temporary directory: {e}"))
            })?;
        let path = dir.path().join("huddle.db");
        let store = SqliteStore::open(path_str(&path)?, options.clone()).await?;
        Ok(SqliteTestBackend {
            store: Arc::new(store),
            path,
            options,
            _dir: dir,
        })
    }

    /// The concrete store under test.
    pub fn sqlite(&self) -> Arc<SqliteStore> {
        Arc::clone(&self.store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's path as text, for a raw connection opened off the runtime.
    fn raw_path(&self) -> Result<String> {
        Ok(path_str(&self.path)?.to_string())
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| StoreError::Config(format!("temporary path {path:?} is not UTF-8")))
}

#[async_trait]
impl TestBackend for SqliteTestBackend {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn reopen(&self, relay: &str) -> Result<Arc<dyn Store>> {
        let options = StoreOptions {
            relay: relay.to_string(),
            ..self.options.clone()
        };
        Ok(Arc::new(
            SqliteStore::open(path_str(&self.path)?, options).await?,
        ))
    }

    async fn reopen_signing(
        &self,
        relay: &str,
        signer: huddle_core::keys::WriterSecret,
    ) -> Result<Arc<dyn Store>> {
        let options = StoreOptions {
            relay: relay.to_string(),
            signer: Some(signer),
            ..self.options.clone()
        };
        Ok(Arc::new(
            SqliteStore::open(path_str(&self.path)?, options).await?,
        ))
    }

    fn writers(&self) -> Writers {
        // `BEGIN IMMEDIATE`: one writer at a time.
        Writers::Serialized
    }

    fn url(&self) -> Option<String> {
        self.raw_path().ok()
    }

    fn recorded_relay(&self, relay: &str) -> String {
        relay.to_string()
    }

    async fn hold_append(&self, batch: Vec<NewInteraction>) -> Result<Box<dyn HeldAppend>> {
        let checked = ledger::validate_batch(&self.options.limits, &batch)?;
        let path = self.raw_path()?;
        let relay = self.options.relay.clone();
        let signer = self.options.signer.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            // A raw connection on the same file, as another program would open it.
            let conn = open_connection(&path, ConnKind::Writer)?;
            // Other writers now wait on the busy timeout until `commit`.
            conn.execute_batch("BEGIN IMMEDIATE")?;
            ledger::insert_batch(&conn, &relay, signer.as_ref(), &batch, &checked)?;
            Ok(conn)
        })
        .await
        .map_err(joined)??;
        Ok(Box::new(SqliteHeldAppend { conn }))
    }

    async fn insert_raw(&self, row: RawRow) -> Result<()> {
        let path = self.raw_path()?;
        let relay = self.options.relay.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let conn = open_connection(&path, ConnKind::Writer)?;
            // "No checks" includes the schema's CHECK constraints (e.g. the id length).
            conn.pragma_update(None, "ignore_check_constraints", true)?;
            let caused_by: Vec<u8> = row.caused_by.concat();
            conn.execute(
                concat!(
                    "INSERT INTO interaction ",
                    "(id, room, thread, verb, actor, role, parent, caused_by, body, at, relay, ",
                    "sig) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ",
                    now_us!(),
                    ", ?10, ?11)"
                ),
                params![
                    row.id, row.room, row.thread, row.verb, row.actor, row.role, row.parent,
                    caused_by, row.body, relay, row.sig,
                ],
            )?;
            Ok(())
        })
        .await
        .map_err(joined)?
    }
}

/// An append transaction on its own connection, begun with `BEGIN IMMEDIATE`, rows
/// inserted, not yet committed. Dropping it without [`HeldAppend::commit`] rolls it
/// back.
pub struct SqliteHeldAppend {
    conn: Connection,
}

#[async_trait]
impl HeldAppend for SqliteHeldAppend {
    async fn commit(self: Box<Self>) -> Result<()> {
        let conn = self.conn;
        tokio::task::spawn_blocking(move || Ok(conn.execute_batch("COMMIT")?))
            .await
            .map_err(joined)?
    }
}
