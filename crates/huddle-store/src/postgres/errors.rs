//! Mapping Postgres and pool failures onto [`StoreError`].
//!
//! Connection-level failures (refused, reset, closed, server shutting down or starting
//! up, too many connections, a session cut by a timeout) are
//! [`StoreError::Unavailable`]: retrying later may succeed. Everything else the
//! server reports is [`StoreError::Backend`].

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::StoreError;

/// SQLSTATEs that mean "the connection or server is gone or not ready", as opposed to
/// "this statement is wrong".
const UNAVAILABLE_STATES: &[SqlState] = &[
    // Class 08, connection exception.
    SqlState::CONNECTION_EXCEPTION,
    SqlState::CONNECTION_DOES_NOT_EXIST,
    SqlState::CONNECTION_FAILURE,
    SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    SqlState::SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
    SqlState::TRANSACTION_RESOLUTION_UNKNOWN,
    SqlState::PROTOCOL_VIOLATION,
    // 57P: admin or crash shutdown, cannot connect now, database dropped, idle timeout.
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::DATABASE_DROPPED,
    SqlState::IDLE_SESSION_TIMEOUT,
    // Class 53, the server is short of resources.
    SqlState::INSUFFICIENT_RESOURCES,
    SqlState::TOO_MANY_CONNECTIONS,
    // Class 58, system error: I/O errors on the server.
    SqlState::SYSTEM_ERROR,
    SqlState::IO_ERROR,
    SqlState::UNDEFINED_FILE,
    SqlState::DUPLICATE_FILE,
    // The session was cut by idle_in_transaction_session_timeout.
    SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
];

/// Whether a server error with this SQLSTATE means "retry later".
fn is_unavailable(state: &SqlState) -> bool {
    UNAVAILABLE_STATES.contains(state)
}

/// Maps a tokio-postgres error.
pub(crate) fn map_pg(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{} ({})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(": ");
            text.push_str(detail);
        }
        if is_unavailable(db.code()) {
            return StoreError::Unavailable(text);
        }
        return StoreError::Backend(text);
    }
    let text = match std::error::Error::source(&e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    };
    if is_connection_level(&e) {
        StoreError::Unavailable(text)
    } else {
        StoreError::Backend(text)
    }
}

/// A client-side failure of the connection itself: closed, or an I/O error
/// (tokio-postgres gives every I/O and connect failure an `io::Error` source).
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
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_states_are_unavailable_and_statement_errors_are_not() {
        for code in [
            "08000", "08003", "08006", "08001", "08004", "08P01", "57P01", "57P02", "57P03",
            "57P04", "57P05", "53000", "53300", "58000", "58030", "25P03",
        ] {
            assert!(is_unavailable(&SqlState::from_code(code)), "{code}");
        }
        for code in [
            "23505", "42P01", "42601", "40001", "22P02", "53100", "XX000",
        ] {
            assert!(!is_unavailable(&SqlState::from_code(code)), "{code}");
        }
    }
}
