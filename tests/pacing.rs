//! Pacing of work (plan 0049), end to end through the real binary with exec agents
//! that log every execution: the back-off between attempts, the per-agent circuit
//! breaker, attempt deadlines (`[due D]`) and the stall timeout.

use crate::common;

use common::relays::*;
use huddle_core::protocol::task::TaskEndedBody;
use huddle_core::tasks::TaskStatus;
use huddle_core::{Timestamp, Verb};

on_both_backends!(
    a_retry_waits_out_its_back_off,
    an_always_failing_agent_is_benched_while_a_healthy_one_works,
    an_overdue_attempt_is_failed_with_a_notice_and_retried,
    a_hung_agent_is_cancelled_after_the_stall_timeout_and_retried,
    the_board_names_stuck_tasks
);

/// Lines of a side-effect log (one per real execution).
fn runs(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `(at, body)` of every `verb` row about `task` (a `task.*` body), in ledger order.
fn task_rows(l: &Ledger, verb: Verb, task: &str) -> Vec<(Timestamp, serde_json::Value)> {
    l.of_verb(verb)
        .map(|(_, r)| r)
        .filter(|r| r.body["task"] == task)
        .map(|r| (r.at, r.body.clone()))
        .collect()
}

/// A task whose first attempt fails is claimed again only once its back-off passed:
/// attempt 2's claim is no earlier than attempt 1's failure plus the back-off every
/// relay computes from the ledger, and `huddle tasks` showed when.
async fn a_retry_waits_out_its_back_off(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let failed = h.dir().join("failed-once");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"$HUDDLE_TASK $HUDDLE_ATTEMPT\" >> {log}\n\
             if mkdir {failed} 2>/dev/null; then exit 1; fi\necho ok",
            log = log.display(),
            failed = failed.display()
        ),
    );
    // Two relays, so the retry could go elsewhere at once were it not for the back-off.
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    h.wait_registered(&["ada", "bo"]).await;
    h.config("retry-backoff 4s retry-backoff-max 10s").await;
    h.delegate("pay: charge the card").await;
    h.wait_until("the first attempt failed", secs(60), |l| {
        !task_rows(l, Verb::TaskFailed, "pay").is_empty()
    })
    .await;
    // While it backs off, `huddle tasks` says until when.
    let shown = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", &h.room, "--json"]);
        c
    });
    let view: serde_json::Value = serde_json::from_str(&shown).expect("tasks --json");
    let line = view["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["id"] == "pay"))
        .cloned()
        .expect("pay in tasks");
    h.wait_until("pay done", secs(60), |l| {
        l.task("pay").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let l = &h.ledger;
    let config = l.config.config().effective(&h.room, None);
    let back_ms = huddle_core::pacing::retry_backoff_ms(&config, &h.room, "pay", 1);
    assert!((2_000..=4_000).contains(&back_ms), "{back_ms}");
    let failures = task_rows(l, Verb::TaskFailed, "pay");
    let claims = task_rows(l, Verb::TaskClaimed, "pay");
    assert_eq!((failures.len(), claims.len()), (1, 2), "{}", l.describe());
    let earliest = failures[0].0.saturating_add(back_ms as i64 * 1_000);
    assert!(
        claims[1].0 >= earliest,
        "attempt 2 claimed at {:?}, before the back-off ended at {earliest:?}",
        claims[1].0
    );
    // `tasks` showed that very time (if it looked before the retry was claimed).
    if line["status"] == "open" {
        assert_eq!(line["retry_at"], serde_json::json!(earliest.0), "{line}");
    }
    assert_eq!(runs(&log), ["pay 1", "pay 2"], "two real executions");
}

/// An agent whose every turn fails is benched after `breaker` failures in a row: it
/// runs exactly that many times while the healthy agent does every task, and the
/// board shows it benched.
async fn an_always_failing_agent_is_benched_while_a_healthy_one_works(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"$HUDDLE_AGENT $HUDDLE_TASK\" >> {log}\n\
             [ \"$HUDDLE_AGENT\" = ada ] && {{ echo 'upstream down' >&2; exit 1; }}\n\
             sleep 0.3\necho ok",
            log = log.display(),
        ),
    );
    h.spawn_relay(
        "r0",
        vec![
            AgentSpec::exec("ada", &agent),
            AgentSpec::exec("bo", &agent),
        ],
    );
    h.wait_registered(&["ada", "bo"]).await;
    h.config("breaker 2 breaker-cooldown 10m retry-backoff 0 max-attempts 5")
        .await;
    let tasks: Vec<String> = (1..=10).map(|i| format!("t{i}: step {i}")).collect();
    h.delegate(&tasks.join("\n")).await;
    h.wait_until("every task done", secs(120), |l| l.summary().done == 10)
        .await;
    h.wait_quiescent(secs(30)).await;
    let board = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["board", "--room", &h.room]);
        c
    });
    h.stop_all().await;
    let all = runs(&log);
    let ada: Vec<&String> = all.iter().filter(|r| r.starts_with("ada ")).collect();
    let bo = all.iter().filter(|r| r.starts_with("bo ")).count();
    assert_eq!(ada.len(), 2, "benched after two failures: {all:?}");
    assert_eq!(bo, 10, "bo did every task once: {all:?}");
    assert!(
        board.contains("benched by the circuit breaker (1):")
            && board.contains("ada (2 failed turns in a row) until"),
        "{board}"
    );
    let streak = h.ledger.board.room(&h.room).unwrap().failing["ada"];
    assert_eq!(streak.failed, 2);
}

/// A task whose first attempt runs past its `[due D]` is failed (`overdue: ...`) with
/// a notice to the owner, and retried; the retry that finishes in time completes it.
async fn an_overdue_attempt_is_failed_with_a_notice_and_retried(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\ncase \"$p\" in *'due-ms=\"2000\"'*) ;; *) echo 'no deadline in the prompt' >&2; exit 3;; esac\n\
             echo \"$HUDDLE_TASK $HUDDLE_ATTEMPT\" >> {log}\n\
             [ \"$HUDDLE_ATTEMPT\" = 1 ] && sleep 30\necho done",
            log = log.display(),
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.config("retry-backoff 0").await;
    h.delegate("report: write the report [due 2s]").await;
    h.wait_until("report done", secs(60), |l| {
        l.task("report")
            .is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let l = &h.ledger;
    let t = l.task("report").unwrap();
    assert_eq!((t.attempts, t.due_ms), (2, Some(2_000)));
    let failures = task_rows(l, Verb::TaskFailed, "report");
    let claims = task_rows(l, Verb::TaskClaimed, "report");
    assert_eq!(failures.len(), 1, "{}", l.describe());
    let reason = TaskEndedBody::parse(&failures[0].1).unwrap().reason;
    assert!(reason.starts_with("overdue:"), "{reason}");
    // Failed at its deadline, not at the agent's 30 s sleep or the exec timeout.
    let ran_ms = (failures[0].0.as_micros() - claims[0].0.as_micros()) / 1_000;
    assert!(
        (2_000..15_000).contains(&ran_ms),
        "attempt 1 ran {ran_ms} ms"
    );
    let notice = l
        .of_verb(Verb::CoordNote)
        .map(|(_, r)| r)
        .find(|r| r.body["about"] == "task-overdue")
        .expect("an overdue notice");
    assert_eq!(notice.body["task"], "report");
    assert_eq!(notice.body["to"], "owner");
    assert_eq!(runs(&log), ["report 1", "report 2"], "two real executions");
}

/// A turn whose agent sleeps without output is cancelled after `stall-timeout` and
/// its task retried: two real executions, the first failed as stalled well before
/// its 30 s sleep would have ended.
async fn a_hung_agent_is_cancelled_after_the_stall_timeout_and_retried(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"$HUDDLE_TASK $HUDDLE_ATTEMPT\" >> {log}\n\
             [ \"$HUDDLE_ATTEMPT\" = 1 ] && sleep 30\n\
             for i in 1 2 3 4 5 6; do echo \"working $i\" >&2; sleep 0.5; done\necho done",
            log = log.display(),
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    // The second attempt runs 3 s, longer than the timeout, but keeps talking.
    h.config("stall-timeout 2s retry-backoff 0").await;
    h.delegate("crawl: fetch the pages").await;
    h.wait_until("crawl done", secs(60), |l| {
        l.task("crawl")
            .is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let l = &h.ledger;
    let failures = task_rows(l, Verb::TaskFailed, "crawl");
    let claims = task_rows(l, Verb::TaskClaimed, "crawl");
    assert_eq!(failures.len(), 1, "{}", l.describe());
    let reason = TaskEndedBody::parse(&failures[0].1).unwrap().reason;
    assert!(
        reason.starts_with("stalled: no activity for 2s"),
        "{reason}"
    );
    let ran_ms = (failures[0].0.as_micros() - claims[0].0.as_micros()) / 1_000;
    assert!(
        (2_000..15_000).contains(&ran_ms),
        "attempt 1 ran {ran_ms} ms"
    );
    assert_eq!(runs(&log), ["crawl 1", "crawl 2"], "two real executions");
}

/// `huddle board` lists the tasks that cannot make progress and why: one waiting for
/// a task that failed for good, one whose `needs` no agent of the room declares.
async fn the_board_names_stuck_tasks(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let agent = h.script(
        "agent.sh",
        "cat >/dev/null\n[ \"$HUDDLE_TASK\" = fetch ] && exit 1\necho ok",
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("fetch: get the data [attempts 1]\nparse: parse it [after fetch]\nquery: run the query [needs sql]")
        .await;
    h.wait_until("fetch abandoned", secs(60), |l| {
        l.task("fetch")
            .is_some_and(|t| t.status == TaskStatus::Abandoned)
    })
    .await;
    let board = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["board", "--room", &h.room]);
        c
    });
    h.stop_all().await;
    assert!(
        board.contains("stuck tasks (2):")
            && board.contains("  parse: blocked by fetch (abandoned)")
            && board.contains("  query: needs sql: no agent in the room declares it"),
        "{board}"
    );
}
