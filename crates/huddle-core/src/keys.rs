//! Ed25519 keys, and the signatures writers put beside the rows they store.
//!
//! One key type serves every signer: a room owner (whose signatures live in a row's
//! body, [`crate::signing`]) and a writer — a relay, or any `huddle` command given a
//! key — whose [`RowSignature`] is stored next to the row, like its `relay` column,
//! outside the hashed content.
//!
//! A row signature covers [`ROW_SIGNATURE_TAG`], the writer's name (length-prefixed)
//! and the row's content id, the blake3 hash of its canonical encoding
//! ([`crate::canonical`]): signing the id signs the encoding. So it says "writer W
//! stored exactly this content": it does not verify under another writer's name, on
//! other content, or with another key. Identical content written by two writers is
//! still one row (the one stored first keeps its writer and signature).
//!
//! This module sits below the model: it needs only the content id. Key generation takes
//! its 32 random bytes from the caller ([`OwnerSecret::from_seed`]).
//!
//! ```
//! use huddle_core::keys::{OwnerSecret, RowSignature};
//! use huddle_core::InteractionId;
//!
//! let relay = OwnerSecret::from_seed([9; 32]);
//! let id = InteractionId([1; 32]);
//! let sig = relay.sign_row("relay-a", &id);
//! let stored = sig.to_text();
//! let read: RowSignature = stored.parse().unwrap();
//! assert!(read.verify("relay-a", &id).is_ok());
//! assert!(read.verify("relay-b", &id).is_err());
//! ```

use std::fmt;
use std::str::FromStr;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::id::InteractionId;

/// Domain tag in front of the bytes a writer signs, so a row signature can never be
/// mistaken for an owner's signature or anything else.
pub const ROW_SIGNATURE_TAG: &[u8] = b"huddle.row-signature.v1\0";

/// The scheme prefix of a stored row signature's text form.
const ROW_SIGNATURE_SCHEME: &str = "ed25519";

/// Why a signature was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The body has no `sig` member.
    #[error("the row is not signed")]
    Missing,
    /// `sig` is not `{"key": <64 hex>, "ed25519": <128 hex>}` (or a stored row
    /// signature is not `ed25519:<64 hex>:<128 hex>`).
    #[error("the row's signature is malformed: {0}")]
    Malformed(String),
    /// Signed by a key other than the room's owner key.
    #[error("the row is signed by key {signed_by}, not by the room owner's key {expected}")]
    OtherKey {
        /// The key named in the signature, hex.
        signed_by: String,
        /// The room's owner key, hex.
        expected: String,
    },
    /// The signature does not match the content.
    #[error("the row's signature does not match its content")]
    Invalid,
    /// The room has no owner key to check against.
    #[error("the room has no owner key")]
    NoKey,
}

/// A key text that is not 64 hex digits of a valid Ed25519 public key (or secret).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad key: {0}")]
pub struct KeyError(String);

/// An Ed25519 public key: a room owner's, or a writer's.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerKey(pub(crate) VerifyingKey);

/// A writer's public key (the same type as an owner's).
pub type WriterKey = OwnerKey;

impl OwnerKey {
    /// The 64-hex-digit text form, as recorded in `room.created`.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.as_bytes())
    }

    /// A short form for messages (the first 16 hex digits).
    pub fn short(&self) -> String {
        self.to_hex()[..16].to_string()
    }
}

impl PartialOrd for OwnerKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OwnerKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.as_bytes().cmp(other.0.as_bytes())
    }
}

impl fmt::Debug for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerKey({})", self.to_hex())
    }
}

impl fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for OwnerKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex32(s)?;
        VerifyingKey::from_bytes(&bytes)
            .map(OwnerKey)
            .map_err(|_| KeyError("not an Ed25519 public key".into()))
    }
}

impl serde::Serialize for OwnerKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for OwnerKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 secret key: an owner's or a writer's. Its `Debug` does not show the
/// secret.
#[derive(Clone)]
pub struct OwnerSecret(pub(crate) SigningKey);

/// A writer's secret key (the same type as an owner's).
pub type WriterSecret = OwnerSecret;

impl OwnerSecret {
    /// The secret key from 32 random bytes.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        OwnerSecret(SigningKey::from_bytes(&seed))
    }

    /// The 64-hex-digit text form (what a key file holds).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.to_bytes())
    }

    /// The public key.
    pub fn public(&self) -> OwnerKey {
        OwnerKey(self.0.verifying_key())
    }

    /// The signature `writer` stores beside the row with content id `id`.
    pub fn sign_row(&self, writer: &str, id: &InteractionId) -> RowSignature {
        RowSignature {
            key: self.public(),
            signature: self.0.sign(&row_signed_bytes(writer, id)).to_bytes(),
        }
    }
}

impl fmt::Debug for OwnerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerSecret(public {})", self.public().to_hex())
    }
}

impl FromStr for OwnerSecret {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(OwnerSecret::from_seed(hex32(s)?))
    }
}

fn hex32(s: &str) -> Result<[u8; 32], KeyError> {
    let bytes = hex::decode(s.trim()).map_err(|e| KeyError(e.to_string()))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| KeyError(format!("{} bytes, expected 32", b.len())))
}

/// The bytes a writer signs for a row: [`ROW_SIGNATURE_TAG`], the writer's name as a
/// big-endian u64 length and its bytes, then the 32-byte content id.
pub fn row_signed_bytes(writer: &str, id: &InteractionId) -> Vec<u8> {
    let mut out = Vec::with_capacity(ROW_SIGNATURE_TAG.len() + 8 + writer.len() + 32);
    out.extend_from_slice(ROW_SIGNATURE_TAG);
    out.extend_from_slice(&(writer.len() as u64).to_be_bytes());
    out.extend_from_slice(writer.as_bytes());
    out.extend_from_slice(&id.0);
    out
}

/// A writer's signature of a stored row: who signed (the public key) and the Ed25519
/// signature of [`row_signed_bytes`]. Stored as text, `ed25519:<64 hex>:<128 hex>`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RowSignature {
    key: OwnerKey,
    signature: [u8; 64],
}

impl RowSignature {
    /// The signer's public key.
    pub fn key(&self) -> OwnerKey {
        self.key
    }

    /// The stored text form.
    pub fn to_text(&self) -> String {
        format!(
            "{ROW_SIGNATURE_SCHEME}:{}:{}",
            self.key.to_hex(),
            hex::encode(self.signature)
        )
    }

    /// Checks the signature: by its own key, over `writer` and `id`.
    pub fn verify(&self, writer: &str, id: &InteractionId) -> Result<(), SignatureError> {
        self.key
            .0
            .verify_strict(
                &row_signed_bytes(writer, id),
                &Signature::from_bytes(&self.signature),
            )
            .map_err(|_| SignatureError::Invalid)
    }
}

impl fmt::Debug for RowSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowSignature(by {})", self.key.short())
    }
}

impl FromStr for RowSignature {
    type Err = SignatureError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| SignatureError::Malformed(why.to_string());
        let mut parts = s.split(':');
        let (Some(scheme), Some(key), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected ed25519:<key>:<signature>"));
        };
        if scheme != ROW_SIGNATURE_SCHEME {
            return Err(bad("unknown signature scheme"));
        }
        let key: OwnerKey = key
            .parse()
            .map_err(|e: KeyError| SignatureError::Malformed(e.to_string()))?;
        let raw = hex::decode(sig).map_err(|e| SignatureError::Malformed(e.to_string()))?;
        let signature: [u8; 64] = raw
            .try_into()
            .map_err(|_| bad("the signature must be 64 bytes"))?;
        Ok(RowSignature { key, signature })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_signature_binds_writer_content_and_key() {
        let r0 = OwnerSecret::from_seed([1; 32]);
        let mallory = OwnerSecret::from_seed([2; 32]);
        let id = InteractionId([7; 32]);
        let sig = r0.sign_row("r0", &id);
        assert_eq!(sig.key(), r0.public());
        assert_eq!(sig.verify("r0", &id), Ok(()));
        let back: RowSignature = sig.to_text().parse().unwrap();
        assert_eq!(back, sig);
        // Another writer's name, other content, or another key's relabelled signature.
        assert_eq!(sig.verify("r1", &id), Err(SignatureError::Invalid));
        assert_eq!(sig.verify("r", &id), Err(SignatureError::Invalid));
        assert_eq!(
            sig.verify("r0", &InteractionId([8; 32])),
            Err(SignatureError::Invalid)
        );
        let forged = mallory
            .sign_row("r0", &id)
            .to_text()
            .replace(&mallory.public().to_hex(), &r0.public().to_hex());
        let forged: RowSignature = forged.parse().unwrap();
        assert_eq!(forged.verify("r0", &id), Err(SignatureError::Invalid));
        // Deterministic: the same writer signing the same row gives the same text.
        assert_eq!(r0.sign_row("r0", &id).to_text(), sig.to_text());
    }

    #[test]
    fn malformed_row_signatures_are_refused() {
        let key = OwnerSecret::from_seed([1; 32]).public().to_hex();
        for bad in [
            String::new(),
            "ed25519".into(),
            format!("ed25519:{key}"),
            format!("rsa:{key}:{}", "00".repeat(64)),
            format!("ed25519:{key}:{}", "00".repeat(63)),
            format!("ed25519:{key}:zz"),
            format!("ed25519:nokey:{}", "00".repeat(64)),
            format!("ed25519:{key}:{}:extra", "00".repeat(64)),
        ] {
            assert!(
                matches!(
                    bad.parse::<RowSignature>(),
                    Err(SignatureError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keys_serialize_as_hex_and_order_by_bytes() {
        let a = OwnerSecret::from_seed([1; 32]).public();
        let b = OwnerSecret::from_seed([2; 32]).public();
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text, format!("\"{}\"", a.to_hex()));
        assert_eq!(serde_json::from_str::<OwnerKey>(&text).unwrap(), a);
        assert!(serde_json::from_str::<OwnerKey>("\"abc\"").is_err());
        assert_eq!(a < b, a.to_hex() < b.to_hex());
    }
}
