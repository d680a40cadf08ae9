//! The fault battery (plan 0015): three relays hosting recording exec agents work a
//! few hundred tasks and answer addressed messages while a seeded random schedule
//! kills, pauses and partitions them and restarts or cuts off the database. At the
//! end the history checker (`tests/common/history.rs`) must find *exactly once*
//! intact: every task completed once, no execution started after its result was
//! committed, every message answered once, equal fold hashes; work re-runs only after
//! a kill, a pause or a partition, and those re-runs are counted.
//!
//! - `HUDDLE_FAULT_SEED=N` replays a schedule (the seed is printed).
//! - `HUDDLE_SOAK=1` runs the soak: rounds of the battery, each a fresh database and
//!   three fresh relays working 500 tasks and 50 messages under a continuous fault
//!   schedule, until ≥ 10,000 tasks and ≥ 1,000 messages were worked
//!   (`HUDDLE_SOAK_TASKS`, `HUDDLE_SOAK_MESSAGES` and `HUDDLE_SOAK_ROUND_TASKS` change
//!   the totals and the round size); every round's history is checked, and the
//!   figures of all rounds are printed together (`scripts/soak.sh`). Rounds keep each
//!   room's task DAG a few hundred tasks large, so the run measures faults, not the
//!   cost of scheduling a DAG of 10,000.
//!
//! The first tests check the checker itself on synthetic histories, so a battery that
//! reports nothing has been shown able to report something.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::history::*;
use common::relays::*;
use huddle_core::tasks::{TaskClaimedBody, TaskCompletedBody, TaskCreatedBody};
use huddle_core::{
    ClaimEpoch, Interaction, InteractionId, NewInteraction, Position, Role, Timestamp, Verb,
};
use huddle_testkit::FaultProxy;
use serde_json::json;

// ---------------------------------------------------------------------------------
// The checker on synthetic histories
// ---------------------------------------------------------------------------------

const ROOM: &str = "lobby";
const T0: i64 = 1_700_000_000_000_000;

/// Builds ledger rows with increasing positions and times.
#[derive(Default)]
struct Rows(Vec<Interaction>);

impl Rows {
    /// Appends a row of the room; `parent` for replies.
    fn push(
        &mut self,
        verb: Verb,
        actor: &str,
        role: Role,
        body: serde_json::Value,
        at: i64,
        parent: Option<InteractionId>,
    ) -> InteractionId {
        let mut n = NewInteraction::new(ROOM, verb, actor, role, body.clone());
        n.parent = parent;
        let id = n.id();
        let minor = self.0.len() as u64 + 1;
        self.0.push(Interaction {
            id,
            position: Position { major: 0, minor },
            at: Timestamp(at),
            relay: "r".into(),
            room: ROOM.into(),
            thread: None,
            verb,
            actor: actor.into(),
            role,
            parent,
            caused_by: Vec::new(),
            body,
            signer: None,
        });
        id
    }

    fn task(&mut self, task: &str) {
        let b = TaskCreatedBody {
            task: task.into(),
            label: format!("do {task}"),
            deps: Vec::new(),
            assignee: None,
            needs: Vec::new(),
            max_attempts: None,
            priority: None,
            size: None,
            path: None,
            due_ms: None,
            uses: Vec::new(),
            review: None,
            undo: None,
        };
        self.push(
            Verb::TaskCreated,
            "olga",
            Role::Owner,
            b.to_body(),
            T0,
            None,
        );
    }

    fn claim(&mut self, task: &str, agent: &str, epoch: i64, at: i64) {
        let b = TaskClaimedBody {
            task: task.into(),
            epoch: ClaimEpoch(epoch),
            attempt: 1,
            generation: 0,
        };
        self.push(Verb::TaskClaimed, agent, Role::Agent, b.to_body(), at, None);
    }

    fn complete(&mut self, task: &str, agent: &str, epoch: i64, at: i64) {
        let b = TaskCompletedBody {
            task: task.into(),
            epoch: ClaimEpoch(epoch),
            result: Some(format!("done by {agent}")),
            tokens: Some(1),
            generation: 0,
        };
        self.push(
            Verb::TaskCompleted,
            agent,
            Role::Agent,
            b.to_body(),
            at,
            None,
        );
    }

    fn message(&mut self, token: &str) -> InteractionId {
        self.message_saying(&format!("question {token}"))
    }

    fn message_saying(&mut self, text: &str) -> InteractionId {
        self.push(
            Verb::MessagePosted,
            "hana",
            Role::Human,
            json!({ "text": text }),
            T0,
            None,
        )
    }

    fn reply(&mut self, to: InteractionId, agent: &str, at: i64) {
        self.push(
            Verb::MessagePosted,
            agent,
            Role::Agent,
            json!({ "text": format!("answer by {agent}") }),
            at,
            Some(to),
        );
    }
}

fn exec(phase: Phase, work: Work, agent: &str, epoch: i64, time_us: i64, pid: u32) -> SideEffect {
    SideEffect {
        phase,
        work,
        agent: agent.into(),
        epoch: Some(epoch),
        attempt: 1,
        time_us,
        pid,
    }
}

/// A start and an end, 10 ms apart.
fn ran(work: Work, agent: &str, epoch: i64, start: i64, pid: u32) -> [SideEffect; 2] {
    [
        exec(Phase::Start, work.clone(), agent, epoch, start, pid),
        exec(Phase::End, work, agent, epoch, start + 10_000, pid),
    ]
}

/// A fault with no duration (a kill, a dropped link) on `relay` at `at`.
fn instant(kind: FaultKind, relay: &str, at: i64) -> Fault {
    Fault {
        kind,
        relay: Some(relay.into()),
        from_us: at,
        to_us: at,
    }
}

fn task(t: &str) -> Work {
    Work::Task(t.into())
}

fn msg(m: &str) -> Work {
    Work::Message(m.into())
}

fn summary(relay: &str, board: &str) -> RelaySummary {
    RelaySummary {
        relay: relay.into(),
        cursor: "0:9".into(),
        board_hash: board.into(),
        tasks_hash: "t".into(),
        turns_started: 1,
        turns_replied: 1,
        turns_failed: 0,
        fenced_refusals: 0,
        skipped_rows: 0,
        ..Default::default()
    }
}

/// A small clean world: tasks t1 (by a0 on r0) and t2 (by a1 on r1), message tok-1
/// answered by a1.
struct World {
    rows: Rows,
    effects: Vec<SideEffect>,
    tasks: BTreeSet<String>,
    messages: BTreeMap<String, InteractionId>,
    hosts: BTreeMap<String, String>,
    faults: Vec<Fault>,
    summaries: Vec<RelaySummary>,
    one_writer: bool,
}

impl World {
    fn clean() -> World {
        let mut rows = Rows::default();
        rows.task("t1");
        rows.task("t2");
        let m = rows.message("tok-1");
        rows.claim("t1", "a0", 1, T0 + 100_000);
        rows.claim("t2", "a1", 1, T0 + 100_000);
        rows.complete("t1", "a0", 1, T0 + 300_000);
        rows.complete("t2", "a1", 1, T0 + 300_000);
        rows.reply(m, "a1", T0 + 400_000);
        let mut effects = Vec::new();
        effects.extend(ran(task("t1"), "a0", 1, T0 + 150_000, 10));
        effects.extend(ran(task("t2"), "a1", 1, T0 + 150_000, 11));
        effects.extend(ran(msg("tok-1"), "a1", 1, T0 + 350_000, 12));
        World {
            rows,
            effects,
            tasks: ["t1", "t2"].iter().map(|s| s.to_string()).collect(),
            messages: [("tok-1".to_string(), m)].into_iter().collect(),
            hosts: [("a0", "r0"), ("a1", "r1")]
                .iter()
                .map(|(a, r)| (a.to_string(), r.to_string()))
                .collect(),
            faults: Vec::new(),
            summaries: vec![summary("r0", "b"), summary("r1", "b")],
            one_writer: false,
        }
    }

    fn check(&self) -> HistoryReport {
        let r = check(&History {
            room: ROOM,
            rows: &self.rows.0,
            side_effects: &self.effects,
            tasks: &self.tasks,
            messages: &self.messages,
            hosts: &self.hosts,
            faults: &self.faults,
            summaries: &self.summaries,
            expected_hashes: None,
            commit_slack_us: 50_000,
            one_writer: self.one_writer,
        });
        eprintln!("{r}");
        r
    }
}

fn invariants(r: &HistoryReport) -> Vec<&'static str> {
    r.violations.iter().map(Violation::invariant).collect()
}

#[test]
fn checker_passes_a_clean_history() {
    let r = World::clean().check();
    assert!(r.violations.is_empty(), "{r}");
    assert_eq!((r.tasks, r.tasks_completed, r.raw_completions), (2, 2, 2));
    assert_eq!(
        (r.messages, r.messages_answered, r.agent_replies),
        (1, 1, 1)
    );
    assert_eq!((r.task_starts, r.message_starts, r.unfinished), (2, 1, 0));
    assert_eq!(r.extra_starts(), 0);
}

#[test]
fn checker_finds_a_double_completion() {
    let mut w = World::clean();
    // r0 paused, its claim lapsed and a1 re-took t1 and finished it too.
    w.rows.claim("t1", "a1", 2, T0 + 200_000);
    w.rows.complete("t1", "a1", 2, T0 + 250_000);
    let r = w.check();
    assert_eq!(r.raw_completions, 3);
    assert_eq!(
        r.refused_completions, 1,
        "a0's later row is refused by the fold"
    );
    assert!(
        r.violations.iter().any(|v| matches!(v,
            Violation::TaskCompletedTwice { task, rows } if task == "t1" && rows.len() == 2)),
        "{r}"
    );
}

#[test]
fn checker_finds_a_start_after_completion() {
    let mut w = World::clean();
    w.faults.push(Fault {
        kind: FaultKind::Pause,
        relay: Some("r0".into()),
        from_us: T0 + 160_000,
        to_us: T0 + 9_000_000,
    });
    // a0 runs t1 again 9 s after its completion was committed (paused relay).
    w.effects
        .extend(ran(task("t1"), "a0", 2, T0 + 9_300_000, 20));
    let r = w.check();
    assert_eq!(
        invariants(&r),
        ["execution started after result committed"],
        "{r}"
    );
    match &r.violations[0] {
        Violation::StartedAfterResult { work, late_us, .. } => {
            assert_eq!(work, &task("t1"));
            assert_eq!(*late_us, 9_000_000);
        }
        v => panic!("{v:?}"),
    }
    // The repeat itself is explained by the pause, so it is counted, not a violation.
    assert_eq!(r.extra_starts(), 1);
    assert_eq!(r.repeats_by_cause().get("pause"), Some(&1));
    // Inside the commit slack it is not "after" (the write was still committing).
    let mut w = World::clean();
    w.effects.extend(ran(task("t1"), "a1", 2, T0 + 320_000, 21));
    let r = w.check();
    assert_eq!(
        invariants(&r),
        ["re-execution without a kill/pause/partition"],
        "{r}"
    );
}

#[test]
fn checker_finds_a_lost_message_and_a_lost_task() {
    let mut w = World::clean();
    let lost = w.rows.message("tok-2");
    w.messages.insert("tok-2".into(), lost);
    w.rows.task("t3");
    w.tasks.insert("t3".into());
    // Its turn ran, but the reply was never written (a failed append, dropped).
    w.effects
        .extend(ran(msg("tok-2"), "a0", 1, T0 + 500_000, 30));
    let r = w.check();
    let mut got = invariants(&r);
    got.sort();
    assert_eq!(
        got,
        ["message never answered", "task never completed"],
        "{r}"
    );
    assert_eq!((r.messages, r.messages_answered), (2, 1));
}

#[test]
fn checker_expects_one_reply_from_each_agent_a_message_names() {
    let mut w = World::clean();
    let m = w.rows.message_saying("@a0 @a1 question tok-9");
    w.messages.insert("tok-9".into(), m);
    w.rows.reply(m, "a0", T0 + 500_000);
    w.rows.reply(m, "a1", T0 + 500_000);
    w.effects
        .extend(ran(msg("tok-9"), "a0", 1, T0 + 450_000, 20));
    w.effects
        .extend(ran(msg("tok-9"), "a1", 1, T0 + 450_000, 21));
    let r = w.check();
    assert!(r.violations.is_empty(), "{r}");
    assert!(
        r.reexecutions.is_empty(),
        "one execution per named agent: {r}"
    );
    // A second reply by one of them is a double answer of that agent's part, and a
    // part nobody answered is lost.
    w.rows.reply(m, "a0", T0 + 900_000);
    let m2 = w.rows.message_saying("@a0 @a1 question tok-10");
    w.messages.insert("tok-10".into(), m2);
    w.rows.reply(m2, "a1", T0 + 500_000);
    let r = w.check();
    assert!(
        r.violations.iter().any(|v| matches!(v,
            Violation::MessageAnsweredTwice { token, .. } if token == "tok-9@a0")),
        "{r}"
    );
    assert!(
        r.violations.iter().any(|v| matches!(v,
            Violation::MessageLost { token } if token == "tok-10@a0")),
        "{r}"
    );
}

#[test]
fn checker_finds_a_double_reply() {
    let mut w = World::clean();
    let m = w.messages["tok-1"];
    w.rows.reply(m, "a0", T0 + 9_000_000);
    let r = w.check();
    assert!(
        r.violations.iter().any(|v| matches!(v,
            Violation::MessageAnsweredTwice { token, repliers }
                if token == "tok-1" && repliers == &["a1".to_string(), "a0".to_string()])),
        "{r}"
    );
    assert_eq!(r.agent_replies, 2);
}

#[test]
fn checker_finds_unexplained_reexecution_phantom_completion_and_hash_split() {
    let mut w = World::clean();
    // t2 runs twice on a live relay with no fault at all (short turns, stale view).
    w.effects.extend(ran(task("t2"), "a1", 1, T0 + 200_000, 40));
    // A drop of connections does not excuse a repeat.
    w.faults
        .push(instant(FaultKind::DropConnections, "r1", T0 + 170_000));
    // No execution stands behind t1's completion.
    w.effects.retain(|e| e.work != task("t1"));
    w.summaries.push(summary("r2", "other"));
    let r = w.check();
    let mut got = invariants(&r);
    got.sort();
    assert_eq!(
        got,
        [
            "completion without execution",
            "fold hashes differ",
            "re-execution without a kill/pause/partition"
        ],
        "{r}"
    );
    // A kill of the first runner's relay in between explains it.
    let mut w = World::clean();
    w.effects.extend(ran(task("t2"), "a0", 2, T0 + 200_000, 41));
    w.faults.push(instant(FaultKind::Kill9, "r1", T0 + 170_000));
    let r = w.check();
    assert!(r.violations.is_empty(), "{r}");
    assert_eq!(r.repeats_by_cause().get("kill-9"), Some(&1));
    // A pause of another relay explains it only on a one-writer database (SQLite),
    // where the paused relay may hold the write lock every renewal waits for.
    let mut w = World::clean();
    w.effects.extend(ran(task("t2"), "a0", 2, T0 + 200_000, 42));
    w.faults.push(instant(FaultKind::Pause, "r0", T0 + 170_000));
    assert_eq!(
        invariants(&w.check()),
        ["re-execution without a kill/pause/partition"]
    );
    w.one_writer = true;
    let r = w.check();
    assert!(r.violations.is_empty(), "{r}");
    assert_eq!(r.repeats_by_cause().get("pause"), Some(&1));
}

#[test]
fn checker_finds_an_interaction_read_twice() {
    let mut w = World::clean();
    // t1's claim written again (a row beside the lot item it already was).
    let again = w
        .rows
        .0
        .iter()
        .find(|r| r.verb == Verb::TaskClaimed)
        .cloned()
        .expect("a claim row");
    w.rows.0.push(again);
    assert_eq!(invariants(&w.check()), ["interaction read twice"]);
}

#[test]
fn side_effect_lines_parse_strictly() {
    let e = SideEffect::parse("start task/t1 a0 3 2 1700000000000001 77").expect("parse");
    assert_eq!(
        e,
        SideEffect {
            phase: Phase::Start,
            work: task("t1"),
            agent: "a0".into(),
            epoch: Some(3),
            attempt: 2,
            time_us: 1_700_000_000_000_001,
            pid: 77
        }
    );
    assert_eq!(
        SideEffect::parse("end msg/tok-3 a0 - 1 5 6").map(|e| (e.work, e.epoch)),
        Ok((msg("tok-3"), None))
    );
    for torn in [
        "start task/t1 a0 3 2 17000",
        "begin task/t1 a0 3 2 1 2",
        "start job/x a 1 1 1 1",
    ] {
        assert!(SideEffect::parse(torn).is_err(), "{torn}");
    }
}

/// The recording agent, run directly: a task turn is named by `HUDDLE_TASK`; a
/// message turn by the token of the *last* message block (an earlier one is context).
#[test]
fn recording_agent_logs_each_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, RECORDING_AGENT).expect("write");
    let log = dir.path().join("effects.log");
    let run = |task: &str, prompt: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new("sh")
            .arg(&script)
            .arg(&log)
            .arg("0")
            .env("HUDDLE_AGENT", "a7")
            .env("HUDDLE_TASK", task)
            .env("HUDDLE_EPOCH", "4")
            .env("HUDDLE_ATTEMPT", "2")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the agent");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(prompt.as_bytes())
            .expect("prompt");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success());
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let before = now_us();
    let reply = run(
        "t9",
        "<task id=\"t9\" attempt=\"2\" of=\"3\">\nstep\n</task>\n",
    );
    assert_eq!(reply.trim(), "done task/t9 by a7");
    let prompt = "<coordination>\n<message from=\"hugo\" role=\"human\">\nold tok-1\n</message>\n\
                  </coordination>\n<message from=\"hana\" role=\"human\">\nquestion tok-22: anyone?\n</message>\n";
    let reply = run("", prompt);
    assert_eq!(reply.trim(), "done msg/tok-22 by a7");
    let effects = read_side_effects(&log);
    let got: Vec<(Phase, Work, Option<i64>, u32)> = effects
        .iter()
        .map(|e| (e.phase, e.work.clone(), e.epoch, e.attempt))
        .collect();
    assert_eq!(
        got,
        [
            (Phase::Start, task("t9"), Some(4), 2),
            (Phase::End, task("t9"), Some(4), 2),
            (Phase::Start, msg("tok-22"), Some(4), 2),
            (Phase::End, msg("tok-22"), Some(4), 2),
        ]
    );
    assert!(effects
        .iter()
        .all(|e| e.time_us >= before && e.time_us <= now_us()));
    assert_eq!(effects[0].pid, effects[1].pid);
}

// ---------------------------------------------------------------------------------
// The battery
// ---------------------------------------------------------------------------------

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// splitmix64: a seeded schedule without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn ms_between(&mut self, lo: u64, hi: u64) -> Duration {
        ms(lo + self.below(hi - lo + 1))
    }
}

/// The seed: `HUDDLE_FAULT_SEED`, else the clock.
fn seed() -> u64 {
    match std::env::var("HUDDLE_FAULT_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("HUDDLE_FAULT_SEED={s:?} is not a whole number")),
        Err(_) => now_us() as u64,
    }
}

/// How big a run is.
struct Size {
    tasks: usize,
    chunk: usize,
    messages: usize,
    /// Faults to inject; `None`: keep injecting until the work is done.
    faults: Option<usize>,
    /// Seconds each agent turn sleeps.
    turn_sleep: &'static str,
    limit: Duration,
}

/// The soak's totals and round size, when `HUDDLE_SOAK` is set.
struct Soak {
    tasks: usize,
    messages: usize,
    round_tasks: usize,
}

fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

fn soak() -> Option<Soak> {
    std::env::var_os("HUDDLE_SOAK")?;
    Some(Soak {
        tasks: env_number("HUDDLE_SOAK_TASKS", 10_000),
        messages: env_number("HUDDLE_SOAK_MESSAGES", 1_000),
        round_tasks: env_number("HUDDLE_SOAK_ROUND_TASKS", 500).max(100),
    })
}

impl Soak {
    fn rounds(&self) -> usize {
        self.tasks.div_ceil(self.round_tasks).max(1)
    }

    /// One round: its share of the tasks and messages, faults all the time.
    fn round(&self) -> Size {
        Size {
            tasks: self.round_tasks,
            chunk: 100,
            messages: self.messages.div_ceil(self.rounds()),
            faults: None,
            turn_sleep: "0.02",
            limit: Duration::from_secs(10 * 60),
        }
    }
}

fn size(fault_kinds: usize) -> Size {
    if let Some(soak) = soak() {
        soak.round()
    } else {
        let chunks = fault_kinds + 2;
        Size {
            tasks: chunks * 30,
            chunk: 30,
            messages: 40,
            faults: Some(fault_kinds),
            turn_sleep: "0.15",
            limit: secs(100),
        }
    }
}

const TTL: &str = "2s";
const TTL_MS: u64 = 2_000;
const HUMANS: [&str; 4] = ["hank", "hana", "hugo", "hedy"];

/// One battery run: the world, the relays' links, and what was injected.
struct Battery {
    h: Huddle,
    rng: Rng,
    effects: PathBuf,
    agents: BTreeMap<String, Vec<AgentSpec>>,
    hosts: BTreeMap<String, String>,
    proxies: BTreeMap<String, FaultProxy>,
    urls: BTreeMap<String, String>,
    faults: Vec<Fault>,
    tasks: BTreeSet<String>,
    chunks_posted: usize,
    chunks_created: usize,
    pending_chunk: Option<InteractionId>,
    messages: BTreeMap<String, InteractionId>,
    /// Messages naming several agents: the agents, each of which answers once.
    named: BTreeMap<InteractionId, Vec<String>>,
    /// Relays that exited by themselves, and when.
    crashes: Vec<String>,
    size: Size,
}

impl Battery {
    async fn new(backend: Backend, seed: u64, size: Size) -> Battery {
        let h = Huddle::new(backend).await;
        let effects = h.dir().join("side-effects.log");
        let script = h.script("record.sh", RECORDING_AGENT);
        let mut b = Battery {
            h,
            rng: Rng(seed),
            effects: effects.clone(),
            agents: BTreeMap::new(),
            hosts: BTreeMap::new(),
            proxies: BTreeMap::new(),
            urls: BTreeMap::new(),
            faults: Vec::new(),
            tasks: BTreeSet::new(),
            chunks_posted: 0,
            chunks_created: 0,
            pending_chunk: None,
            messages: BTreeMap::new(),
            named: BTreeMap::new(),
            crashes: Vec::new(),
            size,
        };
        let upstream =
            b.h.db
                .cluster()
                .map(|c| std::net::SocketAddr::from(([127, 0, 0, 1], c.port())));
        for r in 0..3 {
            let id = format!("r{r}");
            let agents: Vec<AgentSpec> = (0..2)
                .map(|a| {
                    let key = format!("a{r}{a}");
                    b.hosts.insert(key.clone(), id.clone());
                    AgentSpec {
                        key,
                        driver: DriverSpec::Exec {
                            command: vec![
                                "sh".into(),
                                script.display().to_string(),
                                effects.display().to_string(),
                                b.size.turn_sleep.into(),
                            ],
                            timeout_ms: 30_000,
                        },
                        capabilities: Vec::new(),
                        priority: None,
                    }
                })
                .collect();
            let url = match upstream {
                Some(up) => {
                    let p = FaultProxy::start(up).await.expect("start a proxy");
                    let url = p.redirect_url(&b.h.db.url);
                    b.proxies.insert(id.clone(), p);
                    url
                }
                None => b.h.db.url.clone(),
            };
            b.h.spawn_relay_on(&id, agents.clone(), &url);
            b.agents.insert(id.clone(), agents);
            b.urls.insert(id, url);
        }
        let all: Vec<String> = b.hosts.keys().cloned().collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        b.h.wait_registered(&all).await;
        // Short leases; no attempt limit, loop cap or rate cap gets in the way.
        b.h.config(&format!(
            "claim-ttl {TTL} max-attempts 100 loop-max 100 loop-cooldown 1s rate 1000 rate-window 1s"
        ))
        .await;
        b
    }

    fn relays(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    /// A relay to hit: one whose agents hold a claimed task now when there is one
    /// (so the fault lands between a turn and its write), else any.
    fn pick_relay(&mut self) -> String {
        let busy: BTreeSet<String> = self
            .h
            .ledger
            .dag
            .claimed(&self.h.room)
            .iter()
            .filter_map(|t| self.hosts.get(t.owner.as_deref()?).cloned())
            .collect();
        let rs: Vec<String> = if busy.is_empty() {
            self.relays()
        } else {
            busy.into_iter().collect()
        };
        let i = self.rng.below(rs.len() as u64) as usize;
        rs[i].clone()
    }

    /// Appends rows, retrying through database outages (ids are content-addressed,
    /// so a retry never duplicates).
    async fn append(&self, rows: Vec<NewInteraction>) -> Vec<InteractionId> {
        let deadline = Instant::now() + secs(60);
        loop {
            match self.h.store.append(rows.clone()).await {
                Ok(out) => return out.iter().map(|a| a.id).collect(),
                Err(e) if Instant::now() < deadline => {
                    eprintln!("append retried: {e}");
                    tokio::time::sleep(ms(200)).await;
                }
                Err(e) => panic!("the test could not append for 60 s: {e}"),
            }
        }
    }

    /// The next `!delegate` chunk: tasks `c<k>t<i>`, some after an earlier one.
    async fn post_chunk(&mut self) {
        let k = self.chunks_posted;
        let mut text = String::from("!delegate\n");
        for i in 0..self.size.chunk {
            let id = format!("c{k:03}t{i:03}");
            if i > 0 && self.rng.below(4) == 0 {
                let dep = self.rng.below(i as u64);
                text.push_str(&format!("{id}: step {k}.{i} [after c{k:03}t{dep:03}]\n"));
            } else {
                text.push_str(&format!("{id}: step {k}.{i}\n"));
            }
            self.tasks.insert(id);
        }
        let row = common::owner_key(&self.h.owner).sign(NewInteraction::new(
            self.h.room.as_str(),
            Verb::MessagePosted,
            self.h.owner.as_str(),
            Role::Owner,
            json!({ "text": text }),
        ));
        self.pending_chunk = Some(self.append(vec![row]).await[0]);
        self.chunks_posted += 1;
    }

    async fn post_message(&mut self) {
        let n = self.messages.len();
        let token = message_token(n);
        let human = HUMANS[n % HUMANS.len()];
        // Most are broadcasts; some name two agents on different relays, and each of
        // them answers once (plan 0026).
        let mut named = Vec::new();
        let text = if self.rng.below(4) == 0 {
            let a = self.rng.below(3);
            let b = (a + 1 + self.rng.below(2)) % 3;
            named = vec![format!("a{a}0"), format!("a{b}1")];
            format!("@a{a}0 @a{b}1 question {token}: can you look?")
        } else {
            format!("question {token}: anyone?")
        };
        let row = NewInteraction::new(
            self.h.room.as_str(),
            Verb::MessagePosted,
            human,
            Role::Human,
            json!({ "text": text }),
        );
        let id = self.append(vec![row]).await[0];
        self.messages.insert(token, id);
        if !named.is_empty() {
            self.named.insert(id, named);
        }
    }

    fn record(&mut self, kind: FaultKind, relay: Option<&str>, from_us: i64) {
        let to_us = now_us();
        eprintln!(
            "fault {:>3}: {} on {} for {} ms",
            self.faults.len(),
            kind.name(),
            relay.unwrap_or("all"),
            (to_us - from_us) / 1000
        );
        self.faults.push(Fault {
            kind,
            relay: relay.map(str::to_string),
            from_us,
            to_us,
        });
    }

    fn restart_relay(&mut self, id: &str) {
        let agents = self.agents[id].clone();
        let url = self.urls[id].clone();
        self.h.spawn_relay_on(id, agents, &url);
    }

    async fn inject(&mut self, kind: FaultKind) {
        let t = now_us();
        let past_ttl = ms(TTL_MS + 1_000 + self.rng.below(1_000));
        match kind {
            FaultKind::Kill9 => {
                let r = self.pick_relay();
                self.h.relay(&r).kill9();
                self.record(kind, Some(&r), t);
                tokio::time::sleep(self.rng.ms_between(200, 1_500)).await;
                self.restart_relay(&r);
            }
            FaultKind::Pause => {
                let r = self.pick_relay();
                self.h.relay(&r).pause();
                tokio::time::sleep(past_ttl).await;
                self.h.relay(&r).resume();
                self.record(kind, Some(&r), t);
            }
            FaultKind::BlackHole => {
                let r = self.pick_relay();
                self.proxies[&r].black_hole();
                tokio::time::sleep(past_ttl).await;
                self.proxies[&r].heal();
                self.record(kind, Some(&r), t);
            }
            FaultKind::Delay => {
                let r = self.pick_relay();
                self.proxies[&r].set_delay(self.rng.ms_between(20, 200));
                tokio::time::sleep(self.rng.ms_between(1_000, 3_000)).await;
                self.proxies[&r].set_delay(Duration::ZERO);
                self.record(kind, Some(&r), t);
            }
            FaultKind::DropConnections => {
                let r = self.pick_relay();
                let n = self.proxies[&r].drop_all();
                eprintln!("  dropped {n} connections of {r}");
                self.record(kind, Some(&r), t);
            }
            FaultKind::PgRestartFast | FaultKind::PgRestartImmediate => {
                let cluster = self.h.db.cluster().expect("own cluster");
                tokio::task::block_in_place(|| {
                    if kind == FaultKind::PgRestartFast {
                        cluster.stop()
                    } else {
                        cluster.kill()
                    }
                    .and_then(|()| cluster.start_again())
                })
                .expect("restart Postgres");
                self.record(kind, None, t);
            }
            FaultKind::TerminateBackends => {
                let cluster = self.h.db.cluster().expect("own cluster");
                let (admin, conn) =
                    tokio_postgres::connect(&cluster.admin_url(), tokio_postgres::NoTls)
                        .await
                        .expect("connect as admin");
                let driver = tokio::spawn(conn);
                let rows = admin
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = 'huddle_e2e' AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .expect("terminate huddle sessions");
                eprintln!("  terminated {} sessions", rows.len());
                drop(admin);
                let _ = driver.await;
                self.record(kind, None, t);
            }
        }
    }

    /// Restarts relays that exited by themselves (a crash is reported, not hidden).
    fn revive(&mut self) {
        for id in self.relays() {
            if !self.h.relay(&id).is_running() {
                let tail = self.h.relay(&id).log_tail(20);
                eprintln!("relay {id} exited by itself\n{tail}");
                self.crashes.push(id.clone());
                self.restart_relay(&id);
            }
        }
    }

    /// Whether the message has its replies: one from each agent it names, or one.
    fn answered(&self, id: InteractionId) -> bool {
        let replies = self.h.ledger.replies_to(id);
        match self.named.get(&id) {
            Some(named) => named.iter().all(|a| replies.iter().any(|r| &r.actor == a)),
            None => !replies.is_empty(),
        }
    }

    fn all_answered(&self) -> bool {
        self.messages.values().all(|id| self.answered(*id))
    }

    fn backlog(&self) -> usize {
        let s = self.h.ledger.summary();
        s.total - s.done
    }

    /// Runs the schedule until the work is posted, the faults are injected and the
    /// room is settled, or the time limit; returns whether it settled.
    async fn run(&mut self, kinds: &[FaultKind]) -> bool {
        let chunks = self.size.tasks.div_ceil(self.size.chunk);
        let mut schedule: Vec<FaultKind> = match self.size.faults {
            Some(n) => {
                // Every kind once (in a seeded order), then random ones.
                let mut s: Vec<FaultKind> = kinds.to_vec();
                while s.len() < n {
                    s.push(kinds[self.rng.below(kinds.len() as u64) as usize]);
                }
                for i in (1..s.len()).rev() {
                    s.swap(i, self.rng.below(i as u64 + 1) as usize);
                }
                s.reverse();
                s
            }
            None => Vec::new(),
        };
        let continuous = self.size.faults.is_none();
        let per_chunk = self.size.messages.div_ceil(chunks);
        let started = Instant::now();
        let mut next_fault = Instant::now() + self.rng.ms_between(1_500, 3_000);
        let mut faults_done = 0usize;
        loop {
            if let Err(e) = self.h.ledger.try_refresh(&*self.h.store).await {
                eprintln!("refresh failed (retrying): {e}");
            }
            if let Some(cmd) = self.pending_chunk {
                if self.h.ledger.system_reply(cmd).is_some() {
                    self.pending_chunk = None;
                    self.chunks_created += 1;
                }
            }
            // Work arrives as the faults go on: a new chunk when the last one was
            // created and the backlog is low (in CI, at most two chunks ahead of the
            // faults, so work overlaps every fault).
            let may_post = self.pending_chunk.is_none()
                && self.chunks_posted < chunks
                && self.backlog() < self.size.chunk.max(40) / 2
                && (continuous || self.chunks_posted < faults_done + 2);
            if may_post {
                self.post_chunk().await;
            }
            if self.messages.len() < self.size.messages.min(per_chunk * self.chunks_posted) {
                self.post_message().await;
            }
            let faults_left = if continuous {
                self.chunks_created < chunks || self.backlog() > 0
            } else {
                !schedule.is_empty()
            };
            if faults_left && Instant::now() >= next_fault {
                let kind = if continuous {
                    kinds[self.rng.below(kinds.len() as u64) as usize]
                } else {
                    schedule.pop().expect("a fault left")
                };
                self.inject(kind).await;
                faults_done += 1;
                next_fault = Instant::now() + self.rng.ms_between(1_000, 3_000);
            }
            self.revive();
            let all_posted =
                self.chunks_created == chunks && self.messages.len() == self.size.messages;
            if all_posted
                && !faults_left
                && self.backlog() == 0
                && self.all_answered()
                && self.h.ledger.quiescent()
            {
                eprintln!(
                    "settled after {:?}: {faults_done} faults",
                    started.elapsed()
                );
                return true;
            }
            if started.elapsed() > self.size.limit {
                eprintln!(
                    "NOT settled within {:?}: {}; {} of {} messages answered",
                    self.size.limit,
                    self.h.ledger.describe(),
                    self.messages
                        .values()
                        .filter(|id| self.answered(**id))
                        .count(),
                    self.messages.len()
                );
                return false;
            }
            tokio::time::sleep(ms(50)).await;
        }
    }

    /// Milliseconds from each kill/pause/partition to the first re-claim of a task
    /// the relay's agents held then (failover time), from the ledger, with the fault.
    fn failover_ms(&self) -> Vec<(FaultKind, String, i64)> {
        let claims = self.h.ledger.claims();
        let completions = self.h.ledger.completions();
        let mut out = Vec::new();
        for f in &self.faults {
            if !f.kind.may_repeat_work() {
                continue;
            }
            let Some(relay) = &f.relay else { continue };
            // Per task, the latest accepted claim before the fault.
            let mut held: BTreeMap<&str, &ClaimRow> = BTreeMap::new();
            for c in claims.iter().filter(|c| c.at.as_micros() <= f.from_us) {
                held.insert(c.task.as_str(), c);
            }
            for (task, c) in held {
                if self.hosts.get(&c.actor) != Some(relay) {
                    continue;
                }
                let finished_before = completions
                    .iter()
                    .any(|d| d.accepted && d.task == task && d.at.as_micros() <= f.from_us);
                if finished_before {
                    continue;
                }
                if let Some(next) = claims
                    .iter()
                    .find(|n| n.task == task && n.epoch > c.epoch && n.at.as_micros() > f.from_us)
                {
                    out.push((
                        f.kind,
                        task.to_string(),
                        (next.at.as_micros() - f.from_us) / 1000,
                    ));
                }
            }
        }
        out
    }
}

/// What one battery run found.
struct Round {
    seed: u64,
    settled: bool,
    report: HistoryReport,
    failover: Vec<(FaultKind, String, i64)>,
    crashes: Vec<String>,
    summaries: Vec<RelaySummary>,
    wall: Duration,
}

async fn round(backend: Backend, kinds: &[FaultKind], seed: u64) -> Round {
    eprintln!(
        "fault battery on {backend:?}: seed {seed} (HUDDLE_FAULT_SEED={seed} replays the schedule)"
    );
    let started = Instant::now();
    let mut b = Battery::new(backend, seed, size(kinds.len())).await;
    let settled = b.run(kinds).await;
    for p in b.proxies.values() {
        p.heal();
        p.set_delay(Duration::ZERO);
    }
    let summaries = b.h.stop_all_unchecked().await;
    let rows = b.h.ledger.rows.clone();
    let effects = read_side_effects(&b.effects);
    let report = check(&History {
        room: &b.h.room,
        rows: &rows,
        side_effects: &effects,
        tasks: &b.tasks,
        messages: &b.messages,
        hosts: &b.hosts,
        faults: &b.faults,
        summaries: &summaries,
        expected_hashes: Some(b.h.ledger.hashes()),
        commit_slack_us: 250_000,
        one_writer: backend == Backend::Sqlite,
    });
    let failover = b.failover_ms();
    let ms: Vec<i64> = failover.iter().map(|f| f.2).collect();
    eprintln!("{report}");
    eprintln!("  failover ms by fault: {}", failover_by_kind(&failover));
    eprintln!(
        "figures: seed {seed}; faults by kind {:?}; duplicates {} (tasks completed twice) + {} (messages answered twice); losses {} (tasks) + {} (messages); re-executions {} ({:?}); failover ms max {:?} mean {:?} over {}; relay crashes {:?}; (relay, turns started, not started, fenced refusals) {:?}",
        report.faults,
        count(&report, "task completed twice"),
        count(&report, "message answered twice"),
        count(&report, "task never completed"),
        count(&report, "message never answered"),
        report.extra_starts(),
        report.repeats_by_cause(),
        ms.iter().max(),
        (!ms.is_empty()).then(|| ms.iter().sum::<i64>() / ms.len() as i64),
        ms.len(),
        b.crashes,
        summaries
            .iter()
            .map(|s| (&s.relay, s.turns_started, s.turns_not_started, s.fenced_refusals))
            .collect::<Vec<_>>(),
    );
    Round {
        seed,
        settled,
        report,
        failover,
        crashes: b.crashes.clone(),
        summaries,
        wall: started.elapsed(),
    }
}

async fn battery(backend: Backend, kinds: &[FaultKind]) {
    let seed = seed();
    let Some(soak) = soak() else {
        let r = round(backend, kinds, seed).await;
        assert!(
            r.settled,
            "the room did not settle under faults (seed {seed})\n{}",
            r.report
        );
        assert!(
            r.report.violations.is_empty(),
            "exactly once broke under faults (seed {seed}):\n{}",
            r.report
        );
        assert!(
            r.crashes.is_empty(),
            "relays exited by themselves: {:?}",
            r.crashes
        );
        return;
    };
    // The soak: successive rounds, each with its own seed (printed), faults
    // throughout every round; the figures add up over all of them.
    let rounds = soak.rounds();
    let started = Instant::now();
    let mut all: Vec<Round> = Vec::new();
    for i in 0..rounds {
        eprintln!(
            "soak round {}/{rounds} on {backend:?} ({:?} so far)",
            i + 1,
            started.elapsed()
        );
        let r = round(backend, kinds, seed.wrapping_add(i as u64)).await;
        let broken = !r.settled || !r.report.violations.is_empty() || !r.crashes.is_empty();
        all.push(r);
        if broken {
            break;
        }
    }
    let sum = |f: &dyn Fn(&Round) -> usize| all.iter().map(f).sum::<usize>();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &all {
        for (k, n) in &r.report.faults {
            *faults.entry(k).or_default() += n;
        }
        for (k, n) in r.report.repeats_by_cause() {
            *causes.entry(k).or_default() += n;
        }
    }
    let failover: Vec<(FaultKind, String, i64)> =
        all.iter().flat_map(|r| r.failover.clone()).collect();
    let mut sorted: Vec<i64> = failover.iter().map(|f| f.2).collect();
    sorted.sort_unstable();
    let pct = |p: usize| {
        sorted
            .get((sorted.len().saturating_sub(1)) * p / 100)
            .copied()
    };
    let not_started: u64 = all
        .iter()
        .flat_map(|r| &r.summaries)
        .map(|s| s.turns_not_started)
        .sum();
    eprintln!(
        "soak figures: backend {backend:?}; {} rounds (seeds {}..={}) in {:?}; tasks {} created, {} completed; messages {} posted, {} answered; faults {} by kind {faults:?}; duplicates {} (tasks completed twice) + {} (messages answered twice); losses {} (tasks) + {} (messages); re-executions {} by cause {causes:?}; turns not started (late) {not_started}; failover ms over {} re-claims: p50 {:?} p99 {:?} max {:?}; violations {}; unsettled rounds {}; relay crashes {}",
        all.len(),
        seed,
        seed.wrapping_add(all.len().saturating_sub(1) as u64),
        started.elapsed(),
        sum(&|r| r.report.tasks),
        sum(&|r| r.report.tasks_completed),
        sum(&|r| r.report.messages),
        sum(&|r| r.report.messages_answered),
        faults.values().sum::<usize>(),
        sum(&|r| count(&r.report, "task completed twice")),
        sum(&|r| count(&r.report, "message answered twice")),
        sum(&|r| count(&r.report, "task never completed")),
        sum(&|r| count(&r.report, "message never answered")),
        sum(&|r| r.report.extra_starts()),
        failover.len(),
        pct(50),
        pct(99),
        sorted.last(),
        sum(&|r| r.report.violations.len()),
        all.iter().filter(|r| !r.settled).count(),
        sum(&|r| r.crashes.len()),
    );
    eprintln!("soak failover ms by fault: {}", failover_by_kind(&failover));
    for r in &all {
        eprintln!(
            "  round seed {}: {:?}, {} tasks, {} messages, {} faults, {} re-executions, settled {}",
            r.seed,
            r.wall,
            r.report.tasks,
            r.report.messages,
            r.report.faults.values().sum::<usize>(),
            r.report.extra_starts(),
            r.settled
        );
    }
    for r in &all {
        assert!(
            r.settled,
            "a soak round did not settle (seed {})\n{}",
            r.seed, r.report
        );
        assert!(
            r.report.violations.is_empty(),
            "exactly once broke in a soak round (seed {}):\n{}",
            r.seed,
            r.report
        );
        assert!(
            r.crashes.is_empty(),
            "relays exited by themselves (seed {}): {:?}",
            r.seed,
            r.crashes
        );
    }
    assert!(
        sum(&|r| r.report.tasks) >= soak.tasks && sum(&|r| r.report.messages) >= soak.messages,
        "the soak fell short of its totals"
    );
}

/// `kind: n re-claims, p50 / max ms` per fault kind, and the slowest re-claims.
fn failover_by_kind(failover: &[(FaultKind, String, i64)]) -> String {
    let mut by: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (k, _, ms) in failover {
        by.entry(k.name()).or_default().push(*ms);
    }
    let mut out: Vec<String> = by
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_unstable();
            format!(
                "{k}: {} re-claims, p50 {} max {}",
                v.len(),
                v[(v.len() - 1) / 2],
                v[v.len() - 1]
            )
        })
        .collect();
    let mut slow: Vec<&(FaultKind, String, i64)> = failover.iter().collect();
    slow.sort_by_key(|f| -f.2);
    out.push(format!(
        "slowest {:?}",
        slow.iter()
            .take(3)
            .map(|(k, t, ms)| format!("{} {t} {ms}", k.name()))
            .collect::<Vec<_>>()
    ));
    out.join("; ")
}

fn count(r: &HistoryReport, invariant: &str) -> usize {
    r.by_invariant().get(invariant).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_under_faults_sqlite() {
    battery(
        Backend::Sqlite,
        &[
            FaultKind::Kill9,
            FaultKind::Pause,
            FaultKind::Kill9,
            FaultKind::Pause,
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_under_faults_postgres() {
    battery(
        Backend::PostgresOwnCluster,
        &[
            FaultKind::PgRestartFast,
            FaultKind::PgRestartImmediate,
            FaultKind::TerminateBackends,
            FaultKind::DropConnections,
            FaultKind::BlackHole,
            FaultKind::Delay,
            FaultKind::Kill9,
            FaultKind::Pause,
        ],
    )
    .await
}
