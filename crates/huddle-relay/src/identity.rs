//! One live process per relay id.
//!
//! Every claim a relay takes as holder names the relay id (drive claims, task-drive
//! claims), so two processes started with the same id would both "win" them. At start
//! a relay takes the claim `relay/<id>` under a name unique to its process
//! (`<id>@<host>/pid<pid>/<nonce>`) and renews it from its reconcile ticks. A second
//! process finding the claim live waits up to one lease: if the holder renews, the
//! second process refuses to start and names the first; if the lease lapses (the
//! first was killed), it takes over.

use std::time::{Duration, Instant};

use huddle_store::{Acquired, ClaimState, Store, StoreError};
use tracing::{info, warn};

/// How long a relay's identity lease lasts without renewal.
pub const IDENTITY_TTL: Duration = Duration::from_secs(10);

/// How often the lease is renewed.
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// Why a relay could not hold its id.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Another live process holds the id.
    #[error(
        "relay id {relay:?} is in use by another live process ({holder}); give this relay a \
         different `relay` id in its configuration, or stop the other one first"
    )]
    InUse {
        /// The relay id.
        relay: String,
        /// The other process's instance name.
        holder: String,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// The claim key of a relay id.
pub fn identity_key(relay: &str) -> String {
    format!("relay/{relay}")
}

/// The identity lease a running relay holds.
pub struct Identity {
    key: String,
    relay: String,
    instance: String,
    epoch: huddle_store::Epoch,
    renewed: Instant,
}

impl Identity {
    /// Takes the relay id for this process, waiting up to one lease for a previous
    /// holder that stopped renewing. Fails when another process keeps it live.
    pub async fn take(store: &dyn Store, relay: &str) -> Result<Identity, IdentityError> {
        let key = identity_key(relay);
        let instance = instance_name(relay);
        let deadline = Instant::now() + IDENTITY_TTL + RENEW_EVERY;
        let mut first_seen: Option<ClaimState> = None;
        loop {
            match store.acquire(&key, &instance, IDENTITY_TTL).await? {
                Acquired::Won(state) => {
                    info!(relay, instance, epoch = state.epoch.get(), "relay id taken");
                    return Ok(Identity {
                        key,
                        relay: relay.to_string(),
                        instance,
                        epoch: state.epoch,
                        renewed: Instant::now(),
                    });
                }
                Acquired::HeldBy(state) | Acquired::Closed { state, .. } => {
                    let renewed_since = first_seen.as_ref().is_some_and(|f| {
                        f.holder == state.holder
                            && f.epoch == state.epoch
                            && state.expires_at > f.expires_at
                    });
                    if renewed_since || Instant::now() > deadline {
                        return Err(IdentityError::InUse {
                            relay: relay.to_string(),
                            holder: state.holder,
                        });
                    }
                    if first_seen.is_none() {
                        info!(
                            relay,
                            other = %state.holder,
                            "relay id held by another process; waiting to see whether it is alive"
                        );
                        first_seen = Some(state);
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// This process's instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Renews the lease when due. A lease that lapsed (the process was paused) is
    /// re-taken when nobody else took it; when another process holds the id now, this
    /// one must stop.
    pub async fn keep(&mut self, store: &dyn Store) -> Result<(), IdentityError> {
        if self.renewed.elapsed() < RENEW_EVERY {
            return Ok(());
        }
        match store
            .renew(&self.key, &self.instance, self.epoch, IDENTITY_TTL)
            .await?
        {
            Some(_) => {}
            None => match store
                .acquire(&self.key, &self.instance, IDENTITY_TTL)
                .await?
            {
                Acquired::Won(state) => {
                    warn!(relay = %self.relay, epoch = state.epoch.get(), "relay id lease had lapsed; re-taken");
                    self.epoch = state.epoch;
                }
                Acquired::HeldBy(state) | Acquired::Closed { state, .. } => {
                    return Err(IdentityError::InUse {
                        relay: self.relay.clone(),
                        holder: state.holder,
                    });
                }
            },
        }
        self.renewed = Instant::now();
        Ok(())
    }

    /// Gives the id up (at a clean shutdown), so a restart need not wait.
    pub async fn release(self, store: &dyn Store) {
        if let Err(e) = store.release(&self.key, &self.instance, self.epoch).await {
            warn!(relay = %self.relay, error = %e, "could not release the relay id; it lapses by itself");
        }
    }
}

fn instance_name(relay: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    let nonce: i64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as i64)
        .unwrap_or(0);
    format!("{relay}@{host}/pid{}/{nonce:x}", std::process::id())
}
