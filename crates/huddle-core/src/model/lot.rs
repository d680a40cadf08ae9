//! Task lots (plan 0080): several task turns' rows of one room and one writer in one
//! ledger row, `task.lot`.
//!
//! A lot's body is `{"items": [...]}`, each item an interaction of the room without
//! the room (`verb`, `actor`, `role`, optional `thread`, `parent`, `caused_by`, and
//! `body`). Items may only be the rows of a task turn written by an agent's relay:
//! [`LOT_ITEM_VERBS`], role `agent`. Readers never see a lot: the stores unpack it
//! ([`RawRow::read_into`]) into its items, each with the id it would have as a row of
//! its own and the lot's position, time, writer and signer, in item order. A lot that
//! is not exactly that is corrupt as a whole: no item of it is read.

use serde::{Deserialize, Serialize};

use super::{Interaction, NewInteraction, RawRow, Role};
use crate::error::ModelError;
use crate::id::InteractionId;
use crate::limits::Limits;
use crate::verbs::Verb;

/// The most items one lot carries.
pub const MAX_LOT_ITEMS: usize = 64;

/// The verbs an item of a lot may have: a task turn's rows, as its relay writes them.
pub const LOT_ITEM_VERBS: &[Verb] = &[
    Verb::TaskClaimed,
    Verb::TurnPrompted,
    Verb::TaskCompleted,
    Verb::TurnReplied,
    Verb::TaskFailed,
    Verb::TurnFailed,
];

/// One item as encoded in a lot's body.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Item {
    verb: Verb,
    actor: String,
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thread: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<InteractionId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    caused_by: Vec<InteractionId>,
    body: serde_json::Value,
}

/// One item of a lot body as [`NewInteraction::check_lot`] reads it: the fields
/// [`Item`] reads, by the same rules, borrowed where they lie (the body is looked at
/// in place, not copied).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemRef<'a> {
    verb: Verb,
    #[serde(borrow)]
    actor: &'a str,
    role: Role,
    #[serde(default, borrow)]
    thread: Option<&'a str>,
    #[serde(default)]
    parent: Option<InteractionId>,
    #[serde(default)]
    caused_by: Vec<InteractionId>,
    #[allow(dead_code)]
    body: serde::de::IgnoredAny,
}

/// `item` as encoded in a lot's body: the value serializing an [`Item`] gives, built
/// directly (the body copied once, not through a serializer;
/// `item_value_is_what_serializing_an_item_gives` holds the two together).
fn item_value(item: &NewInteraction) -> serde_json::Value {
    use serde_json::Value;
    let mut m = serde_json::Map::with_capacity(7);
    m.insert("verb".into(), Value::String(item.verb.as_str().into()));
    m.insert("actor".into(), Value::String(item.actor.clone()));
    m.insert("role".into(), Value::String(item.role.as_str().into()));
    if let Some(thread) = &item.thread {
        m.insert("thread".into(), Value::String(thread.clone()));
    }
    if let Some(parent) = &item.parent {
        m.insert("parent".into(), Value::String(parent.to_hex()));
    }
    if !item.caused_by.is_empty() {
        let causes = item.caused_by.iter().map(|c| Value::String(c.to_hex()));
        m.insert("caused_by".into(), Value::Array(causes.collect()));
    }
    m.insert("body".into(), item.body.clone());
    Value::Object(m)
}

/// What only a lot's items must be: a task turn's row ([`LOT_ITEM_VERBS`]) by an
/// agent, with an object body.
fn check_item_kind(verb: Verb, role: Role, body: &serde_json::Value) -> Result<(), ModelError> {
    if !LOT_ITEM_VERBS.contains(&verb) {
        return Err(ModelError::BadLot(format!(
            "an item's verb {verb} is not a task turn's row"
        )));
    }
    if role != Role::Agent {
        return Err(ModelError::BadLot(format!(
            "an item's role is {role}, not agent"
        )));
    }
    if !body.is_object() {
        return Err(ModelError::BadLot("an item's body is not an object".into()));
    }
    Ok(())
}

/// An item's error, naming the item.
fn at_item(index: usize, e: ModelError) -> ModelError {
    ModelError::BadLot(match e {
        ModelError::BadLot(reason) => format!("item {index}: {reason}"),
        other => format!("item {index}: {other}"),
    })
}

impl Item {
    /// The item as the interaction of `room` it stands for, checked.
    fn into_content(self, room: &str) -> Result<NewInteraction, ModelError> {
        check_item_kind(self.verb, self.role, &self.body)?;
        Ok(NewInteraction {
            room: room.to_string(),
            thread: self.thread,
            verb: self.verb,
            actor: self.actor,
            role: self.role,
            parent: self.parent,
            caused_by: self.caused_by,
            body: self.body,
            idempotency_key: None,
        })
    }
}

/// Checks the fields of a lot row other than its items: role `system`, no thread,
/// causes or idempotency key (a lot is known by its content and fenced by its items'
/// claims).
fn check_envelope(
    role: Role,
    thread: Option<&str>,
    parent: Option<&InteractionId>,
    causes: usize,
) -> Result<(), ModelError> {
    if role != Role::System {
        return Err(ModelError::BadLot(format!(
            "its role is {role}, not system"
        )));
    }
    if thread.is_some() || parent.is_some() || causes > 0 {
        return Err(ModelError::BadLot(
            "it has a thread or causes; its items carry their own".into(),
        ));
    }
    Ok(())
}

fn not_a_list() -> ModelError {
    ModelError::BadLot("its body is not exactly {\"items\": [...]}".into())
}

/// A lot has 1 to [`MAX_LOT_ITEMS`] items.
fn check_count(n: usize) -> Result<(), ModelError> {
    if n == 0 || n > MAX_LOT_ITEMS {
        return Err(ModelError::BadLot(format!(
            "it has {n} items; a lot has 1 to {MAX_LOT_ITEMS}"
        )));
    }
    Ok(())
}

/// The item values of a lot body: exactly `{"items": [1..=MAX_LOT_ITEMS values]}`.
fn item_values(body: &serde_json::Value) -> Result<&Vec<serde_json::Value>, ModelError> {
    let items = body
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("items"))
        .and_then(|i| i.as_array())
        .ok_or_else(not_a_list)?;
    check_count(items.len())?;
    Ok(items)
}

/// Checks one item of a lot of `room` in place, as [`decode_item`] would: its fields,
/// its kind, and its names, causes and body within `limits`, `size` bounding its
/// body's canonical text.
fn check_item(
    room: &str,
    value: &serde_json::Value,
    limits: &Limits,
    size: usize,
) -> Result<(), ModelError> {
    let item = ItemRef::deserialize(value).map_err(|e| ModelError::BadBody(e.to_string()))?;
    let body = value.get("body").unwrap_or(&serde_json::Value::Null);
    check_item_kind(item.verb, item.role, body)?;
    let fields = crate::canonical::HashedFields {
        room,
        thread: item.thread,
        verb: item.verb.as_str(),
        actor: item.actor,
        role: item.role.as_str(),
        parent: item.parent.as_ref(),
        caused_by: &item.caused_by,
        body,
    };
    super::check_hashed(&fields, limits, size)
}

/// Decodes and checks one item, returning its content and its id.
fn decode_item(
    room: &str,
    index: usize,
    value: serde_json::Value,
    limits: &Limits,
) -> Result<(NewInteraction, InteractionId), ModelError> {
    let at = |e: ModelError| at_item(index, e);
    let item: Item =
        serde_json::from_value(value).map_err(|e| at(ModelError::BadBody(e.to_string())))?;
    let content = item.into_content(room).map_err(at)?;
    let (id, _) = content.checked(limits).map_err(at)?;
    Ok((content, id))
}

impl NewInteraction {
    /// The lot of `items` (plan 0080): one `task.lot` row of `room`, written by the
    /// relay `writer`, standing for every item in order. Every item must be of `room`,
    /// a task turn's row ([`LOT_ITEM_VERBS`]) by an agent, without an idempotency key,
    /// within `limits`; 1 to [`MAX_LOT_ITEMS`] of them.
    pub fn lot(
        room: &str,
        writer: &str,
        items: &[NewInteraction],
        limits: &Limits,
    ) -> Result<NewInteraction, ModelError> {
        Self::lot_of(room, writer, items.iter(), limits)
    }

    /// [`Self::lot`] of borrowed items (a relay's pending writes, not copied first).
    pub fn lot_of<'a>(
        room: &str,
        writer: &str,
        items: impl ExactSizeIterator<Item = &'a NewInteraction>,
        limits: &Limits,
    ) -> Result<NewInteraction, ModelError> {
        check_count(items.len())?;
        let items: Vec<&NewInteraction> = items.collect();
        let mut values = Vec::with_capacity(items.len());
        for (index, &item) in items.iter().enumerate() {
            if item.room != room {
                return Err(ModelError::BadLot(format!(
                    "item {index} is of room {:?}, the lot of room {room:?}",
                    item.room
                )));
            }
            if item.idempotency_key.is_some() {
                return Err(ModelError::BadLot(format!(
                    "item {index} has an idempotency key; items are known by their content"
                )));
            }
            // The rules the readers apply to every item (verb, role, names, causes),
            // checked on the item itself rather than decoded back from the lot's body.
            // Its body's size is bounded by the lot's, checked below (the item's
            // canonical body is a part of the lot's).
            check_item_kind(item.verb, item.role, &item.body)
                .and_then(|()| super::check_hashed(&item.hashed(), limits, 0))
                .map_err(|e| at_item(index, e))?;
            values.push(item_value(item));
        }
        let lot = NewInteraction::new(
            room,
            Verb::TaskLot,
            writer,
            Role::System,
            serde_json::json!({ "items": values }),
        );
        let size = lot.body_text().len();
        if size > limits.max_body_bytes {
            // Name an item that is over the limit by itself, if one is.
            for (index, item) in items.iter().enumerate() {
                let own = item.body_text().len();
                if own > limits.max_body_bytes {
                    let e = ModelError::BodyTooLarge {
                        size: own,
                        max: limits.max_body_bytes,
                    };
                    return Err(at_item(index, e));
                }
            }
        }
        // The lot's own fields, its size above all.
        lot.validate_own_fields(limits, size)?;
        Ok(lot)
    }

    /// For a `task.lot`: checks its envelope and every item as a reader will
    /// ([`NewInteraction::validate`] calls this, so nothing a reader would skip is
    /// written).
    ///
    /// `size` is the length of the lot's canonical body text, already checked against
    /// the limit: every item's body is a part of that text, so within the limit too,
    /// and no item is encoded or hashed here (readers do both, for its id).
    pub(super) fn check_lot(&self, limits: &Limits, size: usize) -> Result<(), ModelError> {
        check_envelope(
            self.role,
            self.thread.as_deref(),
            self.parent.as_ref(),
            self.caused_by.len(),
        )?;
        if self.idempotency_key.is_some() {
            return Err(ModelError::BadLot(
                "it has an idempotency key; a lot is known by its content".into(),
            ));
        }
        for (index, value) in item_values(&self.body)?.iter().enumerate() {
            check_item(&self.room, value, limits, size).map_err(|e| at_item(index, e))?;
        }
        Ok(())
    }
}

impl Interaction {
    /// Appends what this row stands for to `out`: itself, or a lot's items (each with
    /// its own id and the lot's position, time, writer and signer, in order). A lot
    /// that is not exactly a list of allowed items appends nothing.
    pub fn unpack_into(
        self,
        limits: &Limits,
        out: &mut Vec<Interaction>,
    ) -> Result<(), ModelError> {
        if self.verb != Verb::TaskLot {
            out.push(self);
            return Ok(());
        }
        check_envelope(
            self.role,
            self.thread.as_deref(),
            self.parent.as_ref(),
            self.caused_by.len(),
        )?;
        let Interaction {
            position,
            at,
            relay,
            room,
            body,
            signer,
            ..
        } = self;
        let values = match body {
            serde_json::Value::Object(mut object) if object.len() == 1 => {
                match object.remove("items") {
                    Some(serde_json::Value::Array(values)) => values,
                    _ => return Err(not_a_list()),
                }
            }
            _ => return Err(not_a_list()),
        };
        check_count(values.len())?;
        let mut items = Vec::with_capacity(values.len());
        for (index, value) in values.into_iter().enumerate() {
            let (content, id) = decode_item(&room, index, value, limits)?;
            items.push(Interaction::as_read(
                content, id, position, at, &relay, signer,
            ));
        }
        out.extend(items);
        Ok(())
    }

    /// What this row stands for: itself, or a lot's items ([`Self::unpack_into`]).
    pub fn unpacked(self, limits: &Limits) -> Result<Vec<Interaction>, ModelError> {
        let mut out = Vec::new();
        self.unpack_into(limits, &mut out)?;
        Ok(out)
    }
}

impl RawRow {
    /// Verifies the row ([`RawRow::verify`]) and appends what it stands for to `out`
    /// ([`Interaction::unpack_into`]): how the stores read the ledger, so no reader
    /// ever sees a `task.lot` row, only its items.
    ///
    /// An unsigned lot in canonical form is read by [`RawRow::read_lot_typed`], which
    /// gives exactly what the general path gives for it; anything else (and any lot
    /// the typed reading does not accept) goes the general path, which decides.
    pub fn read_into(self, out: &mut Vec<Interaction>) -> Result<(), ModelError> {
        let limits = Limits::default();
        if self.verb == Verb::TaskLot.as_str() && self.sig.is_none() {
            if let Some(items) = self.read_lot_typed(&limits) {
                out.extend(items);
                return Ok(());
            }
        }
        self.verify_within(&limits)?.unpack_into(&limits, out)
    }

    /// An unsigned lot read without building its body as JSON values first: its
    /// items decoded straight from the text, the text required to be exactly the
    /// canonical form of what was decoded (so it is what the general path would hash),
    /// the lot's id checked on that text, every rule the general path applies applied.
    /// `None` when any of that does not hold: the caller then reads the row the
    /// general way, so the result (items or error) never depends on which path ran
    /// (`typed_lot_reading_agrees_with_the_general_path` pins it).
    fn read_lot_typed(&self, limits: &Limits) -> Option<Vec<Interaction>> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wire {
            items: Vec<Item>,
        }
        let id = InteractionId::from_slice(&self.id).ok()?;
        let role: Role = self.role.parse().ok()?;
        if self.parent.is_some() || !self.caused_by.is_empty() {
            return None;
        }
        check_envelope(role, self.thread.as_deref(), None, 0).ok()?;
        let wire: Wire = serde_json::from_str(&self.body).ok()?;
        check_count(wire.items.len()).ok()?;
        // The canonical text of what was decoded must be the stored text.
        // (Where each item's body lies in it: the body's own canonical text.)
        let mut text = String::with_capacity(self.body.len());
        let mut bodies = Vec::with_capacity(wire.items.len());
        text.push_str("{\"items\":[");
        for (i, item) in wire.items.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            bodies.push(item.write_canonical(&mut text));
        }
        text.push_str("]}");
        if text != self.body {
            return None;
        }
        // The lot's own rules (names, size, no NUL anywhere in it), then its id.
        let null = serde_json::Value::Null;
        let fields = crate::canonical::HashedFields {
            room: &self.room,
            thread: None,
            verb: Verb::TaskLot.as_str(),
            actor: &self.actor,
            role: role.as_str(),
            parent: None,
            caused_by: &[],
            body: &null,
        };
        super::check_hashed(&fields, limits, self.body.len()).ok()?;
        let nul = wire.items.iter().any(|i| {
            i.actor.contains('\0')
                || i.thread.as_deref().is_some_and(|t| t.contains('\0'))
                || super::contains_nul(&i.body)
        });
        if nul {
            return None;
        }
        if fields.id_with_body(&self.body) != id {
            return None;
        }
        let mut out = Vec::with_capacity(wire.items.len());
        for (item, body) in wire.items.into_iter().zip(bodies) {
            let content = item.into_content(&self.room).ok()?;
            // As `NewInteraction::checked`, with the body's canonical text at hand.
            let body = &text[body];
            content.validate_own_fields(limits, body.len()).ok()?;
            let id = content.hashed().id_with_body(body);
            out.push(Interaction::as_read(
                content,
                id,
                self.position,
                self.at,
                &self.relay,
                None,
            ));
        }
        Some(out)
    }
}

impl Item {
    /// Writes the item's canonical JSON: what `canonical_json` gives for the value
    /// [`item_value`] builds of it (keys in byte order, absent fields left out).
    /// Returns where its body's canonical text lies in `out`.
    fn write_canonical(&self, out: &mut String) -> std::ops::Range<usize> {
        use crate::canonical::{write_json, write_str};
        out.push_str("{\"actor\":");
        write_str(out, &self.actor);
        out.push_str(",\"body\":");
        let start = out.len();
        write_json(out, &self.body);
        let body = start..out.len();
        if !self.caused_by.is_empty() {
            out.push_str(",\"caused_by\":[");
            for (i, c) in self.caused_by.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, &c.to_hex());
            }
            out.push(']');
        }
        if let Some(parent) = &self.parent {
            out.push_str(",\"parent\":");
            write_str(out, &parent.to_hex());
        }
        out.push_str(",\"role\":");
        write_str(out, self.role.as_str());
        if let Some(thread) = &self.thread {
            out.push_str(",\"thread\":");
            write_str(out, thread);
        }
        out.push_str(",\"verb\":");
        write_str(out, self.verb.as_str());
        out.push('}');
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Position, Timestamp};
    use proptest::prelude::*;
    use serde_json::json;

    fn item(verb: Verb, agent: &str, task: &str) -> NewInteraction {
        NewInteraction::new(
            "r",
            verb,
            agent,
            Role::Agent,
            json!({"task": task, "epoch": 3}),
        )
    }

    #[test]
    fn item_value_is_what_serializing_an_item_gives() {
        let plain = item(Verb::TaskClaimed, "bo", "t1");
        let parent = plain.id();
        let threaded = item(Verb::TurnReplied, "cy", "t2")
            .in_thread("ops \"quoted\" \u{7}")
            .with_parent(parent)
            .with_caused_by(vec![parent, item(Verb::TaskCompleted, "bo", "t1").id()]);
        let mut nested = item(Verb::TurnPrompted, "dee", "t3");
        nested.body = json!({"subject": {"id": "t3", "label": "ünïcode ✓", "n": [1, 2.5, null]}});
        for i in [plain, threaded, nested] {
            let serialized = serde_json::to_value(Item {
                verb: i.verb,
                actor: i.actor.clone(),
                role: i.role,
                thread: i.thread.clone(),
                parent: i.parent,
                caused_by: i.caused_by.clone(),
                body: i.body.clone(),
            })
            .expect("serialize");
            let built = item_value(&i);
            assert_eq!(built, serialized);
            // The same canonical text, so the same lot id.
            assert_eq!(
                crate::canonical::canonical_json(&built),
                crate::canonical::canonical_json(&serialized)
            );
        }
    }

    /// The row a store would read back for `content`, at `position`.
    fn stored(content: &NewInteraction, position: u64) -> RawRow {
        let (id, body) = content.id_and_body();
        RawRow {
            id: id.0.to_vec(),
            position: Position::new(0, position),
            at: Timestamp(7),
            relay: "relay-a".into(),
            room: content.room.clone(),
            thread: content.thread.clone(),
            verb: content.verb.as_str().into(),
            actor: content.actor.clone(),
            role: content.role.as_str().into(),
            parent: content.parent.map(|p| p.0.to_vec()),
            caused_by: content.caused_by.iter().map(|c| c.0.to_vec()).collect(),
            body,
            sig: None,
        }
    }

    fn read(raw: RawRow) -> Result<Vec<Interaction>, ModelError> {
        let mut out = Vec::new();
        raw.read_into(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_lot_reads_as_its_items_with_the_ids_of_their_own_rows() {
        let claimed = item(Verb::TaskClaimed, "ann", "t1");
        let prompted = NewInteraction::new(
            "r",
            Verb::TurnPrompted,
            "ann",
            Role::Agent,
            json!({"turn": "x"}),
        )
        .in_thread("work")
        .with_parent(claimed.id());
        let completed = item(Verb::TaskCompleted, "bob", "t2").with_caused_by(vec![claimed.id()]);
        let items = vec![claimed, prompted, completed];
        let lot = NewInteraction::lot("r", "relay-a", &items, &Limits::default()).unwrap();
        assert_eq!(lot.verb, Verb::TaskLot);
        assert_eq!(lot.role, Role::System);
        let out = read(stored(&lot, 9)).unwrap();
        assert_eq!(out.len(), 3);
        for (got, want) in out.iter().zip(&items) {
            assert_eq!(got.id, want.id(), "an item has the id of its own row");
            assert_eq!(got.content(), *want);
            assert_eq!(got.position, Position::new(0, 9));
            assert_eq!(got.at, Timestamp(7));
            assert_eq!(got.relay, "relay-a");
        }
        // A row that is not a lot reads as itself.
        let plain = read(stored(&items[0], 10)).unwrap();
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].id, items[0].id());
    }

    #[test]
    fn a_writer_cannot_build_a_lot_readers_would_skip() {
        let limits = Limits::default();
        let ok = item(Verb::TaskCompleted, "ann", "t1");
        let bad = [
            (vec![], "1 to"),
            (vec![ok.clone(); MAX_LOT_ITEMS + 1], "1 to"),
            (vec![item(Verb::ConfigSet, "ann", "t1")], "not a task turn"),
            (
                vec![item(Verb::MessagePosted, "ann", "t1")],
                "not a task turn",
            ),
            (
                vec![NewInteraction {
                    role: Role::Owner,
                    ..ok.clone()
                }],
                "not agent",
            ),
            (
                vec![NewInteraction {
                    room: "other".into(),
                    ..ok.clone()
                }],
                "room",
            ),
            (vec![ok.clone().with_idempotency_key("k")], "idempotency"),
            (
                vec![NewInteraction {
                    actor: "a/b".into(),
                    ..ok.clone()
                }],
                "actor",
            ),
            (
                vec![NewInteraction {
                    body: json!("text"),
                    ..ok.clone()
                }],
                "object",
            ),
        ];
        for (items, why) in bad {
            let err = NewInteraction::lot("r", "relay-a", &items, &limits).unwrap_err();
            assert!(err.to_string().contains(why), "{err} (expected {why:?})");
        }
        // Items each within the body limit, but not the lot of them.
        let small = Limits {
            max_body_bytes: 300,
            ..Limits::default()
        };
        let wordy = NewInteraction {
            body: json!({"task": "t1", "text": "x".repeat(120)}),
            ..ok.clone()
        };
        assert!(wordy.validate(&small).is_ok());
        let err = NewInteraction::lot("r", "relay-a", &[wordy.clone(), wordy.clone()], &small)
            .unwrap_err();
        assert!(matches!(err, ModelError::BodyTooLarge { .. }), "{err}");
        // An item over the limit is named.
        let err = NewInteraction::lot(
            "r",
            "relay-a",
            &[ok.clone(), wordy],
            &Limits {
                max_body_bytes: 100,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("item 1"), "{err}");
        // Nor write one by hand: validate checks a lot's envelope and items.
        let lot = NewInteraction::lot("r", "relay-a", std::slice::from_ref(&ok), &limits).unwrap();
        for broken in [
            NewInteraction {
                role: Role::Agent,
                ..lot.clone()
            },
            lot.clone().in_thread("t"),
            lot.clone().with_idempotency_key("k"),
            NewInteraction {
                body: json!({"items": [], "more": 1}),
                ..lot.clone()
            },
            NewInteraction {
                body: json!({"items": [{"verb": "task.completed", "actor": "ann",
                    "role": "agent", "body": {}, "extra": 1}]}),
                ..lot.clone()
            },
        ] {
            assert!(broken.validate(&limits).is_err(), "{broken:?}");
        }
    }

    #[test]
    fn a_corrupt_lot_is_skipped_whole() {
        let good = json!({"verb": "task.completed", "actor": "ann", "role": "agent",
            "body": {"task": "t1", "epoch": 1}});
        let bodies = [
            json!({"items": [good, {"verb": "config.set", "actor": "ann", "role": "agent", "body": {}}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "owner", "body": {}}]}),
            json!({"items": [good, {"verb": "task.nope", "actor": "ann", "role": "agent", "body": {}}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "", "role": "agent", "body": {}}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": {"t": "\u{0}"}}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": {}, "extra": 1}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent"}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": 7, "role": "agent", "body": {}}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": {}, "thread": "a/b"}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": {}, "parent": "beef"}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": {}, "caused_by": ["x"]}]}),
            json!({"items": [good, {"verb": "task.claimed", "actor": "ann", "role": "agent", "body": []}]}),
            json!({"items": [good, "task.claimed"]}),
            json!({"items": [good], "also": 1}),
            json!({"items": []}),
            json!({"items": "x"}),
            json!([good]),
        ];
        for body in bodies {
            let lot = NewInteraction::new("r", Verb::TaskLot, "relay-a", Role::System, body);
            let err = read(stored(&lot, 1)).unwrap_err();
            assert!(
                matches!(err, ModelError::BadLot(_) | ModelError::BadBody(_)),
                "{err}"
            );
            // What readers skip, writers refuse: the two checks agree.
            assert!(lot.validate(&Limits::default()).is_err(), "{lot:?}");
        }
        // And what one accepts, so does the other, optional fields and nulls included.
        let parent = item(Verb::TaskClaimed, "ann", "t1").id();
        for extra in [
            json!({}),
            json!({"thread": "work", "parent": parent.to_hex(), "caused_by": [parent.to_hex()]}),
            json!({"thread": null, "parent": null}),
        ] {
            let mut one = good.clone();
            for (k, v) in extra.as_object().unwrap() {
                one[k] = v.clone();
            }
            let lot = NewInteraction::new(
                "r",
                Verb::TaskLot,
                "relay-a",
                Role::System,
                json!({ "items": [good, one] }),
            );
            assert!(lot.validate(&Limits::default()).is_ok(), "{lot:?}");
            assert_eq!(read(stored(&lot, 1)).unwrap().len(), 2);
        }
        // An envelope that is not a relay's: skipped as well.
        let lot = NewInteraction::new(
            "r",
            Verb::TaskLot,
            "ann",
            Role::Agent,
            json!({"items": [good]}),
        );
        assert!(read(stored(&lot, 1)).is_err());
        let mut out = Vec::new();
        assert!(stored(&lot, 1).read_into(&mut out).is_err());
        assert!(out.is_empty(), "nothing of a corrupt lot is read");
    }

    /// The general path's reading of `raw` (the typed one never runs).
    fn read_general(raw: RawRow) -> Result<Vec<Interaction>, ModelError> {
        let limits = Limits::default();
        let mut out = Vec::new();
        raw.verify_within(&limits)?.unpack_into(&limits, &mut out)?;
        Ok(out)
    }

    /// Asserts that reading `raw` gives what the general path gives, and that the
    /// typed reading accepts nothing the general path refuses; whether it was used.
    fn agrees(raw: &RawRow) -> bool {
        let typed = raw.read_lot_typed(&Limits::default());
        let general = read_general(raw.clone());
        if let Some(items) = &typed {
            assert_eq!(
                general.as_ref(),
                Ok(items),
                "the typed reading accepted what the general one reads otherwise: {raw:?}"
            );
        }
        assert_eq!(read(raw.clone()), general, "{raw:?}");
        typed.is_some()
    }

    fn with_text(raw: &RawRow, text: String) -> RawRow {
        RawRow {
            body: text,
            ..raw.clone()
        }
    }

    #[test]
    fn typed_lot_reading_agrees_with_the_general_path() {
        let claimed = item(Verb::TaskClaimed, "ann", "t1");
        let mut prompted = item(Verb::TurnPrompted, "ann", "t1")
            .in_thread("w \"q\" é")
            .with_parent(claimed.id());
        prompted.body = json!({"turn": "3.3", "subject": {"kind": "task", "id": "t1",
            "n": [1, -2, 2.5, 1e300, null, true], "s": "tab\there \\ \u{1f}"}});
        let completed = item(Verb::TaskCompleted, "bob", "t2")
            .with_caused_by(vec![claimed.id(), prompted.id()]);
        let items = vec![claimed, prompted, completed];
        let lot = NewInteraction::lot("r", "relay-a", &items, &Limits::default()).unwrap();
        let raw = stored(&lot, 4);
        assert!(agrees(&raw), "a relay's lot is read the typed way");
        assert_eq!(read(raw.clone()).unwrap().len(), 3);

        // Texts that are not the canonical form, under the id of the canonical one:
        // the general path accepts them (it hashes what it parsed), the typed one
        // leaves them to it.
        let text = raw.body.clone();
        let spaced = text.replacen("\"items\":", "\"items\" : ", 1);
        let swapped = text
            .replacen(
                "{\"actor\":\"ann\",",
                "{\"verb\":\"task.claimed\",\"actor\":\"ann\",",
                1,
            )
            .replacen(",\"verb\":\"task.claimed\"}", "}", 1);
        let escaped = text.replacen("\"actor\":\"ann\"", "\"actor\":\"\\u0061nn\"", 1);
        let upper = text.replacen(
            &items[0].id().to_hex(),
            &items[0].id().to_hex().to_uppercase(),
            1,
        );
        let duplicated = text.replacen("{\"items\":", "{\"items\":[],\"items\":", 1);
        for variant in [spaced, swapped, escaped, upper, duplicated] {
            assert_ne!(variant, text);
            let v = with_text(&raw, variant.clone());
            assert!(!agrees(&v), "{}", v.body);
            // The same text under an id hashed over it as it stands: not the typed
            // reading's to accept (the general path refuses most of these, its id not
            // being the content's; upper-case ids it reads, as it always has).
            let fields = crate::canonical::HashedFields {
                room: "r",
                thread: None,
                verb: Verb::TaskLot.as_str(),
                actor: "relay-a",
                role: Role::System.as_str(),
                parent: None,
                caused_by: &[],
                body: &serde_json::Value::Null,
            };
            let forged_id = fields.id_with_body(&variant);
            let mut forged = with_text(&raw, variant);
            forged.id = forged_id.0.to_vec();
            assert!(!agrees(&forged), "{}", forged.body);
        }
        // Nulls for absent fields: accepted by both checks (above), read the general way.
        let good = json!({"verb": "task.completed", "actor": "ann", "role": "agent",
            "body": {"task": "t1", "epoch": 1}});
        let nulls = json!({"verb": "task.completed", "actor": "ann", "role": "agent",
            "body": {"task": "t1", "epoch": 1}, "thread": null, "parent": null});
        let lot = NewInteraction::new(
            "r",
            Verb::TaskLot,
            "relay-a",
            Role::System,
            json!({"items": [good, nulls]}),
        );
        let v = stored(&lot, 1);
        assert!(!agrees(&v));
        assert_eq!(read(v).unwrap().len(), 2);
        // A lot with the wrong id, a signed one, a foreign envelope: not the typed way.
        let mut wrong = raw.clone();
        wrong.id[0] ^= 1;
        assert!(!agrees(&wrong));
        let mut agent = stored(
            &NewInteraction {
                role: Role::Agent,
                ..lot.clone()
            },
            1,
        );
        assert!(!agrees(&agent));
        agent.role = "system".into();
        assert!(!agrees(&agent));
    }

    fn arb_body() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".{0,8}".prop_map(serde_json::Value::String),
        ];
        let tree = leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".{0,5}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map(".{0,5}", tree, 0..4)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }

    fn arb_item() -> impl Strategy<Value = NewInteraction> {
        (
            prop::sample::select(LOT_ITEM_VERBS.to_vec()),
            "[a-z][a-z0-9_-]{0,7}",
            prop::option::of("[a-z][ a-z0-9]{0,7}"),
            any::<bool>(),
            0..3usize,
            arb_body(),
        )
            .prop_map(|(verb, actor, thread, parent, causes, body)| {
                let cause = |i: usize| {
                    NewInteraction::new("r", Verb::TaskClaimed, "x", Role::Agent, json!({"i": i}))
                        .id()
                };
                let mut i = NewInteraction::new("r", verb, &actor, Role::Agent, body);
                i.thread = thread;
                if parent {
                    i.parent = Some(cause(99));
                }
                i.caused_by = (0..causes).map(cause).collect();
                i
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every lot a writer can build is read the typed way, with the general
        /// path's items; and a byte of its text changed (the id kept) is never
        /// accepted by the typed reading unless the general one reads it the same.
        #[test]
        fn typed_lot_reading_agrees_on_any_lot(
            items in prop::collection::vec(arb_item(), 1..6),
            at in any::<prop::sample::Index>(),
            byte in 0x20u8..0x7f,
        ) {
            let lot = NewInteraction::lot("r", "relay-a", &items, &Limits::default());
            prop_assume!(lot.is_ok(), "a lot no writer builds");
            let lot = lot.unwrap();
            let raw = stored(&lot, 2);
            prop_assert!(agrees(&raw));
            let mut bytes = raw.body.clone().into_bytes();
            let i = at.index(bytes.len());
            if bytes[i].is_ascii() {
                bytes[i] = byte;
                if let Ok(text) = String::from_utf8(bytes) {
                    agrees(&with_text(&raw, text));
                }
            }
        }
    }
}
