//! Store meters: a [`Store`] wrapper that counts what one relay's handle was asked to
//! do (acquisitions won and lost per key kind, fenced appends refused, renewals,
//! releases, mean latencies).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use huddle_core::{Interaction, InteractionId, Limits, NewInteraction, Position, Timestamp};
use huddle_store::{
    Acquired, Appended, ClaimRequest, ClaimRow, ClaimState, Claims, Doorbell, Epoch, Fence, Ledger,
    ReadBatch, Store,
};
use serde::Serialize;
use tracing::debug;

use crate::report::round2;

/// Counters of what one relay's store handle was asked to do.
#[derive(Default)]
pub struct Meter {
    task_acquires: AtomicU64,
    task_won: AtomicU64,
    drive_acquires: AtomicU64,
    drive_won: AtomicU64,
    other_acquires: AtomicU64,
    acquire_us: AtomicU64,
    fenced_appends: AtomicU64,
    fenced_refused: AtomicU64,
    plain_appends: AtomicU64,
    append_us: AtomicU64,
    renews: AtomicU64,
    releases: AtomicU64,
}

/// A snapshot of a [`Meter`].
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MeterReport {
    /// `task/...` acquisitions (one per claim attempt on a task).
    pub task_acquires: u64,
    /// Of those, won.
    pub task_won: u64,
    /// `taskdrive/...` acquisitions (none since plan 0094: a task claim names its
    /// driver relay).
    pub drive_acquires: u64,
    /// Of those, won.
    pub drive_won: u64,
    /// Other acquisitions (reply, drive of replies).
    pub other_acquires: u64,
    /// Mean time of one acquisition through this handle, ms (includes waiting for
    /// the handle's writer connection).
    pub acquire_mean_ms: f64,
    /// Fenced appends (claims, completions).
    pub fenced_appends: u64,
    /// Of those, refused by the fence.
    pub fenced_refused: u64,
    /// Unfenced appends (registrations, bids, command results).
    pub plain_appends: u64,
    /// Mean time of one append, ms.
    pub append_mean_ms: f64,
    /// Renewals.
    pub renews: u64,
    /// Releases.
    pub releases: u64,
}

impl Meter {
    /// What the meter counted so far.
    pub fn report(&self) -> MeterReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let acquires =
            get(&self.task_acquires) + get(&self.drive_acquires) + get(&self.other_acquires);
        let appends = get(&self.fenced_appends) + get(&self.plain_appends);
        let mean = |us: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                round2(us as f64 / n as f64 / 1000.0)
            }
        };
        MeterReport {
            task_acquires: get(&self.task_acquires),
            task_won: get(&self.task_won),
            drive_acquires: get(&self.drive_acquires),
            drive_won: get(&self.drive_won),
            other_acquires: get(&self.other_acquires),
            acquire_mean_ms: mean(get(&self.acquire_us), acquires),
            fenced_appends: get(&self.fenced_appends),
            fenced_refused: get(&self.fenced_refused),
            plain_appends: get(&self.plain_appends),
            append_mean_ms: mean(get(&self.append_us), appends),
            renews: get(&self.renews),
            releases: get(&self.releases),
        }
    }
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// A store that counts what passes through it; otherwise the inner store.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    meter: Arc<Meter>,
}

impl MeteredStore {
    /// Wraps `inner`, counting into `meter`.
    pub fn new(inner: Arc<dyn Store>, meter: Arc<Meter>) -> Self {
        MeteredStore { inner, meter }
    }
}

#[async_trait]
impl Ledger for MeteredStore {
    fn limits(&self) -> &Limits {
        self.inner.limits()
    }

    async fn append(&self, batch: Vec<NewInteraction>) -> huddle_store::Result<Vec<Appended>> {
        let t = Instant::now();
        let r = self.inner.append(batch).await;
        self.meter.plain_appends.fetch_add(1, Ordering::Relaxed);
        add_elapsed(&self.meter.append_us, t);
        r
    }

    async fn append_under(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> huddle_store::Result<Vec<Appended>> {
        let t = Instant::now();
        let r = self.inner.append_under(fences, close, batch).await;
        self.meter.fenced_appends.fetch_add(1, Ordering::Relaxed);
        if matches!(r, Err(huddle_store::StoreError::Fenced { .. })) {
            self.meter.fenced_refused.fetch_add(1, Ordering::Relaxed);
        }
        add_elapsed(&self.meter.append_us, t);
        r
    }

    async fn read_forward(&self, after: Position, limit: usize) -> huddle_store::Result<ReadBatch> {
        self.inner.read_forward(after, limit).await
    }

    async fn read_room(
        &self,
        room: &str,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<ReadBatch> {
        self.inner.read_room(room, after, limit).await
    }

    async fn read_room_rows(
        &self,
        room: &str,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<ReadBatch> {
        self.inner.read_room_rows(room, after, limit).await
    }

    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<ReadBatch> {
        self.inner.read_rooms(rooms, after, limit).await
    }

    async fn get(&self, id: InteractionId) -> huddle_store::Result<Option<Interaction>> {
        self.inner.get(id).await
    }

    fn doorbell(&self) -> Doorbell {
        self.inner.doorbell()
    }

    async fn now(&self) -> huddle_store::Result<Timestamp> {
        self.inner.now().await
    }

    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }
}

impl MeteredStore {
    /// The counters of the kind of claim `key` is: calls, and wins when counted.
    fn counters(&self, key: &str) -> (&AtomicU64, Option<&AtomicU64>) {
        if key.starts_with("task/") {
            (&self.meter.task_acquires, Some(&self.meter.task_won))
        } else if key.starts_with("taskdrive/") {
            (&self.meter.drive_acquires, Some(&self.meter.drive_won))
        } else {
            (&self.meter.other_acquires, None)
        }
    }

    fn count_call(&self, key: &str) {
        self.counters(key).0.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one answered acquisition of `key`.
    fn count(&self, key: &str, holder: &str, a: &Acquired) {
        let (calls, wins) = self.counters(key);
        calls.fetch_add(1, Ordering::Relaxed);
        let won = a.won();
        let st = a.state();
        debug!(key, holder, won, by = %st.holder, epoch = st.epoch.get(), "acquire");
        if let (true, Some(w)) = (won, wins) {
            w.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl Claims for MeteredStore {
    async fn acquire_request(&self, request: &ClaimRequest) -> huddle_store::Result<Acquired> {
        let (key, holder) = (request.key.as_str(), request.holder.as_str());
        let t = Instant::now();
        let r = self.inner.acquire_request(request).await;
        add_elapsed(&self.meter.acquire_us, t);
        if let Ok(a) = &r {
            self.count(key, holder, a);
        } else {
            self.count_call(key);
        }
        r
    }

    async fn acquire_batch(
        &self,
        requests: &[ClaimRequest],
    ) -> huddle_store::Result<Vec<Option<Acquired>>> {
        let t = Instant::now();
        let r = self.inner.acquire_batch(requests).await;
        add_elapsed(&self.meter.acquire_us, t);
        match &r {
            Ok(out) => {
                for (req, a) in requests.iter().zip(out) {
                    if let Some(a) = a {
                        self.count(&req.key, &req.holder, a);
                    }
                }
            }
            Err(_) => {
                for req in requests {
                    self.count_call(&req.key);
                }
            }
        }
        r
    }

    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> huddle_store::Result<Option<ClaimState>> {
        self.meter.renews.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, holder, epoch, ttl).await
    }

    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> huddle_store::Result<bool> {
        self.meter.releases.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.release(key, holder, epoch).await;
        debug!(key, holder, epoch = epoch.get(), released = ?r.as_ref().ok(), "release");
        r
    }

    async fn list_claims(&self, prefix: &str) -> huddle_store::Result<Vec<ClaimRow>> {
        self.inner.list_claims(prefix).await
    }

    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> huddle_store::Result<huddle_store::ResourcesAcquired> {
        self.meter.other_acquires.fetch_add(1, Ordering::Relaxed);
        self.inner
            .acquire_resources(room, holder, wanted, ttl)
            .await
    }
}

#[async_trait::async_trait]
impl Store for MeteredStore {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn writer(&self) -> Option<String> {
        self.inner.writer()
    }

    async fn acquire_and_append(
        &self,
        requests: &[ClaimRequest],
        appends: Vec<huddle_store::ConditionalAppend>,
    ) -> huddle_store::Result<huddle_store::Handoff> {
        let t = Instant::now();
        let r = self.inner.acquire_and_append(requests, appends).await;
        add_elapsed(&self.meter.acquire_us, t);
        match &r {
            Ok(h) => {
                for (req, a) in requests.iter().zip(&h.acquired) {
                    if let Some(a) = a {
                        self.count(&req.key, &req.holder, a);
                    }
                }
                let written = h.appended.iter().flatten().count() as u64;
                self.meter
                    .fenced_appends
                    .fetch_add(written, Ordering::Relaxed);
            }
            Err(_) => {
                for req in requests {
                    self.count_call(&req.key);
                }
            }
        }
        r
    }

    async fn archive_room(
        &self,
        request: huddle_store::ArchiveRequest,
    ) -> huddle_store::Result<huddle_store::ArchiveOutcome> {
        self.inner.archive_room(request).await
    }

    async fn prune_claims(
        &self,
        older_than: Duration,
    ) -> huddle_store::Result<huddle_store::PrunedClaims> {
        self.inner.prune_claims(older_than).await
    }
}
