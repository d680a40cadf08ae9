//! The change watcher: a background thread that notices commits made by other
//! connections (other stores, other processes) and rings the doorbell.
//!
//! `PRAGMA data_version` on a connection changes whenever *another* connection has
//! committed to the database file. The watcher's connection never writes, so every
//! change it sees is someone's commit (including this store's own writer; the extra
//! ring is harmless: a doorbell is a hint, never a record).

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::watch;

use crate::error::{Result, StoreError};

/// The running watcher. Dropping it stops the thread promptly (the stop channel
/// disconnects, which wakes the thread's wait at once).
pub(crate) struct Watcher {
    _stop: mpsc::Sender<()>,
    /// Held by the thread for its whole life; tests watch it to see the thread end.
    #[cfg_attr(not(test), allow(dead_code))]
    alive: Arc<()>,
}

impl Watcher {
    /// Starts polling `conn` every `every` (at least 1 ms), ringing `bell` when the
    /// database changed.
    pub(crate) fn spawn(
        conn: Connection,
        every: Duration,
        bell: watch::Sender<u64>,
    ) -> Result<Self> {
        let every = every.max(Duration::from_millis(1));
        // The baseline is read before `open` returns, so every commit made after the
        // store is open is seen as a change (reading it in the thread would race).
        let baseline = data_version(&conn)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let alive = Arc::new(());
        let token = Arc::clone(&alive);
        thread::Builder::new()
            .name("huddle-sqlite-watch".into())
            .spawn(move || {
                let _token = token;
                run(&conn, baseline, every, &bell, &stopped);
            })
            .map_err(|e| {
                StoreError::Backend(format!("cannot start the SQLite change watcher: {e}"))
            })?;
        Ok(Watcher { _stop: stop, alive })
    }

    /// A handle that dangles once the thread has exited.
    #[cfg(test)]
    pub(crate) fn alive(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.alive)
    }
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}

fn run(
    conn: &Connection,
    baseline: i64,
    every: Duration,
    bell: &watch::Sender<u64>,
    stopped: &mpsc::Receiver<()>,
) {
    let mut last = baseline;
    let mut failing = false;
    loop {
        match stopped.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        match data_version(conn) {
            Ok(v) => {
                if failing {
                    tracing::info!("SQLite change watcher recovered");
                    failing = false;
                }
                if v != last {
                    last = v;
                    bell.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            Err(e) => {
                // Subscriptions still catch up on their fallback poll; say so once per
                // streak of failures rather than every few milliseconds.
                if !failing {
                    tracing::warn!(error = %e, "SQLite change watcher cannot read data_version");
                    failing = true;
                }
            }
        }
    }
}
