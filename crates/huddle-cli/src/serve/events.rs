//! `GET /api/rooms/{room}/events`: the room's new interactions as server-sent events.
//!
//! Each event is one row, `event: interaction`, `id:` its cursor, `data:` the row as
//! `huddle tail --json` prints it. A stream starts after `Last-Event-ID` (a
//! reconnecting client), else after `?after=`, else at the end of the room; it reads
//! the room forward from there, then waits for the store's doorbell — the one relays
//! wait on: NOTIFY on Postgres, the `data_version` watcher on SQLite — or the bounded
//! fallback poll, and reads again. The ledger's read-forward never skips a committed
//! row, so a client that resumes from the last id it received misses nothing and
//! receives nothing twice — except the items of a `task.lot` (plan 0080), which share
//! its position: only the last carries the id, so a client cut off inside a lot is
//! sent all of it again (an interaction's `id` tells the repeats). Corrupt rows are
//! sent as `event: skipped` (with their cursor as id), so the cursor moves past them
//! and the stream goes on.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use huddle_core::Position;
use huddle_store::Doorbell;

use super::api::{existing_room, parse_cursor, ReadQuery};
use super::{ApiError, Shared};

/// Rows read per step of a stream.
const PAGE: usize = 500;
/// How long a stream waits before reading again after a database error.
const RETRY: Duration = Duration::from_millis(500);
/// Interval of the comment lines that keep an idle connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /api/rooms/{room}/events[?after=CURSOR]`, honouring `Last-Event-ID`.
pub async fn events(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = ReadQuery::parse(query.as_deref())?;
    if q.limit.is_some() {
        return Err(ApiError::BadRequest(
            "an event stream takes no limit (it sends every row as it comes)".into(),
        ));
    }
    let resume = match headers.get("last-event-id") {
        // An empty id is no id (what a stream that never saw one would resume from).
        None => None,
        Some(v) if v.as_bytes().iter().all(u8::is_ascii_whitespace) => None,
        Some(v) => {
            let text = v.to_str().map_err(|_| {
                ApiError::BadRequest("Last-Event-ID is not text: give an event id".into())
            })?;
            Some(parse_cursor("Last-Event-ID", text.trim())?)
        }
    };
    let room = existing_room(&state, room).await?;
    // Subscribe before the first read, so a ring during it is not lost.
    let bell = state.store.doorbell();
    let cursor = match resume.or(q.after) {
        Some(c) => c,
        // The end of the room: where its fold has read to, caught up now.
        None => state.folds.room(&*state.store, &room).await?.cursor(),
    };
    let stream = RoomStream {
        state: state.clone(),
        room,
        cursor,
        bell,
        pending: VecDeque::new(),
        _client: state.counters.sse_client(),
    };
    let events = futures::stream::unfold(stream, |mut s| async move {
        let shutdown = s.state.shutdown.clone();
        tokio::select! {
            event = s.next_event() => Some((Ok::<_, Infallible>(event), s)),
            () = shutdown.cancelled() => None,
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

/// One client's stream.
struct RoomStream {
    state: Shared,
    room: String,
    cursor: Position,
    bell: Doorbell,
    pending: VecDeque<Event>,
    /// Counts the client while the stream lives.
    _client: super::metrics::ClientGuard,
}

impl RoomStream {
    /// The next event: a row already read, else a read forward, else a wait for the
    /// doorbell or the fallback poll.
    async fn next_event(&mut self) -> Event {
        loop {
            if let Some(e) = self.pending.pop_front() {
                self.state.counters.sse_event();
                return e;
            }
            // Mark the bell seen before reading: a ring during the read is kept.
            self.bell.borrow_and_update();
            match self
                .state
                .store
                .read_room(&self.room, self.cursor, PAGE)
                .await
            {
                Ok(batch) => {
                    let mut items: Vec<(Position, Event)> = Vec::new();
                    for row in &batch.rows {
                        match serde_json::to_string(row) {
                            Ok(data) => items.push((
                                row.position,
                                Event::default().event("interaction").data(data),
                            )),
                            Err(e) => tracing::warn!(error = %e, "cannot encode a row"),
                        }
                    }
                    for s in &batch.skipped {
                        let data = serde_json::json!({
                            "position": s.position.to_string(),
                            "reason": s.reason,
                        });
                        items.push((
                            s.position,
                            Event::default().event("skipped").data(data.to_string()),
                        ));
                    }
                    // Ledger order, so the last id a client saw is its resume point. The
                    // items of one lot share its position (plan 0080): only the last of
                    // them carries the id, so a client cut off inside a lot resumes
                    // before it and is sent the whole lot again, never half of it.
                    items.sort_by_key(|(p, _)| *p);
                    let mut items = items.into_iter().peekable();
                    while let Some((position, event)) = items.next() {
                        let last_here = items.peek().is_none_or(|(next, _)| *next != position);
                        self.pending.push_back(if last_here {
                            event.id(position.to_string())
                        } else {
                            event
                        });
                    }
                    let moved = batch.next != self.cursor;
                    self.cursor = batch.next;
                    if moved {
                        continue;
                    }
                    let fallback = self.state.fallback;
                    tokio::select! {
                        rang = self.bell.changed() => {
                            // A store whose doorbell is gone: poll only.
                            if rang.is_err() {
                                tokio::time::sleep(fallback).await;
                            }
                        }
                        _ = tokio::time::sleep(fallback) => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, room = %self.room, "event stream read failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}
