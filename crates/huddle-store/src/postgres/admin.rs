//! Database roles on Postgres: the set-up `huddle admin` runs.
//!
//! | role | login | may |
//! |---|---|---|
//! | [`OWNER_ROLE`] | no | own every huddle table, function and trigger; only migrations use it |
//! | [`READER_ROLE`] | no (group) | read `interaction`, `external_claim`, `huddle_migration` |
//! | [`WRITER_ROLE`] | no (group) | the reader's rights, insert interactions (people, owners), and archive a room it created (`huddle_room_archive`) |
//! | [`RELAY_ROLE`] | no (group) | the writer's rights, use claims through the `huddle_claim_*` functions, and read `agent_token` (`huddle mcp --http`) |
//!
//! Each relay, owner or reader logs in with a role of its own that is a member of one
//! group, so the rows it writes are attributed to it by the database (`relay` is
//! `session_user`) and its claims are its own. Nobody but [`OWNER_ROLE`] (and the
//! superuser) may update, delete or truncate interactions, change claims directly,
//! alter the tables or disable their triggers.
//!
//! The administrator also keeps `agent_binding` (migration 0006, plan 0032): which
//! relay roles may write as which agent of a room ([`bind_agent`], [`unbind_agent`],
//! [`bindings`], [`set_bindings`]); the insert check refuses a role-`agent` row whose
//! actor is bound in its room to other roles.
//!
//! Everything here is idempotent: running it again changes nothing that is already
//! right. It needs a connection that may create roles and give away ownership (the
//! cluster's superuser, or the database owner with `CREATEROLE` that is a member of
//! [`OWNER_ROLE`]).

use tokio_postgres::{Client, Config, NoTls};

use super::errors::map_pg;
use crate::{Result, StoreError};

/// The role that owns the schema; only migrations act as it.
pub const OWNER_ROLE: &str = "huddle_owner";
/// The read-only group role.
pub const READER_ROLE: &str = "huddle_reader";
/// Group role of people and owners: read, and insert interactions.
pub const WRITER_ROLE: &str = "huddle_writer";
/// Group role of relays: write, and use claims.
pub const RELAY_ROLE: &str = "huddle_relay";

/// The claim functions a relay may call (migrations 0003 on), with their signatures.
const CLAIM_FUNCTIONS: &[&str] = &[
    "huddle_claim_acquire(text, text, bigint)",
    "huddle_claim_renew(text, text, bigint, bigint)",
    "huddle_claim_release(text, text, bigint)",
    "huddle_claim_fence(text, text, bigint)",
    "huddle_claim_fence_close(text, text, bigint, bytea)",
    "huddle_resource_acquire(text, text, text[], text[], bigint)",
    "huddle_claim_acquire_batch(text[], text[], bigint[], int[])",
    "huddle_append_under(text[], text[], bigint[], bytea, bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[])",
    "huddle_handoff(text[], text[], bigint[], int[], int[], int[], bigint[], int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[])",
    "huddle_claim_acquire_batch(text[], text[], bigint[], int[], text[])",
    "huddle_handoff(text[], text[], bigint[], int[], int[], int[], bigint[], int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[], text[])",
];

/// The function an owner archives a room with (migration 0012). Owners (the writer
/// group) may call it; relays inherit the right through the writer group and are
/// refused inside it, as is any role but the one that created the room (the
/// administrator excepted). Pruning claims (`huddle_prune_claims`) is granted to
/// nobody: the administrator runs it as the schema owner.
const ARCHIVE_FUNCTION: &str = "huddle_room_archive(text, bigint, bytea, text, text, text)";

/// The kinds of login role [`add_login`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginKind {
    /// A relay: member of [`RELAY_ROLE`].
    Relay,
    /// A room owner or person posting with the CLI: member of [`WRITER_ROLE`].
    Owner,
    /// A reader (dashboards, `huddle tail`): member of [`READER_ROLE`].
    Reader,
}

impl LoginKind {
    /// The group role it joins.
    pub fn group(self) -> &'static str {
        match self {
            LoginKind::Relay => RELAY_ROLE,
            LoginKind::Owner => WRITER_ROLE,
            LoginKind::Reader => READER_ROLE,
        }
    }
}

/// What [`add_login`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Login {
    /// The role name.
    pub role: String,
    /// Its new password (generated).
    pub password: String,
    /// Whether the role already existed (its password was replaced).
    pub existed: bool,
    /// A connection URL for it: the admin URL with this role's name and password.
    pub url: String,
}

/// Whether `name` may be a huddle login role: 1..=63 bytes of `[A-Za-z0-9_-]`, not
/// starting with `pg_` or `huddle_` (reserved for the system and the group roles).
pub fn valid_login_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!("role name {name:?} must be 1 to 63 bytes long"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "role name {name:?} may hold only letters, digits, '_' and '-'"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("pg_") || lower.starts_with("huddle_") {
        return Err(format!(
            "role name {name:?} is reserved (names starting with pg_ or huddle_)"
        ));
    }
    Ok(())
}

/// `name` quoted as an SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn connect(url: &str) -> Result<(Client, tokio::task::JoinHandle<()>)> {
    let config: Config = url
        .parse()
        .map_err(|e| StoreError::Config(format!("bad Postgres URL: {e}")))?;
    let (client, connection) = config.connect(NoTls).await.map_err(map_pg)?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, driver))
}

fn admin_err(what: &str, e: tokio_postgres::Error) -> StoreError {
    match map_pg(e) {
        StoreError::Unavailable(m) => StoreError::Unavailable(m),
        StoreError::Backend(m) => StoreError::Backend(format!(
            "{what}: {m} (huddle admin needs the database administrator: a superuser, \
             or the database owner with CREATEROLE)"
        )),
        other => other,
    }
}

/// Creates the group roles when missing.
async fn ensure_groups(client: &Client) -> Result<()> {
    for role in [OWNER_ROLE, READER_ROLE, WRITER_ROLE, RELAY_ROLE] {
        let exists = role_exists(client, role).await?;
        if !exists {
            // Two admins racing: the loser's "already exists" is fine. (Roles are
            // cluster-wide, so two inits of different databases race too; when both
            // insert at once the loser sees the catalog's unique index instead.)
            if let Err(e) = client
                .batch_execute(&format!("CREATE ROLE {} NOLOGIN", ident(role)))
                .await
            {
                if !lost_a_race(&e) {
                    return Err(admin_err(&format!("creating role {role}"), e));
                }
            }
        }
    }
    let grants = format!(
        "GRANT {reader} TO {writer}; GRANT {writer} TO {relay};",
        reader = ident(READER_ROLE),
        writer = ident(WRITER_ROLE),
        relay = ident(RELAY_ROLE),
    );
    // Granted again once when a concurrent init granted the same membership first.
    match client.batch_execute(&grants).await {
        Err(e) if lost_a_race(&e) => client.batch_execute(&grants).await,
        other => other,
    }
    .map_err(|e| admin_err("granting the group roles", e))
}

/// Whether a catalog change failed only because a concurrent session made the same
/// change first (an object that now exists, the catalog's unique index, or a catalog
/// row updated concurrently).
fn lost_a_race(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    match e.code() {
        Some(c) if *c == SqlState::DUPLICATE_OBJECT || *c == SqlState::UNIQUE_VIOLATION => true,
        Some(c) if *c == SqlState::INTERNAL_ERROR => e
            .as_db_error()
            .is_some_and(|d| d.message().contains("concurrently updated")),
        _ => false,
    }
}

async fn role_exists(client: &Client, role: &str) -> Result<bool> {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)",
            &[&role],
        )
        .await
        .map_err(map_pg)?
        .try_get(0)
        .map_err(map_pg)
}

/// `huddle admin init`: the group roles, the schema owned by [`OWNER_ROLE`] (existing
/// huddle objects are handed to it), migrations applied as it, and the grants of each
/// group. Returns the migrations now applied.
pub async fn init(url: &str) -> Result<Vec<i64>> {
    let (mut client, driver) = connect(url).await?;
    let result = init_on(&mut client).await;
    drop(client);
    let _ = driver.await;
    result
}

async fn init_on(client: &mut Client) -> Result<Vec<i64>> {
    ensure_groups(client).await?;
    let owner = ident(OWNER_ROLE);
    client
        .batch_execute(&format!(
            "GRANT USAGE, CREATE ON SCHEMA public TO {owner};
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
        ))
        .await
        .map_err(|e| admin_err("granting the schema to its owner", e))?;
    // The one who runs init must be able to act as the owner (a superuser always can).
    let is_super: bool = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(map_pg)?
        .try_get(0)
        .map_err(map_pg)?;
    if is_super {
        // Readers pass over transactions running in other databases only when they
        // can see them (docs/operations.md, "Postgres requirements").
        client
            .batch_execute(&format!(
                "GRANT pg_read_all_stats TO {}",
                ident(READER_ROLE)
            ))
            .await
            .map_err(|e| admin_err("granting pg_read_all_stats", e))?;
    } else {
        client
            .batch_execute(&format!("GRANT {owner} TO CURRENT_USER"))
            .await
            .map_err(|e| admin_err("joining the schema owner role", e))?;
    }
    // Huddle objects created before init (by a relay or `huddle migrate`) move to the
    // owner role; nothing else in the schema is touched.
    let tables = client
        .query(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind = 'r'
               AND c.relname IN ('interaction', 'external_claim', 'huddle_migration',
                                 'agent_token', 'agent_binding', 'resource_scope',
                                 'archived_room')
               AND pg_get_userbyid(c.relowner) <> $1",
            &[&OWNER_ROLE],
        )
        .await
        .map_err(map_pg)?;
    for row in tables {
        let name: String = row.try_get(0).map_err(map_pg)?;
        client
            .batch_execute(&format!("ALTER TABLE {} OWNER TO {owner}", ident(&name)))
            .await
            .map_err(|e| admin_err(&format!("handing table {name} to {OWNER_ROLE}"), e))?;
    }
    let functions = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND p.proname LIKE 'huddle\\_%'
               AND pg_get_userbyid(p.proowner) <> $1",
            &[&OWNER_ROLE],
        )
        .await
        .map_err(map_pg)?;
    for row in functions {
        let signature: String = row.try_get(0).map_err(map_pg)?;
        client
            .batch_execute(&format!("ALTER FUNCTION {signature} OWNER TO {owner}"))
            .await
            .map_err(|e| admin_err(&format!("handing function {signature} to {OWNER_ROLE}"), e))?;
    }
    client
        .batch_execute(&format!("SET ROLE {owner}"))
        .await
        .map_err(|e| admin_err("acting as the schema owner", e))?;
    super::migrate::migrate_on(client).await?;
    client.batch_execute("RESET ROLE").await.map_err(map_pg)?;
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .map_err(map_pg)?
        .try_get(0)
        .map_err(map_pg)?;
    let reader = ident(READER_ROLE);
    let writer = ident(WRITER_ROLE);
    let relay = ident(RELAY_ROLE);
    let mut grants = format!(
        "GRANT CONNECT ON DATABASE {db} TO {reader};
         GRANT USAGE ON SCHEMA public TO {reader};
         REVOKE ALL ON interaction, external_claim, huddle_migration FROM PUBLIC;
         GRANT SELECT ON interaction, external_claim, huddle_migration TO {reader};
         GRANT INSERT ON interaction TO {writer};
         REVOKE ALL ON agent_token FROM PUBLIC;
         GRANT SELECT ON agent_token TO {relay};
         REVOKE ALL ON agent_binding FROM PUBLIC;
         GRANT SELECT ON agent_binding TO {reader};
         GRANT EXECUTE ON FUNCTION {ARCHIVE_FUNCTION} TO {writer};\n",
        db = ident(&db),
    );
    for f in CLAIM_FUNCTIONS {
        grants.push_str(&format!("GRANT EXECUTE ON FUNCTION {f} TO {relay};\n"));
    }
    client
        .batch_execute(&grants)
        .await
        .map_err(|e| admin_err("granting the group roles their rights", e))?;
    let applied = client
        .query("SELECT version FROM huddle_migration ORDER BY version", &[])
        .await
        .map_err(map_pg)?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<Vec<i64>, _>>()
        .map_err(map_pg)?;
    Ok(applied)
}

/// `huddle admin add-relay` / `add-owner` / `add-reader`: creates the login role
/// `name` in `kind`'s group (or, when it exists, gives it a new password and makes
/// sure of its group), and returns a connection URL for it. [`init`] must have run.
pub async fn add_login(url: &str, name: &str, kind: LoginKind) -> Result<Login> {
    valid_login_name(name).map_err(StoreError::Config)?;
    let password = generate_password()?;
    let (client, driver) = connect(url).await?;
    let result = async {
        if !role_exists(&client, kind.group()).await? {
            return Err(StoreError::Config(format!(
                "role {} does not exist: run `huddle admin init` first",
                kind.group()
            )));
        }
        let existed = role_exists(&client, name).await?;
        if existed {
            check_ours(&client, name).await?;
        }
        // The password is generated from [A-Za-z0-9]: safe inside a literal.
        let sql = if existed {
            format!("ALTER ROLE {} LOGIN PASSWORD '{password}'", ident(name))
        } else {
            format!(
                "CREATE ROLE {} LOGIN PASSWORD '{password}' NOSUPERUSER NOCREATEDB NOCREATEROLE",
                ident(name)
            )
        };
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| admin_err(&format!("creating role {name}"), e))?;
        // One group only: a relay demoted to reader loses its relay rights.
        for group in [RELAY_ROLE, WRITER_ROLE, READER_ROLE] {
            let stmt = if group == kind.group() {
                format!("GRANT {} TO {}", ident(group), ident(name))
            } else {
                format!("REVOKE {} FROM {}", ident(group), ident(name))
            };
            client
                .batch_execute(&stmt)
                .await
                .map_err(|e| admin_err(&format!("setting the groups of {name}"), e))?;
        }
        Ok(existed)
    }
    .await;
    drop(client);
    let _ = driver.await;
    let existed = result?;
    Ok(Login {
        role: name.to_string(),
        url: url_for(url, name, &password)?,
        password,
        existed,
    })
}

/// Refuses to touch a role that is not one of huddle's logins: a superuser, or a role
/// in none of the huddle groups, is left alone.
async fn check_ours(client: &Client, name: &str) -> Result<()> {
    let row = client
        .query_one(
            "SELECT r.rolsuper,
                    EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                            WHERE m.member = r.oid AND g.rolname = ANY($2))
             FROM pg_roles r WHERE r.rolname = $1",
            &[&name, &vec![RELAY_ROLE, WRITER_ROLE, READER_ROLE]],
        )
        .await
        .map_err(map_pg)?;
    let superuser: bool = row.try_get(0).map_err(map_pg)?;
    let member: bool = row.try_get(1).map_err(map_pg)?;
    if superuser || !member {
        return Err(StoreError::Config(format!(
            "role {name:?} exists and is not a huddle login (not in {RELAY_ROLE}, \
             {WRITER_ROLE} or {READER_ROLE}); huddle admin leaves it alone"
        )));
    }
    Ok(())
}

/// `huddle admin remove-relay` (and the owner and reader kinds): ends the role's
/// sessions and drops it. Its rows stay attributed to it; its claims lapse. Returns
/// whether there was such a role.
pub async fn remove_login(url: &str, name: &str) -> Result<bool> {
    valid_login_name(name).map_err(StoreError::Config)?;
    let (client, driver) = connect(url).await?;
    let result = async {
        if !role_exists(&client, name).await? {
            return Ok(false);
        }
        check_ours(&client, name).await?;
        client
            .batch_execute(&format!("ALTER ROLE {} NOLOGIN", ident(name)))
            .await
            .map_err(|e| admin_err(&format!("locking role {name}"), e))?;
        client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                &[&name],
            )
            .await
            .map_err(|e| admin_err(&format!("ending the sessions of {name}"), e))?;
        client
            .batch_execute(&format!("DROP ROLE {}", ident(name)))
            .await
            .map_err(|e| admin_err(&format!("dropping role {name}"), e))?;
        Ok(true)
    }
    .await;
    drop(client);
    let _ = driver.await;
    result
}

/// One row of `agent_binding`: `agent` in `room` may be written by the role `writer`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Binding {
    /// The room.
    pub room: String,
    /// The agent.
    pub agent: String,
    /// The relay role that may write as it.
    pub writer: String,
}

/// Checks the names of a binding the way the ledger does (room and agent names) and
/// the way roles are named (writer).
fn check_binding(room: &str, agent: &str, writer: &str) -> Result<()> {
    let limits = huddle_core::Limits::default();
    huddle_core::validate_name("room", room, &limits)
        .map_err(|e| StoreError::Config(e.to_string()))?;
    huddle_core::config::check_agent_name(agent).map_err(StoreError::Config)?;
    valid_login_name(writer).map_err(StoreError::Config)
}

/// Runs `f` on an administrator's session and closes it.
async fn with_admin<T>(
    url: &str,
    f: impl for<'c> FnOnce(
        &'c mut Client,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<T>> + Send + 'c>,
    >,
) -> Result<T> {
    let (mut client, driver) = connect(url).await?;
    let result = f(&mut client).await;
    drop(client);
    let _ = driver.await;
    result
}

/// `huddle admin bind-agent ROOM AGENT ROLE`: from now on the database accepts rows
/// as `agent` (role `agent`) in `room` only from the roles bound to it, `writer` among
/// them. Returns whether the binding is new.
pub async fn bind_agent(url: &str, room: &str, agent: &str, writer: &str) -> Result<bool> {
    check_binding(room, agent, writer)?;
    let (room, agent, writer) = (room.to_string(), agent.to_string(), writer.to_string());
    with_admin(url, move |client| {
        Box::pin(async move {
            let n = client
                .execute(
                    "INSERT INTO agent_binding (room, agent, writer, bound_us)
                     VALUES ($1, $2, $3, (extract(epoch FROM now()) * 1000000)::int8)
                     ON CONFLICT DO NOTHING",
                    &[&room, &agent, &writer],
                )
                .await
                .map_err(|e| admin_err("binding the agent", e))?;
            Ok(n > 0)
        })
    })
    .await
}

/// `huddle admin unbind-agent ROOM AGENT [ROLE]`: removes the binding of `agent` to
/// `writer`, or every binding of the agent in the room when `writer` is `None`.
/// Returns how many were removed. An agent with no binding left is anyone's again.
pub async fn unbind_agent(url: &str, room: &str, agent: &str, writer: Option<&str>) -> Result<u64> {
    check_binding(room, agent, writer.unwrap_or("x"))?;
    let (room, agent) = (room.to_string(), agent.to_string());
    let writer = writer.map(str::to_string);
    with_admin(url, move |client| {
        Box::pin(async move {
            client
                .execute(
                    "DELETE FROM agent_binding
                     WHERE room = $1 AND agent = $2 AND ($3::text IS NULL OR writer = $3)",
                    &[&room, &agent, &writer],
                )
                .await
                .map_err(|e| admin_err("unbinding the agent", e))
        })
    })
    .await
}

/// `huddle admin bindings [ROOM]`: the bindings, by room, agent and writer.
pub async fn bindings(url: &str, room: Option<&str>) -> Result<Vec<Binding>> {
    let room = room.map(str::to_string);
    with_admin(url, move |client| {
        Box::pin(async move {
            let rows = client
                .query(
                    "SELECT room, agent, writer FROM agent_binding
                     WHERE $1::text IS NULL OR room = $1
                     ORDER BY room COLLATE \"C\", agent COLLATE \"C\", writer COLLATE \"C\"",
                    &[&room],
                )
                .await
                .map_err(|e| admin_err("listing the bindings", e))?;
            rows.iter()
                .map(|r| {
                    Ok(Binding {
                        room: r.try_get(0).map_err(map_pg)?,
                        agent: r.try_get(1).map_err(map_pg)?,
                        writer: r.try_get(2).map_err(map_pg)?,
                    })
                })
                .collect()
        })
    })
    .await
}

/// `huddle admin sync-agents ROOM`: makes the room's bindings exactly `wanted`
/// (agent, writer) pairs, in one transaction. Returns the bindings added and removed.
pub async fn set_bindings(
    url: &str,
    room: &str,
    wanted: &[(String, String)],
) -> Result<(Vec<Binding>, Vec<Binding>)> {
    for (agent, writer) in wanted {
        check_binding(room, agent, writer)?;
    }
    let room = room.to_string();
    let wanted: std::collections::BTreeSet<(String, String)> = wanted.iter().cloned().collect();
    with_admin(url, move |client| {
        Box::pin(async move {
            let tx = client.transaction().await.map_err(map_pg)?;
            let have: std::collections::BTreeSet<(String, String)> = tx
                .query(
                    "SELECT agent, writer FROM agent_binding WHERE room = $1 FOR UPDATE",
                    &[&room],
                )
                .await
                .map_err(|e| admin_err("reading the bindings", e))?
                .iter()
                .map(|r| Ok((r.try_get(0).map_err(map_pg)?, r.try_get(1).map_err(map_pg)?)))
                .collect::<Result<_>>()?;
            let binding = |(agent, writer): &(String, String)| Binding {
                room: room.clone(),
                agent: agent.clone(),
                writer: writer.clone(),
            };
            let added: Vec<Binding> = wanted.difference(&have).map(binding).collect();
            let removed: Vec<Binding> = have.difference(&wanted).map(binding).collect();
            for b in &added {
                tx.execute(
                    "INSERT INTO agent_binding (room, agent, writer, bound_us)
                     VALUES ($1, $2, $3, (extract(epoch FROM now()) * 1000000)::int8)",
                    &[&b.room, &b.agent, &b.writer],
                )
                .await
                .map_err(|e| admin_err("binding the agent", e))?;
            }
            for b in &removed {
                tx.execute(
                    "DELETE FROM agent_binding WHERE room = $1 AND agent = $2 AND writer = $3",
                    &[&b.room, &b.agent, &b.writer],
                )
                .await
                .map_err(|e| admin_err("unbinding the agent", e))?;
            }
            tx.commit().await.map_err(map_pg)?;
            Ok((added, removed))
        })
    })
    .await
}

/// 32 characters of `[A-Za-z0-9]` from the operating system's random source.
fn generate_password() -> Result<String> {
    use std::io::Read;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(32);
    let mut file = std::fs::File::open("/dev/urandom")
        .map_err(|e| StoreError::Config(format!("no random source for a password: {e}")))?;
    while out.len() < 32 {
        let mut buf = [0u8; 64];
        file.read_exact(&mut buf)
            .map_err(|e| StoreError::Config(format!("no random source for a password: {e}")))?;
        // 248 = 4 * 62: drop higher bytes so every character is equally likely.
        for b in buf.into_iter().filter(|b| *b < 248) {
            if out.len() < 32 {
                out.push(ALPHABET[usize::from(b) % ALPHABET.len()] as char);
            }
        }
    }
    Ok(out)
}

/// The admin URL with its user and password replaced.
pub fn url_for(admin_url: &str, user: &str, password: &str) -> Result<String> {
    let (scheme, rest) = admin_url
        .split_once("://")
        .ok_or_else(|| StoreError::Config(format!("not a Postgres URL: {admin_url:?}")))?;
    // The authority ends at the first '/', '?' or end; userinfo ends at its last '@'.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    Ok(format!("{scheme}://{user}:{password}@{host}{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_the_new_user() {
        assert_eq!(
            url_for("postgres://postgres@127.0.0.1:5432/db", "r1", "pw").unwrap(),
            "postgres://r1:pw@127.0.0.1:5432/db"
        );
        assert_eq!(
            url_for("postgresql://a:b@h/db?sslmode=disable", "r-2", "x").unwrap(),
            "postgresql://r-2:x@h/db?sslmode=disable"
        );
        assert_eq!(
            url_for("postgres://h", "u", "p").unwrap(),
            "postgres://u:p@h"
        );
        assert!(url_for("h/db", "u", "p").is_err());
    }

    #[test]
    fn login_names_are_checked() {
        assert!(valid_login_name("relay-a").is_ok());
        assert!(valid_login_name("r_1").is_ok());
        for bad in [
            "",
            "huddle_relay",
            "pg_monitor",
            "a b",
            "a\"b",
            &"x".repeat(64),
        ] {
            assert!(valid_login_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_are_long_and_plain() {
        let a = generate_password().unwrap();
        let b = generate_password().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
