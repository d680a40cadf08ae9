//! Shared resources in an agent's hands: `resource_acquire`, `resource_renew`,
//! `resource_release` and `resources` (`huddle_core::resources` has the names, modes
//! and the conflict rule; the store decides).
//!
//! An acquisition asks the store for the whole set at once
//! ([`huddle_store::Claims::acquire_resources`]: all or nothing, in the global order,
//! in one transaction judged by the database clock), waiting up to `wait_ms` for a
//! doorbell, the fallback poll or the first blocking holding's expiry between tries;
//! it never holds part of a set while it waits. Won, it records `resource.acquired`
//! under the fences of every holding it took. A renewal renews each claim and records
//! `resource.renewed` under their fences; a release gives the claims back first (so
//! a waiter woken by the row finds them free) and then records `resource.released`.
//!
//! **Kept holdings.** What a session acquired is kept alive by
//! [`AgentSession::keep_resources`] (renewed at a third of its lease) for as long as
//! the front end runs it — `huddle mcp` for the life of the server, which for an
//! agent a relay drives is the life of its turn — and given back by
//! [`AgentSession::release_kept`] when the front end ends. A killed holder renews
//! nothing, and its holdings lapse after their lease.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use huddle_core::resources::{
    holder_prefix, ordered, HeldBody, Holding, Mode, ResourceName, ResourceRowBody, Wanted,
    MAX_PERMITS,
};
use huddle_core::{NewInteraction, Role, Timestamp, Verb};
use huddle_store::resources::{holding, live_holdings};
use huddle_store::{Fence, ResourcesAcquired, StoreError};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{AgentError, Result};
use crate::resource_views::{
    HoldingView, ResourceAcquireArgs, ResourceNamesArgs, ResourceSpec, ResourcesArgs,
    ResourcesResult, ResourcesWritten,
};
use crate::session::AgentSession;
use crate::views::{written, Written};

/// Default lease of a holding, ms.
pub const DEFAULT_RESOURCE_TTL_MS: u64 = 60_000;
/// Shortest and longest lease, ms.
pub const MIN_RESOURCE_TTL_MS: u64 = 500;
/// Longest lease, ms (an hour).
pub const MAX_RESOURCE_TTL_MS: u64 = 3_600_000;
/// Longest wait of one acquisition, ms (ten minutes).
pub const MAX_RESOURCE_WAIT_MS: u64 = 600_000;
/// Longest `reason`, characters.
const MAX_REASON_CHARS: usize = 200;

/// A holding this session took and keeps alive.
#[derive(Clone, Debug)]
struct KeptHolding {
    holding: Holding,
    ttl: Duration,
    /// When to renew next (a third of the lease after the last renewal).
    due: Instant,
}

/// The holdings a session keeps alive, and a bell for when they change.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    held: Mutex<BTreeMap<String, KeptHolding>>,
    changed: Notify,
}

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KeptHolding>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn keep(&self, holdings: &[Holding], ttl: Duration) {
        let due = Instant::now() + ttl / 3;
        let mut held = self.lock();
        for h in holdings {
            // Taking a resource again in another mode replaced the old holding.
            held.retain(|_, k| !(k.holding.name == h.name && k.holding.mode != h.mode));
            held.insert(
                h.key.clone(),
                KeptHolding {
                    holding: h.clone(),
                    ttl,
                    due,
                },
            );
        }
        drop(held);
        self.changed.notify_one();
    }

    fn forget(&self, keys: &[String]) {
        let mut held = self.lock();
        for k in keys {
            held.remove(k);
        }
    }

    fn ttl_of(&self, key: &str) -> Option<Duration> {
        self.lock().get(key).map(|k| k.ttl)
    }
}

fn ttl_arg(ttl_ms: Option<u64>) -> Result<Duration> {
    let ms = ttl_ms.unwrap_or(DEFAULT_RESOURCE_TTL_MS);
    if !(MIN_RESOURCE_TTL_MS..=MAX_RESOURCE_TTL_MS).contains(&ms) {
        return Err(AgentError::BadArgument(format!(
            "ttl_ms {ms}: give {MIN_RESOURCE_TTL_MS} to {MAX_RESOURCE_TTL_MS}"
        )));
    }
    Ok(Duration::from_millis(ms))
}

fn bad(e: impl std::fmt::Display) -> AgentError {
    AgentError::BadArgument(e.to_string())
}

/// The wanted set of `resource_acquire`'s specs, checked and in the global order.
pub fn wanted_of(specs: &[ResourceSpec]) -> Result<Vec<Wanted>> {
    let wanted = specs
        .iter()
        .map(|s| {
            let name = ResourceName::parse(&s.name).map_err(bad)?;
            let mode = match (s.mode.as_deref().unwrap_or("exclusive"), s.permits) {
                ("exclusive", None) => Mode::Exclusive,
                ("shared", None) => Mode::Shared,
                ("permits", Some(n)) if (1..=MAX_PERMITS).contains(&n) => Mode::Permits(n),
                ("permits", _) => {
                    return Err(bad(format!(
                        "resource {name}: mode permits needs `permits`, 1 to {MAX_PERMITS}"
                    )))
                }
                (m @ ("exclusive" | "shared"), Some(_)) => {
                    return Err(bad(format!(
                        "resource {name}: `permits` goes with mode permits, not {m}"
                    )))
                }
                (other, _) => {
                    // `permits-N`, as listings print it, is accepted too.
                    Mode::parse(other).map_err(bad)?
                }
            };
            Ok(Wanted { name, mode })
        })
        .collect::<Result<Vec<_>>>()?;
    ordered(wanted).map_err(bad)
}

/// The holdings in the way, for people: `file:src/** by ada (exclusive, epoch 3)
/// until 2024-...`.
fn describe_blocked(blocked: &[huddle_core::resources::Blocked]) -> String {
    let mut out = String::new();
    for (i, b) in blocked.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        let _ = write!(
            out,
            "{} is blocked by {} held by {} ({}, epoch {}) until {} µs (database clock)",
            b.wanted, b.by.name, b.by.holder, b.by.mode, b.by.epoch, b.by.expires_at
        );
    }
    out
}

fn bodies(held: &[Holding]) -> Vec<HeldBody> {
    held.iter()
        .map(|h| HeldBody {
            name: h.name.clone(),
            mode: h.mode,
            epoch: h.epoch,
        })
        .collect()
}

fn fences(held: &[Holding]) -> Vec<Fence> {
    held.iter()
        .map(|h| Fence {
            key: h.key.clone(),
            holder: h.holder.clone(),
            epoch: h.epoch,
        })
        .collect()
}

impl AgentSession {
    fn resource_row(&self, verb: Verb, body: &ResourceRowBody) -> NewInteraction {
        NewInteraction::new(
            self.room.as_str(),
            verb,
            self.agent.as_str(),
            Role::Agent,
            serde_json::to_value(body).unwrap_or_default(),
        )
    }

    /// This agent's live holdings in the room (the database's view).
    async fn my_holdings(&self) -> Result<Vec<Holding>> {
        Ok(self
            .store
            .list_claims(&holder_prefix(&self.room, &self.agent))
            .await?
            .iter()
            .filter(|r| r.live)
            .filter_map(holding)
            .collect())
    }

    /// `resource_acquire`: takes every resource of `args` together, waiting up to
    /// `wait_ms` for them, and records the acquisition. Refused, with every holding
    /// in the way, when they stay taken.
    pub async fn resource_acquire(&self, args: ResourceAcquireArgs) -> Result<ResourcesWritten> {
        let wanted = wanted_of(&args.resources)?;
        let ttl = ttl_arg(args.ttl_ms)?;
        let reason = match args.reason.as_deref().map(str::trim) {
            Some(r) if r.chars().count() > MAX_REASON_CHARS => {
                return Err(bad(format!(
                    "reason: at most {MAX_REASON_CHARS} characters"
                )))
            }
            Some(r) if r.chars().any(char::is_control) => {
                return Err(bad("reason: one line without control characters"))
            }
            Some("") | None => None,
            Some(r) => Some(r.to_string()),
        };
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0).min(MAX_RESOURCE_WAIT_MS));
        let deadline = Instant::now() + wait;
        loop {
            let blocked = match self
                .store
                .acquire_resources(&self.room, &self.agent, &wanted, ttl)
                .await?
            {
                ResourcesAcquired::Won(held) => {
                    return self.record_acquired(held, ttl, reason).await
                }
                ResourcesAcquired::Blocked(blocked) => blocked,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(AgentError::ResourcesBusy {
                    held: describe_blocked(&blocked),
                });
            }
            // Wake on news (a release rings the doorbell), the fallback poll, or just
            // after the first blocking holding lapses — at least a few ms from now.
            let db_now = self.store.now().await?;
            let lapse = blocked
                .iter()
                .map(|b| b.by.expires_at.micros_since(db_now).max(0))
                .min()
                .unwrap_or(0);
            let lapse = Duration::from_micros(lapse as u64) + Duration::from_millis(2);
            let until = deadline.min(now + lapse.max(Duration::from_millis(5)));
            self.wait_for_news(until).await;
        }
    }

    async fn record_acquired(
        &self,
        held: Vec<Holding>,
        ttl: Duration,
        reason: Option<String>,
    ) -> Result<ResourcesWritten> {
        let body = ResourceRowBody {
            resources: bodies(&held),
            ttl_ms: Some(ttl.as_millis() as u64),
            expires_at: held.iter().map(|h| h.expires_at).min(),
            reason,
        };
        let row = self.resource_row(Verb::ResourceAcquired, &body);
        match self.store.append_under(&fences(&held), false, vec![row]).await {
            Ok(out) => {
                self.store.flush().await;
                self.kept.keep(&held, ttl);
                tracing::info!(room = %self.room, agent = %self.agent, resources = held.len(), "resources acquired");
                Ok(ResourcesWritten {
                    resources: held.iter().map(HoldingView::from).collect(),
                    written: written(&out)?,
                })
            }
            Err(StoreError::Fenced { key, .. }) => Err(AgentError::LeaseLost(format!(
                "the holding {key} lapsed before its acquisition was recorded; nothing is held, take the resources again with a longer ttl_ms"
            ))),
            Err(e) => {
                // Give back what was taken but cannot be recorded now.
                for h in &held {
                    let _ = self.store.release(&h.key, &h.holder, h.epoch).await;
                }
                Err(e.into())
            }
        }
    }

    /// The holdings `names` (canonical; empty = all) among this agent's live ones.
    async fn select_mine(&self, names: &[String]) -> Result<Vec<Holding>> {
        let mine = self.my_holdings().await?;
        if names.is_empty() {
            return Ok(mine);
        }
        let mut out = Vec::new();
        for n in names {
            let name = ResourceName::parse(n).map_err(bad)?;
            let found: Vec<&Holding> = mine.iter().filter(|h| h.name == name).collect();
            if found.is_empty() {
                return Err(AgentError::NotResourceHolder {
                    name: name.to_string(),
                });
            }
            out.extend(found.into_iter().cloned());
        }
        Ok(out)
    }

    /// `resource_renew`: extends holdings this agent holds (all, or those named) and
    /// records it. Refused when one of them lapsed (the others are still renewed).
    pub async fn resource_renew(&self, args: ResourceNamesArgs) -> Result<ResourcesWritten> {
        let held = self.select_mine(&args.resources).await?;
        if held.is_empty() {
            return Err(AgentError::NotResourceHolder {
                name: "(any)".into(),
            });
        }
        self.renew_holdings(&held, args.ttl_ms).await
    }

    /// Renews `held`, each with `ttl_ms` or the lease it was kept with; records the
    /// renewed ones; refuses when any is lost.
    async fn renew_holdings(
        &self,
        held: &[Holding],
        ttl_ms: Option<u64>,
    ) -> Result<ResourcesWritten> {
        let asked = ttl_ms.map(|ms| ttl_arg(Some(ms))).transpose()?;
        let mut renewed = Vec::new();
        let mut lost = Vec::new();
        let mut longest = Duration::ZERO;
        for h in held {
            let ttl = asked
                .or_else(|| self.kept.ttl_of(&h.key))
                .unwrap_or(Duration::from_millis(DEFAULT_RESOURCE_TTL_MS));
            longest = longest.max(ttl);
            match self.store.renew(&h.key, &h.holder, h.epoch, ttl).await? {
                Some(state) => {
                    let mut h = h.clone();
                    h.expires_at = state.expires_at;
                    renewed.push((h, ttl));
                }
                None => lost.push(h.clone()),
            }
        }
        if !lost.is_empty() {
            self.kept
                .forget(&lost.iter().map(|h| h.key.clone()).collect::<Vec<_>>());
        }
        let holdings: Vec<Holding> = renewed.iter().map(|(h, _)| h.clone()).collect();
        let mut written_row = Written {
            id: String::new(),
            inserted: false,
        };
        if !holdings.is_empty() {
            let body = ResourceRowBody {
                resources: bodies(&holdings),
                ttl_ms: Some(longest.as_millis() as u64),
                expires_at: holdings.iter().map(|h| h.expires_at).min(),
                reason: None,
            };
            let row = self.resource_row(Verb::ResourceRenewed, &body);
            match self
                .store
                .append_under(&fences(&holdings), false, vec![row])
                .await
            {
                Ok(out) => {
                    self.store.flush().await;
                    written_row = written(&out)?;
                }
                Err(StoreError::Fenced { key, .. }) => {
                    return Err(AgentError::LeaseLost(format!(
                        "the holding {key} lapsed while it was renewed"
                    )))
                }
                Err(e) => return Err(e.into()),
            }
            for (h, ttl) in &renewed {
                self.kept.keep(std::slice::from_ref(h), *ttl);
            }
        }
        if let Some(h) = lost.first() {
            return Err(AgentError::LeaseLost(format!(
                "your holding of {} (epoch {}) lapsed before it was renewed; take it again with resource_acquire",
                h.name, h.epoch
            )));
        }
        Ok(ResourcesWritten {
            resources: holdings.iter().map(HoldingView::from).collect(),
            written: written_row,
        })
    }

    /// `resource_release`: gives back holdings this agent holds (all, or those
    /// named) and records it.
    pub async fn resource_release(&self, args: ResourceNamesArgs) -> Result<ResourcesWritten> {
        let held = self.select_mine(&args.resources).await?;
        self.release_holdings(held).await
    }

    async fn release_holdings(&self, held: Vec<Holding>) -> Result<ResourcesWritten> {
        let mut released = Vec::new();
        for h in held {
            if self.store.release(&h.key, &h.holder, h.epoch).await? {
                released.push(h);
            }
        }
        self.kept
            .forget(&released.iter().map(|h| h.key.clone()).collect::<Vec<_>>());
        if released.is_empty() {
            return Ok(ResourcesWritten {
                resources: Vec::new(),
                written: Written {
                    id: String::new(),
                    inserted: false,
                },
            });
        }
        let body = ResourceRowBody {
            resources: bodies(&released),
            ttl_ms: None,
            expires_at: None,
            reason: None,
        };
        let out = self
            .append_own(self.resource_row(Verb::ResourceReleased, &body))
            .await?;
        tracing::info!(room = %self.room, agent = %self.agent, resources = released.len(), "resources released");
        Ok(ResourcesWritten {
            resources: released.iter().map(HoldingView::from).collect(),
            written: out,
        })
    }

    /// `resources`: every live holding of the room, as the database holds them.
    pub async fn resources(&self, args: ResourcesArgs) -> Result<ResourcesResult> {
        let now = self.store.now().await?;
        let mut held = live_holdings(&*self.store, &self.room).await?;
        if let Some(path) = args.path.as_deref() {
            held.retain(|h| h.name.covers_path(path));
        }
        held.sort_by(|a, b| (&a.name, &a.holder).cmp(&(&b.name, &b.holder)));
        let views: Vec<HoldingView> = held.iter().map(HoldingView::from).collect();
        let mine = views
            .iter()
            .filter(|v| v.holder == self.agent)
            .cloned()
            .collect();
        Ok(ResourcesResult {
            held: views,
            mine,
            now,
        })
    }

    /// Keeps every holding this session acquired alive, renewing each at a third of
    /// its lease, until the future is dropped; returns early with the names of the
    /// holdings that could not be renewed (lapsed or taken over), which are no
    /// longer kept. Run it beside the front end that serves the session.
    pub async fn keep_resources(&self) -> Vec<String> {
        loop {
            let next = self.kept.lock().values().map(|k| k.due).min();
            let changed = self.kept.changed.notified();
            match next {
                None => changed.await,
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => {}
                        _ = changed => continue,
                    }
                }
            }
            let now = Instant::now();
            let due: Vec<Holding> = self
                .kept
                .lock()
                .values()
                .filter(|k| k.due <= now)
                .map(|k| k.holding.clone())
                .collect();
            if due.is_empty() {
                continue;
            }
            match self.renew_holdings(&due, None).await {
                Ok(_) => {}
                Err(AgentError::LeaseLost(why)) => {
                    tracing::warn!(room = %self.room, agent = %self.agent, %why, "a kept resource was lost");
                    let live: Vec<String> = self.kept.lock().keys().cloned().collect();
                    return due
                        .iter()
                        .filter(|h| !live.contains(&h.key))
                        .map(|h| h.name.to_string())
                        .collect();
                }
                Err(e) => {
                    // The database is away: try again shortly; the lease has two
                    // thirds of its length left.
                    tracing::warn!(room = %self.room, agent = %self.agent, error = %e, "renewing kept resources failed; retrying");
                    let soon = Instant::now() + Duration::from_millis(500);
                    for k in self.kept.lock().values_mut() {
                        k.due = k.due.max(soon);
                    }
                }
            }
        }
    }

    /// Gives back every holding this session acquired and still keeps (when its
    /// front end ends).
    pub async fn release_kept(&self) -> Result<ResourcesWritten> {
        let kept: Vec<Holding> = self
            .kept
            .lock()
            .values()
            .map(|k| k.holding.clone())
            .collect();
        self.release_holdings(kept).await
    }

    /// The database clock now.
    pub async fn now(&self) -> Result<Timestamp> {
        Ok(self.store.now().await?)
    }
}

/// Spawns a task that keeps `session`'s holdings alive ([`AgentSession::keep_resources`],
/// logging any that are lost) until it is aborted.
pub fn spawn_keeper(session: std::sync::Arc<AgentSession>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let lost = session.keep_resources().await;
            tracing::warn!(room = %session.room(), agent = %session.agent(), ?lost, "resources lost: no longer held");
        }
    })
}
