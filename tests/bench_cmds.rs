//! The benches as commands: `huddle bench tasks` hands every task out exactly once
//! through relay processes beside its plain-SQL queue, and neither it nor `huddle
//! bench ledger` leaves anything behind in (or beside) the database it was given; nor
//! does `huddle bench startup`, whose relays read their own room only.

use std::process::Command;

use super::common::huddle_bin;

/// Files in `dir`, sorted.
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Nothing is left in `dir`: neither the scratch database beside the given one nor
/// the given one.
fn assert_nothing_left(dir: &std::path::Path) {
    assert!(files(dir).is_empty(), "left behind: {:?}", files(dir));
}

/// Runs `huddle --db DB bench ARGS... --json`, requires success and returns its
/// JSON report.
fn bench_report(db: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(huddle_bin())
        .arg("--db")
        .arg(db)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run huddle bench");
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// `bench tasks` arguments for a small run: `tasks` tasks, `agents` agents over
/// `relays` relays, 1 ms turns, then `extra`.
fn tasks_args<'a>(
    tasks: &'a str,
    agents: &'a str,
    relays: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut v = vec![
        "tasks",
        "--tasks",
        tasks,
        "--agents",
        agents,
        "--relays",
        relays,
        "--turn-ms",
        "1",
        "--stall-s",
        "30",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn bench_tasks_runs_each_task_once_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(&db, &tasks_args("30", "3", "2", &[]));
    // Unset, the relays keep their own default: one batch in flight on SQLite.
    assert_eq!(report["batches_in_flight"], 1, "{report}");
    let line = &report["lines"][0];
    assert_eq!(line["tasks"], 30);
    // Executions are counted from the turns the relays started, not from rows.
    assert_eq!(line["huddle"]["executions_per_task"].as_f64(), Some(1.0));
    assert_eq!(line["baseline"]["executions_per_task"].as_f64(), Some(1.0));
    assert!(line["huddle"]["per_s"].as_f64().is_some_and(|r| r > 0.0));
    // Pickup as the relays measured it (plan 0083): three agents with ten tasks
    // each had gaps between their turns, and a gap is never 0.
    assert!(
        line["huddle"]["pickup_p50_ms"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "{line}"
    );
    assert!(line["huddle"]["relay_peak_rss_mib"]
        .as_f64()
        .is_some_and(|m| m > 0.0));
    // The scratch database beside the given one is gone, and the given one was
    // never created.
    assert_nothing_left(dir.path());
}

/// A run that is not clean (here: it stops early, its one turn outlasting the stall
/// limit) fails, keeps its relays' logs and configurations, and says where; the
/// scratch database is still dropped.
#[test]
fn bench_tasks_keeps_the_relay_logs_of_a_run_that_is_not_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = tempfile::tempdir().expect("tempdir for the scratch directory");
    let db = dir.path().join("given.db");
    let out = Command::new(huddle_bin())
        .env("TMPDIR", tmp.path())
        .arg("--db")
        .arg(&db)
        .arg("bench")
        .args([
            "tasks",
            "--tasks",
            "2",
            "--agents",
            "1",
            "--relays",
            "1",
            "--turn-ms",
            "6000",
            "--stall-s",
            "2",
            "--no-baseline",
            "--json",
        ])
        .output()
        .expect("run huddle bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a run that stopped early must fail: {stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the report, printed before the failure");
    assert!(
        report["lines"][0]["huddle"]["stopped_early"].is_string(),
        "{report}"
    );
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(tmp.path())
        .expect("read the temporary directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("huddle-bench-tasks-"))
        })
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}; {stderr}");
    assert!(
        stderr.contains("not clean") && stderr.contains(&kept[0].display().to_string()),
        "the failure names the kept directory: {stderr}"
    );
    let inside = files(&kept[0]);
    assert!(
        inside.contains(&"bench-relay-0.log".to_string())
            && inside.contains(&"bench-relay-0.toml".to_string()),
        "{inside:?}"
    );
    let log = std::fs::read_to_string(kept[0].join("bench-relay-0.log")).expect("the log");
    assert!(log.contains("huddle_relay"), "the relay's own lines: {log}");
    assert_nothing_left(dir.path());
}

#[test]
fn bench_tasks_rounds_each_run_once_in_a_database_of_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(&db, &tasks_args("20", "2", "1", &["--rounds", "2"]));
    assert_eq!(report["rounds"], 2);
    let lines = report["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), 2, "{report}");
    let mut ratios = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["round"], i + 1);
        assert_eq!(line["tasks"], 20);
        assert_eq!(line["huddle"]["executions_per_task"].as_f64(), Some(1.0));
        assert_eq!(line["baseline"]["executions_per_task"].as_f64(), Some(1.0));
        ratios.push(line["ratio"].as_f64().expect("a ratio"));
    }
    let spread = &report["spread"][0];
    assert_eq!(spread["tasks"], 20);
    assert_eq!(spread["rounds"], 2);
    let (lo, hi) = (ratios[0].min(ratios[1]), ratios[0].max(ratios[1]));
    assert_eq!(spread["ratio_min"].as_f64(), Some(lo));
    assert_eq!(spread["ratio_max"].as_f64(), Some(hi));
    let median = spread["ratio_median"].as_f64().expect("median");
    assert!((median - (lo + hi) / 2.0).abs() < 1e-12, "{spread}");
    // Both rounds' scratch databases are gone.
    assert_nothing_left(dir.path());
}

/// `--batches-in-flight N` goes to every relay's configuration (plan 0087; a key the
/// relays did not know would stop them at start-up) and is in the report; every task
/// still runs once. Outside 1 - 4 it is refused before anything is created.
#[test]
fn bench_tasks_passes_batches_in_flight_to_its_relays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(
        &db,
        &tasks_args(
            "40",
            "4",
            "2",
            &["--no-baseline", "--lease-ahead", "--batches-in-flight", "2"],
        ),
    );
    assert_eq!(report["batches_in_flight"], 2, "{report}");
    let line = &report["lines"][0];
    assert_eq!(line["huddle"]["executions_per_task"].as_f64(), Some(1.0));
    assert_nothing_left(dir.path());
    for bad in ["0", "5"] {
        let out = Command::new(huddle_bin())
            .arg("--db")
            .arg(&db)
            .args(["bench", "tasks", "--tasks", "5", "--batches-in-flight", bad])
            .output()
            .expect("run huddle bench");
        assert!(!out.status.success(), "--batches-in-flight {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("batches-in-flight"), "{err}");
        assert_nothing_left(dir.path());
    }
}

/// `--compact-turns`: the owner sets `!config compact-turns on` before delegating
/// (plan 0095); the report says so and every task still runs once.
#[test]
fn bench_tasks_runs_a_compact_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(
        &db,
        &tasks_args("40", "4", "2", &["--no-baseline", "--compact-turns"]),
    );
    assert_eq!(report["compact_turns"], true, "{report}");
    let line = &report["lines"][0];
    assert_eq!(line["huddle"]["executions_per_task"].as_f64(), Some(1.0));
    assert_nothing_left(dir.path());
}

#[test]
fn bench_tasks_refuses_zero_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(huddle_bin())
        .arg("--db")
        .arg(dir.path().join("given.db"))
        .args(["bench", "tasks", "--tasks", "5", "--rounds", "0"])
        .output()
        .expect("run huddle bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rounds"), "{err}");
    assert_nothing_left(dir.path());
}

#[test]
fn bench_ledger_rounds_leave_no_rows_in_the_database_it_was_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let status = Command::new(huddle_bin())
        .arg("--db")
        .arg(&db)
        .args(["migrate"])
        .status()
        .expect("run huddle migrate");
    assert!(status.success());
    let before = files(dir.path());
    let report = bench_report(
        &db,
        &[
            "ledger",
            "--seconds",
            "0.4",
            "--writers",
            "2",
            "--batches",
            "1",
            "--rounds",
            "2",
        ],
    );
    // Two rounds of the three scenarios (batch-1 appends, claims, reads), round by
    // round, each a measurement of its own.
    assert_eq!(report["rounds"], 2);
    let lines = report["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), 6, "{report}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["round"], i / 3 + 1, "{line}");
        assert!(
            line["huddle_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{line}"
        );
        assert!(
            line["baseline_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{line}"
        );
    }
    // Per scenario, the range and middle of its two rounds' ratios.
    let spread = report["spread"].as_array().expect("spread");
    assert_eq!(spread.len(), 3, "{report}");
    for (k, sp) in spread.iter().enumerate() {
        assert_eq!(sp["scenario"], lines[k]["scenario"]);
        assert_eq!(sp["rounds"], 2);
        let (a, b) = (
            lines[k]["ratio"].as_f64().expect("ratio"),
            lines[k + 3]["ratio"].as_f64().expect("ratio"),
        );
        assert_eq!(sp["ratio_min"].as_f64(), Some(a.min(b)), "{sp}");
        assert_eq!(sp["ratio_max"].as_f64(), Some(a.max(b)), "{sp}");
        let median = sp["ratio_median"].as_f64().expect("median");
        assert!((median - (a + b) / 2.0).abs() < 1e-12, "{sp}");
    }
    let conn = rusqlite::Connection::open(&db).expect("open the given database");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM interaction", [], |r| r.get(0))
        .expect("count rows");
    assert_eq!(rows, 0, "the bench wrote into the database it was given");
    drop(conn);
    let after: Vec<String> = files(dir.path())
        .into_iter()
        .filter(|f| !f.starts_with("given.db"))
        .collect();
    let before: Vec<String> = before
        .into_iter()
        .filter(|f| !f.starts_with("given.db"))
        .collect();
    assert_eq!(after, before, "the scratch database was left behind");
}

#[test]
fn bench_ledger_refuses_zero_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(huddle_bin())
        .arg("--db")
        .arg(dir.path().join("given.db"))
        .args(["bench", "ledger", "--seconds", "0.2", "--rounds", "0"])
        .output()
        .expect("run huddle bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rounds"), "{err}");
    assert_nothing_left(dir.path());
}

#[test]
fn bench_startup_measures_relay_processes_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(
        &db,
        &[
            "startup",
            "--rows",
            "600",
            "--rooms",
            "3",
            "--served-rows",
            "300",
            "--runs",
            "1",
        ],
    );
    let phases = report["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2, "{report}");
    assert_eq!(phases[0]["other_rows"], 0);
    assert_eq!(phases[1]["other_rows"], 600);
    for phase in phases {
        let start = &phase["starts"][0];
        // The relay answered the waiting message, and its reader delivered its own
        // room's rows only: the history, the ping and what the starts wrote there.
        assert!(start["first_reply_ms"].as_f64().is_some_and(|ms| ms > 0.0));
        let read = start["rows_read"].as_u64().expect("rows read");
        assert!((301..400).contains(&read), "rows read: {read}");
        assert!(start["peak_rss_kib"].as_u64().is_some_and(|k| k > 0));
    }
    assert_nothing_left(dir.path());
}

/// With `--snapshot` the relay keeps a snapshot of its folds: the first start reads
/// its room from the first row and writes it, the next resumes from it and reads only
/// what the first start and the new ping added.
#[test]
fn bench_startup_with_a_snapshot_resumes_the_second_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("given.db");
    let report = bench_report(
        &db,
        &[
            "startup",
            "--rows",
            "0",
            "--served-rows",
            "400",
            "--runs",
            "2",
            "--snapshot",
        ],
    );
    let starts = report["phases"][0]["starts"].as_array().expect("starts");
    assert_eq!(starts.len(), 2, "{report}");
    assert_eq!(starts[0]["rows_resumed"], 0, "{report}");
    assert!(
        starts[0]["rows_read"].as_u64().is_some_and(|r| r > 400),
        "{report}"
    );
    let resumed = starts[1]["rows_resumed"].as_u64().expect("rows resumed");
    let read = starts[1]["rows_read"].as_u64().expect("rows read");
    assert!(
        resumed > 400 && read < 100,
        "resumed {resumed}, read {read}: {report}"
    );
    assert!(starts[1]["first_reply_ms"]
        .as_f64()
        .is_some_and(|ms| ms > 0.0));
    assert_nothing_left(dir.path());
}

/// `bench sched` hands out every task in memory, also after a long conversation
/// (`--history`: designation notes folded before the tasks arrive).
#[test]
fn bench_sched_finishes_every_task_after_a_long_conversation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("unused.db");
    let report = bench_report(
        &db,
        &[
            "sched",
            "--tasks",
            "40,80",
            "--agents",
            "4",
            "--history",
            "500",
        ],
    );
    let lines = report.as_array().expect("one line per task count");
    assert_eq!(lines.len(), 2, "{report}");
    for (line, n) in lines.iter().zip([40, 80]) {
        assert_eq!(line["tasks"], n, "{report}");
        assert_eq!(line["done"], n, "{report}");
        assert!(line["events_per_task"].as_f64().unwrap() >= 1.0, "{report}");
    }
    assert_nothing_left(dir.path());
}
