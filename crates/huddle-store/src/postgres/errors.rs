//! Mapping Postgres and pool failures onto [`StoreError`].
//!
//! Connection-level failures (refused, reset, closed, server shutting down or starting
//! up, too many connections, a session cut by a timeout) are
//! [`StoreError::Unavailable`]: retrying later may succeed. Everything else the
//! server reports is [`StoreError::Backend`].

use deadpool_postgres::PoolError;

use crate::StoreError;

/// SQLSTATEs (or classes, by prefix) that mean "the connection or server is gone or
/// not ready", as opposed to "this statement is wrong".
const UNAVAILABLE_STATES: &[&str] = &[
    "08",    // connection exception (class)
    "57P",   // admin/crash shutdown, cannot connect now, database dropped, idle timeout
    "53300", // too many connections
    "53000", // insufficient resources
    "58",    // system error (class): I/O errors on the server
    "25P03", // idle_in_transaction_session_timeout: the session was cut
];

/// Maps a tokio-postgres error.
pub(crate) fn map_pg(e: tokio_postgres::Error) -> StoreError {
    classify(&e)
}

fn classify(e: &tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let mut text = format!("{} ({code})", db.message());
        if let Some(detail) = db.detail() {
            text.push_str(": ");
            text.push_str(detail);
        }
        if UNAVAILABLE_STATES.iter().any(|s| code.starts_with(s)) {
            return StoreError::Unavailable(text);
        }
        return StoreError::Backend(text);
    }
    let text = match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    };
    if is_connection_level(e) {
        StoreError::Unavailable(text)
    } else {
        StoreError::Backend(text)
    }
}

fn is_connection_level(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    // tokio-postgres does not expose its error kinds; its Debug form names them.
    let debug = format!("{e:?}");
    ["kind: Io", "kind: Connect", "kind: Timeout", "kind: Closed"]
        .iter()
        .any(|k| debug.contains(k))
}

/// Maps a failure to get a pooled connection.
pub(crate) fn map_pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(pg) => map_pg(pg),
        PoolError::Timeout(kind) => StoreError::Unavailable(format!(
            "no database connection available ({kind:?} timeout)"
        )),
        PoolError::Closed => StoreError::Unavailable("the connection pool is closed".into()),
        PoolError::NoRuntimeSpecified => {
            StoreError::Config("the connection pool has no async runtime".into())
        }
        PoolError::PostCreateHook(h) => StoreError::Unavailable(h.to_string()),
    }
}
