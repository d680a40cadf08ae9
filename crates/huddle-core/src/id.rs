//! The content id of an interaction.
//!
//! It sits below [`crate::canonical`] and [`crate::model`]: the encoding names causes
//! by id, and the model computes ids from the encoding.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The 32-byte blake3 id of an interaction. Shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InteractionId(pub [u8; 32]);

impl InteractionId {
    /// The id as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 12 hex digits, for display.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }

    /// Builds an id from exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ModelError> {
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| ModelError::BadId(format!("expected 32 bytes, got {}", bytes.len())))?;
        Ok(InteractionId(arr))
    }
}

impl fmt::Debug for InteractionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InteractionId({})", self.short())
    }
}

impl fmt::Display for InteractionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for InteractionId {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s).map_err(|e| ModelError::BadId(format!("{s:?}: {e}")))?;
        Self::from_slice(&bytes)
    }
}

/// Hex in human-readable formats (JSON), the 32 bytes in binary ones (the CBOR of a
/// relay's snapshot, plan 0063).
impl Serialize for InteractionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            s.serialize_bytes(&self.0)
        }
    }
}

struct IdVisitor;

impl serde::de::Visitor<'_> for IdVisitor {
    type Value = InteractionId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an interaction id: 64 hex digits or 32 bytes")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<InteractionId, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<InteractionId, E> {
        InteractionId::from_slice(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for InteractionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            d.deserialize_str(IdVisitor)
        } else {
            d.deserialize_bytes(IdVisitor)
        }
    }
}
