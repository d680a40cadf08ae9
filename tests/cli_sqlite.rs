//! End-to-end: the real `huddle` binary on the embedded SQLite default.

use crate::common;

use std::time::Duration;

use common::*;

fn db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huddle.db").display().to_string();
    (dir, path)
}

#[test]
fn room_post_tail_round_trip_with_roles() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.arg("migrate");
        c
    });
    let out = ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    assert!(out.contains("created room lobby"), "{out}");
    // Creating again with the same owner is a no-op; another owner is refused.
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    let err = fails({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "mallory"]);
        c
    });
    assert!(err.contains("owned by olga"), "{err}");

    for (who, text) in [("olga", "hello all"), ("hank", "hi olga")] {
        let id = ok({
            let mut c = huddle(&db);
            c.args(["post", "--room", "lobby", "--as", who, text]);
            c
        });
        assert_eq!(id.trim().len(), 64, "prints the interaction id: {id}");
    }
    let text = ok({
        let mut c = huddle(&db);
        c.args(["tail", "--room", "lobby"]);
        c
    });
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[1].contains("olga (owner) message.posted: hello all"),
        "{text}"
    );
    assert!(
        lines[2].contains("hank (human) message.posted: hi olga"),
        "{text}"
    );

    let json = ok({
        let mut c = huddle(&db);
        c.args(["tail", "--room", "lobby", "--json"]);
        c
    });
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(rows[1]["role"], "owner");
    assert_eq!(rows[2]["body"]["text"], "hi olga");
}

#[test]
fn hostile_names_are_shown_faithfully_or_refused_clearly() {
    let (_dir, db) = db();
    let room = "r'; DROP TABLE interaction; -- ünï 🚀";
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", room, "--owner", "o\"wner"]);
        c
    });
    ok({
        let mut c = huddle(&db);
        c.args([
            "post",
            "--room",
            room,
            "--as",
            "o\"wner",
            "semi;colon \"text\"",
        ]);
        c
    });
    let out = ok({
        let mut c = huddle(&db);
        c.args(["tail", "--room", room]);
        c
    });
    assert!(out.contains(room), "{out}");
    assert!(
        out.contains("o\"wner (owner) message.posted: semi;colon \"text\""),
        "{out}"
    );

    let huge = "x".repeat(10 * 1024);
    let err = fails({
        let mut c = huddle(&db);
        c.args(["room", "create", &huge, "--owner", "o"]);
        c
    });
    assert!(err.starts_with("error:") && err.contains("room"), "{err}");
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
}

#[test]
fn errors_are_one_line_and_nonzero() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.arg("migrate");
        c
    });
    let err = fails({
        let mut c = huddle(&db);
        c.args(["post", "--room", "nowhere", "--as", "a", "hi"]);
        c
    });
    assert!(err.contains("there is no room \"nowhere\""), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let err = fails({
        let mut c = huddle("mysql://nope");
        c.arg("migrate");
        c
    });
    assert!(err.contains("unsupported database URL"), "{err}");
    let big = "y".repeat(300 * 1024);
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "r", "--owner", "o"]);
        c
    });
    let mut c = huddle(&db);
    c.args(["post", "--room", "r", "--as", "o", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(big.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limit"), "{err}");
}

/// A second process following the ledger sees rows appended by this one.
#[test]
fn tail_follow_in_another_process_wakes_up() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    // A long fallback poll: the wake-up must come from the change counter.
    let follower = LineChild::spawn({
        let mut c = huddle(&db);
        c.args(["tail", "--room", "lobby", "--follow", "--json"])
            .env("HUDDLE_POLL_MS", "60000");
        c
    });
    follower.expect_line("the room.created row", Duration::from_secs(20), |l| {
        l.contains("room.created")
    });
    for i in 0..5 {
        let text = format!("ping {i}");
        ok({
            let mut c = huddle(&db);
            c.args(["post", "--room", "lobby", "--as", "hank", &text]);
            c
        });
        follower.expect_line(&text, Duration::from_secs(10), |l| l.contains(&text));
    }
}

#[test]
fn claims_lists_nothing_on_a_fresh_database() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.arg("migrate");
        c
    });
    let out = ok({
        let mut c = huddle(&db);
        c.arg("claims");
        c
    });
    assert_eq!(out.trim(), "no claims");
    let json = ok({
        let mut c = huddle(&db);
        c.args(["claims", "--json"]);
        c
    });
    assert_eq!(json.trim(), "[]");
}

/// `huddle tail | head` ends quietly: no panic on a closed pipe.
#[test]
fn a_closed_output_pipe_is_not_a_panic() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    for i in 0..50 {
        ok({
            let mut c = huddle(&db);
            c.args([
                "post",
                "--room",
                "lobby",
                "--as",
                "olga",
                &format!("line {i}"),
            ]);
            c
        });
    }
    let mut child = huddle(&db)
        .args(["tail", "--room", "lobby"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Close our end of the pipe without reading.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}
