//! Drivers: how a relay runs one agent turn.
//!
//! A driver gets a [`TurnRequest`] (the prompt and where it belongs) and a
//! cancellation token, and returns a [`TurnOutcome`]. The relay cancels the token when
//! the turn's claim is lost or the relay shuts down; a driver must then stop promptly
//! (the exec driver ends its child's whole process group).
//!
//! A driver that starts processes starts them through [`AgentProcess`], which ties
//! them to the turn and to the relay's life (plan 0013).
//!
//! Every request carries a start deadline ([`TurnRequest::start_by`]): the moment
//! after which the relay can no longer vouch for the turn's claims. A driver starts
//! nothing after it and answers [`TurnOutcome::NotStarted`] instead (plan 0029); the
//! exec driver has the agent's child process check it between fork and exec.

pub mod acp;
mod exec;
mod mcp;
pub mod process;
mod prompt_gate;
mod sim;

pub use acp::{AcpDriver, AcpPreset, AcpSettings, PermissionPolicy};
pub use exec::{ExecDriver, ExecSettings};
pub use mcp::McpLaunch;
pub use process::AgentProcess;

/// The line prefix on an exec agent's standard error that posts a progress note.
pub const PROGRESS_PREFIX: &str = "huddle-progress:";
pub use sim::{SimDriver, SimSettings};

use std::time::Instant;

use async_trait::async_trait;
use huddle_core::protocol::TurnActivity;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// One agent turn to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRequest {
    /// Room.
    pub room: String,
    /// Thread, if any.
    pub thread: Option<String>,
    /// The agent's key.
    pub agent: String,
    /// The task this turn works on, if any.
    pub task: Option<String>,
    /// The epoch of the claim the turn runs under.
    pub epoch: Option<huddle_core::ClaimEpoch>,
    /// Attempt number of the task (1 for the first).
    pub attempt: u32,
    /// The full prompt: the `<coordination>` block, the `<related-context>` block when
    /// there is one, then the message or task.
    pub prompt: String,
    /// The turn's effect key (`HUDDLE_EFFECT_KEY`): the same for every attempt of its
    /// task (or every attempt of this agent's answer to its message), different for
    /// every other; agents pass it to external systems to make effects idempotent.
    #[serde(default)]
    pub effect_key: String,
    /// The turn's trace (`HUDDLE_TRACE`): the id of the owner command or first message
    /// its work comes from, as `huddle trace ROOM ID` takes it; empty when unknown.
    #[serde(default)]
    pub trace: String,
    /// Whether the turn reviews a task's submission (`HUDDLE_REVIEW=1`): its reply
    /// starts with `ACCEPT` or `REJECT` (then the feedback); `task` names the task and
    /// `attempt` is the review round.
    #[serde(default)]
    pub review: bool,
    /// Where the driver sends the turn's interim progress notes (not its reply); the
    /// relay writes each as a `turn.progress` row under the turn's claims.
    #[serde(skip)]
    pub progress: ProgressSink,
    /// The latest moment (this process's monotonic clock) at which the agent may start
    /// working on the turn: well inside the lease of every claim the turn runs under,
    /// measured from before the relay last confirmed them. `None`: no deadline.
    #[serde(skip)]
    pub start_by: Option<Instant>,
}

/// Where a driver sends a running turn's progress notes and its activity beats (any
/// sign of life: output, a session update), which the relay's stall watchdog reads
/// (`stall-timeout`). Cloning shares it; the default sink drops every note and beat
/// (a turn nobody records progress for).
#[derive(Clone, Default)]
pub struct ProgressSink(
    Option<tokio::sync::mpsc::UnboundedSender<String>>,
    Option<std::sync::Arc<std::sync::Mutex<Instant>>>,
);

impl ProgressSink {
    /// A sink and the receiving end the relay writes notes from.
    pub fn channel() -> (ProgressSink, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let beat = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
        (ProgressSink(Some(tx), Some(beat)), rx)
    }

    /// Records that the agent showed activity now (output, an update, a note).
    pub fn beat(&self) {
        if let Some(b) = &self.1 {
            if let Ok(mut at) = b.lock() {
                *at = Instant::now();
            }
        }
    }

    /// How long since the last beat (or since the sink was made). `None` for a sink
    /// that records none.
    pub fn idle_for(&self) -> Option<std::time::Duration> {
        let b = self.1.as_ref()?;
        let at = *b.lock().ok()?;
        Some(at.elapsed())
    }

    /// Sends one note (blank notes are dropped). Returns whether anyone receives it.
    pub fn note(&self, text: &str) -> bool {
        self.beat();
        let text = text.trim();
        match &self.0 {
            Some(tx) if !text.is_empty() => tx.send(text.to_string()).is_ok(),
            _ => false,
        }
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProgressSink(open)"
        } else {
            "ProgressSink(none)"
        })
    }
}

/// Sinks are not part of what a request is: every two compare equal.
impl PartialEq for ProgressSink {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ProgressSink {}

impl TurnRequest {
    /// Whether the start deadline has passed: a driver then starts nothing.
    pub fn too_late(&self) -> bool {
        self.start_by.is_some_and(|by| Instant::now() >= by)
    }

    /// A stable identity for deterministic simulation: what the turn is about.
    pub fn subject(&self) -> String {
        match &self.task {
            Some(t) => format!("task:{}:{t}:{}", self.room, self.attempt),
            None => format!("msg:{}:{}", self.room, self.prompt.len()),
        }
    }
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TurnOutcome {
    /// The agent replied.
    Replied {
        /// The reply text.
        text: String,
        /// Tokens the turn used.
        tokens: u64,
        /// What the agent did (tool calls, plan, permissions), when the driver sees it.
        activity: TurnActivity,
    },
    /// The turn failed (non-zero exit, timeout, simulated failure).
    Failed {
        /// Why.
        reason: String,
        /// Tokens used before failing.
        tokens: u64,
        /// What the agent did before it failed, when the driver sees it.
        activity: TurnActivity,
    },
    /// The turn was cancelled (claim lost, shutdown). Never completes a task.
    Cancelled,
    /// Nothing ran: the start deadline ([`TurnRequest::start_by`]) had passed before
    /// the agent could start (the relay was paused or starved after it last confirmed
    /// the claims). The claims are released and the work is offered again.
    NotStarted,
}

impl TurnOutcome {
    /// A reply, from a driver that sees nothing of what the agent did.
    pub fn replied(text: impl Into<String>, tokens: u64) -> Self {
        TurnOutcome::Replied {
            text: text.into(),
            tokens,
            activity: TurnActivity::default(),
        }
    }

    /// A failure, from a driver that sees nothing of what the agent did.
    pub fn failed(reason: impl Into<String>, tokens: u64) -> Self {
        TurnOutcome::Failed {
            reason: reason.into(),
            tokens,
            activity: TurnActivity::default(),
        }
    }
}

/// Runs agent turns.
#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// Runs one turn until it ends or `cancel` fires.
    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome;

    /// Whether the driver can run turns, for `huddle relay --check`: what it found on
    /// success, what is wrong otherwise. Drivers with nothing to check are ready.
    async fn check(&self) -> Result<String, String> {
        Ok("ready".into())
    }
}

/// A small deterministic generator (SplitMix64) for the simulator: the same seed and
/// subject always give the same turn.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeds from a number and any text (agent key, subject).
    pub fn new(seed: u64, salt: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
        for b in salt.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        SplitMix64(h)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
