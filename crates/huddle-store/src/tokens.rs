//! Agents' bearer tokens for `huddle mcp --http` (plan 0023): the `agent_token`
//! table of migration 0005, on both backends, so every server sharing the database
//! serves the same agents.
//!
//! A token is `huddle_<id>_<secret>`: `id` is 16 hex digits (public: `token list`
//! shows it, and a server looks the row up by it), `secret` is 64 hex digits (256
//! random bits). Only the blake3 hash of the whole token is stored; it is shown once,
//! when made. [`TokenStore::verify`] finds the row by id and compares hashes in
//! constant time, so neither the lookup nor the comparison depends on the secret.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::Serialize;
use tokio_postgres::Config;

use crate::postgres::errors::{map_pg, map_pool};
use crate::sqlite::conn::{self as sqlite_conn, ConnKind};
use crate::{parse_url, Backend, Result, StoreError};

/// What every token starts with.
pub const PREFIX: &str = "huddle_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// A stored token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    /// The public part of the token.
    pub id: String,
    /// The agent the token acts as.
    pub agent: String,
    /// The room it acts in.
    pub room: String,
    /// The capabilities the agent declares when it registers.
    pub capabilities: Vec<String>,
    /// When it was made, µs since the Unix epoch.
    pub created_us: i64,
}

/// A token just made: the only time its secret exists outside the client.
#[derive(Clone, Debug)]
pub struct NewToken {
    /// What is stored about it.
    pub info: TokenInfo,
    /// The whole token, to hand to the agent's client.
    pub token: String,
}

/// Which tokens [`TokenStore::remove`] removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The token with this id.
    Id(String),
    /// Every token of this agent, in one room or in all.
    Agent {
        /// The agent.
        agent: String,
        /// Only this room's.
        room: Option<String>,
    },
}

/// The id part of a presented token, when it has the token's shape.
pub fn token_id(presented: &str) -> Option<&str> {
    let rest = presented.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == 2 * n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_BYTES) && hex(secret, SECRET_BYTES)).then_some(id)
}

fn hash(token: &str) -> blake3::Hash {
    blake3::hash(token.as_bytes())
}

fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf)
        .map_err(|e| StoreError::Config(format!("no random source for a token: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A stored row: the info and the stored hash (hex).
type Row = (TokenInfo, String);

fn info(
    id: String,
    agent: String,
    room: String,
    capabilities: &str,
    created_us: i64,
) -> Result<TokenInfo> {
    let capabilities = serde_json::from_str(capabilities).map_err(|e| {
        StoreError::Backend(format!("agent_token {id}: unreadable capabilities: {e}"))
    })?;
    Ok(TokenInfo {
        id,
        agent,
        room,
        capabilities,
        created_us,
    })
}

const COLUMNS: &str = "id, agent, room, capabilities, created_us, hash";

/// The `agent_token` table of one database.
#[derive(Clone)]
pub struct TokenStore {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(Pool),
}

impl TokenStore {
    /// Opens the token table of the database at `url` (see [`parse_url`]), applying
    /// pending migrations.
    pub async fn open(url: &str) -> Result<Self> {
        let inner = match parse_url(url)? {
            Backend::Sqlite(path) => {
                let conn = tokio::task::spawn_blocking(move || {
                    let mut conn = sqlite_conn::open_connection(&path, ConnKind::Writer)?;
                    sqlite_conn::migrate(&mut conn)?;
                    Ok::<_, StoreError>(conn)
                })
                .await
                .map_err(|e| StoreError::Backend(format!("opening the token table: {e}")))??;
                Inner::Sqlite(Arc::new(Mutex::new(conn)))
            }
            Backend::Postgres(url) => {
                let mut config: Config = url
                    .parse()
                    .map_err(|e| StoreError::Config(format!("bad Postgres URL: {e}")))?;
                config.application_name("huddle-tokens");
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(Duration::from_secs(10));
                }
                crate::postgres::migrate::migrate(&config).await?;
                let manager = Manager::from_config(
                    config,
                    tokio_postgres::NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                let pool = Pool::builder(manager)
                    .max_size(2)
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(Duration::from_secs(10)))
                    .create_timeout(Some(Duration::from_secs(10)))
                    .build()
                    .map_err(|e| StoreError::Config(format!("connection pool: {e}")))?;
                Inner::Postgres(pool)
            }
        };
        Ok(TokenStore { inner })
    }

    /// Makes a token for `agent` in `room`; returns it (the only time it is shown).
    pub async fn add(
        &self,
        agent: &str,
        room: &str,
        mut capabilities: Vec<String>,
    ) -> Result<NewToken> {
        if agent.is_empty() || room.is_empty() {
            return Err(StoreError::Config(
                "a token needs an agent and a room".into(),
            ));
        }
        capabilities.sort();
        capabilities.dedup();
        let id = random_hex(ID_BYTES)?;
        let token = format!("{PREFIX}{id}_{}", random_hex(SECRET_BYTES)?);
        let info = TokenInfo {
            id,
            agent: agent.to_string(),
            room: room.to_string(),
            capabilities,
            created_us: now_us(),
        };
        let caps = serde_json::to_string(&info.capabilities)
            .map_err(|e| StoreError::Backend(format!("encoding capabilities: {e}")))?;
        let digest = hash(&token).to_hex().to_string();
        let sql = "INSERT INTO agent_token (id, hash, agent, room, capabilities, created_us) \
                   VALUES ($1, $2, $3, $4, $5, $6)";
        let row = info.clone();
        match &self.inner {
            Inner::Sqlite(conn) => {
                let conn = conn.clone();
                blocking(move || {
                    let conn = conn.lock().map_err(poisoned)?;
                    conn.execute(
                        sql,
                        rusqlite::params![
                            row.id,
                            digest,
                            row.agent,
                            row.room,
                            caps,
                            row.created_us
                        ],
                    )?;
                    Ok(())
                })
                .await?;
            }
            Inner::Postgres(pool) => {
                let client = pool.get().await.map_err(map_pool)?;
                client
                    .execute(
                        sql,
                        &[
                            &row.id,
                            &digest,
                            &row.agent,
                            &row.room,
                            &caps,
                            &row.created_us,
                        ],
                    )
                    .await
                    .map_err(map_pg)?;
            }
        }
        Ok(NewToken { info, token })
    }

    /// Every token, oldest first, without secrets.
    pub async fn list(&self) -> Result<Vec<TokenInfo>> {
        let rows = self
            .select(
                &format!("SELECT {COLUMNS} FROM agent_token ORDER BY created_us, id"),
                vec![],
            )
            .await?;
        Ok(rows.into_iter().map(|(info, _)| info).collect())
    }

    /// Removes the tokens `which` names; returns them. Servers refuse a removed token
    /// from their next request on.
    pub async fn remove(&self, which: &Removal) -> Result<Vec<TokenInfo>> {
        let (filter, args) = match which {
            Removal::Id(id) => ("id = $1", vec![id.clone()]),
            Removal::Agent { agent, room: None } => ("agent = $1", vec![agent.clone()]),
            Removal::Agent {
                agent,
                room: Some(room),
            } => (
                "agent = $1 AND room = $2",
                vec![agent.clone(), room.clone()],
            ),
        };
        let sql = format!("DELETE FROM agent_token WHERE {filter} RETURNING {COLUMNS}");
        let rows = self.select(&sql, args).await?;
        Ok(rows.into_iter().map(|(info, _)| info).collect())
    }

    /// The token `presented` names, when it is a stored token: looked up by its id,
    /// its hash compared in constant time.
    pub async fn verify(&self, presented: &str) -> Result<Option<TokenInfo>> {
        let Some(id) = token_id(presented) else {
            return Ok(None);
        };
        let rows = self
            .select(
                &format!("SELECT {COLUMNS} FROM agent_token WHERE id = $1"),
                vec![id.to_string()],
            )
            .await?;
        let presented = hash(presented);
        Ok(rows.into_iter().find_map(|(info, stored)| {
            // `blake3::Hash`'s equality is constant-time.
            let stored = blake3::Hash::from_hex(stored.as_bytes()).ok()?;
            (stored == presented).then_some(info)
        }))
    }

    /// Runs a statement returning [`COLUMNS`] with text arguments.
    async fn select(&self, sql: &str, args: Vec<String>) -> Result<Vec<Row>> {
        match &self.inner {
            Inner::Sqlite(conn) => {
                let conn = conn.clone();
                let sql = sql.to_string();
                blocking(move || {
                    let conn = conn.lock().map_err(poisoned)?;
                    let mut stmt = conn.prepare(&sql)?;
                    let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
                    let mut out = Vec::new();
                    while let Some(r) = rows.next()? {
                        let caps: String = r.get(3)?;
                        out.push((
                            info(r.get(0)?, r.get(1)?, r.get(2)?, &caps, r.get(4)?)?,
                            r.get(5)?,
                        ));
                    }
                    Ok(out)
                })
                .await
            }
            Inner::Postgres(pool) => {
                let client = pool.get().await.map_err(map_pool)?;
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
                    .iter()
                    .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                let rows = client.query(sql, &params).await.map_err(map_pg)?;
                rows.iter()
                    .map(|r| {
                        let caps: String = r.try_get(3).map_err(map_pg)?;
                        Ok((
                            info(
                                r.try_get(0).map_err(map_pg)?,
                                r.try_get(1).map_err(map_pg)?,
                                r.try_get(2).map_err(map_pg)?,
                                &caps,
                                r.try_get(4).map_err(map_pg)?,
                            )?,
                            r.try_get(5).map_err(map_pg)?,
                        ))
                    })
                    .collect()
            }
        }
    }
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Backend("the token table's connection lock is poisoned".into())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend(format!("token table task: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_made_verified_listed_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = TokenStore::open(&url).await.unwrap();
        let a = store
            .add(
                "ana",
                "lab",
                vec!["rust".into(), "go".into(), "rust".into()],
            )
            .await
            .unwrap();
        let b = store.add("bo", "lab", vec![]).await.unwrap();
        assert_eq!(token_id(&a.token), Some(a.info.id.as_str()));
        assert_eq!(a.info.capabilities, vec!["go", "rust"]);
        assert_eq!(store.verify(&a.token).await.unwrap(), Some(a.info.clone()));
        assert_eq!(store.verify(&b.token).await.unwrap(), Some(b.info.clone()));
        // The right id with a wrong secret, a malformed token, an unknown id.
        let mut forged = a.token.clone();
        let last = forged.pop().unwrap();
        forged.push(if last == '0' { '1' } else { '0' });
        assert_eq!(store.verify(&forged).await.unwrap(), None);
        assert_eq!(store.verify("huddle_x_y").await.unwrap(), None);
        assert_eq!(store.verify("").await.unwrap(), None);
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 2);
        // No secret is stored: the table holds hashes only.
        let raw = std::fs::read(dir.path().join("t.db")).unwrap();
        let secret = a.token.rsplit('_').next().unwrap();
        assert!(!raw.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let removed = store.remove(&Removal::Id(a.info.id.clone())).await.unwrap();
        assert_eq!(removed, vec![a.info.clone()]);
        assert_eq!(store.verify(&a.token).await.unwrap(), None);
        assert!(store.verify(&b.token).await.unwrap().is_some());
        let removed = store
            .remove(&Removal::Agent {
                agent: "bo".into(),
                room: Some("other".into()),
            })
            .await
            .unwrap();
        assert!(removed.is_empty());
        let removed = store
            .remove(&Removal::Agent {
                agent: "bo".into(),
                room: None,
            })
            .await
            .unwrap();
        assert_eq!(removed.len(), 1);
        assert!(store.list().await.unwrap().is_empty());
    }
}
