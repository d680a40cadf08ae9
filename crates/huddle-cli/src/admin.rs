//! `huddle admin`: database roles on Postgres (plan 0017). The work is done by
//! `huddle_store::postgres::admin`; this module parses flags and prints.
//!
//! Every subcommand is idempotent. On SQLite there are no roles: `init` applies the
//! migrations and says so; the others fail with an explanation.

use clap::Subcommand;
use huddle_store::postgres::admin::{self, LoginKind};
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
}

const SQLITE_HAS_NO_ROLES: &str = "SQLite has no database roles: whoever can write the \
database file can write anything, so give only the relays' user write access to it \
(see docs/security.md). `huddle admin` roles are for Postgres";

/// Runs one admin command against `db`.
pub async fn run(db: &str, options: StoreOptions, command: AdminCommand) -> anyhow::Result<()> {
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
