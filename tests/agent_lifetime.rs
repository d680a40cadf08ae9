//! End-to-end: an agent's processes never outlive their relay or their turn (plan
//! 0013, issue 18).
//!
//! One exec agent script serves every test. Its turn logs `start`, `term` (on SIGTERM)
//! and `end` lines with nanosecond timestamps to a side-effect log, starts a
//! grandchild that appends a timestamp to a file every 10 ms, and writes the pids of
//! itself (the group leader) and of the grandchild. Agent `slow` never finishes by
//! itself; agent `quick` finishes after 300 ms. `slow` on relay `r0` takes the task;
//! `quick` on relay `r1` re-takes it after `r0` is killed, stopped or loses the claim,
//! and the tests check that the first run was over — no member of its process group
//! running, its file no longer growing — before the re-take started.
//!
//! Linux only: processes are observed through `/proc`.
#![cfg(target_os = "linux")]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::relays::*;
use huddle_core::{Role, TaskStatus, Verb};

/// The bound of issue 18: an agent's work is gone this soon after its relay is.
const BOUND: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_relay_sqlite() {
    killed_relay(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_relay_postgres() {
    killed_relay(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_relay_sqlite() {
    stopped_relay(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_relay_postgres() {
    stopped_relay(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_claim_sqlite() {
    lost_claim(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_claim_postgres() {
    lost_claim(Backend::Postgres).await
}

/// An agent that exits without reading its prompt (longer than a pipe holds) fails
/// or ends its turn; the relay, writing into the closed pipe, goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_its_prompt_does_not_end_the_relay() {
    let mut h = Huddle::new(Backend::Sqlite).await;
    let script = h.script("deaf.sh", "exit 0");
    h.spawn_relay("r0", vec![AgentSpec::exec("deaf", &script)]);
    h.wait_registered(&["deaf"]).await;
    let m = h
        .post(
            "hank",
            Role::Human,
            &format!("deaf, {}", "x".repeat(200_000)),
        )
        .await;
    let msg = message_subject(m);
    // `wait_until` panics as soon as the relay exits.
    h.wait_until("deaf's turn to end", secs(30), |l| {
        !l.about(Verb::TurnReplied, &msg).is_empty() || !l.about(Verb::TurnFailed, &msg).is_empty()
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let s = h.stop_all().await;
    assert_eq!(s[0].turns_started, 1, "{s:?}");
}

// ---------------------------------------------------------------------------------
// The agent and what it leaves behind
// ---------------------------------------------------------------------------------

/// Wall-clock nanoseconds since the Unix epoch, as `date +%s%N` prints them.
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i128
}

fn agent_script(h: &Huddle) -> PathBuf {
    let dir = h.dir().display().to_string();
    h.script(
        "agent.sh",
        &format!(
            r#"d='{dir}'
now() {{ date +%s%N; }}
tag="$HUDDLE_AGENT $HUDDLE_TASK $HUDDLE_EPOCH"
echo "start $tag $(now)" >> "$d/effects.log"
cat > /dev/null
( while :; do now >> "$d/ticks.$HUDDLE_AGENT.$HUDDLE_EPOCH"; sleep 0.01; done ) &
echo "$$ $!" > "$d/pids.$$"; mv "$d/pids.$$" "$d/pids.$HUDDLE_AGENT.$HUDDLE_EPOCH"
trap 'echo "term $tag $(now)" >> "$d/effects.log"; exit 143' TERM
case $HUDDLE_AGENT in
  slow) sleep 600 & wait $! ;;
  *) sleep 0.3 ;;
esac
echo "end $tag $(now)" >> "$d/effects.log"
echo "done by $HUDDLE_AGENT""#
        ),
    )
}

/// One line of the side-effect log.
#[derive(Clone, Debug)]
struct Effect {
    kind: String,
    agent: String,
    task: String,
    epoch: i64,
    at_ns: i128,
}

fn effects(dir: &Path) -> Vec<Effect> {
    let text = std::fs::read_to_string(dir.join("effects.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [kind, agent, task, epoch, at] => Some(Effect {
                    kind: kind.to_string(),
                    agent: agent.to_string(),
                    task: task.to_string(),
                    epoch: epoch.parse().ok()?,
                    at_ns: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

fn effect<'a>(all: &'a [Effect], kind: &str, agent: &str) -> Option<&'a Effect> {
    all.iter().find(|e| e.kind == kind && e.agent == agent)
}

/// One agent run: its epoch, its group leader, its grandchild, its ticking file.
#[derive(Clone, Debug)]
struct Run {
    agent: String,
    epoch: i64,
    leader: u32,
    grandchild: u32,
    ticks: PathBuf,
}

impl Run {
    /// The run of `agent` once its pids file and a first tick are there.
    fn find(dir: &Path, agent: &str) -> Option<Run> {
        let start = effects(dir)
            .into_iter()
            .find(|e| e.kind == "start" && e.agent == agent)?;
        let pids =
            std::fs::read_to_string(dir.join(format!("pids.{agent}.{}", start.epoch))).ok()?;
        let pids: Vec<u32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let ticks = dir.join(format!("ticks.{agent}.{}", start.epoch));
        (pids.len() == 2 && ticks.exists()).then(|| Run {
            agent: agent.into(),
            epoch: start.epoch,
            leader: pids[0],
            grandchild: pids[1],
            ticks,
        })
    }

    fn tick_count(&self) -> usize {
        std::fs::read_to_string(&self.ticks)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn last_tick_ns(&self) -> i128 {
        std::fs::read_to_string(&self.ticks)
            .expect("ticks file")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .max()
            .expect("at least one tick")
    }

    /// Processes of the run's group that still run (zombies run nothing), and the
    /// grandchild if it left the group somehow.
    fn running(&self) -> Vec<u32> {
        let mut out = group_members(self.leader);
        if runs(self.grandchild) && !out.contains(&self.grandchild) {
            out.push(self.grandchild);
        }
        out
    }

    /// Waits until nothing of the run runs; returns how long that took from `since`
    /// and the wall-clock time it was seen.
    async fn wait_gone(&self, since: Instant, limit: Duration) -> (Duration, i128) {
        let deadline = Instant::now() + limit;
        loop {
            if self.running().is_empty() {
                return (since.elapsed(), now_ns());
            }
            assert!(
                Instant::now() < deadline,
                "{}'s run (group {}) still runs {:?} later: {:?}",
                self.agent,
                self.leader,
                since.elapsed(),
                self.running()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The state and group of a `/proc/<pid>/stat` line.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    Some((state, f.next()?.parse().ok()?))
}

fn runs(pid: u32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// Every running process in group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|(s, g)| g == pgid && s != 'Z' && s != 'X'))
        .collect()
}

/// `text` without terminal colour sequences (`ESC [ ... m`).
fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn ms_of(ns: i128) -> f64 {
    ns as f64 / 1e6
}

// ---------------------------------------------------------------------------------
// The common start: `slow` on r0 mid-turn on task j1, `quick` on r1 idle
// ---------------------------------------------------------------------------------

async fn slow_mid_turn(backend: Backend, r0_log: Option<&str>) -> (Huddle, Run) {
    let mut h = Huddle::new(backend).await;
    let script = agent_script(&h);
    h.spawn_relay_logging("r0", vec![AgentSpec::exec("slow", &script)], r0_log);
    h.wait_registered(&["slow"]).await;
    h.config("claim-ttl 2s").await;
    h.delegate("j1: a job that runs until it is stopped").await;
    let dir = h.dir().to_path_buf();
    let run = h
        .wait_for("slow's run with a ticking grandchild", secs(30), |_| {
            Run::find(&dir, "slow").filter(|r| r.tick_count() >= 3)
        })
        .await;
    assert!(runs(run.leader) && runs(run.grandchild), "{run:?}");
    assert_eq!(
        stat(run.grandchild).map(|(_, g)| g),
        Some(run.leader),
        "the grandchild is in the agent's process group"
    );
    // Only now the re-taker: `slow` already holds the task.
    h.spawn_relay("r1", vec![AgentSpec::exec("quick", &script)]);
    h.wait_registered(&["quick"]).await;
    (h, run)
}

/// After the first run is gone: `quick` re-takes j1 at a later epoch, its run starts
/// after `gone_ns` and after the first run's last write, the first run never ended,
/// its file never grew again, and `quick`'s own grandchild did not outlive its turn.
async fn retaken_after(h: &mut Huddle, first: &Run, gone_ns: i128) {
    let ticks_then = first.tick_count();
    let last_tick = first.last_tick_ns();
    h.wait_until("quick completes j1", secs(30), |l| {
        l.task("j1")
            .is_some_and(|t| t.status == TaskStatus::Done && t.owner.as_deref() == Some("quick"))
    })
    .await;
    let dir = h.dir().to_path_buf();
    let all = effects(&dir);
    let start = effect(&all, "start", "quick").expect("quick's start line");
    assert_eq!(start.task, "j1");
    assert!(
        start.epoch > first.epoch,
        "re-taken at epoch {} after {}",
        start.epoch,
        first.epoch
    );
    assert!(
        start.at_ns > gone_ns && start.at_ns > last_tick,
        "the re-take started {:.1} ms after the first run was seen gone and {:.1} ms after \
         its last write: it overlapped",
        ms_of(start.at_ns - gone_ns),
        ms_of(start.at_ns - last_tick)
    );
    eprintln!(
        "re-take by quick at epoch {} started {:.1} ms after the first run was gone",
        start.epoch,
        ms_of(start.at_ns - gone_ns)
    );
    assert!(effect(&all, "end", "quick").is_some(), "{all:?}");
    assert!(
        effect(&all, "end", "slow").is_none(),
        "the first run reached its end: {all:?}"
    );
    assert_eq!(
        first.tick_count(),
        ticks_then,
        "the first run's grandchild wrote again after its group was gone"
    );
    // `quick` exited by itself; its ticking grandchild went with its turn.
    let quick = Run::find(&dir, "quick").expect("quick's run");
    quick.wait_gone(Instant::now(), secs(5)).await;
}

// ---------------------------------------------------------------------------------
// The three ways a relay lets go of a turn
// ---------------------------------------------------------------------------------

async fn killed_relay(backend: Backend) {
    let (mut h, run) = slow_mid_turn(backend, None).await;
    let killed = Instant::now();
    let killed_ns = now_ns();
    h.relay("r0").kill9();
    let (took, gone_ns) = run.wait_gone(killed, secs(5)).await;
    let last = run.last_tick_ns();
    eprintln!(
        "{backend:?} kill -9: group gone {took:?} after the kill; last write {:.1} ms after it",
        ms_of(last - killed_ns)
    );
    assert!(
        took <= BOUND,
        "the agent's group outlived its killed relay by {took:?}"
    );
    assert!(
        last - killed_ns <= BOUND.as_nanos() as i128,
        "the grandchild wrote {:.1} ms after the kill",
        ms_of(last - killed_ns)
    );
    retaken_after(&mut h, &run, gone_ns).await;
    // Killed outright, the agent had no chance to see a SIGTERM.
    assert!(effect(&effects(h.dir()), "term", "slow").is_none());
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
}

async fn stopped_relay(backend: Backend) {
    let (mut h, run) = slow_mid_turn(backend, None).await;
    let stopped = Instant::now();
    h.relay("r0").request_stop();
    let (took, gone_ns) = run.wait_gone(stopped, secs(10)).await;
    eprintln!("{backend:?} SIGTERM: group gone {took:?} after the relay was told to stop");
    assert!(
        took <= BOUND,
        "the agent's group outlived its stopping relay's notice by {took:?}"
    );
    let summary = h.relay("r0").wait_summary(secs(30));
    assert_eq!(summary.turns_started, 1, "{summary:?}");
    // The relay ended the turn gracefully: the agent saw SIGTERM first.
    let term = effect(&effects(h.dir()), "term", "slow")
        .cloned()
        .expect("the agent received SIGTERM");
    assert_eq!((term.task.as_str(), term.epoch), ("j1", run.epoch));
    assert!(run.last_tick_ns() <= gone_ns);
    retaken_after(&mut h, &run, gone_ns).await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
}

async fn lost_claim(backend: Backend) {
    let (mut h, run) = slow_mid_turn(backend, Some("info")).await;
    h.relay("r0").pause();
    // Frozen, r0 renews nothing: its lease lapses and quick re-takes the task. Its
    // agent is not frozen with it (nothing can stop it while r0 is): it runs on until
    // r0 resumes and learns the claim is lost.
    let dir = h.dir().to_path_buf();
    let quick_epoch = h
        .wait_for("quick to re-take j1", secs(30), |_| {
            effect(&effects(&dir), "start", "quick").map(|e| e.epoch)
        })
        .await;
    assert!(quick_epoch > run.epoch);
    let resumed = Instant::now();
    h.relay("r0").resume();
    let (took, gone_ns) = run.wait_gone(resumed, secs(10)).await;
    let term = effect(&effects(&dir), "term", "slow")
        .cloned()
        .expect("the relay ended its agent's turn with SIGTERM");
    let after_term = gone_ns - term.at_ns;
    let last = run.last_tick_ns();
    eprintln!(
        "{backend:?} lost claim: group gone {took:?} after SIGCONT, {:.1} ms after its \
         SIGTERM; last write {:.1} ms after the SIGTERM",
        ms_of(after_term),
        ms_of(last - term.at_ns)
    );
    // The relay notices at its first renewal after resuming.
    assert!(
        took <= secs(2),
        "the lost claim was acted on {took:?} after SIGCONT"
    );
    assert!(
        after_term <= BOUND.as_nanos() as i128,
        "the group ran {:.1} ms after its SIGTERM",
        ms_of(after_term)
    );
    assert!(last - term.at_ns <= BOUND.as_nanos() as i128);
    let ticks_then = run.tick_count();
    h.wait_until("quick completes j1", secs(30), |l| {
        l.task("j1").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let all = effects(&dir);
    assert!(effect(&all, "end", "slow").is_none(), "{all:?}");
    assert_eq!(run.tick_count(), ticks_then);

    // The loss is in r0's log at info, with the task, the agent and both epochs.
    let log = without_ansi(&h.relay("r0").log_tail(200));
    let fields: BTreeMap<&str, String> = [
        ("task", "\"j1\"".to_string()),
        ("agent", "\"slow\"".to_string()),
        ("epoch", run.epoch.to_string()),
        ("now_epoch", quick_epoch.to_string()),
    ]
    .into_iter()
    .collect();
    let line = log
        .lines()
        .find(|l| {
            l.contains("INFO")
                && (l.contains("claim lost at renewal") || l.contains("fenced append refused"))
                && l.contains("key=\"task/")
        })
        .unwrap_or_else(|| panic!("no info line about the lost task claim\n{log}"));
    for (k, v) in &fields {
        assert!(
            line.contains(&format!(" {k}={v}")),
            "{k}={v} missing: {line}"
        );
    }
}
