//! `huddle decisions`, `huddle barriers` and `huddle lease`: a room's quorum
//! decisions, phase barriers and leases as the folds see them at the database clock's
//! now ([`huddle_agent::Patterns`], the same views the MCP tools return).

use std::fmt::Write as _;

use huddle_agent::Patterns;
use huddle_core::{Fold, Timestamp};
use huddle_store::StoreOptions;
use serde::Serialize;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::{emit, fold_admitted};

/// The room's patterns and the database clock's now.
async fn fold(
    db: &str,
    options: StoreOptions,
    room: &str,
) -> anyhow::Result<(Patterns, Timestamp)> {
    let store = ledger_cmds::open(db, options).await?;
    let mut patterns = Patterns::new();
    fold_admitted(&*store, room, |r| patterns.apply(r)).await?;
    let now = store.now().await?;
    Ok((patterns, now))
}

fn json<T: Serialize>(view: &T) -> anyhow::Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(view)?))
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "-".to_string()
    } else {
        names.join(", ")
    }
}

/// `huddle decisions --room R [--json]`.
pub async fn decisions(
    db: &str,
    options: StoreOptions,
    room: &str,
    as_json: bool,
) -> anyhow::Result<()> {
    let (patterns, now) = fold(db, options, room).await?;
    let views = patterns.decisions(room, now, None);
    if as_json {
        return json(&views);
    }
    let mut out = String::new();
    if views.is_empty() {
        let _ = writeln!(out, "room {room}: no decisions");
    }
    for d in &views {
        let outcome = match (&d.option, &d.reason) {
            (Some(o), Some(r)) => format!(" {o} ({r})"),
            (Some(o), None) => format!(" {o}"),
            (None, Some(r)) => format!(" ({r})"),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "{} [{}{}] by {} — {}",
            d.id, d.status, outcome, d.proposer, d.question
        );
        let tally: Vec<String> = d
            .tally
            .iter()
            .map(|t| format!("{} {} ({})", t.option, t.count, t.weight))
            .collect();
        let _ = writeln!(
            out,
            "  votes: {}; waiting for: {}; deadline {}",
            tally.join(", "),
            list(&d.waiting_for),
            format_time(d.deadline)
        );
    }
    emit(&out)
}

/// `huddle barriers --room R [--json]`.
pub async fn barriers(
    db: &str,
    options: StoreOptions,
    room: &str,
    as_json: bool,
) -> anyhow::Result<()> {
    let (patterns, now) = fold(db, options, room).await?;
    let views = patterns.barriers(room, now, None);
    if as_json {
        return json(&views);
    }
    let mut out = String::new();
    if views.is_empty() {
        let _ = writeln!(out, "room {room}: no barriers");
    }
    for b in &views {
        let reason = b
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let _ = writeln!(out, "{} [{}{}] by {}", b.phase, b.status, reason, b.opener);
        let _ = writeln!(
            out,
            "  checked in: {}; missing: {}; dropped: {}; timeout {}",
            list(&b.checked_in),
            list(&b.missing),
            list(&b.dropped),
            format_time(b.deadline)
        );
    }
    emit(&out)
}

/// `huddle lease --room R [--json]`.
pub async fn leases(
    db: &str,
    options: StoreOptions,
    room: &str,
    as_json: bool,
) -> anyhow::Result<()> {
    let (patterns, now) = fold(db, options, room).await?;
    let views = patterns.leases(room, now, None);
    if as_json {
        return json(&views);
    }
    let mut out = String::new();
    if views.is_empty() {
        let _ = writeln!(out, "room {room}: no leases");
    }
    for l in &views {
        let holder = match (&l.holder, l.epoch, l.expires_at) {
            (Some(h), Some(e), Some(at)) => format!(" {h} at epoch {e}, until {}", format_time(at)),
            _ => String::new(),
        };
        let _ = writeln!(out, "{} [{}]{}", l.name, l.status, holder);
        for d in &l.directives {
            let _ = writeln!(
                out,
                "  {} {} epoch {} [{}] {}",
                format_time(d.at),
                d.actor,
                d.epoch,
                d.check,
                d.directive
            );
        }
    }
    emit(&out)
}
