//! Canonical encoding of an interaction's hashed fields.
//!
//! The id of an interaction is `blake3(encode_fields(..))`. The encoding is a domain
//! tag followed by each hashed field, length-prefixed, in a fixed order; optional
//! fields carry a presence byte. The body is encoded as canonical JSON: object keys
//! sorted by their UTF-8 bytes, no insignificant white space, numbers and strings as
//! `serde_json` prints them. JSON cannot hold NaN or infinities, so none can appear.
//!
//! Changing this encoding changes every id: it is versioned by the domain tag.

use serde_json::Value;

use crate::id::InteractionId;

/// Domain tag that starts every encoding; bump the version to change the format.
pub const DOMAIN_TAG: &[u8] = b"huddle.interaction.v1\0";

/// The hashed fields of an interaction, borrowed.
#[derive(Debug)]
pub struct HashedFields<'a> {
    /// Room.
    pub room: &'a str,
    /// Thread.
    pub thread: Option<&'a str>,
    /// Verb text.
    pub verb: &'a str,
    /// Actor.
    pub actor: &'a str,
    /// Role text.
    pub role: &'a str,
    /// Parent.
    pub parent: Option<&'a InteractionId>,
    /// Further causes.
    pub caused_by: &'a [InteractionId],
    /// Body.
    pub body: &'a Value,
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_opt(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

/// Encodes the hashed fields canonically.
pub fn encode_fields(f: &HashedFields<'_>) -> Vec<u8> {
    encode_fields_with_body(f, &canonical_json(f.body))
}

/// [`encode_fields`] with the body's canonical JSON already computed (it must be
/// `canonical_json(f.body)`), so a writer encodes each body once.
pub fn encode_fields_with_body(f: &HashedFields<'_>, body: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(DOMAIN_TAG.len() + body.len() + 128);
    out.extend_from_slice(DOMAIN_TAG);
    put_bytes(&mut out, f.room.as_bytes());
    put_opt(&mut out, f.thread.map(str::as_bytes));
    put_bytes(&mut out, f.verb.as_bytes());
    put_bytes(&mut out, f.actor.as_bytes());
    put_bytes(&mut out, f.role.as_bytes());
    put_opt(&mut out, f.parent.map(|p| &p.0[..]));
    out.extend_from_slice(&(f.caused_by.len() as u64).to_be_bytes());
    for c in f.caused_by {
        out.extend_from_slice(&c.0);
    }
    put_bytes(&mut out, body.as_bytes());
    out
}

/// The canonical JSON text of a value: keys sorted by UTF-8 bytes, no white space.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, v);
    out
}

fn write_json(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write_json(out, &map[k]);
            }
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str) {
    // serde_json's string escaping is already canonical (minimal escapes).
    out.push_str(&Value::String(s.to_string()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let v = json!({"b": [{"z": 1, "a": null}], "a": "x\"y", "é": true});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"x\"y","b":[{"a":null,"z":1}],"é":true}"#
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Parsing the canonical text and encoding again gives the same text, so a
        /// reader recomputes exactly the id the writer hashed.
        #[test]
        fn canonical_json_is_a_fixed_point(v in arb_json()) {
            let text = canonical_json(&v);
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(canonical_json(&back), text);
        }
    }
}
