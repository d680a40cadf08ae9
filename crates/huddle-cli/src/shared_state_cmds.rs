//! `huddle state get|put|list ROOM [KEY]`: a room's versioned shared state. `get` and
//! `list` fold the room's `state.put` rows; `put` is the `state_put` tool of an agent
//! (`--agent`), with `--if-version` the version read: a stale put writes nothing,
//! prints the current version and value and exits with status 4.

use std::fmt::Write as _;

use clap::Subcommand;
use huddle_agent::resource_views::{StatePutArgs, StateView};
use huddle_agent::{AgentError, AgentSession, Patterns};
use huddle_core::Fold as _;
use huddle_store::StoreOptions;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::{emit, fold_admitted};
use crate::task_cmds::{refusal, show};

/// The exit status of a put refused as stale.
pub const EXIT_STALE: u8 = 4;

/// A put refused because the key moved on (exit status [`EXIT_STALE`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Stale(pub String);

/// `huddle state ...`
#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// A key's current version and value (version 0 when never put).
    Get {
        /// The room.
        room: String,
        /// The key.
        key: String,
        /// Also print every earlier version.
        #[arg(long)]
        history: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Write the next version of a key as an agent (the `state_put` tool).
    Put {
        /// The room.
        room: String,
        /// The key (1 to 256 bytes; `/` allowed).
        key: String,
        /// The value: JSON (`42`, `"text"`, `{"a": 1}`); anything that is not JSON is
        /// taken as a string.
        value: String,
        /// The agent writing.
        #[arg(long)]
        agent: String,
        /// The version read: refused (exit status 4, nothing written) when the key
        /// has moved on since. Without it the last writer wins.
        #[arg(long)]
        if_version: Option<u64>,
        /// Take VALUE as a string even when it parses as JSON.
        #[arg(long)]
        string: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Every key of the room with its current version and value.
    List {
        /// The room.
        room: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

fn view_line(out: &mut String, v: &StateView) {
    if v.version == 0 {
        let _ = writeln!(out, "{}: never put (version 0)", v.key);
        return;
    }
    let _ = write!(out, "{} = {} (version {}", v.key, v.value, v.version);
    if let Some(by) = &v.by {
        let _ = write!(out, " by {by}");
    }
    if let Some(at) = v.at {
        let _ = write!(out, " at {}", format_time(at));
    }
    out.push_str(")\n");
    for h in &v.history {
        let _ = writeln!(
            out,
            "  version {}: {} by {} at {}",
            h.version,
            h.value,
            h.by,
            format_time(h.at)
        );
    }
}

/// The room's shared state, folded.
async fn fold(db: &str, options: StoreOptions, room: &str) -> anyhow::Result<Patterns> {
    let store = ledger_cmds::open(db, options).await?;
    let mut patterns = Patterns::new();
    fold_admitted(&*store, room, |r| patterns.apply(r)).await?;
    Ok(patterns)
}

/// Runs a `huddle state` subcommand.
pub async fn run(db: &str, options: StoreOptions, c: StateCommand) -> anyhow::Result<()> {
    match c {
        StateCommand::Get {
            room,
            key,
            history,
            json,
        } => {
            huddle_core::shared_state::check_key(&key).map_err(anyhow::Error::msg)?;
            let p = fold(db, options, &room).await?;
            let v = huddle_agent::state_view_of(p.shared_state(), &room, &key, history);
            let mut out = String::new();
            view_line(&mut out, &v);
            show(json, &v, || out.trim_end().to_string())
        }
        StateCommand::List { room, json } => {
            let p = fold(db, options, &room).await?;
            let views: Vec<StateView> = p
                .shared_state()
                .list(&room)
                .into_iter()
                .map(|(k, _)| huddle_agent::state_view_of(p.shared_state(), &room, k, false))
                .collect();
            if json {
                return emit(&format!("{}\n", serde_json::to_string_pretty(&views)?));
            }
            let mut out = String::new();
            if views.is_empty() {
                let _ = writeln!(out, "room {room}: no shared state");
            }
            for v in &views {
                view_line(&mut out, v);
            }
            emit(&out)
        }
        StateCommand::Put {
            room,
            key,
            value,
            agent,
            if_version,
            string,
            json,
        } => {
            let value = if string {
                serde_json::Value::String(value)
            } else {
                serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value))
            };
            let store = ledger_cmds::open(db, options).await?;
            let me = AgentSession::open(store, &room, &agent, Vec::new())
                .await
                .map_err(refusal)?;
            match me
                .state_put(StatePutArgs {
                    key,
                    value,
                    if_version,
                })
                .await
            {
                Ok(w) => {
                    let mut out = String::new();
                    view_line(&mut out, &w.state);
                    show(json, &w, || out.trim_end().to_string())
                }
                Err(e @ AgentError::StaleVersion { .. }) => {
                    Err(Stale(format!("[{}] {e}", e.code())).into())
                }
                Err(e) => Err(refusal(e)),
            }
        }
    }
}
