//! The ledger's blocking SQL: insert a batch, check a fence, read rows back
//! defensively.

use huddle_core::{InteractionId, Limits, NewInteraction, Position, RawRow, Timestamp};
use rusqlite::types::FromSql;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::conn::now_us;
use crate::error::{Result, StoreError};
use crate::traits::{Appended, Fence};

/// Columns read back for every row, in the order [`decode_row`] expects.
macro_rules! row_columns {
    () => {
        "seq, id, at, relay, room, thread, verb, actor, role, parent, caused_by, body, sig"
    };
}
pub(crate) use row_columns;

/// Inserts a content row; a duplicate id or idempotency key inserts nothing.
const INSERT: &str = concat!(
    "INSERT INTO interaction ",
    "(id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key, at, relay, ",
    "sig) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ",
    now_us!(),
    ", ?11, ?12) ON CONFLICT DO NOTHING"
);

/// A batch checked against the limits: each interaction's content id and canonical
/// body, encoded once for the check and the insert.
pub(crate) type Checked = Vec<(InteractionId, String)>;

/// Checks a batch against the limits before anything is written: its size, then
/// every interaction. One bad interaction refuses the whole batch.
pub(crate) fn validate_batch(limits: &Limits, batch: &[NewInteraction]) -> Result<Checked> {
    if batch.len() > limits.max_batch {
        return Err(StoreError::BatchTooLarge {
            got: batch.len(),
            max: limits.max_batch,
        });
    }
    batch
        .iter()
        .map(|n| n.checked(limits).map_err(StoreError::from))
        .collect()
}

/// Inserts `batch` on `conn`, which must already be inside a write transaction, as
/// written by `relay` (and signed by `signer`, when given). Duplicates (same
/// idempotency key, or same content id, including earlier in the same batch) insert
/// nothing and report the existing row's id.
/// `checked` is [`validate_batch`]'s answer for `batch`.
pub(crate) fn insert_batch(
    conn: &Connection,
    relay: &str,
    signer: Option<&huddle_core::keys::WriterSecret>,
    batch: &[NewInteraction],
    checked: &[(InteractionId, String)],
) -> Result<Vec<Appended>> {
    let mut insert = conn.prepare_cached(INSERT)?;
    let mut out = Vec::with_capacity(batch.len());
    for (n, (id, body)) in batch.iter().zip(checked) {
        let id = *id;
        let caused_by: Vec<u8> = n.caused_by.iter().flat_map(|c| c.0).collect();
        let changed = insert.execute(params![
            &id.0[..],
            n.room,
            n.thread,
            n.verb.as_str(),
            n.actor,
            n.role.as_str(),
            n.parent.map(|p| p.0.to_vec()),
            caused_by,
            body,
            n.idempotency_key,
            relay,
            crate::row_signature(signer, relay, &id),
        ])?;
        if changed > 0 {
            out.push(Appended { id, inserted: true });
            continue;
        }
        // The conflict was the idempotency key (its row wins, whatever its content)
        // or the content id (the row is this very interaction).
        let existing = match &n.idempotency_key {
            Some(key) => id_for_key(conn, key)?,
            None => None,
        };
        out.push(Appended {
            id: existing.unwrap_or(id),
            inserted: false,
        });
    }
    Ok(out)
}

/// The id of the row holding idempotency key `key`, if any.
fn id_for_key(conn: &Connection, key: &str) -> Result<Option<InteractionId>> {
    let bytes: Option<Vec<u8>> = conn
        .prepare_cached("SELECT id FROM interaction WHERE idempotency_key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()?;
    bytes
        .map(|b| {
            InteractionId::from_slice(&b).map_err(|e| {
                StoreError::Backend(format!(
                    "the row holding idempotency key {key:?} has a corrupt id: {e}"
                ))
            })
        })
        .transpose()
}

/// Checks, inside the caller's transaction, that `fence.key` is still held by
/// `fence.holder` at `fence.epoch`, unexpired by the database clock and not closed;
/// with `closing`, also accepts a claim that this very batch closed (an idempotent
/// retry), and closes the claim with that id.
pub(crate) fn check_fence(
    conn: &Connection,
    fence: &Fence,
    closing: Option<&InteractionId>,
) -> Result<()> {
    let ok = match closing {
        None => conn
            .prepare_cached(concat!(
                "SELECT 1 FROM external_claim WHERE key = ?1 AND holder = ?2 AND epoch = ?3 ",
                "AND closed_by IS NULL AND expires_at > ",
                now_us!()
            ))?
            .query_row(params![fence.key, fence.holder, fence.epoch.get()], |_| {
                Ok(())
            })
            .optional()?
            .is_some(),
        Some(id) => {
            conn.prepare_cached(concat!(
                "UPDATE external_claim SET closed_by = ?4, expires_at = min(expires_at, ",
                now_us!(),
                ") WHERE key = ?1 AND holder = ?2 AND epoch = ?3 AND ((closed_by IS NULL ",
                "AND expires_at > ",
                now_us!(),
                ") OR closed_by = ?4)"
            ))?
            .execute(params![
                fence.key,
                fence.holder,
                fence.epoch.get(),
                &id.0[..]
            ])? > 0
        }
    };
    if ok {
        Ok(())
    } else {
        Err(StoreError::Fenced {
            key: fence.key.clone(),
            holder: fence.holder.clone(),
            epoch: fence.epoch,
        })
    }
}

/// A stored row: its position and either its decoded columns or why they could not
/// be decoded.
pub(crate) struct StoredRow {
    /// The row's position, `(0, seq)`.
    pub position: Position,
    /// The decoded columns, or the reason the row is corrupt.
    pub raw: std::result::Result<RawRow, String>,
}

/// Runs a query whose result columns are [`row_columns!`] and decodes every row
/// defensively: a column of the wrong type or with invalid UTF-8 makes that row
/// corrupt, never a panic or a failed read.
pub(crate) fn query_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<StoredRow>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        // `seq` is the rowid alias: SQLite guarantees an integer.
        let seq: i64 = row.get(0)?;
        let position = Position::new(0, u64::try_from(seq).unwrap_or(0));
        out.push(StoredRow {
            position,
            raw: decode_row(row, position),
        });
    }
    Ok(out)
}

fn col<T: FromSql>(row: &Row<'_>, idx: usize, name: &str) -> std::result::Result<T, String> {
    row.get(idx)
        .map_err(|e| format!("corrupt column {name}: {e}"))
}

fn decode_row(row: &Row<'_>, position: Position) -> std::result::Result<RawRow, String> {
    let caused_by: Vec<u8> = col(row, 10, "caused_by")?;
    Ok(RawRow {
        id: col(row, 1, "id")?,
        position,
        at: Timestamp(col(row, 2, "at")?),
        relay: col(row, 3, "relay")?,
        room: col(row, 4, "room")?,
        thread: col(row, 5, "thread")?,
        verb: col(row, 6, "verb")?,
        actor: col(row, 7, "actor")?,
        role: col(row, 8, "role")?,
        parent: col(row, 9, "parent")?,
        // A length that is not a multiple of 32 leaves a short last id, which
        // `RawRow::verify` refuses.
        caused_by: caused_by.chunks(32).map(<[u8]>::to_vec).collect(),
        body: col(row, 11, "body")?,
        sig: col(row, 12, "sig")?,
    })
}
