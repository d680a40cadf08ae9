//! `barrier.*` bodies.

use serde::{Deserialize, Serialize};

use crate::model::Timestamp;

/// Largest roster one barrier may expect.
pub const MAX_ROSTER: usize = 1024;

/// Body of `barrier.opened`. Exactly one of `timeout_ms` and `deadline` is required.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierOpenedBody {
    /// The phase this barrier closes; unique per room.
    pub phase: String,
    /// Who must check in.
    pub roster: Vec<String>,
    /// Timeout relative to the opening row's `at`, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Absolute timeout, microseconds since the epoch in database time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// What happens at the timeout; default `escalate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

/// What a barrier does when its timeout passes with someone missing.
///
/// On the wire: `"escalate"` or `{"proceed-with-quorum": {"quorum": 4}}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnTimeout {
    /// Pass if at least `quorum` roster members checked in; the rest are dropped.
    /// Otherwise escalate.
    ProceedWithQuorum {
        /// Check-ins needed, 1 to the roster size.
        quorum: u64,
    },
    /// Hand the barrier to a person.
    Escalate,
}

/// Body of `barrier.checkin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierCheckinBody {
    /// The phase checked in to.
    pub phase: String,
}

/// Body of `barrier.passed` and `barrier.escalated`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierClosedBody {
    /// The phase.
    pub phase: String,
    /// Roster members who checked in.
    #[serde(default)]
    pub checked_in: Vec<String>,
    /// `barrier.passed`: roster members dropped at the timeout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// `barrier.escalated`: roster members still missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// `barrier.escalated`: `timeout` or `quorum-not-reached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
