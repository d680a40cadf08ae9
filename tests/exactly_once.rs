//! Exactly once under faults, counted in side effects: every agent here is an exec
//! agent that appends a `start` and an `end` line to a log for every real execution,
//! so a re-run is visible even when it writes rows identical to the first run's.
//!
//! Each test is one of the failures the exactly-once work fixed: short turns re-running
//! finished tasks, a paused relay re-taking finished work, the same agent on two relays
//! completing a task twice, two processes with one relay id, reads stalling on a page
//! boundary, a large `!delegate` lost, a result dropped while the database restarts,
//! and a relay killed while it writes an owner command's results.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::relays::{secs, AgentSpec, Backend, Huddle};
use huddle_core::{Role, TaskStatus, Verb};

/// One line of the side-effect log.
#[derive(Clone, Debug)]
struct Execution {
    start: bool,
    agent: String,
    subject: String,
    epoch: i64,
    at_us: i64,
}

/// An exec agent script that logs every execution to `log`, works `work_s` seconds
/// and replies. The subject is the task id, or the `tok-...` token of the message.
fn recording_agent(h: &Huddle, name: &str, log: &Path, work_s: &str) -> PathBuf {
    h.script(
        name,
        &format!(
            r#"prompt=$(cat)
subject=${{HUDDLE_TASK:-}}
if [ -z "$subject" ]; then
  subject=$(printf '%s\n' "$prompt" | sed -n '/<message from/,/<\/message>/p' | grep -o 'tok-[0-9a-z]*' | head -n 1)
fi
echo "start $HUDDLE_AGENT $subject ${{HUDDLE_EPOCH:-0}} $(date +%s%6N)" >> {log}
sleep {work_s}
echo "end $HUDDLE_AGENT $subject ${{HUDDLE_EPOCH:-0}} $(date +%s%6N)" >> {log}
echo "done $subject"
"#,
            log = log.display()
        ),
    )
}

fn executions(log: &Path) -> Vec<Execution> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5).then(|| Execution {
                start: f[0] == "start",
                agent: f[1].to_string(),
                subject: f[2].to_string(),
                epoch: f[3].parse().unwrap_or(-1),
                at_us: f[4].parse().unwrap_or(0),
            })
        })
        .collect()
}

fn starts_per_subject(log: &Path) -> BTreeMap<String, Vec<Execution>> {
    let mut out: BTreeMap<String, Vec<Execution>> = BTreeMap::new();
    for e in executions(log).into_iter().filter(|e| e.start) {
        out.entry(e.subject.clone()).or_default().push(e);
    }
    out
}

/// No execution of a task started after its completion was committed.
fn assert_no_start_after_completion(h: &Huddle, log: &Path) {
    let done = h.ledger.completions();
    for e in executions(log).into_iter().filter(|e| e.start) {
        if let Some(c) = done.iter().find(|c| c.task == e.subject) {
            assert!(
                e.at_us < c.at.as_micros(),
                "{} started {} by {} at epoch {} after its completion was committed ({} µs later)",
                e.subject,
                e.at_us,
                e.agent,
                e.epoch,
                e.at_us - c.at.as_micros()
            );
        }
    }
}

fn task_lines(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{prefix}{i:04}: job {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Side effects counted: the agents' log shows `n` tasks started, each exactly once,
/// and none started after its completion was written.
fn assert_each_task_ran_once(h: &Huddle, log: &Path, n: usize) {
    let starts = starts_per_subject(log);
    assert_eq!(starts.len(), n, "tasks executed");
    let repeated: Vec<(&String, usize)> = starts
        .iter()
        .filter(|(_, s)| s.len() != 1)
        .map(|(t, s)| (t, s.len()))
        .collect();
    assert!(
        repeated.is_empty(),
        "tasks executed more than once: {repeated:?}"
    );
    assert_no_start_after_completion(h, log);
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(Backend::Postgres).await;
            }
        }
    )*};
}

both_backends!(
    short_turns_run_every_task_once,
    short_turns_holding_tasks_ahead_run_every_task_once,
    three_relays_holding_tasks_deep_run_every_task_once,
    three_relays_with_two_batches_in_flight_run_every_task_once,
    three_relays_in_a_compact_room_run_every_task_once,
    paused_relay_never_reruns_finished_work,
    paused_relay_holding_tasks_ahead_never_reruns_finished_work,
    paused_relay_in_a_compact_room_never_reruns_finished_work,
    same_agent_on_two_relays_completes_once,
    same_agents_on_two_live_relays_run_every_task_once,
    delegates_at_page_and_batch_boundaries_all_land,
    a_relay_resuming_from_its_snapshot_reruns_nothing,
);

/// A relay that keeps a snapshot of its folds (plan 0063), stopped cleanly and later
/// killed, resumes from the snapshot each time: it reads only the rows since, runs the
/// tasks delegated while it was down, and executes no task twice (side effects
/// counted), beside a relay that reads from the first row.
async fn a_relay_resuming_from_its_snapshot_reruns_nothing(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "snap.sh", &log, "0.01");
    let snapshot = h.dir().join("r0.snapshot");
    let with_snapshot =
        "snapshot = \"r0.snapshot\"\nsnapshot_every_rows = 1\nsnapshot_min_interval_ms = 0";
    let r0 = || vec![AgentSpec::exec("s0", &agent), AgentSpec::exec("s1", &agent)];
    h.spawn_relay_with("r0", r0(), with_snapshot);
    h.spawn_relay("r1", vec![AgentSpec::exec("p0", &agent)]);
    h.wait_registered(&["s0", "s1", "p0"]).await;
    h.delegate(&task_lines("a", 30)).await;
    h.wait_until("30 tasks done", secs(60), |l| l.summary().done == 30)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.wait_until("r0 wrote its snapshot", secs(30), |_| snapshot.exists())
        .await;
    let first = h.relay("r0").terminate();
    assert_eq!(first.rows_resumed, 0);

    // Delegated while r0 is down: r0 resumes and shares them with r1.
    h.delegate(&task_lines("b", 30)).await;
    let url = h.db.url.clone();
    h.spawn_relay_full("r0", r0(), &url, Some("warn,huddle=info"), with_snapshot);
    h.wait_until("60 tasks done", secs(60), |l| l.summary().done == 60)
        .await;
    h.wait_quiescent(secs(30)).await;
    // Idle again: the snapshot is rewritten; then the relay is killed outright.
    let written = std::fs::metadata(&snapshot).and_then(|m| m.modified()).ok();
    h.wait_until("r0 rewrote its snapshot", secs(30), |_| {
        std::fs::metadata(&snapshot).and_then(|m| m.modified()).ok() != written
    })
    .await;
    let resumed = h.relay("r0").log_tail(10_000);
    assert!(
        resumed.contains("resumed from the snapshot of its folds"),
        "{resumed}"
    );
    h.relay("r0").kill9();

    // r1 stops too, then more is delegated (no relay runs to answer it yet): r0 alone
    // runs it when it comes back.
    let r1 = h.relay("r1").terminate();
    let mut post = common::huddle(&h.db.url);
    let text = format!("!delegate\n{}", task_lines("c", 20));
    post.args(["post", "--room", &h.room, "--as", &h.owner, &text]);
    common::ok(post);
    h.spawn_relay_with("r0", r0(), with_snapshot);
    h.wait_until("80 tasks done", secs(90), |l| l.summary().done == 80)
        .await;
    h.wait_quiescent(secs(30)).await;
    let last = h.relay("r0").terminate();
    assert!(last.rows_resumed > 0, "{last:?}");
    assert!(r1.rows_resumed == 0);
    h.refresh().await;
    // The resumed fold equals the test's own fold of every row.
    h.assert_converged(std::slice::from_ref(&last));
    h.ledger.assert_all_done_exactly_once(80);
    assert_each_task_ran_once(&h, &log, 80);
}

/// One relay, 16 agents with turns of a few milliseconds, 300 independent tasks:
/// exactly 300 executions (the relay used to re-claim a task it had just finished
/// before reading its own completion back).
async fn short_turns_run_every_task_once(backend: Backend) {
    short_turns(backend, false).await;
}

/// The same with `lease-ahead on` and `lease-depth 8` (plans 0084, 0085): every agent
/// holds up to eight next tasks while it works, and still every task runs exactly
/// once.
async fn short_turns_holding_tasks_ahead_run_every_task_once(backend: Backend) {
    short_turns(backend, true).await;
}

async fn short_turns(backend: Backend, ahead: bool) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "quick.sh", &log, "0.001");
    let keys: Vec<String> = (0..16).map(|i| format!("q{i:02}")).collect();
    h.spawn_relay(
        "r0",
        keys.iter().map(|k| AgentSpec::exec(k, &agent)).collect(),
    );
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    h.wait_registered(&refs).await;
    if ahead {
        h.config("lease-ahead on").await;
        h.config("lease-depth 8").await;
    }
    h.delegate(&task_lines("t", 300)).await;
    h.wait_until("300 tasks done", secs(120), |l| l.summary().done == 300)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(300);
    assert_each_task_ran_once(&h, &log, 300);
    // Hand-offs of several fresh tasks, and turns that end together, are written as
    // lots (plan 0080); `assert_all_done_exactly_once` found no interaction read twice.
    let (handoffs, results) = lots_written(&h).await;
    eprintln!("lots: {handoffs} hand-offs, {results} of results");
    assert!(handoffs >= 1, "no hand-off was written as a lot");
    assert!(results >= 1, "no results were written as a lot");
}

/// Three relay processes, four agents each, `lease-ahead on` at `lease-depth 8`
/// (plans 0084, 0085), 300 short tasks: the relays contend for the same ready tasks
/// with many claims in flight at once, so some hand-off lots are refused (a claim lost
/// to another relay) and their won tasks' rows are written after their claims. Every
/// task still runs exactly once (executions counted) and is done: a held turn never
/// starts before its rows are in, so its result is never written before them.
async fn three_relays_holding_tasks_deep_run_every_task_once(backend: Backend) {
    three_relays_deep(backend, 1, false).await;
}

/// The same in a room with `compact-turns on` (plan 0095): each task turn is two
/// rows, its start and end carried by `task.claimed` and `task.completed`. Every task
/// runs exactly once, no task turn writes a `turn.*` row of its own, and every relay's
/// folds agree with the test's own fold of the two-row form.
async fn three_relays_in_a_compact_room_run_every_task_once(backend: Backend) {
    three_relays_deep(backend, 1, true).await;
}

/// The same with each relay keeping two batches of results and claims in flight at
/// once (plan 0087): its hand-off statements overlap, and still every task runs
/// exactly once.
async fn three_relays_with_two_batches_in_flight_run_every_task_once(backend: Backend) {
    three_relays_deep(backend, 2, false).await;
}

async fn three_relays_deep(backend: Backend, batches_in_flight: usize, compact: bool) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "deep.sh", &log, "0.001");
    let mut keys = Vec::new();
    for r in 0..3 {
        let mine: Vec<String> = (0..4).map(|i| format!("d{r}{i}")).collect();
        h.spawn_relay_with(
            &format!("r{r}"),
            mine.iter().map(|k| AgentSpec::exec(k, &agent)).collect(),
            &format!("batches_in_flight = {batches_in_flight}"),
        );
        keys.extend(mine);
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    h.wait_registered(&refs).await;
    h.config("lease-ahead on").await;
    h.config("lease-depth 8").await;
    if compact {
        h.config("compact-turns on").await;
    }
    h.delegate(&task_lines("t", 300)).await;
    h.wait_until("300 tasks done", secs(180), |l| l.summary().done == 300)
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;
    h.refresh().await;
    h.ledger.assert_all_done_exactly_once(300);
    assert_each_task_ran_once(&h, &log, 300);
    assert_command_results_sent_once(&h, &summaries);
    if compact {
        h.assert_converged(&summaries);
        let carrying = |verb| {
            h.ledger
                .of_verb(verb)
                .filter(|r| r.1.body.get("turn").is_some_and(|t| t.is_object()))
                .count()
        };
        assert_eq!(
            carrying(Verb::TaskCompleted),
            300,
            "every completion carries its turn"
        );
        assert!(
            carrying(Verb::TaskClaimed) >= 300,
            "every turn's start is carried"
        );
        assert_eq!(h.ledger.of_verb(Verb::TurnReplied).count(), 0);
    }
}

/// Each owner command's results were sent by one relay (plan 0090): the rows the
/// relays sent together are the rows the commands derived, not once per relay.
fn assert_command_results_sent_once(h: &Huddle, summaries: &[common::relays::RelaySummary]) {
    let rows = &h.ledger.rows;
    let commands: std::collections::BTreeSet<_> = rows
        .iter()
        .filter(|r| r.verb == Verb::MessagePosted && r.role == Role::Owner)
        .map(|r| r.id)
        .collect();
    let derived = rows
        .iter()
        .filter(|r| r.parent.is_some_and(|p| commands.contains(&p)))
        .count() as u64;
    let sent: u64 = summaries.iter().map(|s| s.command_rows_sent).sum();
    assert!(derived > 300, "{derived} rows derived from owner commands");
    assert_eq!(
        sent,
        derived,
        "owner-command result rows sent by all relays together: {:?}",
        summaries
            .iter()
            .map(|s| (&s.relay, s.command_rows_sent))
            .collect::<Vec<_>>()
    );
}

/// The `task.lot` rows of the room as stored (plan 0080): how many carried hand-offs
/// (`task.claimed` items) and how many results.
async fn lots_written(h: &Huddle) -> (usize, usize) {
    let (mut handoffs, mut results) = (0, 0);
    let mut cursor = huddle_core::Position::START;
    loop {
        let batch = h
            .store
            .read_room_rows(&h.room, cursor, 1000)
            .await
            .expect("read the room's rows");
        assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
        for row in batch.rows.iter().filter(|r| r.verb == Verb::TaskLot) {
            match row.body["items"][0]["verb"].as_str() {
                Some("task.claimed") => handoffs += 1,
                _ => results += 1,
            }
        }
        if batch.next == cursor {
            return (handoffs, results);
        }
        cursor = batch.next;
    }
}

/// A relay paused past the claim TTL while the other relay finishes everything must,
/// once resumed, run none of the finished tasks again (its view is older than the
/// claims it could win: closed claims refuse it).
async fn paused_relay_never_reruns_finished_work(backend: Backend) {
    paused_relay(backend, false, false).await;
}

/// The same with `lease-ahead on` (plan 0084, at the default `lease-depth` of 4): the
/// paused relay's agent holds its next tasks when it is paused; their leases lapse and
/// the other relay takes them, and once resumed the relay starts none of what it
/// held.
async fn paused_relay_holding_tasks_ahead_never_reruns_finished_work(backend: Backend) {
    paused_relay(backend, true, false).await;
}

/// The same with `lease-ahead on` in a room with `compact-turns on` (plan 0095): the
/// resumed relay reads the turns the other relay ran from their task rows alone.
async fn paused_relay_in_a_compact_room_never_reruns_finished_work(backend: Backend) {
    paused_relay(backend, true, true).await;
}

async fn paused_relay(backend: Backend, ahead: bool, compact: bool) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "steady.sh", &log, "0.05");
    h.spawn_relay("r0", vec![AgentSpec::exec("p0", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("q0", &agent)]);
    h.wait_registered(&["p0", "q0"]).await;
    h.config("claim-ttl 1s").await;
    if ahead {
        h.config("lease-ahead on").await;
    }
    if compact {
        h.config("compact-turns on").await;
    }
    h.delegate(&task_lines("t", 40)).await;
    h.wait_until("p0 has started a task", secs(30), |_| {
        executions(&log).iter().any(|e| e.agent == "p0")
    })
    .await;
    h.relay("r0").pause();
    h.wait_until("every task done while r0 is paused", secs(90), |l| {
        l.summary().done == 40
    })
    .await;
    // Past the TTL of everything r0 held, so every claim it had is lapsed.
    let resumed_at = h.db_now().await;
    h.relay("r0").resume();
    // r0 is back when it answers a message addressed to its agent: by then it has read
    // forward and made its passes over the (stale, then fresh) task view.
    let ping = h
        .post("olga", Role::Human, "@p0 tok-ping are you back?")
        .await;
    h.wait_until("p0 answers after the pause", secs(30), |l| {
        !l.replies_to(ping).is_empty()
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(40);
    assert_no_start_after_completion(&h, &log);
    let late: Vec<Execution> = executions(&log)
        .into_iter()
        .filter(|e| {
            e.start
                && e.agent == "p0"
                && e.at_us > resumed_at.as_micros()
                && e.subject != "tok-ping"
        })
        .collect();
    assert!(
        late.is_empty(),
        "the resumed relay ran work again: {late:?}"
    );
    let raw = h.ledger.of_verb(Verb::TaskCompleted).count();
    assert_eq!(
        raw, 40,
        "raw task.completed rows (a second completion is a re-run)"
    );
}

/// The same agent hosted on two relays: one relay is paused mid-turn past the TTL, the
/// other re-takes the task as the same agent and completes it; the resumed relay's
/// completion is refused (fenced by the task claim, re-taken at a higher epoch by the
/// other relay as its driver) and it starts nothing it no longer drives.
async fn same_agent_on_two_relays_completes_once(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "ada.sh", &log, "1.5");
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.config("claim-ttl 1s").await;
    h.delegate("j1: one job").await;
    h.wait_until("r0 runs j1", secs(30), |_| {
        executions(&log)
            .iter()
            .any(|e| e.start && e.subject == "j1")
    })
    .await;
    h.relay("r0").pause();
    h.spawn_relay("r1", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_until("j1 done by r1", secs(60), |l| {
        l.task("j1").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.relay("r0").resume();
    // r0's own execution ends after its pause; its completion must be refused.
    h.wait_until("both executions ended", secs(30), |_| {
        executions(&log).iter().filter(|e| !e.start).count() >= 2
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let completed: Vec<_> = h
        .ledger
        .of_verb(Verb::TaskCompleted)
        .map(|(_, r)| r.relay.clone())
        .collect();
    assert_eq!(completed.len(), 1, "raw completions of j1: {completed:?}");
    h.ledger.assert_all_done_exactly_once(1);
    assert_no_start_after_completion(&h, &log);
    let starts = starts_per_subject(&log);
    assert_eq!(
        starts["j1"].len(),
        2,
        "one run per relay: {:?}",
        starts["j1"]
    );
}

/// The same two agents hosted by two live relay processes at once (plan 0094: one
/// claim a task turn, the relay its driver): both relays contend for every task as
/// the same agents, and each task runs exactly once (executions counted from the
/// agents' own log), is completed once, and no relay takes a task the other drives.
async fn same_agents_on_two_live_relays_run_every_task_once(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    // One log per relay process: the agents are the same, their runs are told apart.
    let logs = [
        h.dir().join("effects-r0.log"),
        h.dir().join("effects-r1.log"),
    ];
    let scripts = [
        recording_agent(&h, "twin0.sh", &logs[0], "0.05"),
        recording_agent(&h, "twin1.sh", &logs[1], "0.05"),
    ];
    let agents = |s: &Path| vec![AgentSpec::exec("ada", s), AgentSpec::exec("bo", s)];
    h.spawn_relay("r0", agents(&scripts[0]));
    h.spawn_relay("r1", agents(&scripts[1]));
    h.wait_registered(&["ada", "bo"]).await;
    h.delegate(&task_lines("w", 40)).await;
    h.wait_until("40 tasks done", secs(90), |l| l.summary().done == 40)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(40);
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for log in &logs {
        assert_no_start_after_completion(&h, log);
        for (task, runs) in starts_per_subject(log) {
            *starts.entry(task).or_default() += runs.len();
        }
    }
    assert_eq!(starts.len(), 40, "every task ran: {:?}", starts.keys());
    let twice: Vec<_> = starts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "tasks run more than once: {twice:?}");
    let raw = h.ledger.of_verb(Verb::TaskCompleted).count();
    assert_eq!(raw, 40, "raw task.completed rows");
    for log in &logs {
        assert!(
            !starts_per_subject(log).is_empty(),
            "both relays drove some of the work: {} ran nothing",
            log.display()
        );
    }
}

/// `!delegate`s whose rows end exactly at a read page (500) or exceed one append batch
/// (1,000 tasks plus the reply) are all created and all worked; none stalls until an
/// unrelated row arrives.
async fn delegates_at_page_and_batch_boundaries_all_land(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let keys: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    h.spawn_relay("r0", keys.iter().map(|k| AgentSpec::sim(k, 1)).collect());
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    h.wait_registered(&refs).await;
    let mut total = 0;
    for (prefix, n) in [("a", 499), ("b", 500), ("c", 999), ("d", 1000)] {
        h.delegate(&task_lines(prefix, n)).await;
        total += n;
        h.wait_until(&format!("{total} tasks done"), secs(180), |l| {
            l.summary().done == total
        })
        .await;
    }
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(total);
}

/// Two processes with one relay id: the second refuses to start and names the first;
/// after the first stops cleanly, the id is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_id_is_held_by_one_live_process() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    h.spawn_relay("r0", vec![AgentSpec::sim("a0", 10)]);
    h.wait_registered(&["a0"]).await;
    let config = h.dir().join("r0.toml");
    assert!(config.exists(), "the harness writes <id>.toml");
    let out = common::huddle(&h.db.url)
        .args(["relay", "--config"])
        .arg(&config)
        .output()
        .expect("run a second relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second r0 started: {stderr}");
    assert!(
        stderr.contains("relay id \"r0\" is in use by another live process")
            && stderr.contains(&format!("pid{}", h.relay("r0").pid())),
        "the refusal names the other process: {stderr}"
    );
    h.relay("r0").terminate();
    // Free at once after a clean stop.
    h.spawn_relay("r0", vec![AgentSpec::sim("a0", 10)]);
    let id = h.post("olga", Role::Human, "@a0 still there?").await;
    h.wait_until("a0 answers", secs(30), |l| !l.replies_to(id).is_empty())
        .await;
    h.stop_all().await;
}

/// A turn that ends while Postgres is down: its result is retried until the database
/// is back, then written; the message is answered exactly once and the task done
/// once, by the agent that ran them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_written_while_the_database_restarts_is_not_lost() {
    let mut h = Huddle::new(Backend::PostgresOwnCluster).await;
    let log = h.dir().join("effects.log");
    let agent = recording_agent(&h, "slow.sh", &log, "2");
    h.spawn_relay("r0", vec![AgentSpec::exec("solo", &agent)]);
    h.wait_registered(&["solo"]).await;
    h.delegate("j1: survive an outage").await;
    h.wait_until("solo runs j1", secs(30), |_| {
        executions(&log)
            .iter()
            .any(|e| e.start && e.subject == "j1")
    })
    .await;
    h.db.stop_postgres();
    h.wait_local("j1's execution ended", secs(30), || {
        executions(&log)
            .iter()
            .any(|e| !e.start && e.subject == "j1")
    })
    .await;
    // Give the database back once the relay has failed to write at least once.
    let relay_log = h.dir().join("r0.0.log");
    h.wait_local("the relay retrying its write", secs(30), || {
        std::fs::read_to_string(&relay_log).is_ok_and(|t| t.contains("append failed; retrying"))
    })
    .await;
    h.db.start_postgres();
    h.wait_until("j1 done", secs(60), |l| {
        l.task("j1").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    let id = h
        .post("olga", Role::Human, "@solo tok-after the outage")
        .await;
    h.wait_until("solo answers", secs(30), |l| !l.replies_to(id).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(1);
    let starts = starts_per_subject(&log);
    assert_eq!(starts["j1"].len(), 1, "j1 ran once: {:?}", starts["j1"]);
    assert!(
        summaries[0].writes_retried > 0,
        "the relay retried a write: {summaries:?}"
    );
    assert_eq!(summaries[0].results_lost, 0, "{summaries:?}");
}

/// The relay that won an owner command's result claim (plan 0090) is killed with
/// SIGKILL while its write of the results waits inside the database (a test trigger
/// holds every `task.created` insert on an advisory lock the test owns), and its
/// database session is ended: the write dies with it. Once its lease lapses, one of the two other relay processes takes the
/// claim over and writes the results; every task is created and done exactly once,
/// the survivors sent the command's rows once between them, and none of them was
/// written before the dead writer's lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_while_writing_command_results_is_taken_over() {
    const GATE: i64 = 0x0090;
    let mut h = Huddle::new(Backend::Postgres).await;
    let (sql, conn) = tokio_postgres::connect(&h.db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    sql.batch_execute(&format!(
        "CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock_shared({GATE}); RETURN NEW; END $$;
         CREATE TRIGGER test_gate BEFORE INSERT ON interaction FOR EACH ROW
         WHEN (NEW.verb = 'task.created') EXECUTE FUNCTION test_gate();
         SELECT pg_advisory_lock({GATE});"
    ))
    .await
    .expect("the gate");
    for r in 0..3 {
        h.spawn_relay(
            &format!("r{r}"),
            vec![
                AgentSpec::sim(&format!("k{r}0"), 5),
                AgentSpec::sim(&format!("k{r}1"), 5),
            ],
        );
    }
    h.wait_registered(&["k00", "k01", "k10", "k11", "k20", "k21"])
        .await;
    let command = h.owner_posts(&format!("!delegate\n{}", task_lines("t", 40)));
    let key = huddle_core::protocol::command_result_key("lobby", &command);
    // The winner is inside its insert, waiting on the gate.
    let deadline = std::time::Instant::now() + secs(30);
    let (holder, expires_us) = loop {
        let held = sql
            .query_opt(
                "SELECT holder, (extract(epoch FROM expires_at) * 1e6)::int8 FROM external_claim
                 WHERE key = $1",
                &[&key],
            )
            .await
            .expect("read the claim");
        if let (Some(row), false) = (held, waiting_writers(&sql).await.is_empty()) {
            break (row.get::<_, String>(0), row.get::<_, i64>(1));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no relay took the command's result claim and started writing"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        waiting_writers(&sql).await.len(),
        1,
        "one relay writes the results"
    );
    // The relay dies, and so does its connection's session (a backend waiting on a
    // lock would otherwise finish the insert for the dead client once the gate opens).
    h.relay(&holder).kill9();
    let waiting = waiting_writers(&sql).await;
    assert_eq!(waiting.len(), 1, "the dead relay's write was waiting");
    let ended: bool = sql
        .query_one("SELECT pg_terminate_backend($1)", &[&waiting[0]])
        .await
        .expect("end the dead relay's session")
        .get(0);
    assert!(ended, "the dead relay's session ended");
    sql.batch_execute(&format!("SELECT pg_advisory_unlock({GATE})"))
        .await
        .expect("open the gate");
    h.wait_until("40 tasks done", secs(60), |l| l.summary().done == 40)
        .await;
    h.wait_quiescent(secs(30)).await;
    let summaries = h.stop_all().await;
    assert_eq!(
        summaries.len(),
        2,
        "the two survivors stopped: {summaries:?}"
    );
    h.ledger.assert_all_done_exactly_once(40);
    let results: Vec<_> = h
        .ledger
        .rows
        .iter()
        .filter(|r| r.parent == Some(command))
        .collect();
    assert_eq!(results.len(), 41, "40 tasks and the reply");
    for r in &results {
        assert!(
            r.at.0 >= expires_us,
            "{:?} written at {}, before the killed writer's lease lapsed at {expires_us}",
            r.verb,
            r.at.0
        );
    }
    let sent: u64 = summaries.iter().map(|s| s.command_rows_sent).sum();
    assert_eq!(sent, 41, "one survivor wrote the results: {summaries:?}");
}

/// The backends (process ids) waiting on the test's advisory lock.
async fn waiting_writers(sql: &tokio_postgres::Client) -> Vec<i32> {
    sql.query(
        "SELECT pid FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
        &[],
    )
    .await
    .expect("read pg_stat_activity")
    .iter()
    .map(|r| r.get(0))
    .collect()
}
