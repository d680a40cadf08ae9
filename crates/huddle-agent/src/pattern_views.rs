//! Arguments and results of the pattern operations (decisions, barriers, the
//! coordinator lease): plain serde types with JSON schemas, like [`crate::views`].
//!
//! No argument names an actor: who proposes, votes, checks in or holds a lease is the
//! session's agent.

use std::collections::BTreeMap;

use huddle_core::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::views::Written;

/// A voter set: a list (weight 1 each) or a map from voter to weight.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum VotersArg {
    /// Every voter weighs 1.
    List(Vec<String>),
    /// Voter to weight (greater than 0, at most 1,000,000).
    Weighted(BTreeMap<String, f64>),
}

impl Default for VotersArg {
    fn default() -> Self {
        VotersArg::List(Vec::new())
    }
}

/// Arguments of `propose`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ProposeArgs {
    /// The decision's id, unique in the room (a name: no `/`).
    pub id: String,
    /// The question, for the voters.
    #[serde(default)]
    pub question: Option<String>,
    /// The options, in order (default `yes`, `no`).
    #[serde(default)]
    pub options: Option<Vec<String>>,
    /// Who may vote: a list of agents, or a map from agent to weight.
    pub voters: VotersArg,
    /// Quorum as a number of voters agreeing on the leading option (default: a
    /// majority of the voters). Give at most one of `quorum_count` and `quorum_weight`.
    #[serde(default)]
    pub quorum_count: Option<u64>,
    /// Quorum as the summed weight of the leading option's voters.
    #[serde(default)]
    pub quorum_weight: Option<f64>,
    /// How long voting stays open, ms (1 to 7 days' worth).
    pub window_ms: u64,
    /// A stricter winning margin than the room's 10 %, as a fraction (0.25 = 25 %).
    #[serde(default)]
    pub min_margin: Option<f64>,
    /// Thread to propose in.
    #[serde(default)]
    pub thread: Option<String>,
}

/// Arguments of `vote`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct VoteArgs {
    /// The decision's id.
    pub id: String,
    /// The option you choose. Your first vote is final.
    pub option: String,
}

/// Arguments of `decision`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct DecisionArgs {
    /// The decision's id.
    pub id: String,
    /// While it is open, wait up to this long (ms, at most 60000) for its outcome.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// One option's support.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct OptionTallyView {
    /// The option.
    pub option: String,
    /// Voters who chose it.
    pub count: u64,
    /// Their summed weight.
    pub weight: f64,
}

/// A decision as the fold sees it now.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DecisionView {
    /// Its id.
    pub id: String,
    /// The question.
    pub question: String,
    /// Who proposed it.
    pub proposer: String,
    /// The options.
    pub options: Vec<String>,
    /// Voter to weight.
    pub voters: BTreeMap<String, f64>,
    /// Quorum by count, if it is one.
    pub quorum_count: Option<u64>,
    /// Quorum by weight, if it is one.
    pub quorum_weight: Option<f64>,
    /// No vote counts after this (database clock, µs).
    #[schemars(with = "i64")]
    pub deadline: Timestamp,
    /// `open`, `committed`, `escalated` (a person decides) or `failed`.
    pub status: String,
    /// True once the outcome can no longer change.
    pub is_final: bool,
    /// The committed option, or the leader of an escalated decision.
    pub option: Option<String>,
    /// Why it was escalated or failed (`thin-margin`, `leader-without-quorum`,
    /// `deadline-missed`, `quorum-unreachable`).
    pub reason: Option<String>,
    /// The leader's margin over the runner-up, as a fraction (none without a runner-up).
    pub margin: Option<f64>,
    /// Support per option.
    pub tally: Vec<OptionTallyView>,
    /// Counted votes: voter to option.
    pub votes: BTreeMap<String, String>,
    /// Voters who have not voted.
    pub waiting_for: Vec<String>,
    /// Your counted vote.
    pub your_vote: Option<String>,
    /// The closing row in the ledger (`decision.committed`, ...), once written.
    pub closed_by: Option<String>,
}

/// Result of `propose` and `vote`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DecisionWritten {
    /// The row written (`inserted` false for a retry).
    pub written: Written,
    /// The decision afterwards.
    pub decision: DecisionView,
}

/// Arguments of `barrier_open`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct BarrierOpenArgs {
    /// The phase this barrier closes, unique in the room (a name: no `/`).
    pub phase: String,
    /// Who must check in.
    pub roster: Vec<String>,
    /// How long to wait for the roster, ms (1 to 7 days' worth).
    pub timeout_ms: u64,
    /// At the timeout, pass if at least this many checked in (the rest are dropped);
    /// without it, a timeout escalates to a person.
    #[serde(default)]
    pub quorum: Option<u64>,
    /// Thread to open it in.
    #[serde(default)]
    pub thread: Option<String>,
}

/// Arguments of `barrier_arrive`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct BarrierArriveArgs {
    /// The phase you finished.
    pub phase: String,
}

/// Arguments of `barrier`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct BarrierArgs {
    /// The phase.
    pub phase: String,
    /// While it is waiting, wait up to this long (ms, at most 60000) for it to pass or
    /// escalate.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// A barrier as the fold sees it now.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BarrierView {
    /// The phase.
    pub phase: String,
    /// Who opened it.
    pub opener: String,
    /// Who must check in.
    pub roster: Vec<String>,
    /// No check-in counts after this (database clock, µs).
    #[schemars(with = "i64")]
    pub deadline: Timestamp,
    /// Check-ins that pass it at the timeout; none: a timeout escalates.
    pub quorum: Option<u64>,
    /// `waiting`, `passed` (the next phase may start) or `escalated` (a person decides).
    pub status: String,
    /// True once the status can no longer change.
    pub is_final: bool,
    /// Roster members checked in.
    pub checked_in: Vec<String>,
    /// Roster members not checked in.
    pub missing: Vec<String>,
    /// Members dropped when it passed by quorum at the timeout.
    pub dropped: Vec<String>,
    /// Why it escalated (`timeout`, `quorum-not-reached`).
    pub reason: Option<String>,
    /// Whether you checked in.
    pub you_checked_in: bool,
    /// The closing row in the ledger (`barrier.passed`, ...), once written.
    pub closed_by: Option<String>,
}

/// Result of `barrier_open` and `barrier_arrive`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BarrierWritten {
    /// The row written (`inserted` false for a retry).
    pub written: Written,
    /// The barrier afterwards.
    pub barrier: BarrierView,
}

/// Arguments of `lease_acquire` and `lease_renew`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct LeaseArgs {
    /// The lease (default `coordinator`).
    #[serde(default)]
    pub name: Option<String>,
    /// How long the lease lasts unless renewed, ms (1000 to 3600000; default 90000,
    /// or the current ttl on renewal).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// Arguments of `lease_release` and `lease`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct LeaseNameArgs {
    /// The lease (default `coordinator`).
    #[serde(default)]
    pub name: Option<String>,
}

/// Arguments of `lease_directive`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct DirectiveArgs {
    /// The lease you hold (default `coordinator`).
    #[serde(default)]
    pub name: Option<String>,
    /// The directive, any JSON (for example `{"assign": "t1", "to": "w2"}`).
    pub directive: Value,
    /// A key of your choosing: a retry with the same key never writes twice.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// A `lease.directive` and whether it applies.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DirectiveView {
    /// The interaction (hex id).
    pub id: String,
    /// Who issued it.
    pub actor: String,
    /// Database time.
    #[schemars(with = "i64")]
    pub at: Timestamp,
    /// The epoch it carries.
    pub epoch: u64,
    /// `applies` (act on it), `stale` (an older epoch: ignore it), `not-holder` or
    /// `unfenced` (ignore it).
    pub check: String,
    /// The directive.
    pub directive: Value,
}

/// A lease as the fold sees it now, with its latest directives.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CoordinatorLease {
    /// The lease.
    pub name: String,
    /// `vacant`, `held` or `lapsed` (the holder stopped renewing: take it over).
    pub status: String,
    /// The holder (the last one when lapsed).
    pub holder: Option<String>,
    /// Its epoch: every directive carries it.
    pub epoch: Option<u64>,
    /// When it lapses, or lapsed (database clock, µs).
    #[schemars(with = "Option<i64>")]
    pub expires_at: Option<Timestamp>,
    /// The ttl of the latest heartbeat, ms.
    pub ttl_ms: Option<u64>,
    /// Whether you hold it now.
    pub you_hold: bool,
    /// The latest directives of this lease, oldest first, each checked against the
    /// lease as it was when the directive was written.
    pub directives: Vec<DirectiveView>,
}

/// Result of `lease_acquire`, `lease_renew`, `lease_release` and `lease_directive`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct LeaseWritten {
    /// The row written (a heartbeat or a directive).
    pub written: Written,
    /// The lease afterwards.
    pub lease: CoordinatorLease,
}
