//! Versioned shared state: a value per key of a room, folded from append-only
//! `state.put` rows.
//!
//! Each put carries the version it makes: one more than the version its writer read.
//! Version `v` of key `k` in room `r` is the row whose idempotency key is
//! `state/<r>/<v>/<k>` ([`state_idempotency_key`]); the ledger holds at most one row
//! per idempotency key, so of two writers that read version `v - 1` and put `v`, the
//! database keeps exactly one and answers the other with the first row's id — a put
//! on a stale version is refused atomically, by the unique index, not by a read
//! followed by an append. Both database backends also refuse (migration 0007) a
//! `state.put` whose idempotency key is not that one, or whose version's predecessor
//! is not in the ledger, so versions of a key are dense: 1, 2, 3, ...
//!
//! The fold keeps every version (the history); the value of a key is its latest. A
//! row whose version is already taken (it could only come from around the store) is
//! ignored and counted; a row whose predecessor is not folded yet is held until it
//! is, so the fold is the same for any interleaving that keeps each writer's order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, Timestamp};
use crate::verbs::Verb;

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// The body of `state.put`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatePutBody {
    /// The key.
    pub key: String,
    /// The version this put makes (1 for a key's first put).
    pub version: u64,
    /// The value (any JSON).
    pub value: serde_json::Value,
}

/// The idempotency key of version `version` of `key` in `room`.
pub fn state_idempotency_key(room: &str, version: u64, key: &str) -> String {
    format!("state/{room}/{version}/{key}")
}

/// Checks a key: 1 to [`MAX_KEY_BYTES`] bytes, no control characters, no
/// surrounding white space (`/` is allowed).
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!("key must be 1 to {MAX_KEY_BYTES} bytes"));
    }
    if key.chars().any(char::is_control) || key.trim() != key {
        return Err(format!(
            "key {key:?} must not contain control characters or start or end with white space"
        ));
    }
    Ok(())
}

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateVersion {
    /// The version.
    pub version: u64,
    /// The value.
    pub value: serde_json::Value,
    /// Who put it.
    pub by: String,
    /// When (database clock).
    pub at: Timestamp,
    /// The row.
    pub id: InteractionId,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct KeyHistory {
    /// Versions 1..=n, in order.
    versions: Vec<StateVersion>,
    /// Rows whose predecessor is not folded yet, by version (first wins).
    waiting: BTreeMap<u64, StateVersion>,
}

/// The fold of `state.put` rows: per room and key, every version.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SharedStateFold {
    rooms: BTreeMap<String, BTreeMap<String, KeyHistory>>,
    ignored: BTreeMap<String, u64>,
}

impl SharedStateFold {
    /// Nothing folded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The latest version of `key` in `room`.
    pub fn get(&self, room: &str, key: &str) -> Option<&StateVersion> {
        self.history(room, key).last()
    }

    /// The current version number of `key` (0 when it was never put).
    pub fn version(&self, room: &str, key: &str) -> u64 {
        self.get(room, key).map_or(0, |v| v.version)
    }

    /// Every version of `key`, oldest first.
    pub fn history(&self, room: &str, key: &str) -> &[StateVersion] {
        self.rooms
            .get(room)
            .and_then(|r| r.get(key))
            .map_or(&[], |h| h.versions.as_slice())
    }

    /// The latest version of every key of `room` that has one, by key.
    pub fn list(&self, room: &str) -> Vec<(&str, &StateVersion)> {
        self.rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.iter())
            .filter_map(|(k, h)| h.versions.last().map(|v| (k.as_str(), v)))
            .collect()
    }

    /// Rows of `room` ignored: unreadable bodies and versions already taken.
    pub fn ignored(&self, room: &str) -> u64 {
        self.ignored.get(room).copied().unwrap_or(0)
    }
}

impl Fold for SharedStateFold {
    fn apply(&mut self, row: &Interaction) {
        if row.verb != Verb::StatePut {
            return;
        }
        let body = serde_json::from_value::<StatePutBody>(row.body.clone())
            .ok()
            .filter(|b| b.version >= 1 && check_key(&b.key).is_ok());
        let Some(body) = body else {
            *self.ignored.entry(row.room.clone()).or_default() += 1;
            return;
        };
        let h = self
            .rooms
            .entry(row.room.clone())
            .or_default()
            .entry(body.key)
            .or_default();
        let current = h.versions.len() as u64;
        let version = StateVersion {
            version: body.version,
            value: body.value,
            by: row.actor.clone(),
            at: row.at,
            id: row.id,
        };
        if body.version <= current || h.waiting.contains_key(&body.version) {
            *self.ignored.entry(row.room.clone()).or_default() += 1;
            return;
        }
        h.waiting.insert(body.version, version);
        while let Some(next) = h.waiting.remove(&(h.versions.len() as u64 + 1)) {
            h.versions.push(next);
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;
    use crate::testing::{interleaving, positioned, row};
    use proptest::prelude::*;
    use serde_json::json;

    fn put(actor: &str, key: &str, version: u64, value: i64) -> Interaction {
        row(
            "r",
            Verb::StatePut,
            actor,
            Role::Agent,
            Timestamp(version as i64),
            json!({"key": key, "version": version, "value": value}),
        )
    }

    #[test]
    fn versions_chain_and_history_is_kept() {
        let mut f = SharedStateFold::new();
        for r in [
            put("a", "k", 1, 10),
            put("b", "k", 2, 20),
            put("a", "k", 2, 99),
        ] {
            f.apply(&r);
        }
        assert_eq!(f.version("r", "k"), 2);
        assert_eq!(
            f.get("r", "k").map(|v| (&v.by, v.value.clone())),
            Some((&"b".to_string(), json!(20)))
        );
        assert_eq!(f.history("r", "k").len(), 2);
        assert_eq!(f.ignored("r"), 1, "the second version 2 is ignored");
        assert_eq!(f.version("r", "other"), 0);
        // A version ahead of its predecessor waits for it.
        f.apply(&put("a", "k", 4, 40));
        assert_eq!(f.version("r", "k"), 2);
        f.apply(&put("a", "k", 3, 30));
        assert_eq!(f.version("r", "k"), 4);
        assert_eq!(f.list("r").len(), 1);
        f.apply(&row(
            "r",
            Verb::StatePut,
            "a",
            Role::Agent,
            Timestamp(0),
            json!({"key": "k"}),
        ));
        assert_eq!(f.ignored("r"), 2);
    }

    proptest! {
        /// Any interleaving keeping each writer's order folds to the same state.
        #[test]
        fn interleavings_fold_alike(rows in interleaving(positioned(vec![
            put("a", "k", 1, 1), put("a", "k", 2, 2), put("b", "j", 1, 5),
            put("b", "k", 3, 3), put("a", "j", 2, 6),
        ]))) {
            let mut f = SharedStateFold::new();
            for r in &rows {
                f.apply(r);
            }
            prop_assert_eq!(f.version("r", "k"), 3);
            prop_assert_eq!(f.version("r", "j"), 2);
        }
    }
}
