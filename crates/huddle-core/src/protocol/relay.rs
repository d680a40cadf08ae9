//! `relay.heartbeat`: a relay's presence in a room.
//!
//! A relay holds the liveness lease `relay/<id>` (renewed every few seconds; see the
//! relay crate's `identity`) and, on a slow cadence, writes one heartbeat per room it
//! serves. The lease says whether the relay is alive *now* (judged by the database
//! clock, like every claim); the heartbeat says what it hosts and how it is doing.
//! Readers join the two: an agent is offline when every relay whose latest heartbeat
//! lists it has a lapsed lease.

use serde::{Deserialize, Serialize};

/// Most agents one heartbeat lists.
pub const MAX_HEARTBEAT_AGENTS: usize = 256;

/// Body of `relay.heartbeat` (actor = the relay id, role `system`).
///
/// `{"relay":"r0","instance":"r0@host/pid42/1f","beat":3,"version":"0.1.0",
///   "agents":["ada","bo"],"behind":0}`
///
/// `beat` counts the heartbeats of one process from 0 (written at start); with the
/// instance (unique per process) it makes every heartbeat a new row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayHeartbeatBody {
    /// The relay id (the holder name of its drive claims).
    pub relay: String,
    /// The process holding the id's lease.
    pub instance: String,
    /// The heartbeat's number within this process (0 at start).
    pub beat: u64,
    /// The relay's version.
    #[serde(default)]
    pub version: String,
    /// The agents it hosts in this room, sorted.
    #[serde(default)]
    pub agents: Vec<String>,
    /// Ledger rows committed but not yet folded by the relay when it wrote this (at
    /// most the read batch it checks; a relay that keeps up reports 0).
    #[serde(default)]
    pub behind: u64,
}

impl RelayHeartbeatBody {
    /// The JSON body.
    pub fn to_body(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Reads a body; `None` when it does not fit the schema or lists too many agents.
    pub fn parse(body: &serde_json::Value) -> Option<Self> {
        serde_json::from_value::<Self>(body.clone())
            .ok()
            .filter(|b| b.agents.len() <= MAX_HEARTBEAT_AGENTS && !b.relay.is_empty())
    }
}
