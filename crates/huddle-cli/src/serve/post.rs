//! Posting as the room's owner from the dashboard (plan 0055): `huddle serve --owner
//! ID` holds ID's owner key, the room pages of rooms ID owns carry a post box, and
//! `POST /api/rooms/{room}/messages` appends the message — an owner command signed
//! with the key — exactly as `huddle post --as ID` would, then waits for a command's
//! answer as `huddle post --wait` does (the same two functions,
//! `ledger_cmds::compose_message` and `ledger_cmds::await_answer`).
//!
//! The endpoint is guarded, in order: posting must be on (403); the loopback `Host`
//! check every route has (403); an `Origin`, when the browser sends one, must be the
//! server's own (403); `X-Huddle-Token` must carry the server's token (403) — random
//! per server start, embedded only in the pages of the owner's rooms, which a page of
//! another origin cannot read, and a header a cross-origin request cannot set without
//! a CORS preflight this server never grants; `Content-Type: application/json` (415);
//! at most [`MAX_BODY`] bytes (413). The key never leaves the process.

use std::path::PathBuf;
use std::time::Duration;

use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use huddle_core::signing::OwnerSecret;
use huddle_core::{Interaction, Role};
use serde::{Deserialize, Serialize};

use super::api::{checked_room, owner_of};
use super::pages::esc;
use super::{ApiError, Shared};
use crate::ledger_cmds::{self, Outgoing, OwnerKey};

/// Largest request body the endpoint reads.
pub const MAX_BODY: usize = 64 * 1024;
/// The header that must carry the server's token.
pub const TOKEN_HEADER: &str = "x-huddle-token";
/// How long a command waits for its answer unless the request says otherwise.
const DEFAULT_COMMAND_WAIT: Duration = Duration::from_secs(10);
/// Longest `wait_ms` a request may ask for.
const MAX_WAIT_MS: u64 = 60_000;

/// The owner a server posts as: the key (read once at start) and the page token.
pub(crate) struct Owner {
    name: String,
    secret: OwnerSecret,
    path: PathBuf,
    token: String,
}

impl Owner {
    /// Reads `name`'s owner key the way `huddle post --as NAME` finds it (`key`, then
    /// `HUDDLE_OWNER_KEY`, then the keys directory); fails, naming the path, when it is
    /// not there. Makes the server's token.
    pub(crate) fn load(name: &str, key: Option<&std::path::Path>) -> anyhow::Result<Owner> {
        huddle_core::validate_name("owner", name, &huddle_core::Limits::default())
            .map_err(|e| anyhow::anyhow!("--owner {name:?}: {e}"))?;
        let path = crate::keys::key_path(name, key)?;
        let Some(secret) = crate::keys::load(&path)? else {
            anyhow::bail!(
                "no owner key for {name} at {}: `huddle serve --owner {name}` signs {name}'s \
                 commands with it. Give the key with --key PATH (or HUDDLE_OWNER_KEY), or \
                 start without --owner for a read-only dashboard",
                path.display()
            );
        };
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("no randomness for the page token: {e}"))?;
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect();
        tracing::info!(owner = name, key = %secret.public().short(), "posting as the owner is on");
        Ok(Owner {
            name: name.to_string(),
            secret,
            path,
            token,
        })
    }
}

/// The post box of a room page: only when the server posts as `owner` of the room.
pub(crate) fn post_box(state: &Shared, room: &str, owner: Option<&str>) -> String {
    let Some(me) = &state.owner else {
        return String::new();
    };
    if owner != Some(me.name.as_str()) {
        return format!(
            "<p class=\"foot\" id=\"post-off\">posting as {} (not this room's owner, {})</p>",
            esc(&me.name),
            esc(owner.unwrap_or("nobody"))
        );
    }
    format!(
        "<section id=\"post\"><h2>Post as {me} <small>(the owner: messages, and commands such as \
         <code>!delegate</code>, <code>!config</code>)</small></h2>\
         <form id=\"post-form\" data-room=\"{room}\" data-token=\"{token}\">\
         <textarea id=\"post-text\" name=\"text\" rows=\"3\" maxlength=\"{max}\" \
         placeholder=\"a message, or !config get (Ctrl+Enter posts)\"></textarea>\
         <div class=\"post-row\"><input id=\"post-thread\" name=\"thread\" placeholder=\"thread (optional)\" \
         maxlength=\"256\"> <button id=\"post-send\" type=\"submit\">Post</button> \
         <span id=\"post-status\" class=\"post-status\"></span></div></form>\
         <pre id=\"post-answer\" hidden></pre></section>",
        me = esc(&me.name),
        room = esc(room),
        token = me.token,
        max = MAX_BODY / 2,
    )
}

/// What the endpoint reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostRequest {
    /// The message or command.
    text: String,
    /// The thread to post in.
    #[serde(default)]
    thread: Option<String>,
    /// How long to wait for an answer (default: 10 s for a command, none otherwise).
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// What the endpoint answers (201).
#[derive(Debug, Serialize)]
struct Posted {
    /// The new message's id.
    id: String,
    /// The room.
    room: String,
    /// Who it was posted as.
    actor: String,
    /// The command word (`!config`, ...), or `null` for a plain message.
    command: Option<String>,
    /// Whether the owner's key signed it.
    signed: bool,
    /// The first answer to it, as `huddle tail --json` prints rows, or `null`.
    answer: Option<Interaction>,
    /// Why there is no answer, when one was waited for.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// The request's `Host`, if any.
fn host(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

/// Whether two byte strings are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The checks before the body is read: posting on, same origin, token, content type.
fn guard(state: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(owner) = &state.owner else {
        return Err(ApiError::Forbidden(
            "posting is off: this server was started without --owner (start `huddle serve \
             --owner ID` to post as the owner of ID's rooms)"
                .into(),
        ));
    };
    if let Some(origin) = headers.get(header::ORIGIN) {
        let expected = host(headers).map(|h| format!("http://{h}"));
        if origin.to_str().ok() != expected.as_deref() {
            return Err(ApiError::Forbidden(format!(
                "Origin {origin:?} is not this server: post from the room page this server serves"
            )));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|s| s.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Err(ApiError::Forbidden(format!(
                "a {site} request: post from the room page this server serves"
            )));
        }
    }
    let token = headers
        .get(TOKEN_HEADER)
        .map(|t| t.as_bytes())
        .unwrap_or_default();
    if !same(token, owner.token.as_bytes()) {
        return Err(ApiError::Forbidden(
            "missing or wrong X-Huddle-Token: post from the room page (reload it: the token \
             changes when the server restarts)"
                .into(),
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::UnsupportedMediaType(
            "send the message as JSON (Content-Type: application/json): {\"text\": \"...\"}".into(),
        ));
    }
    Ok(())
}

/// `POST /api/rooms/{room}/messages` with `{"text": "...", "thread"?: "...",
/// "wait_ms"?: N}`: appends the message as the owner (a command signed with the
/// owner's key) and, for a command (or with `wait_ms`), waits for its answer.
pub async fn post_message(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    guard(&state, &headers)?;
    let Some(me) = &state.owner else {
        return Err(ApiError::Forbidden("posting is off".into()));
    };
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(format!(
            "the request is over {MAX_BODY} bytes: post a shorter message"
        )),
        _ => ApiError::BadRequest(format!("cannot read the request: {e}")),
    })?;
    let request: PostRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "the request is not {{\"text\": \"...\", \"thread\"?: \"...\", \"wait_ms\"?: N}}: {e}"
        ))
    })?;
    if request.text.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "the text is empty: say something".into(),
        ));
    }
    let limits = state.store.limits();
    if let Some(t) = &request.thread {
        huddle_core::validate_name("thread", t, limits)
            .map_err(|e| ApiError::BadRequest(format!("bad thread name: {e}")))?;
    }
    if request.wait_ms.is_some_and(|w| w > MAX_WAIT_MS) {
        return Err(ApiError::BadRequest(format!(
            "wait_ms is at most {MAX_WAIT_MS}"
        )));
    }
    let room = checked_room(&state, room)?;
    let owner = owner_of(&state, &room).await?;
    if owner != me.name {
        return Err(ApiError::Forbidden(format!(
            "room {room:?} is owned by {owner}; this server posts as {}",
            me.name
        )));
    }
    let command = huddle_core::commands::command_word(&request.text)
        .and_then(|_| request.text.split_whitespace().next())
        .map(str::to_string);
    // Compose under the room's fold: its owner key, and where the room ends now (the
    // answer is read forward from there).
    let (message, after) = {
        let fold = state.folds.room(&*state.store, &room).await?;
        let config = fold.state.authority();
        match config.owner_key(&room) {
            Some(k) if k == me.secret.public() => {}
            Some(k) => {
                return Err(ApiError::Conflict(format!(
                    "the key in {} ({}) is not room {room:?}'s owner key ({}): restart with the \
                     room's current key (--key PATH)",
                    me.path.display(),
                    me.secret.public().short(),
                    k.short()
                )))
            }
            None => {
                return Err(ApiError::Conflict(format!(
                    "room {room:?} has no owner key to sign for"
                )))
            }
        }
        let (message, not_signed) = ledger_cmds::compose_message(
            &*state.store,
            config,
            Outgoing {
                room: &room,
                actor: &me.name,
                role: Role::Owner,
                text: &request.text,
                thread: request.thread.clone(),
                parent: None,
                key: Some(OwnerKey {
                    path: &me.path,
                    secret: Some(&me.secret),
                }),
            },
        )
        .map_err(|e| ApiError::Conflict(format!("{e:#}")))?;
        if let Some(why) = not_signed {
            return Err(ApiError::Conflict(format!("not posted: {why}")));
        }
        (message, fold.cursor())
    };
    let signed = message
        .body
        .get(huddle_core::signing::SIGNATURE_FIELD)
        .is_some();
    let appended = state.store.append(vec![message]).await.map_err(|e| {
        if e.is_retryable() {
            ApiError::from_build(e.into())
        } else {
            ApiError::BadRequest(format!("not posted: {e}"))
        }
    })?;
    state.store.flush().await;
    let id = appended
        .first()
        .map(|a| a.id)
        .ok_or_else(|| ApiError::Unavailable("the database answered no id".into()))?;
    tracing::info!(room, id = %id.short(), command = ?command, "posted as the owner");
    let wait = match request.wait_ms {
        Some(ms) => Duration::from_millis(ms),
        None if command.is_some() => DEFAULT_COMMAND_WAIT,
        None => Duration::ZERO,
    };
    let (answer, note) = if wait.is_zero() {
        (None, None)
    } else {
        match ledger_cmds::await_answer(state.store.clone(), &room, id, after, wait).await {
            Ok(Some(row)) => (Some(row), None),
            Ok(None) => (
                None,
                Some(format!(
                    "no answer within {} s: is a relay running for room {room}?",
                    wait.as_secs_f64()
                )),
            ),
            Err(e) => (
                None,
                Some(format!("posted; waiting for the answer failed: {e:#}")),
            ),
        }
    };
    let posted = Posted {
        id: id.to_string(),
        room,
        actor: me.name.clone(),
        command,
        signed,
        answer,
        note,
    };
    let text = serde_json::to_string_pretty(&posted)
        .map_err(|e| ApiError::Unavailable(format!("cannot encode the answer: {e}")))?;
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, super::JSON)],
        format!("{text}\n"),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(!same(b"", b"a"));
    }
}
