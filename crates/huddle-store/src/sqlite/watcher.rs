//! The change watcher: a background thread that notices commits made by other
//! connections (other stores, other processes) and rings the doorbell.
//!
//! `PRAGMA data_version` on a connection changes whenever *another* connection has
//! committed to the database file. The watcher's connection never writes, so every
//! change it sees is someone's commit (including this store's own writer; the extra
//! ring is harmless: a doorbell is a hint, never a record).
//!
//! When it is read: on Linux, whenever the database's **bell file** (`<db>-bell`,
//! [`BELL_SUFFIX`]) is closed after writing — every store's writer thread opens and
//! closes it after a commit that appended rows ([`BellFile::ring`]), so a commit in
//! another process wakes the thread at once, once per commit, and an idle store costs
//! nothing; an event that shows no commit yet is looked at again [`RECHECK`] later —
//! and at least every [`FALLBACK`], which also catches commits that ring no bell
//! (claims, programs that are not huddle). When the bell file cannot be created or
//! watched, the thread waits on writes to the database's directory instead (every page
//! a commit writes to the log is an event: plan 0064). Elsewhere, or when inotify
//! cannot be set up, every `every` (the store's `sqlite_change_poll`).

use std::path::{Path, PathBuf};
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

/// What a SQLite database's bell file is called: the database's path with this
/// appended (beside SQLite's own `-wal` and `-shm`). It stays empty; only its events
/// matter.
pub const BELL_SUFFIX: &str = "-bell";

/// The bell file of the database at `db`.
pub(crate) fn bell_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(BELL_SUFFIX);
    PathBuf::from(p)
}

/// A database's bell file as its writer thread rings it: after each commit that
/// appended rows, the file is opened for writing and closed again, which raises one
/// close-after-write event for every watcher of the database, in this process or
/// another. Opened and closed, never written: a write would update the file's times
/// on every commit.
pub(crate) struct BellFile {
    path: PathBuf,
    /// Whether the last ring failed (said once per streak).
    failing: bool,
}

impl BellFile {
    /// The bell of the database at `db`.
    pub(crate) fn new(db: &Path) -> BellFile {
        BellFile {
            path: bell_path(db),
            failing: false,
        }
    }

    /// Rings the bell (on Linux; elsewhere watchers poll and nothing listens).
    pub(crate) fn ring(&mut self) {
        if !cfg!(target_os = "linux") {
            return;
        }
        match open_bell(&self.path) {
            Ok(()) if self.failing => {
                tracing::info!(path = %self.path.display(), "SQLite bell file rings again");
                self.failing = false;
            }
            Ok(()) => {}
            Err(e) if !self.failing => {
                tracing::warn!(
                    path = %self.path.display(),
                    error = %e,
                    "cannot ring the SQLite bell file; other processes see this store's commits \
                     on their fallback read (within 100 ms)"
                );
                self.failing = true;
            }
            Err(_) => {}
        }
    }
}

/// Opens `path` for writing (creating it when missing) and closes it.
fn open_bell(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
}

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

/// Commits to the database, as inotify reports them (Linux): close-after-write events
/// of its bell file or, when the bell cannot be watched, writes to its directory.
#[cfg(target_os = "linux")]
pub(crate) struct FileEvents {
    inotify: nix::sys::inotify::Inotify,
    /// The bell file and its watch, while the bell is what is watched.
    bell: Option<(PathBuf, nix::sys::inotify::WatchDescriptor)>,
    /// The database's directory (watched when the bell cannot be).
    dir: PathBuf,
    /// The database file.
    db: PathBuf,
    /// The bell's watch was lost (the file deleted or moved): watch it anew.
    rearm: bool,
}

#[cfg(target_os = "linux")]
impl FileEvents {
    /// Watches the bell file of the database at `path` (else its directory); `None`
    /// when inotify cannot be set up (the watcher then polls).
    pub(crate) fn watch(path: &Path) -> Option<FileEvents> {
        use nix::sys::inotify::{InitFlags, Inotify};
        path.file_name()?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| tracing::debug!(error = %e, "no inotify; polling the change counter"))
            .ok()?;
        let mut events = FileEvents {
            inotify,
            bell: None,
            dir,
            db: path.to_path_buf(),
            rearm: false,
        };
        events.arm(&bell_path(path))?;
        Some(events)
    }

    /// Watches the bell file at `bell` (creating it when missing), else the directory;
    /// `None` when neither can be watched.
    fn arm(&mut self, bell: &Path) -> Option<()> {
        use nix::sys::inotify::AddWatchFlags;
        let watched = open_bell(bell).map_err(|e| e.to_string()).and_then(|()| {
            self.inotify
                .add_watch(
                    bell,
                    AddWatchFlags::IN_CLOSE_WRITE
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                )
                .map_err(|e| e.to_string())
        });
        match watched {
            Ok(wd) => {
                self.bell = Some((bell.to_path_buf(), wd));
                return Some(());
            }
            Err(e) => tracing::debug!(
                error = %e,
                bell = %bell.display(),
                "cannot watch the SQLite bell file; watching the database's directory"
            ),
        }
        self.bell = None;
        self.inotify
            .add_watch(
                &self.dir,
                AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(|e| tracing::debug!(error = %e, dir = %self.dir.display(), "cannot watch the database's directory; polling the change counter"))
            .ok()
            .map(drop)
    }

    /// Waits until the bell rings (or the directory is written) or `timeout` passes,
    /// then drains the pending events: `Some(true)` when there were any, `Some(false)`
    /// on a timeout, `None` when waiting failed for good. A bell file that was deleted
    /// or moved away is created and watched again at the start of the next wait.
    pub(crate) fn wait(&mut self, timeout: Duration) -> Option<bool> {
        use nix::errno::Errno;
        use nix::poll::{poll, PollFd, PollFlags};
        use nix::sys::inotify::AddWatchFlags;
        use std::os::fd::AsFd;
        if std::mem::take(&mut self.rearm) {
            if let Some((bell, wd)) = self.bell.take() {
                // Gone already when the file was deleted; still there when it moved.
                let _ = self.inotify.rm_watch(wd);
                // A database removed with its files gets no new bell: the fallback
                // reads cover the rest.
                if self.db.exists() {
                    tracing::debug!(bell = %bell.display(), "the SQLite bell file was deleted or moved; watching it anew");
                    self.arm(&bell)?;
                }
            }
        }
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
        let lost =
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED;
        let mut any = false;
        let mut rearm = false;
        loop {
            match self.inotify.read_events() {
                Ok(events) if events.is_empty() => break,
                Ok(events) => {
                    any = true;
                    // Other files of the directory only cost a read of the change
                    // counter: nothing to filter for correctness.
                    if let Some((_, wd)) = &self.bell {
                        rearm |= events
                            .iter()
                            .any(|e| e.wd == *wd && e.mask.intersects(lost));
                    }
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
        // Watched anew on the next wait, once the caller has seen whether it is
        // stopping (a store dropped with its directory must not leave a new bell).
        self.rearm |= rearm;
        Some(any)
    }

    /// The bell file being watched, if it is.
    #[cfg(test)]
    pub(crate) fn bell(&self) -> Option<&Path> {
        self.bell.as_ref().map(|(p, _)| p.as_path())
    }
}

/// No file events off Linux: the watcher polls.
#[cfg(not(target_os = "linux"))]
pub(crate) struct FileEvents;

#[cfg(not(target_os = "linux"))]
impl FileEvents {
    pub(crate) fn watch(_path: &Path) -> Option<FileEvents> {
        None
    }

    pub(crate) fn wait(&mut self, _timeout: Duration) -> Option<bool> {
        None
    }
}
