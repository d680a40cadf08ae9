//! The store conformance suite, run against the SQLite backend (a fresh database file
//! per test), plus the one check that needs a real second process.

use huddle_store::sqlite::SqliteTestBackend;

async fn make_backend() -> SqliteTestBackend {
    SqliteTestBackend::new()
        .await
        .expect("a fresh SQLite database in a temporary directory")
}

huddle_store::conformance_tests!(make_backend);

/// Set in the child process of [`a_commit_in_another_process_wakes_a_subscriber`]:
/// the database file the child appends to.
const CHILD_DB: &str = "HUDDLE_SQLITE_TEST_CHILD_DB";

/// A real second process (this test binary, re-run in a child role) appends a row;
/// the parent's doorbell rings through the `data_version` watcher, not the fallback
/// poll (set to an hour here), and a subscription picks the row up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_another_process_wakes_a_subscriber() {
    use std::time::Duration;

    use huddle_core::{NewInteraction, Position, Role, Verb};
    use huddle_store::sqlite::SqliteStore;
    use huddle_store::{Ledger, StoreOptions, Subscription};

    let row = NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "child",
        Role::Agent,
        serde_json::json!({ "text": "from another process" }),
    );
    if let Ok(path) = std::env::var(CHILD_DB) {
        // Child role: append one row and exit.
        let options = StoreOptions {
            relay: "child-process".into(),
            ..StoreOptions::default()
        };
        let store = SqliteStore::open(&path, options).await.expect("child open");
        let out = store.append(vec![row]).await.expect("child append");
        assert!(out[0].inserted);
        return;
    }

    let backend = SqliteTestBackend::with_options(StoreOptions {
        poll_interval: Duration::from_secs(3600),
        ..StoreOptions::default()
    })
    .await
    .expect("backend");
    let store = backend.sqlite();
    let mut bell = store.doorbell();
    bell.borrow_and_update();
    let mut sub = Subscription::new(store.clone(), Position::START, 10);

    let exe = std::env::current_exe().expect("test binary path");
    let child = tokio::process::Command::new(exe)
        .args([
            "--exact",
            "a_commit_in_another_process_wakes_a_subscriber",
            "--test-threads=1",
        ])
        .env(CHILD_DB, backend.path())
        .output()
        .await
        .expect("run the child process");
    assert!(
        child.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    // Nothing in this process appended, so only the watcher can ring the bell.
    tokio::time::timeout(Duration::from_secs(10), bell.changed())
        .await
        .expect("no doorbell for another process's commit")
        .expect("bell open");
    let batch = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("subscription did not wake")
        .expect("next");
    assert_eq!(batch.rows.len(), 1);
    assert_eq!(batch.rows[0].id, row.id());
    assert_eq!(batch.rows[0].relay, "child-process");
}
