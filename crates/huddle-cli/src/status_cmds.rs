//! `huddle status`: the relays serving a room (or every room), online or offline by
//! their `relay/<id>` lease, with what their latest heartbeat says; and the presence
//! facts `huddle board` adds (offline agents, messages waiting on absent agents).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use huddle_core::relays::{Hosting, RelayFold, RoomRelays};
use huddle_core::{Fold, Position, Timestamp};
use huddle_store::{Store, StoreOptions};
use serde::Serialize;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::{emit, fold_admitted};

/// The relay ids whose `relay/<id>` lease is live now (database clock).
pub async fn live_relays(store: &dyn Store) -> anyhow::Result<BTreeSet<String>> {
    Ok(store
        .list_claims("relay/")
        .await?
        .into_iter()
        .filter(|c| c.live)
        .filter_map(|c| c.state.key.strip_prefix("relay/").map(str::to_string))
        .collect())
}

/// One relay as `huddle status` shows it.
#[derive(Debug, Serialize)]
pub struct RelayLine {
    /// Relay id.
    pub relay: String,
    /// `online` (its lease is live) or `offline`.
    pub state: &'static str,
    /// Rooms it wrote heartbeats in.
    pub rooms: Vec<String>,
    /// Agents its latest heartbeat lists.
    pub agents: Vec<String>,
    /// Its version.
    pub version: String,
    /// The process of its latest heartbeat.
    pub instance: String,
    /// Ledger rows it had not folded yet when it wrote its latest heartbeat.
    pub behind: u64,
    /// When it wrote its latest heartbeat (database time).
    pub last_heartbeat: Timestamp,
    /// Seconds since then, by the database clock.
    pub heartbeat_age_s: f64,
}

/// `huddle status --json`.
#[derive(Debug, Serialize)]
pub struct StatusView {
    /// The room asked about, or `None` for every room.
    pub room: Option<String>,
    /// Database time of the answer.
    pub now: Timestamp,
    /// Relays, by id.
    pub relays: Vec<RelayLine>,
}

/// The status of every relay whose heartbeats the folded rooms hold.
fn status_view(
    fold: &RelayFold,
    live: &BTreeSet<String>,
    room: Option<&str>,
    now: Timestamp,
) -> StatusView {
    let mut by_relay: std::collections::BTreeMap<String, RelayLine> = Default::default();
    for (r, rr) in fold.rooms() {
        for (id, seen) in &rr.relays {
            let line = by_relay.entry(id.clone()).or_insert_with(|| RelayLine {
                relay: id.clone(),
                state: if live.contains(id) {
                    "online"
                } else {
                    "offline"
                },
                rooms: Vec::new(),
                agents: Vec::new(),
                version: String::new(),
                instance: String::new(),
                behind: 0,
                last_heartbeat: seen.at,
                heartbeat_age_s: 0.0,
            });
            line.rooms.push(r.to_string());
            if seen.at >= line.last_heartbeat || line.instance.is_empty() {
                line.last_heartbeat = seen.at;
                line.agents = seen.heartbeat.agents.clone();
                line.version = seen.heartbeat.version.clone();
                line.instance = seen.heartbeat.instance.clone();
                line.behind = seen.heartbeat.behind;
            }
        }
    }
    let relays = by_relay
        .into_values()
        .map(|mut l| {
            l.heartbeat_age_s = now.micros_since(l.last_heartbeat).max(0) as f64 / 1e6;
            l
        })
        .collect();
    StatusView {
        room: room.map(str::to_string),
        now,
        relays,
    }
}

/// `huddle status [--room R] [--json]`
pub async fn status(
    db: &str,
    options: StoreOptions,
    room: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let store = ledger_cmds::open(db, options).await?;
    let mut fold = RelayFold::new();
    match room {
        Some(r) => fold_admitted(&*store, r, |row| fold.apply(row)).await?,
        None => {
            let mut cursor = Position::START;
            loop {
                let batch = store.read_forward(cursor, 5000).await?;
                for row in &batch.rows {
                    fold.apply(row);
                }
                if batch.next == cursor {
                    break;
                }
                cursor = batch.next;
            }
        }
    }
    let live = live_relays(&*store).await?;
    let now = store.now().await?;
    let view = status_view(&fold, &live, room, now);
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&view)?));
    }
    let mut out = String::new();
    match room {
        Some(r) => {
            let _ = writeln!(out, "relays serving room {r}:");
        }
        None => {
            let _ = writeln!(out, "relays:");
        }
    }
    if view.relays.is_empty() {
        let _ = writeln!(out, "(no relay has written a heartbeat yet)");
    }
    let _ = writeln!(
        out,
        "{:<12} {:<8} {:>6} {:<10} {:<23} agents",
        "relay", "state", "behind", "version", "last heartbeat"
    );
    for l in &view.relays {
        let _ = writeln!(
            out,
            "{:<12} {:<8} {:>6} {:<10} {:<23} {}",
            l.relay,
            l.state,
            l.behind,
            l.version,
            format!(
                "{} ({:.0}s ago)",
                format_time(l.last_heartbeat),
                l.heartbeat_age_s
            ),
            if l.agents.is_empty() {
                "-".to_string()
            } else {
                l.agents.join(", ")
            }
        );
    }
    emit(&out)
}

/// How the board shows an agent's hosting: `None` while nothing is known.
pub fn hosting_word(h: &Hosting) -> Option<String> {
    match h {
        Hosting::Online => Some("online".into()),
        Hosting::Offline(relays) => Some(format!("offline (relay {} down)", relays.join(", "))),
        Hosting::Unknown => None,
    }
}

/// A message the board reports as waiting on agents no live relay hosts.
#[derive(Debug, Serialize)]
pub struct AbsentWait {
    /// Message id (hex).
    pub message: String,
    /// Its author.
    pub author: String,
    /// When it was posted.
    pub at: Timestamp,
    /// The named agents that owe an answer and are absent, with why.
    pub absent: Vec<(String, String)>,
}

/// The messages of a room waiting on absent named agents, oldest first.
pub fn absent_waits(rr: &RoomRelays, live: &BTreeSet<String>, group_one: bool) -> Vec<AbsentWait> {
    rr.waiting_on_absent(live, group_one)
        .into_iter()
        .map(|(id, a, absent)| AbsentWait {
            message: id.to_string(),
            author: a.author.clone(),
            at: a.at,
            absent: absent
                .into_iter()
                .map(|(agent, h)| {
                    let why = match h {
                        Hosting::Offline(r) => format!("its relay {} is offline", r.join(", ")),
                        _ => "no relay's heartbeat lists it (an agent acting for itself may still answer)".into(),
                    };
                    (agent, why)
                })
                .collect(),
        })
        .collect()
}

/// Exit status of `huddle wait` when the room settled with tasks abandoned or blocked.
pub const EXIT_BLOCKED: u8 = 2;
/// Exit status of `huddle wait` when the room did not settle in time.
pub const EXIT_TIMED_OUT: u8 = 124;

/// `huddle wait` ended without every task done: the status to exit with and why.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct WaitEnded {
    /// [`EXIT_BLOCKED`] or [`EXIT_TIMED_OUT`].
    pub code: u8,
    /// What to print.
    pub message: String,
}

/// `huddle wait --room R [--timeout SECS]`: returns when the room settles — a relay
/// wrote a `room.settled` whose counts are the room's current ones and nothing is
/// ready, claimed or running — exiting 0 when every task is done, 2 when some are
/// abandoned or blocked, 124 when `timeout` passes first. Reads forward from its own
/// cursor, woken by the store's doorbell.
pub async fn wait(
    db: &str,
    options: StoreOptions,
    room: &str,
    timeout: Option<u64>,
) -> anyhow::Result<()> {
    use huddle_core::protocol::RoomSettledBody;
    let store = ledger_cmds::open(db, options).await?;
    // Fails when the room does not exist.
    fold_admitted(&*store, room, |_| {}).await?;
    let deadline = timeout.map(|s| std::time::Instant::now() + std::time::Duration::from_secs(s));
    let mut authority = huddle_core::OwnerAuthority::new();
    let mut tally = huddle_sim::Tally::new(room);
    let mut last: Option<RoomSettledBody> = None;
    let mut cursor = Position::START;
    let mut bell = store.doorbell();
    loop {
        loop {
            let batch = store.read_room(room, cursor, 5000).await?;
            for r in &batch.rows {
                authority.apply(r);
                if authority.admits(r) {
                    tally.apply(r);
                    if r.verb == huddle_core::Verb::RoomSettled {
                        last = serde_json::from_value(r.body.clone()).ok();
                    }
                }
            }
            if batch.next == cursor {
                break;
            }
            cursor = batch.next;
        }
        let s = tally.dag.summary(room);
        let open_turns = tally
            .board
            .room(room)
            .is_some_and(|b| !b.open_turns().is_empty());
        if let Some(b) = last.filter(|b| {
            b.total == s.total
                && b.done == s.done
                && b.abandoned == s.abandoned
                && b.blocked == s.blocked
                && tally.dag.is_settled(room)
                && !open_turns
        }) {
            let line = format!(
                "room {room} settled: {} of {} tasks done, {} abandoned, {} blocked",
                b.done, b.total, b.abandoned, b.blocked
            );
            if b.all_done() {
                println!("{line}");
                return Ok(());
            }
            return Err(WaitEnded {
                code: EXIT_BLOCKED,
                message: line,
            }
            .into());
        }
        let nap = std::time::Duration::from_millis(500);
        let nap = match deadline {
            Some(d) => {
                let now = std::time::Instant::now();
                if now >= d {
                    return Err(WaitEnded {
                        code: EXIT_TIMED_OUT,
                        message: format!(
                            "room {room} did not settle in {}s: {} tasks, {} done, {} claimed, {} ready, {} waiting",
                            timeout.unwrap_or(0),
                            s.total,
                            s.done,
                            s.claimed,
                            s.ready,
                            s.waiting
                        ),
                    }
                    .into());
                }
                nap.min(d - now)
            }
            None => nap,
        };
        bell.borrow_and_update();
        tokio::select! {
            _ = bell.changed() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}
