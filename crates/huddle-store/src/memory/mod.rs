//! The in-memory store (feature `memory`): one process, nothing persisted.
//!
//! It keeps the written behaviour of the database backends (the conformance suite runs
//! against it) without their I/O, for tests and simulations:
//!
//! - **Handles** ([`MemoryStore::handle`]) share one ledger and one claims table, as
//!   separate connections to one database would; each has its own relay name, limits
//!   and fallback poll.
//! - **Writes** (appends and claim changes) pass one writer gate at a time, like
//!   SQLite's `BEGIN IMMEDIATE`, so positions `(0, n)` are in commit order and a
//!   reader never sees a later row before an earlier one.
//! - **Rows** are kept as they were stored ([`RawRow`]) and verified on every read,
//!   like the database backends, so a corrupt row is skipped and never blocks the
//!   cursor.
//! - **The doorbell** rings every handle's subscriptions on every insert.
//! - **The clock** is the system's, or a [`ManualClock`] a simulation sets: expiry of
//!   claims and every row's `at` are judged by it, never by a caller.
//!
//! ```
//! # async fn demo() -> Result<(), huddle_store::StoreError> {
//! use std::time::Duration;
//! use huddle_store::memory::{ManualClock, MemoryStore};
//! use huddle_store::{Claims, StoreOptions};
//! let clock = ManualClock::new(huddle_core::Timestamp(1_000_000));
//! let store = MemoryStore::with_clock(StoreOptions::default(), clock.clone());
//! let other = store.handle(StoreOptions { relay: "second".into(), ..StoreOptions::default() });
//! assert!(store.acquire("task/lobby/t1", "a", Duration::from_secs(1)).await?.won());
//! assert!(!other.acquire("task/lobby/t1", "b", Duration::from_secs(1)).await?.won());
//! clock.advance(Duration::from_secs(1));
//! assert!(other.acquire("task/lobby/t1", "b", Duration::from_secs(1)).await?.won());
//! # Ok(()) }
//! ```

#[cfg(feature = "testing")]
mod testing;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use huddle_core::{
    Interaction, InteractionId, Limits, NewInteraction, Position, RawRow, Timestamp,
};
use tokio::sync::watch;

use crate::error::{Result, StoreError};
use crate::traits::{
    Acquired, Appended, ArchiveOutcome, ArchiveRefusal, ArchiveRequest, ClaimRequest, ClaimRow,
    ClaimState, Claims, Doorbell, Epoch, Fence, Ledger, PrunedClaims, ReadBatch, SkippedRow, Store,
};
use crate::StoreOptions;
use huddle_core::protocol::room_of_claim;

#[cfg(feature = "testing")]
pub use testing::{MemoryHeldAppend, MemoryTestBackend};

/// A clock a simulation moves by hand: µs since the Unix epoch. Clones share the time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock that reads `start` until it is moved.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.as_micros())))
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }

    /// Sets the time (it may go backwards; claims are judged by whatever it reads).
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.as_micros(), Ordering::SeqCst);
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(micros(by), Ordering::SeqCst);
    }
}

/// The store's clock: the "database clock" of this backend.
#[derive(Clone, Debug)]
enum Clock {
    System,
    Manual(ManualClock),
}

impl Clock {
    fn now(&self) -> Timestamp {
        match self {
            Clock::System => Timestamp(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
                    .unwrap_or(0),
            ),
            Clock::Manual(m) => m.now(),
        }
    }
}

/// A duration in µs, at most 100 years, so `now + ttl` cannot overflow.
fn micros(d: Duration) -> i64 {
    const MAX: u128 = 100 * 365 * 24 * 3600 * 1_000_000;
    d.as_micros().min(MAX) as i64
}

/// The database: what every handle shares.
#[derive(Default)]
struct Tables {
    /// Rows as stored, in position order; row `i` is at `(0, i + 1)`.
    rows: Vec<RawRow>,
    /// Stored id bytes → index in `rows`.
    by_id: HashMap<Vec<u8>, usize>,
    /// Idempotency key → the id of the row that holds it.
    by_key: HashMap<String, InteractionId>,
    /// Claims by key (byte order).
    claims: BTreeMap<String, ClaimState>,
    /// Closed claims: key → the id of the interaction whose append closed it.
    closed: HashMap<String, InteractionId>,
    /// The drivers of claims taken for one (`ClaimRequest::driver`); a claim not
    /// here has none.
    drivers: HashMap<String, String>,
    /// Archived rooms → the id of their `room.archived` row.
    archived: HashMap<String, InteractionId>,
    /// The last sequence number given (never reused, even after an archive).
    last_seq: u64,
}

impl Tables {
    /// Inserts one validated interaction unless its id or idempotency key is already
    /// there; returns what the append reports.
    fn insert(
        &mut self,
        n: &NewInteraction,
        id: InteractionId,
        body: &str,
        at: Timestamp,
        relay: &str,
        signer: Option<&huddle_core::keys::WriterSecret>,
    ) -> Appended {
        // A repeated key returns its first row, whatever that row's content; a
        // repeated content is the row itself (its key, if any, is not stored).
        if let Some(existing) = n.idempotency_key.as_ref().and_then(|k| self.by_key.get(k)) {
            return Appended {
                id: *existing,
                inserted: false,
            };
        }
        if self.by_id.contains_key(&id.0[..]) {
            return Appended {
                id,
                inserted: false,
            };
        }
        if let Some(k) = &n.idempotency_key {
            self.by_key.insert(k.clone(), id);
        }
        self.push(RawRow {
            id: id.0.to_vec(),
            position: Position::START,
            at,
            relay: relay.to_string(),
            room: n.room.clone(),
            thread: n.thread.clone(),
            verb: n.verb.as_str().to_string(),
            actor: n.actor.clone(),
            role: n.role.as_str().to_string(),
            parent: n.parent.map(|p| p.0.to_vec()),
            caused_by: n.caused_by.iter().map(|c| c.0.to_vec()).collect(),
            body: body.to_string(),
            sig: crate::row_signature(signer, relay, &id),
        });
        Appended { id, inserted: true }
    }

    /// What both databases check of `state.put` rows (migration 0007): each carries
    /// the idempotency key of its version, and its predecessor is in the ledger (or
    /// earlier in the batch).
    fn check_state_puts(&self, batch: &[NewInteraction]) -> Result<()> {
        use huddle_core::shared_state::{state_idempotency_key, StatePutBody};
        let mut earlier: Vec<String> = Vec::new();
        for n in batch {
            if n.verb == huddle_core::Verb::StatePut {
                let body = serde_json::from_value::<StatePutBody>(n.body.clone())
                    .ok()
                    .filter(|b| b.version >= 1);
                let Some(body) = body else {
                    return Err(StoreError::Backend(
                        "huddle: state.put refused: its body names no key and version".into(),
                    ));
                };
                let own = state_idempotency_key(&n.room, body.version, &body.key);
                if n.idempotency_key.as_deref() != Some(own.as_str()) {
                    return Err(StoreError::Backend(format!(
                        "huddle: state.put refused: version {} of {} must carry the idempotency key {own}",
                        body.version, body.key
                    )));
                }
                let before = state_idempotency_key(&n.room, body.version - 1, &body.key);
                let found = body.version == 1
                    || earlier.contains(&before)
                    || self.by_key.get(&before).is_some_and(|id| {
                        self.by_id
                            .get(&id.0[..])
                            .is_some_and(|&i| self.rows[i].verb == "state.put")
                    });
                if !found {
                    return Err(StoreError::Backend(format!(
                        "huddle: state.put refused: version {} of {} has no version before it",
                        body.version, body.key
                    )));
                }
                earlier.push(own);
            }
        }
        Ok(())
    }

    /// What both databases check of a `task.lot` row (migrations 0014 Postgres, 0011
    /// SQLite): every fenced item (`task.claimed` / `task.completed` / `task.failed`)
    /// names its task claim, held by the item's actor at the item's epoch, live or
    /// closed by this very lot. Its shape is the writer's check
    /// (`NewInteraction::validate`), which every append here runs first.
    fn check_lots(
        &mut self,
        batch: &[NewInteraction],
        ids: &[InteractionId],
        now: Timestamp,
    ) -> Result<()> {
        use huddle_core::protocol::claims::task_key_at;
        for (n, id) in batch.iter().zip(ids) {
            if n.verb != huddle_core::Verb::TaskLot || self.by_id.contains_key(&id.0[..]) {
                continue;
            }
            let items = n.body.get("items").and_then(|i| i.as_array());
            for item in items.into_iter().flatten() {
                let verb = item.get("verb").and_then(|v| v.as_str());
                if !matches!(
                    verb,
                    Some("task.claimed" | "task.completed" | "task.failed")
                ) {
                    continue;
                }
                let body = &item["body"];
                let task = body.get("task").and_then(|t| t.as_str());
                let epoch = body.get("epoch").and_then(|e| e.as_i64());
                let generation = body
                    .get("generation")
                    .map_or(Some(0), |g| g.as_u64().and_then(|g| u32::try_from(g).ok()));
                let holder = item.get("actor").and_then(|a| a.as_str());
                let held = match (task, epoch, generation, holder) {
                    (Some(task), Some(epoch), Some(generation), Some(holder)) => {
                        let key = task_key_at(&n.room, task, generation);
                        match self.closed.get(&key) {
                            Some(by) => {
                                by == id
                                    && self.claims.get(&key).is_some_and(|c| {
                                        c.holder == holder && c.epoch.get() == epoch
                                    })
                            }
                            None => self.live_claim(&key, holder, Epoch(epoch), now).is_some(),
                        }
                    }
                    _ => false,
                };
                if !held {
                    return Err(StoreError::Backend(
                        "huddle: task.lot refused: an item's task claim is not live and held \
                         by its actor at its epoch"
                            .into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Stores `row` at the next position.
    fn push(&mut self, mut row: RawRow) {
        self.last_seq += 1;
        row.position = Position::new(0, self.last_seq);
        self.by_id.insert(row.id.clone(), self.rows.len());
        self.rows.push(row);
    }

    /// What the databases' insert triggers refuse (migrations 0012 Postgres, 0010
    /// SQLite): any row of an archived room but its `room.archived` row, and a
    /// `room.archived` row anywhere but in an archive.
    fn check_archived(&self, batch: &[NewInteraction], ids: &[InteractionId]) -> Result<()> {
        for (n, id) in batch.iter().zip(ids) {
            if n.verb == huddle_core::Verb::RoomArchived && self.archived.get(&n.room) != Some(id) {
                return Err(StoreError::Backend(
                    "huddle: a room.archived row is written only by archiving the room \
                     (huddle room archive)"
                        .into(),
                ));
            }
            if self.archived.get(&n.room).is_some_and(|a| a != id) {
                return Err(StoreError::Backend(format!(
                    "huddle: room {} is archived: nothing can be added to it",
                    n.room
                )));
            }
        }
        Ok(())
    }

    /// Archives a room (see [`Store::archive_room`]): checks, inserts the
    /// `room.archived` row, removes the room's other rows and claims.
    fn archive(
        &mut self,
        request: &ArchiveRequest,
        id: InteractionId,
        body: &str,
        now: Timestamp,
        writer: &StoreOptions,
    ) -> std::result::Result<ArchiveOutcome, ArchiveRefusal> {
        let room = request.archived.room.clone();
        if self.archived.contains_key(&room) {
            return Err(ArchiveRefusal::Archived);
        }
        if !self
            .rows
            .iter()
            .any(|r| r.room == room && r.verb == huddle_core::Verb::RoomCreated.as_str())
        {
            return Err(ArchiveRefusal::NoRoom);
        }
        let have = self.rows.iter().filter(|r| r.room == room).count() as u64;
        if have != request.rows {
            return Err(ArchiveRefusal::Changed {
                exported: request.rows,
                now: have,
            });
        }
        let live: Vec<String> = self
            .claims
            .iter()
            .filter(|(key, c)| {
                room_of_claim(key) == Some(room.as_str())
                    && c.expires_at > now
                    && !self.closed.contains_key(*key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        if !live.is_empty() {
            return Err(ArchiveRefusal::LiveClaims(live));
        }
        self.insert(
            &request.archived,
            id,
            body,
            now,
            &writer.relay,
            writer.signer.as_ref(),
        );
        let before = self.rows.len();
        self.rows.retain(|r| r.room != room || r.id == id.0);
        let rows_removed = (before - self.rows.len()) as u64;
        self.by_id = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        let by_id = &self.by_id;
        self.by_key.retain(|_, id| by_id.contains_key(&id.0[..]));
        let claims_before = self.claims.len();
        self.claims
            .retain(|key, _| room_of_claim(key) != Some(room.as_str()));
        self.closed
            .retain(|key, _| room_of_claim(key) != Some(room.as_str()));
        self.drivers
            .retain(|key, _| room_of_claim(key) != Some(room.as_str()));
        let claims_removed = (claims_before - self.claims.len()) as u64;
        self.archived.insert(room, id);
        Ok(ArchiveOutcome {
            id,
            rows_removed,
            claims_removed,
        })
    }

    /// Prunes claims (see [`Store::prune_claims`]).
    fn prune(&mut self, older_than: Duration, now: Timestamp) -> PrunedClaims {
        let cutoff = now.saturating_add(-micros(older_than));
        let mut out = PrunedClaims::default();
        let archived = &self.archived;
        let closed = &self.closed;
        self.claims.retain(|key, c| {
            if key.starts_with("relay/") && !closed.contains_key(key) && c.expires_at < cutoff {
                out.relay_leases += 1;
                return false;
            }
            if room_of_claim(key).is_some_and(|room| archived.contains_key(room)) {
                out.archived_rooms += 1;
                return false;
            }
            true
        });
        let claims = &self.claims;
        self.closed.retain(|key, _| claims.contains_key(key));
        out
    }

    /// The claim `key` if it is still `(holder, epoch)` and unexpired at `now`.
    fn live_claim(
        &mut self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        now: Timestamp,
    ) -> Option<&mut ClaimState> {
        if self.closed.contains_key(key) {
            return None;
        }
        self.claims
            .get_mut(key)
            .filter(|c| c.holder == holder && c.epoch == epoch && c.expires_at > now)
    }

    /// Whether an append may write under `fence`: the claim is live and open, or
    /// (for a closing append) already closed by this very batch.
    fn fence_passes(
        &mut self,
        fence: &Fence,
        closing: Option<&InteractionId>,
        now: Timestamp,
    ) -> bool {
        match (self.closed.get(&fence.key), closing) {
            (Some(by), Some(id)) => {
                by == id
                    && self
                        .claims
                        .get(&fence.key)
                        .is_some_and(|c| c.holder == fence.holder && c.epoch == fence.epoch)
            }
            (Some(_), None) => false,
            (None, _) => self
                .live_claim(&fence.key, &fence.holder, fence.epoch, now)
                .is_some(),
        }
    }
}

/// What the handles of one in-memory database share.
struct Shared {
    tables: Mutex<Tables>,
    /// One writer at a time (appends, held appends, claim changes), like SQLite's
    /// `BEGIN IMMEDIATE`. Async, so a held append makes other writers wait without
    /// blocking a thread.
    writer: Arc<tokio::sync::Mutex<()>>,
    bell: watch::Sender<u64>,
    clock: Clock,
}

impl Shared {
    /// The tables. A mutex poisoned by a panic elsewhere is still usable: every
    /// change to the tables is complete before anything that could panic.
    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ring(&self) {
        self.bell.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Inserts a validated batch in one step (the caller holds the writer gate), after
    /// checking the fence when given; rings the bell when a row was inserted.
    fn commit(
        &self,
        fences: &[Fence],
        closing: Option<InteractionId>,
        batch: &[NewInteraction],
        ids: &[InteractionId],
        bodies: &[String],
        writer: &StoreOptions,
    ) -> Result<Vec<Appended>> {
        let (relay, signer) = (writer.relay.as_str(), writer.signer.as_ref());
        let now = self.clock.now();
        let out = {
            let mut tables = self.tables();
            for fence in fences {
                if !tables.fence_passes(fence, closing.as_ref(), now) {
                    return Err(StoreError::Fenced {
                        key: fence.key.clone(),
                        holder: fence.holder.clone(),
                        epoch: fence.epoch,
                    });
                }
            }
            tables.check_state_puts(batch)?;
            tables.check_archived(batch, ids)?;
            tables.check_lots(batch, ids, now)?;
            if let Some(id) = closing {
                for fence in fences {
                    tables.closed.insert(fence.key.clone(), id);
                    if let Some(c) = tables.claims.get_mut(&fence.key) {
                        c.expires_at = c.expires_at.min(now);
                    }
                }
            }
            batch
                .iter()
                .zip(ids.iter().zip(bodies))
                .map(|(n, (id, body))| tables.insert(n, *id, body, now, relay, signer))
                .collect::<Vec<_>>()
        };
        if out.iter().any(|a| a.inserted) {
            self.ring();
        }
        Ok(out)
    }
}

/// A handle on an in-memory ledger and claims table. Create the database with
/// [`MemoryStore::new`] or [`MemoryStore::with_clock`]; open more handles on it with
/// [`MemoryStore::handle`]. The data lives as long as any handle.
pub struct MemoryStore {
    shared: Arc<Shared>,
    options: StoreOptions,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("relay", &self.options.relay)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A new, empty database on the system clock.
    pub fn new(options: StoreOptions) -> Self {
        Self::create(options, Clock::System)
    }

    /// A new, empty database whose clock is `clock`.
    pub fn with_clock(options: StoreOptions, clock: ManualClock) -> Self {
        Self::create(options, Clock::Manual(clock))
    }

    fn create(options: StoreOptions, clock: Clock) -> Self {
        let (bell, _) = watch::channel(0u64);
        MemoryStore {
            shared: Arc::new(Shared {
                tables: Mutex::new(Tables::default()),
                writer: Arc::new(tokio::sync::Mutex::new(())),
                bell,
                clock,
            }),
            options,
        }
    }

    /// Another handle on the same database, with its own options (relay name, limits,
    /// fallback poll), as a second relay would open.
    pub fn handle(&self, options: StoreOptions) -> MemoryStore {
        MemoryStore {
            shared: Arc::clone(&self.shared),
            options,
        }
    }

    /// The relay identity written into each appended row's `relay` column.
    pub fn relay(&self) -> &str {
        &self.options.relay
    }

    /// Appends under the writer gate, fenced when asked.
    async fn write(
        &self,
        fences: &[Fence],
        close: bool,
        batch: &[NewInteraction],
    ) -> Result<Vec<Appended>> {
        let (ids, bodies) = crate::checked_batch(&self.options.limits, batch)?;
        let closing = crate::traits::closing_id(close, batch)?;
        if batch.is_empty() && fences.is_empty() {
            return Ok(Vec::new());
        }
        let _gate = self.shared.writer.lock().await;
        self.shared
            .commit(fences, closing, batch, &ids, &bodies, &self.options)
    }

    /// Up to `limit` stored rows of `rooms` after `after`, in ledger order.
    fn stored_rows(&self, rooms: &[String], after: Position, limit: usize) -> Vec<RawRow> {
        let tables = self.shared.tables();
        let first = tables.rows.partition_point(|r| r.position <= after);
        tables.rows[first..]
            .iter()
            .filter(|r| rooms.contains(&r.room))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Runs `f` on the tables under the writer gate, at the clock's time now.
    async fn claims<T>(&self, f: impl FnOnce(&mut Tables, Timestamp) -> T) -> T {
        let _gate = self.shared.writer.lock().await;
        let now = self.shared.clock.now();
        f(&mut self.shared.tables(), now)
    }
}

/// Verifies stored rows into a batch after `after`: each row's interactions (a lot's
/// items when `unpack`), logging and describing a corrupt or foreign one.
fn verified(stored: Vec<RawRow>, after: Position, unpack: bool) -> ReadBatch {
    let mut batch = ReadBatch {
        next: stored.last().map_or(after, |r| r.position),
        ..ReadBatch::default()
    };
    for row in stored {
        let position = row.position;
        if let Err(reason) = crate::traits::read_row(row, unpack, &mut batch.rows) {
            tracing::warn!(%position, %reason, "skipping a corrupt or foreign ledger row");
            batch.skipped.push(SkippedRow { position, reason });
        }
    }
    batch
}

#[async_trait]
impl Ledger for MemoryStore {
    fn limits(&self) -> &Limits {
        &self.options.limits
    }

    async fn append(&self, batch: Vec<NewInteraction>) -> Result<Vec<Appended>> {
        self.write(&[], false, &batch).await
    }

    async fn append_under(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Result<Vec<Appended>> {
        self.write(fences, close, &batch).await
    }

    async fn read_forward(&self, after: Position, limit: usize) -> Result<ReadBatch> {
        let stored: Vec<RawRow> = {
            let tables = self.shared.tables();
            let first = tables.rows.partition_point(|r| r.position <= after);
            tables.rows[first..].iter().take(limit).cloned().collect()
        };
        Ok(verified(stored, after, true))
    }

    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> Result<ReadBatch> {
        Ok(verified(self.stored_rows(rooms, after, limit), after, true))
    }

    async fn read_room_rows(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        let rooms = [room.to_string()];
        Ok(verified(
            self.stored_rows(&rooms, after, limit),
            after,
            false,
        ))
    }

    async fn get(&self, id: InteractionId) -> Result<Option<Interaction>> {
        let stored = {
            let tables = self.shared.tables();
            tables.by_id.get(&id.0[..]).map(|&i| tables.rows[i].clone())
        };
        Ok(stored.and_then(|row| verified(vec![row], Position::START, false).rows.pop()))
    }

    fn doorbell(&self) -> Doorbell {
        self.shared.bell.subscribe()
    }

    async fn now(&self) -> Result<Timestamp> {
        Ok(self.shared.clock.now())
    }

    fn poll_interval(&self) -> Duration {
        self.options.poll_interval
    }
}

#[async_trait]
impl Claims for MemoryStore {
    async fn acquire_request(&self, request: &ClaimRequest) -> Result<Acquired> {
        let (key, holder) = (request.key.as_str(), request.holder.as_str());
        let driver = request.driver.as_deref();
        let ttl = micros(request.ttl);
        Ok(self
            .claims(|tables, now| {
                let taken = |epoch| ClaimState {
                    key: key.to_string(),
                    holder: holder.to_string(),
                    epoch,
                    expires_at: now.saturating_add(ttl),
                };
                // Only a held claim is ever closed, so a closed key has its row.
                if let (Some(by), Some(state)) = (tables.closed.get(key), tables.claims.get(key)) {
                    let state = state.clone();
                    return Acquired::Closed { state, by: *by };
                }
                let same_driver = tables.drivers.get(key).map(String::as_str) == driver;
                let state = match tables.claims.get(key) {
                    None => taken(Epoch::FIRST),
                    // The same holder, for the same driver, extending a live lease
                    // keeps its epoch.
                    Some(c) if c.expires_at > now && c.holder == holder && same_driver => {
                        taken(c.epoch)
                    }
                    Some(c) if c.expires_at > now => return Acquired::HeldBy(c.clone()),
                    // Free again (expired or released): a new epoch, whoever takes it.
                    Some(c) => taken(c.epoch.next()),
                };
                tables.claims.insert(key.to_string(), state.clone());
                match driver {
                    Some(d) => tables.drivers.insert(key.to_string(), d.to_string()),
                    None => tables.drivers.remove(key),
                };
                Acquired::Won(state)
            })
            .await)
    }

    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> Result<Option<ClaimState>> {
        let ttl = micros(ttl);
        Ok(self
            .claims(|tables, now| {
                let claim = tables.live_claim(key, holder, epoch, now)?;
                claim.expires_at = now.saturating_add(ttl);
                Some(claim.clone())
            })
            .await)
    }

    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> Result<bool> {
        Ok(self
            .claims(
                |tables, now| match tables.live_claim(key, holder, epoch, now) {
                    Some(claim) => {
                        claim.expires_at = now;
                        true
                    }
                    None => false,
                },
            )
            .await)
    }

    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> Result<crate::ResourcesAcquired> {
        use huddle_core::resources::{blockers, resource_key, room_prefix};
        let wanted = crate::resources::checked_request(&self.options.limits, room, holder, wanted)?;
        let ttl = micros(ttl);
        Ok(self
            .claims(|tables, now| {
                let prefix = room_prefix(room);
                let live: Vec<_> = tables
                    .claims
                    .range(prefix.clone()..)
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .filter(|(key, c)| c.expires_at > now && !tables.closed.contains_key(*key))
                    .filter_map(|(_, c)| {
                        crate::resources::holding(&ClaimRow {
                            state: c.clone(),
                            live: true,
                            driver: None,
                        })
                    })
                    .collect();
                let blocked = blockers(holder, &wanted, &live);
                if !blocked.is_empty() {
                    return crate::ResourcesAcquired::Blocked(blocked);
                }
                let mut won = Vec::with_capacity(wanted.len());
                for w in &wanted {
                    for other in live
                        .iter()
                        .filter(|h| h.holder == holder && h.name == w.name && h.mode != w.mode)
                    {
                        if let Some(c) = tables.claims.get_mut(&other.key) {
                            c.expires_at = now;
                        }
                    }
                    let key = resource_key(room, holder, w.mode, &w.name);
                    let epoch = match tables.claims.get(&key) {
                        None => Epoch::FIRST,
                        Some(c) if c.expires_at > now && c.holder == holder => c.epoch,
                        Some(c) => c.epoch.next(),
                    };
                    let state = ClaimState {
                        key: key.clone(),
                        holder: holder.to_string(),
                        epoch,
                        expires_at: now.saturating_add(ttl),
                    };
                    tables.drivers.remove(&key);
                    tables.claims.insert(key, state.clone());
                    won.push(crate::resources::won_holding(
                        holder, &w.name, w.mode, state,
                    ));
                }
                crate::ResourcesAcquired::Won(won)
            })
            .await)
    }

    async fn list_claims(&self, prefix: &str) -> Result<Vec<ClaimRow>> {
        let now = self.shared.clock.now();
        let tables = self.shared.tables();
        Ok(tables
            .claims
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, state)| ClaimRow {
                state: state.clone(),
                live: state.expires_at > now,
                driver: tables.drivers.get(key).cloned(),
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    async fn archive_room(&self, request: ArchiveRequest) -> Result<ArchiveOutcome> {
        let room = request.archived.room.clone();
        let refused = |reason| StoreError::ArchiveRefused {
            room: room.clone(),
            reason,
        };
        request.check().map_err(refused)?;
        let (id, body) = request.archived.checked(&self.options.limits)?;
        let out = {
            let _gate = self.shared.writer.lock().await;
            let now = self.shared.clock.now();
            self.shared
                .tables()
                .archive(&request, id, &body, now, &self.options)
                .map_err(refused)?
        };
        self.shared.ring();
        Ok(out)
    }

    async fn prune_claims(&self, older_than: Duration) -> Result<PrunedClaims> {
        Ok(self.claims(|t, now| t.prune(older_than, now)).await)
    }

    fn writer(&self) -> Option<String> {
        Some(self.relay().to_string())
    }

    fn signer(&self) -> Option<huddle_core::keys::WriterKey> {
        self.options.signer.as_ref().map(|s| s.public())
    }
}
