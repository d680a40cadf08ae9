//! # huddle-testkit
//!
//! Test-only support for huddle. Today: throwaway PostgreSQL clusters and one fresh
//! database per test ([`pg`]). Nothing here is used outside tests.
//!
//! ```no_run
//! # async fn demo() {
//! // A fresh, empty database: on `HUDDLE_TEST_DATABASE_URL` when set, else on a
//! // cluster this test process starts (and stops at exit) with the machine's
//! // `initdb`/`pg_ctl`.
//! let db = huddle_testkit::test_database().await;
//! println!("connect to {}", db.url);
//! # }
//! ```
#![warn(missing_docs)]

pub mod pg;
pub mod proxy;

pub use pg::{
    test_database, test_database_collated, ClusterError, PgCluster, TestDb, TEST_DATABASE_URL_ENV,
};
pub use proxy::FaultProxy;
