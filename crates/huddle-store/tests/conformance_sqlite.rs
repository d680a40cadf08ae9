//! The store conformance suite, run against the SQLite backend (a fresh database file
//! per test), including the check that needs a real second process.

use huddle_store::sqlite::SqliteTestBackend;

async fn make_backend() -> SqliteTestBackend {
    SqliteTestBackend::new()
        .await
        .expect("a fresh SQLite database in a temporary directory")
}

huddle_store::conformance_tests!(make_backend, across_processes);
