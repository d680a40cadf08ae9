//! Three relays, each hosting an ACP agent (the scripted agent built on the ACP SDK,
//! `huddle-acp-test-agent`), work a 100-task DAG: every task completes exactly once
//! and no agent is prompted for a task twice. On both backends. And `huddle relay
//! --check` reports every configured agent.

use crate::common;

use common::relays::{relay_toml, secs, AgentSpec, Backend, DriverSpec, Huddle};
use huddle_core::protocol::TurnRepliedBody;
use huddle_core::Verb;
use std::collections::BTreeMap;

on_both_backends!(three_relays_drive_acp_agents_through_a_dag_exactly_once);

async fn three_relays_drive_acp_agents_through_a_dag_exactly_once(backend: Backend) {
    let agent = common::workspace_bin("huddle-relay", "huddle-acp-test-agent");
    let mut h = Huddle::new(backend).await;
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
    // t0000..t0009 are free; every later task waits for the one ten before it. Tasks
    // ending in 3 make the agent report a tool call (`@tool`), which the turn's
    // record must carry.
    let label = |i: usize| {
        if i % 10 == 3 {
            format!("@tool read src/t{i}.rs")
        } else {
            format!("job {i}")
        }
    };
    let dag: Vec<String> = (0..100)
        .map(|i| {
            if i < 10 {
                format!("t{i:04}: {}", label(i))
            } else {
                format!("t{i:04}: {} [after t{:04}]", label(i), i - 10)
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
    // What the agents did is in their turns' records (plan 0025).
    let mut with_activity = BTreeMap::new();
    for (_, row) in h.ledger.of_verb(Verb::TurnReplied) {
        let body: TurnRepliedBody = serde_json::from_value(row.body.clone()).expect("turn.replied");
        if !body.activity.is_empty() {
            with_activity.insert(body.subject.id.clone(), body.activity);
        }
    }
    assert_eq!(
        with_activity.keys().cloned().collect::<Vec<_>>(),
        (0..100)
            .filter(|i| i % 10 == 3)
            .map(|i| format!("t{i:04}"))
            .collect::<Vec<_>>()
    );
    for (task, activity) in &with_activity {
        let n: usize = task[1..].parse().expect("task number");
        assert_eq!(activity.tool_calls, 1, "{task}: {activity:?}");
        let call = &activity.tools[0];
        assert_eq!(
            (
                call.title.as_str(),
                call.kind.as_str(),
                call.status.as_str()
            ),
            (format!("src/t{n}.rs").as_str(), "read", "completed"),
            "{task}"
        );
    }
    // Every agent process was started once per relay: none crashed or restarted.
    assert_eq!(text.lines().filter(|l| l.starts_with("start ")).count(), 3);
}

/// `huddle relay --check` starts each agent, prints one line per agent and fails when
/// any cannot run; it needs no database.
#[test]
fn relay_check_reports_every_agent_and_fails_when_one_cannot_run() {
    let agent = common::workspace_bin("huddle-relay", "huddle-acp-test-agent")
        .display()
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let ada = AgentSpec::acp("ada", vec![agent.clone()], &dir.path().join("ada"));
    let bob = AgentSpec::acp(
        "bob",
        vec!["env".into(), "ACP_TEST_INIT=fail".into(), agent],
        &dir.path().join("bob"),
    );
    let cy = AgentSpec {
        key: "cy".into(),
        driver: DriverSpec::Exec {
            command: vec!["no-such-agent-program".into()],
            timeout_ms: 1000,
        },
        capabilities: Vec::new(),
        priority: None,
    };
    let database = "sqlite:///nonexistent/huddle.db";
    let check = |name: &str, agents: &[AgentSpec]| {
        let config = dir.path().join(name);
        std::fs::write(&config, relay_toml("r0", database, &["lobby"], agents))
            .expect("write the config");
        let mut c = common::huddle(database);
        c.arg("relay").arg("--check").arg("--config").arg(&config);
        let out = common::run(c);
        let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
        (out.status.success(), stdout)
    };

    let (passed, out) = check("good.toml", std::slice::from_ref(&ada));
    assert!(passed, "{out}");
    assert!(
        out.starts_with("ok    ada: acp ") && out.contains("huddle-acp-test-agent 1.0.0"),
        "{out}"
    );

    let (passed, out) = check("bad.toml", &[ada, bob, cy]);
    assert!(!passed, "a failing agent fails the check: {out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("ok    ada: "), "{out}");
    assert!(lines[1].starts_with("FAIL  bob: "), "{out}");
    assert!(
        lines[2].starts_with("FAIL  cy: ") && lines[2].contains("no-such-agent-program"),
        "{out}"
    );
}
