//! `huddle decisions`, `huddle barriers`, `huddle lease` and `huddle approvals`: a
//! room's quorum decisions, phase barriers, leases and approval requests as the folds
//! see them at the database clock's now ([`huddle_agent::Patterns`], the owner
//! authority's approvals; the same views the MCP tools return); and the pattern
//! writes for agents without MCP — `huddle propose`, `huddle vote`, `huddle barrier
//! open|arrive`, `huddle lease acquire|renew|release` — each one [`AgentSession`]
//! call, the one the MCP tool of the same name makes (`--json` prints its result).
//!
//! [`AgentSession`]: huddle_agent::AgentSession

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use huddle_agent::approvals::{
    views as approval_views, ApprovalArgs, ApprovalRequestArgs, ApprovalView,
};
use huddle_agent::pattern_views::{
    BarrierArriveArgs, BarrierOpenArgs, BarrierView, CoordinatorLease, DecisionView, LeaseArgs,
    LeaseNameArgs, ProposeArgs, VoteArgs, VotersArg,
};
use huddle_agent::views::Written;
use huddle_agent::Patterns;
use huddle_core::{Fold, Timestamp};
use huddle_store::StoreOptions;
use serde::Serialize;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::{emit, fold_admitted};
use crate::task_cmds::{refusal, show as print_result, Agent};

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

pub(crate) fn decision_lines(out: &mut String, d: &DecisionView) {
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

pub(crate) fn barrier_lines(out: &mut String, b: &BarrierView) {
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

pub(crate) fn lease_lines(out: &mut String, l: &CoordinatorLease) {
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

// ---- writes: the pattern tools for agents without MCP -------------------------------

/// `huddle propose`: open a quorum decision (the `propose` tool).
#[derive(Args, Debug)]
pub struct Propose {
    #[command(flatten)]
    who: Agent,
    /// The decision's id, unique in the room.
    id: String,
    /// The question, for the voters.
    #[arg(long)]
    question: Option<String>,
    /// The options, comma-separated [default: yes,no].
    #[arg(long, value_delimiter = ',')]
    options: Vec<String>,
    /// Who may vote, comma-separated; `name=weight` gives a weight (default 1).
    #[arg(long, value_delimiter = ',', required = true)]
    voters: Vec<String>,
    /// Quorum: voters agreeing on the leading option [default: a majority].
    #[arg(long)]
    quorum: Option<u64>,
    /// Quorum as the summed weight of the leading option's voters.
    #[arg(long, conflicts_with = "quorum")]
    quorum_weight: Option<f64>,
    /// How long voting stays open, in ms.
    #[arg(long)]
    window_ms: u64,
    /// A stricter winning margin than 10 %, as a fraction (0.25 = 25 %).
    #[arg(long)]
    min_margin: Option<f64>,
    /// Thread to propose in.
    #[arg(long)]
    thread: Option<String>,
}

/// `huddle vote`: vote on a decision (the `vote` tool).
#[derive(Args, Debug)]
pub struct Vote {
    #[command(flatten)]
    who: Agent,
    /// The decision's id.
    id: String,
    /// The option chosen; the first vote is final.
    option: String,
}

/// `huddle barrier ...`: the barrier tools.
#[derive(Subcommand, Debug)]
pub enum BarrierCommand {
    /// Open a barrier for a phase (the `barrier_open` tool).
    Open {
        #[command(flatten)]
        who: Agent,
        /// The phase.
        phase: String,
        /// Who must check in, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        roster: Vec<String>,
        /// When the barrier times out, in ms.
        #[arg(long)]
        timeout_ms: u64,
        /// Pass at the timeout when this many checked in [default: escalate].
        #[arg(long)]
        quorum: Option<u64>,
        /// Thread to open it in.
        #[arg(long)]
        thread: Option<String>,
    },
    /// Check in at a barrier (the `barrier_arrive` tool).
    Arrive {
        #[command(flatten)]
        who: Agent,
        /// The phase.
        phase: String,
    },
}

/// `huddle lease acquire|renew|release`: the coordinator lease tools.
#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    /// Take the lease (the `lease_acquire` tool).
    Acquire {
        #[command(flatten)]
        who: Agent,
        #[command(flatten)]
        lease: LeaseOpts,
    },
    /// Renew the lease the agent holds (the `lease_renew` tool).
    Renew {
        #[command(flatten)]
        who: Agent,
        #[command(flatten)]
        lease: LeaseOpts,
    },
    /// Give the lease up (the `lease_release` tool).
    Release {
        #[command(flatten)]
        who: Agent,
        /// The lease [default: coordinator].
        #[arg(long)]
        name: Option<String>,
    },
}

/// Which lease, for how long.
#[derive(Args, Debug)]
pub struct LeaseOpts {
    /// The lease [default: coordinator].
    #[arg(long)]
    name: Option<String>,
    /// Its ttl in ms [default: 90000].
    #[arg(long)]
    ttl_ms: Option<u64>,
}

impl From<LeaseOpts> for LeaseArgs {
    fn from(o: LeaseOpts) -> Self {
        LeaseArgs {
            name: o.name,
            ttl_ms: o.ttl_ms,
        }
    }
}

/// Runs `huddle propose`.
pub async fn propose(db: &str, options: StoreOptions, p: Propose) -> anyhow::Result<()> {
    let me = p.who.open(db, options).await?;
    let voters = voters(&p.voters)?;
    let r = me
        .propose(ProposeArgs {
            id: p.id,
            question: p.question,
            options: (!p.options.is_empty()).then_some(p.options),
            voters,
            quorum_count: p.quorum,
            quorum_weight: p.quorum_weight,
            window_ms: p.window_ms,
            min_margin: p.min_margin,
            thread: p.thread,
        })
        .await
        .map_err(refusal)?;
    print_result(p.who.json, &r, || {
        lines(&r.written, &r.decision, decision_lines)
    })
}

/// `a,b=2` as a voter set: a list when no weight is given, else a weighted map.
fn voters(names: &[String]) -> anyhow::Result<VotersArg> {
    if !names.iter().any(|n| n.contains('=')) {
        return Ok(VotersArg::List(names.to_vec()));
    }
    let mut weighted = std::collections::BTreeMap::new();
    for n in names {
        let (name, weight) = match n.split_once('=') {
            Some((name, w)) => {
                let w: f64 = w.parse().map_err(|_| {
                    anyhow::anyhow!("voter {n:?}: the weight after `=` is not a number")
                })?;
                (name, w)
            }
            None => (n.as_str(), 1.0),
        };
        weighted.insert(name.to_string(), weight);
    }
    Ok(VotersArg::Weighted(weighted))
}

/// Runs `huddle vote`.
pub async fn vote(db: &str, options: StoreOptions, v: Vote) -> anyhow::Result<()> {
    let me = v.who.open(db, options).await?;
    let r = me
        .vote(VoteArgs {
            id: v.id,
            option: v.option,
        })
        .await
        .map_err(refusal)?;
    print_result(v.who.json, &r, || {
        lines(&r.written, &r.decision, decision_lines)
    })
}

/// Runs `huddle barrier open|arrive`.
pub async fn barrier(db: &str, options: StoreOptions, c: BarrierCommand) -> anyhow::Result<()> {
    let (who, r) = match c {
        BarrierCommand::Open {
            who,
            phase,
            roster,
            timeout_ms,
            quorum,
            thread,
        } => {
            let me = who.open(db, options).await?;
            let args = BarrierOpenArgs {
                phase,
                roster,
                timeout_ms,
                quorum,
                thread,
            };
            (who, me.barrier_open(args).await)
        }
        BarrierCommand::Arrive { who, phase } => {
            let me = who.open(db, options).await?;
            (who, me.barrier_arrive(BarrierArriveArgs { phase }).await)
        }
    };
    let r = r.map_err(refusal)?;
    print_result(who.json, &r, || {
        lines(&r.written, &r.barrier, barrier_lines)
    })
}

/// Runs `huddle lease acquire|renew|release`.
pub async fn lease(db: &str, options: StoreOptions, c: LeaseCommand) -> anyhow::Result<()> {
    let (who, r) = match c {
        LeaseCommand::Acquire { who, lease } => {
            let me = who.open(db, options).await?;
            (who, me.lease_acquire(lease.into()).await)
        }
        LeaseCommand::Renew { who, lease } => {
            let me = who.open(db, options).await?;
            (who, me.lease_renew(lease.into()).await)
        }
        LeaseCommand::Release { who, name } => {
            let me = who.open(db, options).await?;
            (who, me.lease_release(LeaseNameArgs { name }).await)
        }
    };
    let r = r.map_err(refusal)?;
    print_result(who.json, &r, || lines(&r.written, &r.lease, lease_lines))
}

/// A write's view for people: the view's lines, and a note when it was a retry.
fn lines<T>(written: &Written, view: &T, render: fn(&mut String, &T)) -> String {
    let mut out = String::new();
    render(&mut out, view);
    if !written.inserted {
        out.push_str("(already recorded; nothing new was written)\n");
    }
    out.trim_end().to_string()
}

/// `huddle approval request|status`: the approval tools for agents without MCP.
#[derive(Subcommand, Debug)]
pub enum ApprovalCommand {
    /// Ask the room owner before an action (the `approval_request` tool); prints the
    /// id the owner answers with `!approve ID` / `!deny ID [reason]`.
    Request {
        #[command(flatten)]
        who: Agent,
        /// What the agent wants to do, in one line.
        #[arg(long)]
        action: String,
        /// More about it.
        #[arg(long)]
        details: Option<String>,
        /// Wait up to this long for the answer (ms, at most 60000).
        #[arg(long)]
        wait_ms: Option<u64>,
        /// Makes a retry safe: the same key is the same request.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Where a request stands (the `approval` tool).
    Status {
        #[command(flatten)]
        who: Agent,
        /// The request's id.
        id: String,
        /// Wait up to this long while it is pending (ms, at most 60000).
        #[arg(long)]
        wait_ms: Option<u64>,
    },
}

/// Runs `huddle approval request|status`.
pub async fn approval(db: &str, options: StoreOptions, c: ApprovalCommand) -> anyhow::Result<()> {
    match c {
        ApprovalCommand::Request {
            who,
            action,
            details,
            wait_ms,
            idempotency_key,
        } => {
            let me = who.open(db, options).await?;
            let r = me
                .approval_request(ApprovalRequestArgs {
                    action,
                    details,
                    thread: None,
                    wait_ms,
                    idempotency_key,
                })
                .await
                .map_err(refusal)?;
            print_result(who.json, &r, || {
                let mut out = String::new();
                approval_lines(&mut out, &r.approval);
                out.trim_end().to_string()
            })
        }
        ApprovalCommand::Status { who, id, wait_ms } => {
            let me = who.open(db, options).await?;
            let r = me
                .approval(ApprovalArgs { id, wait_ms })
                .await
                .map_err(refusal)?;
            print_result(who.json, &r, || {
                let mut out = String::new();
                approval_lines(&mut out, &r);
                out.trim_end().to_string()
            })
        }
    }
}
