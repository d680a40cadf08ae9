//! Agents working as a team (issue 16), end to end through the real binary with exec
//! agents that log every execution: effect keys, repeated posts, agent-to-agent hop
//! limits, notices for unanswerable messages, settled rooms and `huddle wait`.

use crate::common;

use common::relays::*;
use huddle_core::tasks::TaskStatus;

on_both_backends!(the_effect_key_is_stable_across_attempts_and_differs_across_tasks);

/// A task whose first attempt fails is retried; both attempts see the same
/// `HUDDLE_EFFECT_KEY`, another task a different one, and the key is in the prompt.
async fn the_effect_key_is_stable_across_attempts_and_differs_across_tasks(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("keys.log");
    let failed = h.dir().join("failed-once");
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\necho \"$HUDDLE_TASK $HUDDLE_ATTEMPT $HUDDLE_EFFECT_KEY\" >> {log}\n\
             case \"$p\" in *\"effect-key=\\\"$HUDDLE_EFFECT_KEY\\\"\"*) ;; *) echo 'no key in prompt' >&2; exit 3;; esac\n\
             if [ \"$HUDDLE_TASK\" = flaky ] && mkdir {failed} 2>/dev/null; then exit 1; fi\necho ok",
            log = log.display(),
            failed = failed.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("flaky: charge the card\nsteady: send the receipt").await;
    h.wait_until("both done", secs(60), |l| {
        ["flaky", "steady"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let runs: Vec<(String, String, String)> = lines
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            Some((p.next()?.into(), p.next()?.into(), p.next()?.into()))
        })
        .collect();
    let flaky: Vec<&(String, String, String)> = runs.iter().filter(|r| r.0 == "flaky").collect();
    let steady: Vec<&(String, String, String)> = runs.iter().filter(|r| r.0 == "steady").collect();
    assert_eq!(flaky.len(), 2, "one failed attempt, one retry: {lines}");
    assert_eq!((flaky[0].1.as_str(), flaky[1].1.as_str()), ("1", "2"), "{lines}");
    assert_eq!(flaky[0].2, flaky[1].2, "the key is the same across attempts: {lines}");
    assert_eq!(flaky[0].2.len(), 32, "{lines}");
    assert_eq!(steady.len(), 1, "{lines}");
    assert_ne!(steady[0].2, flaky[0].2, "tasks have different keys: {lines}");
    assert_eq!(
        flaky[0].2,
        huddle_core::protocol::task_effect_key(&h.room, "flaky"),
        "the key is the documented derivation"
    );
}
