//! Archiving a room and pruning claims: the blocking SQL (migration 0010).
//!
//! Both run as jobs of the store's writer thread, inside its `BEGIN IMMEDIATE`
//! transaction (in a savepoint of their own): SQLite has one writer at a time, so
//! nothing can be appended to the room or take one of its claims between the checks
//! and the removal, and a refusal rolls back everything the job did.

use std::time::Duration;

use huddle_core::protocol::room_of_claim;
use huddle_core::{InteractionId, NewInteraction};
use rusqlite::{params, Connection, OptionalExtension};

use super::conn::now_us;
use super::ledger;
use crate::error::{Result, StoreError};
use crate::traits::{ArchiveOutcome, ArchiveRefusal, ArchiveRequest, PrunedClaims};

/// Every claim key with whether it is live (unexpired and not closed).
fn claims(conn: &Connection) -> Result<Vec<(String, bool)>> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT key, closed_by IS NULL AND expires_at > ",
        now_us!(),
        " FROM external_claim"
    ))?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Deletes the claims with these keys; returns how many.
fn delete_claims(conn: &Connection, keys: &[String]) -> Result<u64> {
    let mut stmt = conn.prepare_cached("DELETE FROM external_claim WHERE key = ?1")?;
    let mut n = 0;
    for key in keys {
        n += stmt.execute([key])? as u64;
    }
    Ok(n)
}

/// Archives `request`'s room as written by `relay` (signed by `signer`): see
/// [`crate::Store::archive_room`]. A refusal changes nothing.
pub(crate) fn archive(
    tx: &Connection,
    relay: &str,
    signer: Option<&huddle_core::keys::WriterSecret>,
    request: &ArchiveRequest,
    id: InteractionId,
    body: String,
) -> Result<ArchiveOutcome> {
    let room = request.archived.room.as_str();
    let refused = |reason| StoreError::ArchiveRefused {
        room: room.to_string(),
        reason,
    };
    let archived: Option<i64> = tx
        .query_row("SELECT 1 FROM archived_room WHERE room = ?1", [room], |r| {
            r.get(0)
        })
        .optional()?;
    if archived.is_some() {
        return Err(refused(ArchiveRefusal::Archived));
    }
    let created: Option<i64> = tx
        .query_row(
            "SELECT 1 FROM interaction WHERE room = ?1 AND verb = 'room.created' LIMIT 1",
            [room],
            |r| r.get(0),
        )
        .optional()?;
    if created.is_none() {
        return Err(refused(ArchiveRefusal::NoRoom));
    }
    let have: i64 = tx.query_row(
        "SELECT count(*) FROM interaction WHERE room = ?1",
        [room],
        |r| r.get(0),
    )?;
    let have = u64::try_from(have).unwrap_or(0);
    if have != request.rows {
        return Err(refused(ArchiveRefusal::Changed {
            exported: request.rows,
            now: have,
        }));
    }
    let of_room: Vec<(String, bool)> = claims(tx)?
        .into_iter()
        .filter(|(key, _)| room_of_claim(key) == Some(room))
        .collect();
    let live: Vec<String> = of_room
        .iter()
        .filter(|(_, live)| *live)
        .map(|(key, _)| key.clone())
        .collect();
    if !live.is_empty() {
        return Err(refused(ArchiveRefusal::LiveClaims(live)));
    }
    tx.execute(
        concat!(
            "INSERT INTO archived_room (room, archived_id, rows, archived_by, archived_at, ",
            "removing) VALUES (?1, ?2, ?3, ?4, ",
            now_us!(),
            ", 1)"
        ),
        params![room, &id.0[..], have as i64, relay],
    )?;
    // The `room.archived` row first: its rowid is then above every row removed
    // below, so no removed rowid is ever given again (a reader past it would skip it).
    ledger::insert_batch(
        tx,
        relay,
        signer,
        std::slice::from_ref::<NewInteraction>(&request.archived),
        &[(id, body)],
    )?;
    let rows_removed = tx.execute(
        "DELETE FROM interaction WHERE room = ?1 AND id <> ?2",
        params![room, &id.0[..]],
    )? as u64;
    let keys: Vec<String> = of_room.into_iter().map(|(key, _)| key).collect();
    let claims_removed = delete_claims(tx, &keys)?;
    tx.execute(
        "UPDATE archived_room SET removing = 0 WHERE room = ?1",
        [room],
    )?;
    Ok(ArchiveOutcome {
        id,
        rows_removed,
        claims_removed,
    })
}

/// Prunes claims: see [`crate::Store::prune_claims`].
pub(crate) fn prune(tx: &Connection, older_than: Duration) -> Result<PrunedClaims> {
    let older_us = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX / 2);
    let relay_leases = tx.execute(
        concat!(
            "DELETE FROM external_claim WHERE substr(key, 1, 6) = 'relay/' ",
            "AND closed_by IS NULL AND expires_at < ",
            now_us!(),
            " - ?1"
        ),
        [older_us],
    )? as u64;
    let archived: std::collections::HashSet<String> = tx
        .prepare("SELECT room FROM archived_room")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let keys: Vec<String> = claims(tx)?
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| room_of_claim(key).is_some_and(|room| archived.contains(room)))
        .collect();
    let archived_rooms = delete_claims(tx, &keys)?;
    Ok(PrunedClaims {
        relay_leases,
        archived_rooms,
    })
}
