//! [`TestBackend`] for the in-memory store: what the conformance suite needs beyond
//! the store traits.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{InteractionId, NewInteraction, RawRow};
use tokio::sync::OwnedMutexGuard;

use super::{MemoryStore, Shared};
use crate::conformance::{HeldAppend, TestBackend, Writers};
use crate::error::{Result, StoreError};
use crate::traits::Store;
use crate::StoreOptions;

/// A fresh in-memory database.
pub struct MemoryTestBackend {
    store: Arc<MemoryStore>,
}

impl MemoryTestBackend {
    /// A new database on the system clock with default options, except: relay
    /// `"conformance"`, and a 60 s fallback poll, so a subscription that wakes within
    /// the suite's deadlines was woken by the doorbell.
    pub fn new() -> Self {
        MemoryTestBackend {
            store: Arc::new(MemoryStore::new(Self::options("conformance"))),
        }
    }

    fn options(relay: &str) -> StoreOptions {
        StoreOptions {
            relay: relay.to_string(),
            poll_interval: Duration::from_secs(60),
            ..StoreOptions::default()
        }
    }

    /// The concrete store under test.
    pub fn memory(&self) -> Arc<MemoryStore> {
        Arc::clone(&self.store)
    }
}

impl Default for MemoryTestBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl TestBackend for MemoryTestBackend {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn reopen(&self, relay: &str) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.store.handle(Self::options(relay))))
    }

    async fn reopen_signing(
        &self,
        relay: &str,
        signer: huddle_core::keys::WriterSecret,
    ) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.store.handle(StoreOptions {
            signer: Some(signer),
            ..Self::options(relay)
        })))
    }

    fn writers(&self) -> Writers {
        Writers::Serialized
    }

    fn url(&self) -> Option<String> {
        None
    }

    fn recorded_relay(&self, relay: &str) -> String {
        relay.to_string()
    }

    async fn hold_append(&self, batch: Vec<NewInteraction>) -> Result<Box<dyn HeldAppend>> {
        let (ids, bodies) = crate::checked_batch(&self.store.options.limits, &batch)?;
        // Other writers now wait at the gate until `commit`.
        let gate = Arc::clone(&self.store.shared.writer).lock_owned().await;
        Ok(Box::new(MemoryHeldAppend {
            shared: Arc::clone(&self.store.shared),
            writer: self.store.options.clone(),
            batch,
            ids,
            bodies,
            _gate: gate,
        }))
    }

    async fn insert_raw(&self, row: RawRow) -> Result<()> {
        let _gate = self.store.shared.writer.lock().await;
        {
            let mut tables = self.store.shared.tables();
            if tables.by_id.contains_key(&row.id) {
                return Err(StoreError::Backend(
                    "a row with this id is already stored".into(),
                ));
            }
            let at = self.store.shared.clock.now();
            tables.push(RawRow {
                at,
                relay: self.store.options.relay.clone(),
                ..row
            });
        }
        self.store.shared.ring();
        Ok(())
    }
}

/// An append that holds the writer gate, its batch checked but not yet stored.
/// Dropping it without [`HeldAppend::commit`] writes nothing.
pub struct MemoryHeldAppend {
    shared: Arc<Shared>,
    writer: StoreOptions,
    batch: Vec<NewInteraction>,
    ids: Vec<InteractionId>,
    bodies: Vec<String>,
    _gate: OwnedMutexGuard<()>,
}

#[async_trait]
impl HeldAppend for MemoryHeldAppend {
    async fn commit(self: Box<Self>) -> Result<()> {
        self.shared.commit(
            &[],
            None,
            &self.batch,
            &self.ids,
            &self.bodies,
            &self.writer,
        )?;
        Ok(())
    }
}
