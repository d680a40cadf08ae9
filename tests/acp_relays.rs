//! Three relays, each hosting an ACP agent (the scripted agent built on the ACP SDK,
//! `huddle-acp-test-agent`), work a 100-task DAG: every task completes exactly once
//! and no agent is prompted for a task twice.

mod common;

use common::relays::{secs, AgentSpec, Backend, Huddle};
use std::collections::BTreeMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_drive_acp_agents_through_a_dag_exactly_once() {
    let agent = common::workspace_bin("huddle-relay", "huddle-acp-test-agent");
    let mut h = Huddle::new(Backend::Sqlite).await;
    let log = h.dir().join("acp-events.log");
    let keys = ["ada", "bob", "cy"];
    for (i, key) in keys.iter().enumerate() {
        let command = vec![
            "env".to_string(),
            format!("ACP_TEST_LOG={}", log.display()),
            agent.display().to_string(),
        ];
        let cwd = h.dir().join(format!("work-{key}"));
        h.spawn_relay(&format!("r{i}"), vec![AgentSpec::acp(key, command, &cwd)]);
    }
    h.wait_registered(&keys).await;
    // t0000..t0009 are free; every later task waits for the one ten before it.
    let dag: Vec<String> = (0..100)
        .map(|i| {
            if i < 10 {
                format!("t{i:04}: job {i}")
            } else {
                format!("t{i:04}: job {i} [after t{:04}]", i - 10)
            }
        })
        .collect();
    h.delegate(&dag.join("\n")).await;
    h.wait_until("100 tasks done", secs(180), |l| l.summary().done == 100)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(100);
    let text = std::fs::read_to_string(&log).expect("the agents' log");
    let mut prompted: BTreeMap<&str, usize> = BTreeMap::new();
    for task in text.lines().filter_map(|l| l.strip_prefix("task ")) {
        *prompted.entry(task).or_default() += 1;
    }
    assert_eq!(prompted.len(), 100, "tasks prompted");
    let repeated: Vec<_> = prompted.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "tasks prompted more than once: {repeated:?}"
    );
    // Every agent process was started once per relay: none crashed or restarted.
    assert_eq!(text.lines().filter(|l| l.starts_with("start ")).count(), 3);
}
