//! `turn.*` bodies, and the token use every turn reports.

use serde::{Deserialize, Serialize};

use super::claims::ClaimEpoch;
use super::coord::Subject;
use crate::id::InteractionId;

/// Body of `turn.prompted` (actor = the agent; fenced by the drive claim).
///
/// `{"turn":"t/lobby/api/bo/4/9","subject":{"kind":"task","id":"api"},"epoch":4,"drive_epoch":9}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnPromptedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn is about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim (`reply/..` or `task/..`).
    pub epoch: ClaimEpoch,
    /// Epoch of the drive claim (`drive/..` or `taskdrive/..`).
    pub drive_epoch: ClaimEpoch,
}

/// Body of `turn.replied` (actor = the agent; fenced by the claim of the turn).
///
/// `{"turn":"..","subject":{..},"epoch":4,"tokens":1200,"reply":"<64 hex>"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRepliedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn was about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim.
    pub epoch: ClaimEpoch,
    /// Tokens the turn used.
    #[serde(default)]
    pub tokens: u64,
    /// The id of the `message.posted` that carries the reply, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<InteractionId>,
}

/// Body of `turn.failed` (actor = the agent).
///
/// `{"turn":"..","subject":{..},"epoch":4,"reason":"exit status 1","tokens":10}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFailedBody {
    /// The turn id.
    pub turn: String,
    /// What the turn was about.
    pub subject: Subject,
    /// Epoch of the subject's exclusive claim.
    pub epoch: ClaimEpoch,
    /// Why it failed.
    #[serde(default)]
    pub reason: String,
    /// Tokens the turn used.
    #[serde(default)]
    pub tokens: u64,
}

/// The part of a `turn.replied` / `turn.failed` body the budget fold reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsageBody {
    /// Tokens the turn used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensBody>,
}

/// Tokens used by one turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokensBody {
    /// A total.
    Total(u64),
    /// Input and output separately; their sum counts.
    Split {
        /// Prompt tokens.
        input: u64,
        /// Completion tokens.
        output: u64,
    },
}

impl TokensBody {
    /// The total.
    pub fn total(&self) -> u64 {
        match *self {
            TokensBody::Total(n) => n,
            TokensBody::Split { input, output } => input.saturating_add(output),
        }
    }
}
