//! A scripted ACP agent for the ACP driver's tests, built on the agent side of the
//! `agent-client-protocol` SDK: the protocol is the SDK's, not huddle's.
//!
//! Each prompt is scripted by lines starting with `@` in its text (the first of these
//! that ends the turn wins; the others run in order):
//!
//! - `@say TEXT` streams TEXT as many three-character message chunks.
//! - `@remember WORD` keeps WORD in the session; `@recall` replies with every word
//!   the session kept, comma-separated (`nothing` when none).
//! - `@sleep MS` waits MS milliseconds, ending the turn `cancelled` as soon as
//!   `session/cancel` arrives; `@stubborn MS` waits and ignores cancellation.
//! - `@crash` sends one chunk, then exits with status 3 mid-turn.
//! - `@permission KIND` asks permission for a tool of KIND and replies with the
//!   chosen option's id (`cancelled` when none was chosen).
//! - `@usage N` reports N tokens for the turn.
//! - `@tool KIND TITLE` reports a tool call (`pending`), then an update of it to
//!   `completed` (`@tool! KIND TITLE`: to `failed`).
//! - `@plan STEP;STEP;...` reports a plan, the first step `completed`, the others
//!   `pending`.
//!
//! A prompt without a reply-producing line replies `done`.
//!
//! Environment: `ACP_TEST_LOG` — a file each event is appended to (`start PID`,
//! `new SID`, `mcp NAME COMMAND ARGS... env NAMES...` per stdio MCP server a new session
//! is offered, `prompt SID` (` with-note` added when the
//! prompt starts with huddle's new-session note), `task ID` for a task's prompt, `load SID`, `cancel SID`, `crash`); `ACP_TEST_LOAD=1` — advertise and
//! support `session/load`, keeping sessions' words in `ACP_TEST_STATE` (a file) so
//! that a later process can load them; `ACP_TEST_INIT=fail` — answer `initialize`
//! with an error.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse, McpServer,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, Plan, PlanEntry,
    PlanEntryPriority, PlanEntryStatus, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionNotification, SessionUpdate, StopReason,
    TextContent, ToolCall, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, Usage,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client, Error};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct State {
    /// Words kept per session.
    words: HashMap<String, Vec<String>>,
    /// The running prompt's cancellation, per session.
    running: HashMap<String, CancellationToken>,
    next: u64,
}

type Shared = Arc<Mutex<State>>;

fn log(event: &str) {
    if let Ok(path) = std::env::var("ACP_TEST_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: several agents may append to one log.
            let _ = f.write_all(format!("{event}\n").as_bytes());
        }
    }
}

/// Logs each stdio MCP server a session is offered: `mcp NAME COMMAND ARG... env
/// NAME...` (variable names only).
fn log_mcp_servers(servers: &[McpServer]) {
    for server in servers {
        if let McpServer::Stdio(s) = server {
            let env: Vec<&str> = s.env.iter().map(|e| e.name.as_str()).collect();
            log(&format!(
                "mcp {} {} {} env {}",
                s.name,
                s.command.display(),
                s.args.join(" "),
                env.join(" ")
            ));
        }
    }
}

fn loads() -> bool {
    std::env::var("ACP_TEST_LOAD").is_ok_and(|v| v == "1")
}

fn saved() -> HashMap<String, Vec<String>> {
    std::env::var("ACP_TEST_STATE")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn save(words: &HashMap<String, Vec<String>>) {
    if let Ok(p) = std::env::var("ACP_TEST_STATE") {
        let _ = std::fs::write(p, serde_json::to_vec(words).unwrap_or_default());
    }
}

fn chunk(cx: &ConnectionTo<Client>, session: &SessionId, text: &str) -> Result<(), Error> {
    cx.send_notification(SessionNotification::new(
        session.clone(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
            text,
        )))),
    ))
}

fn kind_of(name: &str) -> ToolKind {
    serde_json::from_value(serde_json::json!(name)).unwrap_or(ToolKind::Other)
}

/// Runs one prompt; the stop reason and the usage to report.
async fn prompt(
    state: Shared,
    cx: ConnectionTo<Client>,
    request: PromptRequest,
    cancel: CancellationToken,
) -> Result<PromptResponse, Error> {
    let session = request.session_id.clone();
    let sid = session.to_string();
    let text: String = request
        .prompt
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    let note = if text.contains("<session-note>") {
        " with-note"
    } else {
        ""
    };
    log(&format!("prompt {sid}{note}"));
    if let Some(task) = text
        .split("<task id=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
    {
        log(&format!("task {task}"));
    }
    let mut replied = false;
    let mut usage = None;
    let mut calls = 0;
    for line in text.lines().map(str::trim) {
        let (cmd, arg) = line.split_once(' ').unwrap_or((line, ""));
        match cmd {
            "@say" => {
                for part in arg.as_bytes().chunks(3) {
                    chunk(&cx, &session, &String::from_utf8_lossy(part))?;
                }
                replied = true;
            }
            "@remember" => {
                let mut st = state.lock().expect("state");
                st.words
                    .entry(sid.clone())
                    .or_default()
                    .push(arg.to_string());
                save(&st.words);
            }
            "@recall" => {
                let words = state
                    .lock()
                    .expect("state")
                    .words
                    .get(&sid)
                    .cloned()
                    .unwrap_or_default();
                let reply = if words.is_empty() {
                    "nothing".to_string()
                } else {
                    words.join(",")
                };
                chunk(&cx, &session, &reply)?;
                replied = true;
            }
            "@sleep" => {
                let ms = arg.parse().unwrap_or(60_000);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = cancel.cancelled() => {
                        log(&format!("cancelled {sid}"));
                        return Ok(PromptResponse::new(StopReason::Cancelled));
                    }
                }
            }
            "@stubborn" => {
                let ms = arg.parse().unwrap_or(60_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            "@crash" => {
                chunk(&cx, &session, "about to crash")?;
                log("crash");
                // Let the chunk reach the client, then die mid-turn.
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(3);
            }
            "@permission" => {
                let fields = ToolCallUpdateFields::new()
                    .kind(kind_of(arg))
                    .title(format!("a {arg} tool"));
                let options = vec![
                    PermissionOption::new("allow-once", "Allow", PermissionOptionKind::AllowOnce),
                    PermissionOption::new(
                        "allow-always",
                        "Always allow",
                        PermissionOptionKind::AllowAlways,
                    ),
                    PermissionOption::new(
                        "reject-once",
                        "Reject",
                        PermissionOptionKind::RejectOnce,
                    ),
                ];
                let answer = cx
                    .send_request(RequestPermissionRequest::new(
                        session.clone(),
                        ToolCallUpdate::new(format!("tool-{arg}"), fields),
                        options,
                    ))
                    .block_task()
                    .await?;
                let chosen = match answer.outcome {
                    RequestPermissionOutcome::Selected(s) => s.option_id.to_string(),
                    _ => "cancelled".to_string(),
                };
                log(&format!("permission {arg} {chosen}"));
                chunk(&cx, &session, &chosen)?;
                replied = true;
            }
            "@usage" => usage = arg.parse::<u64>().ok(),
            "@tool" | "@tool!" => {
                let (kind, title) = arg.split_once(' ').unwrap_or((arg, arg));
                calls += 1;
                let id = format!("call-{calls}");
                cx.send_notification(SessionNotification::new(
                    session.clone(),
                    SessionUpdate::ToolCall(
                        ToolCall::new(id.clone(), title)
                            .kind(kind_of(kind))
                            .status(ToolCallStatus::Pending),
                    ),
                ))?;
                let end = if cmd == "@tool!" {
                    ToolCallStatus::Failed
                } else {
                    ToolCallStatus::Completed
                };
                cx.send_notification(SessionNotification::new(
                    session.clone(),
                    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                        id,
                        ToolCallUpdateFields::new().status(end),
                    )),
                ))?;
            }
            "@plan" => {
                let entries = arg
                    .split(';')
                    .enumerate()
                    .map(|(i, step)| {
                        let status = if i == 0 {
                            PlanEntryStatus::Completed
                        } else {
                            PlanEntryStatus::Pending
                        };
                        PlanEntry::new(step, PlanEntryPriority::Medium, status)
                    })
                    .collect();
                cx.send_notification(SessionNotification::new(
                    session.clone(),
                    SessionUpdate::Plan(Plan::new(entries)),
                ))?;
            }
            _ => {}
        }
    }
    if !replied {
        chunk(&cx, &session, "done")?;
    }
    let mut response = PromptResponse::new(StopReason::EndTurn);
    if let Some(n) = usage {
        response = response.usage(Usage::new(n, n / 2, n - n / 2));
    }
    Ok(response)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    log(&format!("start {}", std::process::id()));
    let state: Shared = Arc::default();
    let (s1, s2, s3, s4) = (state.clone(), state.clone(), state.clone(), state.clone());
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    Agent
        .v1()
        .name("huddle-acp-test-agent")
        .on_receive_request(
            async move |req: InitializeRequest, responder: Responder<InitializeResponse>, _cx| {
                if std::env::var("ACP_TEST_INIT").is_ok_and(|v| v == "fail") {
                    return responder.respond_with_error(Error::new(-32603, "scripted failure"));
                }
                responder.respond(
                    InitializeResponse::new(req.protocol_version)
                        .agent_capabilities(AgentCapabilities::new().load_session(loads()))
                        .agent_info(Implementation::new("huddle-acp-test-agent", "1.0.0")),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: NewSessionRequest, responder: Responder<NewSessionResponse>, _cx| {
                let id = {
                    let mut st = s1.lock().expect("state");
                    st.next += 1;
                    format!("s-{}-{}", std::process::id(), st.next)
                };
                log(&format!("new {id}"));
                log_mcp_servers(&req.mcp_servers);
                responder.respond(NewSessionResponse::new(id))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: LoadSessionRequest, responder: Responder<LoadSessionResponse>, _cx| {
                let sid = req.session_id.to_string();
                let words = saved();
                match words.get(&sid) {
                    Some(w) if loads() => {
                        log(&format!("load {sid}"));
                        s2.lock().expect("state").words.insert(sid, w.clone());
                        responder.respond(LoadSessionResponse::new())
                    }
                    _ => responder.respond_with_error(Error::new(-32602, "no such session")),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: PromptRequest, responder: Responder<PromptResponse>, cx| {
                let cancel = CancellationToken::new();
                s3.lock()
                    .expect("state")
                    .running
                    .insert(req.session_id.to_string(), cancel.clone());
                let state = s3.clone();
                // The prompt runs beside the dispatch loop, which must stay free to
                // deliver cancellations and permission answers.
                cx.clone().spawn(async move {
                    let sid = req.session_id.to_string();
                    let result = prompt(state.clone(), cx, req, cancel).await;
                    state.lock().expect("state").running.remove(&sid);
                    match result {
                        Ok(r) => responder.respond(r),
                        Err(e) => responder.respond_with_error(e),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: CancelNotification, _cx| {
                let sid = n.session_id.to_string();
                log(&format!("cancel {sid}"));
                if let Some(t) = s4.lock().expect("state").running.get(&sid) {
                    t.cancel();
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await
}
