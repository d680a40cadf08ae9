//! Quorum decisions: propose, vote, then commit, escalate or fail.
//!
//! A `decision.proposed` fixes everything the outcome depends on: the voter set
//! (optionally weighted), the quorum, the options and a deadline in database time.
//! `decision.voted` rows count only from listed voters, only for a listed option, only
//! when their `at` is not after the deadline, and only the **first** such vote of each
//! voter (a vote is final; see below). The outcome is a pure function of the folded
//! votes and a passed-in `now` ([`DecisionState::status`]):
//!
//! - **committed** when the leading option has reached the quorum and beats every
//!   other option by at least the margin threshold — early, as soon as no vote still
//!   to come could change that, or once every voter has voted or the deadline passed;
//! - **escalated** when the quorum is reached but the margin is under the threshold
//!   (a tie included): the seed's weighted vote, 1.91 against 1.85, is a 3 % margin
//!   where the unweighted 3 against 2 is 50 %, and a thin margin goes to a person;
//!   also escalated when voting is over and the leader by weight lacks the quorum
//!   another option reached (the weighted and the counted majority disagree);
//! - **failed** when the deadline passes without a quorum, or when not enough voters
//!   are left for any option to reach it.
//!
//! The margin is `(leader − runner-up) / runner-up`, the measure the seed article
//! uses (3 to 2 is 50 %, 1.91 to 1.85 is 3 %); with no runner-up it is unbounded.
//!
//! **First vote counts.** A voter's first counted vote is final; later ones are
//! ignored and counted. Because a vote can never change, a decision can be committed
//! before the deadline as soon as even the worst case of the votes still to come
//! (every one of them for the runner-up) leaves the leader clear; and a voter cannot
//! flip after seeing the others.
//!
//! Weights and margins are fixed-point integers (micro-units, parts per million), so
//! sums do not depend on the order votes were folded in and every relay compares the
//! same numbers. Votes seen before their proposal (possible when different actors'
//! rows interleave) are held and counted when it arrives, so the state does not depend
//! on how actors interleave.
//!
//! [`DecisionFold::due`] gives the `decision.committed` / `decision.escalated` /
//! `decision.failed` interaction a relay should append once the outcome is final; its
//! idempotency key makes sure only one lands however many relays write it.
//!
//! ```
//! use huddle_core::{DecisionFold, DecisionRules, DecisionStatus, Fold, Interaction,
//!     NewInteraction, Position, Role, Timestamp, Verb};
//! use serde_json::json;
//!
//! let row = |n: u64, verb, actor: &str, body| {
//!     let new = NewInteraction::new("ops", verb, actor, Role::Agent, body);
//!     Interaction { id: new.id(), position: Position::new(0, n), at: Timestamp(1_000_000),
//!         relay: "r".into(), room: new.room, thread: None, verb, actor: new.actor,
//!         role: new.role, parent: None, caused_by: vec![], body: new.body, signer: None }
//! };
//! let mut f = DecisionFold::new();
//! f.apply(&row(1, Verb::DecisionProposed, "lead", json!({
//!     "id": "d1", "options": ["material", "routine"],
//!     "voters": {"a": 0.62, "b": 0.58, "c": 0.71, "d": 0.94, "e": 0.91},
//!     "quorum": {"count": 3}, "window_ms": 60_000})));
//! for (n, (voter, option)) in [("a", "material"), ("b", "material"), ("c", "material"),
//!                              ("d", "routine"), ("e", "routine")].into_iter().enumerate() {
//!     f.apply(&row(n as u64 + 2, Verb::DecisionVoted, voter,
//!         json!({"id": "d1", "option": option})));
//! }
//! // 1.91 against 1.85: quorum reached, but a 3 % margin is escalated, not committed.
//! let status = f.status("ops", "d1", Timestamp(2_000_000), &DecisionRules::default());
//! assert!(matches!(status, Some(DecisionStatus::Escalated { .. })));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Interaction, InteractionId, Timestamp};
use crate::pattern::{ClosingRow, Instance, PatternFold, Read};
use crate::protocol::{deadline_from, truncate_text, valid_name};
use crate::verbs::Verb;

/// One unit of vote weight, in the fixed-point micro-units weights are kept in.
pub const WEIGHT_UNIT: u64 = 1_000_000;

pub use crate::protocol::decision::{
    DecisionClosedBody, OptionTallyBody, ProposalBody, QuorumBody, VoteBody, VotersBody,
    MAX_OPTIONS, MAX_QUESTION_BYTES, MAX_VOTERS, MAX_WEIGHT,
};
pub use crate::protocol::PPM;

// ---------------------------------------------------------------------------------
// Validated state.
// ---------------------------------------------------------------------------------

/// A quorum in fixed point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Quorum {
    /// At least this many voters chose the leading option.
    Count(u64),
    /// The leading option's voters weigh at least this many micro-units.
    Weight(u64),
}

/// A validated proposal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Proposal {
    /// The proposal id.
    pub id: String,
    /// The `decision.proposed` interaction.
    pub interaction: InteractionId,
    /// The thread it was proposed in; closing rows go to the same thread.
    pub thread: Option<String>,
    /// Who proposed it.
    pub proposer: String,
    /// The question (possibly empty).
    pub question: String,
    /// The options, in the proposal's order.
    pub options: Vec<String>,
    /// Voter to weight in micro-units ([`WEIGHT_UNIT`] is weight 1).
    pub voters: BTreeMap<String, u64>,
    /// The quorum.
    pub quorum: Quorum,
    /// Database time after which no vote counts.
    pub deadline: Timestamp,
    /// The proposal's own margin threshold, ppm (can only raise the room's).
    pub min_margin_ppm: Option<u64>,
}

/// A counted vote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CastVote {
    /// The option chosen.
    pub option: String,
    /// Database time of the vote.
    pub at: Timestamp,
}

/// Votes that were seen but not counted, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IgnoredVotes {
    /// From an actor not in the voter set.
    pub not_voter: u64,
    /// With an `at` after the deadline.
    pub late: u64,
    /// For an option the proposal does not offer.
    pub unknown_option: u64,
    /// A voter's votes after their first counted one.
    pub repeated: u64,
}

/// How a decision was closed in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Closure {
    /// `decision.committed`, `decision.escalated` or `decision.failed`.
    pub verb: Verb,
    /// The option named by the closing row.
    pub option: Option<String>,
    /// The reason named by the closing row.
    pub reason: Option<String>,
    /// Who wrote it.
    pub actor: String,
    /// The closing interaction.
    pub interaction: InteractionId,
}

/// One proposal and its votes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecisionState {
    proposal: Proposal,
    votes: BTreeMap<String, CastVote>,
    ignored: IgnoredVotes,
    closure: Option<Closure>,
    ignored_closures: u64,
}

/// Support for one option.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OptionTally {
    /// The option.
    pub option: String,
    /// Voters who chose it.
    pub count: u64,
    /// Their summed weight, micro-units.
    pub weight: u64,
}

/// The counted votes of a proposal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Support per option, in the proposal's option order.
    pub options: Vec<OptionTally>,
    /// Listed voters who have not voted (yet).
    pub remaining_count: u64,
    /// Their summed weight, micro-units.
    pub remaining_weight: u64,
}

impl Tally {
    /// The leading option by weight (ties go to the option listed first) and the
    /// runner-up's weight (0 when nobody else has votes).
    pub fn leader(&self) -> Option<(&OptionTally, u64)> {
        let mut lead: Option<&OptionTally> = None;
        for o in &self.options {
            if lead.is_none_or(|l| o.weight > l.weight) {
                lead = Some(o);
            }
        }
        let lead = lead?;
        let runner = self
            .options
            .iter()
            .filter(|o| o.option != lead.option)
            .map(|o| o.weight)
            .max()
            .unwrap_or(0);
        Some((lead, runner))
    }
}

/// Why a decision was escalated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EscalationReason {
    /// Quorum reached, but the leader's margin is under the threshold (or a tie).
    ThinMargin,
    /// Voting is over and another option reached the quorum, but the leader by
    /// weight did not: the weighted and the counted majority disagree.
    LeaderWithoutQuorum,
}

/// Why a decision failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureReason {
    /// The deadline passed without the leader reaching the quorum.
    DeadlineMissed,
    /// Too few voters are left for any option to reach the quorum.
    QuorumUnreachable,
}

impl EscalationReason {
    /// The wire text.
    pub fn as_str(&self) -> &'static str {
        match self {
            EscalationReason::ThinMargin => "thin-margin",
            EscalationReason::LeaderWithoutQuorum => "leader-without-quorum",
        }
    }
}

impl FailureReason {
    /// The wire text.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureReason::DeadlineMissed => "deadline-missed",
            FailureReason::QuorumUnreachable => "quorum-unreachable",
        }
    }
}

/// The outcome of a decision at some `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum DecisionStatus {
    /// Still collecting votes.
    Open,
    /// Final: the option is chosen.
    Committed {
        /// The chosen option.
        option: String,
        /// Margin over the runner-up, ppm; `None` when nobody voted otherwise.
        margin_ppm: Option<u64>,
    },
    /// Final: a person must decide.
    Escalated {
        /// The leading option.
        leader: String,
        /// Margin over the runner-up, ppm (`Some(0)` for a tie).
        margin_ppm: Option<u64>,
        /// Why.
        reason: EscalationReason,
    },
    /// Final: the proposal failed; re-propose under a new id.
    Failed {
        /// Why.
        reason: FailureReason,
    },
}

impl DecisionStatus {
    /// Whether the outcome can no longer change.
    pub fn is_final(&self) -> bool {
        !matches!(self, DecisionStatus::Open)
    }
}

/// Room-wide rules for evaluating decisions (the caller passes them in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecisionRules {
    /// Least winning margin that commits, ppm (default 100,000 = 10 %). A proposal
    /// may only raise it.
    pub min_margin_ppm: u64,
    /// How long after a deadline to wait before judging it missed, µs (default 2 s):
    /// a vote stamped just before the deadline may still be committing.
    pub grace_us: i64,
}

impl Default for DecisionRules {
    fn default() -> Self {
        DecisionRules {
            min_margin_ppm: 100_000,
            grace_us: 2_000_000,
        }
    }
}

/// `(lead - other) / other >= threshold`, with the lead strictly ahead.
fn clear(lead: u64, other: u64, threshold_ppm: u64) -> bool {
    lead > other
        && u128::from(lead - other) * u128::from(PPM)
            >= u128::from(threshold_ppm) * u128::from(other)
}

/// The margin `(lead - other) / other` in ppm; `None` when `other` is 0.
pub fn margin_ppm(lead: u64, other: u64) -> Option<u64> {
    if other == 0 {
        return None;
    }
    let m = u128::from(lead.saturating_sub(other)) * u128::from(PPM) / u128::from(other);
    Some(u64::try_from(m).unwrap_or(u64::MAX))
}

impl DecisionState {
    /// The validated proposal.
    pub fn proposal(&self) -> &Proposal {
        &self.proposal
    }

    /// Counted votes by voter.
    pub fn votes(&self) -> &BTreeMap<String, CastVote> {
        &self.votes
    }

    /// Votes seen but not counted.
    pub fn ignored(&self) -> IgnoredVotes {
        self.ignored
    }

    /// The first accepted closing row, if one was folded.
    pub fn closure(&self) -> Option<&Closure> {
        self.closure.as_ref()
    }

    /// The counted votes per option and what is still outstanding.
    pub fn tally(&self) -> Tally {
        let mut options: Vec<OptionTally> = self
            .proposal
            .options
            .iter()
            .map(|o| OptionTally {
                option: o.clone(),
                count: 0,
                weight: 0,
            })
            .collect();
        let mut remaining_count = 0u64;
        let mut remaining_weight = 0u64;
        for (voter, weight) in &self.proposal.voters {
            match self.votes.get(voter) {
                Some(v) => {
                    if let Some(t) = options.iter_mut().find(|t| t.option == v.option) {
                        t.count = t.count.saturating_add(1);
                        t.weight = t.weight.saturating_add(*weight);
                    }
                }
                None => {
                    remaining_count += 1;
                    remaining_weight = remaining_weight.saturating_add(*weight);
                }
            }
        }
        Tally {
            options,
            remaining_count,
            remaining_weight,
        }
    }
}

/// A weight as micro-units, if it is finite, positive and not over [`MAX_WEIGHT`].
fn weight_micros(w: f64) -> Option<u64> {
    if !w.is_finite() || w <= 0.0 || w > MAX_WEIGHT {
        return None;
    }
    let m = (w * WEIGHT_UNIT as f64).round();
    if m < 1.0 {
        None
    } else {
        Some(m as u64)
    }
}

impl Proposal {
    /// Validates a `decision.proposed` interaction. `None` when the body is
    /// malformed: missing or bad id, no deadline (or two), empty or oversized voter
    /// set, bad weight, duplicate or bad options, an impossible quorum.
    pub fn parse(i: &Interaction) -> Option<Proposal> {
        let body = ProposalBody::deserialize(&i.body).ok()?;
        if !valid_name(&body.id) {
            return None;
        }
        let options = body
            .options
            .unwrap_or_else(|| vec!["yes".to_string(), "no".to_string()]);
        if options.is_empty() || options.len() > MAX_OPTIONS {
            return None;
        }
        for (n, o) in options.iter().enumerate() {
            if !valid_name(o) || options[..n].contains(o) {
                return None;
            }
        }
        let voters: BTreeMap<String, u64> = match body.voters {
            VotersBody::List(list) => {
                let n = list.len();
                let map: BTreeMap<String, u64> =
                    list.into_iter().map(|v| (v, WEIGHT_UNIT)).collect();
                if map.len() != n {
                    return None; // a voter listed twice
                }
                map
            }
            VotersBody::Weighted(map) => map
                .into_iter()
                .map(|(v, w)| weight_micros(w).map(|w| (v, w)))
                .collect::<Option<_>>()?,
        };
        if voters.is_empty() || voters.len() > MAX_VOTERS || !voters.keys().all(|v| valid_name(v)) {
            return None;
        }
        let total: u64 = voters.values().fold(0u64, |a, w| a.saturating_add(*w));
        let quorum = match body.quorum {
            None => Quorum::Count(voters.len() as u64 / 2 + 1),
            Some(QuorumBody::Count(q)) => Quorum::Count(q),
            Some(QuorumBody::Weight(w)) => Quorum::Weight(weight_micros(w)?),
        };
        let possible = match quorum {
            Quorum::Count(q) => q >= 1 && q <= voters.len() as u64,
            Quorum::Weight(w) => w >= 1 && w <= total,
        };
        if !possible {
            return None;
        }
        let deadline = deadline_from(i.at, body.deadline, body.window_ms)?;
        let min_margin_ppm = match body.min_margin {
            None => None,
            Some(m) if m.is_finite() && (0.0..=1_000.0).contains(&m) => {
                Some((m * PPM as f64).round() as u64)
            }
            Some(_) => return None,
        };
        let question = truncate_text(&body.question.unwrap_or_default(), MAX_QUESTION_BYTES);
        Some(Proposal {
            id: body.id,
            interaction: i.id,
            thread: i.thread.clone(),
            proposer: i.actor.clone(),
            question,
            options,
            voters,
            quorum,
            deadline,
            min_margin_ppm,
        })
    }
}

// ---------------------------------------------------------------------------------
// The fold.
// ---------------------------------------------------------------------------------

/// The decisions of every room, folded from `decision.*` interactions.
pub type DecisionFold = PatternFold<DecisionState>;

/// A decision is a pattern instance: opened by `decision.proposed`, voted on by
/// `decision.voted`, closed by `decision.committed` / `escalated` / `failed`.
impl Instance for DecisionState {
    /// The option voted for.
    type Member = String;
    /// The option and the reason a closing row names.
    type Closing = (Option<String>, Option<String>);
    type Rules = DecisionRules;
    type Closed = DecisionClosedBody;
    type Status = DecisionStatus;

    const KIND: &'static str = "decision";

    fn read(i: &Interaction) -> Option<Read<Self>> {
        let read = match i.verb {
            Verb::DecisionProposed => {
                Read::Open(Proposal::parse(i).map(|proposal| DecisionState {
                    proposal,
                    votes: BTreeMap::new(),
                    ignored: IgnoredVotes::default(),
                    closure: None,
                    ignored_closures: 0,
                }))
            }
            Verb::DecisionVoted => Read::Member(
                VoteBody::deserialize(&i.body)
                    .ok()
                    .map(|v| (v.id, v.option)),
            ),
            Verb::DecisionCommitted | Verb::DecisionEscalated | Verb::DecisionFailed => {
                let closed = DecisionClosedBody::deserialize(&i.body).ok();
                Read::Closing(closed.map(|c| (c.id, (c.option, c.reason))))
            }
            _ => return None,
        };
        Some(read)
    }

    fn name(&self) -> &str {
        &self.proposal.id
    }

    fn member(&mut self, actor: &str, at: Timestamp, option: String) {
        let p = &self.proposal;
        if !p.voters.contains_key(actor) {
            self.ignored.not_voter += 1;
        } else if at > p.deadline {
            self.ignored.late += 1;
        } else if !p.options.contains(&option) {
            self.ignored.unknown_option += 1;
        } else if self.votes.contains_key(actor) {
            self.ignored.repeated += 1;
        } else {
            self.votes
                .insert(actor.to_string(), CastVote { option, at });
        }
    }

    fn close(&mut self, c: ClosingRow<(Option<String>, Option<String>)>) {
        let p = &self.proposal;
        let option_ok = match &c.body.0 {
            Some(o) => p.options.contains(o),
            None => c.verb != Verb::DecisionCommitted,
        };
        if self.closure.is_some() || !c.trusted(&p.proposer) || !option_ok {
            self.ignored_closures += 1;
            return;
        }
        let (option, reason) = c.body;
        self.closure = Some(Closure {
            verb: c.verb,
            option,
            reason,
            actor: c.actor,
            interaction: c.interaction,
        });
    }

    /// The outcome at database time `now`. Monotone: once final, later `now`s and
    /// further votes give the same outcome.
    fn status(&self, now: Timestamp, rules: &DecisionRules) -> DecisionStatus {
        let p = &self.proposal;
        let threshold = rules.min_margin_ppm.max(p.min_margin_ppm.unwrap_or(0));
        let tally = self.tally();
        let support = |t: &OptionTally| match p.quorum {
            Quorum::Count(_) => t.count,
            Quorum::Weight(_) => t.weight,
        };
        let (need, remaining) = match p.quorum {
            Quorum::Count(q) => (q, tally.remaining_count),
            Quorum::Weight(q) => (q, tally.remaining_weight),
        };
        let Some((lead, runner)) = tally.leader() else {
            // No options: cannot happen for a validated proposal; never commit.
            return DecisionStatus::Failed {
                reason: FailureReason::QuorumUnreachable,
            };
        };
        let has_quorum = support(lead) >= need;
        let settled =
            now > p.deadline.saturating_add(rules.grace_us.max(0)) || tally.remaining_count == 0;

        if has_quorum {
            let worst_case = if settled {
                runner
            } else {
                runner.saturating_add(tally.remaining_weight)
            };
            if clear(lead.weight, worst_case, threshold) {
                return DecisionStatus::Committed {
                    option: lead.option.clone(),
                    margin_ppm: margin_ppm(lead.weight, runner),
                };
            }
            if settled {
                return DecisionStatus::Escalated {
                    leader: lead.option.clone(),
                    margin_ppm: margin_ppm(lead.weight, runner),
                    reason: EscalationReason::ThinMargin,
                };
            }
            return DecisionStatus::Open;
        }
        let reachable = tally
            .options
            .iter()
            .any(|t| support(t).saturating_add(remaining) >= need);
        if !reachable {
            return DecisionStatus::Failed {
                reason: FailureReason::QuorumUnreachable,
            };
        }
        if !settled {
            return DecisionStatus::Open;
        }
        if tally.options.iter().any(|t| support(t) >= need) {
            return DecisionStatus::Escalated {
                leader: lead.option.clone(),
                margin_ppm: margin_ppm(lead.weight, runner),
                reason: EscalationReason::LeaderWithoutQuorum,
            };
        }
        DecisionStatus::Failed {
            reason: FailureReason::DeadlineMissed,
        }
    }

    fn opening(&self) -> (InteractionId, Option<&String>) {
        (self.proposal.interaction, self.proposal.thread.as_ref())
    }

    fn closed(&self) -> bool {
        self.closure.is_some()
    }

    fn closing(&self, now: Timestamp, rules: &DecisionRules) -> Option<(Verb, DecisionClosedBody)> {
        let status = self.status(now, rules);
        let tally = self.tally();
        let tally_body: BTreeMap<String, OptionTallyBody> = tally
            .options
            .iter()
            .map(|t| {
                (
                    t.option.clone(),
                    OptionTallyBody {
                        count: t.count,
                        weight: t.weight as f64 / WEIGHT_UNIT as f64,
                    },
                )
            })
            .collect();
        let to_fraction = |m: Option<u64>| m.map(|m| m as f64 / PPM as f64);
        let closing = match status {
            DecisionStatus::Open => return None,
            DecisionStatus::Committed { option, margin_ppm } => (
                Verb::DecisionCommitted,
                DecisionClosedBody {
                    id: self.proposal.id.clone(),
                    option: Some(option),
                    reason: None,
                    margin: to_fraction(margin_ppm),
                    tally: Some(tally_body),
                },
            ),
            DecisionStatus::Escalated {
                leader,
                margin_ppm,
                reason,
            } => (
                Verb::DecisionEscalated,
                DecisionClosedBody {
                    id: self.proposal.id.clone(),
                    option: Some(leader),
                    reason: Some(reason.as_str().to_string()),
                    margin: to_fraction(margin_ppm),
                    tally: Some(tally_body),
                },
            ),
            DecisionStatus::Failed { reason } => (
                Verb::DecisionFailed,
                DecisionClosedBody {
                    id: self.proposal.id.clone(),
                    option: None,
                    reason: Some(reason.as_str().to_string()),
                    margin: None,
                    tally: Some(tally_body),
                },
            ),
        };
        Some(closing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::Fold;
    use crate::model::Role;
    use crate::testing::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ROOM: &str = "ops";
    const T0: Timestamp = Timestamp(1_700_000_000 * SEC);

    fn propose(body: serde_json::Value) -> Interaction {
        row(ROOM, Verb::DecisionProposed, "lead", Role::Agent, T0, body)
    }

    fn vote(voter: &str, option: &str, at: Timestamp) -> Interaction {
        row(
            ROOM,
            Verb::DecisionVoted,
            voter,
            Role::Agent,
            at,
            json!({"id": "d1", "option": option}),
        )
    }

    /// Folds the rows and evaluates proposal `d1` at `now` with default rules.
    fn check(rows: Vec<Interaction>, now: Timestamp) -> DecisionStatus {
        let rows = positioned(rows);
        let f: DecisionFold = fold_checked(&rows);
        f.status(ROOM, "d1", now, &DecisionRules::default())
            .expect("proposal d1 folded")
    }

    fn five_voters() -> serde_json::Value {
        json!({"id": "d1", "question": "material or routine?",
               "options": ["material", "routine"],
               "voters": ["a", "b", "c", "d", "e"],
               "quorum": {"count": 3}, "window_ms": 60_000})
    }

    fn weighted() -> serde_json::Value {
        json!({"id": "d1", "options": ["material", "routine"],
               "voters": {"a": 0.62, "b": 0.58, "c": 0.71, "d": 0.94, "e": 0.91},
               "quorum": {"count": 3}, "window_ms": 60_000})
    }

    fn committed(option: &str, margin_ppm: Option<u64>) -> DecisionStatus {
        DecisionStatus::Committed {
            option: option.into(),
            margin_ppm,
        }
    }

    #[test]
    fn three_of_five_commits_as_soon_as_the_rest_cannot_change_it() {
        let t = T0 + SEC;
        // Two votes: open.
        let rows = vec![
            propose(five_voters()),
            vote("a", "material", t),
            vote("b", "material", t),
        ];
        assert_eq!(check(rows.clone(), t), DecisionStatus::Open);
        // The third: 3 against at most 2 to come is a 50 % margin, over 10 %.
        let mut rows3 = rows.clone();
        rows3.push(vote("c", "material", t));
        assert_eq!(check(rows3.clone(), t), committed("material", None));
        // The two remaining votes go the other way: still committed, margin 50 %.
        rows3.push(vote("d", "routine", t));
        rows3.push(vote("e", "routine", t));
        assert_eq!(check(rows3, t), committed("material", Some(500_000)));
    }

    #[test]
    fn weighted_thin_margin_is_escalated_not_committed() {
        // The seed: material 0.62 + 0.58 + 0.71 = 1.91, routine 0.94 + 0.91 = 1.85.
        let t = T0 + SEC;
        let mut rows = vec![
            propose(weighted()),
            vote("a", "material", t),
            vote("b", "material", t),
            vote("c", "material", t),
        ];
        // Quorum reached, but the 1.85 still to come could make it thin: open.
        assert_eq!(check(rows.clone(), t), DecisionStatus::Open);
        rows.push(vote("d", "routine", t));
        rows.push(vote("e", "routine", t));
        let status = check(rows.clone(), t);
        assert_eq!(
            status,
            DecisionStatus::Escalated {
                leader: "material".into(),
                margin_ppm: Some(32_432), // 0.06 / 1.85
                reason: EscalationReason::ThinMargin,
            }
        );
        // With a 3 % threshold the same votes commit.
        let f = DecisionFold::rebuild(&positioned(rows));
        let lax = DecisionRules {
            min_margin_ppm: 30_000,
            ..DecisionRules::default()
        };
        assert_eq!(
            f.status(ROOM, "d1", t, &lax),
            Some(committed("material", Some(32_432)))
        );
        // And the closing row says so.
        let due = f.due(t, &DecisionRules::default(), "relay-1");
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].verb, Verb::DecisionEscalated);
        assert_eq!(due[0].body["reason"], "thin-margin");
        assert_eq!(due[0].body["tally"]["material"]["weight"], 1.91);
        assert_eq!(due[0].body["tally"]["routine"]["weight"], 1.85);
    }

    #[test]
    fn missed_deadline_fails_and_late_votes_never_count() {
        let deadline = T0 + 60 * SEC;
        let rows = vec![
            propose(five_voters()),
            vote("a", "material", T0 + SEC),
            vote("b", "material", deadline), // exactly at the deadline counts
            vote("c", "material", deadline + 1),
            vote("d", "material", deadline + 5 * SEC),
        ];
        let f = DecisionFold::rebuild(&positioned(rows.clone()));
        let d = f.get(ROOM, "d1").unwrap();
        assert_eq!(d.votes().len(), 2);
        assert_eq!(d.ignored().late, 2);
        // Before the deadline (plus grace) it is open, after it failed.
        assert_eq!(check(rows.clone(), deadline + SEC), DecisionStatus::Open);
        assert_eq!(
            check(rows, deadline + 3 * SEC),
            DecisionStatus::Failed {
                reason: FailureReason::DeadlineMissed
            }
        );
    }

    #[test]
    fn only_listed_voters_first_vote_listed_option() {
        let t = T0 + SEC;
        let rows = vec![
            propose(five_voters()),
            vote("mallory", "material", t),
            vote("a", "banana", t),
            vote("a", "routine", t),
            vote("a", "material", t),
            vote("b", "material", t),
        ];
        let f = DecisionFold::rebuild(&positioned(rows));
        let d = f.get(ROOM, "d1").unwrap();
        assert_eq!(d.votes()["a"].option, "routine");
        assert_eq!(
            d.ignored(),
            IgnoredVotes {
                not_voter: 1,
                late: 0,
                unknown_option: 1,
                repeated: 1
            }
        );
    }

    #[test]
    fn unreachable_quorum_fails_early_and_ties_escalate() {
        let t = T0 + SEC;
        // 4 voters, quorum 3: 2-2 split leaves no option able to reach 3.
        let body = json!({"id": "d1", "voters": ["a", "b", "c", "d"], "quorum": {"count": 3},
                          "deadline": T0 + 60 * SEC});
        let rows = vec![
            propose(body.clone()),
            vote("a", "yes", t),
            vote("b", "yes", t),
            vote("c", "no", t),
            vote("d", "no", t),
        ];
        assert_eq!(
            check(rows, t),
            DecisionStatus::Failed {
                reason: FailureReason::QuorumUnreachable
            }
        );
        // Quorum 2: a tie with quorum reached escalates, whatever the threshold.
        let tie = json!({"id": "d1", "voters": ["a", "b", "c", "d"], "quorum": {"count": 2},
                         "deadline": T0 + 60 * SEC});
        let rows = vec![
            propose(tie),
            vote("a", "yes", t),
            vote("b", "yes", t),
            vote("c", "no", t),
            vote("d", "no", t),
        ];
        let f = DecisionFold::rebuild(&positioned(rows));
        let zero = DecisionRules {
            min_margin_ppm: 0,
            ..DecisionRules::default()
        };
        assert!(matches!(
            f.status(ROOM, "d1", t, &zero),
            Some(DecisionStatus::Escalated {
                margin_ppm: Some(0),
                ..
            })
        ));
    }

    #[test]
    fn weighted_leader_without_the_counted_quorum_is_escalated() {
        // Three light voters reach the count quorum for "yes"; two heavy ones outweigh
        // them for "no". Every voter voted: a person decides.
        let t = T0 + SEC;
        let body = json!({"id": "d1", "voters": {"a": 0.3, "b": 0.3, "c": 0.3, "d": 1.0, "e": 1.0},
                          "quorum": {"count": 3}, "window_ms": 60_000});
        let rows = vec![
            propose(body),
            vote("a", "yes", t),
            vote("b", "yes", t),
            vote("c", "yes", t),
            vote("d", "no", t),
        ];
        // "no" leads by weight but cannot have the quorum yet; e is still to vote.
        assert_eq!(check(rows.clone(), t), DecisionStatus::Open);
        let mut rows = rows;
        rows.push(vote("e", "no", t));
        assert!(matches!(
            check(rows, t),
            DecisionStatus::Escalated {
                reason: EscalationReason::LeaderWithoutQuorum,
                ..
            }
        ));
    }

    #[test]
    fn weight_quorum_counts_weight() {
        let t = T0 + SEC;
        let body = json!({"id": "d1", "voters": {"a": 2.0, "b": 1.0, "c": 1.0},
                          "quorum": {"weight": 2.5}, "window_ms": 1000});
        // a alone: 2.0 < 2.5, open; a + b: 3.0 >= 2.5 and 3.0 vs (0 + 1.0) clear.
        let rows = vec![propose(body), vote("a", "yes", t)];
        assert_eq!(check(rows.clone(), t), DecisionStatus::Open);
        let mut rows = rows;
        rows.push(vote("b", "yes", t));
        assert_eq!(check(rows, t), committed("yes", None));
    }

    #[test]
    fn malformed_bodies_are_ignored_and_counted() {
        let bad = [
            json!({}),
            json!({"id": "d1"}),
            json!({"id": "d1", "voters": [], "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"]}), // no deadline
            json!({"id": "d1", "voters": ["a"], "window_ms": 1, "deadline": 5}),
            json!({"id": "d1", "voters": ["a", "a"], "window_ms": 1}),
            json!({"id": "d1", "voters": {"a": -1.0}, "window_ms": 1}),
            json!({"id": "d1", "voters": {"a": 0.0}, "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "quorum": {"count": 2}, "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "quorum": {"count": 0}, "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "quorum": {"weight": 1.5}, "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "options": ["x", "x"], "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "options": [], "window_ms": 1}),
            json!({"id": "a/b", "voters": ["a"], "window_ms": 1}),
            json!({"id": "d1", "voters": ["a"], "window_ms": 1, "min_margin": -0.5}),
            json!("just a string"),
            json!([1, 2, 3]),
        ];
        let mut rows: Vec<Interaction> = bad.iter().map(|b| propose(b.clone())).collect();
        rows.push(row(
            ROOM,
            Verb::DecisionVoted,
            "a",
            Role::Agent,
            T0,
            json!({"id": 3}),
        ));
        rows.push(row(
            ROOM,
            Verb::DecisionCommitted,
            "a",
            Role::Agent,
            T0,
            json!(null),
        ));
        let f = DecisionFold::rebuild(&positioned(rows));
        assert_eq!(f.malformed(ROOM), bad.len() as u64 + 2);
        assert!(f.get(ROOM, "d1").is_none());
    }

    #[test]
    fn closing_row_is_due_once_and_first_closure_wins() {
        let t = T0 + SEC;
        let rows = vec![
            propose(five_voters()),
            vote("a", "material", t),
            vote("b", "material", t),
            vote("c", "material", t),
        ];
        let f = DecisionFold::rebuild(&positioned(rows.clone()));
        let rules = DecisionRules::default();
        let due = f.due(t, &rules, "relay-1");
        assert_eq!(due.len(), 1);
        let c = &due[0];
        assert_eq!(c.verb, Verb::DecisionCommitted);
        assert_eq!(c.role, Role::System);
        assert_eq!(c.parent, Some(rows[0].id));
        assert_eq!(c.body["option"], "material");
        // Two relays build the same key.
        let other = f.due(t, &rules, "relay-2");
        assert_eq!(c.idempotency_key, other[0].idempotency_key);

        // An agent that is neither proposer nor system cannot close it.
        let forged = row(
            ROOM,
            Verb::DecisionCommitted,
            "a",
            Role::Agent,
            t,
            json!({"id": "d1", "option": "routine"}),
        );
        let mut rows2 = rows.clone();
        rows2.push(forged);
        rows2.push(from_new(c.clone(), t));
        let f2 = DecisionFold::rebuild(&positioned(rows2));
        let d = f2.get(ROOM, "d1").unwrap();
        assert_eq!(d.closure().unwrap().option.as_deref(), Some("material"));
        assert!(f2.due(t, &rules, "relay-1").is_empty());
    }

    #[test]
    fn votes_before_their_proposal_are_held_and_counted() {
        let t = T0 + SEC;
        let rows = vec![
            vote("a", "material", t),
            vote("b", "material", t),
            propose(five_voters()),
            vote("c", "material", t),
        ];
        assert_eq!(check(rows, t), committed("material", None));
    }

    #[test]
    fn a_proposal_can_only_raise_the_margin_threshold() {
        let t = T0 + SEC;
        let mut body = five_voters();
        body["min_margin"] = json!(0.6);
        let rows = vec![
            propose(body),
            vote("a", "material", t),
            vote("b", "material", t),
            vote("c", "material", t),
            vote("d", "routine", t),
            vote("e", "routine", t),
        ];
        // 50 % < 60 %.
        assert!(matches!(check(rows, t), DecisionStatus::Escalated { .. }));
    }

    fn scenario() -> impl Strategy<Value = (Vec<Interaction>, Timestamp)> {
        let voter = prop::sample::select(vec!["a", "b", "c", "d", "e", "x"]);
        let option = prop::sample::select(vec!["yes", "no", "maybe"]);
        let deadline = T0 + 10 * SEC;
        let vote = (voter, option, 0i64..20).prop_map(move |(v, o, s)| {
            row(
                ROOM,
                Verb::DecisionVoted,
                v,
                Role::Agent,
                T0 + s * SEC,
                json!({"id": "d1", "option": o}),
            )
        });
        let weights = prop::collection::vec(1u32..300, 5);
        let quorum = 1u64..=5;
        (
            prop::collection::vec(vote, 0..24),
            weights,
            quorum,
            0i64..25,
        )
            .prop_map(move |(votes, w, q, now)| {
                let voters: BTreeMap<&str, f64> = ["a", "b", "c", "d", "e"]
                    .into_iter()
                    .zip(w.iter().map(|w| *w as f64 / 100.0))
                    .collect();
                let mut rows = vec![propose(json!({
                    "id": "d1", "voters": voters, "quorum": {"count": q},
                    "deadline": deadline
                }))];
                rows.extend(votes);
                (rows, T0 + now * SEC)
            })
    }

    proptest! {
        /// The state hash does not depend on how actors' rows interleave.
        #[test]
        fn any_interleaving_gives_the_same_state(
            (rows, shuffled) in scenario().prop_flat_map(|(rows, _)| (Just(rows.clone()), interleaving(rows))),
        ) {
            let reference = DecisionFold::rebuild(&positioned(rows)).state_hash();
            prop_assert_eq!(DecisionFold::rebuild(&shuffled).state_hash(), reference);
        }

        /// Adding votes stamped after the deadline never changes the outcome, at any
        /// `now`, wherever they land in the ledger.
        #[test]
        fn late_votes_never_change_the_outcome(
            (rows, now) in scenario(),
            late in prop::collection::vec(
                (prop::sample::select(vec!["a", "b", "c", "d", "e"]),
                 prop::sample::select(vec!["yes", "no"]), 1i64..100, any::<prop::sample::Index>()),
                1..8),
        ) {
            let rules = DecisionRules::default();
            // Only rows on time, so a late row is not a voter's first vote by accident.
            let deadline = T0 + 10 * SEC;
            let on_time: Vec<Interaction> = rows.into_iter().filter(|r| r.at <= deadline).collect();
            let before = DecisionFold::rebuild(&positioned(on_time.clone()));
            let mut with_late = on_time;
            for (v, o, s, idx) in late {
                let r = row(ROOM, Verb::DecisionVoted, v, Role::Agent, deadline + s,
                            json!({"id": "d1", "option": o}));
                let at = idx.index(with_late.len() + 1);
                with_late.insert(at, r);
            }
            let after = DecisionFold::rebuild(&positioned(with_late));
            for dt in [0, 5, 11, 30] {
                let t = now + dt * SEC;
                prop_assert_eq!(before.status(ROOM, "d1", t, &rules), after.status(ROOM, "d1", t, &rules));
            }
        }

        /// Once final, an outcome stays final and the same as time passes and further
        /// rows are folded (rows arrive in database-time order, each evaluated at its
        /// own `at`, as a relay would see them).
        #[test]
        fn outcomes_are_monotone((rows, _now) in scenario()) {
            let rules = DecisionRules::default();
            let mut rows = rows;
            rows[1..].sort_by_key(|r| r.at);
            let rows = positioned(rows);
            let mut f = DecisionFold::new();
            let mut seen: Option<DecisionStatus> = None;
            for r in &rows {
                f.apply(r);
                // The margin of a commit may still grow; the outcome may not change.
                let s = f.status(ROOM, "d1", r.at, &rules).map(|s| match s {
                    DecisionStatus::Committed { option, .. } => committed(&option, None),
                    other => other,
                });
                if let Some(prev) = &seen {
                    prop_assert_eq!(Some(prev), s.as_ref());
                } else if s.as_ref().is_some_and(DecisionStatus::is_final) {
                    seen = s;
                }
            }
        }
    }
}
