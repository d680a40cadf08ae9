//! The ACP driver: drives an agent that speaks the Agent Client Protocol (JSON-RPC over
//! its standard streams) through the `agent-client-protocol` crate's client side
//! (plan 0019).
//!
//! - **One long-lived process per hosted agent**, started when the driver starts
//!   (relay start), through [`AgentProcess`] so it dies with the relay. It is sent
//!   `initialize` (protocol version 1; the negotiated version and the agent's
//!   capabilities are logged); a command that cannot start or initialise fails
//!   [`AcpDriver::start`]. When the process exits it is restarted with back-off.
//!   Its standard error goes to the relay's log, line by line.
//! - **One ACP session per room thread**, created with `session/new` in the configured
//!   `cwd` and reused across turns. Sessions outlive the process that made them only
//!   through `session/load`: after an agent restart (or a relay restart, the session
//!   ids being kept in `sessions_file`) a thread's session is loaded when the agent
//!   supports it; otherwise a new one is made and the prompt says so.
//! - **A turn is `session/prompt`** with the relay's prompt; agent message chunks of
//!   `session/update` are assembled into the reply, tool calls are logged, and the
//!   token usage the agent reports for the turn is recorded (an estimate otherwise).
//!   The prompt reaches the agent only before the turn's start deadline: the line is
//!   copied to the agent by a `cat` whose child checks the deadline between fork and
//!   exec (`prompt_gate`); a late prompt is never delivered and the turn reports
//!   [`TurnOutcome::NotStarted`].
//! - **Cancellation** (claim lost, shutdown) and the turn timeout send
//!   `session/cancel` and wait up to `cancel_grace_ms` for the prompt to end; an agent
//!   that does not end it is restarted, so no later turn finds its session busy.
//! - **Permissions** (`session/request_permission`) are answered at once by the
//!   configured policy, and every answer is logged. The client advertises neither
//!   file-system nor terminal capabilities.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, EnvVariable, Implementation, InitializeRequest,
    InitializeResponse, LoadSessionRequest, McpServer, McpServerStdio, NewSessionRequest,
    PermissionOptionKind, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionId,
    SessionNotification, SessionUpdate, StopReason, TextContent, ToolKind,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Lines};
use async_trait::async_trait;
use huddle_core::protocol::TurnActivity;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, watch, Mutex};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, info, warn};

use super::prompt_gate::{self, PromptGate};
use super::{AgentProcess, Driver, McpLaunch, TurnOutcome, TurnRequest};

/// The ACP agents huddle knows the commands of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcpPreset {
    /// Claude Code through its ACP adapter (`claude-code-acp`).
    ClaudeCode,
    /// Codex through its ACP adapter (`codex-acp`).
    Codex,
    /// Gemini CLI in ACP mode (`gemini --experimental-acp`).
    Gemini,
}

impl AcpPreset {
    /// The command the preset runs.
    pub fn command(self) -> Vec<String> {
        let words: &[&str] = match self {
            AcpPreset::ClaudeCode => &["claude-code-acp"],
            AcpPreset::Codex => &["codex-acp"],
            AcpPreset::Gemini => &["gemini", "--experimental-acp"],
        };
        words.iter().map(|w| w.to_string()).collect()
    }
}

/// The tool kinds an agent may name in a permission request.
pub const TOOL_KINDS: &[&str] = &[
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
];

/// The kinds `read-only` allows.
const READ_ONLY_KINDS: &[&str] = &["read", "search", "think"];

/// How `session/request_permission` is answered: `"read-only"` (reading, searching
/// and thinking allowed, the rest rejected), `"allow-all"`, `"deny"`, or a list of the
/// tool kinds to allow (from [`TOOL_KINDS`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PermissionPolicy {
    /// A named policy.
    Named(String),
    /// The tool kinds allowed.
    Kinds(Vec<String>),
}

impl Default for PermissionPolicy {
    fn default() -> Self {
        PermissionPolicy::Named("read-only".into())
    }
}

/// What the policy says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allow the tool call.
    Allow,
    /// Reject it.
    Reject,
}

impl PermissionPolicy {
    /// Checks the policy; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            PermissionPolicy::Named(n) if ["read-only", "allow-all", "deny"].contains(&n.as_str()) => {
                Ok(())
            }
            PermissionPolicy::Named(n) => Err(format!(
                "{n:?} is not a permission policy: use \"read-only\", \"allow-all\", \"deny\" or a list of tool kinds"
            )),
            PermissionPolicy::Kinds(kinds) => match kinds.iter().find(|k| !TOOL_KINDS.contains(&k.as_str())) {
                Some(k) => Err(format!(
                    "{k:?} is not a tool kind (one of {})",
                    TOOL_KINDS.join(", ")
                )),
                None => Ok(()),
            },
        }
    }

    /// The decision for a tool of `kind` (snake_case, `other` when unknown).
    pub fn decide(&self, kind: &str) -> Decision {
        let allowed = match self {
            PermissionPolicy::Named(n) if n == "allow-all" => true,
            PermissionPolicy::Named(n) if n == "read-only" => READ_ONLY_KINDS.contains(&kind),
            PermissionPolicy::Named(_) => false,
            PermissionPolicy::Kinds(kinds) => kinds.iter().any(|k| k == kind),
        };
        if allowed {
            Decision::Allow
        } else {
            Decision::Reject
        }
    }
}

/// Settings of an ACP agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpSettings {
    /// A known agent whose command is used when `command` is not given.
    #[serde(default)]
    pub preset: Option<AcpPreset>,
    /// Program and arguments (no shell); overrides the preset's.
    #[serde(default)]
    pub command: Vec<String>,
    /// The agent's working directory and its sessions' `cwd` (default: the relay's;
    /// created when missing).
    #[serde(default)]
    pub cwd: Option<String>,
    /// How permission requests are answered (default `"read-only"`).
    #[serde(default)]
    pub permissions: PermissionPolicy,
    /// Longest turn, in milliseconds (default 600,000).
    #[serde(default = "default_turn_timeout_ms")]
    pub turn_timeout_ms: u64,
    /// How long a cancelled turn waits for the agent to end its prompt, in
    /// milliseconds (default 5,000); an agent that does not is restarted.
    #[serde(default = "default_cancel_grace_ms")]
    pub cancel_grace_ms: u64,
    /// How long `initialize` may take, in milliseconds (default 30,000).
    #[serde(default = "default_init_timeout_ms")]
    pub init_timeout_ms: u64,
    /// Grace between SIGTERM and SIGKILL when the agent's process group is stopped, in
    /// milliseconds (default 2,000).
    #[serde(default = "default_stop_grace_ms")]
    pub stop_grace_ms: u64,
    /// Where the session ids of the agent's threads are kept across relay restarts
    /// (default `<cwd>/.huddle/acp-sessions-<agent>.json`).
    #[serde(default)]
    pub sessions_file: Option<String>,
}

fn default_turn_timeout_ms() -> u64 {
    600_000
}
fn default_cancel_grace_ms() -> u64 {
    5_000
}
fn default_init_timeout_ms() -> u64 {
    30_000
}
fn default_stop_grace_ms() -> u64 {
    2_000
}

impl AcpSettings {
    /// Settings running `command` with every other field at its default.
    pub fn with_command(command: Vec<String>) -> Self {
        AcpSettings {
            preset: None,
            command,
            cwd: None,
            permissions: PermissionPolicy::default(),
            turn_timeout_ms: default_turn_timeout_ms(),
            cancel_grace_ms: default_cancel_grace_ms(),
            init_timeout_ms: default_init_timeout_ms(),
            stop_grace_ms: default_stop_grace_ms(),
            sessions_file: None,
        }
    }

    /// The command run: `command` when given, else the preset's.
    pub fn resolved_command(&self) -> Vec<String> {
        if self.command.is_empty() {
            self.preset.map(AcpPreset::command).unwrap_or_default()
        } else {
            self.command.clone()
        }
    }

    /// Checks the settings; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.command.is_empty() && self.preset.is_none() {
            return Err("command or preset must be given".into());
        }
        if self
            .resolved_command()
            .first()
            .is_none_or(|p| p.trim().is_empty())
        {
            return Err("command must name a program".into());
        }
        if self.cwd.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err("cwd must not be empty".into());
        }
        self.permissions
            .validate()
            .map_err(|e| format!("permissions: {e}"))?;
        for (name, v) in [
            ("turn_timeout_ms", self.turn_timeout_ms),
            ("cancel_grace_ms", self.cancel_grace_ms),
            ("init_timeout_ms", self.init_timeout_ms),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        Ok(())
    }
}

/// First and longest wait before an exited agent is started again.
const RESTART_FIRST: Duration = Duration::from_millis(200);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// An agent that ran this long before exiting is restarted after the first wait again.
const RESTART_STABLE: Duration = Duration::from_secs(60);

/// Said at the start of a prompt to a thread whose earlier session could not be
/// loaded into the agent.
pub const NEW_SESSION_NOTE: &str = "<session-note>The agent was restarted and could not resume this thread's session: this is a new session, and earlier turns of the thread are not in it.</session-note>\n";

/// A connection to a running, initialised agent process.
#[derive(Clone)]
struct Live {
    cx: ConnectionTo<Agent>,
    /// Which process this is (1 for the first).
    generation: u64,
    load_session: bool,
    /// Cancelled to have the process stopped and restarted.
    restart: CancellationToken,
    /// Prompts written only before their turn's start deadline.
    gate: Arc<PromptGate>,
}

/// One thread's session.
#[derive(Default)]
struct Slot {
    id: Option<SessionId>,
    /// The process generation the session lives in (0: from an earlier relay).
    generation: u64,
}

struct Inner {
    agent: String,
    settings: AcpSettings,
    command: Vec<String>,
    cwd: PathBuf,
    sessions_file: PathBuf,
    live: watch::Sender<Option<Live>>,
    /// Where each session's updates go while a turn runs in it.
    routes: StdMutex<HashMap<SessionId, mpsc::UnboundedSender<Routed>>>,
    sessions: Mutex<BTreeMap<String, Arc<Mutex<Slot>>>>,
    stop: CancellationToken,
    /// What `initialize` negotiated, for `--check`.
    negotiated: StdMutex<String>,
    /// huddle's MCP server, offered to every session.
    mcp: Option<McpLaunch>,
}

/// Drives an ACP agent: see the module documentation.
pub struct AcpDriver {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

impl std::fmt::Debug for AcpDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpDriver")
            .field("agent", &self.inner.agent)
            .field("command", &self.inner.command)
            .finish()
    }
}

impl AcpDriver {
    /// Starts agent `agent`'s process and initialises it; fails when the command
    /// cannot be started or does not initialise. The process is restarted whenever it
    /// exits, until the driver is dropped.
    pub async fn start(agent: &str, settings: AcpSettings) -> Result<AcpDriver, String> {
        Self::start_offering(agent, settings, None).await
    }

    /// [`AcpDriver::start`], offering every session huddle's MCP server for the agent
    /// in the session's room (`mcpServers` of `session/new` and `session/load`), so the
    /// driven agent can also act: claim, post, vote.
    pub async fn start_offering(
        agent: &str,
        settings: AcpSettings,
        mcp: Option<McpLaunch>,
    ) -> Result<AcpDriver, String> {
        settings.validate()?;
        let command = settings.resolved_command();
        let cwd = match &settings.cwd {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create cwd {dir:?}: {e}"))?;
                std::fs::canonicalize(dir).map_err(|e| format!("cwd {dir:?}: {e}"))?
            }
            None => std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?,
        };
        let sessions_file = match &settings.sessions_file {
            Some(f) => PathBuf::from(f),
            None => cwd
                .join(".huddle")
                .join(format!("acp-sessions-{agent}.json")),
        };
        let (live, _) = watch::channel(None);
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            agent: agent.to_string(),
            settings,
            command,
            cwd,
            sessions: Mutex::new(load_sessions(&sessions_file)),
            sessions_file,
            live,
            routes: StdMutex::new(HashMap::new()),
            stop: stop.clone(),
            negotiated: StdMutex::new(String::new()),
            mcp,
        });
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(inner.clone().supervise(first_tx));
        let guard = stop.drop_guard();
        match first_rx.await {
            Ok(Ok(())) => Ok(AcpDriver {
                inner,
                _stop: guard,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the agent's supervisor ended before the agent started".into()),
        }
    }
}

/// Session ids kept by an earlier relay, keyed by thread; a missing or unreadable
/// file is no sessions.
fn load_sessions(file: &Path) -> BTreeMap<String, Arc<Mutex<Slot>>> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<BTreeMap<String, String>>(&text) {
        Ok(map) => map
            .into_iter()
            .map(|(thread, id)| {
                let slot = Slot {
                    id: Some(SessionId::new(id)),
                    generation: 0,
                };
                (thread, Arc::new(Mutex::new(slot)))
            })
            .collect(),
        Err(e) => {
            warn!(file = %file.display(), error = %e, "ignoring an unreadable ACP sessions file");
            BTreeMap::new()
        }
    }
}

/// The text of a content block, if it has text.
fn text_of(block: &ContentBlock) -> Option<&str> {
    match block {
        ContentBlock::Text(t) => Some(&t.text),
        _ => None,
    }
}

/// The snake_case name of a tool kind.
fn kind_name(kind: Option<ToolKind>) -> String {
    kind.and_then(|k| serde_json::to_value(k).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "other".into())
}

/// The answer to a permission request under `policy`: the narrowest option of the
/// decided kind, or a cancelled outcome when the agent offered none.
pub fn answer_permission(
    policy: &PermissionPolicy,
    request: &RequestPermissionRequest,
) -> (RequestPermissionOutcome, String) {
    let kind = kind_name(request.tool_call.fields.kind);
    let wanted: &[PermissionOptionKind] = match policy.decide(&kind) {
        Decision::Allow => &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ],
        Decision::Reject => &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ],
    };
    let chosen = wanted.iter().find_map(|w| {
        request
            .options
            .iter()
            .find(|o| o.kind == *w)
            .map(|o| o.option_id.clone())
    });
    match chosen {
        Some(id) => {
            let what = format!("{id}");
            (
                RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
                what,
            )
        }
        None => (RequestPermissionOutcome::Cancelled, "cancelled".into()),
    }
}

impl Inner {
    /// Runs the agent process, restarting it with back-off, until `stop`. The first
    /// start's result goes to `first`; if it fails, supervision ends there.
    async fn supervise(self: Arc<Self>, first: tokio::sync::oneshot::Sender<Result<(), String>>) {
        let mut first = Some(first);
        let mut delay = RESTART_FIRST;
        let mut generation = 0;
        while !self.stop.is_cancelled() {
            generation += 1;
            let started = Instant::now();
            let result = self.run_process(generation, &mut first).await;
            if let Some(tx) = first.take() {
                let _ = tx.send(result.map(|_| ()));
                // The first start failed: the driver is not built.
                return;
            }
            if self.stop.is_cancelled() {
                break;
            }
            if started.elapsed() > RESTART_STABLE {
                delay = RESTART_FIRST;
            }
            match result {
                Ok(()) => {
                    warn!(agent = %self.agent, restart_in_ms = delay.as_millis() as u64, "ACP agent process ended; restarting it")
                }
                Err(e) => {
                    warn!(agent = %self.agent, error = %e, restart_in_ms = delay.as_millis() as u64, "ACP agent failed to start; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.stop.cancelled() => break,
            }
            delay = (delay * 2).min(RESTART_MAX);
        }
    }

    /// One process: start, initialise, publish, wait until it ends (or must be
    /// restarted, or the driver stops), stop its group.
    async fn run_process(
        self: &Arc<Self>,
        generation: u64,
        first: &mut Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), String> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| "no command configured".to_string())?;
        // The agent's standard input is a plain (blocking) pipe, so that a prompt's
        // `cat` can write to it too (see `prompt_gate`).
        let (agent_in, stdin) =
            std::io::pipe().map_err(|e| format!("cannot make a pipe for {program:?}: {e}"))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&self.cwd)
            .env("HUDDLE_AGENT", &self.agent)
            .stdin(Stdio::from(agent_in))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = AgentProcess::spawn(cmd)
            .await
            .map_err(|e| format!("cannot start {program:?}: {e}"))?;
        let pid = process.child().id();
        let (Some(stdout), Some(stderr)) =
            (process.child().stdout.take(), process.child().stderr.take())
        else {
            return Err("the agent's standard streams are not available".into());
        };
        let agent = self.agent.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(target: "huddle_relay::acp::stderr", agent = %agent, "{line}");
            }
        });
        let grace = Duration::from_millis(self.settings.stop_grace_ms);
        let gate = Arc::new(PromptGate::default());
        let transport = Lines::new(
            prompt_gate::outgoing(stdin, gate.clone()),
            prompt_gate::incoming(stdout),
        );
        let (cx_tx, cx_rx) = tokio::sync::oneshot::channel();
        let done = CancellationToken::new();
        let done_inside = done.clone();
        let routes = self.clone();
        let permissions = self.clone();
        let connection = Client
            .v1()
            .name("huddle")
            .on_receive_notification(
                async move |n: SessionNotification, _cx| {
                    routes.route(n);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest,
                            responder: Responder<RequestPermissionResponse>,
                            _cx| {
                    let (outcome, chosen) =
                        answer_permission(&permissions.settings.permissions, &request);
                    let tool = request.tool_call.fields.title.as_deref().unwrap_or("");
                    let kind = kind_name(request.tool_call.fields.kind);
                    info!(
                        agent = %permissions.agent,
                        session = %request.session_id,
                        tool,
                        kind = %kind,
                        answer = %chosen,
                        "permission request answered"
                    );
                    permissions.send_route(
                        &request.session_id,
                        Routed::Permission {
                            tool: tool.to_string(),
                            kind,
                            answer: chosen,
                        },
                    );
                    responder.respond(RequestPermissionResponse::new(outcome))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                let _ = cx_tx.send(cx.clone());
                tokio::select! {
                    _ = cx.incoming_closed() => {}
                    _ = done_inside.cancelled() => {}
                }
                Ok(())
            });
        let connection = tokio::spawn(connection);
        let ended = |why: String| async move { why };
        let init = async {
            let cx = cx_rx
                .await
                .map_err(|_| "the connection ended at once".to_string())?;
            let request = InitializeRequest::new(ProtocolVersion::V1)
                .client_info(Implementation::new("huddle", env!("CARGO_PKG_VERSION")));
            let response = tokio::time::timeout(
                Duration::from_millis(self.settings.init_timeout_ms),
                cx.send_request(request).block_task(),
            )
            .await
            .map_err(|_| {
                format!(
                    "initialize got no answer in {} ms",
                    self.settings.init_timeout_ms
                )
            })?
            .map_err(|e| format!("initialize failed: {e}"))?;
            Ok::<_, String>((cx, response))
        };
        let init = tokio::select! {
            r = init => r,
            status = process.child().wait() => Err(ended(format!("exited during initialize ({})", status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()))).await),
            _ = self.stop.cancelled() => Err("stopped".to_string()),
        };
        let (cx, response) = match init {
            Ok(ok) => ok,
            Err(e) => {
                done.cancel();
                let _ = process.stop(grace).await;
                connection.abort();
                return Err(format!("{:?}: {e}", self.command.join(" ")));
            }
        };
        if let Err(e) = self.accept(&response, pid, generation) {
            done.cancel();
            let _ = process.stop(grace).await;
            connection.abort();
            return Err(format!("{:?}: {e}", self.command.join(" ")));
        }
        let restart = CancellationToken::new();
        self.live.send_replace(Some(Live {
            cx,
            generation,
            load_session: response.agent_capabilities.load_session,
            restart: restart.clone(),
            gate,
        }));
        if let Some(tx) = first.take() {
            let _ = tx.send(Ok(()));
        }
        let mut connection = connection;
        tokio::select! {
            status = process.child().wait() => {
                warn!(agent = %self.agent, pid, status = %status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()), "ACP agent process exited");
            }
            _ = &mut connection => {
                warn!(agent = %self.agent, pid, "ACP connection to the agent ended");
            }
            _ = restart.cancelled() => {
                warn!(agent = %self.agent, pid, "restarting the ACP agent: it did not end a cancelled prompt");
            }
            _ = self.stop.cancelled() => {
                debug!(agent = %self.agent, pid, "stopping the ACP agent");
            }
        }
        self.live.send_replace(None);
        done.cancel();
        let _ = process.stop(grace).await;
        connection.abort();
        Ok(())
    }

    /// Checks and logs what `initialize` negotiated.
    fn accept(
        &self,
        response: &InitializeResponse,
        pid: Option<u32>,
        generation: u64,
    ) -> Result<(), String> {
        if response.protocol_version != ProtocolVersion::V1 {
            return Err(format!(
                "the agent speaks ACP protocol version {}; huddle speaks version 1",
                response.protocol_version
            ));
        }
        let caps = &response.agent_capabilities;
        let name = response
            .agent_info
            .as_ref()
            .map(|i| format!("{} {}", i.name, i.version))
            .unwrap_or_else(|| "an unnamed agent".into());
        let summary = format!(
            "{name}, ACP protocol {}, load_session={}, image={}, audio={}, embedded_context={}, mcp_http={}, mcp_sse={}",
            response.protocol_version,
            caps.load_session,
            caps.prompt_capabilities.image,
            caps.prompt_capabilities.audio,
            caps.prompt_capabilities.embedded_context,
            caps.mcp_capabilities.http,
            caps.mcp_capabilities.sse,
        );
        info!(agent = %self.agent, pid, generation, "ACP agent initialised: {summary}");
        if let Ok(mut n) = self.negotiated.lock() {
            *n = summary;
        }
        Ok(())
    }

    fn route(&self, n: SessionNotification) {
        self.send_route(&n.session_id, Routed::Update(Box::new(n.update)));
    }

    /// Hands what the agent sent or was answered in `session` to the turn running in it.
    fn send_route(&self, session: &SessionId, routed: Routed) {
        let routes = match self.routes.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        match routes.get(session) {
            Some(tx) => {
                let _ = tx.send(routed);
            }
            None => {
                debug!(agent = %self.agent, session = %session, "session update outside a turn")
            }
        }
    }

    /// The live connection, once there is one.
    async fn wait_live(&self) -> Live {
        let mut rx = self.live.subscribe();
        loop {
            if let Some(live) = rx.borrow_and_update().clone() {
                return live;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: not reached.
                std::future::pending::<()>().await;
            }
        }
    }

    async fn slot(&self, thread: &str) -> Arc<Mutex<Slot>> {
        self.sessions
            .lock()
            .await
            .entry(thread.to_string())
            .or_default()
            .clone()
    }

    /// Saves the session ids of every thread not being changed right now (best
    /// effort: a failure only costs a new session after a relay restart).
    async fn save_sessions(&self, thread: &str, id: &SessionId) {
        let mut map: BTreeMap<String, String> = BTreeMap::new();
        for (t, slot) in self.sessions.lock().await.iter() {
            if t == thread {
                map.insert(t.clone(), id.to_string());
            } else if let Ok(s) = slot.try_lock() {
                if let Some(i) = &s.id {
                    map.insert(t.clone(), i.to_string());
                }
            }
        }
        let file = &self.sessions_file;
        let write = || -> std::io::Result<()> {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = file.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&map).unwrap_or_default())?;
            std::fs::rename(tmp, file)
        };
        if let Err(e) = write() {
            warn!(agent = %self.agent, file = %file.display(), error = %e, "cannot save the ACP session ids");
        }
    }

    /// The MCP servers a session in `room` is offered: huddle's, for this agent.
    fn mcp_servers(&self, room: &str) -> Vec<McpServer> {
        self.mcp
            .iter()
            .map(|m| {
                McpServer::Stdio(
                    McpServerStdio::new("huddle", m.program.clone())
                        .args(m.args(room, &self.agent))
                        .env(
                            m.env()
                                .into_iter()
                                .map(|(k, v)| EnvVariable::new(k, v))
                                .collect(),
                        ),
                )
            })
            .collect()
    }

    /// The thread's session in `live`'s process: the current one, a loaded earlier
    /// one, or a new one (with the note to prepend to the prompt when an earlier
    /// session was lost).
    async fn session(
        &self,
        live: &Live,
        room: &str,
        thread: &str,
        slot: &mut Slot,
    ) -> Result<(SessionId, &'static str), String> {
        if let Some(id) = &slot.id {
            if slot.generation == live.generation {
                return Ok((id.clone(), ""));
            }
        }
        let earlier = slot.id.take();
        if let Some(id) = &earlier {
            if live.load_session {
                let request = LoadSessionRequest::new(id.clone(), self.cwd.clone())
                    .mcp_servers(self.mcp_servers(room));
                match live.cx.send_request(request).block_task().await {
                    Ok(_) => {
                        info!(agent = %self.agent, thread, session = %id, "ACP session loaded");
                        slot.id = Some(id.clone());
                        slot.generation = live.generation;
                        return Ok((id.clone(), ""));
                    }
                    Err(e) => {
                        warn!(agent = %self.agent, thread, session = %id, error = %e, "session/load failed; starting a new session")
                    }
                }
            }
        }
        let response = live
            .cx
            .send_request(
                NewSessionRequest::new(self.cwd.clone()).mcp_servers(self.mcp_servers(room)),
            )
            .block_task()
            .await
            .map_err(|e| format!("session/new failed: {e}"))?;
        let id = response.session_id;
        info!(agent = %self.agent, thread, session = %id, replaced = earlier.is_some(), "ACP session created");
        slot.id = Some(id.clone());
        slot.generation = live.generation;
        self.save_sessions(thread, &id).await;
        Ok((
            id,
            if earlier.is_some() {
                NEW_SESSION_NOTE
            } else {
                ""
            },
        ))
    }
}

/// Removes a turn's route when the turn ends, however it ends.
struct Route<'a> {
    inner: &'a Inner,
    session: SessionId,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        let mut routes = match self.inner.routes.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        routes.remove(&self.session);
    }
}

/// What reaches a running turn from its session: the agent's updates, and the
/// answers the relay gave to its permission requests.
enum Routed {
    Update(Box<SessionUpdate>),
    Permission {
        tool: String,
        kind: String,
        answer: String,
    },
}

/// What a turn's updates add up to: the reply text and the activity summary that goes
/// into the turn's record (plan 0025).
#[derive(Default)]
struct Reply {
    text: String,
    activity: TurnActivity,
    /// Tool call ids seen, with their place in `activity.tools`.
    calls: HashMap<String, Option<usize>>,
    /// Where plan updates go as progress notes.
    progress: super::ProgressSink,
}

/// The wire name of a protocol enum value (`"in_progress"`, `"completed"`, ...).
fn wire_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Reply {
    fn absorb(&mut self, agent: &str, routed: Routed) {
        // Any update or permission request is the agent showing life.
        self.progress.beat();
        let update = match routed {
            Routed::Update(update) => *update,
            Routed::Permission { tool, kind, answer } => {
                self.activity.note_permission(&tool, &kind, &answer);
                return;
            }
        };
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let Some(t) = text_of(&chunk.content) {
                    self.text.push_str(t);
                }
            }
            SessionUpdate::ToolCall(call) => {
                let kind = kind_name(Some(call.kind));
                let status = wire_name(&call.status);
                info!(agent, tool = %call.title, kind = %kind, status = %status, "agent tool call");
                self.activity.note_tool_call(
                    &mut self.calls,
                    &call.tool_call_id.to_string(),
                    Some(&call.title),
                    Some(&kind),
                    Some(&status),
                );
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let f = &update.fields;
                let kind = f.kind.map(|k| kind_name(Some(k)));
                let status = f.status.as_ref().map(wire_name);
                debug!(agent, call = %update.tool_call_id, status = ?status, "agent tool call update");
                self.activity.note_tool_call(
                    &mut self.calls,
                    &update.tool_call_id.to_string(),
                    f.title.as_deref(),
                    kind.as_deref(),
                    status.as_deref(),
                );
            }
            SessionUpdate::Plan(plan) => {
                debug!(agent, entries = plan.entries.len(), "agent plan");
                let steps: Vec<(String, String)> = plan
                    .entries
                    .iter()
                    .map(|e| (e.content.clone(), wire_name(&e.status)))
                    .collect();
                self.activity
                    .set_plan(steps.iter().map(|(c, s)| (c.as_str(), s.as_str())));
                // A plan update is the agent saying where it is: an interim progress
                // note, never part of the reply.
                let note: Vec<String> = steps.iter().map(|(c, s)| format!("[{s}] {c}")).collect();
                self.progress.note(&format!("plan: {}", note.join("; ")));
            }
            _ => {}
        }
    }
}

/// Forgets a prompt's registered deadline when its turn ends first.
struct Forget<'a> {
    gate: &'a PromptGate,
    session: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.gate.forget(self.session);
    }
}

enum End {
    Done(Box<Result<PromptResponse, agent_client_protocol::Error>>),
    Cancelled,
    TimedOut,
}

#[async_trait]
impl Driver for AcpDriver {
    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome {
        let inner = &*self.inner;
        let s = &inner.settings;
        let timeout = tokio::time::sleep(Duration::from_millis(s.turn_timeout_ms));
        tokio::pin!(timeout);
        let timed_out =
            || TurnOutcome::failed(format!("timed out after {} ms", s.turn_timeout_ms), 0);
        let thread = format!(
            "{}/{}",
            request.room,
            request.thread.as_deref().unwrap_or("-")
        );
        // One prompt at a time per session: a second turn in the thread waits.
        let slot = inner.slot(&thread).await;
        let mut slot = tokio::select! {
            s = slot.lock_owned() => s,
            _ = cancel.cancelled() => return TurnOutcome::Cancelled,
            _ = &mut timeout => return timed_out(),
        };
        let live = tokio::select! {
            l = inner.wait_live() => l,
            _ = cancel.cancelled() => return TurnOutcome::Cancelled,
            _ = &mut timeout => return timed_out(),
        };
        let (session, note) = tokio::select! {
            r = inner.session(&live, &request.room, &thread, &mut slot) => match r {
                Ok(ok) => ok,
                Err(reason) => return TurnOutcome::failed(reason, 0),
            },
            _ = cancel.cancelled() => return TurnOutcome::Cancelled,
            _ = &mut timeout => return timed_out(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        if let Ok(mut routes) = inner.routes.lock() {
            routes.insert(session.clone(), tx);
        }
        let _route = Route {
            inner,
            session: session.clone(),
        };
        let prompt = format!("{note}{}", request.prompt);
        let prompt_len = prompt.len();
        // The prompt reaches the agent only before the turn's start deadline.
        let session_key = session.to_string();
        let mut delivery = request
            .start_by
            .map(|by| live.gate.expect(&session_key, by));
        let _forget = Forget {
            gate: &live.gate,
            session: &session_key,
        };
        let response = live
            .cx
            .send_request(PromptRequest::new(
                session.clone(),
                vec![ContentBlock::Text(TextContent::new(prompt))],
            ))
            .block_task();
        tokio::pin!(response);
        let mut reply = Reply {
            progress: request.progress.clone(),
            ..Reply::default()
        };
        let end = loop {
            let delivered = async {
                match delivery.as_mut() {
                    Some(d) => d.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = &mut response => break End::Done(Box::new(r)),
                Some(u) = rx.recv() => reply.absorb(&inner.agent, u),
                d = delivered => {
                    delivery = None;
                    match d {
                        Ok(Ok(true)) => {}
                        Ok(Ok(false)) => {
                            info!(agent = %inner.agent, session = %session, "prompt not delivered: the turn's start deadline had passed");
                            return TurnOutcome::NotStarted;
                        }
                        Ok(Err(e)) => return TurnOutcome::failed(format!("the prompt could not be delivered: {e}"), 0),
                        Err(_) => return TurnOutcome::failed("the connection to the agent ended before the prompt was delivered", 0),
                    }
                }
                _ = cancel.cancelled() => break End::Cancelled,
                _ = &mut timeout => break End::TimedOut,
            }
        };
        let response = match end {
            End::Done(r) => *r,
            End::Cancelled | End::TimedOut => {
                // A prompt still on its way through the gate: if it never reached the
                // agent, there is nothing to cancel there.
                if let Some(d) = delivery.take() {
                    let grace = Duration::from_millis(s.cancel_grace_ms);
                    if !matches!(tokio::time::timeout(grace, d).await, Ok(Ok(Ok(true)))) {
                        return match end {
                            End::TimedOut => timed_out(),
                            _ => TurnOutcome::Cancelled,
                        };
                    }
                }
                let _ = live
                    .cx
                    .send_notification(CancelNotification::new(session.clone()));
                let grace = Duration::from_millis(s.cancel_grace_ms);
                let started = Instant::now();
                let stopped = tokio::time::timeout(grace, async {
                    loop {
                        tokio::select! {
                            r = &mut response => break r,
                            Some(u) = rx.recv() => reply.absorb(&inner.agent, u),
                        }
                    }
                })
                .await;
                match stopped {
                    Ok(Ok(r)) => {
                        info!(agent = %inner.agent, session = %session, stop_reason = ?r.stop_reason, took_ms = started.elapsed().as_millis() as u64, "cancelled prompt ended")
                    }
                    Ok(Err(e)) => {
                        debug!(agent = %inner.agent, session = %session, error = %e, "cancelled prompt failed")
                    }
                    Err(_) => {
                        warn!(agent = %inner.agent, session = %session, grace_ms = s.cancel_grace_ms, "the agent did not end a cancelled prompt");
                        live.restart.cancel();
                    }
                }
                return match end {
                    End::TimedOut => TurnOutcome::Failed {
                        reason: format!("timed out after {} ms", s.turn_timeout_ms),
                        tokens: 0,
                        activity: reply.activity,
                    },
                    _ => TurnOutcome::Cancelled,
                };
            }
        };
        // Updates sent before the response were routed before it was delivered.
        while let Ok(u) = rx.try_recv() {
            reply.absorb(&inner.agent, u);
        }
        let estimate = ((prompt_len + reply.text.len()) / 4) as u64;
        match response {
            Ok(r) => {
                let tokens = r.usage.as_ref().map(|u| u.total_tokens).unwrap_or(estimate);
                debug!(agent = %inner.agent, session = %session, stop_reason = ?r.stop_reason, tool_calls = reply.activity.tool_calls, tokens, "prompt ended");
                let activity = reply.activity;
                match r.stop_reason {
                    StopReason::EndTurn | StopReason::MaxTokens | StopReason::MaxTurnRequests => {
                        TurnOutcome::Replied {
                            text: reply.text,
                            tokens,
                            activity,
                        }
                    }
                    StopReason::Refusal => TurnOutcome::Failed {
                        reason: "the agent refused the prompt".into(),
                        tokens,
                        activity,
                    },
                    other => TurnOutcome::Failed {
                        reason: format!("the agent ended the prompt with {other:?}"),
                        tokens,
                        activity,
                    },
                }
            }
            Err(e) => TurnOutcome::Failed {
                reason: format!("the prompt failed: {e}"),
                tokens: estimate,
                activity: reply.activity,
            },
        }
    }

    async fn check(&self) -> Result<String, String> {
        let n = self
            .inner
            .negotiated
            .lock()
            .map(|n| n.clone())
            .unwrap_or_default();
        Ok(format!("acp {:?}: {n}", self.inner.command.join(" ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_decide_by_tool_kind() {
        let ro = PermissionPolicy::default();
        assert_eq!(ro.decide("read"), Decision::Allow);
        assert_eq!(ro.decide("search"), Decision::Allow);
        assert_eq!(ro.decide("edit"), Decision::Reject);
        assert_eq!(ro.decide("execute"), Decision::Reject);
        let all = PermissionPolicy::Named("allow-all".into());
        assert_eq!(all.decide("delete"), Decision::Allow);
        let deny = PermissionPolicy::Named("deny".into());
        assert_eq!(deny.decide("read"), Decision::Reject);
        let list = PermissionPolicy::Kinds(vec!["edit".into(), "read".into()]);
        assert_eq!(list.decide("edit"), Decision::Allow);
        assert_eq!(list.decide("execute"), Decision::Reject);
    }

    #[test]
    fn bad_policies_and_settings_are_named() {
        assert!(PermissionPolicy::Named("yolo".into())
            .validate()
            .unwrap_err()
            .contains("yolo"));
        assert!(PermissionPolicy::Kinds(vec!["teleport".into()])
            .validate()
            .unwrap_err()
            .contains("teleport"));
        let mut s = AcpSettings::with_command(vec![]);
        assert!(s.validate().unwrap_err().contains("command or preset"));
        s.preset = Some(AcpPreset::Gemini);
        assert_eq!(s.resolved_command(), ["gemini", "--experimental-acp"]);
        assert!(s.validate().is_ok());
        s.command = vec!["my-gemini".into()];
        assert_eq!(s.resolved_command(), ["my-gemini"]);
        s.turn_timeout_ms = 0;
        assert!(s.validate().unwrap_err().contains("turn_timeout_ms"));
    }

    #[test]
    fn tool_kind_names_match_the_protocol() {
        for k in TOOL_KINDS {
            let kind: ToolKind = serde_json::from_value(serde_json::json!(k)).expect("a kind");
            assert_eq!(kind_name(Some(kind)), *k);
        }
    }
}
