//! Agents bound to writers: the `agents` key (`!config agents ada@relay-a,bo@relay-b`).
//!
//! A binding names, for an agent, the writers that may write rows as it. The writer of
//! a row is its `relay` column: on Postgres the writing database role (the database
//! sets and checks it), on SQLite the writer's self-declared relay id. An agent with
//! no binding may be written by anyone, as before; once bound, a row whose actor is
//! the agent (role `agent`) written by any other writer is ignored by every fold that
//! goes through the owner authority, and counted
//! ([`crate::OwnerAuthority::misbound_rows`]). Where rows are written, relays and
//! agent sessions check [`refusal`] first and refuse to act as an agent bound
//! elsewhere.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::keys::{check_agent_name, RoomConfig};
use crate::keys::OwnerKey;
use crate::limits::Limits;
use crate::model::{validate_name, Interaction, Role};

/// Most entries one `agents` (or `relay-keys`) value may hold.
pub const MAX_BINDINGS: usize = 64;

/// One entry of the `relay-keys` key: rows whose writer (`relay`) is `writer` count
/// only when signed by `key` (or another key listed for the same writer).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RelayKey {
    /// The writer (a row's `relay`): a relay id, on Postgres a database role.
    pub writer: String,
    /// Its public key.
    pub key: OwnerKey,
}

impl RelayKey {
    /// Parses `writer=<64 hex digits>`.
    pub fn parse(text: &str) -> Result<RelayKey, String> {
        let (writer, key) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?} is not writer=key"))?;
        check_writer_name(writer)?;
        let key = key
            .parse::<OwnerKey>()
            .map_err(|e| format!("{writer}: {e}"))?;
        Ok(RelayKey {
            writer: writer.to_string(),
            key,
        })
    }
}

impl fmt::Display for RelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.writer, self.key.to_hex())
    }
}

/// The keys registered for `writer` in `list`; empty when it has none.
pub fn keys_of<'a>(
    list: &'a [RelayKey],
    writer: &'a str,
) -> impl Iterator<Item = &'a OwnerKey> + 'a {
    list.iter()
        .filter(move |k| k.writer == writer)
        .map(|k| &k.key)
}

/// One entry of the `agents` key: `agent` may be written by `writer`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AgentBinding {
    /// The agent name.
    pub agent: String,
    /// The writer (a row's `relay`): a relay id, on Postgres a relay's database role.
    pub writer: String,
}

impl AgentBinding {
    /// Parses `agent@writer` (a leading `@` on the agent is allowed, as in mentions).
    pub fn parse(text: &str) -> Result<AgentBinding, String> {
        let text = text.strip_prefix('@').unwrap_or(text);
        let (agent, writer) = text
            .split_once('@')
            .ok_or_else(|| format!("{text:?} is not agent@writer"))?;
        check_agent_name(agent)?;
        check_writer_name(writer)?;
        Ok(AgentBinding {
            agent: agent.to_string(),
            writer: writer.to_string(),
        })
    }
}

impl fmt::Display for AgentBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.agent, self.writer)
    }
}

/// Checks a writer name: a valid name (see [`validate_name`]) without white space,
/// `@` or `,`.
pub fn check_writer_name(name: &str) -> Result<(), String> {
    validate_name("writer", name, &Limits::default()).map_err(|e| e.to_string())?;
    if name
        .chars()
        .any(|c| c.is_whitespace() || c == '@' || c == ',')
    {
        return Err("writer names have no spaces, '@' or ','".into());
    }
    Ok(())
}

/// Sorts and deduplicates a binding (or key) list; `None` when it is too long.
pub(crate) fn normalized<T: Ord>(mut list: Vec<T>) -> Option<Vec<T>> {
    if list.len() > MAX_BINDINGS {
        return None;
    }
    list.sort();
    list.dedup();
    Some(list)
}

/// The writers `agent` is bound to in `list`; empty when it is not bound (anyone may
/// write as it).
pub fn writers_of<'a>(list: &'a [AgentBinding], agent: &str) -> Vec<&'a str> {
    list.iter()
        .filter(|b| b.agent == agent)
        .map(|b| b.writer.as_str())
        .collect()
}

/// Whether `writer` may write rows as `agent` under `list`: the agent is unbound, or
/// bound to `writer` among others.
pub fn may_write_as(list: &[AgentBinding], agent: &str, writer: &str) -> bool {
    let writers = writers_of(list, agent);
    writers.is_empty() || writers.contains(&writer)
}

/// Whether `row` is written as a bound agent (actor = the agent, role `agent`) by a
/// writer `list` does not bind the agent to.
pub fn misbound(list: &[AgentBinding], row: &Interaction) -> bool {
    row.role == Role::Agent && !may_write_as(list, &row.actor, &row.relay)
}

/// Why a writer may not act as an agent: the room's owner bound it to other writers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent {agent:?} is bound to {} in room {room:?} (the owner's `!config agents`), \
     not to this writer {writer:?}; host it there, or ask the owner to add \
     {agent}@{writer}",
    list(writers)
)]
pub struct BoundElsewhere {
    /// The room.
    pub room: String,
    /// The agent.
    pub agent: String,
    /// The writer that asked.
    pub writer: String,
    /// The writers the agent is bound to.
    pub writers: Vec<String>,
}

fn list(writers: &[String]) -> String {
    writers.join(", ")
}

/// The check writers make before acting as `agent` in `room`: `Err` when the room's
/// config binds the agent to writers other than `writer`.
pub fn refusal(
    config: &RoomConfig,
    room: &str,
    agent: &str,
    writer: &str,
) -> Result<(), BoundElsewhere> {
    if may_write_as(&config.agents, agent, writer) {
        return Ok(());
    }
    Err(BoundElsewhere {
        room: room.to_string(),
        agent: agent.to_string(),
        writer: writer.to_string(),
        writers: writers_of(&config.agents, agent)
            .into_iter()
            .map(str::to_string)
            .collect(),
    })
}

/// How a row's writer is proven, by the room's `relay-keys` and
/// `require-signatures` ([`writer_proof`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterProof {
    /// Signed by a key registered for its writer.
    Signed,
    /// Its writer has no registered key and the room does not require signatures:
    /// taken on the `relay` column's word, as before.
    Unproven,
    /// Its writer has no registered key (or it is signed by another key) and the room
    /// requires signatures.
    Unsigned,
    /// Its writer has registered keys and the row is not signed by one of them.
    ForgedWriter,
}

impl WriterProof {
    /// Whether the row may count.
    pub fn passes(self) -> bool {
        matches!(self, WriterProof::Signed | WriterProof::Unproven)
    }
}

/// What the room's `keys` (its `relay-keys`) and `required` (`require-signatures`)
/// make of a row written by `writer` and signed by `signer`.
pub fn writer_proof(
    keys: &[RelayKey],
    required: bool,
    writer: &str,
    signer: Option<&OwnerKey>,
) -> WriterProof {
    let mut registered = keys_of(keys, writer).peekable();
    let has_keys = registered.peek().is_some();
    let signed = signer.is_some_and(|s| registered.any(|k| k == s));
    match (signed, has_keys, required) {
        (true, _, _) => WriterProof::Signed,
        (false, true, _) => WriterProof::ForgedWriter,
        (false, false, true) => WriterProof::Unsigned,
        (false, false, false) => WriterProof::Unproven,
    }
}

/// Why a writer may not write in a room: what it writes would be ignored by every
/// reader, because the room requires signatures or registers keys for this writer and
/// the writer does not sign with one of them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnsignedWriter {
    /// The writer signs nothing.
    #[error(
        "room {room:?} {} and this writer {writer:?} signs nothing, so every reader would \
         ignore its rows; sign with a key (relays: `sign = true` in huddle.toml; other \
         commands: --relay-key PATH or HUDDLE_RELAY_KEY; `huddle writer-key {writer}` \
         makes one) and ask the owner to register it with `!config relay-keys \
         {writer}=<key>`",
        requirement(registered)
    )]
    NotSigning {
        /// The room.
        room: String,
        /// The writer.
        writer: String,
        /// Keys the room registers for this writer (empty: it requires signatures).
        registered: Vec<String>,
    },
    /// The writer signs with a key the room does not register for it.
    #[error(
        "room {room:?} {} and this writer {writer:?} signs with key {key}, which is not \
         registered for it, so every reader would ignore its rows; ask the owner to add \
         {writer}={key} to `!config relay-keys`",
        requirement(registered)
    )]
    OtherKey {
        /// The room.
        room: String,
        /// The writer.
        writer: String,
        /// The key it signs with, hex.
        key: String,
        /// Keys the room registers for this writer, short hex.
        registered: Vec<String>,
    },
}

fn requirement(registered: &[String]) -> String {
    if registered.is_empty() {
        "requires signed rows (the owner's `!config require-signatures on`)".to_string()
    } else {
        format!(
            "registers the keys {} for this writer (the owner's `!config relay-keys`)",
            registered.join(", ")
        )
    }
}

/// The check writers make before writing in a room: `Err` when the room's config would
/// make every reader ignore rows by `writer` signed by `signer` (`None`: unsigned).
pub fn signing_refusal(
    config: &RoomConfig,
    room: &str,
    writer: &str,
    signer: Option<&OwnerKey>,
) -> Result<(), UnsignedWriter> {
    if writer_proof(
        &config.relay_keys,
        config.require_signatures,
        writer,
        signer,
    )
    .passes()
    {
        return Ok(());
    }
    let registered: Vec<String> = keys_of(&config.relay_keys, writer)
        .map(OwnerKey::short)
        .collect();
    Err(match signer {
        None => UnsignedWriter::NotSigning {
            room: room.to_string(),
            writer: writer.to_string(),
            registered,
        },
        Some(key) => UnsignedWriter::OtherKey {
            room: room.to_string(),
            writer: writer.to_string(),
            key: key.to_hex(),
            registered,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(agent: &str, writer: &str) -> AgentBinding {
        AgentBinding {
            agent: agent.into(),
            writer: writer.into(),
        }
    }

    #[test]
    fn entries_parse_and_bad_ones_say_why() {
        assert_eq!(AgentBinding::parse("ada@relay-a"), Ok(b("ada", "relay-a")));
        assert_eq!(AgentBinding::parse("@ada@r0"), Ok(b("ada", "r0")));
        assert_eq!(b("ada", "r0").to_string(), "ada@r0");
        for bad in [
            "ada", "@relay", "ada@", "ada@r@s", "a b@r", "ada@r/s", "a/b@r",
        ] {
            assert!(AgentBinding::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unbound_agent_is_anyones_and_a_bound_one_only_its_writers() {
        let config = RoomConfig {
            agents: vec![b("ada", "r0"), b("ada", "r2"), b("bo", "r1")],
            ..RoomConfig::default()
        };
        let list = &config.agents;
        assert!(may_write_as(list, "ada", "r0"));
        assert!(may_write_as(list, "ada", "r2"));
        assert!(!may_write_as(list, "ada", "r1"));
        assert!(may_write_as(list, "cy", "anyone"));
        let err = refusal(&config, "lobby", "ada", "r1").unwrap_err();
        assert_eq!(err.writers, ["r0", "r2"]);
        assert_eq!(
            err.to_string(),
            "agent \"ada\" is bound to r0, r2 in room \"lobby\" (the owner's `!config \
             agents`), not to this writer \"r1\"; host it there, or ask the owner to add \
             ada@r1"
        );
        assert!(refusal(&config, "lobby", "bo", "r1").is_ok());
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;
    use crate::keys::OwnerSecret;

    fn key(seed: u8) -> OwnerKey {
        OwnerSecret::from_seed([seed; 32]).public()
    }

    #[test]
    fn relay_key_entries_parse_and_bad_ones_say_why() {
        let k = key(1);
        let entry = RelayKey::parse(&format!("r0={}", k.to_hex())).unwrap();
        assert_eq!(entry.writer, "r0");
        assert_eq!(entry.key, k);
        assert_eq!(entry.to_string(), format!("r0={}", k.to_hex()));
        for bad in [
            "r0".to_string(),
            format!("={}", k.to_hex()),
            "r0=abc".to_string(),
            format!("r 0={}", k.to_hex()),
            format!("r@0={}", k.to_hex()),
        ] {
            assert!(RelayKey::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_writers_rows_count_only_with_its_keys_once_it_has_some() {
        let (k0, k0b, k1, other) = (key(1), key(2), key(3), key(9));
        let keys = vec![
            RelayKey {
                writer: "r0".into(),
                key: k0,
            },
            RelayKey {
                writer: "r0".into(),
                key: k0b,
            },
            RelayKey {
                writer: "r1".into(),
                key: k1,
            },
        ];
        use WriterProof::*;
        for required in [false, true] {
            assert_eq!(writer_proof(&keys, required, "r0", Some(&k0)), Signed);
            assert_eq!(writer_proof(&keys, required, "r0", Some(&k0b)), Signed);
            assert_eq!(writer_proof(&keys, required, "r0", Some(&k1)), ForgedWriter);
            assert_eq!(writer_proof(&keys, required, "r0", None), ForgedWriter);
            assert_eq!(
                writer_proof(&keys, required, "r1", Some(&other)),
                ForgedWriter
            );
        }
        // A writer with no registered key: as before, unless signatures are required.
        assert_eq!(writer_proof(&keys, false, "cli", None), Unproven);
        assert_eq!(writer_proof(&keys, false, "cli", Some(&other)), Unproven);
        assert_eq!(writer_proof(&keys, true, "cli", None), Unsigned);
        assert_eq!(writer_proof(&keys, true, "cli", Some(&other)), Unsigned);
        assert_eq!(writer_proof(&[], false, "r0", None), Unproven);
    }

    #[test]
    fn writers_are_told_what_to_register() {
        let k0 = key(1);
        let config = RoomConfig {
            relay_keys: vec![RelayKey {
                writer: "r0".into(),
                key: k0,
            }],
            require_signatures: true,
            ..RoomConfig::default()
        };
        assert!(signing_refusal(&config, "lobby", "r0", Some(&k0)).is_ok());
        let err = signing_refusal(&config, "lobby", "cli", None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("requires signed rows")
                && text.contains("signs nothing")
                && text.contains("`huddle writer-key cli`")
                && text.contains("!config relay-keys cli=<key>"),
            "{text}"
        );
        let other = key(5);
        let err = signing_refusal(&config, "lobby", "r0", Some(&other)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("registers the keys {}", k0.short()))
                && text.contains(&format!("add r0={}", other.to_hex())),
            "{text}"
        );
        let open = RoomConfig::default();
        assert!(signing_refusal(&open, "lobby", "cli", None).is_ok());
    }
}
