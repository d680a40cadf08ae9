//! The server's folds of the ledger, each read forward from its own cursor when a
//! request needs it (plan 0055): a request costs the rows appended since the last one,
//! not a read of the whole ledger.
//!
//! - [`LedgerFold`]: every room (`room list`), rows per room and verb, skipped rows and
//!   the relays' heartbeats, for `/`, `/api/rooms`, the room checks and `/metrics`;
//! - [`RoomFold`]: one room's [`RoomState`] (the task DAG, board, config, relays and
//!   patterns the CLI's views are built from, by the same functions) and its newest
//!   rows for the timeline. Made only for rooms that exist.
//!
//! Each sits behind an async mutex, so requests for the same room take turns catching
//! it up; claims, liveness leases and the database clock are not in the ledger and are
//! read per request.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use huddle_core::{Fold, Interaction, Position};
use huddle_store::Store;
use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

use super::ApiError;
use crate::ledger_cmds::RoomRows;
use crate::state_cmds::RoomState;

/// Rows read per step of a catch-up.
const STEP: usize = 5000;
/// Rows of a room kept for its timeline (the newest).
pub(crate) const TIMELINE_ROWS: usize = 300;

/// The whole ledger, folded forward.
pub(crate) struct LedgerFold {
    cursor: Position,
    /// Every room: owner, rows, last activity.
    pub rooms: RoomRows,
    /// Verified rows by room and verb.
    pub verbs: BTreeMap<(String, &'static str), u64>,
    /// Rows that failed verification.
    pub skipped: u64,
    /// Each relay's latest heartbeat in each room.
    pub relays: huddle_core::relays::RelayFold,
}

/// One room, folded forward.
pub(crate) struct RoomFold {
    cursor: Position,
    /// What the views are built from.
    pub state: RoomState,
    /// The room's newest rows (every verified row, admitted or not), oldest first.
    pub recent: VecDeque<Interaction>,
}

impl RoomFold {
    fn new(room: &str) -> RoomFold {
        RoomFold {
            cursor: Position::START,
            state: RoomState::new(room),
            recent: VecDeque::new(),
        }
    }

    /// The cursor after the last row folded: the end of the room as of the last
    /// catch-up.
    pub fn cursor(&self) -> Position {
        self.cursor
    }
}

/// The server's folds.
pub(crate) struct Folds {
    ledger: Mutex<LedgerFold>,
    rooms: std::sync::Mutex<HashMap<String, Arc<Mutex<RoomFold>>>>,
    /// Rows (and skipped rows) the folds have read from the database.
    rows_read: AtomicU64,
}

impl Default for Folds {
    fn default() -> Self {
        Folds {
            ledger: Mutex::new(LedgerFold {
                cursor: Position::START,
                rooms: RoomRows::default(),
                verbs: BTreeMap::new(),
                skipped: 0,
                relays: huddle_core::relays::RelayFold::new(),
            }),
            rooms: Default::default(),
            rows_read: AtomicU64::new(0),
        }
    }
}

/// A caught-up fold of a room, locked.
pub(crate) type RoomGuard = OwnedMutexGuard<RoomFold>;

fn read_failed(e: huddle_store::StoreError) -> ApiError {
    ApiError::from_build(e.into())
}

impl Folds {
    /// Rows the folds have read so far (`huddle_fold_rows_read_total`).
    pub fn rows_read(&self) -> u64 {
        self.rows_read.load(Ordering::Relaxed)
    }

    /// The ledger fold, caught up with everything committed now.
    pub async fn ledger(&self, store: &dyn Store) -> Result<MutexGuard<'_, LedgerFold>, ApiError> {
        let mut guard = self.ledger.lock().await;
        let fold = &mut *guard;
        loop {
            let batch = store
                .read_forward(fold.cursor, STEP)
                .await
                .map_err(read_failed)?;
            self.rows_read.fetch_add(
                (batch.rows.len() + batch.skipped.len()) as u64,
                Ordering::Relaxed,
            );
            fold.skipped += batch.skipped.len() as u64;
            for row in &batch.rows {
                fold.rooms.apply(row);
                *fold
                    .verbs
                    .entry((row.room.clone(), row.verb.as_str()))
                    .or_default() += 1;
                fold.relays.apply(row);
            }
            if batch.next == fold.cursor {
                break;
            }
            fold.cursor = batch.next;
        }
        Ok(guard)
    }

    /// Room `room`'s fold, caught up with everything committed now. Call it only for
    /// a room that exists (checked with the ledger fold), so names from requests do
    /// not make folds.
    pub async fn room(&self, store: &dyn Store, room: &str) -> Result<RoomGuard, ApiError> {
        let slot = {
            let mut rooms = self
                .rooms
                .lock()
                .map_err(|_| ApiError::Unavailable("the room folds are poisoned".into()))?;
            rooms
                .entry(room.to_string())
                .or_insert_with(|| Arc::new(Mutex::new(RoomFold::new(room))))
                .clone()
        };
        let mut guard = slot.lock_owned().await;
        let fold = &mut *guard;
        loop {
            let batch = store
                .read_room(room, fold.cursor, STEP)
                .await
                .map_err(read_failed)?;
            self.rows_read.fetch_add(
                (batch.rows.len() + batch.skipped.len()) as u64,
                Ordering::Relaxed,
            );
            fold.state.fold(&batch.rows);
            for row in batch.rows {
                if fold.recent.len() == TIMELINE_ROWS {
                    fold.recent.pop_front();
                }
                fold.recent.push_back(row);
            }
            if batch.next == fold.cursor {
                break;
            }
            fold.cursor = batch.next;
        }
        Ok(guard)
    }
}
