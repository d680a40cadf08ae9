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
            items.push(Interaction {
                id,
                position,
                at,
                relay: relay.clone(),
                room: content.room,
                thread: content.thread,
                verb: content.verb,
                actor: content.actor,
                role: content.role,
                parent: content.parent,
                caused_by: content.caused_by,
                body: content.body,
                signer,
            });
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
    pub fn read_into(self, out: &mut Vec<Interaction>) -> Result<(), ModelError> {
        let limits = Limits::default();
        self.verify_within(&limits)?.unpack_into(&limits, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Position, Timestamp};
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
}
