//! `decision.*` bodies: proposals, votes and closing rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::Timestamp;

/// Most voters one proposal may list.
pub const MAX_VOTERS: usize = 1024;
/// Most options one proposal may offer.
pub const MAX_OPTIONS: usize = 64;
/// Largest weight one voter may carry.
pub const MAX_WEIGHT: f64 = 1_000_000.0;
/// Longest question text kept, in bytes.
pub const MAX_QUESTION_BYTES: usize = 4096;

/// Body of `decision.proposed`.
///
/// Exactly one of `deadline` and `window_ms` must be given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProposalBody {
    /// The proposal id, unique in the room (the first proposal of an id wins).
    pub id: String,
    /// The question, for people and prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The options, in order (the order breaks ties in reports). Default `yes`, `no`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// Who may vote: a list (weight 1 each) or a map from voter to weight.
    pub voters: VotersBody,
    /// The quorum. Default: a majority of the voters by count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<QuorumBody>,
    /// Absolute deadline, microseconds since the epoch in database time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// Deadline relative to the proposal's own `at`, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// A stricter margin threshold for this decision, as a fraction (0.25 = 25 %).
    /// It can only raise the room's threshold, never lower it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_margin: Option<f64>,
}

/// The voter set of a proposal on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VotersBody {
    /// Every voter has weight 1.
    List(Vec<String>),
    /// Voter to weight (finite, greater than 0, at most [`MAX_WEIGHT`]).
    Weighted(BTreeMap<String, f64>),
}

/// The quorum of a proposal on the wire: `{"count": 3}` or `{"weight": 2.5}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuorumBody {
    /// At least this many voters chose the leading option.
    Count(u64),
    /// The leading option's voters weigh at least this much together.
    Weight(f64),
}

/// Body of `decision.voted`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoteBody {
    /// The proposal id.
    pub id: String,
    /// The chosen option.
    pub option: String,
}

/// Body of `decision.committed`, `decision.escalated` and `decision.failed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecisionClosedBody {
    /// The proposal id.
    pub id: String,
    /// The committed option (required for `decision.committed`), or the leader of an
    /// escalated decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option: Option<String>,
    /// Why it was escalated or failed (`thin-margin`, `leader-without-quorum`,
    /// `deadline-missed`, `quorum-unreachable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The winning margin as a fraction, when there was a runner-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
    /// Votes per option, informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<BTreeMap<String, OptionTallyBody>>,
}

/// One option's votes in a closing body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptionTallyBody {
    /// Number of voters.
    pub count: u64,
    /// Their summed weight.
    pub weight: f64,
}
