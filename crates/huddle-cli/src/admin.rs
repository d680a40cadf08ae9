//! `huddle admin`: database roles on Postgres (plan 0017). The work is done by
//! `huddle_store::postgres::admin`; this module parses flags and prints.
//!
//! Every role subcommand is idempotent. On SQLite there are no roles: `init` applies
//! the migrations and says so; the others fail with an explanation. `token` (agents'
//! bearer tokens for `huddle mcp --http`, plan 0023) works on both backends. The
//! agent bindings the database enforces on Postgres (`bind-agent`, `unbind-agent`,
//! `bindings`, `sync-agents`; plan 0032) are kept here too. `prune-claims` (plan
//! 0057) works on both backends.

use clap::Subcommand;
use huddle_store::postgres::admin::{self, LoginKind};
use huddle_store::tokens::{Removal, TokenStore};
use huddle_store::{parse_url, Backend, StoreOptions};

/// `huddle admin ...` (run with the database administrator's URL in `--db`).
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Create the schema owner and the group roles (huddle_relay, huddle_writer,
    /// huddle_reader), apply migrations as the owner, grant each group its rights.
    Init,
    /// Create relay NAME's login role (a member of huddle_relay) and print its
    /// connection URL with a new password; again for an existing relay, a new
    /// password.
    AddRelay {
        /// The role name: the relay's id is a good choice.
        name: String,
    },
    /// Remove relay NAME's role (its sessions end; its rows stay attributed to it).
    RemoveRelay {
        /// The role name.
        name: String,
    },
    /// Create the login role of a room owner or person who posts (huddle_writer:
    /// reads and appends, no claims) and print its URL.
    AddOwner {
        /// The role name.
        name: String,
    },
    /// Remove an owner's role.
    RemoveOwner {
        /// The role name.
        name: String,
    },
    /// Create a read-only login role (huddle_reader) and print its URL.
    AddReader {
        /// The role name.
        name: String,
    },
    /// Remove a reader's role.
    RemoveReader {
        /// The role name.
        name: String,
    },
    /// Let only the relay role RELAY (and others bound the same way) write as AGENT in
    /// ROOM: the database refuses rows as the agent from any other role. Keep it equal
    /// to the owner's `!config agents` (`sync-agents` copies it).
    BindAgent {
        /// The room.
        room: String,
        /// The agent.
        agent: String,
        /// The relay's database role.
        relay: String,
    },
    /// Remove AGENT's binding to RELAY in ROOM, or all of the agent's bindings there
    /// when RELAY is not given (the database then lets any role write as it).
    UnbindAgent {
        /// The room.
        room: String,
        /// The agent.
        agent: String,
        /// The relay's database role [default: every one].
        relay: Option<String>,
    },
    /// The bindings the database enforces (room, agent, relay role).
    Bindings {
        /// Only this room.
        room: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Make ROOM's database bindings exactly the owner's signed `!config agents` (read
    /// from the ledger through the owner authority: only a verified binding counts).
    SyncAgents {
        /// The room.
        room: String,
    },
    /// Remove claim rows that can never matter again: relay leases (`relay/<id>`)
    /// expired for longer than --older-than, and every claim of an archived room.
    /// Claims of live rooms are never removed (their epochs must never go back, and a
    /// closed one must stay closed). Both backends; on Postgres as the administrator.
    PruneClaims {
        /// How long a relay lease must have been expired to go (`168h`, `12h`, `30m`).
        #[arg(long, value_name = "DURATION", default_value = "168h")]
        older_than: String,
    },
    /// Agents' bearer tokens for `huddle mcp --http`: `add`, `list`, `remove`.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

/// `huddle admin token ...`
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Make a token that acts as agent KEY in room ROOM and print it (shown once:
    /// only its hash is stored).
    Add {
        /// The agent the token acts as.
        #[arg(long)]
        agent: String,
        /// The room it acts in.
        #[arg(long)]
        room: String,
        /// Capabilities the agent declares (comma-separated).
        #[arg(long, value_delimiter = ',')]
        capabilities: Vec<String>,
    },
    /// The tokens (ids, agents, rooms; no secrets).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove the token ID, or every token of --agent (in --room); servers refuse it
    /// from their next request on.
    Remove {
        /// The token's id (as `list` shows it, or the whole token).
        #[arg(required_unless_present = "agent", conflicts_with = "agent")]
        id: Option<String>,
        /// Every token of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// With --agent: only its tokens in this room.
        #[arg(long, requires = "agent")]
        room: Option<String>,
    },
}

const SQLITE_HAS_NO_ROLES: &str = "SQLite has no database roles: whoever can write the \
database file can write anything, so give only the relays' user write access to it \
(see docs/security.md). `huddle admin` roles are for Postgres";

/// Runs one admin command against `db`.
pub async fn run(db: &str, options: StoreOptions, command: AdminCommand) -> anyhow::Result<()> {
    if let AdminCommand::Token { command } = command {
        return token(db, options, command).await;
    }
    if let AdminCommand::PruneClaims { older_than } = command {
        return crate::archive_cmds::prune_claims(db, options, &older_than).await;
    }
    let url = match parse_url(db)? {
        Backend::Postgres(url) => url,
        Backend::Sqlite(_) => {
            return match command {
                AdminCommand::Init => {
                    huddle_store::open(db, options).await?;
                    println!("migrations applied to {db}; {SQLITE_HAS_NO_ROLES}.");
                    Ok(())
                }
                _ => anyhow::bail!("{SQLITE_HAS_NO_ROLES}."),
            };
        }
    };
    match command {
        AdminCommand::Init => {
            let applied = admin::init(&url).await?;
            println!(
                "roles {}, {}, {}, {} ready; migrations applied as {}: {:?}",
                admin::OWNER_ROLE,
                admin::RELAY_ROLE,
                admin::WRITER_ROLE,
                admin::READER_ROLE,
                admin::OWNER_ROLE,
                applied
            );
        }
        AdminCommand::AddRelay { name } => add(&url, &name, LoginKind::Relay).await?,
        AdminCommand::AddOwner { name } => add(&url, &name, LoginKind::Owner).await?,
        AdminCommand::AddReader { name } => add(&url, &name, LoginKind::Reader).await?,
        AdminCommand::Token { .. } | AdminCommand::PruneClaims { .. } => {
            unreachable!("handled above, on both backends")
        }
        AdminCommand::BindAgent { room, agent, relay } => {
            if admin::bind_agent(&url, &room, &agent, &relay).await? {
                eprintln!("agent {agent} in room {room} is bound to role {relay}");
            } else {
                eprintln!("agent {agent} in room {room} was already bound to role {relay}");
            }
            print_bindings(&admin::bindings(&url, Some(&room)).await?, false)?;
        }
        AdminCommand::UnbindAgent { room, agent, relay } => {
            let n = admin::unbind_agent(&url, &room, &agent, relay.as_deref()).await?;
            eprintln!("{n} binding(s) of agent {agent} in room {room} removed");
        }
        AdminCommand::Bindings { room, json } => {
            print_bindings(&admin::bindings(&url, room.as_deref()).await?, json)?;
        }
        AdminCommand::SyncAgents { room } => {
            let store = crate::ledger_cmds::open(db, options).await?;
            let config = crate::ledger_cmds::room_authority(store.as_ref(), &room).await?;
            if config.owner(&room).is_none() {
                anyhow::bail!("room {room} does not exist in {db}");
            }
            let wanted: Vec<(String, String)> = config
                .effective(&room, None)
                .agents
                .into_iter()
                .map(|b| (b.agent, b.writer))
                .collect();
            let (added, removed) = admin::set_bindings(&url, &room, &wanted).await?;
            for b in &added {
                eprintln!("bound {} to role {} in room {room}", b.agent, b.writer);
            }
            for b in &removed {
                eprintln!("unbound {} from role {} in room {room}", b.agent, b.writer);
            }
            eprintln!(
                "room {room}: the database now enforces the owner's binding ({} entries; {} added, {} removed)",
                wanted.len(),
                added.len(),
                removed.len()
            );
            print_bindings(&admin::bindings(&url, Some(&room)).await?, false)?;
        }
        AdminCommand::RemoveRelay { name }
        | AdminCommand::RemoveOwner { name }
        | AdminCommand::RemoveReader { name } => {
            if admin::remove_login(&url, &name).await? {
                eprintln!("role {name} removed");
            } else {
                eprintln!("no role {name}: nothing to remove");
            }
        }
    }
    Ok(())
}

/// Prints bindings, one `room agent relay` line each (or a JSON array).
fn print_bindings(list: &[admin::Binding], json: bool) -> anyhow::Result<()> {
    if json {
        let rows: Vec<serde_json::Value> = list
            .iter()
            .map(|b| serde_json::json!({"room": b.room, "agent": b.agent, "relay": b.writer}))
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    for b in list {
        println!("{} {} {}", b.room, b.agent, b.writer);
    }
    Ok(())
}

/// Creates (or re-keys) a login and prints its URL alone on stdout, so a script can
/// capture it; what happened goes to stderr.
async fn add(url: &str, name: &str, kind: LoginKind) -> anyhow::Result<()> {
    let login = admin::add_login(url, name, kind).await?;
    if login.existed {
        eprintln!(
            "role {name} existed: it is in {} with a new password",
            kind.group()
        );
    } else {
        eprintln!("role {name} created in {}", kind.group());
    }
    println!("{}", login.url);
    Ok(())
}

/// `huddle admin token ...`. `add` prints the token alone on stdout, so a script can
/// capture it; what happened goes to stderr.
async fn token(db: &str, options: StoreOptions, command: TokenCommand) -> anyhow::Result<()> {
    let tokens = TokenStore::open(db).await?;
    match command {
        TokenCommand::Add {
            agent,
            room,
            capabilities,
        } => {
            huddle_core::config::check_agent_name(&agent)
                .map_err(|e| anyhow::anyhow!("--agent: {e}"))?;
            huddle_core::validate_name("room", &room, &huddle_core::Limits::default())
                .map_err(|e| anyhow::anyhow!("--room: {e}"))?;
            if let Some(bad) = capabilities
                .iter()
                .find(|c| !huddle_core::tasks::valid_capability(c))
            {
                anyhow::bail!("capability {bad:?}: 1 to 64 bytes, no white space");
            }
            let store = crate::ledger_cmds::open(db, options).await?;
            if crate::ledger_cmds::room_owner(store.as_ref(), &room)
                .await?
                .is_none()
            {
                eprintln!(
                    "warning: room {room} does not exist yet: the token is refused until \
                     it is created (`huddle room create {room} --owner ...`)"
                );
            }
            let made = tokens.add(&agent, &room, capabilities).await?;
            eprintln!(
                "token {} acts as agent {agent} in room {room}; it is shown once, only its hash is stored",
                made.info.id
            );
            println!("{}", made.token);
        }
        TokenCommand::List { json } => {
            let list = tokens.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.is_empty() {
                println!("no tokens");
            } else {
                for t in list {
                    println!(
                        "{}  agent {}  room {}  capabilities [{}]  made {}",
                        t.id,
                        t.agent,
                        t.room,
                        t.capabilities.join(","),
                        crate::output::format_time(huddle_core::Timestamp(t.created_us))
                    );
                }
            }
        }
        TokenCommand::Remove { id, agent, room } => {
            let which = match (id, agent) {
                (Some(id), _) => Removal::Id(
                    huddle_store::tokens::token_id(&id).map_or(id.clone(), str::to_string),
                ),
                (None, Some(agent)) => Removal::Agent { agent, room },
                (None, None) => anyhow::bail!("name a token id or --agent"),
            };
            let removed = tokens.remove(&which).await?;
            if removed.is_empty() {
                eprintln!("no such token: nothing to remove");
            }
            for t in removed {
                eprintln!(
                    "token {} (agent {} in room {}) removed",
                    t.id, t.agent, t.room
                );
            }
        }
    }
    Ok(())
}
