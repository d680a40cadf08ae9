//! Agents working as a team (issue 16), end to end through the real binary with exec
//! agents that log every execution: effect keys, repeated posts, agent-to-agent hop
//! limits, notices for unanswerable messages, settled rooms and `huddle wait`.

use crate::common;

use common::relays::*;
use huddle_core::tasks::TaskStatus;
use huddle_core::{InteractionId, Role, Verb};

on_both_backends!(
    the_effect_key_is_stable_across_attempts_and_differs_across_tasks,
    repeated_posts_hops_notices_and_settled_rooms
);

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
    h.delegate("flaky: charge the card\nsteady: send the receipt")
        .await;
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
    assert_eq!(
        (flaky[0].1.as_str(), flaky[1].1.as_str()),
        ("1", "2"),
        "{lines}"
    );
    assert_eq!(
        flaky[0].2, flaky[1].2,
        "the key is the same across attempts: {lines}"
    );
    assert_eq!(flaky[0].2.len(), 32, "{lines}");
    assert_eq!(steady.len(), 1, "{lines}");
    assert_ne!(
        steady[0].2, flaky[0].2,
        "tasks have different keys: {lines}"
    );
    assert_eq!(
        flaky[0].2,
        huddle_core::protocol::task_effect_key(&h.room, "flaky"),
        "the key is the documented derivation"
    );
}

/// Runs `huddle wait` and returns (exit code, stdout + stderr).
fn wait(h: &Huddle, timeout: u64) -> (i32, String) {
    let out = common::huddle(&h.db.url)
        .args(["wait", "--room", &h.room, "--timeout", &timeout.to_string()])
        .output()
        .expect("run huddle wait");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// One world for the silences of issue 16, counting executions: the same text posted
/// twice is two messages, each answered; an agent-to-agent chain stops at `max-hops`;
/// a message whose reply turns all failed gets a notice to its author; a room that
/// settles gets one `room.settled`, and `huddle wait` exits 0 (all done), 2 (a task
/// abandoned) or 124 (timed out).
async fn repeated_posts_hops_notices_and_settled_rooms(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("executions.log");
    let go = h.dir().join("go");
    // ann hands over to bo and bo back to ann (a chain); "[fail]" and task `bad` fail.
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\necho \"$HUDDLE_AGENT ${{HUDDLE_TASK:-msg}}\" >> {log}\n\
             p=$(printf '%s' \"$p\" | sed -n '/^<message /,$p')\n\
             case \"$p\" in *\"[fail]\"*) exit 1;; esac\n\
             [ \"$HUDDLE_TASK\" = bad ] && exit 1\n\
             if [ \"$HUDDLE_TASK\" = slow ]; then i=0; while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; fi\n\
             case \"$p\" in *\"[chain]\"*) if [ \"$HUDDLE_AGENT\" = ann ]; then echo '@bo [chain] over to you'; else echo '@ann [chain] back to you'; fi; exit 0;; esac\n\
             echo \"$HUDDLE_AGENT ok\"",
            log = log.display(),
            go = go.display()
        ),
    );
    h.spawn_relay(
        "r0",
        vec![
            AgentSpec::exec("ann", &agent),
            AgentSpec::exec("bo", &agent),
        ],
    );
    h.wait_registered(&["ann", "bo"]).await;
    let runs = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();

    // The same text twice from the CLI: two messages, two answers.
    let post = |h: &Huddle, text: &str| -> InteractionId {
        let mut c = common::huddle(&h.db.url);
        c.args(["post", "--room", &h.room, "--as", "hank", text]);
        common::ok(c).trim().parse().expect("post prints the id")
    };
    let y1 = post(&h, "@ann yes");
    let y2 = post(&h, "@ann yes");
    assert_ne!(y1, y2, "repeated text is a new message");
    for id in [y1, y2] {
        h.wait_until("ann's answer", secs(60), |l| l.replies_to(id).len() == 1)
            .await;
    }

    // An agent-to-agent chain: with max-hops 1, ann's hand-over (hops 1) is answered
    // by bo, whose hand-back (hops 2) is answered by nobody.
    h.config("max-hops 1").await;
    let start = post(&h, "@ann [chain] start");
    let handover = h
        .wait_for("ann's hand-over", secs(60), |l| {
            l.replies_to(start).first().map(|r| r.id)
        })
        .await;
    let back = h
        .wait_for("bo's hand-back", secs(60), |l| {
            l.replies_to(handover).first().map(|r| r.id)
        })
        .await;
    h.wait_quiescent(secs(30)).await;
    // A marker after the chain: once it is answered, a third link would have run.
    let marker = post(&h, "@ann after the chain");
    h.wait_until("the marker answered", secs(60), |l| {
        !l.replies_to(marker).is_empty()
    })
    .await;
    let l = &h.ledger;
    assert_eq!(
        l.get(handover).map(|r| r.body["hops"].clone()),
        Some(1.into())
    );
    assert_eq!(l.get(back).map(|r| r.body["hops"].clone()), Some(2.into()));
    assert!(l.replies_to(back).is_empty(), "max-hops ends the chain");
    assert!(
        l.get(y1).is_some_and(|r| r.body.get("hops").is_none()),
        "a person's post carries no hops"
    );

    // Every reply turn failed: a notice to the author, and one execution.
    h.config("max-reply-failures 1").await;
    let doomed = post(&h, "@bo [fail] please");
    let notice = h
        .wait_for("the notice", secs(60), |l| {
            l.of_verb(Verb::MessagePosted)
                .map(|(_, r)| r)
                .find(|r| r.role == Role::System && r.parent == Some(doomed))
                .map(|r| r.body["text"].as_str().unwrap_or_default().to_string())
        })
        .await;
    assert!(notice.contains("reply turns failed"), "{notice}");

    // Settled rooms and `huddle wait`.
    h.delegate("w1: write it\nw2: check it [after w1]").await;
    let (code, text) = wait(&h, 60);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 of 2 tasks done"), "{text}");
    h.config("max-attempts 1").await;
    h.delegate("bad: this fails").await;
    let (code, text) = wait(&h, 60);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("1 abandoned"), "{text}");

    // A task still running: the room has not settled when the timeout passes.
    h.delegate("slow: takes a while").await;
    let (code, text) = wait(&h, 2);
    assert_eq!(code, 124, "{text}");
    assert!(text.contains("did not settle"), "{text}");
    std::fs::write(&go, "").expect("let the slow task finish");
    let (code, text) = wait(&h, 60);
    assert_eq!(code, 2, "still one abandoned: {text}");
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let settled: Vec<serde_json::Value> = h
        .ledger
        .of_verb(Verb::RoomSettled)
        .map(|(_, r)| r.body.clone())
        .collect();
    assert_eq!(
        settled,
        vec![
            serde_json::json!({"total": 2, "done": 2, "abandoned": 0, "blocked": 0}),
            serde_json::json!({"total": 3, "done": 2, "abandoned": 1, "blocked": 0}),
            serde_json::json!({"total": 4, "done": 3, "abandoned": 1, "blocked": 0}),
        ],
        "one row per settling"
    );

    let ran = runs(&log);
    let count = |needle: &str| ran.lines().filter(|l| *l == needle).count();
    assert_eq!(
        count("bo msg"),
        2,
        "bo: the chain link and the failed turn: {ran}"
    );
    assert_eq!(count("ann bad") + count("bo bad"), 1, "one attempt: {ran}");
}
