//! Room configuration: the topology (responder and allocation policies) and the
//! limits the room owner tunes with `!config`.
//!
//! - [`RoomConfig`] is the typed, effective configuration that policies, guards and
//!   synchronization decisions read.
//! - [`ConfigKey`] names every tunable key; each numeric key has [`Bounds`] that a
//!   value is clamped into when it is parsed ([`ConfigKey::parse_value`], which
//!   reports the clamp as a [`ClampNote`]) and again when it is read
//!   ([`RoomConfig::clamped`]): chat can tune a protection but never switch it off.
//! - [`ConfigSetBody`] is the body of a `config.set` interaction.
//! - [`ConfigFold`] folds `room.created` and `config.set` into room and thread
//!   overlays and answers [`ConfigFold::effective`].
//!
//! The grammar of the `!config` command is parsed above this module, in `commands`;
//! the reference for users is `docs/protocol/commands.md`.

pub mod binding;
mod fold;
mod keys;

pub use binding::{refusal, AgentBinding, BoundElsewhere};
pub use fold::{ConfigFold, ConfigSource, ExplainedSetting};
pub(crate) use keys::shorten;
pub use keys::{
    check_agent_name, format_duration, parse_duration, Allocation, Bounds, ClampLimit, ClampNote,
    ConfigKey, ConfigSetBody, ConfigValue, GroupReply, Responder, RoomConfig, Topology, UnknownKey,
    ValueError, ValueKind, MAX_BUDGET, MAX_DELEGATORS,
};
