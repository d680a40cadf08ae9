//! Shared resources: names, modes, the conflict rule, claim keys, the bodies of the
//! `resource.*` rows and their fold.
//!
//! A **resource** is a name `kind:rest` — `file:src/**/*.rs`, `api:github`,
//! `slot:build`. For kind `file`, `rest` is a path glob ([`crate::glob`]) and two file
//! resources *touch* when their globs overlap (some path matches both); for any other
//! kind two resources touch only when their names are equal. A resource is taken in a
//! [`Mode`]: `exclusive`, `shared`, or as one of `n` permits.
//!
//! **The rule** ([`blockers`]): a wanted resource is blocked by every live holding of
//! *another* holder that touches it and
//! - any holding, when it is wanted exclusive, or the holding is exclusive;
//! - a holding that is not shared, when it is wanted shared;
//! - when it is wanted as one of `n` permits: a holding that is not a permit, or, when
//!   the touching permit holdings plus this one would exceed the least `n` any of them
//!   (or this request) names, every touching permit holding.
//!
//! A holder's own holdings never block it; taking a resource again in another mode
//! replaces its holding. A set of resources is taken **all or nothing**, examined in
//! the global order (the canonical names' byte order, then the mode), in one
//! transaction of the store (`Claims::acquire_resources`): nobody ever holds part of
//! a set while waiting for the rest, so two sets cannot deadlock. Each holding is the
//! claim `resource/<room>/<holder>/<mode>/<name>` ([`resource_key`]); its epoch and
//! expiry are the claim's, judged by the database clock.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::glob::{Glob, GlobError};
use crate::model::{Interaction, Timestamp};
use crate::protocol::ClaimEpoch;
use crate::verbs::Verb;

/// The longest resource name, in bytes.
pub const MAX_RESOURCE_BYTES: usize = 1024;
/// The most resources one acquisition takes.
pub const MAX_RESOURCES_PER_CALL: usize = 64;
/// The most permits a resource may have.
pub const MAX_PERMITS: u32 = 1000;
/// Claim keys of resources start with this.
pub const RESOURCE_KEY_PREFIX: &str = "resource/";
/// The `reason` of a `resource.released` row that gives back holdings no
/// `resource.acquired` row records: a relay took them for a task whose turn then did
/// not start (its claim lapsed or was superseded meanwhile, or the relay stopped).
pub const UNUSED_HOLDINGS: &str = "unused";

/// A resource name in canonical form.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName {
    text: String,
    kind_len: usize,
}

/// Why a resource name, mode or request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The name is malformed.
    #[error("resource {name:?}: {reason}")]
    BadName {
        /// The text given.
        name: String,
        /// What is wrong, and what to write.
        reason: String,
    },
    /// The glob of a `file:` resource is malformed.
    #[error("resource {name:?}: {source}")]
    BadGlob {
        /// The text given.
        name: String,
        /// What is wrong with the glob.
        source: GlobError,
    },
    /// The mode is malformed.
    #[error("mode {0:?}: use exclusive, shared or permits-N (N from 1 to {MAX_PERMITS})")]
    BadMode(String),
    /// The set of wanted resources is empty, too large or names one twice.
    #[error("{0}")]
    BadRequest(String),
}

impl ResourceName {
    /// Parses `kind:rest`: `kind` is 1 to 32 of `a-z 0-9 - _` starting with a letter;
    /// `rest` is a path glob for `file`, any other non-empty text without control
    /// characters or surrounding white space otherwise.
    pub fn parse(text: &str) -> Result<ResourceName, ResourceError> {
        let bad = |reason: &str| ResourceError::BadName {
            name: text.to_string(),
            reason: reason.to_string(),
        };
        let Some((kind, rest)) = text.split_once(':') else {
            return Err(bad(
                "needs a kind: write kind:name, e.g. file:src/**, api:github, slot:build",
            ));
        };
        let kind_ok = (1..=32).contains(&kind.len())
            && kind.starts_with(|c: char| c.is_ascii_lowercase())
            && kind
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !kind_ok {
            return Err(bad(
                "its kind must be 1 to 32 of a-z, 0-9, '-', '_', starting with a letter",
            ));
        }
        let rest = if kind == "file" {
            Glob::parse(rest)
                .map_err(|source| ResourceError::BadGlob {
                    name: text.to_string(),
                    source,
                })?
                .as_str()
                .to_string()
        } else {
            if rest.is_empty() {
                return Err(bad("has an empty name after the kind"));
            }
            if rest.chars().any(char::is_control) || rest.trim() != rest {
                return Err(bad(
                    "must not contain control characters or start or end with white space",
                ));
            }
            rest.to_string()
        };
        let canonical = format!("{kind}:{rest}");
        if canonical.len() > MAX_RESOURCE_BYTES {
            return Err(bad(&format!("is longer than {MAX_RESOURCE_BYTES} bytes")));
        }
        Ok(ResourceName {
            text: canonical,
            kind_len: kind.len(),
        })
    }

    /// The canonical text, `kind:rest`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The kind (`file`, `api`, `slot`, ...).
    pub fn kind(&self) -> &str {
        &self.text[..self.kind_len]
    }

    /// What follows the kind: the glob of a file resource, the name of any other.
    pub fn rest(&self) -> &str {
        &self.text[self.kind_len + 1..]
    }

    /// The glob of a `file:` resource.
    pub fn glob(&self) -> Option<Glob> {
        (self.kind() == "file")
            .then(|| Glob::parse(self.rest()).ok())
            .flatten()
    }

    /// Whether the two resources can stand for a common thing: overlapping globs for
    /// `file:`, equal names otherwise.
    pub fn touches(&self, other: &ResourceName) -> bool {
        if self.kind() != other.kind() {
            return false;
        }
        if self.text == other.text {
            return true;
        }
        match (self.glob(), other.glob()) {
            (Some(a), Some(b)) => a.overlaps(&b),
            _ => false,
        }
    }

    /// Whether a file resource covers `path` (repository-relative).
    pub fn covers_path(&self, path: &str) -> bool {
        self.glob().is_some_and(|g| g.matches(path))
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for ResourceName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ResourceName::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How a resource is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nobody else may hold anything touching it.
    Exclusive,
    /// Others may hold it shared too.
    Shared,
    /// One of at most `n` holders.
    Permits(u32),
}

impl Mode {
    /// Parses `exclusive`, `shared` or `permits-N`.
    pub fn parse(text: &str) -> Result<Mode, ResourceError> {
        match text {
            "exclusive" => Ok(Mode::Exclusive),
            "shared" => Ok(Mode::Shared),
            other => other
                .strip_prefix("permits-")
                .filter(|n| !n.starts_with('0') && n.chars().all(|c| c.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| (1..=MAX_PERMITS).contains(n))
                .map(Mode::Permits)
                .ok_or_else(|| ResourceError::BadMode(other.to_string())),
        }
    }

    /// `exclusive`, `shared` or `permits-N`: the text of claim keys and bodies.
    pub fn as_text(&self) -> String {
        match self {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Permits(n) => format!("permits-{n}"),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_text())
    }
}

impl Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_text())
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Mode::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One resource wanted in a mode.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Wanted {
    /// The resource.
    pub name: ResourceName,
    /// How.
    pub mode: Mode,
}

/// A live holding of a resource: one claim row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    /// The claim key.
    pub key: String,
    /// Who holds it.
    pub holder: String,
    /// The resource.
    pub name: ResourceName,
    /// How.
    pub mode: Mode,
    /// The claim's epoch (a fencing token for side effects).
    pub epoch: ClaimEpoch,
    /// When it lapses unless renewed (database clock).
    pub expires_at: Timestamp,
}

/// A wanted resource and a holding that blocks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// The resource wanted.
    pub wanted: ResourceName,
    /// The holding in the way.
    pub by: Holding,
}

/// Checks a set of wanted resources and puts it in the global order: 1 to
/// [`MAX_RESOURCES_PER_CALL`] resources, none named twice.
pub fn ordered(mut wanted: Vec<Wanted>) -> Result<Vec<Wanted>, ResourceError> {
    if wanted.is_empty() {
        return Err(ResourceError::BadRequest(
            "name at least one resource".into(),
        ));
    }
    if wanted.len() > MAX_RESOURCES_PER_CALL {
        return Err(ResourceError::BadRequest(format!(
            "{} resources in one call; at most {MAX_RESOURCES_PER_CALL}",
            wanted.len()
        )));
    }
    wanted.sort();
    if let Some(w) = wanted.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(ResourceError::BadRequest(format!(
            "resource {} is named twice; take each once, in one mode",
            w[0].name
        )));
    }
    Ok(wanted)
}

/// Every holding of `live` (holdings by anyone, live at the database clock) that
/// blocks `holder` from taking `wanted`, by the rule of the module documentation; in
/// the order of `wanted`, then of `live`. Empty when the whole set may be taken.
pub fn blockers(holder: &str, wanted: &[Wanted], live: &[Holding]) -> Vec<Blocked> {
    let mut out = Vec::new();
    for w in wanted {
        let touching: Vec<&Holding> = live
            .iter()
            .filter(|h| h.holder != holder && h.name.touches(&w.name))
            .collect();
        let blocking: Vec<&Holding> = match w.mode {
            Mode::Exclusive => touching,
            Mode::Shared => touching
                .into_iter()
                .filter(|h| h.mode != Mode::Shared)
                .collect(),
            Mode::Permits(n) => {
                let others: Vec<&Holding> = touching
                    .iter()
                    .copied()
                    .filter(|h| !matches!(h.mode, Mode::Permits(_)))
                    .collect();
                if !others.is_empty() {
                    others
                } else {
                    let cap = touching
                        .iter()
                        .filter_map(|h| match h.mode {
                            Mode::Permits(m) => Some(m),
                            _ => None,
                        })
                        .fold(n, u32::min);
                    if touching.len() < cap as usize {
                        Vec::new()
                    } else {
                        touching
                    }
                }
            }
        };
        out.extend(blocking.into_iter().map(|h| Blocked {
            wanted: w.name.clone(),
            by: h.clone(),
        }));
    }
    out
}

/// The claim key of `holder`'s holding of `name` in `mode` in `room`:
/// `resource/<room>/<holder>/<mode>/<name>` (room, holder and mode have no `/`).
pub fn resource_key(room: &str, holder: &str, mode: Mode, name: &ResourceName) -> String {
    format!("{RESOURCE_KEY_PREFIX}{room}/{holder}/{mode}/{name}")
}

/// The prefix of every resource claim key of `room`.
pub fn room_prefix(room: &str) -> String {
    format!("{RESOURCE_KEY_PREFIX}{room}/")
}

/// The prefix of every resource claim key of `holder` in `room`.
pub fn holder_prefix(room: &str, holder: &str) -> String {
    format!("{RESOURCE_KEY_PREFIX}{room}/{holder}/")
}

/// Reads a resource claim key back: `(room, holder, mode, name)`. `None` for a key
/// that is not one [`resource_key`] makes.
pub fn parse_resource_key(key: &str) -> Option<(&str, &str, Mode, ResourceName)> {
    let rest = key.strip_prefix(RESOURCE_KEY_PREFIX)?;
    let mut parts = rest.splitn(4, '/');
    let room = parts.next().filter(|s| !s.is_empty())?;
    let holder = parts.next().filter(|s| !s.is_empty())?;
    let mode = Mode::parse(parts.next()?).ok()?;
    let name = ResourceName::parse(parts.next()?).ok()?;
    Some((room, holder, mode, name))
}

/// One resource in a `resource.*` row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBody {
    /// The resource.
    pub name: ResourceName,
    /// How it is held.
    pub mode: Mode,
    /// The claim's epoch.
    pub epoch: ClaimEpoch,
}

/// The body of `resource.acquired`, `resource.renewed` and `resource.released`:
/// the holdings the actor took, renewed or gave back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRowBody {
    /// The holdings.
    pub resources: Vec<HeldBody>,
    /// The lease length asked (acquired, renewed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// When the holdings lapse unless renewed, as the database answered (acquired,
    /// renewed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// What for (acquired, renewed): a note people and agents see on the board; on a
    /// release, [`UNUSED_HOLDINGS`] when no acquisition recorded the holdings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A holding as the ledger records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedHolding {
    /// Who holds it.
    pub holder: String,
    /// The resource.
    pub name: ResourceName,
    /// How.
    pub mode: Mode,
    /// The claim's epoch.
    pub epoch: ClaimEpoch,
    /// When it was taken (the acquisition row's time).
    pub since: Timestamp,
    /// When it lapses unless renewed.
    pub expires_at: Timestamp,
    /// What for, when the holder said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The fold of `resource.*` rows: per room, who holds what, how and until when, as
/// the holders recorded it. The claims table is the truth for contention; this is
/// what the board and the `<coordination>` block show.
///
/// Per `(holder, resource)` the holding with the highest epoch counts (a lower one is
/// stale); `resource.renewed` moves its expiry, `resource.released` at its epoch ends
/// it, and a holding past its expiry is lapsed at any `now` after.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceFold {
    rooms: BTreeMap<String, BTreeMap<(String, ResourceName), RecordedHolding>>,
    malformed: BTreeMap<String, u64>,
}

impl ResourceFold {
    /// Nothing folded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The holdings of `room` still live at `now`, by resource then holder.
    pub fn held(&self, room: &str, now: Timestamp) -> Vec<RecordedHolding> {
        let mut out: Vec<RecordedHolding> = self
            .rooms
            .get(room)
            .into_iter()
            .flat_map(|r| r.values())
            .filter(|h| h.expires_at > now)
            .cloned()
            .collect();
        out.sort_by(|a, b| (&a.name, &a.holder).cmp(&(&b.name, &b.holder)));
        out
    }

    /// Whether a `resource.acquired` row of `holder` recorded `name` at `epoch` (and no
    /// release at that epoch has ended it yet), lapsed or not.
    pub fn records(
        &self,
        room: &str,
        holder: &str,
        name: &ResourceName,
        epoch: ClaimEpoch,
    ) -> bool {
        self.rooms
            .get(room)
            .and_then(|r| r.get(&(holder.to_string(), name.clone())))
            .is_some_and(|h| h.epoch == epoch)
    }

    /// Rows of `room` whose body could not be read.
    pub fn malformed(&self, room: &str) -> u64 {
        self.malformed.get(room).copied().unwrap_or(0)
    }
}

impl Fold for ResourceFold {
    fn apply(&mut self, row: &Interaction) {
        if !matches!(
            row.verb,
            Verb::ResourceAcquired | Verb::ResourceRenewed | Verb::ResourceReleased
        ) {
            return;
        }
        let Ok(body) = serde_json::from_value::<ResourceRowBody>(row.body.clone()) else {
            *self.malformed.entry(row.room.clone()).or_default() += 1;
            return;
        };
        let room = self.rooms.entry(row.room.clone()).or_default();
        for r in body.resources {
            let slot = (row.actor.clone(), r.name.clone());
            match row.verb {
                Verb::ResourceAcquired => {
                    let Some(expires_at) = body.expires_at else {
                        continue;
                    };
                    if room.get(&slot).is_some_and(|h| h.epoch > r.epoch) {
                        continue;
                    }
                    let since = match room.get(&slot) {
                        Some(h) if h.epoch == r.epoch && h.mode == r.mode => h.since,
                        _ => row.at,
                    };
                    room.insert(
                        slot,
                        RecordedHolding {
                            holder: row.actor.clone(),
                            name: r.name,
                            mode: r.mode,
                            epoch: r.epoch,
                            since,
                            expires_at,
                            reason: body.reason.clone(),
                        },
                    );
                }
                Verb::ResourceRenewed => {
                    if let (Some(h), Some(t)) = (room.get_mut(&slot), body.expires_at) {
                        if h.epoch == r.epoch && h.mode == r.mode {
                            h.expires_at = h.expires_at.max(t);
                        }
                    }
                }
                _ => {
                    if room
                        .get(&slot)
                        .is_some_and(|h| h.epoch == r.epoch && h.mode == r.mode)
                    {
                        room.remove(&slot);
                    }
                }
            }
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        let flat: Vec<(&String, Vec<&RecordedHolding>)> = self
            .rooms
            .iter()
            .map(|(room, held)| (room, held.values().collect()))
            .collect();
        hash_state(&(flat, &self.malformed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn held(holder: &str, n: &str, mode: Mode) -> Holding {
        let name = name(n);
        Holding {
            key: resource_key("r", holder, mode, &name),
            holder: holder.into(),
            name,
            mode,
            epoch: ClaimEpoch(1),
            expires_at: Timestamp(10),
        }
    }

    fn want(n: &str, mode: Mode) -> Wanted {
        Wanted {
            name: name(n),
            mode,
        }
    }

    #[test]
    fn names_are_canonical_and_checked() {
        assert_eq!(name("file:src/***/x").as_str(), "file:src/**/x");
        assert_eq!(name("api:github").kind(), "api");
        assert_eq!(name("api:github").rest(), "github");
        for bad in [
            "github",
            ":x",
            "File:x",
            "api:",
            "api: x",
            "file:/etc",
            "9x:y",
        ] {
            assert!(ResourceName::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(name("file:src/**").touches(&name("file:src/a.rs")));
        assert!(!name("file:src/**").touches(&name("api:src/a.rs")));
        assert!(!name("api:a*").touches(&name("api:ab")), "only files glob");
        assert!(name("file:src/**").covers_path("src/x/y.rs"));
    }

    #[test]
    fn modes_round_trip() {
        for m in [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Permits(1),
            Mode::Permits(12),
        ] {
            assert_eq!(Mode::parse(&m.as_text()), Ok(m));
        }
        for bad in ["permits-0", "permits-01", "permits-", "permits-1001", "x"] {
            assert!(Mode::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_round_trip() {
        let n = name("file:src/**/*.rs");
        let key = resource_key("room", "ada", Mode::Permits(3), &n);
        assert_eq!(key, "resource/room/ada/permits-3/file:src/**/*.rs");
        assert_eq!(
            parse_resource_key(&key),
            Some(("room", "ada", Mode::Permits(3), n))
        );
        assert_eq!(parse_resource_key("task/room/t"), None);
        assert_eq!(parse_resource_key("resource/room/ada/weird/file:x"), None);
    }

    #[test]
    fn the_conflict_rule() {
        let live = [
            held("a", "file:src/**", Mode::Exclusive),
            held("b", "file:docs/**", Mode::Shared),
            held("c", "slot:build", Mode::Permits(2)),
        ];
        let blocked = |holder: &str, w: Wanted| {
            blockers(holder, &[w], &live)
                .into_iter()
                .map(|b| b.by.holder)
                .collect::<Vec<_>>()
        };
        assert_eq!(blocked("x", want("file:src/a.rs", Mode::Shared)), ["a"]);
        assert_eq!(
            blocked("a", want("file:src/a.rs", Mode::Exclusive)),
            Vec::<String>::new()
        );
        assert_eq!(
            blocked("x", want("file:docs/a.md", Mode::Shared)),
            Vec::<String>::new()
        );
        assert_eq!(blocked("x", want("file:docs/a.md", Mode::Exclusive)), ["b"]);
        assert_eq!(
            blocked("x", want("file:**/*.md", Mode::Exclusive)),
            ["a", "b"]
        );
        assert_eq!(
            blocked("x", want("file:README.md", Mode::Exclusive)),
            Vec::<String>::new()
        );
        assert_eq!(
            blocked("x", want("slot:build", Mode::Permits(2))),
            Vec::<String>::new()
        );
        // The least count named wins: c said 2, so a request naming 1 is full.
        assert_eq!(blocked("x", want("slot:build", Mode::Permits(1))), ["c"]);
        assert_eq!(blocked("x", want("slot:build", Mode::Shared)), ["c"]);
        let mut full = live.to_vec();
        full.push(held("d", "slot:build", Mode::Permits(2)));
        assert_eq!(
            blockers("x", &[want("slot:build", Mode::Permits(5))], &full)
                .into_iter()
                .map(|b| b.by.holder)
                .collect::<Vec<_>>(),
            ["c", "d"]
        );
    }

    #[test]
    fn requests_are_ordered_and_checked() {
        let w = ordered(vec![
            want("slot:build", Mode::Permits(2)),
            want("api:github", Mode::Exclusive),
            want("file:b", Mode::Shared),
        ])
        .unwrap();
        let names: Vec<&str> = w.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["api:github", "file:b", "slot:build"]);
        assert!(ordered(vec![]).is_err());
        assert!(ordered(vec![
            want("api:x", Mode::Shared),
            want("api:x", Mode::Exclusive)
        ])
        .is_err());
    }

    #[test]
    fn the_fold_follows_acquire_renew_release_and_expiry() {
        use crate::model::Role;
        let row = |verb, actor: &str, body: serde_json::Value, at: i64| {
            crate::testing::row("r", verb, actor, Role::Agent, Timestamp(at), body)
        };
        let held = |epoch: i64| serde_json::json!({"name": "file:src/**", "mode": "exclusive", "epoch": epoch});
        let mut f = ResourceFold::new();
        f.apply(&row(
            Verb::ResourceAcquired,
            "ada",
            serde_json::json!({"resources": [held(2)], "ttl_ms": 1, "expires_at": 100}),
            10,
        ));
        assert_eq!(f.held("r", Timestamp(50)).len(), 1);
        assert!(
            f.held("r", Timestamp(100)).is_empty(),
            "lapsed at its expiry"
        );
        f.apply(&row(
            Verb::ResourceRenewed,
            "ada",
            serde_json::json!({"resources": [held(2)], "ttl_ms": 1, "expires_at": 200}),
            60,
        ));
        let h = f.held("r", Timestamp(150));
        assert_eq!(
            (h[0].since, h[0].expires_at),
            (Timestamp(10), Timestamp(200))
        );
        // A stale epoch changes nothing; the release at the epoch ends it.
        f.apply(&row(
            Verb::ResourceReleased,
            "ada",
            serde_json::json!({"resources": [held(1)]}),
            70,
        ));
        assert_eq!(f.held("r", Timestamp(150)).len(), 1);
        f.apply(&row(
            Verb::ResourceReleased,
            "ada",
            serde_json::json!({"resources": [held(2)]}),
            80,
        ));
        assert!(f.held("r", Timestamp(150)).is_empty());
        f.apply(&row(
            Verb::ResourceAcquired,
            "bo",
            serde_json::json!({"resources": "no"}),
            90,
        ));
        assert_eq!(f.malformed("r"), 1);
    }
}
