//! The JSON endpoints: each answers what the CLI's `--json` prints for the same room,
//! built by the same functions. Every path and query is checked here first: a bad
//! room name, cursor or limit is a 400 with a JSON error, never a 500 or a panic.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use huddle_core::{Interaction, Position};
use serde::Serialize;

use super::{json_response, ApiError, Shared};
use crate::{ledger_cmds, state_cmds};

/// Most interactions one `interactions` answer holds.
pub const MAX_LIMIT: usize = 1000;
/// Interactions per answer when no `limit` is given.
pub const DEFAULT_LIMIT: usize = 100;

/// The room named by the path, checked as the ledger checks names, and existing
/// (404 otherwise).
pub(crate) async fn existing_room(
    state: &Shared,
    room: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let room = checked_room(state, room)?;
    owner_of(state, &room).await?;
    Ok(room)
}

/// The owner of `room` (its first `room.created`); 404 when it was never created.
pub(crate) async fn owner_of(state: &Shared, room: &str) -> Result<String, ApiError> {
    let ledger = state.folds.ledger(&*state.store).await?;
    ledger
        .rooms
        .get(room)
        .and_then(|r| r.owner.clone())
        .ok_or_else(|| ApiError::NotFound(format!("there is no room {room:?} in this database")))
}

/// The room named by the path, checked as the ledger checks names.
pub(crate) fn checked_room(
    state: &Shared,
    room: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let Path(room) =
        room.map_err(|e| ApiError::BadRequest(format!("bad room in the path: {e}")))?;
    huddle_core::validate_name("room", &room, state.store.limits())
        .map_err(|e| ApiError::BadRequest(format!("bad room name: {e}")))?;
    Ok(room)
}

/// A query string's `name=value` pairs, percent-decoded; a malformed one is a 400.
pub(crate) fn query_pairs(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let Some(query) = query else {
        return Ok(Vec::new());
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

/// `%XX` and `+` decoded; invalid escapes or UTF-8 are a 400.
fn percent_decode(text: &str) -> Result<String, ApiError> {
    let bad = || ApiError::BadRequest(format!("bad percent-encoding in the query: {text:?}"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// What `interactions` and `events` accept in their query.
#[derive(Debug, Default)]
pub(crate) struct ReadQuery {
    /// Read strictly after this cursor.
    pub after: Option<Position>,
    /// At most this many rows.
    pub limit: Option<usize>,
}

impl ReadQuery {
    /// Parses `after=MAJOR:MINOR` and `limit=N` (1..=[`MAX_LIMIT`]); anything else, or
    /// either twice, is a 400.
    pub(crate) fn parse(query: Option<&str>) -> Result<ReadQuery, ApiError> {
        let mut q = ReadQuery::default();
        for (k, v) in query_pairs(query)? {
            match k.as_str() {
                "after" if q.after.is_none() => q.after = Some(parse_cursor("after", &v)?),
                "limit" if q.limit.is_none() => {
                    let n: usize = v.parse().map_err(|_| {
                        ApiError::BadRequest(format!(
                            "limit={v:?}: give a whole number from 1 to {MAX_LIMIT}"
                        ))
                    })?;
                    if n == 0 || n > MAX_LIMIT {
                        return Err(ApiError::BadRequest(format!(
                            "limit={n}: give a whole number from 1 to {MAX_LIMIT}"
                        )));
                    }
                    q.limit = Some(n);
                }
                "after" | "limit" => {
                    return Err(ApiError::BadRequest(format!("{k} is given twice")))
                }
                other => {
                    return Err(ApiError::BadRequest(format!(
                        "unknown query parameter {other:?} (this endpoint takes after and limit)"
                    )))
                }
            }
        }
        Ok(q)
    }
}

/// A cursor in its text form `MAJOR:MINOR`, as `next` and event ids give it.
pub(crate) fn parse_cursor(what: &str, text: &str) -> Result<Position, ApiError> {
    text.parse::<Position>().map_err(|_| {
        ApiError::BadRequest(format!(
            "{what} {text:?} is not a cursor: give one as `next` or an event id gave it \
             (two whole numbers, MAJOR:MINOR, e.g. 0:42)"
        ))
    })
}

/// `GET /api/rooms`: `huddle room list --json`.
pub async fn rooms(State(state): State<Shared>) -> Result<Response, ApiError> {
    let rooms = state.folds.ledger(&*state.store).await?.rooms.rows();
    json_response(&rooms)
}

/// `GET /api/rooms/{room}/tasks`: `huddle tasks --room R --json`.
pub async fn tasks(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let room = existing_room(&state, room).await?;
    let fold = state.folds.room(&*state.store, &room).await?;
    json_response(&state_cmds::tasks_view_from(&fold.state))
}

/// `GET /api/rooms/{room}/board`: `huddle board --room R --json`.
pub async fn board(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let room = existing_room(&state, room).await?;
    let fold = state.folds.room(&*state.store, &room).await?;
    let view = state_cmds::board_view_from(&*state.store, &fold.state)
        .await
        .map_err(ApiError::from_build)?;
    json_response(&view)
}

/// `GET /api/rooms/{room}/claims`: `huddle claims --room R --json`.
pub async fn claims(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let room = existing_room(&state, room).await?;
    let rows = ledger_cmds::claim_rows(&*state.store, "", Some(&room), false)
        .await
        .map_err(ApiError::from_build)?;
    json_response(&rows)
}

/// The answer of `interactions`.
#[derive(Debug, Serialize)]
pub struct InteractionsPage {
    /// The room.
    pub room: String,
    /// The cursor read after.
    pub after: String,
    /// The cursor to pass as `after` for the rows that follow these.
    pub next: String,
    /// The rows, in ledger order, each as `huddle tail --json` prints it.
    pub interactions: Vec<Interaction>,
    /// Rows of the ledger that failed verification and were skipped (corrupt or
    /// foreign), with where and why.
    pub skipped: Vec<huddle_store::SkippedRow>,
    /// Whether every row committed when this was read is in it (no more to read now).
    pub caught_up: bool,
}

/// Up to `limit` rows of `room` after `after`, read forward (several reads when a
/// read returns fewer than asked and is not at the end).
pub(crate) async fn read_page(
    state: &Shared,
    room: &str,
    after: Position,
    limit: usize,
) -> Result<InteractionsPage, ApiError> {
    let mut cursor = after;
    let mut rows: Vec<Interaction> = Vec::new();
    let mut skipped = Vec::new();
    let caught_up = loop {
        let want = limit - rows.len();
        let batch = state
            .store
            .read_room(room, cursor, want)
            .await
            .map_err(|e| ApiError::from_build(e.into()))?;
        let n = batch.rows.len();
        skipped.extend(batch.skipped);
        rows.extend(batch.rows);
        if batch.next == cursor {
            break true;
        }
        cursor = batch.next;
        if n >= want {
            break false;
        }
    };
    if !skipped.is_empty() {
        tracing::warn!(
            room,
            skipped = skipped.len(),
            "skipped ledger rows that failed verification"
        );
    }
    Ok(InteractionsPage {
        room: room.to_string(),
        after: after.to_string(),
        next: cursor.to_string(),
        interactions: rows,
        skipped,
        caught_up,
    })
}

/// `GET /api/rooms/{room}/interactions?after=CURSOR&limit=N`: the room's rows after
/// the cursor, as `huddle tail --room R --json` prints them, and the next cursor.
pub async fn interactions(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = ReadQuery::parse(query.as_deref())?;
    let room = existing_room(&state, room).await?;
    let page = read_page(
        &state,
        &room,
        q.after.unwrap_or(Position::START),
        q.limit.unwrap_or(DEFAULT_LIMIT),
    )
    .await?;
    json_response(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked() {
        let q = ReadQuery::parse(Some("after=0%3A12&limit=5")).unwrap();
        assert_eq!(q.after, Some(Position::new(0, 12)));
        assert_eq!(q.limit, Some(5));
        for bad in [
            "after=12",
            "after=a:b",
            "after=-1:0",
            "after=99999999999999999999999:0",
            "limit=0",
            "limit=1001",
            "limit=-3",
            "limit=1e3",
            "limit=5&limit=6",
            "cursor=0:1",
            "after=%ZZ",
            "after=%FF%FE",
            "after=%",
        ] {
            assert!(
                matches!(ReadQuery::parse(Some(bad)), Err(ApiError::BadRequest(_))),
                "{bad}"
            );
        }
        assert!(ReadQuery::parse(None).unwrap().after.is_none());
    }
}
