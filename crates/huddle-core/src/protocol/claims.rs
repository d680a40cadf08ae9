//! Claim keys and the values that name a claim.
//!
//! | key | holder | what it elects |
//! |---|---|---|
//! | `reply/<room>/<message>` | agent key | the one agent that answers a message |
//! | `drive/<room>/<agent>/<message>` | relay id | the one relay that drives that agent's reply turn |
//! | `task/<room>/<task>` | agent key (driver: relay id) | the one owner of a task (epoch = fencing token), and the one relay that drives its turn (plan 0094) |
//! | `taskdrive/<room>/<task>` | relay id | the one relay that drives the owner's task turn (relays before plan 0094) |
//! | `review/<room>/<task>` | agent key | the reviewer's one verdict on a task's submission |
//! | `reviewdrive/<room>/<task>` | relay id | the one relay that drives the review turn |
//! | `cmdresult/<room>/<command>` | relay id | the one relay that writes an owner command's results |
//!
//! Task and review keys end in `/<generation>` from a task's generation 1 on (after
//! the owner's `!retry` or a reviewer's rejection).
//!
//! `<message>` is the message's interaction id in hex (64 digits). Rooms, agents and
//! task ids never contain `/`, so keys parse back unambiguously.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::InteractionId;

/// A claim's fencing token: strictly increases every time the claim changes hands or
/// is re-taken after expiry (the store's `Epoch` is this type). The first epoch of a
/// claim is [`ClaimEpoch::FIRST`]; "no epoch" is `Option<ClaimEpoch>`, never a
/// number. Encoded as the bare number (serde-transparent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimEpoch(pub i64);

impl ClaimEpoch {
    /// The epoch a claim is first granted at; bodies carrying a lower one are malformed.
    pub const FIRST: ClaimEpoch = ClaimEpoch(1);

    /// The number, as stored.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// The epoch after this one (saturating).
    pub const fn next(self) -> ClaimEpoch {
        ClaimEpoch(self.0.saturating_add(1))
    }

    /// Whether this is an epoch a claim can be held at (at least [`Self::FIRST`]).
    pub const fn is_valid(self) -> bool {
        self.0 >= Self::FIRST.0
    }
}

impl fmt::Display for ClaimEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A claim held at an epoch: what a fenced append presents and what renew / release
/// name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    /// The claim key.
    pub key: String,
    /// The holder (agent key or relay id).
    pub holder: String,
    /// The epoch it is held at.
    pub epoch: ClaimEpoch,
}

/// A parsed claim key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKey {
    /// `reply/<room>/<message>`.
    Reply {
        /// Room.
        room: String,
        /// Message id.
        message: InteractionId,
    },
    /// `reply/<room>/<message>/<agent>`: one named agent's reply claim on a message
    /// that names several.
    DirectedReply {
        /// Room.
        room: String,
        /// Message id.
        message: InteractionId,
        /// The named agent.
        agent: String,
    },
    /// `drive/<room>/<agent>/<message>`.
    Drive {
        /// Room.
        room: String,
        /// Agent.
        agent: String,
        /// Message id.
        message: InteractionId,
    },
    /// `task/<room>/<task>`.
    Task {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The task's generation (0 until the owner retries it).
        generation: u32,
    },
    /// `taskdrive/<room>/<task>` (`/<generation>` after an owner's `!retry`).
    TaskDrive {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The task's generation (0 until the owner retries it).
        generation: u32,
    },
    /// `review/<room>/<task>[/<generation>]`: the reviewer's claim on the submission
    /// of a task's generation.
    Review {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The task's generation the submission was made in.
        generation: u32,
    },
    /// `reviewdrive/<room>/<task>[/<generation>]`.
    ReviewDrive {
        /// Room.
        room: String,
        /// Task id.
        task: String,
        /// The task's generation the submission was made in.
        generation: u32,
    },
}

/// A generation in a task claim key: a whole number from 1, without leading zeros.
fn parse_generation(text: &str) -> Option<u32> {
    (!text.starts_with('0') && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

impl ClaimKey {
    /// Parses a key; `None` for any other shape.
    pub fn parse(key: &str) -> Option<Self> {
        let parts: Vec<&str> = key.split('/').collect();
        let nonempty = parts.iter().all(|p| !p.is_empty());
        if !nonempty {
            return None;
        }
        match parts.as_slice() {
            ["reply", room, msg] => Some(ClaimKey::Reply {
                room: room.to_string(),
                message: msg.parse().ok()?,
            }),
            ["reply", room, msg, agent] => Some(ClaimKey::DirectedReply {
                room: room.to_string(),
                message: msg.parse().ok()?,
                agent: agent.to_string(),
            }),
            ["drive", room, agent, msg] => Some(ClaimKey::Drive {
                room: room.to_string(),
                agent: agent.to_string(),
                message: msg.parse().ok()?,
            }),
            ["task", room, task] => Some(ClaimKey::Task {
                room: room.to_string(),
                task: task.to_string(),
                generation: 0,
            }),
            ["task", room, task, g] => Some(ClaimKey::Task {
                room: room.to_string(),
                task: task.to_string(),
                generation: parse_generation(g)?,
            }),
            ["taskdrive", room, task] => Some(ClaimKey::TaskDrive {
                room: room.to_string(),
                task: task.to_string(),
                generation: 0,
            }),
            ["taskdrive", room, task, g] => Some(ClaimKey::TaskDrive {
                room: room.to_string(),
                task: task.to_string(),
                generation: parse_generation(g)?,
            }),
            ["review", room, task] => Some(ClaimKey::Review {
                room: room.to_string(),
                task: task.to_string(),
                generation: 0,
            }),
            ["review", room, task, g] => Some(ClaimKey::Review {
                room: room.to_string(),
                task: task.to_string(),
                generation: parse_generation(g)?,
            }),
            ["reviewdrive", room, task] => Some(ClaimKey::ReviewDrive {
                room: room.to_string(),
                task: task.to_string(),
                generation: 0,
            }),
            ["reviewdrive", room, task, g] => Some(ClaimKey::ReviewDrive {
                room: room.to_string(),
                task: task.to_string(),
                generation: parse_generation(g)?,
            }),
            _ => None,
        }
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimKey::Reply { room, message } => write!(f, "reply/{room}/{message}"),
            ClaimKey::DirectedReply {
                room,
                message,
                agent,
            } => write!(f, "reply/{room}/{message}/{agent}"),
            ClaimKey::Drive {
                room,
                agent,
                message,
            } => write!(f, "drive/{room}/{agent}/{message}"),
            ClaimKey::Task {
                room,
                task,
                generation,
            } => f.write_str(&task_key_at(room, task, *generation)),
            ClaimKey::TaskDrive {
                room,
                task,
                generation,
            } => f.write_str(&taskdrive_key_at(room, task, *generation)),
            ClaimKey::Review {
                room,
                task,
                generation,
            } => f.write_str(&review_key(room, task, *generation)),
            ClaimKey::ReviewDrive {
                room,
                task,
                generation,
            } => f.write_str(&reviewdrive_key(room, task, *generation)),
        }
    }
}

/// `reply/<room>/<message>`.
pub fn reply_key(room: &str, message: &InteractionId) -> String {
    format!("reply/{room}/{message}")
}

/// `reply/<room>/<message>/<agent>`: the reply claim of one named agent on a message
/// that names several (each answers once).
pub fn directed_reply_key(room: &str, message: &InteractionId, agent: &str) -> String {
    format!("reply/{room}/{message}/{agent}")
}

/// The reply claim `agent` answers `message` under: its own when the message names
/// several agents (`each`), the message's one claim otherwise.
pub fn reply_key_for(room: &str, message: &InteractionId, agent: &str, each: bool) -> String {
    if each {
        directed_reply_key(room, message, agent)
    } else {
        reply_key(room, message)
    }
}

/// `drive/<room>/<agent>/<message>`.
pub fn drive_key(room: &str, agent: &str, message: &InteractionId) -> String {
    format!("drive/{room}/{agent}/{message}")
}

/// `cmdresult/<room>/<command>`: the one relay that writes the results of an owner
/// command (plan 0090); the write of the last result rows closes it.
pub fn command_result_key(room: &str, command: &InteractionId) -> String {
    format!("cmdresult/{room}/{command}")
}

/// `task/<room>/<task>`.
pub fn task_key(room: &str, task: &str) -> String {
    format!("task/{room}/{task}")
}

/// `taskdrive/<room>/<task>`.
pub fn taskdrive_key(room: &str, task: &str) -> String {
    format!("taskdrive/{room}/{task}")
}

/// The task claim of a task's `generation`: `task/<room>/<task>` for generation 0,
/// `task/<room>/<task>/<generation>` after the owner's `!retry` (a retried task is
/// claimed under a fresh key: the old one is closed).
pub fn task_key_at(room: &str, task: &str, generation: u32) -> String {
    if generation == 0 {
        task_key(room, task)
    } else {
        format!("task/{room}/{task}/{generation}")
    }
}

/// The drive claim of a task's `generation` (see [`task_key_at`]).
pub fn taskdrive_key_at(room: &str, task: &str, generation: u32) -> String {
    if generation == 0 {
        taskdrive_key(room, task)
    } else {
        format!("taskdrive/{room}/{task}/{generation}")
    }
}

/// The reviewer's claim on the submission of a task's `generation`:
/// `review/<room>/<task>` for generation 0, `review/<room>/<task>/<generation>` after.
pub fn review_key(room: &str, task: &str, generation: u32) -> String {
    if generation == 0 {
        format!("review/{room}/{task}")
    } else {
        format!("review/{room}/{task}/{generation}")
    }
}

/// The drive claim of a review turn (see [`review_key`]).
pub fn reviewdrive_key(room: &str, task: &str, generation: u32) -> String {
    if generation == 0 {
        format!("reviewdrive/{room}/{task}")
    } else {
        format!("reviewdrive/{room}/{task}/{generation}")
    }
}

/// The kinds of claim key that belong to one room: `<kind>/<room>/...` (resource
/// claims are `resource/<room>/...`, leases `lease/<room>/...`). Every other kind
/// (`relay/<id>`) belongs to no room. Postgres's `huddle_claim_room` (migration 0012)
/// holds the same list (`cmdresult` since migration 0017).
pub const ROOM_CLAIM_KINDS: &[&str] = &[
    "reply",
    "drive",
    "task",
    "taskdrive",
    "review",
    "reviewdrive",
    "lease",
    "resource",
    "cmdresult",
];

/// The room a claim key belongs to, when it is of a room-scoped kind
/// ([`ROOM_CLAIM_KINDS`]); names hold no `/`, so the room is the second segment.
pub fn room_of_claim(key: &str) -> Option<&str> {
    let mut parts = key.split('/');
    let kind = parts.next()?;
    let room = parts.next().filter(|r| !r.is_empty())?;
    ROOM_CLAIM_KINDS.contains(&kind).then_some(room)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_know_their_room() {
        assert_eq!(room_of_claim("task/lobby/t1"), Some("lobby"));
        assert_eq!(room_of_claim("taskdrive/lobby/t1/2"), Some("lobby"));
        assert_eq!(
            room_of_claim("resource/lobby/ada/exclusive/file:src/**"),
            Some("lobby")
        );
        assert_eq!(room_of_claim("lease/lobby/coordinator"), Some("lobby"));
        assert_eq!(
            room_of_claim(&command_result_key("lobby", &InteractionId([2; 32]))),
            Some("lobby")
        );
        assert_eq!(room_of_claim("relay/lobby"), None);
        assert_eq!(room_of_claim("task//t1"), None);
        assert_eq!(room_of_claim("task"), None);
        assert_eq!(room_of_claim(&task_key("r", "t")), Some("r"));
        assert_eq!(room_of_claim(&review_key("r", "t", 3)), Some("r"));
        assert_eq!(
            room_of_claim(&drive_key("r", "a", &InteractionId([1; 32]))),
            Some("r")
        );
    }

    #[test]
    fn keys_round_trip() {
        let m = InteractionId([7; 32]);
        for key in [
            reply_key("lobby", &m),
            directed_reply_key("lobby", &m, "bo"),
            reply_key_for("lobby", &m, "bo", false),
            drive_key("lobby", "bo", &m),
            task_key("lobby", "api-1"),
            taskdrive_key("lobby", "api-1"),
            task_key_at("lobby", "api-1", 2),
            taskdrive_key_at("lobby", "api-1", 12),
            review_key("lobby", "api-1", 0),
            review_key("lobby", "api-1", 3),
            reviewdrive_key("lobby", "api-1", 0),
            reviewdrive_key("lobby", "api-1", 3),
        ] {
            let parsed = ClaimKey::parse(&key).expect(&key);
            assert_eq!(parsed.to_string(), key);
        }
        assert_ne!(
            reply_key_for("lobby", &m, "bo", true),
            reply_key_for("lobby", &m, "cy", true),
            "each named agent has its own reply claim"
        );
        for bad in [
            "",
            "reply/lobby",
            "task//x",
            "nope/a/b",
            "reply/lobby/zz",
            "reply/lobby/zz/bo",
        ] {
            assert_eq!(ClaimKey::parse(bad), None, "{bad}");
        }
    }
}

/// The effect key of a task: stable across every attempt, epoch and relay, different
/// for every task and room (32 hex digits). Agents pass it to external systems as an
/// idempotency key (`Idempotency-Key` of a payment API, a request id, a file name), so
/// an execution that repeats after a crash repeats no effect.
pub fn task_effect_key(room: &str, task: &str) -> String {
    let h = super::fields::hash_parts(&["huddle.effect.v1", room, "task", task]);
    hex_prefix(h.as_bytes())
}

/// The effect key of a task's work in review round `round` (the rejections so far):
/// round 0 is [`task_effect_key`]; every redo after a reviewer's rejection has its own
/// key, so the external system does not answer a redo with the rejected effect.
pub fn task_round_effect_key(room: &str, task: &str, round: u32) -> String {
    if round == 0 {
        return task_effect_key(room, task);
    }
    let r = round.to_string();
    let h = super::fields::hash_parts(&["huddle.effect.v1", room, "task", task, "round", &r]);
    hex_prefix(h.as_bytes())
}

/// The effect key of the review of a task's round `round` (1-based): stable across
/// the attempts of that review, different for every round and task.
pub fn review_effect_key(room: &str, task: &str, round: u32) -> String {
    let r = round.to_string();
    let h = super::fields::hash_parts(&["huddle.effect.v1", room, "review", task, &r]);
    hex_prefix(h.as_bytes())
}

/// The effect key of one agent's answer to a message: stable across attempts and
/// relays; each named agent answering a message has its own.
pub fn message_effect_key(room: &str, message: &InteractionId, agent: &str) -> String {
    let h = super::fields::hash_parts(&[
        "huddle.effect.v1",
        room,
        "message",
        &message.to_hex(),
        agent,
    ]);
    hex_prefix(h.as_bytes())
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod effect_key_tests {
    use super::*;

    #[test]
    fn effect_keys_are_stable_per_subject_and_differ_across_subjects() {
        let k = task_effect_key("lobby", "t1");
        assert_eq!(k, task_effect_key("lobby", "t1"));
        assert_eq!(k.len(), 32);
        assert_ne!(k, task_effect_key("lobby", "t2"));
        assert_ne!(k, task_effect_key("other", "t1"));
        assert_eq!(task_round_effect_key("lobby", "t1", 0), k);
        assert_ne!(task_round_effect_key("lobby", "t1", 1), k);
        assert_ne!(
            task_round_effect_key("lobby", "t1", 1),
            task_round_effect_key("lobby", "t1", 2)
        );
        let m = InteractionId::from_slice(&[7; 32]).unwrap();
        assert_ne!(
            message_effect_key("lobby", &m, "ada"),
            message_effect_key("lobby", &m, "bo")
        );
    }
}
