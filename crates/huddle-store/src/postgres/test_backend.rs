//! Test support: the Postgres side of the conformance suite.
//!
//! Free of huddle-testkit on purpose (the testkit is a dev-dependency): it takes a
//! database URL, and can keep any guard (such as a testkit `TestDb`) alive as long as
//! the backend.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{NewInteraction, RawRow};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use super::errors::map_pg;
use super::{insert_batch, sql, PgOptions, PgStore};
use crate::conformance::{HeldAppend, TestBackend, Writers};
use crate::traits::Store;
use crate::{Result, StoreError, StoreOptions};

/// Inserts a row's content columns verbatim, bypassing every check (foreign or broken
/// rows for [`TestBackend::insert_raw`]).
const INSERT_RAW: &str = "\
INSERT INTO interaction (id, room, thread, verb, actor, role, parent, caused_by, body, sig)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// The least fallback poll of stores opened by [`TestBackend::reopen`].
const REOPEN_POLL: Duration = Duration::from_secs(60);

/// A [`TestBackend`] on one (fresh, empty) Postgres database.
pub struct PgTestBackend {
    url: String,
    options: StoreOptions,
    pg: PgOptions,
    store: Arc<PgStore>,
    // Declared last: dropped after the store.
    guard: Option<Box<dyn Any + Send + Sync>>,
}

impl PgTestBackend {
    /// A second store on the database, signing with `signer` when given.
    async fn reopen_as(
        &self,
        relay: &str,
        signer: Option<huddle_core::keys::WriterSecret>,
    ) -> Result<Arc<dyn Store>> {
        // A long fallback poll, so a prompt wake-up proves the doorbell.
        let options = StoreOptions {
            relay: relay.to_string(),
            poll_interval: self.options.poll_interval.max(REOPEN_POLL),
            signer,
            ..self.options.clone()
        };
        let store = PgStore::connect_with(&self.url, options, self.pg.clone()).await?;
        if !store.wait_listening(self.pg.connect_timeout * 2).await {
            return Err(StoreError::Unavailable(
                "the reopened store's LISTEN connection did not come up".into(),
            ));
        }
        Ok(Arc::new(store))
    }

    /// Connects (and migrates) a store on `url` with default options.
    pub async fn new(url: &str) -> Result<Self> {
        Self::with_options(url, StoreOptions::default(), PgOptions::default()).await
    }

    /// Connects a store on `url` with the given options; [`TestBackend::reopen`] uses
    /// the same options.
    pub async fn with_options(url: &str, options: StoreOptions, pg: PgOptions) -> Result<Self> {
        let store = Arc::new(PgStore::connect_with(url, options.clone(), pg.clone()).await?);
        Ok(PgTestBackend {
            url: url.to_string(),
            options,
            pg,
            store,
            guard: None,
        })
    }

    /// Keeps `guard` (e.g. the test database handle) alive as long as this backend.
    pub fn holding<G: Send + Sync + 'static>(mut self, guard: G) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }

    /// The store under test, with its Postgres-only methods.
    pub fn pg_store(&self) -> Arc<PgStore> {
        self.store.clone()
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new session configured like the store's pooled ones (same
    /// `idle_in_transaction_session_timeout`), outside the pool.
    async fn session(&self) -> Result<(Client, JoinHandle<()>)> {
        let (client, connection) = self
            .store
            .session_config()
            .connect(NoTls)
            .await
            .map_err(map_pg)?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, driver))
    }
}

impl Drop for PgTestBackend {
    fn drop(&mut self) {
        // The store's tasks stop with it; only then let the guard go.
        let _ = self.guard.take();
    }
}

/// An append transaction on its own session, rows inserted, not yet committed.
/// Dropping it without [`HeldAppend::commit`] rolls it back (the session closes).
pub struct PgHeldAppend {
    client: Client,
    driver: JoinHandle<()>,
}

impl PgHeldAppend {
    /// Whether the server has closed the held session (for example after
    /// `idle_in_transaction_session_timeout`).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

#[async_trait]
impl HeldAppend for PgHeldAppend {
    async fn commit(self: Box<Self>) -> Result<()> {
        self.client.batch_execute("COMMIT").await.map_err(map_pg)?;
        // Ring other stores' bells as a real append would (outside the transaction).
        let _ = self
            .client
            .batch_execute(&format!("NOTIFY {}", sql::CHANNEL))
            .await;
        drop(self.client);
        let _ = self.driver.await;
        Ok(())
    }
}

#[async_trait]
impl TestBackend for PgTestBackend {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn reopen(&self, relay: &str) -> Result<Arc<dyn Store>> {
        self.reopen_as(relay, None).await
    }

    async fn reopen_signing(
        &self,
        relay: &str,
        signer: huddle_core::keys::WriterSecret,
    ) -> Result<Arc<dyn Store>> {
        self.reopen_as(relay, Some(signer)).await
    }

    fn writers(&self) -> Writers {
        // Each append is its own transaction on its own session.
        Writers::Concurrent
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    fn recorded_relay(&self, _relay: &str) -> String {
        // Postgres records the database role, whatever the relay calls itself.
        self.store
            .session_config()
            .get_user()
            .unwrap_or_default()
            .to_string()
    }

    async fn hold_append(&self, batch: Vec<NewInteraction>) -> Result<Box<dyn HeldAppend>> {
        let (ids, bodies) = self.store.validate(&batch)?;
        let (client, driver) = self.session().await?;
        client.batch_execute("BEGIN").await.map_err(map_pg)?;
        let sigs = self.store.signatures(&ids);
        insert_batch(&client, &batch, &ids, &bodies, &sigs)
            .await
            .map_err(map_pg)?;
        Ok(Box::new(PgHeldAppend { client, driver }))
    }

    async fn insert_raw(&self, row: RawRow) -> Result<()> {
        let (client, driver) = self.session().await?;
        let result = client
            .execute(
                INSERT_RAW,
                &[
                    &row.id,
                    &row.room,
                    &row.thread,
                    &row.verb,
                    &row.actor,
                    &row.role,
                    &row.parent,
                    &row.caused_by,
                    &row.body,
                    &row.sig,
                ],
            )
            .await
            .map_err(map_pg);
        if result.is_ok() {
            let _ = client
                .batch_execute(&format!("NOTIFY {}", sql::CHANNEL))
                .await;
        }
        drop(client);
        let _ = driver.await;
        result.map(|_| ())
    }
}
