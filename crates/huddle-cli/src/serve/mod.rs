//! `huddle serve`: a read-only web dashboard, an HTTP API and Prometheus metrics over
//! the same store code and the same view builders as the CLI's `--json` output
//! (plan 0048, `docs/http.md`).
//!
//! - `api`: the JSON endpoints and the checks every path and query passes;
//! - `events`: the room's server-sent events, woken by the store's doorbell;
//! - `pages`: the HTML pages and the live fragment the page script swaps in;
//! - `dag`: the task DAG as a layered SVG;
//! - `metrics`: `/metrics` in the Prometheus text format;
//! - `folds`: the ledger's and each room's fold, read forward from their cursors;
//! - `post`: posting as the owner (`--owner`), the one write the server makes.
//!
//! Without `--owner` the server never appends; it never takes a claim.

mod api;
mod dag;
mod events;
mod folds;
mod metrics;
mod pages;
mod post;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use huddle_store::{Store, StoreOptions};

/// `huddle serve` flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one); prints the URL when ready.
    #[arg(long, default_value = "127.0.0.1:8420")]
    pub addr: SocketAddr,
    /// Allow an --addr that is not loopback: anyone who can reach it reads every room
    /// of the database (put authentication and TLS in front).
    #[arg(long)]
    pub allow_remote: bool,
    /// Post as this room owner from the room pages of the rooms ID owns (messages and
    /// owner commands, signed with ID's key, read as `huddle post --as ID` reads it).
    /// Loopback only.
    #[arg(long, value_name = "ID")]
    pub owner: Option<String>,
    /// The owner's key file [default: $HUDDLE_KEYS/ID.key, else
    /// $XDG_CONFIG_HOME/huddle/keys/ID.key, else ~/.config/huddle/keys/ID.key].
    #[arg(long, env = "HUDDLE_OWNER_KEY", value_name = "PATH")]
    pub key: Option<std::path::PathBuf>,
}

/// Longest wait of an event stream between two reads when no doorbell rings.
const MAX_FALLBACK: Duration = Duration::from_secs(30);
/// Shortest such wait.
const MIN_FALLBACK: Duration = Duration::from_millis(50);

/// What every handler shares.
pub(crate) struct AppState {
    /// The database.
    store: Arc<dyn Store>,
    /// How long an event stream waits for a doorbell before reading anyway.
    fallback: Duration,
    /// The server's own counters.
    counters: metrics::Counters,
    /// Requests must name a loopback host (DNS-rebinding guard of a loopback server).
    loopback_hosts_only: bool,
    /// Each room's live fragment, rendered once for the pages that ask together.
    fragments: pages::Fragments,
    /// The ledger's and each room's folds, read forward on demand.
    folds: folds::Folds,
    /// The owner the server posts as (`--owner`); `None`: posting is off.
    owner: Option<post::Owner>,
    /// Cancelled at shutdown: ends every event stream, so the server can stop.
    shutdown: tokio_util::sync::CancellationToken,
}

type Shared = Arc<AppState>;

/// `huddle serve`: serves until interrupted.
pub async fn run(db: &str, options: StoreOptions, args: ServeArgs) -> anyhow::Result<()> {
    let loopback = args.addr.ip().is_loopback();
    if !loopback && !args.allow_remote {
        anyhow::bail!(
            "--addr {} is not a loopback address: anyone who can reach it would read every \
             room. Pass --allow-remote to serve it anyway (behind authentication and TLS), \
             or use 127.0.0.1",
            args.addr
        );
    }
    let owner = match &args.owner {
        Some(_) if !loopback => anyhow::bail!(
            "--owner is refused on a non-loopback address ({}): anyone who could reach it \
             would post as the owner. Serve on 127.0.0.1 (and reach it through an SSH tunnel)",
            args.addr
        ),
        Some(name) => Some(post::Owner::load(name, args.key.as_deref())?),
        None => None,
    };
    let fallback = options.poll_interval.clamp(MIN_FALLBACK, MAX_FALLBACK);
    let store = crate::ledger_cmds::open(db, options).await?;
    let state = Arc::new(AppState {
        store,
        fallback,
        counters: metrics::Counters::default(),
        loopback_hosts_only: loopback,
        fragments: pages::Fragments::default(),
        folds: folds::Folds::default(),
        owner,
        shutdown: tokio_util::sync::CancellationToken::new(),
    });
    let shutdown = state.shutdown.clone();
    let app = router(state);
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.addr))?;
    let local = listener.local_addr()?;
    tracing::info!(%local, "dashboard on http");
    println!("http://{local}/");
    // On Ctrl-C (SIGINT) or SIGTERM: stop accepting, end the event streams (they
    // never end by themselves), let requests in flight finish.
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            interrupted().await;
            tracing::info!("shutting down");
            shutdown.cancel();
        })
        .await?;
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn router(state: Shared) -> axum::Router {
    axum::Router::new()
        .route("/", get(pages::index))
        .route("/rooms/{room}", get(pages::room))
        .route("/rooms/{room}/live", get(pages::live))
        .route("/assets/room.js", get(pages::script))
        .route("/api/rooms", get(api::rooms))
        .route("/api/rooms/{room}/tasks", get(api::tasks))
        .route("/api/rooms/{room}/board", get(api::board))
        .route("/api/rooms/{room}/claims", get(api::claims))
        .route("/api/rooms/{room}/interactions", get(api::interactions))
        .route("/api/rooms/{room}/events", get(events::events))
        .route(
            "/api/rooms/{room}/messages",
            post(post::post_message).layer(axum::extract::DefaultBodyLimit::max(post::MAX_BODY)),
        )
        .route("/metrics", get(metrics::metrics))
        .fallback(|| async { ApiError::NotFound("no such page or endpoint".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed(
                "this path does not take that method (the API reads with GET; only \
                 /api/rooms/{room}/messages takes POST)"
                    .into(),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard_and_count,
        ))
        .with_state(state)
}

/// Refuses requests for other hosts on a loopback server (a page elsewhere cannot
/// read the dashboard through DNS rebinding), and counts every answer.
async fn guard_and_count(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let route = metrics::route_of(request.uri().path());
    let response = if state.loopback_hosts_only && !loopback_host(&request) {
        ApiError::Forbidden(
            "this server answers loopback host names only (127.0.0.1, localhost, [::1])".into(),
        )
        .into_response()
    } else {
        next.run(request).await
    };
    state.counters.request(route, response.status().as_u16());
    response
}

/// Whether the request's `Host` is a loopback name (any port), or absent.
pub(crate) fn loopback_host(request: &Request) -> bool {
    let Some(host) = request.headers().get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An error answer: a status and `{"error": "..."}`.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 400: the request itself is wrong (a bad room name, cursor or limit).
    BadRequest(String),
    /// 403: not for this server.
    Forbidden(String),
    /// 404: no such room or page.
    NotFound(String),
    /// 405: the path exists, the method does not.
    MethodNotAllowed(String),
    /// 409: the request cannot be carried out as things stand (the server's owner key
    /// is not the room's).
    Conflict(String),
    /// 413: the request body is too large.
    PayloadTooLarge(String),
    /// 415: the request body is not JSON.
    UnsupportedMediaType(String),
    /// 503: the database failed or is away; try again.
    Unavailable(String),
}

impl ApiError {
    /// A failed view build: the database's errors are 503, anything else (a view that
    /// could not be built from the data) too, never a panic.
    fn from_build(e: anyhow::Error) -> Self {
        tracing::warn!(error = %format!("{e:#}"), "request failed");
        ApiError::Unavailable(format!("{e:#}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::MethodNotAllowed(m) => (StatusCode::METHOD_NOT_ALLOWED, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::PayloadTooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m),
            ApiError::UnsupportedMediaType(m) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, m),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
        };
        let body = serde_json::json!({ "error": message }).to_string();
        (status, [(header::CONTENT_TYPE, JSON)], body).into_response()
    }
}

/// The JSON content type.
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A `200` JSON answer: `value` as the CLI prints it (pretty, with a final newline).
fn json_response(value: &impl serde::Serialize) -> Result<Response, ApiError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ApiError::Unavailable(format!("cannot encode the answer: {e}")))?;
    Ok(([(header::CONTENT_TYPE, JSON)], format!("{text}\n")).into_response())
}
