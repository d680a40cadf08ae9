//! `huddle mcp --http ADDR` (plan 0023): the tools, resources and subscriptions of
//! [`AgentTools`] served over MCP streamable HTTP, one agent per bearer token.
//!
//! Identity comes only from the token (`huddle admin token add`, stored hashed in the
//! database: [`huddle_store::tokens`]):
//! - an axum middleware checks `Authorization: Bearer ...` on every request before
//!   rmcp sees it; no token, or one the database does not hold (removed, forged), is
//!   answered 401 with `WWW-Authenticate: Bearer`;
//! - the MCP session is bound to the token at `initialize`: rmcp builds the session's
//!   handler from the service factory while handling that request, and the factory
//!   takes the [`AgentSession`] of the request's token from a task-local the
//!   middleware set around it;
//! - the session id rmcp answers `initialize` with is recorded against the token;
//!   a later request on that session with another token is refused (403) before rmcp
//!   sees it.
//!
//! The [`AgentSession`] of each token is opened on its first request and shared by
//! that token's MCP sessions (one agent, one room: the same folds and cursor).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use huddle_agent::AgentSession;
use huddle_store::tokens::{self, TokenInfo, TokenStore};
use huddle_store::{Store, StoreOptions};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::mcp::AgentTools;
use crate::mcp_more::Client;

/// The path the MCP endpoint is served on.
pub const PATH: &str = "/mcp";

/// The header of a streamable HTTP session.
const SESSION_HEADER: &str = "mcp-session-id";

tokio::task_local! {
    /// The session of the request being handled, for the service factory.
    static REQUEST_AGENT: Arc<AgentSession>;
}

/// What the middleware needs.
struct HttpState {
    store: Arc<dyn Store>,
    tokens: TokenStore,
    /// The agent session of each token id, opened on its first request (one opening
    /// per token; other tokens' requests do not wait for it).
    agents: Mutex<HashMap<String, Arc<OnceCell<Arc<AgentSession>>>>>,
    /// The token id each MCP session was initialised with.
    bound: Mutex<HashMap<String, String>>,
}

impl HttpState {
    /// The session of `token`'s agent in its room, opened (registering the agent)
    /// on first use.
    async fn agent(&self, token: &TokenInfo) -> huddle_agent::Result<Arc<AgentSession>> {
        let cell = lock(&self.agents)
            .entry(token.id.clone())
            .or_default()
            .clone();
        cell.get_or_try_init(|| async {
            let session = AgentSession::open(
                self.store.clone(),
                &token.room,
                &token.agent,
                token.capabilities.clone(),
            )
            .await?;
            tracing::info!(
                token = token.id,
                agent = token.agent,
                room = token.room,
                "agent session opened"
            );
            let session = Arc::new(session);
            // Its resources stay renewed while the server runs.
            huddle_agent::resources::spawn_keeper(session.clone());
            huddle_agent::watch::spawn_watchdog(session.clone());
            Ok(session)
        })
        .await
        .cloned()
    }

    /// Forgets a token that no longer verifies: its session and its MCP sessions.
    fn forget(&self, id: &str) {
        if lock(&self.agents).remove(id).is_some() {
            tracing::info!(
                token = id,
                "token no longer valid: its agent session is closed"
            );
        }
        lock(&self.bound).retain(|_, t| t != id);
    }
}

/// A plain map behind a lock: a panic while holding it leaves the map usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A refusal before the request's body was read: the connection is closed after it
/// (`Connection: close`), so no client reuses a connection with an unread body on it.
fn refuse(status: StatusCode, message: String) -> Response {
    let mut response = (status, format!("{message}\n")).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 401 with the challenge, and a line saying what was wrong.
fn unauthorized(error: Option<&str>, message: &str) -> Response {
    let challenge = match error {
        Some(e) => format!("Bearer realm=\"huddle\", error=\"{e}\""),
        None => "Bearer realm=\"huddle\"".to_string(),
    };
    let mut response = refuse(StatusCode::UNAUTHORIZED, message.to_string());
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The authentication middleware (see the module documentation).
async fn authenticate(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(presented) = bearer(request.headers()) else {
        return unauthorized(
            None,
            "huddle: this server needs `Authorization: Bearer <token>`; `huddle admin token add` makes one",
        );
    };
    let token = match state.tokens.verify(presented).await {
        Ok(Some(token)) => token,
        Ok(None) => {
            if let Some(id) = tokens::token_id(presented) {
                state.forget(id);
            }
            tracing::info!("request refused: unknown or removed token");
            return unauthorized(
                Some("invalid_token"),
                "huddle: the token is not valid (unknown, or removed); ask for a new one",
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check a token");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("huddle: cannot check the token now: {e}"),
            );
        }
    };
    let session_id = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(sid) = &session_id {
        let owner = lock(&state.bound).get(sid).cloned();
        if owner.is_some_and(|owner| owner != token.id) {
            tracing::warn!(
                agent = token.agent,
                room = token.room,
                "request refused: an MCP session of another token"
            );
            return refuse(
                StatusCode::FORBIDDEN,
                "huddle: this MCP session belongs to another agent's token; initialize your own"
                    .to_string(),
            );
        }
    }
    let agent = match state.agent(&token).await {
        Ok(agent) => agent,
        Err(e) => {
            tracing::warn!(agent = token.agent, room = token.room, error = %e, "cannot open the token's agent session");
            let status = if e.code() == "store" {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::FORBIDDEN
            };
            return refuse(
                status,
                format!(
                    "huddle: cannot act as agent {:?} in room {:?}: {e}",
                    token.agent, token.room
                ),
            );
        }
    };
    let deleting = request.method() == Method::DELETE;
    let response = REQUEST_AGENT.scope(agent, next.run(request)).await;
    match session_id {
        None => {
            if let Some(sid) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                lock(&state.bound).insert(sid.to_string(), token.id.clone());
            }
        }
        Some(sid) if deleting && response.status().is_success() => {
            lock(&state.bound).remove(&sid);
        }
        Some(_) => {}
    }
    response
}

/// `huddle mcp --http ADDR`: serves every token's agent on `addr` until interrupted.
/// A non-loopback address needs `allow_remote`. Prints the endpoint's URL on stdout.
pub async fn serve(
    db: &str,
    options: StoreOptions,
    addr: SocketAddr,
    allow_remote: bool,
) -> anyhow::Result<()> {
    let loopback = addr.ip().is_loopback();
    if !loopback && !allow_remote {
        anyhow::bail!(
            "--http {addr} is not a loopback address: anyone who can reach it can try tokens \
             (sent in clear over plain HTTP). Pass --allow-remote to serve it anyway, behind \
             TLS termination, or use 127.0.0.1"
        );
    }
    let store = huddle_store::open(db, options).await?;
    let tokens = TokenStore::open(db).await?;
    let state = Arc::new(HttpState {
        store,
        tokens,
        agents: Mutex::default(),
        bound: Mutex::default(),
    });
    let shutdown = CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.clone());
    if !loopback {
        // Host checks guard unauthenticated servers on loopback against DNS
        // rebinding; this one is remote on purpose and every request carries a token.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        || {
            REQUEST_AGENT
                .try_with(|agent| AgentTools::new(agent.clone()))
                .map_err(|_| std::io::Error::other("no authenticated agent for this request"))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(state, authenticate));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    if loopback {
        tracing::info!(%local, "mcp server on http");
    } else {
        tracing::warn!(
            %local,
            "mcp server on a non-loopback address: tokens travel in clear unless TLS terminates in front"
        );
    }
    println!("http://{local}{PATH}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        })
        .await?;
    Ok(())
}

/// The environment variable the printed HTTP configurations read the token from.
pub const TOKEN_ENV: &str = "HUDDLE_TOKEN";

/// The snippet registering the HTTP server at `url` (named `huddle`) in `client`,
/// the token taken from [`TOKEN_ENV`] in the client's environment.
pub fn config(url: &str, client: Client) -> String {
    let bearer = |var: &str| format!("Bearer {var}");
    let server = match client {
        Client::Codex => {
            return format!(
                "[mcp_servers.huddle]\nurl = {}\nbearer_token_env_var = \"{TOKEN_ENV}\"\n",
                serde_json::to_string(url).unwrap_or_default()
            );
        }
        Client::Claude => json!({
            "type": "http",
            "url": url,
            "headers": { "Authorization": bearer(&format!("${{{TOKEN_ENV}}}")) },
        }),
        Client::Gemini => json!({
            "httpUrl": url,
            "headers": { "Authorization": bearer(&format!("${{{TOKEN_ENV}}}")) },
        }),
        Client::Cursor => json!({
            "url": url,
            "headers": { "Authorization": bearer(&format!("${{env:{TOKEN_ENV}}}")) },
        }),
    };
    format!("{:#}\n", json!({ "mcpServers": { "huddle": server } }))
}

/// `huddle mcp --http ADDR --print-config CLIENT`.
pub fn print_config(addr: SocketAddr, client: Client) {
    eprintln!(
        "# for {}; set {TOKEN_ENV} to the agent's token (`huddle admin token add`)",
        client.file()
    );
    print!("{}", config(&format!("http://{addr}{PATH}"), client));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn http_configs_name_the_url_and_the_token_variable() {
        let url = "http://127.0.0.1:8765/mcp";
        let claude: serde_json::Value = serde_json::from_str(&config(url, Client::Claude)).unwrap();
        assert_eq!(claude["mcpServers"]["huddle"]["type"], "http");
        assert_eq!(claude["mcpServers"]["huddle"]["url"], url);
        assert_eq!(
            claude["mcpServers"]["huddle"]["headers"]["Authorization"],
            "Bearer ${HUDDLE_TOKEN}"
        );
        let cursor: serde_json::Value = serde_json::from_str(&config(url, Client::Cursor)).unwrap();
        assert_eq!(
            cursor["mcpServers"]["huddle"]["headers"]["Authorization"],
            "Bearer ${env:HUDDLE_TOKEN}"
        );
        let gemini: serde_json::Value = serde_json::from_str(&config(url, Client::Gemini)).unwrap();
        assert_eq!(gemini["mcpServers"]["huddle"]["httpUrl"], url);
        let codex = config(url, Client::Codex);
        assert!(codex.contains("url = \"http://127.0.0.1:8765/mcp\""));
        assert!(codex.contains("bearer_token_env_var = \"HUDDLE_TOKEN\""));
    }
}
