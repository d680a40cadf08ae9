//! `huddle decisions`, `huddle barriers`, `huddle lease` and `huddle approvals`: a
//! room's quorum decisions, phase barriers, leases and approval requests as the folds
//! see them at the database clock's now ([`huddle_agent::Patterns`], the owner
//! authority's approvals; the same views the MCP tools return).

use std::fmt::Write as _;

use huddle_agent::approvals::{views as approval_views, ApprovalView};
use huddle_agent::pattern_views::{BarrierView, CoordinatorLease, DecisionView};
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

/// Which view.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// `huddle decisions`.
    Decisions,
    /// `huddle barriers`.
    Barriers,
    /// `huddle lease`.
    Leases,
    /// `huddle approvals`.
    Approvals,
}

/// `huddle decisions|barriers|lease --room R [--json]`.
pub async fn show(
    db: &str,
    options: StoreOptions,
    room: &str,
    as_json: bool,
    kind: Kind,
) -> anyhow::Result<()> {
    let text = match kind {
        Kind::Approvals => approvals_text(db, options, room, as_json).await?,
        Kind::Decisions => {
            let (p, now) = fold(db, options, room).await?;
            let views = p.decisions(room, now, None);
            render(room, "decisions", &views, as_json, decision_lines)?
        }
        Kind::Barriers => {
            let (p, now) = fold(db, options, room).await?;
            let views = p.barriers(room, now, None);
            render(room, "barriers", &views, as_json, barrier_lines)?
        }
        Kind::Leases => {
            let (p, now) = fold(db, options, room).await?;
            let views = p.leases(room, now, None);
            render(room, "leases", &views, as_json, lease_lines)?
        }
    };
    emit(&text)
}

/// The room's approval requests, pending first.
async fn approvals_text(
    db: &str,
    options: StoreOptions,
    room: &str,
    as_json: bool,
) -> anyhow::Result<String> {
    let store = ledger_cmds::open(db, options).await?;
    // The admitted rows carry everything approvals need (requests, the owner's signed
    // answers, the room's key), so a second authority over them agrees.
    let mut authority = huddle_core::OwnerAuthority::new();
    fold_admitted(&*store, room, |r| authority.apply(r)).await?;
    let views = approval_views(authority.approvals().room(room));
    render(room, "approval requests", &views, as_json, approval_lines)
}

/// `views` as JSON, or each with `lines`.
fn render<T: Serialize>(
    room: &str,
    what: &str,
    views: &[T],
    as_json: bool,
    lines: fn(&mut String, &T),
) -> anyhow::Result<String> {
    if as_json {
        return Ok(format!("{}\n", serde_json::to_string_pretty(views)?));
    }
    let mut out = String::new();
    if views.is_empty() {
        let _ = writeln!(out, "room {room}: no {what}");
    }
    for v in views {
        lines(&mut out, v);
    }
    Ok(out)
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "-".to_string()
    } else {
        names.join(", ")
    }
}

fn decision_lines(out: &mut String, d: &DecisionView) {
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

fn barrier_lines(out: &mut String, b: &BarrierView) {
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

fn lease_lines(out: &mut String, l: &CoordinatorLease) {
    let holder = match (&l.holder, l.epoch, l.expires_at) {
        (Some(h), Some(e), Some(at)) => {
            format!(" {h} at epoch {e}, until {}", format_time(at))
        }
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

fn approval_lines(out: &mut String, a: &ApprovalView) {
    let answer = match (&a.answered_by, a.answered_at) {
        (Some(by), Some(at)) => format!(" by {by} at {}", format_time(at)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{} [{}{}] asked by {} at {} — {}",
        a.id,
        a.status,
        answer,
        a.requested_by,
        format_time(a.requested_at),
        a.action
    );
    if let Some(d) = &a.details {
        let _ = writeln!(out, "  details: {d}");
    }
    if let Some(r) = &a.reason {
        let _ = writeln!(out, "  reason: {r}");
    }
    if a.answered_by.is_none() {
        let _ = writeln!(out, "  answer: !approve {0} | !deny {0} [reason]", a.id);
    }
}
