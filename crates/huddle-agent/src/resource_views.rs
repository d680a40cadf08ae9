//! Arguments and results of the shared-resource and shared-state operations: plain
//! serde types with JSON schemas, like [`crate::views`]. No argument names an actor:
//! who holds a resource or puts a value is the session's agent.

use huddle_core::resources::Holding;
use huddle_core::shared_state::StateVersion;
use huddle_core::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::views::Written;

/// One resource wanted by `resource_acquire`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResourceSpec {
    /// The resource: `file:GLOB` (a path glob relative to the shared working tree:
    /// `*`, `?`, `**`), or `kind:name` for anything else (`api:github`,
    /// `slot:build`).
    pub name: String,
    /// `exclusive` (the default), `shared`, or `permits` (one of `permits` holders).
    #[serde(default)]
    pub mode: Option<String>,
    /// With mode `permits`: how many may hold the resource at once (1 to 1000).
    #[serde(default)]
    pub permits: Option<u32>,
}

/// Arguments of `resource_acquire`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResourceAcquireArgs {
    /// Every resource wanted: all are taken together or none is.
    pub resources: Vec<ResourceSpec>,
    /// How long the holdings last unless renewed, ms (500 to 3600000; default 60000).
    /// The server that took them renews them while it runs and gives them back
    /// when it ends.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// Wait up to this long for the resources to be free, ms (at most 600000;
    /// default 0: answer at once).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// What for, shown on the board (at most 200 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Arguments of `resource_renew` and `resource_release`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResourceNamesArgs {
    /// The resources (as acquired); empty means every resource you hold here.
    #[serde(default)]
    pub resources: Vec<String>,
    /// `resource_renew`: the new lease length, ms (default: as acquired, else 60000).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// Arguments of `resources`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResourcesArgs {
    /// Only holdings of file resources covering this path (repository-relative).
    #[serde(default)]
    pub path: Option<String>,
}

/// A live holding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HoldingView {
    /// The resource (canonical form).
    pub name: String,
    /// `exclusive`, `shared` or `permits-N`.
    pub mode: String,
    /// Who holds it.
    pub holder: String,
    /// The claim's epoch: pass it to side effects as a fencing token.
    pub epoch: i64,
    /// When it lapses unless renewed (µs, database clock).
    #[schemars(with = "i64")]
    pub expires_at: Timestamp,
}

impl From<&Holding> for HoldingView {
    fn from(h: &Holding) -> Self {
        HoldingView {
            name: h.name.to_string(),
            mode: h.mode.as_text(),
            holder: h.holder.clone(),
            epoch: h.epoch.get(),
            expires_at: h.expires_at,
        }
    }
}

/// What `resource_acquire`, `resource_renew` and `resource_release` did.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResourcesWritten {
    /// The holdings acquired, renewed or given back.
    pub resources: Vec<HoldingView>,
    /// The ledger row that records it.
    pub written: Written,
}

/// What `resources` shows.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResourcesResult {
    /// Every live holding in the room (the database's view), by resource.
    pub held: Vec<HoldingView>,
    /// Yours among them.
    pub mine: Vec<HoldingView>,
    /// The database clock now (µs).
    #[schemars(with = "i64")]
    pub now: Timestamp,
}

/// Arguments of `state_get`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct StateGetArgs {
    /// The key.
    pub key: String,
    /// Also return every earlier version.
    #[serde(default)]
    pub history: bool,
}

/// Arguments of `state_put`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct StatePutArgs {
    /// The key (1 to 256 bytes; `/` allowed).
    pub key: String,
    /// The new value (any JSON).
    pub value: Value,
    /// The version you read (0 for a key never put). The put is refused, with the
    /// current version and value, when the key has moved on: read again, apply your
    /// change to the current value, and put with its version. Without it the put
    /// goes on top of whatever is current (last writer wins).
    #[serde(default)]
    pub if_version: Option<u64>,
}

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StateVersionView {
    /// The version (1, 2, ...).
    pub version: u64,
    /// The value.
    pub value: Value,
    /// Who put it.
    pub by: String,
    /// When (µs, database clock).
    #[schemars(with = "i64")]
    pub at: Timestamp,
}

impl From<&StateVersion> for StateVersionView {
    fn from(v: &StateVersion) -> Self {
        StateVersionView {
            version: v.version,
            value: v.value.clone(),
            by: v.by.clone(),
            at: v.at,
        }
    }
}

/// A key's state.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct StateView {
    /// The key.
    pub key: String,
    /// Its current version: 0 when it was never put.
    pub version: u64,
    /// Its current value (null when never put).
    pub value: Value,
    /// Who put the current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>")]
    pub at: Option<Timestamp>,
    /// Earlier versions, oldest first (with `history`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<StateVersionView>,
}

/// What `state_put` wrote.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct StateWritten {
    /// The key as it is now.
    pub state: StateView,
    /// The row.
    pub written: Written,
}

/// What `state_list` shows.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct StateListResult {
    /// Every key of the room with its current version, by key.
    pub keys: Vec<StateView>,
}
