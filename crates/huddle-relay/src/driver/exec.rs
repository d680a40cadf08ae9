//! The exec driver: runs a command per turn. This is how any command-line agent
//! plugs in.
//!
//! - The prompt is the child's standard input: a file holding it (already unlinked),
//!   read to its end. It is written before the child starts, so once the child runs
//!   nothing it reads waits for the relay (plan 0029).
//! - Environment: `HUDDLE_ROOM`, `HUDDLE_THREAD` (empty when none), `HUDDLE_AGENT`,
//!   `HUDDLE_TASK` (empty when none), `HUDDLE_EPOCH` (empty when none),
//!   `HUDDLE_ATTEMPT`, `HUDDLE_EFFECT_KEY` (stable across the attempts of one task or
//!   message answer: the idempotency key for the agent's external effects),
//!   `HUDDLE_REVIEW` (`1` on a review turn, whose reply starts with `ACCEPT` or
//!   `REJECT`; `HUDDLE_TASK` names the task, `HUDDLE_ATTEMPT` is the round); when the
//!   agent is offered huddle's MCP tools, `HUDDLE_MCP` (a `sh` command line starting
//!   `huddle mcp` for this agent and room), `HUDDLE_DB`, `HUDDLE_RELAY_ID` and, when
//!   the relay signs, `HUDDLE_RELAY_KEY` ([`McpLaunch::env`]).
//! - Standard output is the reply (capped at `max_reply_bytes`).
//! - A line `huddle-tokens: N` on standard error reports the tokens used; without one
//!   the driver estimates a token per four bytes of prompt and reply.
//! - A line `huddle-progress: TEXT` on standard error is an interim progress note,
//!   written at once as a `turn.progress` row (never the reply; the reply is still the
//!   standard output when the command exits).
//! - A non-zero exit or the timeout is a failed turn; cancellation (claim lost,
//!   shutdown) ends it.
//! - The command leads a process group of its own ([`AgentProcess`]): whatever it
//!   starts is ended with it. However the turn ends, the group gets SIGTERM, then
//!   SIGKILL after `stop_grace_ms`, and the turn is over only when nothing of it runs;
//!   if the relay dies, the group is killed by the reaper.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::process::{input_file, started_too_late};
use super::{
    AgentProcess, Driver, McpLaunch, ProgressSink, TurnOutcome, TurnRequest, PROGRESS_PREFIX,
};

/// Settings of an exec agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSettings {
    /// Program and arguments (no shell).
    pub command: Vec<String>,
    /// Turn timeout in milliseconds (default 300,000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Largest reply kept, in bytes (default 64 KiB); longer output is cut.
    #[serde(default = "default_max_reply")]
    pub max_reply_bytes: usize,
    /// Working directory (default: the relay's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// How long the command's process group has between SIGTERM and SIGKILL when its
    /// turn ends early (cancelled, timed out) or it leaves processes behind, in
    /// milliseconds (default 2,000; 0 kills at once).
    #[serde(default = "default_stop_grace_ms")]
    pub stop_grace_ms: u64,
}

fn default_timeout_ms() -> u64 {
    300_000
}

fn default_stop_grace_ms() -> u64 {
    2_000
}

fn default_max_reply() -> usize {
    64 * 1024
}

impl ExecSettings {
    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        match self.command.first() {
            None => Err("command must name a program".into()),
            Some(p) if p.trim().is_empty() => Err("command must name a program".into()),
            _ if self.timeout_ms == 0 => Err("timeout_ms must be positive".into()),
            _ if self.max_reply_bytes == 0 => Err("max_reply_bytes must be positive".into()),
            _ => Ok(()),
        }
    }
}

/// Runs a command per turn.
#[derive(Clone, Debug)]
pub struct ExecDriver {
    settings: ExecSettings,
    mcp: Option<McpLaunch>,
    /// Test seam: called with the child's pid right after it started, on the relay's
    /// own thread (a test blocks it there, as a paused relay would be).
    #[cfg(test)]
    after_spawn: Option<fn(u32)>,
}

impl ExecDriver {
    /// An exec driver with `settings` (validated by the caller).
    pub fn new(settings: ExecSettings) -> Self {
        ExecDriver {
            settings,
            mcp: None,
            #[cfg(test)]
            after_spawn: None,
        }
    }

    /// Offers the agent huddle's MCP tools: each turn's process gets `HUDDLE_MCP`
    /// (the command that starts the server for the turn's room) and [`McpLaunch::env`].
    pub fn with_mcp(mut self, launch: McpLaunch) -> Self {
        self.mcp = Some(launch);
        self
    }
}

fn tokens_from_stderr(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("huddle-tokens:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Sends a `huddle-progress: TEXT` line of standard error to the progress sink.
fn progress_line(line: &[u8], sink: &ProgressSink) {
    let text = String::from_utf8_lossy(line);
    if let Some(note) = text.trim().strip_prefix(PROGRESS_PREFIX) {
        sink.note(note);
    }
}

fn cut(mut bytes: Vec<u8>, max: usize) -> String {
    if bytes.len() > max {
        bytes.truncate(max);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Where `program` would be run from: itself when it names a path (relative to `cwd`
/// when given), else the first executable of that name on `PATH`.
fn find_program(program: &str, cwd: Option<&str>) -> Option<std::path::PathBuf> {
    use std::path::Path;
    let executable = |p: &Path| {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        }
        #[cfg(not(unix))]
        {
            p.is_file()
        }
    };
    if program.contains('/') {
        let p = match cwd {
            Some(dir) => Path::new(dir).join(program),
            None => Path::new(program).to_path_buf(),
        };
        return executable(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

#[async_trait]
impl Driver for ExecDriver {
    async fn check(&self) -> Result<String, String> {
        let program = self
            .settings
            .command
            .first()
            .map(String::as_str)
            .unwrap_or("");
        match find_program(program, self.settings.cwd.as_deref()) {
            Some(p) => Ok(format!("exec {}", p.display())),
            None => Err(format!("exec: no executable {program:?}")),
        }
    }

    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome {
        let s = &self.settings;
        let Some((program, args)) = s.command.split_first() else {
            return TurnOutcome::failed("no command configured", 0);
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env("HUDDLE_ROOM", &request.room)
            .env("HUDDLE_THREAD", request.thread.as_deref().unwrap_or(""))
            .env("HUDDLE_AGENT", &request.agent)
            .env("HUDDLE_TASK", request.task.as_deref().unwrap_or(""))
            .env(
                "HUDDLE_EPOCH",
                request.epoch.map(|e| e.to_string()).unwrap_or_default(),
            )
            .env("HUDDLE_ATTEMPT", request.attempt.to_string())
            .env("HUDDLE_EFFECT_KEY", &request.effect_key)
            .env("HUDDLE_REVIEW", if request.review { "1" } else { "" })
            .env("HUDDLE_TRACE", &request.trace)
            .env_remove("HUDDLE_MCP")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &s.cwd {
            cmd.current_dir(dir);
        }
        if let Some(mcp) = &self.mcp {
            cmd.env(
                "HUDDLE_MCP",
                mcp.command_line(&request.room, &request.agent),
            )
            .envs(mcp.env());
        }
        let prompt = request.prompt.clone();
        match tokio::task::spawn_blocking(move || input_file(prompt.as_bytes())).await {
            Ok(Ok(file)) => {
                cmd.stdin(Stdio::from(file));
            }
            Ok(Err(e)) => return TurnOutcome::failed(format!("cannot hold the prompt: {e}"), 0),
            Err(e) => return TurnOutcome::failed(format!("cannot hold the prompt: {e}"), 0),
        }
        // The child checks the start deadline itself, between fork and exec.
        let mut process = match AgentProcess::spawn_by(cmd, request.start_by).await {
            Ok(p) => p,
            Err(e) if started_too_late(&e) => return TurnOutcome::NotStarted,
            Err(e) => return TurnOutcome::failed(format!("cannot start {program:?}: {e}"), 0),
        };
        #[cfg(test)]
        if let (Some(hook), Some(pid)) = (self.after_spawn, process.child().id()) {
            hook(pid);
        }
        let child = process.child();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let max = s.max_reply_bytes;
        let out_beat = request.progress.clone();
        let read_out = tokio::spawn(async move {
            let mut buf = Vec::new();
            if let Some(out) = stdout.as_mut() {
                // Keep at most `max` bytes but drain the rest so the child never blocks.
                let mut chunk = [0u8; 8192];
                while let Ok(n) = out.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    out_beat.beat();
                    if buf.len() < max {
                        buf.extend_from_slice(&chunk[..n.min(max - buf.len())]);
                    }
                }
            }
            buf
        });
        let progress = request.progress.clone();
        let read_err = tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut line: Vec<u8> = Vec::new();
            if let Some(err) = stderr.as_mut() {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = err.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    progress.beat();
                    for b in &chunk[..n] {
                        if *b == b'\n' {
                            progress_line(&line, &progress);
                            line.clear();
                        } else if line.len() < 8 * 1024 {
                            line.push(*b);
                        }
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > 64 * 1024 {
                        buf.drain(..buf.len() - 64 * 1024);
                    }
                }
            }
            progress_line(&line, &progress);
            buf
        });
        let timeout = Duration::from_millis(s.timeout_ms);
        let ended = tokio::select! {
            status = process.child().wait() => Ok(status),
            _ = tokio::time::sleep(timeout) => Err(TurnOutcome::failed(format!("timed out after {} ms", s.timeout_ms), 0)),
            _ = cancel.cancelled() => Err(TurnOutcome::Cancelled),
        };
        // However it ended, nothing the turn started may outlive it: end the group
        // (what a finished command left behind, or all of a cancelled one) and wait.
        let stopped = process.stop(Duration::from_millis(s.stop_grace_ms)).await;
        let status = match ended {
            Ok(waited) => waited.and(stopped),
            Err(outcome) => return outcome,
        };
        let out = read_out.await.unwrap_or_default();
        let err = read_err.await.unwrap_or_default();
        let reply = cut(out, max);
        let err_text = String::from_utf8_lossy(&err).into_owned();
        let tokens = tokens_from_stderr(&err_text)
            .unwrap_or(((request.prompt.len() + reply.len()) / 4) as u64);
        match status {
            Ok(st) if st.success() => TurnOutcome::replied(reply, tokens),
            Ok(st) => {
                let tail: String = err_text
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join(" | ");
                TurnOutcome::failed(format!("exited with {st}: {tail}"), tokens)
            }
            Err(e) => TurnOutcome::failed(format!("waiting for the child failed: {e}"), tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_os = "linux")]
    use crate::driver::process::tests::alive as runs;

    fn req() -> TurnRequest {
        TurnRequest {
            room: "lobby".into(),
            thread: None,
            agent: "ada".into(),
            task: Some("t7".into()),
            epoch: Some(huddle_core::ClaimEpoch(3)),
            attempt: 2,
            prompt: "<coordination>\n</coordination>\nhello".into(),
            effect_key: String::new(),
            trace: String::new(),
            review: false,
            progress: Default::default(),
            start_by: None,
        }
    }

    fn sh(script: &str, timeout_ms: u64) -> ExecDriver {
        ExecDriver::new(ExecSettings {
            command: vec!["sh".into(), "-c".into(), script.into()],
            timeout_ms,
            max_reply_bytes: 1024,
            cwd: None,
            stop_grace_ms: 2_000,
        })
    }

    #[tokio::test]
    async fn prompt_in_reply_out_with_environment() {
        let d = sh(
            "read first; echo \"$HUDDLE_AGENT/$HUDDLE_ROOM/$HUDDLE_TASK/$HUDDLE_EPOCH/$HUDDLE_ATTEMPT/$HUDDLE_EFFECT_KEY $first\"; echo 'huddle-tokens: 42' >&2",
            10_000,
        );
        let mut r = req();
        r.effect_key = "k7".into();
        let out = d.run(r, CancellationToken::new()).await;
        assert_eq!(
            out,
            TurnOutcome::replied("ada/lobby/t7/3/2/k7 <coordination>\n", 42)
        );
    }

    #[tokio::test]
    async fn progress_lines_on_stderr_are_notes_not_the_reply() {
        let d = sh(
            "cat >/dev/null; echo 'huddle-progress: reading' >&2; echo other >&2; \
             printf 'huddle-progress: half done' >&2; echo answer",
            5_000,
        );
        let (sink, mut rx) = ProgressSink::channel();
        let mut r = req();
        r.progress = sink;
        let out = d.run(r, CancellationToken::new()).await;
        assert!(
            matches!(&out, TurnOutcome::Replied { text, .. } if text == "answer\n"),
            "{out:?}"
        );
        let mut notes = Vec::new();
        while let Ok(n) = rx.try_recv() {
            notes.push(n);
        }
        assert_eq!(notes, vec!["reading", "half done"]);
    }

    #[tokio::test]
    async fn nonzero_exit_fails_with_stderr() {
        let out = sh("echo boom >&2; exit 3", 10_000)
            .run(req(), CancellationToken::new())
            .await;
        match out {
            TurnOutcome::Failed { reason, .. } => assert!(reason.contains("boom"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    /// A script that starts a grandchild, writes `leader grandchild` to a file and
    /// waits; the pids once the file is there.
    async fn started(dir: &std::path::Path) -> (u32, u32) {
        let file = dir.join("pids");
        for _ in 0..1000 {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let pids: Vec<u32> = text
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect();
                if pids.len() == 2 {
                    return (pids[0], pids[1]);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the script never wrote its pids");
    }

    fn with_grandchild(dir: &std::path::Path, timeout_ms: u64) -> ExecDriver {
        let file = dir.join("pids");
        sh(
            &format!(
                "sleep 30 & echo $$ $! > {f}.tmp; mv {f}.tmp {f}; wait",
                f = file.display()
            ),
            timeout_ms,
        )
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn timeout_and_cancel_end_the_whole_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = with_grandchild(dir.path(), 300)
            .run(req(), CancellationToken::new())
            .await;
        assert!(
            matches!(out, TurnOutcome::Failed { ref reason, .. } if reason.contains("timed out")),
            "{out:?}"
        );
        let (leader, grandchild) = started(dir.path()).await;
        assert!(
            !runs(leader) && !runs(grandchild),
            "the timed-out turn left processes"
        );

        std::fs::remove_file(dir.path().join("pids")).expect("rm");
        let cancel = CancellationToken::new();
        let d = with_grandchild(dir.path(), 60_000);
        let c2 = cancel.clone();
        let h = tokio::spawn(async move { d.run(req(), c2).await });
        let (leader, grandchild) = started(dir.path()).await;
        assert!(runs(leader) && runs(grandchild));
        cancel.cancel();
        let out = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .expect("cancel is prompt")
            .expect("join");
        assert_eq!(out, TurnOutcome::Cancelled);
        // The driver returns only once the group is gone.
        assert!(
            !runs(leader) && !runs(grandchild),
            "the cancelled turn left processes"
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_background_process_does_not_outlive_a_finished_turn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pids");
        // The background `sleep` keeps stdout open: without ending the group the turn
        // would not even finish reading the reply.
        let d = sh(
            &format!("sleep 30 & echo $$ $! > {}; echo done", file.display()),
            10_000,
        );
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            d.run(req(), CancellationToken::new()),
        )
        .await
        .expect("the turn ends when its command does");
        assert!(
            matches!(out, TurnOutcome::Replied { ref text, .. } if text == "done\n"),
            "{out:?}"
        );
        let (leader, grandchild) = started(dir.path()).await;
        assert!(!runs(leader) && !runs(grandchild));
    }

    /// The agent reads its whole prompt without the relay: a relay frozen right after
    /// the start (its runtime blocked here, as SIGSTOP would stop it) does not keep
    /// the agent waiting for its input, so the agent never starts work late on a
    /// prompt handed over after a pause. The prompt is larger than a pipe holds.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_agent_reads_its_whole_prompt_while_the_relay_is_frozen() {
        fn frozen(pid: u32) {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while runs(pid) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(
                !runs(pid),
                "the agent still waits for its prompt from a frozen relay"
            );
        }
        let mut d = sh("wc -c", 10_000);
        d.after_spawn = Some(frozen);
        let mut request = req();
        request.prompt = "x".repeat(300 * 1024);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        match rt.block_on(d.run(request, CancellationToken::new())) {
            TurnOutcome::Replied { text, .. } => assert_eq!(text.trim(), "307200"),
            other => panic!("{other:?}"),
        }
    }

    /// A turn past its start deadline never runs its command.
    #[tokio::test]
    async fn a_turn_past_its_start_deadline_never_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("ran");
        let d = sh(&format!("echo ran > {}", file.display()), 10_000);
        let mut request = req();
        request.start_by = Some(std::time::Instant::now() - Duration::from_millis(1));
        assert_eq!(
            d.run(request, CancellationToken::new()).await,
            TurnOutcome::NotStarted
        );
        assert!(!file.exists(), "the command ran");
    }

    #[tokio::test]
    async fn check_finds_the_program() {
        assert!(sh("true", 1000)
            .check()
            .await
            .is_ok_and(|s| s.contains("/sh")));
        let missing = ExecDriver::new(ExecSettings {
            command: vec!["no-such-agent-program".into()],
            timeout_ms: 1000,
            max_reply_bytes: 10,
            cwd: None,
            stop_grace_ms: 0,
        });
        let e = missing.check().await.unwrap_err();
        assert!(e.contains("no-such-agent-program"), "{e}");
    }

    #[tokio::test]
    async fn missing_program_is_a_failed_turn() {
        let d = ExecDriver::new(ExecSettings {
            command: vec!["/nonexistent/agent".into()],
            timeout_ms: 1000,
            max_reply_bytes: 10,
            cwd: None,
            stop_grace_ms: 2_000,
        });
        let out = d.run(req(), CancellationToken::new()).await;
        assert!(
            matches!(out, TurnOutcome::Failed { ref reason, .. } if reason.contains("cannot start"))
        );
    }

    #[tokio::test]
    async fn long_output_is_cut() {
        let out = sh("yes x | head -c 100000", 10_000)
            .run(req(), CancellationToken::new())
            .await;
        match out {
            TurnOutcome::Replied { text, .. } => assert_eq!(text.len(), 1024),
            other => panic!("{other:?}"),
        }
    }
}
