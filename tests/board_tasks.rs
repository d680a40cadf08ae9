//! End-to-end: `huddle board` and `huddle tasks` read a room's folded state back from
//! the ledger, and agree with the report of the demo that wrote it.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use serde_json::Value;

fn db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huddle.db").display().to_string();
    (dir, path)
}

fn json_of(db: &str, args: &[&str]) -> Value {
    let out = ok({
        let mut c = huddle(db);
        c.args(args);
        c
    });
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn board_and_tasks_after_a_demo_match_its_report() {
    let (_dir, db) = db();
    let report = json_of(
        &db,
        &[
            "demo",
            "--tasks",
            "40",
            "--agents",
            "4",
            "--relays",
            "2",
            "--turn-ms",
            "10",
            "--room",
            "lab",
            "--json",
        ],
    );
    assert_eq!(report["room"], "lab");
    let per_agent: BTreeMap<String, u64> = report["per_agent"]
        .as_array()
        .expect("per_agent")
        .iter()
        .map(|a| {
            (
                a["agent"].as_str().expect("agent").to_string(),
                n(a, "tasks_done"),
            )
        })
        .collect();

    let tasks = json_of(&db, &["tasks", "--room", "lab", "--json"]);
    assert_eq!(n(&tasks["summary"], "total"), n(&report, "tasks"));
    assert_eq!(n(&tasks["summary"], "done"), n(&report, "done"));
    assert_eq!(n(&tasks["summary"], "ready"), 0);
    assert_eq!(n(&tasks["summary"], "claimed"), 0);
    assert_eq!(tasks["ready"].as_array().map(Vec::len), Some(0));
    let list = tasks["tasks"].as_array().expect("tasks");
    assert_eq!(list.len(), 40);
    let mut by_owner: BTreeMap<String, u64> = BTreeMap::new();
    for t in list {
        assert_eq!(t["status"], "done", "{t}");
        assert_eq!(n(t, "completions"), 1, "{t}");
        assert!(n(t, "attempts") >= 1 && n(t, "epoch") >= 1, "{t}");
        *by_owner
            .entry(t["owner"].as_str().expect("owner").to_string())
            .or_default() += 1;
    }
    assert_eq!(by_owner, per_agent, "task owners differ from the report");

    let board = json_of(&db, &["board", "--room", "lab", "--json"]);
    assert_eq!(board["owner"], "owner");
    assert_eq!(n(&board["tasks"], "done"), 40);
    let agents: BTreeMap<String, u64> = board["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| {
            (
                a["agent"].as_str().expect("agent").to_string(),
                n(a, "tasks_done"),
            )
        })
        .collect();
    assert_eq!(agents, per_agent, "board differs from the report");
    for a in board["agents"].as_array().expect("agents") {
        // Nobody is still working.
        assert!(a["state"] == "done" || a["state"] == "idle", "{a}");
    }
    assert_eq!(board["open_turns"].as_array().map(Vec::len), Some(0));

    // The human forms say the same.
    let text = ok({
        let mut c = huddle(&db);
        c.args(["tasks", "--room", "lab"]);
        c
    });
    assert!(
        text.contains("40 tasks: 40 done, 0 claimed, 0 ready"),
        "{text}"
    );
    assert!(text.contains("ready frontier: (empty)"), "{text}");
    let text = ok({
        let mut c = huddle(&db);
        c.args(["board", "--room", "lab"]);
        c
    });
    for agent in per_agent.keys() {
        assert!(
            text.contains(agent.as_str()),
            "{agent} not on the board:\n{text}"
        );
    }
}

#[test]
fn a_command_no_relay_executed_creates_no_tasks() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "plan", "--owner", "olga"]);
        c
    });
    // No relay runs: the owner's command is only a message, so no task exists yet.
    ok({
        let mut c = huddle(&db);
        c.args([
            "post",
            "--room",
            "plan",
            "--as",
            "olga",
            "!delegate\na: first\nb: second [after a]",
        ]);
        c
    });
    let tasks = json_of(&db, &["tasks", "--room", "plan", "--json"]);
    assert_eq!(n(&tasks["summary"], "total"), 0);
    let board = json_of(&db, &["board", "--room", "plan", "--json"]);
    assert_eq!(board["owner"], "olga");
    assert_eq!(board["agents"].as_array().map(Vec::len), Some(0));
}

#[test]
fn an_unknown_room_is_an_error_that_says_how_to_create_it() {
    let (_dir, db) = db();
    ok({
        let mut c = huddle(&db);
        c.arg("migrate");
        c
    });
    for cmd in ["board", "tasks"] {
        let err = fails({
            let mut c = huddle(&db);
            c.args([cmd, "--room", "nowhere"]);
            c
        });
        assert!(err.contains("room \"nowhere\" does not exist"), "{err}");
        assert!(err.contains("huddle room create"), "{err}");
    }
}
