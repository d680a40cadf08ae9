//! The config fold: room owners and their keys, the owner's verified commands, and
//! room and thread overlays from the `config.set` rows those commands produce.
//!
//! - `room.created` names the room's owner and the owner's public key
//!   (`{"owner": "<actor>", "key": "<64 hex>"}`); the first one by ledger position
//!   wins, every later one is ignored and counted. A thread inherits its room's owner.
//! - `room.key_rotated` (`{"key": "<64 hex>", "sig": ...}`) by the owner, signed by
//!   the room's current key, replaces the key from then on.
//! - `config.set` counts only when its `role` is `owner`, its `actor` is the owner
//!   and it comes after the `room.created`; anything else is ignored and counted in
//!   [`ConfigFold::ignored_rows`]. Whether the owner really wrote it (a signed command
//!   produced it) is judged above this fold, by
//!   [`crate::commands::OwnerAuthority`], which feeds this fold only the rows it
//!   admits; readers that act on config go through it.
//! - Each key of each overlay is a last-writer-wins register keyed by ledger
//!   position: a set stores the value, a reset stores a tombstone. Re-applying an
//!   older row never undoes a newer one.
//! - [`ConfigFold::effective`] layers default, room overlay and thread overlay, and
//!   clamps every value on the way out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::keys::{check_agent_name, ConfigKey, ConfigSetBody, ConfigValue, RoomConfig};
use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, Position, Role};
use crate::signing::{verify, OwnerKey, SignatureError};
use crate::verbs::Verb;

/// Folds `room.created`, `room.key_rotated` and `config.set` into per-room owners,
/// owner keys and config overlays.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ConfigFold {
    rooms: BTreeMap<String, RoomEntry>,
    ignored: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
struct RoomEntry {
    owner: Option<OwnerRecord>,
    room: Overlay,
    threads: BTreeMap<String, Overlay>,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
struct OwnerRecord {
    actor: String,
    position: Position,
    /// The current owner key, hex; `None` when `room.created` carried no valid key
    /// (then no command of the room ever verifies).
    key: Option<String>,
}

/// Key text -> register. String keys so the state serialises (and hashes) plainly.
type Overlay = BTreeMap<String, Slot>;

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
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
    /// The `topology` set in the room or thread overlay (the key itself is not set
    /// there).
    Topology,
}

impl ConfigSource {
    /// `default`, `room` or `thread`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSource::Default => "default",
            ConfigSource::Room => "room",
            ConfigSource::Thread => "thread",
            ConfigSource::Topology => "topology",
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

/// The value one overlay gives `key`: set there itself, or (for `responder` and
/// `allocation`) the preset of a `topology` set there; the flag says it came from
/// the topology. So in each layer the explicit key wins over the layer's topology,
/// and a thread's topology wins over the room's explicit keys.
fn layer_value(o: Option<&Overlay>, key: ConfigKey) -> Option<(ConfigValue, bool)> {
    let o = o?;
    let own = |k: ConfigKey| o.get(k.as_str()).and_then(|slot| slot.value.clone());
    if let Some(v) = own(key) {
        return Some((v, false));
    }
    match own(ConfigKey::Topology) {
        Some(ConfigValue::Topology(t)) => t.preset(key).map(|v| (v, true)),
        _ => None,
    }
}

impl ConfigFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// The room's owner, as named by its first `room.created`.
    pub fn owner(&self, room: &str) -> Option<&str> {
        self.owner_record(room).map(|o| o.actor.as_str())
    }

    fn owner_record(&self, room: &str) -> Option<&OwnerRecord> {
        self.rooms.get(room).and_then(|r| r.owner.as_ref())
    }

    /// The room owner's current public key: from `room.created`, or the last
    /// verified `room.key_rotated`.
    pub fn owner_key(&self, room: &str) -> Option<OwnerKey> {
        self.owner_record(room)
            .and_then(|o| o.key.as_deref())
            .and_then(|k| k.parse().ok())
    }

    /// Whether a row by `actor` with `role` speaks for the room's owner: the role
    /// is [`Role::Owner`] and the actor is the owner `room.created` named. This is
    /// who the row claims to be; [`ConfigFold::check_signature`] is the proof.
    pub fn is_owner(&self, room: &str, actor: &str, role: Role) -> bool {
        role == Role::Owner && self.owner(room) == Some(actor)
    }

    /// Whether `row` is signed by its room's current owner key.
    pub fn check_signature(&self, row: &Interaction) -> Result<(), SignatureError> {
        let key = self.owner_key(&row.room).ok_or(SignatureError::NoKey)?;
        verify(&row.content(), &key)
    }

    /// How many `config.set` / `room.created` / `room.key_rotated` rows were
    /// ignored (not from the owner, not signed, a later `room.created`, or
    /// malformed).
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
                // A room-wide key is read from the room overlay only.
                let thread_overlay = thread_overlay.filter(|_| !key.room_wide());
                let (value, source) = if let Some((v, t)) = layer_value(thread_overlay, key) {
                    (
                        v,
                        if t {
                            ConfigSource::Topology
                        } else {
                            ConfigSource::Thread
                        },
                    )
                } else if let Some((v, t)) = layer_value(room_overlay, key) {
                    (
                        v,
                        if t {
                            ConfigSource::Topology
                        } else {
                            ConfigSource::Room
                        },
                    )
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

    /// The effective value of one key in a room or thread (the thread overlay, then
    /// the room overlay, then the default), clamped: [`Self::effective`] for one key.
    pub fn value(&self, room: &str, thread: Option<&str>, key: ConfigKey) -> ConfigValue {
        let entry = self.rooms.get(room);
        let thread = thread.filter(|_| !key.room_wide());
        let overlays = [
            entry.zip(thread).and_then(|(e, t)| e.threads.get(t)),
            entry.map(|e| &e.room),
        ];
        overlays
            .into_iter()
            .find_map(|o| layer_value(o, key).map(|(v, _)| v))
            .map_or_else(|| key.default_value(), |v| key.clamp(v))
    }

    /// The value the room overlay holds for `key`, unclamped and borrowed (`None`:
    /// not set, or reset). For the room-wide list keys read once per row, whose stored
    /// values are already checked ([`ConfigSetBody::from_json`]).
    pub fn room_setting(&self, room: &str, key: ConfigKey) -> Option<&ConfigValue> {
        self.rooms.get(room)?.room.get(key.as_str())?.value.as_ref()
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
        let key = i
            .body
            .get("key")
            .and_then(|k| k.as_str())
            .and_then(|k| k.parse::<OwnerKey>().ok())
            .map(|k| k.to_hex());
        let entry = self.rooms.entry(i.room.clone()).or_default();
        match &entry.owner {
            // The first room.created is the room; a later one changes nothing.
            Some(existing) if existing.position < i.position => self.ignored += 1,
            Some(existing) if existing.position == i.position => {}
            _ => {
                entry.owner = Some(OwnerRecord {
                    actor: owner.to_string(),
                    position: i.position,
                    key,
                })
            }
        }
    }

    /// Whether `i` is by the owner, after the room's creation, signed by the
    /// current key.
    pub fn signed_by_owner(&self, i: &Interaction) -> bool {
        let after_creation = self
            .owner_record(&i.room)
            .is_some_and(|o| o.position < i.position);
        after_creation
            && self.is_owner(&i.room, &i.actor, i.role)
            && self.check_signature(i).is_ok()
    }

    fn apply_key_rotated(&mut self, i: &Interaction) {
        let new_key = i
            .body
            .get("key")
            .and_then(|k| k.as_str())
            .and_then(|k| k.parse::<OwnerKey>().ok());
        let Some(new_key) = new_key.filter(|_| self.signed_by_owner(i)) else {
            self.ignored += 1;
            return;
        };
        if let Some(owner) = self.rooms.get_mut(&i.room).and_then(|r| r.owner.as_mut()) {
            owner.key = Some(new_key.to_hex());
        }
    }

    /// Counts a row that was kept from this fold (a `config.set` no signed command
    /// produced) among the ignored rows.
    pub(crate) fn count_ignored(&mut self) {
        self.ignored += 1;
    }

    fn apply_config_set(&mut self, i: &Interaction) {
        // The owner speaks from the room's creation on: a row from before it does
        // not count, even when the fold sees it again later (a replay).
        let after_creation = self
            .rooms
            .get(&i.room)
            .and_then(|r| r.owner.as_ref())
            .is_some_and(|o| o.position < i.position);
        if !after_creation || !self.is_owner(&i.room, &i.actor, i.role) {
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
            Verb::RoomKeyRotated => self.apply_key_rotated(interaction),
            Verb::ConfigSet => self.apply_config_set(interaction),
            _ => {}
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::keys::{Allocation, Responder};
    use crate::testing::ledger_row as row;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn created(pos: u64, room: &str, owner: &str) -> Interaction {
        row(
            pos,
            0,
            room,
            None,
            Verb::RoomCreated,
            owner,
            Role::Owner,
            json!({ "owner": owner }),
        )
    }

    fn set(pos: u64, thread: Option<&str>, actor: &str, role: Role, body: Value) -> Interaction {
        row(pos, 0, "lobby", thread, Verb::ConfigSet, actor, role, body)
    }

    fn owner_set(pos: u64, thread: Option<&str>, body: Value) -> Interaction {
        set(pos, thread, "olga", Role::Owner, body)
    }

    #[test]
    fn only_the_named_owner_with_the_owner_role_counts() {
        let rows = [
            // Before the room exists nobody owns it.
            owner_set(1, None, json!({"set": {"rate": 2}})),
            created(2, "lobby", "olga"),
            // A second room.created does not change the owner.
            created(3, "lobby", "mallory"),
            set(4, None, "mallory", Role::Owner, json!({"set": {"rate": 3}})),
            set(5, None, "olga", Role::Human, json!({"set": {"rate": 4}})),
            set(6, None, "bot", Role::Agent, json!({"set": {"rate": 5}})),
            set(
                7,
                None,
                "olga",
                Role::Owner,
                json!({"set": {"loop-max": 2}}),
            ),
        ];
        let fold = ConfigFold::rebuild(&rows);
        assert_eq!(fold.owner("lobby"), Some("olga"));
        assert!(fold.is_owner("lobby", "olga", Role::Owner));
        assert!(!fold.is_owner("lobby", "olga", Role::Human));
        assert!(!fold.is_owner("lobby", "mallory", Role::Owner));
        let c = fold.effective("lobby", None);
        assert_eq!(c.rate, 10, "no rate write counted");
        assert_eq!(c.loop_max, 2);
        // 1 (before the room), 3 (a second room.created), 4, 5, 6.
        assert_eq!(fold.ignored_rows(), 5);
    }

    #[test]
    fn a_room_without_a_valid_owner_takes_no_config() {
        let rows = [
            row(
                1,
                0,
                "lobby",
                None,
                Verb::RoomCreated,
                "x",
                Role::Owner,
                json!({}),
            ),
            row(
                2,
                0,
                "lobby",
                None,
                Verb::RoomCreated,
                "x",
                Role::Owner,
                json!({"owner": "a b"}),
            ),
            owner_set(3, None, json!({"set": {"rate": 2}})),
        ];
        let fold = ConfigFold::rebuild(&rows);
        assert_eq!(fold.owner("lobby"), None);
        assert_eq!(fold.effective("lobby", None), RoomConfig::default());
        assert_eq!(fold.ignored_rows(), 3);
    }

    #[test]
    fn thread_overlays_room_and_reset_falls_back_to_room_then_default() {
        let mut fold = ConfigFold::new();
        fold.apply(&created(1, "lobby", "olga"));
        fold.apply(&owner_set(
            2,
            None,
            json!({"set": {"rate": 5, "responder": "designated"}}),
        ));
        fold.apply(&owner_set(
            3,
            Some("t1"),
            json!({"set": {"rate": 7, "allocation": "bid"}}),
        ));
        let room = fold.effective("lobby", None);
        let t1 = fold.effective("lobby", Some("t1"));
        let t2 = fold.effective("lobby", Some("t2"));
        assert_eq!((room.rate, room.allocation), (5, Allocation::Pull));
        assert_eq!((t1.rate, t1.allocation), (7, Allocation::Bid));
        assert_eq!(
            t1.responder,
            Responder::Designated,
            "inherited from the room"
        );
        assert_eq!(t2, room, "a thread with no overlay is the room");

        let sources: Vec<_> = fold
            .explain("lobby", Some("t1"))
            .into_iter()
            .filter(|s| {
                matches!(
                    s.key,
                    ConfigKey::Rate | ConfigKey::Responder | ConfigKey::Budget
                )
            })
            .map(|s| (s.key, s.source))
            .collect();
        assert_eq!(
            sources,
            vec![
                (ConfigKey::Responder, ConfigSource::Room),
                (ConfigKey::Rate, ConfigSource::Thread),
                (ConfigKey::Budget, ConfigSource::Default),
            ]
        );

        fold.apply(&owner_set(4, Some("t1"), json!({"reset": ["rate"]})));
        assert_eq!(
            fold.effective("lobby", Some("t1")).rate,
            5,
            "back to the room"
        );
        fold.apply(&owner_set(5, None, json!({"reset": ["rate"]})));
        assert_eq!(
            fold.effective("lobby", Some("t1")).rate,
            10,
            "back to the default"
        );
        assert_eq!(
            fold.effective("lobby", Some("t1")).allocation,
            Allocation::Bid
        );
    }

    #[test]
    fn a_topology_sets_responder_and_allocation_beneath_the_explicit_keys() {
        use crate::config::keys::Topology;
        let pair = |c: RoomConfig| (c.responder, c.allocation, c.topology);
        let mut fold = ConfigFold::new();
        fold.apply(&created(1, "lobby", "olga"));
        assert_eq!(
            pair(fold.effective("lobby", None)),
            (Responder::Race, Allocation::Pull, Topology::Peer),
            "the default is peer"
        );
        let presets = [
            ("orchestrator", Responder::Designated, Allocation::Push),
            ("pipeline", Responder::RolePriority, Allocation::Pull),
            ("market", Responder::Race, Allocation::Bid),
            ("peer", Responder::Race, Allocation::Pull),
        ];
        for (i, (name, r, a)) in presets.into_iter().enumerate() {
            fold.apply(&owner_set(
                2 + i as u64,
                None,
                json!({"set": {"topology": name}}),
            ));
            let c = fold.effective("lobby", None);
            assert_eq!((c.responder, c.allocation), (r, a), "{name}");
            assert_eq!(c.topology.as_str(), name);
        }
        // An explicit key in the same layer wins, whichever was set first.
        fold.apply(&owner_set(10, None, json!({"set": {"allocation": "bid"}})));
        fold.apply(&owner_set(
            11,
            None,
            json!({"set": {"topology": "orchestrator"}}),
        ));
        let c = fold.effective("lobby", None);
        assert_eq!(
            (c.responder, c.allocation),
            (Responder::Designated, Allocation::Bid)
        );
        let sources: Vec<_> = fold
            .explain("lobby", None)
            .into_iter()
            .filter(|s| matches!(s.key, ConfigKey::Responder | ConfigKey::Allocation))
            .map(|s| (s.key, s.source))
            .collect();
        assert_eq!(
            sources,
            vec![
                (ConfigKey::Responder, ConfigSource::Topology),
                (ConfigKey::Allocation, ConfigSource::Room),
            ]
        );
        // A thread's topology beats the room's explicit keys there.
        fold.apply(&owner_set(
            12,
            Some("t1"),
            json!({"set": {"topology": "pipeline"}}),
        ));
        let t1 = fold.effective("lobby", Some("t1"));
        assert_eq!(
            (t1.responder, t1.allocation),
            (Responder::RolePriority, Allocation::Pull)
        );
        assert_eq!(
            fold.value("lobby", Some("t1"), ConfigKey::Allocation),
            ConfigValue::Allocation(Allocation::Pull)
        );
        fold.apply(&owner_set(13, None, json!({"reset": ["allocation"]})));
        assert_eq!(fold.effective("lobby", None).allocation, Allocation::Push);
    }

    #[test]
    fn last_writer_by_position_wins_and_order_matters() {
        let a = owner_set(10, None, json!({"set": {"rate": 3}}));
        let mut b = owner_set(20, None, json!({"set": {"rate": 8}}));
        let fold = ConfigFold::rebuild([&created(1, "lobby", "olga"), &a, &b]);
        assert_eq!(fold.effective("lobby", None).rate, 8);

        // Swap which row is later in the ledger: the other value wins.
        b.position = Position::new(0, 5);
        let fold = ConfigFold::rebuild([&created(1, "lobby", "olga"), &b, &a]);
        assert_eq!(fold.effective("lobby", None).rate, 3);

        // A stale row re-applied (a replay) never undoes a newer one, including a
        // reset (tombstone).
        let reset = owner_set(30, None, json!({"reset": ["rate"]}));
        let mut fold = ConfigFold::rebuild([&created(1, "lobby", "olga"), &a, &reset]);
        let before = fold.state_hash();
        fold.apply(&a);
        assert_eq!(fold.state_hash(), before);
        assert_eq!(fold.effective("lobby", None).rate, 10);
    }

    #[test]
    fn hand_written_out_of_range_values_are_clamped_at_read() {
        let fold = ConfigFold::rebuild([
            &created(1, "lobby", "olga"),
            &owner_set(
                2,
                None,
                json!({"set": {"rate": 0, "claim-ttl": 1, "loop-max": -5,
                               "max-hops": 1000000, "budget": 99999999999999999u64}}),
            ),
        ]);
        let c = fold.effective("lobby", None);
        assert!(c.is_within_clamps());
        assert_eq!(
            (c.rate, c.claim_ttl_ms, c.loop_max, c.max_hops),
            (1, 1_000, 1, 16)
        );
        assert_eq!(c.budget, Some(crate::config::keys::MAX_BUDGET));
    }

    // ---- property tests -------------------------------------------------------

    fn any_body() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(
            ConfigKey::ALL
                .iter()
                .map(|k| k.as_str().to_string())
                .chain(["bogus".to_string()])
                .collect::<Vec<_>>(),
        );
        let value = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            prop::sample::select(vec!["race", "designated", "bid", "push", "ana", "a b", ""])
                .prop_map(Value::from),
            Just(Value::Null),
            Just(json!(1.5)),
        ];
        prop_oneof![
            3 => (prop::collection::btree_map(key.clone(), value, 0..4),
                  prop::collection::vec(key, 0..3))
                .prop_map(|(set, reset)| json!({"set": set, "reset": reset})),
            1 => Just(json!("garbage")),
        ]
    }

    fn any_rows() -> impl Strategy<Value = Vec<Interaction>> {
        let one = (
            prop::sample::select(vec!["lobby", "den"]),
            proptest::option::of(prop::sample::select(vec!["t1", "t2"])),
            prop::sample::select(vec!["olga", "mallory"]),
            prop::sample::select(vec![Role::Owner, Role::Human, Role::Agent]),
            prop_oneof![1 => Just(true), 6 => Just(false)],
            any_body(),
        );
        prop::collection::vec(one, 0..40).prop_map(|rows| {
            rows.into_iter()
                .enumerate()
                .map(|(i, (room, thread, actor, role, is_create, body))| {
                    let pos = i as u64 + 1;
                    if is_create {
                        row(
                            pos,
                            0,
                            room,
                            None,
                            Verb::RoomCreated,
                            actor,
                            role,
                            json!({"owner": actor}),
                        )
                    } else {
                        row(pos, 0, room, thread, Verb::ConfigSet, actor, role, body)
                    }
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn incremental_equals_rebuild_and_reads_stay_in_clamps(rows in any_rows(), split in 0usize..40) {
            let full = ConfigFold::rebuild(&rows);
            // Incremental: fold a prefix, snapshot, fold the rest.
            let split = split.min(rows.len());
            let mut inc = ConfigFold::rebuild(&rows[..split]);
            let snapshot = inc.clone();
            inc.apply_all(&rows[split..]);
            prop_assert_eq!(inc.state_hash(), full.state_hash());
            prop_assert_eq!(&inc, &full);
            prop_assert_eq!(ConfigFold::rebuild(&rows[..split]), snapshot);
            // Re-applying rows already folded changes nothing (last writer by position).
            let mut again = full.clone();
            again.apply_all(rows.iter().filter(|r| r.verb == Verb::ConfigSet));
            let same: Vec<_> = ["lobby", "den"].iter().flat_map(|r| {
                [None, Some("t1"), Some("t2")].map(|t| (again.effective(r, t), full.effective(r, t)))
            }).collect();
            for (a, b) in same {
                prop_assert_eq!(a, b);
            }
            for room in ["lobby", "den", "nowhere"] {
                for thread in [None, Some("t1"), Some("t2")] {
                    prop_assert!(full.effective(room, thread).is_within_clamps());
                }
            }
        }
    }
}
