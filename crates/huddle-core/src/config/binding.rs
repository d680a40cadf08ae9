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
use crate::limits::Limits;
use crate::model::{validate_name, Interaction, Role};

/// Most entries one `agents` value may hold.
pub const MAX_BINDINGS: usize = 64;

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

/// Sorts and deduplicates a binding list; `None` when it is too long.
pub(crate) fn normalized(mut list: Vec<AgentBinding>) -> Option<Vec<AgentBinding>> {
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
