//! Canonical encoding of an interaction's hashed fields.
//!
//! The id of an interaction is `blake3(encode_fields(..))`. The encoding is a domain
//! tag followed by each hashed field, length-prefixed, in a fixed order; optional
//! fields carry a presence byte. The body is encoded as canonical JSON: object keys
//! sorted by their UTF-8 bytes, no insignificant white space, numbers and strings as
//! `serde_json` prints them. JSON cannot hold NaN or infinities, so none can appear.
//!
//! Changing this encoding changes every id: it is versioned by the domain tag.

use std::fmt::Write as _;

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

impl HashedFields<'_> {
    /// The content id: blake3 of [`encode_fields`].
    pub fn id(&self) -> InteractionId {
        self.id_with_body(&canonical_json(self.body))
    }

    /// [`Self::id`] with the body's canonical JSON already at hand (it must be
    /// `canonical_json(self.body)`; `self.body` itself is not read).
    pub fn id_with_body(&self, body: &str) -> InteractionId {
        InteractionId(*blake3::hash(&encode_fields_with_body(self, body)).as_bytes())
    }
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

pub(crate) fn write_json(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            // Writing into a `String` cannot fail.
            let _ = write!(out, "{n}");
        }
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
            // Sorted with their values: no lookup of each key again.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write_json(out, v);
            }
            out.push('}');
        }
    }
}

/// Writes `s` as a JSON string with minimal escapes, exactly as serde_json writes one
/// (`"` and `\` escaped, the short forms `\b \f \n \r \t`, other control
/// characters as `\u00xx` in lower-case hex, everything else as is), without
/// copying it first. `writes_strings_as_serde_json_does` holds the two together.
pub(crate) fn write_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, &b) in s.as_bytes().iter().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        // Every escaped byte is ASCII, so `i` is a character boundary.
        out.push_str(&s[start..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(short);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
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
        /// Strings are escaped byte for byte as serde_json escapes them (what every
        /// id already in a ledger was computed with), for any text and for every
        /// ASCII control character, quote and backslash in particular.
        #[test]
        fn writes_strings_as_serde_json_does(
            s in ".*",
            specials in prop::collection::vec(prop_oneof![0u8..0x20, Just(b'"'), Just(b'\\'), Just(0x7f)], 0..8),
        ) {
            let mut text = s;
            for b in specials {
                text.push(char::from(b));
            }
            let mut ours = String::new();
            write_str(&mut ours, &text);
            prop_assert_eq!(ours, serde_json::to_string(&text).unwrap());
        }

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
