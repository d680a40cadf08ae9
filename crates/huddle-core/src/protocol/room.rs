//! Bodies of the room's own verbs as coordination reads them: `room.created`,
//! `agent.registered`, `message.posted`.

use serde::{Deserialize, Serialize};

/// Body of `agent.registered` (actor = the agent, role `agent`).
///
/// `{"capabilities":["rust","sql"],"priority":10}`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRegisteredBody {
    /// Declared capabilities.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Rank under `role-priority` (lower answers first; default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

/// Body of `message.posted` as coordination reads it.
///
/// `{"text":"@bo can you look?","mentions":["bo"]}`; `mentions` is optional (adapters
/// that know who was mentioned put it here; `@name` in the text counts too).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageBody {
    /// The text.
    #[serde(default)]
    pub text: String,
    /// Agents explicitly mentioned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentions: Vec<String>,
    /// How many agent-to-agent steps led here: set on an agent's reply that
    /// addresses another agent (its parent's hops + 1); absent is 0. Guards refuse
    /// to answer a message with more than `max-hops`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops: Option<u64>,
    /// Makes the row unique: every post carries one, so the same text said twice is
    /// two messages (a relay's reply derives it from its turn, so a retried write is
    /// the same row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

/// Body of `room.settled` (actor `huddle`, role `system`): the room's task counts when
/// nothing was ready, claimed or running any more. Every relay writes the same content
/// at the same point, so the ledger keeps one per settling.
///
/// `{"total":4,"done":3,"abandoned":1,"blocked":0}`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomSettledBody {
    /// Tasks in the room.
    pub total: usize,
    /// Completed.
    pub done: usize,
    /// Failed for good.
    pub abandoned: usize,
    /// Open but never runnable (a dependency abandoned, missing or in a cycle).
    pub blocked: usize,
}

impl RoomSettledBody {
    /// Whether every task was done (`huddle wait` exits 0), rather than some
    /// abandoned or blocked.
    pub fn all_done(&self) -> bool {
        self.done == self.total
    }
}

/// Body of `room.archived` (actor = the owner, role `owner`): the room's other rows
/// were exported and removed. `rows` is how many, `digest` the [`ArchiveDigest`] of
/// their ids in ledger order, and `sig` the owner's signature (the room's key at the
/// archive), as on an owner command.
///
/// `{"owner":"olga","rows":1234,"digest":"9f2c…","sig":{"key":"…","ed25519":"…"}}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomArchivedBody {
    /// The owner who archived it.
    pub owner: String,
    /// How many rows were exported and removed.
    pub rows: u64,
    /// The digest of their content ([`ArchiveDigest`]), 64 hex digits.
    pub digest: String,
}

impl RoomArchivedBody {
    /// The body as JSON (without the signature, which [`crate::signing`] adds).
    pub fn to_body(&self) -> serde_json::Value {
        serde_json::json!({
            "owner": self.owner,
            "rows": self.rows,
            "digest": self.digest,
        })
    }
}

/// The digest of an archive: blake3 over `huddle.archive.v1\0` followed by the
/// 32-byte ids of the archived rows in ledger order. The ids are content hashes, so
/// the digest commits to the content of every row and to their order.
#[derive(Clone, Debug)]
pub struct ArchiveDigest {
    hasher: blake3::Hasher,
    rows: u64,
}

impl Default for ArchiveDigest {
    fn default() -> Self {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"huddle.archive.v1\0");
        ArchiveDigest { hasher, rows: 0 }
    }
}

impl ArchiveDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next row's id.
    pub fn add(&mut self, id: &crate::InteractionId) {
        self.hasher.update(&id.0);
        self.rows += 1;
    }

    /// How many ids were added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The digest so far, 64 hex digits.
    pub fn hex(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}

/// A nonce (16 hex digits) from `seed` bytes: random ones for a new post, or a stable
/// value (a turn id, an idempotency key) for a write that must stay the same row when
/// retried.
pub fn nonce_from(seed: &[u8]) -> String {
    let h = blake3::hash(seed);
    h.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Body of `room.created` as coordination reads it: `{"owner":"ana"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomCreatedBody {
    /// The room's owner (the actor when absent).
    #[serde(default)]
    pub owner: Option<String>,
}

/// The `role-priority` rank of an agent that declares none.
pub const DEFAULT_PRIORITY: u32 = 100;
