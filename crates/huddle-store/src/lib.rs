//! # huddle-store
//!
//! The ledger (append-only interactions, read forward from a gap-free cursor) and the
//! claims table (leased rows whose atomicity is the database row lock), behind two
//! traits, [`Ledger`] and [`Claims`], with a SQLite backend (the embedded default) and
//! a Postgres backend. With the `memory` feature there is a third, in-memory backend
//! for tests and simulations (`memory::MemoryStore`).
//!
//! All three run one written behaviour, the conformance suite (`conformance`, with
//! each backend's test hooks), compiled only with the `testing` feature: test crates
//! turn it on through their dev-dependencies, so none of it is in a shipped binary.
//!
//! ```no_run
//! # async fn demo() -> Result<(), huddle_store::StoreError> {
//! use huddle_core::{NewInteraction, Role, Verb, Position};
//! use huddle_store::{open, StoreOptions};
//! let store = open("sqlite://huddle.db", StoreOptions::default()).await?;
//! store.append(vec![NewInteraction::new("lobby", Verb::MessagePosted, "ana",
//!     Role::Human, serde_json::json!({"text": "hi"}))]).await?;
//! let batch = store.read_forward(Position::START, 100).await?;
//! assert_eq!(batch.rows.len(), 1);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

#[cfg(feature = "testing")]
pub mod conformance;
pub mod error;
#[cfg(feature = "memory")]
pub mod memory;
pub mod migrations;
pub mod postgres;
pub mod resources;
pub mod sqlite;
pub mod subscribe;
pub mod tokens;
mod traits;

use std::sync::Arc;
use std::time::Duration;

pub use error::{Result, StoreError};
pub use resources::ResourcesAcquired;
pub use subscribe::{ReadStep, Reader, Subscription};
pub use traits::*;

use huddle_core::{InteractionId, Limits, NewInteraction};

/// Options common to both backends.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The writing relay's identity, stored in each row's `relay` column on SQLite
    /// (Postgres stores the database role instead).
    pub relay: String,
    /// Limits checked before every write.
    pub limits: Limits,
    /// Fallback poll: how often a subscription reads forward with no doorbell.
    pub poll_interval: Duration,
    /// SQLite only: how often the change counter (`PRAGMA data_version`) is polled to
    /// notice other processes' writes.
    pub sqlite_change_poll: Duration,
    /// Postgres only: connection pool size (default 3: on this project's 2-core
    /// machine three relays with 3 connections each handed out tasks faster than
    /// with 8, whose extra backends only contended for the cores; plan 0060).
    pub pool_size: usize,
    /// The writer's signing key: when set, every row this store appends is signed
    /// (its `sig` column) over the writer it records and the row's content id
    /// (`huddle_core::keys`, plan 0031).
    pub signer: Option<huddle_core::keys::WriterSecret>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            relay: "local".to_string(),
            limits: Limits::default(),
            poll_interval: Duration::from_secs(1),
            sqlite_change_poll: Duration::from_millis(2),
            pool_size: 3,
            signer: None,
        }
    }
}

/// Checks a batch against `limits` before anything is written: its size, then every
/// interaction. Returns each item's id and canonical body text (each body encoded
/// once). One bad interaction refuses the whole batch.
pub(crate) fn checked_batch<N: std::borrow::Borrow<NewInteraction>>(
    limits: &Limits,
    batch: &[N],
) -> Result<(Vec<InteractionId>, Vec<String>)> {
    if batch.len() > limits.max_batch {
        return Err(StoreError::BatchTooLarge {
            got: batch.len(),
            max: limits.max_batch,
        });
    }
    let mut ids = Vec::with_capacity(batch.len());
    let mut bodies = Vec::with_capacity(batch.len());
    for n in batch {
        let (id, body) = n.borrow().checked(limits)?;
        ids.push(id);
        bodies.push(body);
    }
    Ok((ids, bodies))
}

/// The `sig` column of a row with content id `id` written by `writer`: its signature
/// when the store signs, else nothing.
pub(crate) fn row_signature(
    signer: Option<&huddle_core::keys::WriterSecret>,
    writer: &str,
    id: &InteractionId,
) -> Option<String> {
    signer.map(|s| s.sign_row(writer, id).to_text())
}

/// Which backend a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `sqlite://PATH`, `sqlite::memory:` or a plain path.
    Sqlite(String),
    /// `postgres://...` or `postgresql://...`.
    Postgres(String),
}

/// The least string greater than every string that starts with `prefix`: the prefix
/// with its last character replaced by the next one. Claim keys compare as UTF-8
/// bytes (SQLite's `BINARY`, Postgres's `"C"`), which orders like code points, so
/// `[prefix, bound)` is exactly the strings that start with `prefix`. `None` when no
/// such string exists.
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Parses a database URL: `postgres://` / `postgresql://` select Postgres; `sqlite://PATH`,
/// `sqlite:PATH`, `sqlite::memory:` or a plain file path select SQLite.
pub fn parse_url(url: &str) -> Result<Backend> {
    let url = url.trim();
    if url.is_empty() {
        return Err(StoreError::Config("empty database URL".into()));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Backend::Postgres(url.to_string()));
    }
    if let Some(rest) = url.strip_prefix("sqlite://") {
        return Ok(Backend::Sqlite(rest.to_string()));
    }
    if let Some(rest) = url.strip_prefix("sqlite:") {
        return Ok(Backend::Sqlite(rest.to_string()));
    }
    if url.contains("://") {
        return Err(StoreError::Config(format!(
            "unsupported database URL {url:?}: use postgres://..., sqlite://PATH or a file path"
        )));
    }
    Ok(Backend::Sqlite(url.to_string()))
}

/// Opens a store by URL (see [`parse_url`]) and applies pending migrations.
pub async fn open(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    match parse_url(url)? {
        Backend::Sqlite(path) => {
            let store = sqlite::SqliteStore::open(&path, options).await?;
            Ok(Arc::new(store))
        }
        Backend::Postgres(url) => Ok(Arc::new(postgres::PgStore::connect(&url, options).await?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_backends() {
        assert_eq!(
            parse_url("postgres://u@h/db").unwrap(),
            Backend::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            parse_url("sqlite://x.db").unwrap(),
            Backend::Sqlite("x.db".into())
        );
        assert_eq!(
            parse_url("sqlite::memory:").unwrap(),
            Backend::Sqlite(":memory:".into())
        );
        assert_eq!(
            parse_url("./h.db").unwrap(),
            Backend::Sqlite("./h.db".into())
        );
        assert!(parse_url("mysql://x").is_err());
        assert!(parse_url("").is_err());
    }

    #[test]
    fn prefix_bounds_cover_exactly_the_prefixed_keys() {
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(prefix_upper_bound("task/").as_deref(), Some("task0"));
        // Skips the surrogate gap.
        assert_eq!(
            prefix_upper_bound("a\u{D7FF}").as_deref(),
            Some("a\u{E000}")
        );
        let max = char::MAX.to_string();
        assert_eq!(prefix_upper_bound(&format!("a{max}")).as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound(&max), None);
        let upper = prefix_upper_bound("ü/").expect("bound");
        for key in ["ü/", "ü/x", &format!("ü/{max}")] {
            assert!(key >= "ü/" && key < upper.as_str(), "{key}");
        }
        assert!("ü0" >= upper.as_str());
    }
}
