//! End-to-end: the owner's `!retry` and `!cancel [with dependants]` (plan 0052),
//! through the real binary with two relays as separate processes, counting the
//! agents' real executions from their own log.

use crate::common;

use common::relays::*;
use huddle_core::tasks::TaskStatus;
use huddle_core::Verb;

on_both_backends!(an_abandoned_task_is_retried_and_a_running_chain_is_cancelled);

async fn an_abandoned_task_is_retried_and_a_running_chain_is_cancelled(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let fixed = h.dir().join("fixed");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat > /dev/null\necho \"begin $HUDDLE_TASK $HUDDLE_ATTEMPT\" >> '{log}'\n\
             case \"$HUDDLE_TASK\" in\n\
               flaky) [ -e '{fixed}' ] || {{ echo 'the API is down' >&2; exit 1; }} ;;\n\
               slow) sleep 60 ;;\n\
             esac\n\
             echo \"end $HUDDLE_TASK\" >> '{log}'\necho done",
            log = log.display(),
            fixed = fixed.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    h.wait_registered(&["ada", "bo"]).await;
    h.delegate(
        "flaky: call the API [attempts 1]\n\
         report: report on it [after flaky]\n\
         slow: the long job\n\
         tail: after the long job [after slow]\n\
         end: after that [after tail]",
    )
    .await;
    h.wait_until("flaky abandoned and slow running", secs(60), |l| {
        l.task("flaky")
            .is_some_and(|t| t.status == TaskStatus::Abandoned)
            && l.task("slow")
                .is_some_and(|t| t.status == TaskStatus::Claimed)
    })
    .await;
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("(blocked by: flaky abandoned)"),
        "{listing}"
    );

    // Cancel the running chain: its turn is stopped, nothing after it runs.
    let reply = h.owner_says("!cancel slow with dependants").await;
    assert!(
        reply.starts_with("Cancelling slow and every task that waits for them"),
        "{reply}"
    );
    h.wait_until("the chain cancelled and its turn ended", secs(60), |l| {
        ["slow", "tail", "end"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Cancelled))
            && l.of_verb(Verb::TurnFailed).any(|(_, r)| {
                r.body["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("cancelled task slow (!cancel)"))
            })
    })
    .await;
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("2 cancelled") || listing.contains("3 cancelled"),
        "{listing}"
    );

    // Fix the API and retry: flaky runs again (attempt 2), then its dependant.
    std::fs::write(&fixed, "").expect("mark the API fixed");
    let reply = h.owner_says("!retry flaky").await;
    assert!(reply.starts_with("Retrying flaky"), "{reply}");
    let refused = h.owner_says("!retry nope").await;
    assert!(refused.contains("room has no task `nope`"), "{refused}");
    h.wait_until("flaky and report done", secs(60), |l| {
        ["flaky", "report"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    let text = std::fs::read_to_string(&log).expect("the agents' log");
    let count = |line: &str| text.lines().filter(|l| *l == line).count();
    assert_eq!(count("begin flaky 1"), 1, "{text}");
    assert_eq!(count("begin flaky 2"), 1, "the retry ran once:\n{text}");
    assert_eq!(count("end flaky"), 1, "{text}");
    assert_eq!(count("begin report 1"), 1, "{text}");
    assert_eq!(count("begin slow 1"), 1, "{text}");
    assert_eq!(
        count("end slow"),
        0,
        "the cancelled turn was stopped:\n{text}"
    );
    assert!(
        !text.contains("tail") && !text.contains("begin end"),
        "no cancelled task ran:\n{text}"
    );
    let t = h.ledger.task("flaky").expect("flaky");
    assert_eq!((t.generation, t.attempts, t.max_attempts), (1, 2, 4));
    let shown = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["task", "show", "lobby", "tail"]);
        c
    });
    assert!(shown.contains("cancelled"), "{shown}");
}

on_both_backends!(agents_receive_the_trace_of_their_work);

/// Every task turn gets `HUDDLE_TRACE` (and `trace="..."` in its prompt): the id of the
/// `!delegate` that created the task, which `huddle trace` takes.
async fn agents_receive_the_trace_of_their_work(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("traces.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\ncase \"$p\" in *\"trace=\\\"$HUDDLE_TRACE\\\"\"*) ;; *) echo 'no trace in the prompt' >&2; exit 3;; esac\n\
             echo \"$HUDDLE_TASK $HUDDLE_TRACE\" >> '{}'\necho done",
            log.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("one: first\ntwo: second [after one]").await;
    h.delegate("three: another command's task").await;
    h.wait_until("all done", secs(60), |l| {
        ["one", "two", "three"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let text = std::fs::read_to_string(&log).expect("the agent's log");
    let traces: std::collections::BTreeMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once(' ')).collect();
    let command = |t: &str| h.ledger.task(t).and_then(|t| t.command).expect("a command");
    for t in ["one", "two", "three"] {
        assert_eq!(
            traces.get(t).copied(),
            Some(command(t).to_string().as_str()),
            "{text}"
        );
    }
    assert_eq!(command("one"), command("two"));
    assert_ne!(command("one"), command("three"));
    let traced = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["trace", "--room", "lobby", traces["one"]]);
        c
    });
    assert!(
        traced.contains("one") && traced.contains("two") && !traced.contains("three"),
        "{traced}"
    );
}
