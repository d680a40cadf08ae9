//! The pattern operations: quorum decisions (`propose`, `vote`, `decision`), phase
//! barriers (`barrier_open`, `barrier_arrive`, `barrier`) and the coordinator lease
//! (`lease_acquire`, `lease_renew`, `lease_release`, `lease_directive`, `lease`).
//!
//! The folds of `huddle-core` (`decision.rs`, `barrier.rs`, `lease.rs`) are the single
//! source of truth: the session writes the rows they read (`docs/protocol/patterns.md`)
//! and reports their status at the database clock's `now`. It refuses, with a reason,
//! a row the fold would ignore (a vote from a non-voter, a late check-in), so the
//! ledger holds what counts. When the opener's session sees a final outcome not yet
//! closed in the ledger, it writes the closing row the fold's `due` gives, as the
//! opener (whom the fold trusts), under the idempotency key every writer shares.
//!
//! The lease is the claim `lease/<room>/<name>`: the holder heartbeats with the
//! claim's epoch under the claim's fence, and so does every directive, so a holder
//! that lost the claim cannot write one; a directive written around the store is
//! judged by [`LeaseFold::check_directive`] in ledger order, and only `applies` counts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use huddle_core::approval::Approvals;
use huddle_core::barrier::{
    BarrierCheckinBody, BarrierOpenedBody, BarrierState, OnTimeout, MAX_ROSTER,
};
use huddle_core::board::{ApprovalLine, BarrierLine, DecisionLine, LeaseLine, PatternLines};
use huddle_core::decision::{
    DecisionState, ProposalBody, Quorum, QuorumBody, VoteBody, VotersBody, MAX_OPTIONS,
    MAX_QUESTION_BYTES, MAX_VOTERS, MAX_WEIGHT, WEIGHT_UNIT,
};
use huddle_core::lease::{
    LeaseDirectiveBody, LeaseHeartbeatBody, DEFAULT_LEASE, DEFAULT_TTL_MS, MAX_TTL_MS, MIN_TTL_MS,
};
use huddle_core::protocol::{truncate_text, PPM};
use huddle_core::resources::ResourceFold;
use huddle_core::shared_state::SharedStateFold;
use huddle_core::{
    validate_name, BarrierFold, BarrierRules, BarrierStatus, ClaimEpoch, DecisionFold,
    DecisionRules, DecisionStatus, DirectiveCheck, Fold, Interaction, LeaseFold, LeaseStatus,
    Limits, NewInteraction, Role, Timestamp, Verb,
};
use huddle_store::{Acquired, Fence, StoreError};
use tokio::time::Instant;

use crate::error::{AgentError, Result};
use crate::pattern_views::{
    BarrierArgs, BarrierArriveArgs, BarrierOpenArgs, BarrierView, BarrierWritten, CoordinatorLease,
    DecisionArgs, DecisionView, DecisionWritten, DirectiveArgs, DirectiveView, LeaseArgs,
    LeaseNameArgs, LeaseWritten, OptionTallyView, ProposeArgs, VoteArgs, VotersArg,
};
use crate::session::{AgentSession, Folded, MAX_WAIT_MS};
use crate::views::{written, Written};

/// The longest voting window or barrier timeout an agent may set: 7 days.
pub const MAX_WINDOW_MS: u64 = 7 * 24 * 3_600_000;
/// Directives kept per lease for the `lease` view.
const KEPT_DIRECTIVES: usize = 50;

/// The claim key of a lease: `lease/<room>/<name>`.
pub fn lease_key(room: &str, name: &str) -> String {
    format!("lease/{room}/{name}")
}

/// The decisions, barriers and leases of the rooms folded so far, with every
/// directive checked in ledger order. A session keeps one for its room; the CLI
/// views fold one from the ledger.
#[derive(Clone, Debug, Default)]
pub struct Patterns {
    decisions: DecisionFold,
    barriers: BarrierFold,
    leases: LeaseFold,
    /// `(room, lease)` to its latest directives, checked when folded.
    directives: BTreeMap<(String, String), VecDeque<DirectiveView>>,
    /// `(room, lease, actor)` to the highest epoch that actor heartbeated at.
    heartbeats: BTreeMap<(String, String, String), u64>,
    /// Shared resources as their holders recorded them.
    resources: ResourceFold,
    /// Versioned shared state.
    state: SharedStateFold,
}

impl Fold for Patterns {
    fn apply(&mut self, row: &Interaction) {
        if let Some(check) = self.leases.check_directive(row) {
            self.directive(row, check);
        }
        if row.verb == Verb::LeaseHeartbeat {
            if let Ok(hb) = serde_json::from_value::<LeaseHeartbeatBody>(row.body.clone()) {
                let name = hb.name.unwrap_or_else(|| DEFAULT_LEASE.to_string());
                let key = (row.room.clone(), name, row.actor.clone());
                let e = self.heartbeats.entry(key).or_default();
                *e = (*e).max(hb.epoch);
            }
        }
        self.decisions.apply(row);
        self.barriers.apply(row);
        self.leases.apply(row);
        self.resources.apply(row);
        self.state.apply(row);
    }

    fn state_hash(&self) -> [u8; 32] {
        let parts = [
            self.decisions.state_hash(),
            self.barriers.state_hash(),
            self.leases.state_hash(),
            self.resources.state_hash(),
            self.state.state_hash(),
        ];
        huddle_core::hash_state(&parts)
    }
}

impl Patterns {
    /// Nothing folded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shared resources as their holders recorded them (`resource.*` rows).
    pub fn resources(&self) -> &ResourceFold {
        &self.resources
    }

    /// Versioned shared state (`state.put` rows).
    pub fn shared_state(&self) -> &SharedStateFold {
        &self.state
    }

    /// What the `<coordination>` block shows of the room's patterns at `now`: open
    /// and escalated decisions, waiting barriers, the held `coordinator` lease (or
    /// the first held one) and `approvals`' pending requests.
    pub fn lines(&self, room: &str, now: Timestamp, approvals: &Approvals) -> PatternLines {
        let decisions = self
            .decisions(room, now, None)
            .into_iter()
            .filter(|d| d.status == "open" || d.status == "escalated")
            .map(|d| DecisionLine {
                id: d.id,
                status: d.status,
                question: d.question,
                waiting_for: d.waiting_for,
                deadline: d.deadline,
            })
            .collect();
        let barriers = self
            .barriers(room, now, None)
            .into_iter()
            .filter(|b| b.status == "waiting")
            .map(|b| BarrierLine {
                phase: b.phase,
                missing: b.missing,
                deadline: b.deadline,
            })
            .collect();
        let mut held: Vec<LeaseLine> = self
            .leases(room, now, None)
            .into_iter()
            .filter_map(|l| {
                Some(LeaseLine {
                    holder: l.holder.filter(|_| l.status == "held")?,
                    epoch: l.epoch?,
                    until: l.expires_at?,
                    name: l.name,
                })
            })
            .collect();
        held.sort_by_key(|l| l.name != DEFAULT_LEASE);
        let approvals = approvals
            .pending(room)
            .into_iter()
            .map(|a| ApprovalLine {
                id: a.id.clone(),
                by: a.requested_by.clone(),
                action: a.action.clone(),
            })
            .collect();
        let resources = huddle_core::board::resource_lines(&self.resources, room, Some(now));
        PatternLines {
            decisions,
            barriers,
            coordinator: held.into_iter().next(),
            approvals,
            resources,
            benched: Vec::new(),
        }
    }

    fn directive(&mut self, row: &Interaction, check: DirectiveCheck) {
        let Ok(body) = serde_json::from_value::<LeaseDirectiveBody>(row.body.clone()) else {
            return;
        };
        let name = body.name.unwrap_or_else(|| DEFAULT_LEASE.to_string());
        let check = match check {
            DirectiveCheck::Applies { .. } => "applies",
            DirectiveCheck::Stale { .. } => "stale",
            DirectiveCheck::NotHolder { .. } => "not-holder",
            DirectiveCheck::Unfenced { .. } => "unfenced",
            DirectiveCheck::Malformed => return,
        };
        let kept = self.directives.entry((row.room.clone(), name)).or_default();
        if kept.len() == KEPT_DIRECTIVES {
            kept.pop_front();
        }
        kept.push_back(DirectiveView {
            id: row.id.to_string(),
            actor: row.actor.clone(),
            at: row.at,
            epoch: body.epoch,
            check: check.to_string(),
            directive: body.directive,
        });
    }

    /// One decision at `now`, as `me` (if anyone) sees it.
    pub fn decision(
        &self,
        room: &str,
        id: &str,
        now: Timestamp,
        me: Option<&str>,
    ) -> Option<DecisionView> {
        let d = self.decisions.get(room, id)?;
        Some(decision_view(d, now, me))
    }

    /// Every decision of `room` at `now`, by id.
    pub fn decisions(&self, room: &str, now: Timestamp, me: Option<&str>) -> Vec<DecisionView> {
        self.decisions
            .instances(room)
            .map(|(_, d)| decision_view(d, now, me))
            .collect()
    }

    /// One barrier at `now`.
    pub fn barrier(
        &self,
        room: &str,
        phase: &str,
        now: Timestamp,
        me: Option<&str>,
    ) -> Option<BarrierView> {
        let b = self.barriers.get(room, phase)?;
        Some(barrier_view(b, now, me))
    }

    /// Every barrier of `room` at `now`, by phase.
    pub fn barriers(&self, room: &str, now: Timestamp, me: Option<&str>) -> Vec<BarrierView> {
        self.barriers
            .instances(room)
            .map(|(_, b)| barrier_view(b, now, me))
            .collect()
    }

    /// One lease at `now`, with its latest directives.
    pub fn lease(
        &self,
        room: &str,
        name: &str,
        now: Timestamp,
        me: Option<&str>,
    ) -> CoordinatorLease {
        let (status, holder, epoch, expires_at) = match self.leases.status(room, name, now) {
            LeaseStatus::Vacant => ("vacant", None, None, None),
            LeaseStatus::Held {
                holder,
                epoch,
                expires_at,
            } => ("held", Some(holder), Some(epoch), Some(expires_at)),
            LeaseStatus::Lapsed {
                holder,
                epoch,
                expired_at,
            } => ("lapsed", Some(holder), Some(epoch), Some(expired_at)),
        };
        let you_hold = status == "held" && me.is_some() && holder.as_deref() == me;
        CoordinatorLease {
            name: name.to_string(),
            status: status.to_string(),
            holder,
            epoch,
            expires_at,
            ttl_ms: self
                .leases
                .lease(room, name)
                .map(|l| u64::try_from(l.ttl_us / 1000).unwrap_or(0)),
            you_hold,
            directives: self
                .directives
                .get(&(room.to_string(), name.to_string()))
                .map(|d| d.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// Every lease of `room` that was heartbeated or directed, by name.
    pub fn leases(&self, room: &str, now: Timestamp, me: Option<&str>) -> Vec<CoordinatorLease> {
        let names: BTreeSet<&String> = self
            .heartbeats
            .keys()
            .filter(|(r, _, _)| r == room)
            .map(|(_, n, _)| n)
            .chain(
                self.directives
                    .keys()
                    .filter(|(r, _)| r == room)
                    .map(|(_, n)| n),
            )
            .collect();
        names
            .into_iter()
            .map(|n| self.lease(room, n, now, me))
            .collect()
    }

    /// The highest epoch `actor` heartbeated `name` at.
    fn heartbeat_epoch(&self, room: &str, name: &str, actor: &str) -> Option<u64> {
        self.heartbeats
            .get(&(room.to_string(), name.to_string(), actor.to_string()))
            .copied()
    }

    /// The closing rows due at `now` for the decisions and barriers `opener` opened
    /// in `room`, written as `opener` (the fold trusts the opener's closing row).
    fn closings_due(&self, room: &str, opener: &str, now: Timestamp) -> Vec<NewInteraction> {
        let mine: BTreeSet<_> = self
            .decisions
            .instances(room)
            .filter(|(_, d)| d.proposal().proposer == opener)
            .map(|(_, d)| d.proposal().interaction)
            .chain(
                self.barriers
                    .instances(room)
                    .filter(|(_, b)| b.barrier().opener == opener)
                    .map(|(_, b)| b.barrier().interaction),
            )
            .collect();
        let decisions = self.decisions.due(now, &DecisionRules::default(), opener);
        let barriers = self.barriers.due(now, &BarrierRules::default(), opener);
        decisions
            .into_iter()
            .chain(barriers)
            .filter(|r| r.room == room && r.parent.is_some_and(|p| mine.contains(&p)))
            .map(|mut r| {
                r.role = Role::Agent;
                r
            })
            .collect()
    }
}

fn fraction(micros: u64, unit: u64) -> f64 {
    micros as f64 / unit as f64
}

fn decision_view(d: &DecisionState, now: Timestamp, me: Option<&str>) -> DecisionView {
    let p = d.proposal();
    let status = huddle_core::pattern::Instance::status(d, now, &DecisionRules::default());
    let margin = |m: Option<u64>| m.map(|m| fraction(m, PPM));
    let (name, option, reason, margin) = match &status {
        DecisionStatus::Open => ("open", None, None, None),
        DecisionStatus::Committed { option, margin_ppm } => {
            ("committed", Some(option.clone()), None, margin(*margin_ppm))
        }
        DecisionStatus::Escalated {
            leader,
            margin_ppm,
            reason,
        } => (
            "escalated",
            Some(leader.clone()),
            Some(reason.as_str().to_string()),
            margin(*margin_ppm),
        ),
        DecisionStatus::Failed { reason } => {
            ("failed", None, Some(reason.as_str().to_string()), None)
        }
    };
    let (quorum_count, quorum_weight) = match p.quorum {
        Quorum::Count(n) => (Some(n), None),
        Quorum::Weight(w) => (None, Some(fraction(w, WEIGHT_UNIT))),
    };
    let votes: BTreeMap<String, String> = d
        .votes()
        .iter()
        .map(|(v, c)| (v.clone(), c.option.clone()))
        .collect();
    DecisionView {
        id: p.id.clone(),
        question: p.question.clone(),
        proposer: p.proposer.clone(),
        options: p.options.clone(),
        voters: p
            .voters
            .iter()
            .map(|(v, w)| (v.clone(), fraction(*w, WEIGHT_UNIT)))
            .collect(),
        quorum_count,
        quorum_weight,
        deadline: p.deadline,
        status: name.to_string(),
        is_final: status.is_final(),
        option,
        reason,
        margin,
        tally: d
            .tally()
            .options
            .into_iter()
            .map(|t| OptionTallyView {
                option: t.option,
                count: t.count,
                weight: fraction(t.weight, WEIGHT_UNIT),
            })
            .collect(),
        waiting_for: p
            .voters
            .keys()
            .filter(|v| !votes.contains_key(*v))
            .cloned()
            .collect(),
        your_vote: me.and_then(|me| votes.get(me).cloned()),
        votes,
        closed_by: d.closure().map(|c| c.verb.to_string()),
    }
}

fn barrier_view(b: &BarrierState, now: Timestamp, me: Option<&str>) -> BarrierView {
    let bar = b.barrier();
    let status = huddle_core::pattern::Instance::status(b, now, &BarrierRules::default());
    let is_final = status.is_final();
    let (name, dropped, reason) = match status {
        BarrierStatus::Waiting { .. } => ("waiting", Vec::new(), None),
        BarrierStatus::Passed { dropped } => ("passed", dropped, None),
        BarrierStatus::Escalated { reason, .. } => {
            ("escalated", Vec::new(), Some(reason.as_str().to_string()))
        }
    };
    BarrierView {
        phase: bar.phase.clone(),
        opener: bar.opener.clone(),
        roster: bar.roster.iter().cloned().collect(),
        deadline: bar.deadline,
        quorum: match bar.on_timeout {
            OnTimeout::ProceedWithQuorum { quorum } => Some(quorum),
            OnTimeout::Escalate => None,
        },
        status: name.to_string(),
        is_final,
        checked_in: b.checked_in().keys().cloned().collect(),
        missing: b.missing(),
        dropped,
        reason,
        you_checked_in: me.is_some_and(|me| b.checked_in().contains_key(me)),
        closed_by: b.closure().map(|c| c.verb.to_string()),
    }
}

/// Checks a name argument (an id, option, phase, voter, lease).
fn name_arg(what: &'static str, value: &str) -> Result<()> {
    validate_name(what, value, &Limits::default())
        .map_err(|e| AgentError::BadArgument(e.to_string()))
}

/// Checks a window or timeout.
fn window_arg(what: &str, ms: u64) -> Result<()> {
    if ms == 0 || ms > MAX_WINDOW_MS {
        return Err(AgentError::BadArgument(format!(
            "{what} must be 1 to {MAX_WINDOW_MS} ms (7 days)"
        )));
    }
    Ok(())
}

/// Checks a list of distinct names, `1..=max` long.
fn names_arg(what: &'static str, names: &[String], max: usize) -> Result<()> {
    if names.is_empty() || names.len() > max {
        return Err(AgentError::BadArgument(format!(
            "{what}: give 1 to {max}, not {}",
            names.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for n in names {
        name_arg(what, n)?;
        if !seen.insert(n) {
            return Err(AgentError::BadArgument(format!(
                "{what}: {n:?} is listed twice"
            )));
        }
    }
    Ok(())
}

/// The body of a `decision.proposed` for `args`, checked as the fold checks it.
fn proposal_body(args: ProposeArgs) -> Result<ProposalBody> {
    name_arg("decision id", &args.id)?;
    let options = args
        .options
        .unwrap_or_else(|| vec!["yes".into(), "no".into()]);
    names_arg("options", &options, MAX_OPTIONS)?;
    let (voters, total) = match &args.voters {
        VotersArg::List(list) => {
            names_arg("voters", list, MAX_VOTERS)?;
            (list.len(), list.len() as f64)
        }
        VotersArg::Weighted(map) => {
            let names: Vec<String> = map.keys().cloned().collect();
            names_arg("voters", &names, MAX_VOTERS)?;
            if let Some((v, w)) = map
                .iter()
                .find(|(_, w)| !w.is_finite() || **w <= 0.0 || **w > MAX_WEIGHT)
            {
                return Err(AgentError::BadArgument(format!(
                    "voter {v:?} has weight {w}; a weight is greater than 0 and at most {MAX_WEIGHT}"
                )));
            }
            (map.len(), map.values().sum())
        }
    };
    let quorum = match (args.quorum_count, args.quorum_weight) {
        (Some(_), Some(_)) => {
            return Err(AgentError::BadArgument(
                "give quorum_count or quorum_weight, not both".into(),
            ))
        }
        (Some(n), None) if n == 0 || n > voters as u64 => {
            return Err(AgentError::BadArgument(format!(
                "quorum_count {n}: 1 to the number of voters ({voters})"
            )))
        }
        (None, Some(w)) if !w.is_finite() || w <= 0.0 || w > total => {
            return Err(AgentError::BadArgument(format!(
                "quorum_weight {w}: greater than 0 and at most the voters' total weight ({total})"
            )))
        }
        (Some(n), None) => Some(QuorumBody::Count(n)),
        (None, Some(w)) => Some(QuorumBody::Weight(w)),
        (None, None) => None,
    };
    window_arg("window_ms", args.window_ms)?;
    if let Some(m) = args.min_margin {
        if !m.is_finite() || !(0.0..=1_000.0).contains(&m) {
            return Err(AgentError::BadArgument(format!(
                "min_margin {m}: a fraction from 0 to 1000 (0.25 = 25 %)"
            )));
        }
    }
    Ok(ProposalBody {
        id: args.id,
        question: args.question.map(|q| truncate_text(&q, MAX_QUESTION_BYTES)),
        options: Some(options),
        voters: match args.voters {
            VotersArg::List(l) => VotersBody::List(l),
            VotersArg::Weighted(m) => VotersBody::Weighted(m),
        },
        quorum,
        deadline: None,
        window_ms: Some(args.window_ms),
        min_margin: args.min_margin,
    })
}

/// The lease name of an argument (default `coordinator`).
fn lease_name(name: Option<&str>) -> Result<String> {
    let name = name.unwrap_or(DEFAULT_LEASE);
    name_arg("lease name", name)?;
    Ok(name.to_string())
}

fn ttl_arg(ttl_ms: u64) -> Result<u64> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(AgentError::BadArgument(format!(
            "ttl_ms {ttl_ms}: {MIN_TTL_MS} to {MAX_TTL_MS}"
        )));
    }
    Ok(ttl_ms)
}

fn claim_epoch(epoch: u64) -> ClaimEpoch {
    ClaimEpoch(i64::try_from(epoch).unwrap_or(i64::MAX))
}

impl AgentSession {
    /// A row by this agent in the session's room.
    fn pattern_row(
        &self,
        verb: Verb,
        body: serde_json::Value,
        thread: Option<String>,
    ) -> Result<NewInteraction> {
        let mut row = NewInteraction::new(
            self.room.as_str(),
            verb,
            self.agent.as_str(),
            Role::Agent,
            body,
        );
        if let Some(t) = thread {
            validate_name("thread", &t, self.store.limits())
                .map_err(|e| AgentError::BadArgument(e.to_string()))?;
            row = row.in_thread(t);
        }
        Ok(row)
    }

    /// Appends `row` (no fence), reads it back and writes any closing row now due.
    async fn write_pattern(
        &self,
        st: &mut Folded,
        row: NewInteraction,
    ) -> Result<(Written, Timestamp)> {
        let out = self.store.append(vec![row]).await?;
        self.store.flush().await;
        self.catch_up(st).await?;
        let now = self.store.now().await?;
        self.close_due(st, now).await?;
        Ok((written(&out)?, now))
    }

    /// Writes the closing rows due for what this agent opened.
    async fn close_due(&self, st: &mut Folded, now: Timestamp) -> Result<()> {
        let due = st.patterns.closings_due(&self.room, &self.agent, now);
        if due.is_empty() {
            return Ok(());
        }
        self.store.append(due).await?;
        self.store.flush().await;
        self.catch_up(st).await
    }

    /// Evaluates `look` on the folded patterns until it reports a final state or the
    /// wait (`wait_ms`, at most [`MAX_WAIT_MS`]) is over.
    async fn wait_final<T>(
        &self,
        wait_ms: Option<u64>,
        look: impl Fn(&Patterns, Timestamp) -> Result<(T, bool)>,
    ) -> Result<T> {
        let deadline =
            Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        loop {
            let (view, done) = {
                let mut st = self.synced().await?;
                let now = self.store.now().await?;
                self.close_due(&mut st, now).await?;
                look(&st.patterns, now)?
            };
            if done || !self.wait_for_news(deadline).await {
                return Ok(view);
            }
        }
    }

    /// `propose`: opens a quorum decision among `voters`, open for `window_ms`.
    pub async fn propose(&self, args: ProposeArgs) -> Result<DecisionWritten> {
        let thread = args.thread.clone();
        let body = proposal_body(args)?;
        let id = body.id.clone();
        let row = self.pattern_row(
            Verb::DecisionProposed,
            serde_json::to_value(&body).unwrap_or_default(),
            thread,
        )?;
        let mut st = self.synced().await?;
        if let Some(d) = st.patterns.decisions.get(&self.room, &id) {
            if d.proposal().interaction != row.id() {
                return Err(AgentError::NameTaken {
                    what: "decision",
                    name: id,
                    by: d.proposal().proposer.clone(),
                });
            }
        }
        let (written, now) = self.write_pattern(&mut st, row).await?;
        let decision = st
            .patterns
            .decision(&self.room, &id, now, Some(&self.agent))
            .ok_or_else(|| {
                AgentError::BadArgument(format!(
                    "decision {id:?} was written but the room does not read it as a proposal"
                ))
            })?;
        tracing::info!(room = %self.room, agent = %self.agent, decision = %id, "decision proposed");
        Ok(DecisionWritten { written, decision })
    }

    /// `vote`: this agent's vote on a decision; the first vote is final.
    pub async fn vote(&self, args: VoteArgs) -> Result<DecisionWritten> {
        let now = self.store.now().await?;
        let mut st = self.synced().await?;
        let d = st
            .patterns
            .decisions
            .get(&self.room, &args.id)
            .ok_or_else(|| AgentError::NoDecision(args.id.clone()))?;
        let p = d.proposal();
        if !p.voters.contains_key(&self.agent) {
            return Err(AgentError::NotListed {
                what: "voter",
                name: args.id.clone(),
                listed: p.voters.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        if !p.options.contains(&args.option) {
            return Err(AgentError::BadArgument(format!(
                "option {:?} is not offered; the options are: {}",
                args.option,
                p.options.join(", ")
            )));
        }
        match d.votes().get(&self.agent) {
            Some(v) if v.option != args.option => {
                return Err(AgentError::AlreadyVoted {
                    id: args.id.clone(),
                    option: v.option.clone(),
                })
            }
            // The same vote again (a retry): the ledger keeps one.
            Some(_) => {}
            None if now > p.deadline => {
                return Err(AgentError::TooLate {
                    what: format!("voting on decision {:?}", args.id),
                    deadline: p.deadline,
                })
            }
            None => {}
        }
        let body = VoteBody {
            id: args.id.clone(),
            option: args.option,
        };
        let row = self.pattern_row(
            Verb::DecisionVoted,
            serde_json::to_value(&body).unwrap_or_default(),
            p.thread.clone(),
        )?;
        let (written, now) = self.write_pattern(&mut st, row).await?;
        let decision = st
            .patterns
            .decision(&self.room, &args.id, now, Some(&self.agent))
            .ok_or_else(|| AgentError::NoDecision(args.id.clone()))?;
        Ok(DecisionWritten { written, decision })
    }

    /// `decision`: a decision's state and outcome, waiting up to `wait_ms` for it to
    /// be final.
    pub async fn decision(&self, args: DecisionArgs) -> Result<DecisionView> {
        self.wait_final(args.wait_ms, |p, now| {
            let view = p
                .decision(&self.room, &args.id, now, Some(&self.agent))
                .ok_or_else(|| AgentError::NoDecision(args.id.clone()))?;
            let done = view.is_final;
            Ok((view, done))
        })
        .await
    }

    /// `barrier_open`: opens a barrier for `phase` that `roster` must check in to.
    pub async fn barrier_open(&self, args: BarrierOpenArgs) -> Result<BarrierWritten> {
        name_arg("phase", &args.phase)?;
        names_arg("roster", &args.roster, MAX_ROSTER)?;
        window_arg("timeout_ms", args.timeout_ms)?;
        let on_timeout = match args.quorum {
            Some(q) if q == 0 || q > args.roster.len() as u64 => {
                return Err(AgentError::BadArgument(format!(
                    "quorum {q}: 1 to the roster size ({})",
                    args.roster.len()
                )))
            }
            Some(quorum) => OnTimeout::ProceedWithQuorum { quorum },
            None => OnTimeout::Escalate,
        };
        let body = BarrierOpenedBody {
            phase: args.phase.clone(),
            roster: args.roster,
            timeout_ms: Some(args.timeout_ms),
            deadline: None,
            on_timeout: Some(on_timeout),
        };
        let row = self.pattern_row(
            Verb::BarrierOpened,
            serde_json::to_value(&body).unwrap_or_default(),
            args.thread,
        )?;
        let mut st = self.synced().await?;
        if let Some(b) = st.patterns.barriers.get(&self.room, &args.phase) {
            if b.barrier().interaction != row.id() {
                return Err(AgentError::NameTaken {
                    what: "barrier",
                    name: args.phase,
                    by: b.barrier().opener.clone(),
                });
            }
        }
        let (written, now) = self.write_pattern(&mut st, row).await?;
        let barrier = st
            .patterns
            .barrier(&self.room, &args.phase, now, Some(&self.agent))
            .ok_or_else(|| AgentError::NoBarrier(args.phase.clone()))?;
        tracing::info!(room = %self.room, agent = %self.agent, phase = %args.phase, "barrier opened");
        Ok(BarrierWritten { written, barrier })
    }

    /// `barrier_arrive`: checks this agent in at a barrier.
    pub async fn barrier_arrive(&self, args: BarrierArriveArgs) -> Result<BarrierWritten> {
        let now = self.store.now().await?;
        let mut st = self.synced().await?;
        let b = st
            .patterns
            .barriers
            .get(&self.room, &args.phase)
            .ok_or_else(|| AgentError::NoBarrier(args.phase.clone()))?;
        let bar = b.barrier();
        if !bar.roster.contains(&self.agent) {
            return Err(AgentError::NotListed {
                what: "roster member",
                name: args.phase.clone(),
                listed: bar.roster.iter().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        if !b.checked_in().contains_key(&self.agent) && now > bar.deadline {
            return Err(AgentError::TooLate {
                what: format!("checking in at barrier {:?}", args.phase),
                deadline: bar.deadline,
            });
        }
        let body = BarrierCheckinBody {
            phase: args.phase.clone(),
        };
        let row = self.pattern_row(
            Verb::BarrierCheckin,
            serde_json::to_value(&body).unwrap_or_default(),
            bar.thread.clone(),
        )?;
        let (written, now) = self.write_pattern(&mut st, row).await?;
        let barrier = st
            .patterns
            .barrier(&self.room, &args.phase, now, Some(&self.agent))
            .ok_or_else(|| AgentError::NoBarrier(args.phase.clone()))?;
        Ok(BarrierWritten { written, barrier })
    }

    /// `barrier`: a barrier's state, waiting up to `wait_ms` for it to pass or
    /// escalate.
    pub async fn barrier(&self, args: BarrierArgs) -> Result<BarrierView> {
        self.wait_final(args.wait_ms, |p, now| {
            let view = p
                .barrier(&self.room, &args.phase, now, Some(&self.agent))
                .ok_or_else(|| AgentError::NoBarrier(args.phase.clone()))?;
            let done = view.is_final;
            Ok((view, done))
        })
        .await
    }

    /// Appends a lease row under `lease/<room>/<name>` held at `epoch`; a refused
    /// fence is explained.
    async fn lease_write(
        &self,
        st: &mut Folded,
        name: &str,
        epoch: u64,
        row: NewInteraction,
    ) -> Result<Written> {
        let fence = Fence {
            key: lease_key(&self.room, name),
            holder: self.agent.clone(),
            epoch: claim_epoch(epoch),
        };
        match self.store.append_under(&[fence], false, vec![row]).await {
            Ok(out) => {
                self.store.flush().await;
                self.catch_up(st).await?;
                written(&out)
            }
            Err(StoreError::Fenced { .. }) => Err(self.lease_lost(st, name, epoch).await),
            Err(e) => Err(e.into()),
        }
    }

    /// Why this agent's hold on lease `name` at `epoch` is over.
    async fn lease_lost(&self, st: &mut Folded, name: &str, epoch: u64) -> AgentError {
        if let Err(e) = self.catch_up(st).await {
            return e;
        }
        let now = match self.store.now().await {
            Ok(n) => n,
            Err(e) => return e.into(),
        };
        let lease = st.patterns.lease(&self.room, name, now, Some(&self.agent));
        let why = match (&lease.holder, lease.epoch) {
            (Some(h), Some(e)) if *h != self.agent && e > epoch => format!(
                "your hold on lease {name:?} at epoch {epoch} lapsed and {h} took it at epoch {e}; nothing was recorded: you are not the coordinator, follow its directives"
            ),
            _ => format!(
                "your hold on lease {name:?} at epoch {epoch} is no longer live (not renewed within its ttl, or released); nothing was recorded: call lease_acquire to take it again"
            ),
        };
        AgentError::LeaseLost(why)
    }

    /// The epoch this agent last heartbeated lease `name` at.
    fn my_lease_epoch(&self, st: &Folded, name: &str) -> Result<u64> {
        st.patterns
            .heartbeat_epoch(&self.room, name, &self.agent)
            .ok_or_else(|| AgentError::NotLeaseHolder {
                name: name.to_string(),
            })
    }

    fn heartbeat(&self, name: &str, epoch: u64, ttl_ms: u64, beat: u64) -> Result<NewInteraction> {
        let body = LeaseHeartbeatBody {
            name: Some(name.to_string()),
            holder: None,
            epoch,
            ttl_ms: Some(ttl_ms),
            beat,
        };
        self.pattern_row(
            Verb::LeaseHeartbeat,
            serde_json::to_value(&body).unwrap_or_default(),
            None,
        )
    }

    /// The next renewal counter of lease `name` at `epoch`.
    fn next_beat(st: &Folded, room: &str, name: &str, epoch: u64) -> u64 {
        match st.patterns.leases.lease(room, name) {
            Some(l) if l.epoch == epoch => l.beat.saturating_add(1),
            _ => 0,
        }
    }

    async fn lease_result(
        &self,
        st: &Folded,
        name: &str,
        written: Written,
    ) -> Result<LeaseWritten> {
        let now = self.store.now().await?;
        Ok(LeaseWritten {
            written,
            lease: st.patterns.lease(&self.room, name, now, Some(&self.agent)),
        })
    }

    /// `lease_acquire`: takes the lease (the claim `lease/<room>/<name>`) and
    /// heartbeats with the claim's epoch. Refused while another agent holds it.
    pub async fn lease_acquire(&self, args: LeaseArgs) -> Result<LeaseWritten> {
        let name = lease_name(args.name.as_deref())?;
        let ttl_ms = ttl_arg(args.ttl_ms.unwrap_or(DEFAULT_TTL_MS))?;
        let key = lease_key(&self.room, &name);
        let won = match self
            .store
            .acquire(&key, &self.agent, Duration::from_millis(ttl_ms))
            .await?
        {
            Acquired::Won(c) => c,
            Acquired::HeldBy(c) | Acquired::Closed { state: c, .. } => {
                return Err(AgentError::LeaseTaken {
                    name,
                    holder: c.holder,
                    epoch: c.epoch,
                    expires_at: c.expires_at,
                })
            }
        };
        let epoch = u64::try_from(won.epoch.0).unwrap_or(0);
        let mut st = self.synced().await?;
        let beat = Self::next_beat(&st, &self.room, &name, epoch);
        let row = self.heartbeat(&name, epoch, ttl_ms, beat)?;
        let written = self.lease_write(&mut st, &name, epoch, row).await?;
        tracing::info!(room = %self.room, agent = %self.agent, lease = %name, epoch, "lease acquired");
        self.lease_result(&st, &name, written).await
    }

    /// `lease_renew`: extends this agent's lease and heartbeats.
    pub async fn lease_renew(&self, args: LeaseArgs) -> Result<LeaseWritten> {
        let name = lease_name(args.name.as_deref())?;
        let mut st = self.synced().await?;
        let epoch = self.my_lease_epoch(&st, &name)?;
        let current = st
            .patterns
            .leases
            .lease(&self.room, &name)
            .filter(|l| l.epoch == epoch)
            .map(|l| u64::try_from(l.ttl_us / 1000).unwrap_or(DEFAULT_TTL_MS));
        let ttl_ms = ttl_arg(args.ttl_ms.or(current).unwrap_or(DEFAULT_TTL_MS))?;
        let key = lease_key(&self.room, &name);
        let renewed = self
            .store
            .renew(
                &key,
                &self.agent,
                claim_epoch(epoch),
                Duration::from_millis(ttl_ms),
            )
            .await?;
        if renewed.is_none() {
            return Err(self.lease_lost(&mut st, &name, epoch).await);
        }
        let beat = Self::next_beat(&st, &self.room, &name, epoch);
        let row = self.heartbeat(&name, epoch, ttl_ms, beat)?;
        let written = self.lease_write(&mut st, &name, epoch, row).await?;
        self.lease_result(&st, &name, written).await
    }

    /// `lease_release`: gives the lease up: a last heartbeat with the shortest ttl
    /// (1 s), then the claim is released so another agent can take it at once.
    pub async fn lease_release(&self, args: LeaseNameArgs) -> Result<LeaseWritten> {
        let name = lease_name(args.name.as_deref())?;
        let mut st = self.synced().await?;
        let epoch = self.my_lease_epoch(&st, &name)?;
        let beat = Self::next_beat(&st, &self.room, &name, epoch);
        let row = self.heartbeat(&name, epoch, MIN_TTL_MS, beat)?;
        let written = self.lease_write(&mut st, &name, epoch, row).await?;
        let key = lease_key(&self.room, &name);
        self.store
            .release(&key, &self.agent, claim_epoch(epoch))
            .await?;
        tracing::info!(room = %self.room, agent = %self.agent, lease = %name, epoch, "lease released");
        self.lease_result(&st, &name, written).await
    }

    /// `lease_directive`: a directive from the lease's holder, carrying its epoch and
    /// written under the lease's claim: refused once the hold is lost.
    pub async fn lease_directive(&self, args: DirectiveArgs) -> Result<LeaseWritten> {
        let name = lease_name(args.name.as_deref())?;
        let mut st = self.synced().await?;
        let epoch = self.my_lease_epoch(&st, &name)?;
        let body = LeaseDirectiveBody {
            name: Some(name.clone()),
            epoch,
            directive: args.directive,
        };
        let mut row = self.pattern_row(
            Verb::LeaseDirective,
            serde_json::to_value(&body).unwrap_or_default(),
            None,
        )?;
        if let Some(k) = self.idempotency(args.idempotency_key.as_deref())? {
            row = row.with_idempotency_key(k);
        }
        let written = self.lease_write(&mut st, &name, epoch, row).await?;
        self.lease_result(&st, &name, written).await
    }

    /// `lease`: the lease's holder, epoch and expiry, and its latest directives with
    /// whether each applies.
    pub async fn lease(&self, args: LeaseNameArgs) -> Result<CoordinatorLease> {
        let name = lease_name(args.name.as_deref())?;
        let st = self.synced().await?;
        let now = self.store.now().await?;
        Ok(st.patterns.lease(&self.room, &name, now, Some(&self.agent)))
    }
}
