//! The change watcher: a background thread that notices commits made by other
//! connections (other stores, other processes) and rings the doorbell.
//!
//! `PRAGMA data_version` on a connection changes whenever *another* connection has
//! committed to the database file. The watcher's connection never writes, so every
//! change it sees is someone's commit (including this store's own writer; the extra
//! ring is harmless: a doorbell is a hint, never a record).
//!
//! When it is read: on Linux, whenever the database's write-ahead log (or the file
//! itself) is written — the thread waits on inotify events of the database's directory,
//! so a commit in another process wakes it at once and an idle store costs nothing; an
//! event that shows no commit yet is looked at again [`RECHECK`] later — and at least
//! every [`FALLBACK`] in case an event is missed (a file system without inotify). Elsewhere, or when inotify cannot be set up, every `every` (the store's
//! `sqlite_change_poll`).

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
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

/// The longest wait between two reads of the change counter when file events wake the
/// watcher (a missed event costs at most this much latency).
pub(crate) const FALLBACK: Duration = Duration::from_millis(100);

/// A file event whose read of the change counter found nothing new is looked at again
/// this much later: a commit's last step (the log index in shared memory) raises no
/// file event of its own, so the event of the write before it can come a moment early.
const RECHECK: Duration = Duration::from_millis(1);

impl Watcher {
    /// Starts watching the database file `path` through `conn`, ringing `bell` when
    /// the database changed: on file events where the platform has them, else every
    /// `every` (at least 1 ms).
    pub(crate) fn spawn(
        conn: Connection,
        path: &Path,
        every: Duration,
        bell: watch::Sender<u64>,
    ) -> Result<Self> {
        let every = every.max(Duration::from_millis(1));
        let events = FileEvents::watch(path);
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
                run(&conn, baseline, every, events, &bell, &stopped);
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
    // Cached: the watcher asks on every file event.
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}

fn run(
    conn: &Connection,
    baseline: i64,
    every: Duration,
    mut events: Option<FileEvents>,
    bell: &watch::Sender<u64>,
    stopped: &mpsc::Receiver<()>,
) {
    let mut last = baseline;
    let mut failing = false;
    let mut recheck = false;
    loop {
        let mut event = false;
        match events.as_mut() {
            Some(ev) => {
                match ev.wait(if recheck { RECHECK } else { FALLBACK }) {
                    Some(e) => event = e,
                    None => {
                        tracing::warn!(
                            "SQLite file events failed; polling the change counter instead"
                        );
                        events = None;
                    }
                }
                match stopped.try_recv() {
                    Err(TryRecvError::Empty) => {}
                    Ok(()) | Err(TryRecvError::Disconnected) => return,
                }
            }
            None => match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            },
        }
        match data_version(conn) {
            Ok(v) => {
                if failing {
                    tracing::info!("SQLite change watcher recovered");
                    failing = false;
                }
                // A write seen with no commit visible yet: look once more shortly.
                recheck = event && v == last;
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

/// Writes to the database's files, as inotify reports them (Linux).
#[cfg(target_os = "linux")]
pub(crate) struct FileEvents {
    inotify: nix::sys::inotify::Inotify,
}

#[cfg(target_os = "linux")]
impl FileEvents {
    /// Watches the directory of `path` for writes (to the database, its `-wal`, ...);
    /// `None` when inotify cannot be set up (the watcher then polls).
    fn watch(path: &Path) -> Option<FileEvents> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        path.file_name()?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| tracing::debug!(error = %e, "no inotify; polling the change counter"))
            .ok()?;
        inotify
            .add_watch(
                &dir,
                AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(|e| tracing::debug!(error = %e, dir = %dir.display(), "cannot watch the database's directory; polling the change counter"))
            .ok()?;
        Some(FileEvents { inotify })
    }

    /// Waits until a file of the database's directory is written or `timeout` passes,
    /// then drains the pending events: `Some(true)` when there were any, `Some(false)`
    /// on a timeout, `None` when waiting failed for good.
    fn wait(&mut self, timeout: Duration) -> Option<bool> {
        use nix::errno::Errno;
        use nix::poll::{poll, PollFd, PollFlags};
        use std::os::fd::AsFd;
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
        let mut any = false;
        loop {
            match self.inotify.read_events() {
                // Writes to other files of the directory only cost a read of the
                // change counter: nothing to filter for correctness.
                Ok(events) if events.is_empty() => return Some(any),
                Ok(_) => any = true,
                Err(Errno::EAGAIN) => return Some(any),
                Err(Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
    }
}

/// No file events off Linux: the watcher polls.
#[cfg(not(target_os = "linux"))]
pub(crate) struct FileEvents;

#[cfg(not(target_os = "linux"))]
impl FileEvents {
    fn watch(_path: &Path) -> Option<FileEvents> {
        None
    }

    fn wait(&mut self, _timeout: Duration) -> Option<bool> {
        None
    }
}
