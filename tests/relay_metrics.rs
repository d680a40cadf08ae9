//! End-to-end: `huddle relay --metrics` (plan 0055), on SQLite and Postgres. A relay
//! with two simulated agents works a small DAG while the test scrapes its metrics: the
//! counters move while it works, and at the end the turns it ended with a reply equal
//! the tasks done in the ledger, its task claims won cover them, and both histograms
//! are there with their counts. Another Host is refused; a non-loopback address needs
//! `--metrics-allow-remote`.

use crate::common;
use crate::dashboard::get_with;

use std::collections::BTreeMap;
use std::time::Instant;

use common::relays::{ms, secs, AgentSpec, Backend, Huddle};
use common::*;

/// A scrape: every sample by its series (name and labels as written).
fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (status, text) = get_with(addr, "/metrics", &[]);
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics text: {text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("a sample: {l}"));
            let value = value.parse().unwrap_or_else(|_| panic!("a number: {l}"));
            (series.to_string(), value)
        })
        .collect()
}

/// The value of `name{relay="r0",<labels>}`.
fn get(m: &BTreeMap<String, f64>, name: &str, labels: &str) -> f64 {
    let series = if labels.is_empty() {
        format!("{name}{{relay=\"r0\"}}")
    } else {
        format!("{name}{{relay=\"r0\",{labels}}}")
    };
    *m.get(&series)
        .unwrap_or_else(|| panic!("no {series} in {m:#?}"))
}

on_both_backends!(a_relay_serves_its_metrics_and_they_follow_its_work);

async fn a_relay_serves_its_metrics_and_they_follow_its_work(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    // A non-loopback address is refused before anything starts.
    let config = h.dir().join("unused.toml");
    let err = fails({
        let mut c = huddle(&h.db.url);
        c.args(["relay", "--config"])
            .arg(&config)
            .args(["--metrics", "0.0.0.0:0"]);
        c
    });
    assert!(err.contains("--metrics-allow-remote"), "{err}");

    h.spawn_relay_flags(
        "r0",
        vec![AgentSpec::sim("ava", 40), AgentSpec::sim("ben", 40)],
        &["--metrics", "127.0.0.1:0"],
    );
    let url = h
        .relay("r0")
        .expect_stdout_line("the metrics URL", secs(60), |l| {
            l.starts_with("http://127.0.0.1:") && l.ends_with("/metrics")
        });
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    h.wait_registered(&["ava", "ben"]).await;
    let start = scrape(&addr);
    assert_eq!(
        get(&start, "huddle_relay_turns_started_total", "work=\"task\""),
        0.0
    );
    let folded_at_start = get(&start, "huddle_relay_rows_folded_total", "");
    assert!(folded_at_start > 0.0, "the relay read the room");

    // Eight tasks: a chain of four beside four independent ones.
    h.delegate(
        "a1: one\na2: two [after a1]\na3: three [after a2]\na4: four [after a3]\n\
         b1: x\nb2: y\nb3: z\nb4: w",
    )
    .await;
    // While it works, the counters move.
    h.wait_until("some tasks done", secs(60), |l| l.summary().done >= 2)
        .await;
    let mid = scrape(&addr);
    assert!(get(&mid, "huddle_relay_turns_started_total", "work=\"task\"") >= 2.0);
    assert!(
        get(
            &mid,
            "huddle_relay_claim_acquires_total",
            "kind=\"task\",result=\"won\""
        ) >= 2.0
    );
    assert!(get(&mid, "huddle_relay_rows_folded_total", "") > folded_at_start);
    // Writes are counted when their answer arrives, after the ledger shows them, and
    // results and hand-offs of turns ending together share one write (plans 0081,
    // 0082): the first hand-off, at least, is counted by now.
    assert!(get(&mid, "huddle_relay_appends_total", "fenced=\"true\"") >= 1.0);

    h.wait_until("every task done", secs(60), |l| l.summary().done == 8)
        .await;
    h.wait_quiescent(secs(30)).await;
    let done = h.ledger.summary().done as f64;
    // The turn's end is counted before its completion is written, so the counts are
    // final once the ledger has every completion; the wait bounds scheduling noise.
    let deadline = Instant::now() + secs(10);
    let end = loop {
        let m = scrape(&addr);
        if get(&m, "huddle_relay_turns_running", "") == 0.0 || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(ms(50));
    };
    let replied = get(
        &end,
        "huddle_relay_turns_ended_total",
        "work=\"task\",outcome=\"replied\"",
    );
    assert_eq!(replied, done, "turns ended with a reply = tasks done");
    let started = get(&end, "huddle_relay_turns_started_total", "work=\"task\"");
    let ended: f64 = ["replied", "failed", "cancelled", "lost", "not_started"]
        .iter()
        .map(|o| {
            get(
                &end,
                "huddle_relay_turns_ended_total",
                &format!("work=\"task\",outcome=\"{o}\""),
            )
        })
        .sum();
    assert_eq!(started, ended, "every task turn started has ended");
    assert_eq!(get(&end, "huddle_relay_turns_running", ""), 0.0);
    // The chain a1 → a4 ends one turn at a time: four result writes at least.
    assert!(get(&end, "huddle_relay_appends_total", "fenced=\"true\"") >= 4.0);
    assert!(
        get(
            &end,
            "huddle_relay_claim_acquires_total",
            "kind=\"task\",result=\"won\""
        ) >= done
    );
    // One claim a task turn (plan 0094): the task claim names the relay as its
    // driver, and no drive claim is taken for a task.
    assert_eq!(
        get(
            &end,
            "huddle_relay_claim_acquires_total",
            "kind=\"drive\",result=\"won\""
        ),
        0.0
    );
    assert!(get(&end, "huddle_relay_appended_rows_total", "") >= 2.0 * done);
    assert_eq!(get(&end, "huddle_relay_rows_skipped_total", ""), 0.0);
    assert_eq!(get(&end, "huddle_relay_fenced_refusals_total", ""), 0.0);
    assert_eq!(get(&end, "huddle_relay_outbox_depth", ""), 0.0);
    // The histograms: one duration per task turn that ran, in cumulative buckets.
    assert_eq!(
        get(
            &end,
            "huddle_relay_turn_duration_seconds_count",
            "work=\"task\""
        ),
        ended
            - get(
                &end,
                "huddle_relay_turns_ended_total",
                "work=\"task\",outcome=\"not_started\""
            ),
    );
    assert_eq!(
        get_bucket(&end, "work=\"task\""),
        get(
            &end,
            "huddle_relay_turn_duration_seconds_count",
            "work=\"task\""
        ),
    );
    assert!(
        get(
            &end,
            "huddle_relay_turn_duration_seconds_sum",
            "work=\"task\""
        ) > 0.0
    );
    assert!(
        get(&end, "huddle_relay_wake_latency_seconds_count", "") > 0.0,
        "the doorbell woke the relay"
    );
    assert!(end
        .keys()
        .any(|k| k.starts_with("huddle_relay_wake_latency_seconds_bucket{")));

    // Only loopback host names; only /metrics.
    let (status, _) = get_with(&addr, "/metrics", &[("Host", "evil.example")]);
    assert_eq!(status, 403);
    let (status, _) = get_with(&addr, "/other", &[]);
    assert_eq!(status, 404);
    h.stop_all().await;
}

/// The `+Inf` bucket of the duration histogram, whatever the label order.
fn get_bucket(m: &BTreeMap<String, f64>, labels: &str) -> f64 {
    m.iter()
        .find(|(k, _)| {
            k.starts_with("huddle_relay_turn_duration_seconds_bucket{")
                && k.contains(labels)
                && k.contains("le=\"+Inf\"")
        })
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no +Inf bucket for {labels}"))
}
