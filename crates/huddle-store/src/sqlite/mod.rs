//! SQLite backend: the embedded default (one machine, zero setup).
//!
//! - **Files** are opened in WAL mode with `synchronous=NORMAL`; a connection that
//!   finds the write lock taken waits up to 10 s in sleeps of 50 µs to 2 ms
//!   (`conn::busy_wait`). Each store holds a writer connection, owned by its writer thread
//!   (`writer.rs`), and a reader connection behind a mutex whose calls run on tokio's
//!   blocking pool, so the async runtime never waits on SQLite.
//! - **Writes** (appends, claims, resources) go to the writer thread, which runs the
//!   writes that arrive together in one `BEGIN IMMEDIATE` transaction, each inside its
//!   own savepoint (a write that fails is rolled back alone), and answers each once the
//!   transaction is committed (group commit). SQLite has a single writer lock, so
//!   rowids are assigned in commit order and the cursor is simply `Position::new(0,
//!   rowid)`: a reader can never see a later row before an earlier one (invariant 4).
//! - **Claims** are one upsert-with-condition inside `BEGIN IMMEDIATE`; expiry is
//!   judged by SQLite's clock (invariant 2).
//! - **Wake-up**: local appends ring the doorbell directly, and the writer thread rings
//!   the database's bell file (`<db>-bell`) after each commit that appended rows; a
//!   background thread reads `PRAGMA data_version` whenever inotify reports the bell
//!   (Linux; at least every 100 ms), else every [`StoreOptions::sqlite_change_poll`],
//!   and rings the doorbell when another connection or process committed. The thread
//!   stops when the store is dropped.
//! - **`:memory:`** gives a private in-memory database on one shared connection (for
//!   tests); nothing else can see it, so it needs no watcher.
//!
//! Readers never trust a row: every column is decoded defensively and checked with
//! [`RawRow::verify`](huddle_core::RawRow::verify); corrupt or foreign rows are
//! skipped, logged, counted ([`SqliteStore::skipped_total`]) and never block the
//! cursor.

mod archive;
mod claims;
pub(crate) mod conn;
mod ledger;
mod resources;
#[cfg(feature = "testing")]
mod testing;
mod watcher;
mod writer;

pub use watcher::BELL_SUFFIX;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{Interaction, InteractionId, Limits, NewInteraction, Position, Timestamp};
use rusqlite::{params, Connection};
use tokio::sync::watch;

use crate::error::{Result, StoreError};
use crate::traits::{
    Acquired, Appended, ArchiveOutcome, ArchiveRequest, ClaimRequest, ClaimRow, ClaimState, Claims,
    Doorbell, Epoch, Fence, Ledger, PrunedClaims, ReadBatch, SkippedRow, Store,
};
use crate::StoreOptions;

use conn::{now_us, ConnKind, MEMORY};
use ledger::row_columns;
use watcher::Watcher;

#[cfg(feature = "testing")]
pub use testing::{SqliteHeldAppend, SqliteTestBackend};

const READ_FORWARD: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM interaction WHERE seq > ?1 ORDER BY seq LIMIT ?2"
);

const READ_ROOM: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM interaction WHERE room = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
);

const GET: &str = concat!("SELECT ", row_columns!(), " FROM interaction WHERE id = ?1");

/// The SQLite store. Open it with [`SqliteStore::open`] (or [`crate::open`]).
///
/// ```no_run
/// # async fn demo() -> Result<(), huddle_store::StoreError> {
/// use huddle_store::{sqlite::SqliteStore, Claims, StoreOptions};
/// let store = SqliteStore::open("huddle.db", StoreOptions::default()).await?;
/// let claim = store
///     .acquire("task/lobby/t1", "agent-a", std::time::Duration::from_secs(60))
///     .await?;
/// assert!(claim.won());
/// # Ok(()) }
/// ```
pub struct SqliteStore {
    inner: Arc<Inner>,
    /// Stops the change watcher when the store is dropped. `None` in memory.
    _watcher: Option<Watcher>,
}

/// What the blocking closures share.
struct Inner {
    /// In memory: the one connection, for every statement. On a file the writer
    /// connection lives in the writer thread (`thread`) and this is `None`.
    writer: Option<Mutex<Connection>>,
    /// Every write of a file store, grouped into shared transactions
    /// ([`writer`](self::writer)). `None` in memory.
    thread: Option<writer::Writer>,
    /// Reads; `None` in memory, where the writer connection is the only one.
    reader: Option<Mutex<Connection>>,
    options: StoreOptions,
    bell: watch::Sender<u64>,
    skipped: AtomicU64,
}

impl Inner {
    /// In memory: runs `f` on the one connection in its own `BEGIN IMMEDIATE`
    /// transaction, committed when it succeeds, and rings when `rings` says so. A
    /// mutex poisoned by a panic elsewhere is still usable: the transaction is rolled
    /// back first.
    fn write_here<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T>,
        rings: fn(&T) -> bool,
    ) -> Result<T> {
        let lock = self.writer.as_ref().ok_or_else(|| {
            StoreError::Backend("a file store writes through its writer thread".into())
        })?;
        let conn = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if !conn.is_autocommit() {
            conn.execute_batch("ROLLBACK")?;
        }
        conn.execute_batch("BEGIN IMMEDIATE")?;
        match f(&conn) {
            Ok(t) => {
                conn.execute_batch("COMMIT")?;
                if rings(&t) {
                    self.ring();
                }
                Ok(t)
            }
            Err(e) => {
                conn.execute_batch("ROLLBACK")?;
                Err(e)
            }
        }
    }

    /// Runs `f` on the reader connection (the writer's, in memory).
    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let lock = self
            .reader
            .as_ref()
            .or(self.writer.as_ref())
            .ok_or_else(|| StoreError::Backend("a store without a connection".into()))?;
        let conn = lock.lock().unwrap_or_else(PoisonError::into_inner);
        f(&conn)
    }

    fn ring(&self) {
        self.bell.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Inside a write transaction: checks `fences` (closing them with the first row's
    /// id when `close`), then inserts `batch` (`checked` is its validation).
    fn append_in(
        &self,
        conn: &Connection,
        fences: &[Fence],
        close: bool,
        batch: &[NewInteraction],
        checked: &[(InteractionId, String)],
    ) -> Result<Vec<Appended>> {
        let closing = crate::traits::closing_id(close, batch)?;
        for fence in fences {
            ledger::check_fence(conn, fence, closing.as_ref())?;
        }
        ledger::insert_batch(
            conn,
            &self.options.relay,
            self.options.signer.as_ref(),
            batch,
            checked,
        )
    }

    /// Inside a write transaction: the batch acquire, then each conditional append
    /// whose claims were won at the epochs it expects (the insert triggers check them
    /// as for any fenced append).
    fn acquire_and_append_in(
        &self,
        conn: &Connection,
        requests: &[ClaimRequest],
        appends: &[crate::ConditionalAppend],
        checked: &[ledger::Checked],
    ) -> Result<crate::Handoff> {
        let acquired = claims::acquire_batch_in(conn, requests)?;
        let mut appended = Vec::with_capacity(appends.len());
        for (a, checked) in appends.iter().zip(checked) {
            appended.push(
                match crate::traits::conditions_hold(a, requests, &acquired) {
                    Some(_) => Some(ledger::insert_batch(
                        conn,
                        &self.options.relay,
                        self.options.signer.as_ref(),
                        &a.rows,
                        checked,
                    )?),
                    None => None,
                },
            );
        }
        Ok(crate::Handoff { acquired, appended })
    }

    /// Reads up to `limit` rows after `after` (of `room` only, when given), verifying
    /// each outside the connection lock.
    /// `unpack`: a lot's items in its place (every reader), or the lot itself
    /// ([`Ledger::read_room_rows`]).
    fn read_forward(
        &self,
        room: Option<&str>,
        after: Position,
        limit: usize,
        unpack: bool,
    ) -> Result<ReadBatch> {
        let batch = ReadBatch {
            next: after,
            ..ReadBatch::default()
        };
        if limit == 0 {
            return Ok(batch);
        }
        let after_seq = i64::try_from(after.minor).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let stored = self.read(|conn| match room {
            None => ledger::query_rows(conn, READ_FORWARD, params![after_seq, limit]),
            Some(room) => ledger::query_rows(conn, READ_ROOM, params![room, after_seq, limit]),
        })?;
        Ok(self.verify_rows(batch, stored, unpack))
    }

    /// Reads up to `limit` rows of `rooms` (without repeats) after `after`: one indexed
    /// query per room, all in one read transaction (one snapshot, so a row committed
    /// between two of them cannot be passed over), merged by rowid and cut at `limit`.
    fn read_rooms(&self, rooms: &[String], after: Position, limit: usize) -> Result<ReadBatch> {
        let batch = ReadBatch {
            next: after,
            ..ReadBatch::default()
        };
        if limit == 0 || rooms.is_empty() {
            return Ok(batch);
        }
        let after_seq = i64::try_from(after.minor).unwrap_or(i64::MAX);
        let per_room = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stored = self.read(|conn| {
            // A deferred transaction on a connection that only reads: its first
            // statement fixes the snapshot every later one sees.
            let tx = conn.unchecked_transaction()?;
            let mut out = Vec::new();
            for room in rooms {
                out.extend(ledger::query_rows(
                    &tx,
                    READ_ROOM,
                    params![room, after_seq, per_room],
                )?);
            }
            tx.commit()?;
            Ok(out)
        })?;
        stored.sort_by_key(|r| r.position);
        stored.truncate(limit);
        Ok(self.verify_rows(batch, stored, true))
    }

    /// Verifies rows read back outside the connection lock, appending them to `batch`
    /// (or its skipped rows) and moving its cursor past each.
    fn verify_rows(
        &self,
        mut batch: ReadBatch,
        stored: Vec<ledger::StoredRow>,
        unpack: bool,
    ) -> ReadBatch {
        for row in stored {
            batch.next = row.position;
            match row
                .raw
                .and_then(|raw| crate::traits::read_row(raw, unpack, &mut batch.rows))
            {
                Ok(()) => {}
                Err(reason) => {
                    tracing::warn!(
                        position = %row.position,
                        reason = %reason,
                        "skipping a corrupt or foreign ledger row"
                    );
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    batch.skipped.push(SkippedRow {
                        position: row.position,
                        reason,
                    });
                }
            }
        }
        batch
    }

    fn get(&self, id: InteractionId) -> Result<Option<Interaction>> {
        let stored = self.read(|conn| ledger::query_rows(conn, GET, [&id.0[..]]))?;
        let Some(row) = stored.into_iter().next() else {
            return Ok(None);
        };
        let mut rows = Vec::with_capacity(1);
        match row
            .raw
            .and_then(|raw| crate::traits::read_row(raw, false, &mut rows))
        {
            Ok(()) => Ok(rows.pop()),
            Err(reason) => {
                tracing::warn!(
                    position = %row.position,
                    reason = %reason,
                    "the ledger row with this id is corrupt or foreign"
                );
                Ok(None)
            }
        }
    }

    fn now(&self) -> Result<Timestamp> {
        self.read(|conn| {
            Ok(conn.query_row(concat!("SELECT ", now_us!()), [], |r| {
                r.get(0).map(Timestamp)
            })?)
        })
    }
}

impl SqliteStore {
    /// Opens (creating if needed) and migrates the database at `path`; `":memory:"`
    /// gives a private in-memory database. Processes opening the same new file
    /// together are safe: migrations run inside `BEGIN IMMEDIATE`.
    pub async fn open(path: &str, options: StoreOptions) -> Result<Self> {
        let path = path.to_string();
        tokio::task::spawn_blocking(move || Self::open_blocking(&path, options))
            .await
            .map_err(joined)?
    }

    fn open_blocking(path: &str, options: StoreOptions) -> Result<Self> {
        if path.is_empty() {
            return Err(StoreError::Config(
                "empty SQLite path: give a file path or :memory:".into(),
            ));
        }
        let mut writer = conn::open_connection(path, ConnKind::Writer)?;
        conn::migrate(&mut writer)?;
        let (bell, _) = watch::channel(0u64);
        let (reader, watcher) = if path == MEMORY {
            (None, None)
        } else {
            let reader = conn::open_connection(path, ConnKind::Reader)?;
            let watched = conn::open_connection(path, ConnKind::Reader)?;
            let watcher = Watcher::spawn(
                watched,
                std::path::Path::new(path),
                options.sqlite_change_poll,
                bell.clone(),
            )?;
            (Some(Mutex::new(reader)), Some(watcher))
        };
        // On a file every write goes through the writer thread; in memory the one
        // connection serves everything.
        let (writer, thread) = if path == MEMORY {
            (Some(Mutex::new(writer)), None)
        } else {
            (
                None,
                Some(writer::Writer::spawn(
                    writer,
                    conn::open_connection(path, ConnKind::Writer)?,
                    bell.clone(),
                    watcher::BellFile::new(std::path::Path::new(path)),
                )?),
            )
        };
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                writer,
                thread,
                reader,
                options,
                bell,
                skipped: AtomicU64::new(0),
            }),
            _watcher: watcher,
        })
    }

    /// A handle that dangles once the change watcher thread has exited.
    #[cfg(test)]
    fn watcher_alive(&self) -> Option<std::sync::Weak<()>> {
        self._watcher.as_ref().map(Watcher::alive)
    }

    /// How many corrupt or foreign rows this store's readers have skipped so far
    /// (a row read twice counts twice).
    pub fn skipped_total(&self) -> u64 {
        self.inner.skipped.load(Ordering::Relaxed)
    }

    /// The relay identity written into each appended row's `relay` column.
    pub fn relay(&self) -> &str {
        &self.inner.options.relay
    }

    /// Runs the write `f` in a transaction of the writer connection: on a file in the
    /// writer thread, grouped with the writes that arrive with it (each keeps its own
    /// all-or-nothing), answered once the group is committed; in memory on tokio's
    /// blocking pool. The doorbell rings after the commit when `rings` says so.
    async fn write<T, F>(&self, f: F, rings: fn(&T) -> bool) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner, &Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        match &self.inner.thread {
            Some(thread) => {
                let (job, answer) = writer::ClosureJob::queued(move |conn| f(&inner, conn), rings);
                if thread.send(job).is_err() {
                    return Err(StoreError::Backend(
                        "the SQLite writer thread has stopped".into(),
                    ));
                }
                answer.await.map_err(|_| {
                    StoreError::Backend("the SQLite writer thread dropped a write".into())
                })?
            }
            None => {
                tokio::task::spawn_blocking(move || inner.write_here(|conn| f(&inner, conn), rings))
                    .await
                    .map_err(joined)?
            }
        }
    }

    /// Runs `f` on tokio's blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(joined)?
    }
}

/// A blocking task that panicked or was cancelled.
fn joined(e: tokio::task::JoinError) -> StoreError {
    StoreError::Backend(format!("a SQLite worker task failed: {e}"))
}

#[async_trait]
impl Ledger for SqliteStore {
    fn limits(&self) -> &Limits {
        &self.inner.options.limits
    }

    async fn append(&self, batch: Vec<NewInteraction>) -> Result<Vec<Appended>> {
        self.append_under(&[], false, batch).await
    }

    async fn append_under(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Result<Vec<Appended>> {
        let checked = ledger::validate_batch(&self.inner.options.limits, &batch)?;
        crate::traits::closing_id(close, &batch)?;
        if batch.is_empty() && fences.is_empty() {
            return Ok(Vec::new());
        }
        let fences = fences.to_vec();
        self.write(
            move |inner, conn| inner.append_in(conn, &fences, close, &batch, &checked),
            |out: &Vec<Appended>| out.iter().any(|a| a.inserted),
        )
        .await
    }

    async fn read_forward(&self, after: Position, limit: usize) -> Result<ReadBatch> {
        self.blocking(move |inner| inner.read_forward(None, after, limit, true))
            .await
    }

    async fn read_room(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        let room = room.to_string();
        self.blocking(move |inner| inner.read_forward(Some(&room), after, limit, true))
            .await
    }

    async fn read_room_rows(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        let room = room.to_string();
        self.blocking(move |inner| inner.read_forward(Some(&room), after, limit, false))
            .await
    }

    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> Result<ReadBatch> {
        let rooms = crate::traits::distinct_rooms(rooms);
        self.blocking(move |inner| inner.read_rooms(&rooms, after, limit))
            .await
    }

    async fn get(&self, id: InteractionId) -> Result<Option<Interaction>> {
        self.blocking(move |inner| inner.get(id)).await
    }

    fn doorbell(&self) -> Doorbell {
        self.inner.bell.subscribe()
    }

    async fn now(&self) -> Result<Timestamp> {
        self.blocking(Inner::now).await
    }

    fn poll_interval(&self) -> Duration {
        self.inner.options.poll_interval
    }
}

#[async_trait]
impl Claims for SqliteStore {
    async fn acquire_request(&self, request: &ClaimRequest) -> Result<Acquired> {
        let request = request.clone();
        self.write(move |_, conn| claims::acquire_in(conn, &request), |_| false)
            .await
    }

    async fn acquire_batch(&self, requests: &[ClaimRequest]) -> Result<Vec<Option<Acquired>>> {
        crate::traits::check_claim_batch(requests)?;
        let requests = requests.to_vec();
        self.write(
            move |_, conn| claims::acquire_batch_in(conn, &requests),
            |_| false,
        )
        .await
    }

    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> Result<Option<ClaimState>> {
        let (key, holder) = (key.to_string(), holder.to_string());
        self.write(
            move |_, conn| claims::renew_in(conn, &key, &holder, epoch, ttl),
            |_| false,
        )
        .await
    }

    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> Result<bool> {
        let (key, holder) = (key.to_string(), holder.to_string());
        self.write(
            move |_, conn| claims::release_in(conn, &key, &holder, epoch),
            |_| false,
        )
        .await
    }

    async fn list_claims(&self, prefix: &str) -> Result<Vec<ClaimRow>> {
        let prefix = prefix.to_string();
        self.blocking(move |inner| inner.read(|conn| claims::list(conn, &prefix)))
            .await
    }

    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> Result<crate::ResourcesAcquired> {
        let wanted =
            crate::resources::checked_request(&self.inner.options.limits, room, holder, wanted)?;
        let (room, holder) = (room.to_string(), holder.to_string());
        self.write(
            move |_, conn| resources::acquire_in(conn, &room, &holder, &wanted, ttl),
            |_| false,
        )
        .await
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend_name(&self) -> &'static str {
        "sqlite"
    }

    async fn archive_room(&self, request: ArchiveRequest) -> Result<ArchiveOutcome> {
        request
            .check()
            .map_err(|reason| StoreError::ArchiveRefused {
                room: request.archived.room.clone(),
                reason,
            })?;
        let (id, body) = request.archived.checked(&self.inner.options.limits)?;
        self.write(
            move |inner, conn| {
                archive::archive(
                    conn,
                    &inner.options.relay,
                    inner.options.signer.as_ref(),
                    &request,
                    id,
                    body,
                )
            },
            |_| true,
        )
        .await
    }

    async fn prune_claims(&self, older_than: Duration) -> Result<PrunedClaims> {
        self.write(move |_, conn| archive::prune(conn, older_than), |_| false)
            .await
    }

    fn writer(&self) -> Option<String> {
        Some(self.relay().to_string())
    }

    fn signer(&self) -> Option<huddle_core::keys::WriterKey> {
        self.inner.options.signer.as_ref().map(|s| s.public())
    }

    async fn acquire_and_append(
        &self,
        requests: &[ClaimRequest],
        appends: Vec<crate::ConditionalAppend>,
    ) -> Result<crate::Handoff> {
        crate::traits::check_claim_batch(requests)?;
        crate::traits::check_appends(requests, &appends)?;
        let checked = appends
            .iter()
            .map(|a| ledger::validate_batch(&self.inner.options.limits, &a.rows))
            .collect::<Result<Vec<_>>>()?;
        let requests = requests.to_vec();
        self.write(
            move |inner, conn| inner.acquire_and_append_in(conn, &requests, &appends, &checked),
            |h: &crate::Handoff| h.appended.iter().flatten().flatten().any(|a| a.inserted),
        )
        .await
    }
}
