//! Owner signatures: Ed25519 over an interaction's canonical encoding.
//!
//! A room's `room.created` records its owner's public key; from then on an owner
//! command (a `message.posted` that starts with `!delegate` / `!config`) and a key
//! rotation (`room.key_rotated`) count only when they carry a signature by the room's
//! current key. The signature lives in the body, under [`SIGNATURE_FIELD`]:
//!
//! ```json
//! {"text": "!config rate 5", "sig": {"key": "<64 hex>", "ed25519": "<128 hex>"}}
//! ```
//!
//! It covers [`SIGNATURE_TAG`] followed by the canonical encoding
//! ([`crate::canonical`]) of every hashed field — room, thread, verb, actor, role,
//! parent, causes and the body **without** its `sig` member. So a signature copied
//! onto other content (another text, room, thread, parent or actor) does not verify,
//! and copying a signed row verbatim gives the same content, hence the same id: the
//! ledger keeps one copy.
//!
//! Key generation needs randomness, which this crate does not have: callers pass 32
//! random bytes to [`OwnerSecret::from_seed`]. Signing and verifying are pure.
//!
//! ```
//! use huddle_core::signing::{verify, OwnerSecret};
//! use huddle_core::{NewInteraction, Role, Verb};
//!
//! let secret = OwnerSecret::from_seed([7; 32]);
//! let command = NewInteraction::new("lobby", Verb::MessagePosted, "olga", Role::Owner,
//!     serde_json::json!({"text": "!config rate 5"}));
//! let signed = secret.sign(command);
//! assert!(verify(&signed, &secret.public()).is_ok());
//! ```

use ed25519_dalek::{Signature, Signer};
use serde_json::{json, Value};

use crate::canonical;
pub use crate::keys::{KeyError, OwnerKey, OwnerSecret, SignatureError};
use crate::model::NewInteraction;

/// The body member that holds a signature.
pub const SIGNATURE_FIELD: &str = "sig";

/// Domain tag in front of the signed bytes, so a signature over an interaction can
/// never be mistaken for one over anything else.
pub const SIGNATURE_TAG: &[u8] = b"huddle.signature.v1\0";

impl OwnerSecret {
    /// `content` with its signature: the body (which must be a JSON object; anything
    /// else is replaced by an empty object) gets a fresh `sig` member, replacing any.
    pub fn sign(&self, mut content: NewInteraction) -> NewInteraction {
        if !content.body.is_object() {
            content.body = json!({});
        }
        let bytes = signed_bytes(&content);
        let signature = self.0.sign(&bytes);
        content.body[SIGNATURE_FIELD] = json!({
            "key": self.public().to_hex(),
            "ed25519": hex::encode(signature.to_bytes()),
        });
        content
    }
}

/// The bytes a signature covers: [`SIGNATURE_TAG`], then the canonical encoding of
/// `content` with the body's `sig` member left out.
pub fn signed_bytes(content: &NewInteraction) -> Vec<u8> {
    let mut body = content.body.clone();
    if let Value::Object(map) = &mut body {
        map.remove(SIGNATURE_FIELD);
    }
    let fields = canonical::HashedFields {
        room: &content.room,
        thread: content.thread.as_deref(),
        verb: content.verb.as_str(),
        actor: &content.actor,
        role: content.role.as_str(),
        parent: content.parent.as_ref(),
        caused_by: &content.caused_by,
        body: &body,
    };
    let mut out = SIGNATURE_TAG.to_vec();
    out.extend_from_slice(&canonical::encode_fields(&fields));
    out
}

/// Checks that `content` carries a valid signature by `key`.
pub fn verify(content: &NewInteraction, key: &OwnerKey) -> Result<(), SignatureError> {
    let sig = content
        .body
        .get(SIGNATURE_FIELD)
        .ok_or(SignatureError::Missing)?;
    let field = |name: &str| {
        sig.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| SignatureError::Malformed(format!("no {name:?} text")))
    };
    let signed_by: OwnerKey = field("key")?
        .parse()
        .map_err(|e: KeyError| SignatureError::Malformed(e.to_string()))?;
    if signed_by != *key {
        return Err(SignatureError::OtherKey {
            signed_by: signed_by.to_hex(),
            expected: key.to_hex(),
        });
    }
    let raw = hex::decode(field("ed25519")?)
        .map_err(|e| SignatureError::Malformed(format!("ed25519: {e}")))?;
    let raw: [u8; 64] = raw
        .try_into()
        .map_err(|_| SignatureError::Malformed("ed25519 must be 64 bytes".into()))?;
    key.0
        .verify_strict(&signed_bytes(content), &Signature::from_bytes(&raw))
        .map_err(|_| SignatureError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;
    use crate::verbs::Verb;

    fn command(text: &str) -> NewInteraction {
        NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "olga",
            Role::Owner,
            json!({ "text": text }),
        )
    }

    #[test]
    fn keys_round_trip_as_hex_and_bad_keys_are_refused() {
        let secret = OwnerSecret::from_seed([3; 32]);
        let back: OwnerSecret = secret.to_hex().parse().unwrap();
        assert_eq!(back.public(), secret.public());
        let key: OwnerKey = secret.public().to_hex().parse().unwrap();
        assert_eq!(key, secret.public());
        assert!("abc".parse::<OwnerKey>().is_err());
        assert!("zz".repeat(32).parse::<OwnerKey>().is_err());
        assert!(!format!("{secret:?}").contains(&secret.to_hex()));
    }

    #[test]
    fn a_signature_covers_every_hashed_field_but_itself() {
        let secret = OwnerSecret::from_seed([1; 32]);
        let key = secret.public();
        let signed = secret.sign(command("!config rate 5"));
        assert_eq!(verify(&signed, &key), Ok(()));

        let other_parent = crate::id::InteractionId([9; 32]);
        let tampered = [
            NewInteraction {
                room: "den".into(),
                ..signed.clone()
            },
            signed.clone().in_thread("t1"),
            NewInteraction {
                actor: "mallory".into(),
                ..signed.clone()
            },
            NewInteraction {
                role: Role::Human,
                ..signed.clone()
            },
            NewInteraction {
                verb: Verb::CoordNote,
                ..signed.clone()
            },
            signed.clone().with_parent(other_parent),
            signed.clone().with_caused_by(vec![other_parent]),
            {
                let mut t = signed.clone();
                t.body["text"] = json!("!config rate 1");
                t
            },
            {
                let mut t = signed.clone();
                t.body["extra"] = json!(true);
                t
            },
        ];
        for t in tampered {
            assert_eq!(verify(&t, &key), Err(SignatureError::Invalid), "{t:?}");
        }
    }

    #[test]
    fn missing_malformed_and_foreign_signatures_are_refused() {
        let secret = OwnerSecret::from_seed([1; 32]);
        let mallory = OwnerSecret::from_seed([2; 32]);
        let key = secret.public();
        assert_eq!(
            verify(&command("!config rate 5"), &key),
            Err(SignatureError::Missing)
        );
        let by_mallory = mallory.sign(command("!config rate 5"));
        assert!(matches!(
            verify(&by_mallory, &key),
            Err(SignatureError::OtherKey { .. })
        ));
        // Mallory's signature relabelled with the owner's key id does not verify.
        let mut relabelled = by_mallory.clone();
        relabelled.body[SIGNATURE_FIELD]["key"] = json!(key.to_hex());
        assert_eq!(verify(&relabelled, &key), Err(SignatureError::Invalid));
        // A signature replayed onto other content does not verify.
        let genuine = secret.sign(command("!config rate 5"));
        let mut replayed = command("!config rate 1");
        replayed.body[SIGNATURE_FIELD] = genuine.body[SIGNATURE_FIELD].clone();
        assert_eq!(verify(&replayed, &key), Err(SignatureError::Invalid));
        for bad in [
            json!("x"),
            json!({"key": key.to_hex()}),
            json!({"key": key.to_hex(), "ed25519": "00"}),
            json!({"key": "nope", "ed25519": "00"}),
        ] {
            let mut row = command("!config rate 5");
            row.body[SIGNATURE_FIELD] = bad;
            assert!(
                matches!(verify(&row, &key), Err(SignatureError::Malformed(_))),
                "{row:?}"
            );
        }
    }

    #[test]
    fn signing_is_deterministic_so_a_resent_command_is_the_same_row() {
        let secret = OwnerSecret::from_seed([5; 32]);
        let a = secret.sign(command("!delegate\na: x"));
        let b = secret.sign(command("!delegate\na: x"));
        assert_eq!(a.id(), b.id());
        // Re-signing replaces the old signature rather than nesting it.
        assert_eq!(secret.sign(a.clone()).id(), a.id());
    }
}
