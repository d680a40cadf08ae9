//! The HTML pages: `/` (every room) and `/rooms/{room}` (timeline, board, relays,
//! the task DAG, claims), and `/rooms/{room}/live`, the board/DAG/claims fragment the
//! page script fetches again when the room's event stream says something changed.
//! Every piece of ledger text goes through [`esc`].

use std::fmt::Write as _;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use huddle_core::{Interaction, Position, Role, Timestamp, Verb};

use super::api::existing_room;
use super::folds::RoomFold;
use super::{dag, ApiError, Shared};
use crate::output::{format_time, summary};
use crate::state_cmds::{BoardView, TasksView};
use crate::{ledger_cmds, state_cmds};

/// `text` escaped for HTML text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one percent-encoded path segment.
fn path_segment(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const STYLE: &str = include_str!("style.css");
const SCRIPT: &str = include_str!("room.js");

fn html(body: String) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
                     connect-src 'self'; img-src 'self' data:; form-action 'none'; \
                     frame-ancestors 'none'",
                ),
            ),
        ],
        body,
    )
        .into_response()
}

fn page(title: &str, body: &str) -> Response {
    html(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · huddle</title><link rel=\"icon\" href=\"data:,\"><style>{STYLE}</style></head><body>{body}</body></html>\n",
        esc(title)
    ))
}

/// `GET /assets/room.js`: the page script (no library, no CDN).
pub async fn script() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/javascript; charset=utf-8"),
        )],
        SCRIPT,
    )
        .into_response()
}

/// Online and offline agents of a board (by their relays' leases).
fn agents_online(board: &BoardView) -> (usize, usize) {
    let online = board
        .agents
        .iter()
        .filter(|a| a.hosting.as_deref() == Some("online"))
        .count();
    let offline = board
        .agents
        .iter()
        .filter(|a| {
            a.hosting
                .as_deref()
                .is_some_and(|h| h.starts_with("offline"))
        })
        .count();
    (online, offline)
}

/// `GET /`: every room with its owner, agents online/offline, tasks done/total and
/// last activity.
pub async fn index(State(state): State<Shared>) -> Result<Response, ApiError> {
    let store = &*state.store;
    let rooms = state.folds.ledger(store).await?.rooms.rows();
    let live = crate::status_cmds::live_relays(store)
        .await
        .map_err(ApiError::from_build)?;
    let now = store
        .now()
        .await
        .map_err(|e| ApiError::from_build(e.into()))?;
    let mut rows = String::new();
    for r in &rooms {
        let Some(owner) = &r.owner else {
            let _ = write!(
                rows,
                "<tr class=\"uncreated\"><td>{}</td><td colspan=\"4\">never created ({} rows)</td></tr>",
                esc(&r.room),
                r.rows
            );
            continue;
        };
        let board = {
            let fold = state.folds.room(store, &r.room).await?;
            state_cmds::board_core(&fold.state, &live, now)
        };
        let (online, offline) = agents_online(&board);
        let _ = write!(
            rows,
            "<tr data-room=\"{room}\"><td><a href=\"/rooms/{href}\">{room}</a></td><td>{owner}</td>\
             <td><span class=\"online\">{online} online</span> · <span class=\"offline\">{offline} offline</span> \
             · {agents} agents</td><td class=\"tasks\">{done}/{total} done</td><td>{last}</td></tr>",
            room = esc(&r.room),
            href = path_segment(&r.room),
            owner = esc(owner),
            agents = board.agents.len(),
            done = board.tasks.done,
            total = board.tasks.total,
            last = r.last_at.map_or_else(|| "-".to_string(), format_time),
        );
    }
    if rooms.is_empty() {
        rows.push_str("<tr><td colspan=\"5\">no rooms yet (create one with <code>huddle room create ROOM --owner ID</code>)</td></tr>");
    }
    let body = format!(
        "<header><h1>huddle</h1><span class=\"sub\">rooms</span></header><main>\
         <table id=\"rooms\"><thead><tr><th>room</th><th>owner</th><th>agents</th>\
         <th>tasks</th><th>last activity (UTC)</th></tr></thead><tbody>{rows}</tbody></table>\
         <p class=\"foot\"><a href=\"/metrics\">metrics</a> · <a href=\"/api/rooms\">api</a></p></main>"
    );
    Ok(page("rooms", &body))
}

/// `GET /rooms/{room}`
pub async fn room(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let room = existing_room(&state, room).await?;
    let (timeline, cursor, owner) = {
        let fold = state.folds.room(&*state.store, &room).await?;
        let owner = fold.state.authority().owner(&room).map(str::to_string);
        (timeline(&fold), fold.cursor(), owner)
    };
    let live = state.fragments.get(&state, &room).await?;
    let post = super::post::post_box(&state, &room, owner.as_deref());
    let body = format!(
        "<header><h1><a href=\"/\">huddle</a> / {name}</h1><span id=\"conn\" class=\"conn\">connecting…</span></header>\
         <main id=\"room\" data-room=\"{name}\" data-cursor=\"{cursor}\">\
         <div id=\"live\">{live}</div>\
         <div id=\"side\">{post}<section id=\"timeline\"><h2>Timeline <small>(newest first)</small></h2>{timeline}</section></div>\
         </main><script src=\"/assets/room.js\"></script>",
        name = esc(&room),
    );
    Ok(page(&room, &body))
}

/// `GET /rooms/{room}/live`: the fragment the page swaps in.
pub async fn live(
    State(state): State<Shared>,
    room: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let room = existing_room(&state, room).await?;
    let fragment = state.fragments.get(&state, &room).await?;
    Ok(html(fragment.as_str().to_string()))
}

/// How long a rendered fragment may be served again while the room has no new row.
/// Shorter than the page script's margin after a lease lapses (300 ms), so a refresh
/// for a lapsed lease always gets a fragment rendered after the lapse.
const FRAGMENT_FRESH: std::time::Duration = std::time::Duration::from_millis(200);

/// One room's last rendered fragment: when, at which end of the room, the HTML.
type Rendered = Option<(std::time::Instant, Position, std::sync::Arc<String>)>;

/// Renders each room's live fragment once for all the pages that ask at the same time:
/// every open page fetches it after the same events, so 50 pages cost one render, not
/// 50. A fragment is served again only while it is younger than [`FRAGMENT_FRESH`]
/// and no row was appended to the room after the end it was rendered at (the room's
/// fold, caught up, says), so no page is left showing a state older than its last
/// event.
#[derive(Default)]
pub(crate) struct Fragments {
    rooms: std::sync::Mutex<
        std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<Rendered>>>,
    >,
}

impl Fragments {
    async fn get(&self, state: &Shared, room: &str) -> Result<std::sync::Arc<String>, ApiError> {
        let slot = {
            let mut rooms = self
                .rooms
                .lock()
                .map_err(|_| ApiError::Unavailable("the fragment cache is poisoned".into()))?;
            rooms.entry(room.to_string()).or_default().clone()
        };
        // Requests for the same room wait here for one render.
        let mut rendered = slot.lock().await;
        let fold = state.folds.room(&*state.store, room).await?;
        let end = fold.cursor();
        if let Some((at, at_end, html)) = rendered.as_ref() {
            if at.elapsed() < FRAGMENT_FRESH && *at_end == end {
                return Ok(html.clone());
            }
        }
        state.counters.fragment_render();
        let html = std::sync::Arc::new(live_html(state, &fold).await?);
        *rendered = Some((std::time::Instant::now(), end, html.clone()));
        Ok(html)
    }
}

/// The newest rows of the room (kept by its fold) as timeline items (newest first),
/// consecutive bookkeeping rows folded into one line.
fn timeline(fold: &RoomFold) -> String {
    let rows = &fold.recent;
    let mut out = String::new();
    let mut group: Vec<&Interaction> = Vec::new();
    let flush = |group: &mut Vec<&Interaction>, out: &mut String| {
        if !group.is_empty() {
            out.push_str(&bookkeeping_item(group));
            group.clear();
        }
    };
    for r in rows.iter().rev() {
        if kind(r) == "bookkeeping" {
            group.push(r);
            continue;
        }
        flush(&mut group, &mut out);
        out.push_str(&row_item(r));
    }
    flush(&mut group, &mut out);
    // The thread filter: every thread of the rows shown.
    let threads: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r.thread.as_deref()).collect();
    let mut filter = String::from(
        "<select id=\"thread-filter\" aria-label=\"thread\"><option value=\"*\">every thread</option>\
         <option value=\"\">the room's top level</option>",
    );
    for t in threads {
        let _ = write!(filter, "<option value=\"{t}\">#{t}</option>", t = esc(t));
    }
    filter.push_str("</select>");
    format!("{filter}<ol id=\"timeline-list\">{out}</ol>")
}

/// How the timeline shows a row: `command` (an owner's `!` message), `answer`
/// (huddle's reply to one), `message`, `progress` or `bookkeeping`.
fn kind(r: &Interaction) -> &'static str {
    let text = r.body.get("text").and_then(|t| t.as_str());
    match (r.verb, text) {
        (Verb::MessagePosted, Some(t))
            if r.role == Role::Owner && t.trim_start().starts_with('!') =>
        {
            "command"
        }
        (Verb::MessagePosted, _) if r.role == Role::System => "answer",
        (Verb::MessagePosted, _) => "message",
        (Verb::TurnProgress, _) => "progress",
        _ => "bookkeeping",
    }
}

fn row_item(r: &Interaction) -> String {
    let text = r
        .body
        .get("text")
        .and_then(|t| t.as_str())
        .map_or_else(|| summary(&r.body), str::to_string);
    let thread = r
        .thread
        .as_deref()
        .map(|t| format!("<span class=\"thread\">#{}</span> ", esc(t)))
        .unwrap_or_default();
    format!(
        "<li class=\"row {kind}\" data-cursor=\"{pos}\" data-thread=\"{in_thread}\"><time>{at}</time> {thread}\
         <span class=\"actor\">{actor}</span> <span class=\"role\">({role})</span> \
         <span class=\"text\">{text}</span></li>",
        kind = kind(r),
        in_thread = esc(r.thread.as_deref().unwrap_or("")),
        pos = r.position,
        at = esc(&format_time(r.at)),
        actor = esc(&r.actor),
        role = r.role,
        text = esc(&text),
    )
}

/// Consecutive bookkeeping rows (newest first) as one line: how many of each verb,
/// the details on hover.
fn bookkeeping_item(group: &[&Interaction]) -> String {
    let mut verbs: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in group {
        *verbs.entry(r.verb.as_str()).or_default() += 1;
    }
    let counts: Vec<String> = verbs
        .iter()
        .map(|(v, n)| {
            if *n == 1 {
                v.to_string()
            } else {
                format!("{v} ×{n}")
            }
        })
        .collect();
    let detail: Vec<String> = group
        .iter()
        .take(20)
        .map(|r| format!("{} {} {}", r.actor, r.verb, summary(&r.body)))
        .collect();
    format!(
        "<li class=\"row bookkeeping\" data-cursor=\"{pos}\" title=\"{detail}\"><time>{at}</time> \
         <span class=\"text\">{n} bookkeeping: {counts}</span></li>",
        pos = group[0].position,
        at = esc(&format_time(group[0].at)),
        n = group.len(),
        counts = esc(&counts.join(", ")),
        detail = esc(&detail.join("\n")),
    )
}

/// What an agent is on, in words.
fn on_text(on: &Option<huddle_core::board::Subject>) -> String {
    match on {
        None => String::new(),
        Some(s) => match &s.label {
            Some(l) => format!("{} {} \"{}\"", s.kind.as_str(), s.id, l),
            None => format!("{} {}", s.kind.as_str(), s.id),
        },
    }
}

/// The board, relays, DAG and claims of the room.
async fn live_html(state: &Shared, fold: &RoomFold) -> Result<String, ApiError> {
    let store = &*state.store;
    let room = fold.state.room();
    let board = state_cmds::board_view_from(store, &fold.state)
        .await
        .map_err(ApiError::from_build)?;
    let tasks = state_cmds::tasks_view_from(&fold.state);
    let claims = ledger_cmds::claim_rows(store, "", Some(room), true)
        .await
        .map_err(ApiError::from_build)?;
    let relays = &fold.state.relays;
    let patterns = &fold.state.patterns;
    // Each relay's liveness lease: online while live; the page refreshes when one
    // it shows would lapse.
    let leases: std::collections::BTreeMap<String, (bool, Timestamp)> = store
        .list_claims("relay/")
        .await
        .map_err(|e| ApiError::from_build(e.into()))?
        .into_iter()
        .filter_map(|c| {
            let id = c.state.key.strip_prefix("relay/")?.to_string();
            Some((id, (c.live, c.state.expires_at)))
        })
        .collect();
    let now = store
        .now()
        .await
        .map_err(|e| ApiError::from_build(e.into()))?;
    let mut out = String::new();
    summary_html(&mut out, &board, &tasks);
    board_html(&mut out, &board);
    out.push_str("<section id=\"relays\"><h2>Relays</h2><ul>");
    match relays.room(room) {
        Some(rr) if !rr.relays.is_empty() => {
            for (id, seen) in &rr.relays {
                let lease = leases.get(id).filter(|(live, _)| *live);
                let word = if lease.is_some() { "online" } else { "offline" };
                let expires = lease
                    .map(|(_, at)| format!(" data-expires=\"{}\"", at.as_micros()))
                    .unwrap_or_default();
                let _ = write!(
                    out,
                    "<li class=\"relay {word}\" data-relay=\"{id}\"{expires}>{id} <b>{word}</b> · hosts {agents} · last heartbeat {at}</li>",
                    id = esc(id),
                    agents = esc(&seen.heartbeat.agents.join(", ")),
                    at = esc(&format_time(seen.at)),
                );
            }
        }
        _ => out.push_str("<li>no relay has written a heartbeat in this room</li>"),
    }
    out.push_str("</ul></section>");
    out.push_str(
        "<section id=\"dag-box\"><h2>Task DAG <small>(wheel: zoom, drag: pan; thick: critical path)</small></h2>\
         <div class=\"legend\"><span class=\"waiting\">waiting</span><span class=\"ready\">ready</span>\
         <span class=\"claimed\">claimed</span><span class=\"submitted\">in review</span><span class=\"done\">done</span><span class=\"retrying\">retrying</span>\
         <span class=\"blocked\">blocked</span><span class=\"abandoned\">abandoned</span>\
         <span class=\"cancelled\">cancelled</span></div>",
    );
    out.push_str(&dag::svg(&tasks));
    out.push_str("</section>");
    claims_html(&mut out, &claims, now);
    patterns_html(&mut out, patterns, room, now);
    Ok(out)
}

fn summary_html(out: &mut String, board: &BoardView, tasks: &TasksView) {
    let s = &tasks.summary;
    let _ = write!(
        out,
        "<section id=\"summary\"><span class=\"owner\">owner {owner}</span> \
         <span id=\"counts\" data-done=\"{done}\" data-total=\"{total}\">{done}/{total} done</span> · \
         {claimed} claimed · {submitted} in review · {ready} ready · {waiting} waiting · {blocked} blocked · {abandoned} abandoned · {cancelled} cancelled{refused}</section>",
        owner = esc(board.owner.as_deref().unwrap_or("?")),
        done = s.done,
        total = s.total,
        claimed = s.claimed,
        submitted = s.submitted,
        ready = s.ready,
        waiting = s.waiting,
        blocked = s.blocked,
        abandoned = s.abandoned,
        cancelled = s.cancelled,
        refused = if tasks.refused + tasks.malformed > 0 {
            format!(" · {} task rows refused", tasks.refused + tasks.malformed)
        } else {
            String::new()
        },
    );
}

fn board_html(out: &mut String, board: &BoardView) {
    out.push_str(
        "<section id=\"board\"><h2>Board</h2><table><thead><tr><th>agent</th><th>state</th>\
         <th>on</th><th>done</th><th>turns</th><th>failed</th><th>tokens</th></tr></thead><tbody>",
    );
    if board.agents.is_empty() {
        out.push_str("<tr><td colspan=\"7\">no agents yet</td></tr>");
    }
    for a in &board.agents {
        let offline = a
            .hosting
            .as_deref()
            .is_some_and(|h| h.starts_with("offline"));
        let state = if offline { "offline" } else { a.state.as_str() };
        let mut on = on_text(&a.on);
        if let Some(n) = &a.note {
            on = format!("{on} — {n}");
        }
        let _ = write!(
            out,
            "<tr class=\"agent {state}\" data-agent=\"{agent}\" data-state=\"{state}\"><td>{agent}</td>\
             <td>{state}{hosting}</td><td>{on}</td><td>{done}</td><td>{turns}</td><td>{failed}</td><td>{tokens}</td></tr>",
            agent = esc(&a.agent),
            state = esc(state),
            hosting = a
                .hosting
                .as_deref()
                .filter(|_| offline)
                .map(|h| format!(" <small>{}</small>", esc(h.strip_prefix("offline ").unwrap_or(h))))
                .unwrap_or_default(),
            on = esc(on.trim_start_matches(" — ")),
            done = a.tasks_done,
            turns = a.turns,
            failed = a.failed_turns,
            tokens = a.tokens,
        );
    }
    out.push_str("</tbody></table>");
    if !board.waiting_on_absent.is_empty() {
        let _ = write!(
            out,
            "<p class=\"warn\">{} messages wait on absent agents</p>",
            board.waiting_on_absent.len()
        );
    }
    if !board.notices.is_empty() {
        out.push_str("<ul class=\"notices\">");
        for n in board.notices.iter().rev().take(10) {
            let _ = write!(
                out,
                "<li>{} {}: {}</li>",
                esc(&format_time(n.at)),
                esc(&n.about),
                esc(&n.text)
            );
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
}

/// The room's decisions, barriers and leases, where it has them, in the words of
/// `huddle decisions`, `huddle barriers` and `huddle lease`.
fn patterns_html(out: &mut String, patterns: &huddle_agent::Patterns, room: &str, now: Timestamp) {
    use crate::pattern_cmds::{barrier_lines, decision_lines, lease_lines};
    let mut text = String::new();
    let decisions = patterns.decisions(room, now, None);
    let barriers = patterns.barriers(room, now, None);
    let leases = patterns.leases(room, now, None);
    if !decisions.is_empty() {
        text.push_str("decisions:\n");
        decisions.iter().for_each(|d| decision_lines(&mut text, d));
    }
    if !barriers.is_empty() {
        text.push_str("barriers:\n");
        barriers.iter().for_each(|b| barrier_lines(&mut text, b));
    }
    if !leases.is_empty() {
        text.push_str("leases:\n");
        leases.iter().for_each(|l| lease_lines(&mut text, l));
    }
    if !text.is_empty() {
        let _ = write!(
            out,
            "<section id=\"patterns\"><h2>Decisions, barriers, leases</h2><pre>{}</pre></section>",
            esc(&text)
        );
    }
}

fn claims_html(out: &mut String, claims: &[huddle_store::ClaimRow], now: Timestamp) {
    let _ = write!(
        out,
        "<section id=\"claims\" data-now=\"{}\"><h2>Live claims ({})</h2><table><thead><tr><th>key</th>\
         <th>holder</th><th>epoch</th><th>time left</th></tr></thead><tbody>",
        now.as_micros(),
        claims.len()
    );
    if claims.is_empty() {
        out.push_str("<tr><td colspan=\"4\">none</td></tr>");
    }
    for c in claims {
        let left = c.state.expires_at.micros_since(now).max(0) as f64 / 1e6;
        let _ = write!(
            out,
            "<tr class=\"claim\"><td>{key}</td><td>{holder}</td><td>{epoch}</td>\
             <td class=\"left\" data-expires=\"{exp}\">{left:.1} s</td></tr>",
            key = esc(&c.state.key),
            holder = match &c.driver {
                Some(d) => format!("{} (driven by {})", esc(&c.state.holder), esc(d)),
                None => esc(&c.state.holder),
            },
            epoch = c.state.epoch,
            exp = c.state.expires_at.as_micros(),
        );
    }
    out.push_str("</tbody></table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_paths_are_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(path_segment("a b/é?"), "a%20b%2F%C3%A9%3F");
    }
}
