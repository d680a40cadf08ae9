//! `lease.*` bodies.

use serde::{Deserialize, Serialize};

/// The lease name used when a body names none.
pub const DEFAULT_LEASE: &str = "coordinator";
/// Default lease ttl: three heartbeat intervals of 30 s.
pub const DEFAULT_TTL_MS: u64 = 90_000;
/// Shortest ttl a heartbeat may ask for.
pub const MIN_TTL_MS: u64 = 1_000;
/// Longest ttl a heartbeat may ask for.
pub const MAX_TTL_MS: u64 = 3_600_000;

/// Body of `lease.heartbeat`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHeartbeatBody {
    /// The lease; default [`DEFAULT_LEASE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The holder; default the actor. Only a `system` row (a relay speaking for its
    /// agent) may name another holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The fencing epoch.
    pub epoch: u64,
    /// How long the lease lasts after this heartbeat, ms; default
    /// [`DEFAULT_TTL_MS`], clamped to [`MIN_TTL_MS`]..=[`MAX_TTL_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Renewal counter: makes each renewal distinct content (identical content is
    /// the same interaction).
    #[serde(default)]
    pub beat: u64,
}

/// Body of `lease.directive`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseDirectiveBody {
    /// The lease; default [`DEFAULT_LEASE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The coordinator's epoch when it issued the directive.
    pub epoch: u64,
    /// The directive itself, opaque to the fold.
    #[serde(default)]
    pub directive: serde_json::Value,
}
