//! End-to-end: `@agent` on a `!delegate` line means that agent under every
//! allocation (pull, push, bid), counted by the agents' own log of real executions.

use crate::common;

use common::relays::*;
use huddle_core::TaskStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignee_does_its_tasks_under_every_allocation() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    let log = h.dir().join("runs.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat > /dev/null\necho \"$HUDDLE_AGENT $HUDDLE_TASK\" >> '{}'\necho done",
            log.display()
        ),
    );
    // Two relays, one agent each: both are free whenever a task is ready.
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    h.wait_registered(&["ada", "bo"]).await;
    let mut want: Vec<(String, String)> = Vec::new();
    for alloc in ["pull", "push", "bid"] {
        h.config(&format!("allocation {alloc}")).await;
        let ids: Vec<String> = (1..=5).map(|i| format!("{alloc}{i}")).collect();
        let lines: Vec<String> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let who = if i == 4 { "ada" } else { "bo" };
                want.push((who.to_string(), id.clone()));
                format!("{id}: step {i} @{who}")
            })
            .collect();
        h.delegate(&lines.join("\n")).await;
        h.wait_until(&format!("every {alloc} task done"), secs(90), |l| {
            ids.iter()
                .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
        })
        .await;
    }
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let text = std::fs::read_to_string(&log).expect("the agents' log");
    let mut runs: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(a, t)| (a.to_string(), t.to_string()))
        .collect();
    runs.sort();
    want.sort();
    assert_eq!(
        runs, want,
        "each task ran once, by its assignee, under pull, push and bid"
    );
}
