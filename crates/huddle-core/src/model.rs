//! The interaction: huddle's one immutable record, and the values it is made of.
//!
//! An [`Interaction`] is what a relay reads back from the ledger; a
//! [`NewInteraction`] is what a writer hands to the store. The id of an interaction is
//! the blake3 hash of the canonical encoding of its hashed fields (see
//! [`crate::canonical`]), so identical content is the same interaction.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::canonical;
use crate::error::ModelError;
pub use crate::id::InteractionId;
use crate::keys::{OwnerKey, RowSignature};
use crate::limits::Limits;
use crate::verbs::Verb;

mod lot;
pub use lot::{LOT_ITEM_VERBS, MAX_LOT_ITEMS};

/// Microseconds since the Unix epoch, as read from the **database** clock.
///
/// The core never reads a clock; every `now` it sees is passed in. A distinct type so
/// a time cannot be passed where an epoch or a duration is meant: durations are plain
/// microseconds (`i64`) added with [`Timestamp::saturating_add`] and measured with
/// [`Timestamp::micros_since`]. Encoded as the bare number (serde-transparent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The earliest time there is.
    pub const MIN: Timestamp = Timestamp(i64::MIN);
    /// The latest time there is.
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> i64 {
        self.0
    }

    /// This time plus `us` microseconds (negative goes back), saturating.
    pub const fn saturating_add(self, us: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(us))
    }

    /// This time minus `us` microseconds, saturating.
    pub const fn saturating_sub(self, us: i64) -> Timestamp {
        Timestamp(self.0.saturating_sub(us))
    }

    /// Microseconds from `earlier` to this time (negative if `earlier` is later),
    /// saturating.
    pub const fn micros_since(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `t + us`: a time `us` microseconds later (panics on overflow like `i64`; code that
/// reads the outside world uses [`Timestamp::saturating_add`]).
impl std::ops::Add<i64> for Timestamp {
    type Output = Timestamp;
    fn add(self, us: i64) -> Timestamp {
        Timestamp(self.0 + us)
    }
}

/// `t += us`.
impl std::ops::AddAssign<i64> for Timestamp {
    fn add_assign(&mut self, us: i64) {
        self.0 += us;
    }
}

/// `t - us`: a time `us` microseconds earlier.
impl std::ops::Sub<i64> for Timestamp {
    type Output = Timestamp;
    fn sub(self, us: i64) -> Timestamp {
        Timestamp(self.0 - us)
    }
}

/// `a - b`: the microseconds from `b` to `a`.
impl std::ops::Sub for Timestamp {
    type Output = i64;
    fn sub(self, earlier: Timestamp) -> i64 {
        self.0 - earlier.0
    }
}

/// Who wrote an interaction, frozen at append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The room's owner: the only role whose `!delegate` / `!config` are executed.
    Owner,
    /// A person in the room who is not its owner.
    Human,
    /// An AI agent hosted by a relay.
    Agent,
    /// huddle itself (relays, schedulers).
    System,
}

impl Role {
    /// The lowercase name stored in the ledger.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Human => "human",
            Role::Agent => "agent",
            Role::System => "system",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "owner" => Ok(Role::Owner),
            "human" => Ok(Role::Human),
            "agent" => Ok(Role::Agent),
            "system" => Ok(Role::System),
            other => Err(ModelError::BadRole(other.to_string())),
        }
    }
}

/// A backend-assigned read-forward position in the ledger. Not hashed.
///
/// Ordered lexicographically `(major, minor)`. Postgres uses `(txid, seq)`;
/// SQLite uses `(0, rowid)`. Folds order interactions by this position, never by
/// wall-clock time.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    /// Postgres: the writing transaction's id; SQLite: always 0.
    pub major: u64,
    /// Postgres: the row's sequence number; SQLite: the rowid.
    pub minor: u64,
}

impl Position {
    /// The position before every interaction.
    pub const START: Position = Position { major: 0, minor: 0 };

    /// A position from its two parts.
    pub const fn new(major: u64, minor: u64) -> Self {
        Position { major, minor }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for Position {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ModelError::BadPosition(s.to_string());
        let (a, b) = s.split_once(':').ok_or_else(bad)?;
        Ok(Position {
            major: a.parse().map_err(|_| bad())?,
            minor: b.parse().map_err(|_| bad())?,
        })
    }
}

/// An interaction as a writer hands it to the store: everything but what the
/// database assigns (position, time, writing relay).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewInteraction {
    /// The room this happens in.
    pub room: String,
    /// Optional thread inside the room.
    pub thread: Option<String>,
    /// `namespace.action`; one of [`Verb`].
    pub verb: Verb,
    /// Who did it (agent key, person id, relay id for system rows).
    pub actor: String,
    /// The actor's role, frozen at append.
    pub role: Role,
    /// The primary cause.
    pub parent: Option<InteractionId>,
    /// Further causes, order kept.
    pub caused_by: Vec<InteractionId>,
    /// The payload. Canonicalised for hashing.
    pub body: serde_json::Value,
    /// Optional writer-chosen key: a second append with the same key is a no-op that
    /// returns the first row's id, whatever its content.
    pub idempotency_key: Option<String>,
}

impl NewInteraction {
    /// A new interaction with no thread, causes or idempotency key.
    pub fn new(
        room: impl Into<String>,
        verb: Verb,
        actor: impl Into<String>,
        role: Role,
        body: serde_json::Value,
    ) -> Self {
        NewInteraction {
            room: room.into(),
            thread: None,
            verb,
            actor: actor.into(),
            role,
            parent: None,
            caused_by: Vec::new(),
            body,
            idempotency_key: None,
        }
    }

    /// Sets the thread.
    pub fn in_thread(mut self, thread: impl Into<String>) -> Self {
        self.thread = Some(thread.into());
        self
    }

    /// Sets the primary cause.
    pub fn with_parent(mut self, parent: InteractionId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Sets further causes.
    pub fn with_caused_by(mut self, causes: Vec<InteractionId>) -> Self {
        self.caused_by = causes;
        self
    }

    /// Sets the idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The canonical encoding of the hashed fields.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        canonical::encode_fields(&self.hashed())
    }

    /// The content id: blake3 of [`Self::canonical_bytes`].
    pub fn id(&self) -> InteractionId {
        self.hashed().id()
    }

    /// The canonical JSON text of the body, exactly as stored and hashed.
    pub fn body_text(&self) -> String {
        canonical::canonical_json(&self.body)
    }

    /// Validates against `limits` and returns the id and the canonical body text,
    /// encoding the body once: what a store needs to write the row.
    pub fn checked(&self, limits: &Limits) -> Result<(InteractionId, String), ModelError> {
        let (id, body) = self.id_and_body();
        self.validate_fields(limits, body.len())?;
        Ok((id, body))
    }

    /// The content id and the canonical body text, encoding the body once.
    pub fn id_and_body(&self) -> (InteractionId, String) {
        let body = self.body_text();
        (self.hashed().id_with_body(&body), body)
    }

    /// Checks every field against `limits`: names, body size, key length. Called by
    /// every store before any write, so nothing oversized or hostile reaches the
    /// ledger half-written.
    pub fn validate(&self, limits: &Limits) -> Result<(), ModelError> {
        self.validate_fields(limits, self.body_text().len())
    }

    fn validate_fields(&self, limits: &Limits, size: usize) -> Result<(), ModelError> {
        self.validate_own_fields(limits, size)?;
        if self.verb == Verb::TaskLot {
            self.check_lot(limits, size)?;
        }
        Ok(())
    }

    /// [`Self::validate_fields`] but a lot's items: the row's own names, body size
    /// and key.
    fn validate_own_fields(&self, limits: &Limits, size: usize) -> Result<(), ModelError> {
        if let Some(k) = &self.idempotency_key {
            if k.is_empty() || k.len() > limits.max_name_bytes {
                return Err(ModelError::BadName {
                    what: "idempotency key",
                    reason: format!("must be 1..={} bytes", limits.max_name_bytes),
                });
            }
        }
        check_hashed(&self.hashed(), limits, size)
    }

    fn hashed(&self) -> canonical::HashedFields<'_> {
        canonical::HashedFields {
            room: &self.room,
            thread: self.thread.as_deref(),
            verb: self.verb.as_str(),
            actor: &self.actor,
            role: self.role.as_str(),
            parent: self.parent.as_ref(),
            caused_by: &self.caused_by,
            body: &self.body,
        }
    }
}

/// Checks a room, thread or actor name: non-empty, at most `max_name_bytes`, no
/// control characters and no `/` (claim keys are `/`-separated paths).
pub fn validate_name(what: &'static str, value: &str, limits: &Limits) -> Result<(), ModelError> {
    let reason = if value.is_empty() {
        Some("must not be empty".to_string())
    } else if value.len() > limits.max_name_bytes {
        Some(format!(
            "is {} bytes; the limit is {}",
            value.len(),
            limits.max_name_bytes
        ))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".to_string())
    } else if value.contains('/') {
        Some("must not contain '/'".to_string())
    } else if value.trim() != value {
        Some("must not start or end with white space".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(ModelError::BadName { what, reason }),
        None => Ok(()),
    }
}

/// One interaction as read back from the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    /// The content id.
    pub id: InteractionId,
    /// Read-forward position, assigned by the backend.
    pub position: Position,
    /// Database clock at append, microseconds since the Unix epoch.
    pub at: Timestamp,
    /// The writing relay's identity (on Postgres the database role).
    pub relay: String,
    /// The room.
    pub room: String,
    /// The thread, if any.
    pub thread: Option<String>,
    /// The verb.
    pub verb: Verb,
    /// The actor.
    pub actor: String,
    /// The actor's role.
    pub role: Role,
    /// Primary cause.
    pub parent: Option<InteractionId>,
    /// Further causes.
    pub caused_by: Vec<InteractionId>,
    /// The payload.
    pub body: serde_json::Value,
    /// The key of the writer that signed the row (its `sig` column, checked on read
    /// against `relay` and `id`), if it was signed. Not content: identical content is
    /// one row whoever stored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<OwnerKey>,
}

impl Interaction {
    /// The hashed fields, borrowed: what [`Self::content`] would hash, without a copy.
    fn hashed(&self) -> canonical::HashedFields<'_> {
        canonical::HashedFields {
            room: &self.room,
            thread: self.thread.as_deref(),
            verb: self.verb.as_str(),
            actor: &self.actor,
            role: self.role.as_str(),
            parent: self.parent.as_ref(),
            caused_by: &self.caused_by,
            body: &self.body,
        }
    }

    /// The hashed part of this interaction, as a writer would have given it.
    pub fn content(&self) -> NewInteraction {
        NewInteraction {
            room: self.room.clone(),
            thread: self.thread.clone(),
            verb: self.verb,
            actor: self.actor.clone(),
            role: self.role,
            parent: self.parent,
            caused_by: self.caused_by.clone(),
            body: self.body.clone(),
            idempotency_key: None,
        }
    }
}

/// Checks the hashed fields of a row against `limits`: names, number of causes, body
/// size (`size`, the canonical text's length) and no NUL in the body. Writers check
/// before writing, readers on every row read.
fn check_hashed(
    f: &canonical::HashedFields<'_>,
    limits: &Limits,
    size: usize,
) -> Result<(), ModelError> {
    validate_name("room", f.room, limits)?;
    if let Some(t) = f.thread {
        validate_name("thread", t, limits)?;
    }
    validate_name("actor", f.actor, limits)?;
    if f.caused_by.len() > limits.max_causes {
        return Err(ModelError::TooManyCauses {
            got: f.caused_by.len(),
            max: limits.max_causes,
        });
    }
    if size > limits.max_body_bytes {
        return Err(ModelError::BodyTooLarge {
            size,
            max: limits.max_body_bytes,
        });
    }
    if contains_nul(f.body) {
        return Err(ModelError::BadBody(
            "text must not contain NUL (U+0000) characters".into(),
        ));
    }
    Ok(())
}

/// Whether any string or key in `v` holds a NUL character: such text cannot be stored
/// so that every row's body casts to `jsonb`, so writers refuse it and readers skip it.
fn contains_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(contains_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// A ledger row exactly as a backend stored it, before it is checked.
///
/// Backends decode their columns into this, then call [`RawRow::verify`]: readers
/// must never trust a row (another program, an older version or a hand-written
/// `INSERT` may have put it there).
#[derive(Clone, Debug, PartialEq)]
pub struct RawRow {
    /// The stored id bytes.
    pub id: Vec<u8>,
    /// Position.
    pub position: Position,
    /// Database time.
    pub at: Timestamp,
    /// Writing relay.
    pub relay: String,
    /// Room.
    pub room: String,
    /// Thread.
    pub thread: Option<String>,
    /// Verb text.
    pub verb: String,
    /// Actor.
    pub actor: String,
    /// Role text.
    pub role: String,
    /// Parent id bytes.
    pub parent: Option<Vec<u8>>,
    /// Further causes, each 32 bytes.
    pub caused_by: Vec<Vec<u8>>,
    /// Body text (canonical JSON).
    pub body: String,
    /// The writer's row signature as stored (`ed25519:<key>:<signature>`), if any.
    pub sig: Option<String>,
}

impl Interaction {
    /// `content` as read back: under `id` (its own, or an item's), at `position` and
    /// `at`, written by `relay` and signed by `signer`. How the stores build what
    /// they read, and how tests build rows as a store would return them.
    pub fn as_read(
        content: NewInteraction,
        id: InteractionId,
        position: Position,
        at: Timestamp,
        relay: &str,
        signer: Option<OwnerKey>,
    ) -> Interaction {
        Interaction {
            id,
            position,
            at,
            relay: relay.to_string(),
            room: content.room,
            thread: content.thread,
            verb: content.verb,
            actor: content.actor,
            role: content.role,
            parent: content.parent,
            caused_by: content.caused_by,
            body: content.body,
            signer,
        }
    }
}

impl RawRow {
    /// Decodes and checks the row against the default [`Limits`]; see
    /// [`RawRow::verify_within`].
    pub fn verify(self) -> Result<Interaction, ModelError> {
        self.verify_within(&Limits::default())
    }

    /// Decodes and checks the row: known verb and role, valid JSON body, well-formed
    /// ids, an id equal to the hash of the content, the same limits writers obey
    /// (names, body size, causes, no NUL), and a row signature, when there is one,
    /// that verifies for the row's writer (`relay`) and id. Anything else is corrupt,
    /// foreign, oversized or forged and is reported, never panicked on.
    pub fn verify_within(self, limits: &Limits) -> Result<Interaction, ModelError> {
        let size = self.body.len();
        let signature = self
            .sig
            .as_deref()
            .map(|s| s.parse::<RowSignature>())
            .transpose()
            .map_err(|e| ModelError::BadSignature(e.to_string()))?;
        let id = InteractionId::from_slice(&self.id)?;
        let verb: Verb = self.verb.parse()?;
        let role: Role = self.role.parse()?;
        let body: serde_json::Value =
            serde_json::from_str(&self.body).map_err(|e| ModelError::BadBody(e.to_string()))?;
        let parent = self
            .parent
            .as_deref()
            .map(InteractionId::from_slice)
            .transpose()?;
        let caused_by = self
            .caused_by
            .iter()
            .map(|c| InteractionId::from_slice(c))
            .collect::<Result<Vec<_>, _>>()?;
        let mut row = Interaction {
            id,
            position: self.position,
            at: self.at,
            relay: self.relay,
            room: self.room,
            thread: self.thread,
            verb,
            actor: self.actor,
            role,
            parent,
            caused_by,
            body,
            signer: None,
        };
        // Checked and hashed in place: the row is not copied to be verified.
        let hashed = row.hashed();
        check_hashed(&hashed, limits, size)?;
        let expected = hashed.id();
        if expected != row.id {
            return Err(ModelError::IdMismatch {
                stored: row.id.to_hex(),
                computed: expected.to_hex(),
            });
        }
        if let Some(signature) = signature {
            signature.verify(&row.relay, &row.id).map_err(|_| {
                ModelError::BadSignature(format!(
                    "the signature by key {} does not verify for writer {:?} and this row",
                    signature.key().short(),
                    row.relay
                ))
            })?;
            row.signer = Some(signature.key());
        }
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(text: &str) -> NewInteraction {
        NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "ana",
            Role::Human,
            json!({"text": text}),
        )
    }

    #[test]
    fn same_content_same_id_and_key_order_does_not_matter() {
        let a = msg("hi");
        let mut b = msg("hi");
        b.body = serde_json::from_str(r#"{"text":"hi"}"#).unwrap();
        assert_eq!(a.id(), b.id());
        let c = NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "ana",
            Role::Human,
            serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap(),
        );
        let d = NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "ana",
            Role::Human,
            serde_json::from_str(r#"{"a":2,"b":1}"#).unwrap(),
        );
        assert_eq!(c.id(), d.id());
    }

    #[test]
    fn every_hashed_field_changes_the_id() {
        let base = msg("hi");
        let id = base.id();
        let variants = vec![
            NewInteraction {
                room: "other".into(),
                ..base.clone()
            },
            base.clone().in_thread("t"),
            NewInteraction {
                verb: Verb::CoordNote,
                ..base.clone()
            },
            NewInteraction {
                actor: "bo".into(),
                ..base.clone()
            },
            NewInteraction {
                role: Role::Owner,
                ..base.clone()
            },
            base.clone().with_parent(id),
            base.clone().with_caused_by(vec![id]),
            msg("ho"),
        ];
        for v in variants {
            assert_ne!(v.id(), id, "{v:?}");
        }
        // The idempotency key is not content.
        assert_eq!(base.clone().with_idempotency_key("k").id(), id);
    }

    #[test]
    fn names_are_checked() {
        let limits = Limits::default();
        assert!(validate_name("room", "a\"; DROP TABLE x; --ü", &limits).is_ok());
        assert!(validate_name("room", "", &limits).is_err());
        assert!(validate_name("room", "a/b", &limits).is_err());
        assert!(validate_name("room", "a\nb", &limits).is_err());
        assert!(validate_name("room", &"x".repeat(10_000), &limits).is_err());
    }

    #[test]
    fn checked_gives_the_id_and_the_stored_body_text() {
        let m = msg("hi");
        let (id, body) = m.checked(&Limits::default()).unwrap();
        assert_eq!(id, m.id());
        assert_eq!(body, m.body_text());
        let limits = Limits {
            max_body_bytes: 5,
            ..Limits::default()
        };
        assert!(m.checked(&limits).is_err());
    }

    #[test]
    fn oversized_body_is_refused() {
        let limits = Limits {
            max_body_bytes: 100,
            ..Limits::default()
        };
        let err = msg(&"x".repeat(200)).validate(&limits).unwrap_err();
        assert!(matches!(err, ModelError::BodyTooLarge { .. }), "{err}");
        assert!(msg("small").validate(&limits).is_ok());
    }

    /// `n` as a backend stores it (a `message.posted` by a human).
    fn raw(n: &NewInteraction) -> RawRow {
        RawRow {
            id: n.id().0.to_vec(),
            position: Position::new(0, 1),
            at: Timestamp(0),
            relay: "r".into(),
            room: n.room.clone(),
            thread: None,
            verb: "message.posted".into(),
            actor: n.actor.clone(),
            role: "human".into(),
            parent: None,
            caused_by: vec![],
            body: n.body_text(),
            sig: None,
        }
    }

    #[test]
    fn raw_rows_are_verified() {
        let n = msg("hi");
        let good = raw(&n);
        assert_eq!(good.clone().verify().unwrap().id, n.id());
        let bad_json = RawRow {
            body: "{not json".into(),
            ..good.clone()
        };
        assert!(matches!(bad_json.verify(), Err(ModelError::BadBody(_))));
        let bad_verb = RawRow {
            verb: "evil.verb".into(),
            ..good.clone()
        };
        assert!(matches!(bad_verb.verify(), Err(ModelError::UnknownVerb(_))));
        let bad_id = RawRow {
            id: vec![0; 32],
            ..good.clone()
        };
        assert!(matches!(
            bad_id.verify(),
            Err(ModelError::IdMismatch { .. })
        ));
        let short_id = RawRow {
            id: vec![0; 3],
            ..good
        };
        assert!(matches!(short_id.verify(), Err(ModelError::BadId(_))));
    }

    /// A row written past the writers' checks (a direct INSERT) is held to the same
    /// limits on read: too large, NUL in text, or a bad name is refused, even when its
    /// id matches its content.
    #[test]
    fn readers_enforce_the_writers_limits() {
        let big = msg(&"x".repeat(300 * 1024));
        assert!(matches!(
            raw(&big).verify(),
            Err(ModelError::BodyTooLarge { .. })
        ));
        let nul = msg("a\0b");
        assert!(matches!(
            nul.validate(&Limits::default()),
            Err(ModelError::BadBody(_))
        ));
        assert!(matches!(raw(&nul).verify(), Err(ModelError::BadBody(_))));
        let mut hostile = msg("hi");
        hostile.room = "a/b".into();
        assert!(matches!(
            raw(&hostile).verify(),
            Err(ModelError::BadName { .. })
        ));
        // A body within the limits, and a literal backslash-u text, are fine.
        assert!(raw(&msg("a\\u0000 is six characters")).verify().is_ok());
    }

    /// A stored row signature is checked against the row's writer and id: a valid
    /// one is read back as the signer; a malformed one, one by another writer's name,
    /// or one copied from other content makes the row refused.
    #[test]
    fn row_signatures_are_verified_on_read() {
        let secret = crate::keys::OwnerSecret::from_seed([4; 32]);
        let n = msg("signed");
        let signed = RawRow {
            sig: Some(secret.sign_row("r", &n.id()).to_text()),
            ..raw(&n)
        };
        assert_eq!(
            signed.clone().verify().unwrap().signer,
            Some(secret.public())
        );
        assert_eq!(raw(&n).verify().unwrap().signer, None);
        let other_writer = RawRow {
            relay: "r2".into(),
            ..signed.clone()
        };
        let other_content = RawRow {
            sig: signed.sig.clone(),
            ..raw(&msg("other"))
        };
        let malformed = RawRow {
            sig: Some("ed25519:zz".into()),
            ..signed
        };
        for bad in [other_writer, other_content, malformed] {
            assert!(
                matches!(bad.clone().verify(), Err(ModelError::BadSignature(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ids_and_positions_round_trip_as_text() {
        let id = msg("x").id();
        assert_eq!(id.to_hex().parse::<InteractionId>().unwrap(), id);
        let p = Position::new(7, 9);
        assert_eq!(p.to_string().parse::<Position>().unwrap(), p);
        assert!(Position::new(1, 0) > Position::new(0, 99));
    }
}
