//! [`crate::Claims::acquire_resources`] on SQLite: one `BEGIN IMMEDIATE` transaction
//! (SQLite's single writer lock is the room's lock) reads the room's live resource
//! claims by SQLite's clock, applies core's rule, and upserts every wanted claim in
//! the global order, or changes nothing.

use std::time::Duration;

use huddle_core::resources::{blockers, resource_key, room_prefix, Wanted};
use rusqlite::{params, Connection, OptionalExtension};

use super::claims::{claim_state, corrupt, ttl_us, ACQUIRE};
use super::conn::now_us;
use crate::error::{Result, StoreError};
use crate::prefix_upper_bound;
use crate::resources::{holding, won_holding, ResourcesAcquired};
use crate::traits::{ClaimRow, ClaimState};

/// The room's live, open resource claims (`?1` the prefix, `?2` its upper bound).
const LIVE: &str = concat!(
    "SELECT key, holder, epoch, expires_at FROM external_claim ",
    "WHERE key >= ?1 AND key < ?2 AND substr(key, 1, length(?1)) = ?1 ",
    "AND closed_by IS NULL AND expires_at > ",
    now_us!(),
    " ORDER BY key"
);

/// Gives back the holder's live holding of a resource in another mode.
const EXPIRE: &str = concat!(
    "UPDATE external_claim SET expires_at = ",
    now_us!(),
    " WHERE key = ?1 AND holder = ?2 AND expires_at > ",
    now_us!()
);

/// Takes `wanted` (already checked and in the global order) inside the caller's write
/// transaction: SQLite's one write lock is the room's lock.
pub(crate) fn acquire_in(
    tx: &Connection,
    room: &str,
    holder: &str,
    wanted: &[Wanted],
    ttl: Duration,
) -> Result<ResourcesAcquired> {
    let prefix = room_prefix(room);
    let upper = prefix_upper_bound(&prefix).ok_or_else(|| {
        StoreError::Backend(format!("no key range for the resources of room {room:?}"))
    })?;
    let live = {
        let mut stmt = tx.prepare_cached(LIVE)?;
        let mut rows = stmt.query(params![prefix, upper])?;
        let mut live = Vec::new();
        while let Some(row) = rows.next()? {
            let state = claim_state(row)?.map_err(|r| corrupt(&prefix, r))?;
            match holding(&ClaimRow {
                state,
                live: true,
                driver: None,
            }) {
                Some(h) => live.push(h),
                None => tracing::warn!(room, "a resource claim key of a foreign shape is ignored"),
            }
        }
        live
    };
    let blocked = blockers(holder, wanted, &live);
    if !blocked.is_empty() {
        return Ok(ResourcesAcquired::Blocked(blocked));
    }
    let mut won = Vec::with_capacity(wanted.len());
    for w in wanted {
        for other in live
            .iter()
            .filter(|h| h.holder == holder && h.name == w.name && h.mode != w.mode)
        {
            tx.prepare_cached(EXPIRE)?
                .execute(params![other.key, holder])?;
        }
        let key = resource_key(room, holder, w.mode, &w.name);
        let state: Option<ClaimState> = tx
            .prepare_cached(ACQUIRE)?
            .query_row(
                params![key, holder, ttl_us(ttl), None::<String>],
                claim_state,
            )
            .optional()?
            .map(|s| s.map_err(|r| corrupt(&key, r)))
            .transpose()?;
        let Some(state) = state else {
            // Only this holder's own claim can live under its key: a closed one
            // (written around the store) is the one way here.
            return Err(StoreError::Backend(format!(
                "resource claim {key:?} is closed and cannot be taken"
            )));
        };
        won.push(won_holding(holder, &w.name, w.mode, state));
    }
    Ok(ResourcesAcquired::Won(won))
}
