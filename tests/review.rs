//! Review gates (plan 0053), end to end through the real binary: relays as separate
//! processes driving exec agents that log every real execution, a reviewer driven by
//! its relay, and a reviewer acting for itself through `huddle task review`.

use crate::common;

use common::relays::*;
use huddle_core::tasks::TaskStatus;

on_both_backends!(
    a_driven_reviewer_sends_work_back_once_then_accepts,
    a_reviewer_acting_for_itself_judges_with_the_cli
);

/// Lines of a side-effect log (one per real execution).
fn runs(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// One script for every agent: a review turn (`HUDDLE_REVIEW=1`) rejects round 1 and
/// accepts round 2 after checking that the submitted result is in its prompt; a work
/// turn keeps its prompt and answers with a result naming the attempt. Every
/// execution is a line of `log`.
fn agent_script(h: &Huddle, log: &std::path::Path) -> std::path::PathBuf {
    let dir = h.dir().display().to_string();
    h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\n\
             if [ \"$HUDDLE_REVIEW\" = 1 ]; then\n\
               echo \"review $HUDDLE_TASK $HUDDLE_ATTEMPT $HUDDLE_AGENT\" >> '{log}'\n\
               case \"$p\" in *\"<result>result of $HUDDLE_TASK attempt\"*) ;; \
                 *) echo 'no submitted result in the prompt' >&2; exit 3;; esac\n\
               if [ \"$HUDDLE_ATTEMPT\" = 1 ]; then echo 'REJECT: add the tests'; else echo 'ACCEPT: good'; fi\n\
             else\n\
               echo \"work $HUDDLE_TASK $HUDDLE_ATTEMPT $HUDDLE_EFFECT_KEY\" >> '{log}'\n\
               printf '%s' \"$p\" > '{dir}/prompt-'\"$HUDDLE_TASK-$HUDDLE_ATTEMPT\"\n\
               echo \"result of $HUDDLE_TASK attempt $HUDDLE_ATTEMPT\"\n\
             fi",
            log = log.display(),
        ),
    )
}

/// The worker and the reviewer on two relays: the first submission is rejected, the
/// work is done once more with the feedback in its prompt (and a new effect key), the
/// second submission is accepted, and only then does the dependant run. Each real
/// execution happens exactly once.
async fn a_driven_reviewer_sends_work_back_once_then_accepts(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let agent = agent_script(&h, &log);
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("lead", &agent)]);
    h.wait_registered(&["ada", "lead"]).await;
    h.delegate("api: build the API [review @lead]\ndocs: document it [after api]")
        .await;
    h.wait_until("api accepted and docs done", secs(90), |l| {
        ["api", "docs"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("[review @lead, 1 of 3 rejected]"),
        "{listing}"
    );
    let shown = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["task", "show", "lobby", "api"]);
        c
    });
    assert!(
        shown.contains("reject by lead: add the tests") && shown.contains("accept by lead"),
        "{shown}"
    );
    h.stop_all().await;

    let lines = runs(&log);
    let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("work api 1 "), 1, "{lines:#?}");
    assert_eq!(count("work api 2 "), 1, "the redo ran once: {lines:#?}");
    assert_eq!(count("review api 1 lead"), 1, "{lines:#?}");
    assert_eq!(count("review api 2 lead"), 1, "{lines:#?}");
    assert_eq!(count("work docs 1 "), 1, "{lines:#?}");
    assert_eq!(lines.len(), 5, "no other execution: {lines:#?}");
    let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix));
    assert!(
        at("work docs") > at("review api 2"),
        "docs ran only after api was accepted: {lines:#?}"
    );
    let key = |prefix: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_ne!(
        key("work api 1 "),
        key("work api 2 "),
        "a redo after a rejection has its own effect key"
    );
    let redo = std::fs::read_to_string(h.dir().join("prompt-api-2")).expect("the redo's prompt");
    assert!(
        redo.contains("<review-feedback from=\"lead\" round=\"1\">")
            && redo.contains("add the tests")
            && redo.contains("<rejected-result>result of api attempt 1</rejected-result>"),
        "{redo}"
    );
    let t = h.ledger.task("api").expect("api");
    assert_eq!((t.generation, t.rejections, t.attempts), (1, 1, 2));
    assert_eq!(t.result.as_deref(), Some("result of api attempt 2"));
}

/// A reviewer no relay hosts answers with `huddle task review`: only it may, only
/// while the task is submitted; a rejection sends the work back to the relay's agent,
/// an acceptance lets the dependant run.
async fn a_reviewer_acting_for_itself_judges_with_the_cli(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    let agent = agent_script(&h, &log);
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("a: do it [review @rev rounds 2]\nb: then this [after a]")
        .await;
    let submitted = |generation: u32| {
        move |l: &Ledger| {
            l.task("a")
                .is_some_and(|t| t.status == TaskStatus::Submitted && t.generation == generation)
        }
    };
    h.wait_until("a submitted", secs(60), submitted(0)).await;
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("submitted") && listing.contains("(waiting for rev's verdict)"),
        "{listing}"
    );
    let url = h.db.url.clone();
    let review = |agent: &str, args: &[&str]| {
        let mut c = common::huddle(&url);
        c.args(["task", "review", "--room", "lobby", "--agent", agent]);
        c.args(args);
        c
    };
    let refused = common::fails(review("ada", &["a", "accept"]));
    assert!(
        refused.contains("not_reviewable") && refused.contains("its reviewer is rev"),
        "{refused}"
    );
    let bad = common::fails(review("rev", &["a", "maybe"]));
    assert!(bad.contains("write accept or reject"), "{bad}");
    let out = common::ok(review("rev", &["a", "reject", "--feedback", "wrong file"]));
    // Open again once rejected; the relay may already have claimed it (or even had
    // the redo submitted) by the time the command reads the task back.
    assert!(
        ["open", "claimed", "submitted"]
            .iter()
            .any(|s| out.contains(&format!("reject a: the task is {s} now"))),
        "{out}"
    );
    h.wait_until("a submitted again", secs(60), submitted(1))
        .await;
    let out = common::ok(review("rev", &["a", "accept", "--json"]));
    let json: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (json["verdict"].as_str(), json["status"].as_str()),
        (Some("accept"), Some("done"))
    );
    let again = common::fails(review("rev", &["a", "accept"]));
    assert!(
        again.contains("it is done, not waiting for a review"),
        "{again}"
    );
    h.wait_until("b done", secs(60), |l| {
        l.task("b").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let lines = runs(&log);
    let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(
        (count("work a 1 "), count("work a 2 "), count("work b 1 ")),
        (1, 1, 1),
        "{lines:#?}"
    );
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let redo = std::fs::read_to_string(h.dir().join("prompt-a-2")).expect("the redo's prompt");
    assert!(redo.contains("wrong file"), "{redo}");
}
