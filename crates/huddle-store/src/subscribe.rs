//! Subscriptions: a stream of "new rows after the cursor" that survives reconnects.
//!
//! NOTIFY (or SQLite's change counter) is only a doorbell. A subscription always reads
//! forward from its cursor: after a wake, after an error, and on a slow fallback poll,
//! so a lost doorbell delays a row but never loses it.
//!
//! [`Subscription::next_step`] also says when the reader has caught up, and
//! [`Subscription::spawn`] moves the read-forward into a task of its own, so a
//! caller that waits on several things at once (`tokio::select!`) can never abort or
//! starve a read in flight: it receives finished steps from a channel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::Position;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::error::{Result, StoreError};
use crate::traits::{Doorbell, Ledger, ReadBatch};

/// One step of a subscription: a batch, and whether the reader has caught up with
/// everything committed when the batch was read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadStep {
    /// The rows (and skipped rows) read; may be empty when the step only reports that
    /// the reader caught up.
    pub batch: ReadBatch,
    /// True when the read returned less than a full page: nothing committed at the
    /// time of the read is left unread.
    pub caught_up: bool,
    /// When the read began (this process's monotonic clock): a caught-up step has
    /// read everything committed before that moment.
    pub began: Option<Instant>,
    /// When the doorbell ended the wait before this read (this process's monotonic
    /// clock); `None` when the read followed a fallback poll, a refresh, an error or
    /// another read. `woken.elapsed()` on receipt is the wake latency: doorbell to
    /// rows in hand.
    pub woken: Option<Instant>,
}

/// A request for a fresh step ([`Reader::refresh`]).
#[derive(Default)]
struct Refresh {
    wanted: AtomicBool,
    bell: Notify,
}

/// Reads forward from a cursor, waiting on the doorbell between reads.
pub struct Subscription {
    ledger: Arc<dyn Ledger>,
    /// The rooms read ([`Ledger::read_rooms`]); `None`: every room.
    rooms: Option<Vec<String>>,
    cursor: Position,
    bell: Doorbell,
    poll: Duration,
    batch: usize,
    /// Whether the last step returned reported "caught up".
    reported_caught_up: bool,
    /// Set when spawned: asks for a step even when nothing new was read.
    refresh: Option<Arc<Refresh>>,
    /// When the doorbell last ended a wait, until a step reports it.
    woken: Option<Instant>,
}

impl Subscription {
    /// A subscription that yields rows after `after`, `batch` at most per step.
    pub fn new(ledger: Arc<dyn Ledger>, after: Position, batch: usize) -> Self {
        let bell = ledger.doorbell();
        let poll = ledger.poll_interval();
        Subscription {
            ledger,
            rooms: None,
            cursor: after,
            bell,
            poll,
            batch: batch.max(1),
            reported_caught_up: false,
            refresh: None,
            woken: None,
        }
    }

    /// A subscription that yields only rows of `rooms` after `after` (with
    /// [`Ledger::read_rooms`]), `batch` at most per step: its reads cost what those
    /// rooms hold, whatever the rest of the ledger holds. The doorbell still rings for
    /// every append; a ring for another room costs one read that finds nothing.
    pub fn for_rooms(
        ledger: Arc<dyn Ledger>,
        rooms: Vec<String>,
        after: Position,
        batch: usize,
    ) -> Self {
        let mut sub = Self::new(ledger, after, batch);
        sub.rooms = Some(rooms);
        sub
    }

    /// Rows per read.
    pub fn page(&self) -> usize {
        self.batch
    }

    /// The cursor: every row at or before it has been returned.
    pub fn cursor(&self) -> Position {
        self.cursor
    }

    /// Reads forward once without waiting (may be empty).
    pub async fn poll_once(&mut self) -> Result<ReadBatch> {
        // Mark the bell seen *before* reading, so a ring during the read is not lost.
        self.bell.borrow_and_update();
        let batch = match &self.rooms {
            None => self.ledger.read_forward(self.cursor, self.batch).await?,
            Some(rooms) => {
                self.ledger
                    .read_rooms(rooms, self.cursor, self.batch)
                    .await?
            }
        };
        self.cursor = batch.next;
        Ok(batch)
    }

    /// Waits until at least one new row (or skipped row) is readable and returns it.
    /// An error leaves the cursor where it was; calling again resumes.
    pub async fn next(&mut self) -> Result<ReadBatch> {
        loop {
            let step = self.next_step().await?;
            if !step.batch.rows.is_empty() || !step.batch.skipped.is_empty() {
                return Ok(step.batch);
            }
        }
    }

    /// Waits for the next step: a non-empty batch, or an empty one that reports the
    /// reader caught up after a full page (so a ledger whose unread rows are an exact
    /// multiple of the page still ends in a caught-up step). An error leaves the
    /// cursor where it was; calling again resumes.
    ///
    /// A [`Reader::refresh`] asks for one more step: the next read that finds nothing
    /// new is returned all the same (empty, caught up), so its caller learns that
    /// nothing was committed before that read began.
    pub async fn next_step(&mut self) -> Result<ReadStep> {
        if self.reported_caught_up && !self.refresh_wanted() {
            // The last step read everything committed before its read began, and the
            // bell was marked seen before that read: anything committed since rings
            // it (a row held back behind an older open transaction rings it again
            // shortly, see the Postgres store's re-check). Reading again at once
            // would find nothing but those rings' rows; wait for them instead.
            self.wait().await;
        }
        loop {
            let forced = self
                .refresh
                .as_ref()
                .is_some_and(|r| r.wanted.swap(false, Ordering::SeqCst));
            let began = Instant::now();
            let batch = match self.poll_once().await {
                Ok(batch) => batch,
                Err(e) => {
                    if forced {
                        if let Some(r) = &self.refresh {
                            r.wanted.store(true, Ordering::SeqCst);
                        }
                    }
                    return Err(e);
                }
            };
            let n = batch.rows.len() + batch.skipped.len();
            let caught_up = n < self.batch;
            if n > 0 || (caught_up && (!self.reported_caught_up || forced)) {
                self.reported_caught_up = caught_up;
                return Ok(ReadStep {
                    batch,
                    caught_up,
                    began: Some(began),
                    woken: self.woken.take(),
                });
            }
            // A read that found nothing: the next wake is what counts.
            self.woken = None;
            self.wait().await;
        }
    }

    /// Whether a [`Reader::refresh`] is waiting for its step (left set).
    fn refresh_wanted(&self) -> bool {
        self.refresh
            .as_ref()
            .is_some_and(|r| r.wanted.load(Ordering::SeqCst))
    }

    /// Waits for the doorbell or the fallback poll interval, whichever comes first.
    async fn wait(&mut self) {
        let refresh = self.refresh.clone();
        let refreshed = async {
            match &refresh {
                Some(r) => r.bell.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = self.bell.changed() => {
                if changed.is_err() {
                    // The store's bell is gone: fall back to polling only.
                    tokio::time::sleep(self.poll).await;
                } else {
                    self.woken = Some(Instant::now());
                }
            }
            _ = refreshed => {}
            _ = tokio::time::sleep(self.poll) => {}
        }
    }

    /// Moves the subscription into a task of its own that reads forward and sends each
    /// [`ReadStep`] (or error) to the returned [`Reader`]. Errors are sent and the read is
    /// retried after `retry`; the task ends when the reader is dropped.
    pub fn spawn(mut self, capacity: usize, retry: Duration) -> Reader {
        let refresh = Arc::new(Refresh::default());
        self.refresh = Some(refresh.clone());
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let task = tokio::spawn(async move {
            loop {
                let step = self.next_step().await;
                let failed = step.is_err();
                if tx.send(step).await.is_err() {
                    return;
                }
                if failed {
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        Reader { rx, task, refresh }
    }
}

/// The receiving end of a [`Subscription::spawn`]ed read-forward.
/// [`Reader::recv`] is cancellation-safe: dropping it loses no step.
pub struct Reader {
    rx: mpsc::Receiver<Result<ReadStep>>,
    task: JoinHandle<()>,
    refresh: Arc<Refresh>,
}

impl Reader {
    /// Asks for a read that begins now and for its step even if it finds nothing new
    /// (an empty, caught-up step), so the caller learns how far its view covers. A
    /// read already waiting for the doorbell starts at once.
    pub fn refresh(&self) {
        self.refresh.wanted.store(true, Ordering::SeqCst);
        self.refresh.bell.notify_one();
    }

    /// The next step, in ledger order.
    pub async fn recv(&mut self) -> Result<ReadStep> {
        match self.rx.recv().await {
            Some(step) => step,
            None => Err(StoreError::Backend("the ledger reader stopped".into())),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use huddle_core::{Interaction, InteractionId, Limits, NewInteraction, Timestamp};

    use super::*;
    use crate::memory::MemoryStore;
    use crate::traits::{Appended, Fence};
    use crate::StoreOptions;

    /// A memory ledger that counts its reads and never polls by itself.
    struct Counting {
        inner: MemoryStore,
        reads: AtomicUsize,
    }

    #[async_trait]
    impl Ledger for Counting {
        fn limits(&self) -> &Limits {
            self.inner.limits()
        }
        async fn append(&self, batch: Vec<NewInteraction>) -> Result<Vec<Appended>> {
            self.inner.append(batch).await
        }
        async fn append_under(
            &self,
            fences: &[Fence],
            close: bool,
            batch: Vec<NewInteraction>,
        ) -> Result<Vec<Appended>> {
            self.inner.append_under(fences, close, batch).await
        }
        async fn read_forward(&self, after: Position, limit: usize) -> Result<ReadBatch> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.read_forward(after, limit).await
        }

        async fn read_room_rows(
            &self,
            room: &str,
            after: Position,
            limit: usize,
        ) -> Result<ReadBatch> {
            self.inner.read_room_rows(room, after, limit).await
        }
        async fn get(&self, id: InteractionId) -> Result<Option<Interaction>> {
            self.inner.get(id).await
        }
        fn doorbell(&self) -> Doorbell {
            self.inner.doorbell()
        }
        async fn now(&self) -> Result<Timestamp> {
            self.inner.now().await
        }
        fn poll_interval(&self) -> Duration {
            Duration::from_secs(3600)
        }
    }

    fn row(text: &str) -> NewInteraction {
        NewInteraction::new(
            "lobby",
            huddle_core::Verb::MessagePosted,
            "ana",
            huddle_core::Role::Human,
            serde_json::json!({ "text": text }),
        )
    }

    async fn step(sub: &mut Subscription) -> ReadStep {
        tokio::time::timeout(Duration::from_secs(10), sub.next_step())
            .await
            .expect("a step in time")
            .expect("read")
    }

    /// A full page is followed by a read at once; a read that caught up is followed
    /// by the next only once the bell rings (a row committed meanwhile rings it), not
    /// by a read that would find nothing. The clock is paused: the idle window below
    /// ends only when every task is waiting, so a read made at once would come first.
    #[tokio::test(start_paused = true)]
    async fn a_caught_up_reader_reads_again_only_when_the_bell_rings() {
        let ledger = Arc::new(Counting {
            inner: MemoryStore::new(StoreOptions::default()),
            reads: AtomicUsize::new(0),
        });
        let reads = || ledger.reads.load(Ordering::SeqCst);
        for t in ["a", "b", "c"] {
            ledger.append(vec![row(t)]).await.expect("append");
        }
        let mut sub = Subscription::new(ledger.clone(), Position::START, 2);
        let full = step(&mut sub).await;
        assert_eq!((full.batch.rows.len(), full.caught_up), (2, false));
        let rest = step(&mut sub).await;
        assert_eq!((rest.batch.rows.len(), rest.caught_up), (1, true));
        assert_eq!(reads(), 2, "a full page is followed by a read at once");

        // Caught up, nothing new, no bell: no read at all.
        let idle = tokio::time::timeout(Duration::from_millis(300), sub.next_step()).await;
        assert!(idle.is_err(), "an idle reader returns nothing: {idle:?}");
        assert_eq!(
            reads(),
            2,
            "a caught-up reader does not read before the bell"
        );

        // A row appended while nobody waits rings the bell all the same: the next
        // step reads it with one read.
        ledger.append(vec![row("d")]).await.expect("append");
        let next = step(&mut sub).await;
        assert_eq!(next.batch.rows.len(), 1);
        assert_eq!(next.batch.rows[0].body["text"], "d");
        assert!(next.caught_up && next.woken.is_some(), "{next:?}");
        assert_eq!(reads(), 3);
    }
}
