//! End-to-end: the annotations of `!delegate` lines (`[priority N]`, `[size N]`,
//! `[needs ...]`, `[attempts N]`) through relays running as separate processes, with
//! exec agents that log every real execution.

use crate::common;

use common::relays::*;
use huddle_core::TaskStatus;

/// An exec agent script that appends `$HUDDLE_TASK` to `log` at every task turn
/// (reply turns log nothing) and fails the turn of task `doomed`.
fn logging_agent(h: &Huddle, name: &str, log: &std::path::Path) -> std::path::PathBuf {
    h.script(
        name,
        &format!(
            "cat >/dev/null\n\
             [ -n \"$HUDDLE_TASK\" ] && echo \"$HUDDLE_TASK\" >> '{}'\n\
             [ \"$HUDDLE_TASK\" = doomed ] && exit 3\n\
             sleep 0.2\n\
             echo done",
            log.display()
        ),
    )
}

fn executions(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// One agent works a frontier of independent tasks and a chain: the task with the
/// lowest priority number goes first, then the head of the long chain before short
/// work, and a high priority number goes last. A `[needs gpu]` task waits for an agent
/// that declares `gpu` (on another relay); `[attempts 1]` abandons a failing task
/// after one execution. Every execution is counted from the agents' own logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_order_the_work_pick_the_agent_and_bound_attempts() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    let solo_log = h.dir().join("solo.log");
    let gpu_log = h.dir().join("gpu.log");
    let solo = logging_agent(&h, "solo.sh", &solo_log);
    let gpu = logging_agent(&h, "gpu.sh", &gpu_log);
    h.spawn_relay("r0", vec![AgentSpec::exec("solo", &solo)]);
    h.wait_registered(&["solo"]).await;
    h.delegate(
        "later: unimportant [priority 200]\n\
         short: a short job\n\
         head: start of a long chain [size 3]\n\
         mid: the middle [after head] [size 3]\n\
         tail: the end [after mid]\n\
         urgent: do this first [priority: 1]\n\
         render: needs a GPU [needs gpu]\n\
         doomed: fails every time [attempts 1]\n\
         cleanup: after the doomed one [after doomed]",
    )
    .await;
    h.wait_until("everything solo can do settled", secs(60), |l| {
        ["later", "short", "head", "mid", "tail", "urgent", "doomed"]
            .iter()
            .all(|id| {
                l.task(id)
                    .is_some_and(|t| matches!(t.status, TaskStatus::Done | TaskStatus::Abandoned))
            })
    })
    .await;
    eprintln!("solo's work settled after {:?}", h.elapsed());
    let ran = executions(&solo_log);
    let at = |id: &str| {
        let n: Vec<usize> = ran
            .iter()
            .enumerate()
            .filter(|(_, t)| *t == id)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(n.len(), 1, "{id} ran {} times: {ran:?}", n.len());
        n[0]
    };
    // The frontier at the start: urgent (priority 1); head (path 3+3+1 = 7) before
    // doomed and short (path 1, by id); later (priority 200) last of all.
    assert_eq!(at("urgent"), 0, "{ran:?}");
    assert_eq!(at("head"), 1, "{ran:?}");
    // (doomed and short rank the same: each relay breaks such ties in its own order.)
    assert!(
        at("short") < at("later") && at("doomed") < at("later"),
        "{ran:?}"
    );
    assert!(at("head") < at("mid") && at("mid") < at("tail"), "{ran:?}");
    assert!(
        !ran.iter().any(|t| t == "render"),
        "solo lacks gpu: {ran:?}"
    );
    let doomed = h.ledger.task("doomed").expect("doomed");
    assert_eq!(
        (doomed.status, doomed.attempts, doomed.max_attempts),
        (TaskStatus::Abandoned, 1, 1)
    );
    assert_eq!(
        h.ledger.task("render").map(|t| t.status),
        Some(TaskStatus::Open)
    );

    // The annotations are in `huddle tasks`, text and JSON.
    let text = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(text.contains("needs a GPU [needs gpu]"), "{text}");
    assert!(text.contains("unimportant [priority 200]"), "{text}");
    // A task behind an abandoned one says it is blocked, and by what; a done task
    // shows its result.
    let cleanup = text
        .lines()
        .find(|l| l.starts_with("cleanup "))
        .unwrap_or_else(|| panic!("no cleanup line: {text}"));
    assert!(cleanup.contains(" blocked "), "{cleanup}");
    assert!(
        cleanup.ends_with("(blocked by: doomed abandoned)"),
        "{cleanup}"
    );
    assert!(
        text.contains(", 0 waiting, 1 blocked, 1 abandoned"),
        "{text}"
    );
    let urgent = text
        .lines()
        .find(|l| l.starts_with("urgent "))
        .expect("urgent");
    assert!(
        urgent.ends_with("do this first [priority 1] => done"),
        "{urgent}"
    );
    let json: serde_json::Value = serde_json::from_str(&common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby", "--json"]);
        c
    }))
    .expect("JSON");
    let head = json["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["id"] == "head")
        .expect("head");
    assert_eq!(
        (head["size"].as_u64(), head["path"].as_u64()),
        (Some(3), Some(7))
    );
    assert_eq!(json["ready"], serde_json::json!(["render"]));
    let cleanup = json["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["id"] == "cleanup")
        .expect("cleanup");
    assert_eq!(
        cleanup["blocked_by"],
        serde_json::json!([{"task": "doomed", "reason": "abandoned"}])
    );
    assert_eq!(head["result"], "done");

    // `huddle task show`: the abandoned task's one attempt, its agent, outcome and
    // reason; a done task's result; an unknown task is an error.
    let show = |id: &str| {
        let mut c = common::huddle(&h.db.url);
        c.args(["task", "show", "lobby", id]);
        c
    };
    let doomed_text = common::ok(show("doomed"));
    assert!(
        doomed_text.starts_with("task doomed in room lobby: abandoned\n"),
        "{doomed_text}"
    );
    assert!(doomed_text.contains("attempts: 1 of 1\n"), "{doomed_text}");
    let attempt_lines: Vec<&str> = doomed_text
        .lines()
        .filter(|l| l.starts_with("  #"))
        .collect();
    assert_eq!(attempt_lines.len(), 1, "{doomed_text}");
    assert!(
        attempt_lines[0].starts_with("  #1 solo (relay r0, epoch ")
            && attempt_lines[0].contains(": failed after "),
        "{doomed_text}"
    );
    let cleanup_text = common::ok(show("cleanup"));
    assert!(
        cleanup_text.contains("blocked by: doomed abandoned\n"),
        "{cleanup_text}"
    );
    let head_json: serde_json::Value = serde_json::from_str(&common::ok({
        let mut c = show("head");
        c.arg("--json");
        c
    }))
    .expect("JSON");
    assert_eq!(head_json["task"]["status"], "done");
    assert_eq!(head_json["task"]["result"], "done");
    let head_attempts = head_json["attempts"].as_array().expect("attempts");
    assert_eq!(head_attempts.len(), 1, "{head_json}");
    assert_eq!(head_attempts[0]["agent"], "solo");
    assert_eq!(head_attempts[0]["outcome"], "completed");
    assert!(
        head_attempts[0]["duration_ms"]
            .as_i64()
            .is_some_and(|d| d >= 200),
        "{head_json}"
    );
    let missing = common::fails(show("nope"));
    assert!(
        missing.contains("room `lobby` has no task `nope`"),
        "{missing}"
    );

    // An agent with the capability, on another relay, takes it.
    let mut gpu_agent = AgentSpec::exec("gpu", &gpu);
    gpu_agent.capabilities = vec!["gpu".into()];
    gpu_agent.priority = Some(7);
    h.spawn_relay("r1", vec![gpu_agent]);
    h.wait_registered(&["gpu"]).await;
    // `priority` in huddle.toml is the agent's registered rank (`role-priority`).
    let ranks: Vec<(String, Option<u64>)> = h
        .ledger
        .of_verb(huddle_core::Verb::AgentRegistered)
        .map(|(_, r)| (r.actor.clone(), r.body["priority"].as_u64()))
        .collect();
    assert!(ranks.contains(&("gpu".into(), Some(7))), "{ranks:?}");
    assert!(
        ranks
            .iter()
            .any(|(a, p)| a == "solo" && p.is_none_or(|p| p == 100)),
        "solo has the default rank: {ranks:?}"
    );
    h.wait_quiescent(secs(60)).await;
    eprintln!("quiescent after {:?}", h.elapsed());
    h.stop_all().await;
    assert_eq!(executions(&gpu_log), ["render"]);
    let render = h.ledger.task("render").expect("render");
    assert_eq!(
        (render.status, render.owner.as_deref()),
        (TaskStatus::Done, Some("gpu"))
    );
    assert_eq!(executions(&solo_log).len(), 7, "solo ran nothing more");
    // Seven tasks done, each by one accepted completion; doomed never completed.
    let mut completed: Vec<String> = h
        .ledger
        .completions()
        .into_iter()
        .map(|c| {
            assert!(c.accepted, "{c:?}");
            c.task
        })
        .collect();
    completed.sort();
    assert_eq!(
        completed,
        ["head", "later", "mid", "render", "short", "tail", "urgent"]
    );
}
