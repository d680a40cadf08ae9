//! Subscriptions: a stream of "new rows after the cursor" that survives reconnects.
//!
//! NOTIFY (or SQLite's change counter) is only a doorbell. A subscription always reads
//! forward from its cursor: after a wake, after an error, and on a slow fallback poll,
//! so a lost doorbell delays a row but never loses it.

use std::sync::Arc;
use std::time::Duration;

use huddle_core::Position;

use crate::error::Result;
use crate::traits::{Doorbell, Ledger, ReadBatch};

/// Reads forward from a cursor, waiting on the doorbell between reads.
pub struct Subscription {
    ledger: Arc<dyn Ledger>,
    cursor: Position,
    bell: Doorbell,
    poll: Duration,
    batch: usize,
}

impl Subscription {
    /// A subscription that yields rows after `after`, `batch` at most per step.
    pub fn new(ledger: Arc<dyn Ledger>, after: Position, batch: usize) -> Self {
        let bell = ledger.doorbell();
        let poll = ledger.poll_interval();
        Subscription {
            ledger,
            cursor: after,
            bell,
            poll,
            batch: batch.max(1),
        }
    }

    /// The cursor: every row at or before it has been returned.
    pub fn cursor(&self) -> Position {
        self.cursor
    }

    /// Reads forward once without waiting (may be empty).
    pub async fn poll_once(&mut self) -> Result<ReadBatch> {
        // Mark the bell seen *before* reading, so a ring during the read is not lost.
        self.bell.borrow_and_update();
        let batch = self.ledger.read_forward(self.cursor, self.batch).await?;
        self.cursor = batch.next;
        Ok(batch)
    }

    /// Waits until at least one new row (or skipped row) is readable and returns it.
    /// An error leaves the cursor where it was; calling again resumes.
    pub async fn next(&mut self) -> Result<ReadBatch> {
        loop {
            let batch = self.poll_once().await?;
            if !batch.rows.is_empty() || !batch.skipped.is_empty() {
                return Ok(batch);
            }
            tokio::select! {
                changed = self.bell.changed() => {
                    if changed.is_err() {
                        // The store's bell is gone: fall back to polling only.
                        tokio::time::sleep(self.poll).await;
                    }
                }
                _ = tokio::time::sleep(self.poll) => {}
            }
        }
    }
}
