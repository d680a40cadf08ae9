//! The writer thread: every write of a file store runs here, on the store's one writer
//! connection, and writes that arrive together share one transaction (group commit).
//!
//! ```text
//!   append / acquire / renew / ... ──job──> queue ──> writer thread
//!                                                      BEGIN IMMEDIATE
//!                                                        SAVEPOINT; job 1; RELEASE (or ROLLBACK TO)
//!                                                        SAVEPOINT; job 2; RELEASE (or ROLLBACK TO)
//!                                                        ...
//!                                                      COMMIT ──> each job answered, doorbell and bell file rung
//!                                                      log past 1,000 frames: wake the checkpointer ──> checkpointer thread
//!                                                      (past 4,000: checkpoint here)                     PASSIVE checkpoint
//! ```
//!
//! Each job keeps its own all-or-nothing: it runs inside a savepoint, and a job that
//! fails (a fence that does not hold, a trigger's refusal) is rolled back to it while
//! the others go on. A job alone in its group runs without one: the transaction is
//! its all-or-nothing, rolled back whole when it fails. Savepoint journals are kept in
//! memory (`temp_store = MEMORY`), not in a temporary file. A job's answer is sent only after the commit, so nobody acts on a
//! write that is not durable; when the commit fails, every job of the group is answered
//! with that error (the callers' retries are idempotent). SQLite has one writer at a
//! time anyway: this turns N commits of writers arriving together into one, and spares
//! each write a hop through tokio's blocking pool. The log is checkpointed outside any
//! `COMMIT` (which every job of the group would wait for, plan 0068), by a
//! checkpointer thread on a connection of its own, while the writer goes on with the
//! next groups (plan 0077); only a log that keeps growing under a steady stream of
//! writes is checkpointed by the writer itself, between two groups.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use rusqlite::Connection;
use tokio::sync::{oneshot, watch};

use super::watcher::BellFile;
use crate::error::{Result, StoreError};

/// Most jobs one transaction takes (the rest wait for the next).
const MAX_GROUP: usize = 64;

/// A write waiting for the writer thread.
pub(crate) trait Job: Send {
    /// Runs the write inside the group's transaction (its own savepoint is the
    /// thread's business) and keeps its outcome until the commit.
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Ran>;
    /// The group could not start (no write lock): answer with this error.
    fn fail(self: Box<Self>, e: StoreError);
}

/// A job that ran, waiting for its group's commit.
pub(crate) trait Ran: Send {
    /// Whether it failed (it was rolled back to its savepoint).
    fn failed(&self) -> bool;
    /// Whether the doorbell should ring once the group is committed.
    fn rings(&self) -> bool;
    /// Answers the caller: its outcome when the group committed, else the commit's
    /// error.
    fn finish(self: Box<Self>, committed: std::result::Result<(), String>);
}

/// A job from a closure: `f` runs on the writer connection inside the transaction;
/// `rings` says whether its answer calls for the doorbell.
pub(crate) struct ClosureJob<T, F> {
    f: F,
    rings: fn(&T) -> bool,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> ClosureJob<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    /// A job and the receiver of its answer.
    pub(crate) fn queued(
        f: F,
        rings: fn(&T) -> bool,
    ) -> (Box<dyn Job>, oneshot::Receiver<Result<T>>) {
        let (reply, rx) = oneshot::channel();
        (Box::new(ClosureJob { f, rings, reply }), rx)
    }
}

struct RanJob<T> {
    outcome: Result<T>,
    rings: bool,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> Job for ClosureJob<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Ran> {
        let outcome = (self.f)(conn);
        let rings = outcome.as_ref().is_ok_and(|t| (self.rings)(t));
        Box::new(RanJob {
            outcome,
            rings,
            reply: self.reply,
        })
    }

    fn fail(self: Box<Self>, e: StoreError) {
        let _ = self.reply.send(Err(e));
    }
}

impl<T: Send + 'static> Ran for RanJob<T> {
    fn failed(&self) -> bool {
        self.outcome.is_err()
    }

    fn rings(&self) -> bool {
        self.rings
    }

    fn finish(self: Box<Self>, committed: std::result::Result<(), String>) {
        let answer = match (committed, self.outcome) {
            (Ok(()), outcome) => outcome,
            // Its own refusal stands; a write that did not commit is unavailable.
            (Err(_), Err(e)) => Err(e),
            (Err(why), Ok(_)) => Err(StoreError::Unavailable(format!(
                "the transaction holding this write did not commit: {why}"
            ))),
        };
        let _ = self.reply.send(answer);
    }
}

/// The writer thread of one store. Dropping it (with the store) closes the queue; the
/// thread finishes the jobs it has and exits.
pub(crate) struct Writer {
    queue: mpsc::Sender<Box<dyn Job>>,
}

impl Writer {
    /// Starts the thread on `conn`, ringing `bell` after commits that call for it,
    /// and its checkpointer on `checkpoints` (a second connection to the same file).
    /// `file` is the database's bell file, rung for the other processes' watchers.
    pub(crate) fn spawn(
        conn: Connection,
        checkpoints: Connection,
        bell: watch::Sender<u64>,
        file: BellFile,
    ) -> Result<Writer> {
        let (queue, jobs) = mpsc::channel::<Box<dyn Job>>();
        let checkpointer = Checkpointer::spawn(checkpoints)?;
        thread::Builder::new()
            .name("huddle-sqlite-writer".into())
            .spawn(move || run(conn, checkpointer, jobs, bell, file))
            .map_err(|e| StoreError::Backend(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Writer { queue })
    }

    /// Queues a job. `false` when the thread is gone.
    pub(crate) fn send(&self, job: Box<dyn Job>) -> std::result::Result<(), Box<dyn Job>> {
        self.queue.send(job).map_err(|e| e.0)
    }
}

/// Runs one statement of a group's frame (begin, savepoint, release, commit) from the
/// connection's statement cache: they run for every group and every job, and are
/// parsed once.
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Log frames (pages) past which the checkpointer is woken to copy the log into the
/// database: SQLite's own automatic threshold.
const CHECKPOINT_FRAMES: i32 = 1000;

/// A log this many frames long is checkpointed by the writer itself, between two
/// groups: under a steady stream of writes the checkpointer never finishes before the
/// next commit, and SQLite restarts the log only when a write transaction begins with
/// every frame copied.
const CHECKPOINT_FRAMES_HARD: i32 = 4 * CHECKPOINT_FRAMES;

/// Takes over SQLite's automatic checkpoint on the writer connection: it would run
/// inside `COMMIT`, before the group's jobs are answered, copying up to a thousand
/// pages while every caller waits. The hook only notes the log's length after each
/// commit; [`Checkpointer::after_commit`] decides who checkpoints.
fn note_log_length(conn: &mut Connection) -> Arc<AtomicI32> {
    let frames = Arc::new(AtomicI32::new(0));
    let noted = Arc::clone(&frames);
    let hooked = conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages| {
        noted.store(pages, Ordering::Relaxed);
        Ok(())
    }));
    if let Err(e) = hooked {
        // SQLite keeps checkpointing inside commits, as before.
        tracing::warn!(error = %e, "cannot take over SQLite's automatic checkpoint");
    }
    frames
}

/// Copies as much of the log into the database as no reader still needs.
fn checkpoint(conn: &Connection) {
    if let Err(e) = conn.wal_checkpoint_v2(
        Some(rusqlite::MAIN_DB),
        rusqlite::wal::CheckpointMode::PASSIVE,
    ) {
        // Another process is checkpointing, or a reader still needs the log: tried
        // again after a later commit.
        tracing::debug!(error = %e, "SQLite checkpoint did not run");
    }
}

/// The checkpointer: a thread with a connection of its own that copies the log into
/// the database whenever the writer wakes it, while the writer goes on with the next
/// groups (a passive checkpoint takes no write lock). It ends when the writer thread
/// does (its end of the channel is dropped).
struct Checkpointer {
    /// One pending wake-up at most: wakes while it is busy are coalesced.
    wake: mpsc::SyncSender<()>,
    /// Held through every checkpoint of this store, the writer's too: SQLite answers
    /// a second checkpoint of the same file with `SQLITE_BUSY` instead of waiting, and
    /// the writer's must not be skipped.
    running: Arc<Mutex<()>>,
}

impl Checkpointer {
    fn spawn(conn: Connection) -> Result<Checkpointer> {
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let running = Arc::new(Mutex::new(()));
        let held = Arc::clone(&running);
        thread::Builder::new()
            .name("huddle-sqlite-checkpointer".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    let _running = held.lock().unwrap_or_else(|p| p.into_inner());
                    checkpoint(&conn);
                }
            })
            .map_err(|e| {
                StoreError::Backend(format!("cannot start the SQLite checkpointer: {e}"))
            })?;
        Ok(Checkpointer { wake, running })
    }

    /// After each group: a log past [`CHECKPOINT_FRAMES`] wakes the checkpointer; one
    /// past [`CHECKPOINT_FRAMES_HARD`] is checkpointed on the writer's connection
    /// before the next group begins (after the checkpointer's run, if one is under
    /// way), so that the log can restart from its beginning (plan 0077).
    fn after_commit(&self, conn: &Connection, frames: &AtomicI32) {
        let logged = frames.load(Ordering::Relaxed);
        if logged >= CHECKPOINT_FRAMES_HARD {
            frames.store(0, Ordering::Relaxed);
            let _running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            checkpoint(conn);
        } else if logged >= CHECKPOINT_FRAMES {
            let _ = self.wake.try_send(());
        }
    }
}

fn run(
    mut conn: Connection,
    checkpointer: Checkpointer,
    jobs: mpsc::Receiver<Box<dyn Job>>,
    bell: watch::Sender<u64>,
    mut file: BellFile,
) {
    let frames = note_log_length(&mut conn);
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        if let Err(e) = exec_cached(&conn, "BEGIN IMMEDIATE") {
            // Busy or locked past the busy timeout (retryable), or worse.
            let e = StoreError::from(e);
            for j in group {
                j.fail(again(&e));
            }
            continue;
        }
        // A job alone in its group needs no savepoint: the transaction is its
        // all-or-nothing (rolled back whole when it fails).
        let alone = group.len() == 1;
        let mut ran: Vec<Box<dyn Ran>> = Vec::with_capacity(group.len());
        let mut broken: Option<String> = None;
        for j in group {
            if let Some(why) = &broken {
                j.fail(StoreError::Unavailable(why.clone()));
                continue;
            }
            if !alone {
                if let Err(e) = exec_cached(&conn, "SAVEPOINT huddle_job") {
                    broken = Some(e.to_string());
                    j.fail(StoreError::Unavailable(e.to_string()));
                    continue;
                }
            }
            let done = j.run(&conn);
            let undo = match (alone, done.failed()) {
                (true, _) => Ok(()),
                (false, true) => conn.execute_batch("ROLLBACK TO huddle_job; RELEASE huddle_job"),
                (false, false) => exec_cached(&conn, "RELEASE huddle_job"),
            };
            if let Err(e) = undo {
                broken = Some(e.to_string());
            }
            ran.push(done);
        }
        let committed = match &broken {
            Some(why) => Err(why.clone()),
            // The one job failed: nothing to keep; it answers with its own error.
            None if alone && ran.iter().all(|r| r.failed()) => {
                exec_cached(&conn, "ROLLBACK").map_err(|e| e.to_string())
            }
            None => exec_cached(&conn, "COMMIT").map_err(|e| e.to_string()),
        };
        if committed.is_err() {
            // Nothing of the group is kept; the connection is ready for the next.
            let _ = conn.execute_batch("ROLLBACK");
        }
        let ring = committed.is_ok() && ran.iter().any(|r| r.rings());
        if ring {
            bell.send_modify(|n| *n = n.wrapping_add(1));
            file.ring();
        }
        for r in ran {
            r.finish(committed.clone());
        }
        checkpointer.after_commit(&conn, &frames);
    }
}

/// The same error again, for the next job of a group that could not start.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        other => StoreError::Backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    use super::*;

    /// A writer on a file of its own with a table `t (job)`, counting its commits.
    fn writer(dir: &std::path::Path) -> (Writer, Arc<AtomicUsize>) {
        let path = dir.join("w.db");
        let mut conn = Connection::open(&path).expect("open");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (job INTEGER NOT NULL)")
            .expect("schema");
        let commits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&commits);
        conn.commit_hook(Some(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            false
        }))
        .expect("hook");
        let (bell, _) = watch::channel(0);
        let checkpoints = Connection::open(&path).expect("open");
        let w = Writer::spawn(conn, checkpoints, bell, BellFile::new(&path)).expect("spawn");
        (w, commits)
    }

    /// Queues a job inserting `rows` rows numbered `job` (failing after its inserts
    /// when `fails`); returns its answer.
    fn insert(w: &Writer, job: i64, rows: usize, fails: bool) -> oneshot::Receiver<Result<()>> {
        let (j, answer) = ClosureJob::queued(
            move |conn: &Connection| {
                for _ in 0..rows {
                    conn.execute("INSERT INTO t (job) VALUES (?1)", [job])?;
                }
                if fails {
                    return Err(StoreError::Backend(format!("job {job} refused")));
                }
                Ok(())
            },
            |_| false,
        );
        assert!(w.send(j).is_ok(), "writer stopped");
        answer
    }

    /// Jobs queued together share one transaction (one commit), each in a savepoint
    /// of its own: a job that fails after writing is rolled back alone, its
    /// neighbours' rows stay, and the rows are in queue order; a job alone in its
    /// group that fails leaves nothing and commits nothing.
    #[tokio::test]
    async fn jobs_queued_together_share_a_commit_and_fail_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (w, commits) = writer(dir.path());
        // Holds the thread so the next jobs are all queued when it looks.
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().expect("lock");
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let g = Arc::clone(&gate);
        let (j, first) = ClosureJob::queued(
            move |_: &Connection| {
                let _ = entered_tx.send(());
                drop(g.lock());
                Ok(())
            },
            |_| false,
        );
        assert!(w.send(j).is_ok());
        entered
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer took the first job");
        let answers = vec![
            insert(&w, 1, 1, false),
            insert(&w, 2, 3, true),
            insert(&w, 3, 40, false),
            insert(&w, 4, 2, true),
            insert(&w, 5, 2, false),
        ];
        drop(held);
        first.await.expect("answer").expect("first job");
        let mut outcomes = Vec::new();
        for a in answers {
            outcomes.push(a.await.expect("answer").is_ok());
        }
        assert_eq!(outcomes, [true, false, true, false, true]);
        // The gate's job, then the five queued behind it in one transaction.
        assert_eq!(commits.load(Ordering::Relaxed), 2);
        // Alone in its group, a failing job is rolled back whole: no commit.
        insert(&w, 6, 5, true)
            .await
            .expect("answer")
            .expect_err("job 6 fails");
        assert_eq!(commits.load(Ordering::Relaxed), 2);
        let conn = Connection::open(dir.path().join("w.db")).expect("open");
        let jobs: Vec<i64> = conn
            .prepare("SELECT job FROM t ORDER BY rowid")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows");
        let mut expected = vec![1];
        expected.extend(std::iter::repeat_n(3, 40));
        expected.extend([5, 5]);
        assert_eq!(jobs, expected);
    }
}
