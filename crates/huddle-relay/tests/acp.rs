//! The ACP driver against a scripted agent built on the ACP SDK's agent side
//! (`tests/acp_agent/agent.rs`, the `huddle-acp-test-agent` binary): streaming,
//! sessions per thread, cancellation, crashes and restarts, permissions, start
//! failures and `session/load` across agent and relay restarts.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use huddle_relay::driver::{
    AcpDriver, AcpSettings, Driver, PermissionPolicy, TurnOutcome, TurnRequest,
};
use tokio_util::sync::CancellationToken;

/// A scripted agent's world: its event log, its state file, its working directory.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        World {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("events.log")
    }

    /// Settings running the test agent with `env` (`NAME=VALUE`) added.
    fn settings(&self, env: &[&str]) -> AcpSettings {
        let mut command = vec![
            "env".to_string(),
            format!("ACP_TEST_LOG={}", self.log().display()),
            format!(
                "ACP_TEST_STATE={}",
                self.dir.path().join("agent-state.json").display()
            ),
        ];
        command.extend(env.iter().map(|e| e.to_string()));
        command.push(env!("CARGO_BIN_EXE_huddle-acp-test-agent").to_string());
        let mut s = AcpSettings::with_command(command);
        s.cwd = Some(self.dir.path().join("work").display().to_string());
        s.turn_timeout_ms = 30_000;
        s
    }

    fn events(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn count(&self, prefix: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }

    /// Waits (bounded) until the log has `n` events starting with `prefix`.
    async fn wait_events(&self, prefix: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.count(prefix) < n {
            assert!(
                Instant::now() < deadline,
                "no {n} {prefix:?} events: {:?}",
                self.events()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn turn(thread: &str, text: &str) -> TurnRequest {
    TurnRequest {
        room: "lobby".into(),
        thread: Some(thread.into()),
        agent: "ada".into(),
        task: None,
        epoch: Some(huddle_core::ClaimEpoch(1)),
        attempt: 1,
        prompt: format!("<coordination>\n</coordination>\n<message from=\"owner\" role=\"owner\">\n{text}\n</message>\n"),
        effect_key: String::new(),
        trace: String::new(),
        review: false,
        progress: Default::default(),
        start_by: None,
    }
}

async fn start(settings: AcpSettings) -> AcpDriver {
    AcpDriver::start("ada", settings)
        .await
        .expect("the agent starts")
}

async fn reply(d: &AcpDriver, thread: &str, text: &str) -> String {
    match d.run(turn(thread, text), CancellationToken::new()).await {
        TurnOutcome::Replied { text, .. } => text,
        other => panic!("{text:?}: {other:?}"),
    }
}

fn pids(w: &World) -> Vec<u32> {
    w.events()
        .iter()
        .filter_map(|e| e.strip_prefix("start "))
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

#[tokio::test]
async fn a_reply_is_assembled_from_many_chunks_and_usage_is_recorded() {
    let w = World::new();
    let d = start(w.settings(&[])).await;
    let text = "The quick brown fox jumps over the lazy dog, again and again and again.";
    assert_eq!(reply(&d, "t", &format!("@say {text}")).await, text);
    match d
        .run(
            turn("t", "@say counted\n@usage 777"),
            CancellationToken::new(),
        )
        .await
    {
        TurnOutcome::Replied { text, tokens, .. } => {
            assert_eq!(text, "counted");
            assert_eq!(tokens, 777);
        }
        other => panic!("{other:?}"),
    }
    let check = d.check().await.expect("ready");
    assert!(
        check.contains("huddle-acp-test-agent 1.0.0") && check.contains("protocol 1"),
        "{check}"
    );
}

/// A prompt whose turn's start deadline has passed never reaches the agent (the
/// relay does not write it: a `cat` checked against the deadline would), the turn
/// reports that it did not start, and the connection stays usable for the next turns,
/// with and without a deadline.
#[tokio::test]
async fn a_prompt_past_its_start_deadline_never_reaches_the_agent() {
    let w = World::new();
    let d = start(w.settings(&[])).await;
    // A first turn makes the thread's session.
    assert_eq!(reply(&d, "t", "@say first").await, "first");
    assert_eq!(w.count("prompt "), 1, "{:?}", w.events());
    let mut late = turn("t", "@say too late");
    late.start_by = Some(Instant::now() - Duration::from_millis(1));
    assert_eq!(
        d.run(late, CancellationToken::new()).await,
        TurnOutcome::NotStarted
    );
    let mut in_time = turn("t", "@say in time");
    in_time.start_by = Some(Instant::now() + Duration::from_secs(30));
    match d.run(in_time, CancellationToken::new()).await {
        TurnOutcome::Replied { text, .. } => assert_eq!(text, "in time"),
        other => panic!("{other:?}"),
    }
    assert_eq!(reply(&d, "t", "@say and after").await, "and after");
    // Three prompts reached the agent; the late one never did.
    assert_eq!(w.count("prompt "), 3, "{:?}", w.events());
}

#[tokio::test]
async fn a_thread_keeps_its_session_across_turns() {
    let w = World::new();
    let d = start(w.settings(&[])).await;
    assert_eq!(reply(&d, "t1", "@remember apple").await, "done");
    assert_eq!(reply(&d, "t1", "@remember pear").await, "done");
    assert_eq!(reply(&d, "t1", "@recall").await, "apple,pear");
    // Another thread is another session.
    assert_eq!(reply(&d, "t2", "@recall").await, "nothing");
    assert_eq!(w.count("new "), 2, "{:?}", w.events());
}

#[tokio::test]
async fn every_session_is_offered_huddles_mcp_server_for_its_room() {
    let w = World::new();
    let launch = huddle_relay::driver::McpLaunch {
        program: "/usr/local/bin/huddle".into(),
        database: "postgres://ada:secret@db/huddle".into(),
        capabilities: vec!["rust".into()],
        writer: None,
        key: None,
    };
    let d = AcpDriver::start_offering("ada", w.settings(&[]), Some(launch))
        .await
        .expect("the agent starts");
    assert_eq!(reply(&d, "t1", "@say hi").await, "hi");
    let mut other = turn("t9", "@say there");
    other.room = "ops".into();
    match d.run(other, CancellationToken::new()).await {
        TurnOutcome::Replied { text, .. } => assert_eq!(text, "there"),
        o => panic!("{o:?}"),
    }
    let offered: Vec<String> = w
        .events()
        .into_iter()
        .filter(|e| e.starts_with("mcp "))
        .collect();
    // One server per new session, for the session's room; the database travels in
    // the environment, never in the arguments.
    assert_eq!(
        offered,
        [
            "mcp huddle /usr/local/bin/huddle mcp --room lobby --agent ada --capabilities rust env HUDDLE_DB",
            "mcp huddle /usr/local/bin/huddle mcp --room ops --agent ada --capabilities rust env HUDDLE_DB",
        ]
    );
    // Without the offer, sessions get no server.
    let w2 = World::new();
    let plain = start(w2.settings(&[])).await;
    assert_eq!(reply(&plain, "t", "@say x").await, "x");
    assert_eq!(w2.count("mcp "), 0, "{:?}", w2.events());
}

#[tokio::test]
async fn a_cancelled_turn_ends_within_a_bound_without_a_reply() {
    let w = World::new();
    let d = std::sync::Arc::new(start(w.settings(&[])).await);
    assert_eq!(reply(&d, "t", "@remember kept").await, "done");
    let cancel = CancellationToken::new();
    let (d2, c2) = (d.clone(), cancel.clone());
    let running = tokio::spawn(async move { d2.run(turn("t", "@sleep 60000"), c2).await });
    w.wait_events("prompt ", 2).await;
    let cancelled_at = Instant::now();
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("cancellation is prompt")
        .expect("join");
    assert_eq!(out, TurnOutcome::Cancelled);
    assert!(cancelled_at.elapsed() < Duration::from_secs(3));
    assert_eq!(w.count("cancel "), 1, "session/cancel was sent");
    assert_eq!(w.count("cancelled "), 1, "the agent ended its prompt");
    // The session is free and still has its context; the process was not restarted.
    assert_eq!(reply(&d, "t", "@recall").await, "kept");
    assert_eq!(w.count("start "), 1);
}

#[tokio::test]
async fn a_turn_that_times_out_is_cancelled_and_fails() {
    let w = World::new();
    let mut s = w.settings(&[]);
    s.turn_timeout_ms = 300;
    let d = start(s).await;
    let out = d
        .run(turn("t", "@sleep 60000"), CancellationToken::new())
        .await;
    assert!(
        matches!(out, TurnOutcome::Failed { ref reason, .. } if reason.contains("timed out")),
        "{out:?}"
    );
    assert_eq!(w.count("cancel "), 1);
}

#[tokio::test]
async fn an_agent_that_ignores_cancel_is_restarted() {
    let w = World::new();
    let mut s = w.settings(&[]);
    s.cancel_grace_ms = 300;
    let d = std::sync::Arc::new(start(s).await);
    let cancel = CancellationToken::new();
    let (d2, c2) = (d.clone(), cancel.clone());
    let running = tokio::spawn(async move { d2.run(turn("t", "@stubborn 60000"), c2).await });
    w.wait_events("prompt ", 1).await;
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the turn ends after the cancel grace")
        .expect("join");
    assert_eq!(out, TurnOutcome::Cancelled);
    let first = pids(&w)[0];
    // The stuck process is replaced; the thread goes on in a new session.
    assert_eq!(reply(&d, "t", "@say again").await, "again");
    assert_eq!(w.count("start "), 2);
    assert!(!alive(first), "the stuck agent was stopped");
}

#[tokio::test]
async fn a_crash_fails_the_turn_and_the_agent_restarts() {
    let w = World::new();
    let d = start(w.settings(&[])).await;
    assert_eq!(reply(&d, "t", "@remember apple").await, "done");
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        d.run(turn("t", "@crash"), CancellationToken::new()),
    )
    .await
    .expect("a crash ends the turn");
    assert!(
        matches!(out, TurnOutcome::Failed { ref reason, .. } if reason.contains("prompt failed")),
        "{out:?}"
    );
    // The next turn runs in the restarted process, in a new session: this agent
    // cannot load sessions, so the earlier context is gone and the prompt says so.
    assert_eq!(reply(&d, "t", "@recall").await, "nothing");
    assert_eq!(w.count("start "), 2);
    assert_eq!(w.count("new "), 2);
    assert_eq!(w.count("load "), 0);
    let last = w
        .events()
        .into_iter()
        .rev()
        .find(|e| e.starts_with("prompt "));
    assert!(
        last.is_some_and(|e| e.ends_with(" with-note")),
        "{:?}",
        w.events()
    );
}

#[tokio::test]
async fn after_a_crash_a_loading_agent_resumes_the_session() {
    let w = World::new();
    let d = start(w.settings(&["ACP_TEST_LOAD=1"])).await;
    assert_eq!(reply(&d, "t", "@remember apple").await, "done");
    let out = d.run(turn("t", "@crash"), CancellationToken::new()).await;
    assert!(matches!(out, TurnOutcome::Failed { .. }), "{out:?}");
    assert_eq!(reply(&d, "t", "@recall").await, "apple");
    assert_eq!(w.count("new "), 1);
    assert_eq!(w.count("load "), 1);
    assert_eq!(w.count("prompt "), 3);
    assert!(!w.events().iter().any(|e| e.ends_with(" with-note")));
}

#[tokio::test]
async fn a_relay_restart_loads_sessions_when_the_agent_can() {
    for (env, expect, loads) in [
        (&["ACP_TEST_LOAD=1"][..], "apple", 1),
        (&[][..], "nothing", 0),
    ] {
        let w = World::new();
        let d = start(w.settings(env)).await;
        assert_eq!(reply(&d, "t", "@remember apple").await, "done");
        let first = pids(&w)[0];
        drop(d);
        // The relay's end ends the agent.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(first) {
            assert!(Instant::now() < deadline, "the agent outlived its driver");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let d = start(w.settings(env)).await;
        assert_eq!(reply(&d, "t", "@recall").await, expect, "{env:?}");
        assert_eq!(w.count("load "), loads, "{env:?}: {:?}", w.events());
    }
}

#[tokio::test]
async fn permission_requests_are_answered_by_policy() {
    let cases: [(PermissionPolicy, &str, &str); 6] = [
        (PermissionPolicy::default(), "read", "allow-once"),
        (PermissionPolicy::default(), "edit", "reject-once"),
        (
            PermissionPolicy::Named("allow-all".into()),
            "execute",
            "allow-once",
        ),
        (
            PermissionPolicy::Named("deny".into()),
            "read",
            "reject-once",
        ),
        (
            PermissionPolicy::Kinds(vec!["execute".into()]),
            "execute",
            "allow-once",
        ),
        (
            PermissionPolicy::Kinds(vec!["execute".into()]),
            "delete",
            "reject-once",
        ),
    ];
    for (policy, kind, expected) in cases {
        let w = World::new();
        let mut s = w.settings(&[]);
        s.permissions = policy.clone();
        let d = start(s).await;
        let got = reply(&d, "t", &format!("@permission {kind}")).await;
        assert_eq!(got, expected, "{policy:?} for {kind}");
    }
}

#[tokio::test]
async fn tool_calls_plans_and_permission_answers_are_summarised_for_the_turn_record() {
    let w = World::new();
    let d = start(w.settings(&[])).await;
    let script = "@plan read the code;fix it;run the tests\n@tool read Read src/lib.rs\n\
                  @tool! execute cargo test\n@permission edit";
    let (sink, mut notes) = huddle_relay::driver::ProgressSink::channel();
    let mut request = turn("t", script);
    request.progress = sink;
    let activity = match d.run(request, CancellationToken::new()).await {
        TurnOutcome::Replied { text, activity, .. } => {
            assert_eq!(text, "reject-once", "the read-only default refuses an edit");
            activity
        }
        other => panic!("{other:?}"),
    };
    // Each plan update is a progress note, never part of the reply.
    let mut got = Vec::new();
    while let Ok(n) = notes.try_recv() {
        got.push(n);
    }
    assert!(!got.is_empty(), "a plan update is a progress note");
    assert!(
        got.iter()
            .all(|n| n.starts_with("plan: ") && n.contains("read the code")),
        "{got:?}"
    );
    assert_eq!(activity.tool_calls, 2, "{activity:?}");
    let tools: Vec<_> = activity
        .tools
        .iter()
        .map(|t| (t.title.as_str(), t.kind.as_str(), t.status.as_str()))
        .collect();
    assert_eq!(
        tools,
        [
            ("Read src/lib.rs", "read", "completed"),
            ("cargo test", "execute", "failed")
        ],
        "each call keeps the last status its updates gave it"
    );
    let plan: Vec<_> = activity
        .plan
        .iter()
        .map(|p| (p.content.as_str(), p.status.as_str()))
        .collect();
    assert_eq!(
        plan,
        [
            ("read the code", "completed"),
            ("fix it", "pending"),
            ("run the tests", "pending")
        ]
    );
    assert_eq!(activity.permissions.len(), 1, "{activity:?}");
    let p = &activity.permissions[0];
    assert_eq!(
        (p.tool.as_str(), p.kind.as_str(), p.answer.as_str()),
        ("a edit tool", "edit", "reject-once")
    );

    // The next turn in the same session starts with nothing: activity is per turn.
    match d
        .run(turn("t", "@say plain"), CancellationToken::new())
        .await
    {
        TurnOutcome::Replied { activity, .. } => assert!(activity.is_empty(), "{activity:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_agent_that_cannot_start_or_initialise_is_reported_at_start() {
    let missing = AcpSettings::with_command(vec!["/nonexistent/acp-agent".into()]);
    let e = AcpDriver::start("ada", missing).await.unwrap_err();
    assert!(e.contains("cannot start"), "{e}");

    let w = World::new();
    let e = AcpDriver::start("ada", w.settings(&["ACP_TEST_INIT=fail"]))
        .await
        .unwrap_err();
    assert!(e.contains("initialize failed"), "{e}");

    let mut exits = AcpSettings::with_command(vec!["true".into()]);
    exits.init_timeout_ms = 10_000;
    let e = AcpDriver::start("ada", exits).await.unwrap_err();
    assert!(e.contains("initialize"), "{e}");
}
