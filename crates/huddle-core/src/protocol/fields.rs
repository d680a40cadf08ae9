//! What many bodies share: units, names, text limits, deadlines and the closing key of
//! a pattern instance, and the defensive reading every fold does.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::limits::Limits;
use crate::model::{validate_name, Timestamp};

/// Parts per million: the unit of margins and margin thresholds.
pub const PPM: u64 = 1_000_000;

/// The actor of interactions huddle writes on nobody's behalf (owner notices).
pub const SYSTEM_ACTOR: &str = "huddle";

/// Truncates `text` to at most `max` bytes on a character boundary.
pub fn truncate_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Decodes a body into `T`, or `None` when it does not fit the schema.
pub(crate) fn parse_body<T: DeserializeOwned>(body: &Value) -> Option<T> {
    T::deserialize(body).ok()
}

/// Encodes a body (never fails for the body types here; `null` if it did).
pub(crate) fn to_value<T: Serialize>(body: &T) -> Value {
    serde_json::to_value(body).unwrap_or(Value::Null)
}

/// An idempotency key for the one closing row of a pattern instance: short, free of
/// `/` in names, and the same on every relay.
pub(crate) fn closing_key(kind: &str, room: &str, id: &str) -> String {
    let hash = hash_parts(&[kind, room, id]);
    format!("{kind}-closed:{}", &hash.to_hex()[..32])
}

/// blake3 of `parts`, each followed by a NUL byte but the last: a stable hash of a
/// tuple of names (names hold no control characters, so the tuple reads back).
pub(crate) fn hash_parts(parts: &[&str]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            h.update(&[0]);
        }
        h.update(part.as_bytes());
    }
    h.finalize()
}

/// Whether `s` is usable as an id, option, phase or agent name.
pub(crate) fn valid_name(s: &str) -> bool {
    validate_name("name", s, &Limits::default()).is_ok()
}

/// The deadline of a pattern instance from its body: exactly one of an absolute
/// deadline or a window (ms) after the opening row's `at`.
pub(crate) fn deadline_from(
    at: Timestamp,
    deadline: Option<Timestamp>,
    window_ms: Option<u64>,
) -> Option<Timestamp> {
    match (deadline, window_ms) {
        (Some(d), None) => Some(d),
        (None, Some(w)) => {
            let us = i64::try_from(w).unwrap_or(i64::MAX).saturating_mul(1000);
            Some(at.saturating_add(us))
        }
        _ => None,
    }
}
