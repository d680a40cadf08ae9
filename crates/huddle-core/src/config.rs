//! Room configuration: the topology (responder and allocation policies) and the
//! limits the room owner tunes with `!config`.
//!
//! [`RoomConfig`] is the typed, effective configuration that policies and
//! synchronization decisions read. (The `!config` grammar, clamps and the config fold
//! that produces it live beside it.)

use serde::{Deserialize, Serialize};

/// Who answers an addressed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Responder {
    /// Every eligible agent contends at once; the first claim wins.
    Race,
    /// The `responder-agent` goes first; others wait the fallback window.
    Designated,
    /// Agents are delayed by role rank; others wait the fallback window.
    RolePriority,
}

/// How ready tasks are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Allocation {
    /// Any eligible agent may claim a ready task.
    Pull,
    /// The task's assignee claims it (anyone when it has none).
    Push,
    /// Agents bid; at the end of the bid window the best bid claims.
    Bid,
}

/// The effective configuration of a room or thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomConfig {
    /// Responder policy.
    pub responder: Responder,
    /// The designated agent (for `designated`), or the ordered preference list head.
    pub responder_agent: Option<String>,
    /// How long non-preferred agents wait before contending, ms (default 1,500).
    pub responder_window_ms: u64,
    /// Allocation policy.
    pub allocation: Allocation,
    /// Claim lease, ms (default 60,000).
    pub claim_ttl_ms: u64,
    /// Bid window, ms (default 2,000).
    pub bid_window_ms: u64,
    /// Attempts per task before it fails for good (default 3).
    pub max_attempts: u32,
    /// Consecutive agent turns without a human message (default 4).
    pub loop_max: u32,
    /// Cooldown after the turn cap is hit, ms (default 30,000).
    pub loop_cooldown_ms: u64,
    /// Messages per sender per window (default 10).
    pub rate: u32,
    /// Rate window, ms (default 60,000).
    pub rate_window_ms: u64,
    /// Whether agents answer only when mentioned.
    pub require_mention: bool,
    /// Room token budget; `None` is unlimited.
    pub budget: Option<u64>,
    /// Most forwards a message may have travelled (default 3).
    pub max_hops: u32,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            responder: Responder::Race,
            responder_agent: None,
            responder_window_ms: 1_500,
            allocation: Allocation::Pull,
            claim_ttl_ms: 60_000,
            bid_window_ms: 2_000,
            max_attempts: 3,
            loop_max: 4,
            loop_cooldown_ms: 30_000,
            rate: 10,
            rate_window_ms: 60_000,
            require_mention: false,
            budget: None,
            max_hops: 3,
        }
    }
}
