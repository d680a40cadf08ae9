//! `GET /metrics`: the Prometheus text format (version 0.0.4), computed at scrape time
//! from the server's folds (each read forward from its cursor: a scrape reads the rows
//! appended since the last request) and the claims table, plus the server's own
//! counters.
//!
//! Written by hand rather than through a metrics crate: every ledger value is a fold's,
//! read when scraped, so a registry would only be a second copy of the state.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::{ApiError, Shared};
use crate::{state_cmds, status_cmds};

/// The server's own counters.
#[derive(Default)]
pub(crate) struct Counters {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    sse_clients: Arc<AtomicU64>,
    sse_events: AtomicU64,
    fragment_renders: AtomicU64,
}

/// Counts one open event stream while it lives.
pub(crate) struct ClientGuard(Arc<AtomicU64>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Counters {
    /// One answered request.
    pub(crate) fn request(&self, route: &'static str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route, status)).or_default() += 1;
        }
    }

    /// A new event stream, counted until the guard drops.
    pub(crate) fn sse_client(&self) -> ClientGuard {
        self.sse_clients.fetch_add(1, Ordering::Relaxed);
        ClientGuard(Arc::clone(&self.sse_clients))
    }

    /// One live fragment rendered (not served from the cache).
    pub(crate) fn fragment_render(&self) {
        self.fragment_renders.fetch_add(1, Ordering::Relaxed);
    }

    /// One event sent.
    pub(crate) fn sse_event(&self) {
        self.sse_events.fetch_add(1, Ordering::Relaxed);
    }
}

/// The route label of a path (a fixed set, so labels stay few).
pub(crate) fn route_of(path: &str) -> &'static str {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [""] => "/",
        ["rooms", _] => "/rooms/{room}",
        ["rooms", _, "live"] => "/rooms/{room}/live",
        ["assets", _] => "/assets",
        ["api", "rooms"] => "/api/rooms",
        ["api", "rooms", _, "tasks"] => "/api/rooms/{room}/tasks",
        ["api", "rooms", _, "board"] => "/api/rooms/{room}/board",
        ["api", "rooms", _, "claims"] => "/api/rooms/{room}/claims",
        ["api", "rooms", _, "interactions"] => "/api/rooms/{room}/interactions",
        ["api", "rooms", _, "events"] => "/api/rooms/{room}/events",
        ["api", "rooms", _, "messages"] => "/api/rooms/{room}/messages",
        ["metrics"] => "/metrics",
        _ => "other",
    }
}

/// A label value escaped for the text format.
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Text-format writer: `# HELP` / `# TYPE` once per family, then samples.
struct Exposition(String);

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let _ = write!(self.0, "{name}");
        if !labels.is_empty() {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", inner.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// `GET /metrics`
pub async fn metrics(State(state): State<Shared>) -> Result<Response, ApiError> {
    let text = scrape(&state).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response())
}

async fn scrape(state: &Shared) -> Result<String, ApiError> {
    let store = &*state.store;
    // The ledger-wide counts, read forward from where the last request left off.
    let (rooms, verbs, skipped, known) = {
        let ledger = state.folds.ledger(store).await?;
        let mut known: std::collections::BTreeSet<String> = Default::default();
        for (_, rr) in ledger.relays.rooms() {
            known.extend(rr.relays.keys().cloned());
        }
        (
            ledger.rooms.rows(),
            ledger.verbs.clone(),
            ledger.skipped,
            known,
        )
    };
    let mut m = Exposition(String::new());
    m.family(
        "huddle_interactions",
        "gauge",
        "Verified ledger rows by room and verb (appends so far).",
    );
    for ((room, verb), n) in &verbs {
        m.sample("huddle_interactions", &[("room", room), ("verb", verb)], n);
    }
    m.family(
        "huddle_skipped_rows",
        "gauge",
        "Ledger rows readers skip: failed verification (corrupt or foreign).",
    );
    m.sample("huddle_skipped_rows", &[], skipped);

    let live = status_cmds::live_relays(store)
        .await
        .map_err(ApiError::from_build)?;
    let now = store
        .now()
        .await
        .map_err(|e| ApiError::from_build(e.into()))?;
    m.family(
        "huddle_tasks",
        "gauge",
        "Tasks by room and status, as `huddle tasks` folds them.",
    );
    let mut refused: Vec<(String, u64, u64)> = Vec::new();
    let mut boards = Vec::new();
    for r in rooms.iter().filter(|r| r.owner.is_some()) {
        // Each room's fold, read forward from where it was.
        let fold = state.folds.room(store, &r.room).await?;
        boards.push(state_cmds::board_core(&fold.state, &live, now));
        let dag = &fold.state.tally.dag;
        let s = dag.summary(&r.room);
        for (status, n) in [
            ("done", s.done),
            ("claimed", s.claimed),
            ("ready", s.ready),
            ("waiting", s.waiting),
            ("blocked", s.blocked),
            ("abandoned", s.abandoned),
            ("cancelled", s.cancelled),
        ] {
            m.sample("huddle_tasks", &[("room", &r.room), ("status", status)], n);
        }
        let (n, malformed) = dag
            .room(&r.room)
            .map_or((0, 0), |t| (t.refusals.refused, t.refusals.malformed));
        refused.push((r.room.clone(), n, malformed));
    }
    m.family(
        "huddle_task_rows_refused",
        "gauge",
        "Task rows the task fold refused (stale epochs, not the owner, malformed).",
    );
    for (room, n, malformed) in &refused {
        m.sample(
            "huddle_task_rows_refused",
            &[("room", room), ("why", "refused")],
            n,
        );
        m.sample(
            "huddle_task_rows_refused",
            &[("room", room), ("why", "malformed")],
            malformed,
        );
    }

    m.family(
        "huddle_agents",
        "gauge",
        "Agents on each room's board by hosting: online, offline (every relay hosting it is down) or unknown (no heartbeat lists it).",
    );
    for b in &boards {
        let mut by_state: BTreeMap<&str, usize> = [("online", 0), ("offline", 0), ("unknown", 0)]
            .into_iter()
            .collect();
        for a in &b.agents {
            let state = match a.hosting.as_deref() {
                Some("online") => "online",
                Some(h) if h.starts_with("offline") => "offline",
                _ => "unknown",
            };
            *by_state.entry(state).or_default() += 1;
        }
        for (state, n) in by_state {
            m.sample("huddle_agents", &[("room", &b.room), ("state", state)], n);
        }
    }
    type Count = fn(&state_cmds::BoardAgent) -> u64;
    let per_agent: [(&str, &str, Count); 4] = [
        (
            "huddle_agent_tasks_done",
            "Completions accepted from each agent.",
            |a| a.tasks_done,
        ),
        (
            "huddle_agent_turns",
            "Turns each agent was prompted for.",
            |a| a.turns,
        ),
        (
            "huddle_agent_failed_turns",
            "Each agent's failed turns.",
            |a| a.failed_turns,
        ),
        (
            "huddle_agent_tokens",
            "Tokens each agent's turns reported.",
            |a| a.tokens,
        ),
    ];
    for (name, help, count) in per_agent {
        m.family(name, "gauge", help);
        for b in &boards {
            for a in &b.agents {
                m.sample(name, &[("room", &b.room), ("agent", &a.agent)], count(a));
            }
        }
    }

    let claims = store
        .list_claims("")
        .await
        .map_err(|e| ApiError::from_build(e.into()))?;
    let mut by_kind: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for c in &claims {
        let kind = c.state.key.split('/').next().unwrap_or("").to_string();
        let st = if c.live { "live" } else { "expired" };
        *by_kind.entry((kind, st)).or_default() += 1;
    }
    m.family(
        "huddle_claims",
        "gauge",
        "Claim rows by kind (the key's first part) and state (live: unexpired by the database clock).",
    );
    for ((kind, st), n) in &by_kind {
        m.sample("huddle_claims", &[("kind", kind), ("state", st)], n);
    }

    let online = known.iter().filter(|r| live.contains(*r)).count();
    m.family(
        "huddle_relays",
        "gauge",
        "Relays that wrote heartbeats, online (live relay lease) or offline.",
    );
    m.sample("huddle_relays", &[("state", "online")], online);
    m.sample(
        "huddle_relays",
        &[("state", "offline")],
        known.len() - online,
    );

    m.family(
        "huddle_http_requests_total",
        "counter",
        "Requests this server answered, by route and status.",
    );
    if let Ok(reqs) = state.counters.requests.lock() {
        for ((route, status), n) in reqs.iter() {
            m.sample(
                "huddle_http_requests_total",
                &[("route", route), ("status", &status.to_string())],
                n,
            );
        }
    }
    m.family("huddle_sse_clients", "gauge", "Event streams open now.");
    m.sample(
        "huddle_sse_clients",
        &[],
        state.counters.sse_clients.load(Ordering::Relaxed),
    );
    m.family(
        "huddle_sse_events_total",
        "counter",
        "Events sent on event streams.",
    );
    m.sample(
        "huddle_sse_events_total",
        &[],
        state.counters.sse_events.load(Ordering::Relaxed),
    );
    m.family(
        "huddle_fold_rows_read_total",
        "counter",
        "Rows the server's folds read from the database (each reads forward from its cursor).",
    );
    m.sample("huddle_fold_rows_read_total", &[], state.folds.rows_read());
    m.family(
        "huddle_fragment_renders_total",
        "counter",
        "Room fragments rendered for pages (the rest were served from the last render).",
    );
    m.sample(
        "huddle_fragment_renders_total",
        &[],
        state.counters.fragment_renders.load(Ordering::Relaxed),
    );
    Ok(m.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_routes_few() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(route_of("/api/rooms/x/tasks"), "/api/rooms/{room}/tasks");
        assert_eq!(route_of("/"), "/");
        assert_eq!(route_of("/etc/passwd/../x"), "other");
    }
}
