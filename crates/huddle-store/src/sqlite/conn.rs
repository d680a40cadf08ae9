//! Connections: opening and configuring them, mapping their errors, and migrating the
//! schema.

use std::thread;
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::error::{Result, StoreError};
use crate::migrations::{self, Migration};

/// SQL for the database clock: µs since the Unix epoch. SQLite's clock has
/// millisecond resolution; rounding at the millisecond before scaling keeps float
/// error from ever truncating a value to the microsecond below. Every expiry decision
/// uses this expression, never a relay's clock (invariant 2).
macro_rules! now_us {
    () => {
        "(CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000)"
    };
}
pub(crate) use now_us;

/// How long a connection waits for another writer's lock before giving up with
/// `SQLITE_BUSY` (mapped to [`StoreError::Unavailable`]).
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest single sleep of [`busy_wait`].
const BUSY_SLEEP_MAX: Duration = Duration::from_millis(2);

thread_local! {
    /// When the current thread's wait for a lock began (reset at each new wait).
    static BUSY_SINCE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The busy handler of every connection: waits for another writer's lock in short
/// sleeps (50 µs doubling to 2 ms) for at most [`BUSY_TIMEOUT`]. SQLite's own
/// `busy_timeout` handler sleeps 1, 2, 5, 10 … up to 100 ms a step, so a writer that
/// finds the lock taken for a millisecond often waits ten or more: with several
/// processes writing one file, that added tens of milliseconds to claims.
fn busy_wait(attempt: i32) -> bool {
    let now = Instant::now();
    let since = BUSY_SINCE.with(|s| {
        if attempt == 0 || s.get().is_none() {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(since) >= BUSY_TIMEOUT {
        return false;
    }
    let step = Duration::from_micros(50)
        .saturating_mul(1u32 << attempt.clamp(0, 16))
        .min(BUSY_SLEEP_MAX);
    thread::sleep(step);
    true
}

/// The path that names a private in-memory database.
pub(crate) const MEMORY: &str = ":memory:";

/// What a connection is for; decides its pragmas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnKind {
    /// Appends, claims and migrations.
    Writer,
    /// Reads only (`query_only`), so a bug cannot write through it.
    Reader,
}

impl From<rusqlite::Error> for StoreError {
    /// `SQLITE_BUSY`, `SQLITE_LOCKED` and I/O-like failures may pass if retried later
    /// and become [`StoreError::Unavailable`]; anything else is
    /// [`StoreError::Backend`].
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(
                ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::CannotOpen
                | ErrorCode::DiskFull
                | ErrorCode::FileLockingProtocolFailed,
            ) => StoreError::Unavailable(format!("SQLite: {e}")),
            _ => StoreError::Backend(format!("SQLite: {e}")),
        }
    }
}

/// Opens one connection to `path` (or a private in-memory database for
/// [`MEMORY`]) and configures it: the [`busy_wait`] handler, and on files WAL and
/// `synchronous=NORMAL`.
pub(crate) fn open_connection(path: &str, kind: ConnKind) -> Result<Connection> {
    let mut conn = if path == MEMORY {
        Connection::open_in_memory()?
    } else {
        Connection::open_with_flags(path, OpenFlags::default()).map_err(
            |e| match StoreError::from(e) {
                StoreError::Unavailable(m) => {
                    StoreError::Unavailable(format!("cannot open SQLite database {path:?}: {m}"))
                }
                StoreError::Backend(m) => {
                    StoreError::Backend(format!("cannot open SQLite database {path:?}: {m}"))
                }
                other => other,
            },
        )?
    };
    conn.busy_handler(Some(busy_wait))?;
    // One plan per statement whatever is bound to it. Without this, a bound `LIMIT ?`
    // (every read of the ledger has one) marks the statement to be prepared again on
    // each new binding: a relay re-parsed its read statement on every read (plan 0061).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    // Room for every statement a connection runs in its cache (the default is 16;
    // the writer's alone are about as many), so none is parsed twice.
    conn.set_prepared_statement_cache_capacity(64);
    if path != MEMORY {
        // Switching to WAL needs a moment of exclusive access; when several processes
        // open a new file together the loser may see SQLITE_BUSY without the busy
        // handler being consulted, so retry for as long as the busy timeout.
        let mode: String = retry_busy(|| {
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .map_err(StoreError::from)
        })?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(
                path,
                mode,
                "SQLite did not switch to WAL; readers and writers will block each other"
            );
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // The writer runs each job of a group commit in a savepoint; its rollback
        // journal (the original of every page a job changes) is kept in memory, not
        // written to a temporary file.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
    }
    if kind == ConnKind::Reader {
        conn.pragma_update(None, "query_only", true)?;
    }
    Ok(conn)
}

/// Retries `f` while it fails with [`StoreError::Unavailable`], for at most
/// [`BUSY_TIMEOUT`].
fn retry_busy<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match f() {
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Applies the pending migrations of [`migrations::SQLITE`], recording each in
/// `huddle_migration`, all inside one `BEGIN IMMEDIATE` transaction: processes that
/// start together queue on the write lock, and the later ones find nothing to do.
pub(crate) fn migrate(conn: &mut Connection) -> Result<()> {
    migrate_with(conn, migrations::SQLITE)
}

/// [`migrate`] with an explicit migration list (tests use edited lists).
pub(crate) fn migrate_with(conn: &mut Connection, known: &[Migration]) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS huddle_migration (
            version    INTEGER PRIMARY KEY,
            name       TEXT NOT NULL,
            checksum   TEXT NOT NULL,
            applied_at INTEGER NOT NULL
        )",
    )?;
    let applied = {
        let mut stmt =
            tx.prepare("SELECT version, checksum FROM huddle_migration ORDER BY version")?;
        let mut rows = stmt.query([])?;
        let mut applied = Vec::new();
        while let Some(row) = rows.next()? {
            let version: i64 = row.get(0).map_err(|e| {
                StoreError::Migration(format!("unreadable huddle_migration row: {e}"))
            })?;
            let checksum: String = row.get(1).map_err(|e| {
                StoreError::Migration(format!("unreadable huddle_migration row: {e}"))
            })?;
            applied.push((version, checksum));
        }
        applied
    };
    let pending = migrations::pending(known, &applied).map_err(StoreError::Migration)?;
    for m in pending {
        tx.execute_batch(m.sql).map_err(|e| {
            StoreError::Migration(format!("migration {} ({}) failed: {e}", m.version, m.name))
        })?;
        tx.execute(
            concat!(
                "INSERT INTO huddle_migration (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ",
                now_us!(),
                ")"
            ),
            rusqlite::params![m.version, m.name, m.checksum()],
        )?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "applied SQLite migration"
        );
    }
    tx.commit()?;
    Ok(())
}
