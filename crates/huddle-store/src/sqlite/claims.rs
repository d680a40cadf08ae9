//! The claims' blocking SQL. Every statement judges expiry by the database clock
//! ([`now_us!`]) and every write runs inside `BEGIN IMMEDIATE`, so the row lock is
//! SQLite's single writer lock.

use std::time::Duration;

use huddle_core::{InteractionId, Timestamp};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::conn::now_us;
use crate::error::{Result, StoreError};
use crate::prefix_upper_bound;
use crate::traits::{Acquired, ClaimRequest, ClaimRow, ClaimState, Epoch};

/// The longest lease we store (100 years): keeps `now + ttl` far from integer
/// overflow, which SQLite would silently turn into a float.
const MAX_TTL_US: i64 = 100 * 365 * 24 * 3600 * 1_000_000;

/// One upsert: insert at epoch 1, or take over a row that is expired or already held
/// by the same holder for the same driver (`?4`; none and none count as the same,
/// `IS`). The epoch is kept only when that holder and driver extend an unexpired
/// lease; a new holder or driver, or a re-take after expiry, bumps it. When the row is
/// someone else's live claim (or the same holder's for another driver), or closed, the
/// `WHERE` leaves it alone and nothing is returned.
pub(super) const ACQUIRE: &str = concat!(
    "INSERT INTO external_claim (key, holder, epoch, expires_at, acquired_at, renewed_at, driver) ",
    "VALUES (?1, ?2, 1, ",
    now_us!(),
    " + ?3, ",
    now_us!(),
    ", ",
    now_us!(),
    ", ?4) ON CONFLICT (key) DO UPDATE SET ",
    "epoch = CASE WHEN external_claim.holder = excluded.holder AND external_claim.driver IS excluded.driver AND external_claim.expires_at > ",
    now_us!(),
    " THEN external_claim.epoch ELSE external_claim.epoch + 1 END, ",
    "acquired_at = CASE WHEN external_claim.holder = excluded.holder AND external_claim.driver IS excluded.driver AND external_claim.expires_at > ",
    now_us!(),
    " THEN external_claim.acquired_at ELSE excluded.acquired_at END, ",
    "holder = excluded.holder, driver = excluded.driver, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at ",
    "WHERE external_claim.closed_by IS NULL AND (external_claim.expires_at <= ",
    now_us!(),
    " OR (external_claim.holder = excluded.holder AND external_claim.driver IS excluded.driver)) ",
    "RETURNING key, holder, epoch, expires_at"
);

const RENEW: &str = concat!(
    "UPDATE external_claim SET expires_at = ",
    now_us!(),
    " + ?4, renewed_at = ",
    now_us!(),
    " WHERE key = ?1 AND holder = ?2 AND epoch = ?3 AND closed_by IS NULL AND expires_at > ",
    now_us!(),
    " RETURNING key, holder, epoch, expires_at"
);

const RELEASE: &str = concat!(
    "UPDATE external_claim SET expires_at = ",
    now_us!(),
    " WHERE key = ?1 AND holder = ?2 AND epoch = ?3 AND expires_at > ",
    now_us!()
);

/// Claims by prefix. Released claims stay as rows forever, so the prefix becomes a
/// key range the primary-key index can seek (`?2` is the first string after every
/// key starting with `?1`); the `substr` test keeps the match literal regardless.
const LIST: &str = concat!(
    "SELECT key, holder, epoch, expires_at, expires_at > ",
    now_us!(),
    ", driver FROM external_claim WHERE key >= ?1 AND key < ?2 AND substr(key, 1, length(?1)) = ?1 ",
    "ORDER BY key"
);

/// [`LIST`] for a prefix with no upper bound (empty, or only `char::MAX`).
const LIST_UNBOUNDED: &str = concat!(
    "SELECT key, holder, epoch, expires_at, expires_at > ",
    now_us!(),
    ", driver FROM external_claim WHERE key >= ?1 AND substr(key, 1, length(?1)) = ?1 ",
    "ORDER BY key"
);

/// A lease length in µs, clamped to [`MAX_TTL_US`].
pub(super) fn ttl_us(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros())
        .unwrap_or(i64::MAX)
        .min(MAX_TTL_US)
}

/// Decodes `key, holder, epoch, expires_at` without trusting the column types.
pub(super) fn claim_state(
    row: &Row<'_>,
) -> rusqlite::Result<std::result::Result<ClaimState, String>> {
    let decoded = (|| {
        Ok::<_, rusqlite::Error>(ClaimState {
            key: row.get(0)?,
            holder: row.get(1)?,
            epoch: Epoch(row.get(2)?),
            expires_at: Timestamp(row.get(3)?),
        })
    })();
    Ok(decoded.map_err(|e| format!("corrupt claim row: {e}")))
}

pub(super) fn corrupt(key: &str, reason: String) -> StoreError {
    StoreError::Backend(format!("claim {key:?}: {reason}"))
}

/// A batch acquire inside the caller's write transaction.
pub(crate) fn acquire_batch_in(
    tx: &Connection,
    requests: &[ClaimRequest],
) -> Result<Vec<Option<Acquired>>> {
    let mut out: Vec<Option<Acquired>> = Vec::with_capacity(requests.len());
    for r in requests {
        let tried = crate::traits::tried(r, &out);
        out.push(if tried {
            Some(acquire_in(tx, r)?)
        } else {
            None
        });
    }
    Ok(out)
}

/// One acquire inside the caller's write transaction.
pub(crate) fn acquire_in(tx: &Connection, request: &ClaimRequest) -> Result<Acquired> {
    let key = request.key.as_str();
    let won = tx
        .prepare_cached(ACQUIRE)?
        .query_row(
            params![key, request.holder, ttl_us(request.ttl), request.driver],
            claim_state,
        )
        .optional()?;
    Ok(match won {
        Some(state) => Acquired::Won(state.map_err(|r| corrupt(key, r))?),
        None => {
            let (current, closed_by) = tx
                .prepare_cached(
                    "SELECT key, holder, epoch, expires_at, closed_by FROM external_claim WHERE key = ?1",
                )?
                .query_row([key], |row| {
                    Ok((claim_state(row)?, row.get::<_, Option<Vec<u8>>>(4)))
                })?;
            let state = current.map_err(|r| corrupt(key, r))?;
            match closed_by.map_err(|e| corrupt(key, e.to_string()))? {
                None => Acquired::HeldBy(state),
                Some(by) => Acquired::Closed {
                    state,
                    by: InteractionId::from_slice(&by)
                        .map_err(|e| corrupt(key, format!("bad closed_by: {e}")))?,
                },
            }
        }
    })
}

/// A renew inside the caller's write transaction.
pub(crate) fn renew_in(
    tx: &Connection,
    key: &str,
    holder: &str,
    epoch: Epoch,
    ttl: Duration,
) -> Result<Option<ClaimState>> {
    let renewed = tx
        .prepare_cached(RENEW)?
        .query_row(params![key, holder, epoch.get(), ttl_us(ttl)], claim_state)
        .optional()?;
    renewed.map(|s| s.map_err(|r| corrupt(key, r))).transpose()
}

/// A release inside the caller's write transaction.
pub(crate) fn release_in(tx: &Connection, key: &str, holder: &str, epoch: Epoch) -> Result<bool> {
    let changed = tx
        .prepare_cached(RELEASE)?
        .execute(params![key, holder, epoch.get()])?;
    Ok(changed > 0)
}

/// [`crate::Claims::list_claims`]. The prefix is compared literally (no `LIKE`
/// wildcards).
pub(crate) fn list(conn: &Connection, prefix: &str) -> Result<Vec<ClaimRow>> {
    let upper = prefix_upper_bound(prefix);
    let mut stmt = conn.prepare_cached(match upper {
        Some(_) => LIST,
        None => LIST_UNBOUNDED,
    })?;
    let mut rows = match &upper {
        Some(upper) => stmt.query(params![prefix, upper])?,
        None => stmt.query(params![prefix])?,
    };
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let state = claim_state(row)?.map_err(|r| corrupt(prefix, r))?;
        let live: bool = row.get(4).map_err(|e| corrupt(&state.key, e.to_string()))?;
        let driver: Option<String> = row.get(5).map_err(|e| corrupt(&state.key, e.to_string()))?;
        out.push(ClaimRow {
            state,
            live,
            driver,
        });
    }
    Ok(out)
}
