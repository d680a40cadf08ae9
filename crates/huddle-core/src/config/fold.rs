//! The config fold: room and thread overlays from the owner's `config.set` rows.
//!
//! - `room.created` names the room's owner (`{"owner": "<actor>"}`); the first one by
//!   ledger position wins. A thread inherits its room's owner.
//! - `config.set` counts only when its `role` is `owner` **and** its `actor` is the
//!   owner named by `room.created`; anything else (another actor, a room with no
//!   known owner, a malformed body) is ignored and counted in
//!   [`ConfigFold::ignored_rows`].
//! - Each key of each overlay is a last-writer-wins register keyed by ledger
//!   position: a set stores the value, a reset stores a tombstone. Re-applying an
//!   older row never undoes a newer one.
//! - [`ConfigFold::effective`] layers default, room overlay and thread overlay, and
//!   clamps every value on the way out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{check_agent_name, ConfigKey, ConfigSetBody, ConfigValue, RoomConfig};
use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, Position, Role};
use crate::verbs::Verb;

/// Folds `room.created` and `config.set` into per-room owners and config overlays.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ConfigFold {
    rooms: BTreeMap<String, RoomEntry>,
    ignored: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct RoomEntry {
    owner: Option<OwnerRecord>,
    room: Overlay,
    threads: BTreeMap<String, Overlay>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
struct OwnerRecord {
    actor: String,
    position: Position,
}

/// Key text -> register. String keys so the state serialises (and hashes) plainly.
type Overlay = BTreeMap<String, Slot>;

#[derive(Clone, Debug, PartialEq, Serialize)]
struct Slot {
    position: Position,
    /// `None` is a reset (a tombstone, so an older set cannot come back).
    value: Option<ConfigValue>,
}

/// Where an effective value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigSource {
    /// Nobody set it: the built-in default.
    Default,
    /// The room overlay.
    Room,
    /// The thread overlay.
    Thread,
}

impl ConfigSource {
    /// `default`, `room` or `thread`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSource::Default => "default",
            ConfigSource::Room => "room",
            ConfigSource::Thread => "thread",
        }
    }
}

/// One effective setting and where it came from (for `!config get`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainedSetting {
    /// The key.
    pub key: ConfigKey,
    /// The effective, clamped value.
    pub value: ConfigValue,
    /// Which layer it came from.
    pub source: ConfigSource,
}

impl ConfigFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds `rows` (in ledger order) from scratch.
    pub fn rebuild<'a, I>(rows: I) -> Self
    where
        I: IntoIterator<Item = &'a Interaction>,
    {
        let mut fold = Self::new();
        fold.apply_all(rows);
        fold
    }

    /// The room's owner, as named by its first `room.created`.
    pub fn owner(&self, room: &str) -> Option<&str> {
        self.rooms
            .get(room)
            .and_then(|r| r.owner.as_ref())
            .map(|o| o.actor.as_str())
    }

    /// Whether a row by `actor` with `role` speaks for the room's owner: the role
    /// is [`Role::Owner`] and the actor is the owner `room.created` named.
    pub fn is_owner(&self, room: &str, actor: &str, role: Role) -> bool {
        role == Role::Owner && self.owner(room) == Some(actor)
    }

    /// How many `config.set` / `room.created` rows were ignored (not from the
    /// owner, or malformed).
    pub fn ignored_rows(&self) -> u64 {
        self.ignored
    }

    /// The effective config of a room, or of a thread in it: default, then the
    /// room overlay, then the thread overlay; every value clamped.
    pub fn effective(&self, room: &str, thread: Option<&str>) -> RoomConfig {
        let mut config = RoomConfig::default();
        for s in self.explain(room, thread) {
            config.set(s.key, s.value);
        }
        config.clamped()
    }

    /// Every key's effective, clamped value and its source, in [`ConfigKey::ALL`]
    /// order.
    pub fn explain(&self, room: &str, thread: Option<&str>) -> Vec<ExplainedSetting> {
        let entry = self.rooms.get(room);
        let room_overlay = entry.map(|e| &e.room);
        let thread_overlay = entry.zip(thread).and_then(|(e, t)| e.threads.get(t));
        ConfigKey::ALL
            .into_iter()
            .map(|key| {
                let lookup = |o: Option<&Overlay>| {
                    o.and_then(|o| o.get(key.as_str()))
                        .and_then(|slot| slot.value.clone())
                };
                let (value, source) = if let Some(v) = lookup(thread_overlay) {
                    (v, ConfigSource::Thread)
                } else if let Some(v) = lookup(room_overlay) {
                    (v, ConfigSource::Room)
                } else {
                    (key.default_value(), ConfigSource::Default)
                };
                ExplainedSetting {
                    key,
                    value: key.clamp(value),
                    source,
                }
            })
            .collect()
    }

    fn apply_room_created(&mut self, i: &Interaction) {
        let owner = i
            .body
            .get("owner")
            .and_then(|o| o.as_str())
            .filter(|o| check_agent_name(o).is_ok());
        let Some(owner) = owner else {
            self.ignored += 1;
            return;
        };
        let entry = self.rooms.entry(i.room.clone()).or_default();
        match &entry.owner {
            Some(existing) if existing.position <= i.position => {}
            _ => {
                entry.owner = Some(OwnerRecord {
                    actor: owner.to_string(),
                    position: i.position,
                })
            }
        }
    }

    fn apply_config_set(&mut self, i: &Interaction) {
        if !self.is_owner(&i.room, &i.actor, i.role) {
            self.ignored += 1;
            return;
        }
        let Ok(body) = ConfigSetBody::from_json(&i.body) else {
            self.ignored += 1;
            return;
        };
        let Some(entry) = self.rooms.get_mut(&i.room) else {
            return; // unreachable: is_owner found the room
        };
        let overlay = match &i.thread {
            Some(t) => entry.threads.entry(t.clone()).or_default(),
            None => &mut entry.room,
        };
        let writes = body
            .set
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .chain(body.reset.into_iter().map(|k| (k, None)));
        for (key, value) in writes {
            let newer = overlay
                .get(key.as_str())
                .is_none_or(|slot| slot.position < i.position);
            if newer {
                overlay.insert(
                    key.as_str().to_string(),
                    Slot {
                        position: i.position,
                        value,
                    },
                );
            }
        }
    }
}

impl Fold for ConfigFold {
    fn apply(&mut self, interaction: &Interaction) {
        match interaction.verb {
            Verb::RoomCreated => self.apply_room_created(interaction),
            Verb::ConfigSet => self.apply_config_set(interaction),
            _ => {}
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}
