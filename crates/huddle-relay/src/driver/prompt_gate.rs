//! The start deadline for prompts to a long-lived agent process (plan 0029).
//!
//! An exec agent is a process per turn, so its child checks the turn's start deadline
//! between fork and exec. An ACP agent runs for the relay's life: a turn starts when
//! the relay writes `session/prompt` to its standard input. A check in the relay just
//! before that write would leave a window (a relay stopped between the check and the
//! `write` delivers the prompt when it resumes, after its lease may have lapsed), so
//! the prompt line is not written by the relay at all:
//!
//! - the relay puts the whole line in an unlinked temporary file, then
//! - starts `cat` through [`AgentProcess::spawn_by`] with the turn's deadline, the file
//!   as its input and the agent's standard input as its output. `cat`'s child checks
//!   the deadline between fork and exec, in a process the relay's pause does not
//!   stop; past it, `cat` never runs and the agent never sees the prompt.
//!
//! Every other line (initialisation, sessions, permission answers, cancellations)
//! is written by the relay directly. Lines are written one at a time, in order, so
//! a prompt being copied by `cat` is never interleaved with another line.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, Stream};
use tokio::sync::oneshot;
use tracing::debug;

use super::process::{input_file, started_too_late};
use super::AgentProcess;

/// What the writer says of a gated prompt: written (`Ok(true)`), refused as late
/// (`Ok(false)`: nothing reached the agent), or not deliverable (`Err`).
pub(super) type Delivery = Result<bool, String>;

/// Prompts waiting to be written under a start deadline, by session id.
#[derive(Default)]
pub(super) struct PromptGate {
    pending: StdMutex<HashMap<String, (Instant, oneshot::Sender<Delivery>)>>,
}

impl PromptGate {
    /// The next `session/prompt` line for `session` is written only if that happens
    /// before `by`; the answer says whether it was.
    pub(super) fn expect(&self, session: &str, by: Instant) -> oneshot::Receiver<Delivery> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(session.to_string(), (by, tx));
        rx
    }

    /// Forgets what [`PromptGate::expect`] registered for `session`, if it is still
    /// there (the turn ended before its prompt was written).
    pub(super) fn forget(&self, session: &str) {
        self.lock().remove(session);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, oneshot::Sender<Delivery>)>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deadline registered for `line`, when it is a `session/prompt` request of a
    /// session that has one.
    fn take(&self, line: &str) -> Option<(Instant, oneshot::Sender<Delivery>)> {
        if !line.contains("session/prompt") {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("method").and_then(|m| m.as_str()) != Some("session/prompt") {
            return None;
        }
        let session = v.get("params")?.get("sessionId")?.as_str()?;
        self.lock().remove(session)
    }
}

/// The outgoing side of an ACP connection over `stdin` (the agent's standard input,
/// blocking): a sink of lines for the connection, and the task that writes them.
pub(super) fn outgoing(
    stdin: io::PipeWriter,
    gate: Arc<PromptGate>,
) -> impl futures::Sink<String, Error = io::Error> + Send + 'static {
    let (tx, mut rx) = futures::channel::mpsc::unbounded::<String>();
    tokio::spawn(async move {
        use futures::StreamExt as _;
        let stdin = Arc::new(stdin);
        while let Some(line) = rx.next().await {
            let result = match gate.take(&line) {
                None => write_line(&stdin, line).await,
                Some((by, answer)) => {
                    let delivered = write_gated(&stdin, line, by).await;
                    let failed = delivered.as_ref().err().map(|e| e.to_string());
                    let _ = answer.send(delivered.map_err(|e| e.to_string()));
                    match failed {
                        Some(e) => Err(io::Error::other(e)),
                        None => Ok(()),
                    }
                }
            };
            if let Err(e) = result {
                debug!(error = %e, "writing to the ACP agent failed; the connection ends");
                break;
            }
        }
    });
    tx.sink_map_err(io::Error::other)
}

/// The incoming side: the agent's standard output, line by line.
pub(super) fn incoming(
    stdout: tokio::process::ChildStdout,
) -> impl Stream<Item = io::Result<String>> + Send + 'static {
    use futures::AsyncBufReadExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;
    Box::pin(futures::io::BufReader::new(stdout.compat()).lines())
}

async fn write_line(stdin: &Arc<io::PipeWriter>, mut line: String) -> io::Result<()> {
    let stdin = stdin.clone();
    line.push('\n');
    tokio::task::spawn_blocking(move || (&*stdin).write_all(line.as_bytes()))
        .await
        .map_err(io::Error::other)?
}

/// Writes `line` through a `cat` started before `by`: `Ok(false)` when it was too late
/// (nothing written).
async fn write_gated(stdin: &io::PipeWriter, mut line: String, by: Instant) -> io::Result<bool> {
    line.push('\n');
    // The whole prompt is on the kernel's side before the deadline is checked: once
    // `cat` runs, nothing of it waits for the relay.
    let file = tokio::task::spawn_blocking(move || input_file(line.as_bytes()))
        .await
        .map_err(io::Error::other)??;
    let mut cmd = tokio::process::Command::new("cat");
    cmd.stdin(std::process::Stdio::from(file))
        .stdout(std::process::Stdio::from(stdin.try_clone()?))
        .stderr(std::process::Stdio::null());
    let mut cat = match AgentProcess::spawn_by(cmd, Some(by)).await {
        Ok(p) => p,
        Err(e) if started_too_late(&e) => return Ok(false),
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot start cat: {e}"))),
    };
    let status = cat.child().wait().await;
    let _ = cat.stop(Duration::from_millis(100)).await;
    match status? {
        s if s.success() => Ok(true),
        s => Err(io::Error::other(format!("cat exited with {s}"))),
    }
}
