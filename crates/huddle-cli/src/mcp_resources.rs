//! The resources of `huddle mcp` (plan 0021): the room's timeline, board and tasks as
//! JSON documents, with subscriptions. Both generations of MCP subscriptions are
//! served: `resources/subscribe` (protocol versions up to 2025-11-25) and
//! `subscriptions/listen` (2026-07-28). One follower per subscription reads the room
//! forward (long-polling on the store's doorbell, as `read` with `wait_ms` does) and
//! sends `notifications/resources/updated` for each subscribed resource whose content
//! changed. Clients drop or mis-route notifications often enough that `read` with
//! `wait_ms` stays the dependable path; the resources are for clients that show state.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use huddle_agent::views::ReadArgs;
use huddle_agent::{AgentSession, MAX_WAIT_MS};
use huddle_core::Position;
use rmcp::model::{
    ErrorData, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::Peer;
use rmcp::RoleServer;
use tokio::sync::Mutex;

/// How many interactions the timeline resource shows (the newest).
const TIMELINE: u32 = 50;

/// The room's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Timeline,
    Board,
    Tasks,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Timeline, Kind::Board, Kind::Tasks];

    fn name(self) -> &'static str {
        match self {
            Kind::Timeline => "timeline",
            Kind::Board => "board",
            Kind::Tasks => "tasks",
        }
    }

    fn uri(self, room: &str) -> String {
        format!("huddle://room/{room}/{}", self.name())
    }

    fn parse(room: &str, uri: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.uri(room) == uri)
    }

    fn description(self) -> &'static str {
        match self {
            Kind::Timeline => "the room's newest interactions (as `read` returns them)",
            Kind::Board => {
                "who is doing what: the <coordination> block and the board (as `board` returns it)"
            }
            Kind::Tasks => "the task DAG and what you may claim (as `tasks` returns it)",
        }
    }
}

/// The legacy (`resources/subscribe`) subscriptions of one server, and the baseline
/// of their follower while it runs.
#[derive(Default)]
pub struct Subscriptions {
    state: Mutex<(BTreeSet<String>, Option<Baseline>)>,
    /// Baselines of `subscriptions/listen` requests, taken before their
    /// acknowledgment and picked up by their `listen`.
    pending: std::sync::Mutex<Vec<Baseline>>,
}

fn unknown(room: &str, uri: &str) -> ErrorData {
    ErrorData::resource_not_found(
        format!(
            "no resource {uri:?}; this server has {}",
            Kind::ALL.map(|k| k.uri(room)).join(", ")
        ),
        None,
    )
}

/// `resources/list`.
pub fn list(session: &AgentSession) -> ListResourcesResult {
    let room = session.room();
    ListResourcesResult::with_all_items(
        Kind::ALL
            .into_iter()
            .map(|k| {
                Resource::new(k.uri(room), format!("{room} {}", k.name()))
                    .with_description(k.description())
                    .with_mime_type("application/json")
            })
            .collect(),
    )
}

/// The JSON text of a resource now.
async fn content(session: &AgentSession, kind: Kind) -> Result<String, ErrorData> {
    let value = match kind {
        Kind::Timeline => session
            .read(ReadArgs {
                limit: Some(TIMELINE),
                ..Default::default()
            })
            .await
            .map(|r| serde_json::to_value(r.interactions)),
        Kind::Board => session.board().await.map(serde_json::to_value),
        Kind::Tasks => session.tasks().await.map(serde_json::to_value),
    };
    let value = value
        .map_err(|e| ErrorData::internal_error(format!("[{}] {e}", e.code()), None))?
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(serde_json::to_string_pretty(&value).unwrap_or_default())
}

/// `resources/read`.
pub async fn read(session: &AgentSession, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let kind = Kind::parse(session.room(), uri).ok_or_else(|| unknown(session.room(), uri))?;
    let text = content(session, kind).await?;
    Ok(ReadResourceResult::new(vec![ResourceContents::text(
        text, uri,
    )
    .with_mime_type("application/json")]))
}

/// Which of `requested` are this server's resources.
pub fn accepted(session: &AgentSession, requested: &[String]) -> Vec<String> {
    requested
        .iter()
        .filter(|u| Kind::parse(session.room(), u).is_some())
        .cloned()
        .collect()
}

/// Where a follower starts: the end of the room and the content of the subscribed
/// resources, both taken when the client subscribed, so a change that lands before
/// the follower runs is still sent.
pub struct Baseline {
    cursor: String,
    seen: Arc<Mutex<BTreeMap<Kind, String>>>,
}

impl Baseline {
    /// The room's end now, with no resource seen yet.
    pub async fn now(session: &AgentSession) -> Baseline {
        let cursor = match session.cursor().await {
            Ok(c) => c,
            Err(_) => Position::START.to_string(),
        };
        Baseline {
            cursor,
            seen: Default::default(),
        }
    }

    /// Records the content of `uri` now, unless it was recorded already (the timeline
    /// needs none: any row after the cursor changes it).
    pub async fn see(&self, session: &AgentSession, uri: &str) {
        let Some(kind) = Kind::parse(session.room(), uri).filter(|k| *k != Kind::Timeline) else {
            return;
        };
        if self.seen.lock().await.contains_key(&kind) {
            return;
        }
        if let Ok(now) = content(session, kind).await {
            self.seen.lock().await.entry(kind).or_insert(now);
        }
    }

    /// The room's end and the content of `uris` now.
    pub async fn of(session: &AgentSession, uris: &[String]) -> Baseline {
        let b = Baseline::now(session).await;
        for uri in uris {
            b.see(session, uri).await;
        }
        b
    }

    fn share(&self) -> Baseline {
        Baseline {
            cursor: self.cursor.clone(),
            seen: self.seen.clone(),
        }
    }
}

/// Follows the room from the baseline until `notify` fails (the client went away or
/// the subscription ended): after new rows, sends the timeline and each other
/// resource of `subscribed()` whose content differs from what it was last.
pub async fn follow<S, SF, N, NF>(
    session: Arc<AgentSession>,
    start: Baseline,
    subscribed: S,
    mut notify: N,
) where
    S: Fn() -> SF,
    SF: Future<Output = Vec<String>>,
    N: FnMut(String) -> NF,
    NF: Future<Output = bool>,
{
    let Baseline { mut cursor, seen } = start;
    loop {
        let news = session
            .read(ReadArgs {
                after: Some(cursor.clone()),
                limit: Some(500),
                wait_ms: Some(MAX_WAIT_MS),
                ..Default::default()
            })
            .await;
        let fresh = match news {
            Ok(r) => {
                cursor = r.next;
                !r.interactions.is_empty()
            }
            Err(e) => {
                tracing::warn!(error = %e, "resource follower: reading the room failed; retrying");
                tokio::time::sleep(session.store().poll_interval()).await;
                continue;
            }
        };
        if !fresh {
            continue;
        }
        for uri in subscribed().await {
            let changed = match Kind::parse(session.room(), &uri) {
                None => false,
                Some(Kind::Timeline) => true,
                Some(kind) => {
                    let Ok(now) = content(&session, kind).await else {
                        continue;
                    };
                    // The first look sets the baseline of a resource subscribed
                    // since; after that, each change is sent.
                    seen.lock()
                        .await
                        .insert(kind, now.clone())
                        .is_some_and(|b| b != now)
                }
            };
            if changed && !notify(uri).await {
                return;
            }
        }
    }
}

impl Subscriptions {
    /// `resources/subscribe`: adds `uri` with its content now as the baseline; starts
    /// the follower on the first one.
    pub async fn subscribe(
        self: &Arc<Self>,
        session: &Arc<AgentSession>,
        uri: String,
        peer: Peer<RoleServer>,
    ) -> Result<(), ErrorData> {
        if Kind::parse(session.room(), &uri).is_none() {
            return Err(unknown(session.room(), &uri));
        }
        let mut guard = self.state.lock().await;
        let baseline = match &guard.1 {
            Some(b) => b.share(),
            None => {
                let b = Baseline::now(session).await;
                guard.1 = Some(b.share());
                let subs = self.clone();
                let session = session.clone();
                let start = b.share();
                tokio::spawn(async move {
                    let list = || async { subs.state.lock().await.0.iter().cloned().collect() };
                    follow(session, start, list, |uri| {
                        let peer = peer.clone();
                        async move {
                            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                                .await
                                .is_ok()
                        }
                    })
                    .await;
                    subs.state.lock().await.1 = None;
                });
                b
            }
        };
        baseline.see(session, &uri).await;
        guard.0.insert(uri);
        Ok(())
    }

    /// Takes the baseline of a `subscriptions/listen` request for `uris` now, before
    /// the SDK acknowledges it (the client may change the room as soon as it has the
    /// acknowledgment). Needs the multi-threaded runtime; elsewhere `listen` takes
    /// its baseline when it starts.
    pub fn baseline_before_ack(&self, session: &AgentSession, uris: &[String]) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        let b = tokio::task::block_in_place(|| rt.block_on(Baseline::of(session, uris)));
        if let Ok(mut pending) = self.pending.lock() {
            pending.push(b);
        }
    }

    /// The baseline of a `listen` starting now: the earliest one pending (an earlier
    /// baseline can only cause an extra notification, never a missed one), or now.
    pub async fn listen_baseline(&self, session: &AgentSession, uris: &[String]) -> Baseline {
        let taken = self.pending.lock().ok().and_then(|mut p| {
            let i = (0..p.len()).min_by_key(|&i| p[i].cursor.parse::<Position>().ok())?;
            Some(p.swap_remove(i))
        });
        match taken {
            Some(b) => b,
            None => Baseline::of(session, uris).await,
        }
    }

    /// `resources/unsubscribe`.
    pub async fn unsubscribe(&self, uri: &str) {
        self.state.lock().await.0.remove(uri);
    }
}
