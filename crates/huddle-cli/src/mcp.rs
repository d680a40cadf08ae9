//! `huddle mcp`: one agent's operations ([`huddle_agent::AgentSession`]) served as
//! Model Context Protocol tools over stdio. Glue only: every tool is one call into the
//! session, its arguments and results are the session's own types (their JSON
//! schemas are the tools' schemas), and its errors are the session's messages with a
//! code in front.

use std::sync::Arc;

use huddle_agent::views::{
    BoardResult, ClaimArgs, ClaimResult, CompleteArgs, GiveBackArgs, LeaseView, PostArgs, ReadArgs,
    ReadResult, RenewArgs, ReviewArgs, ReviewWritten, TaskWritten, TasksResult, Written,
};
use huddle_agent::{AgentError, AgentSession};
use huddle_store::StoreOptions;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    ErrorData, Implementation, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{tool, tool_handler, tool_router, Json, RoleServer, ServerHandler, ServiceExt};

use crate::mcp_resources;

#[path = "mcp_gates.rs"]
mod gates;
#[path = "mcp_patterns.rs"]
mod patterns;
#[path = "mcp_shared.rs"]
mod shared;

/// What a tool returns: structured content, or an error an agent can act on.
pub(crate) type Answer<T> = Result<Json<T>, String>;

pub(crate) fn answer<T>(r: huddle_agent::Result<T>) -> Answer<T> {
    r.map(Json)
        .map_err(|e: AgentError| format!("[{}] {e}", e.code()))
}

const INSTRUCTIONS: &str = "You are one agent in a huddle room. `read` the room (pass the \
returned `next` as `after`, with `wait_ms` to wait for news), `post` to talk, `board` and \
`tasks` to see who does what. To work: `task_claim` (a task, or the best next one), do the \
work, `task_renew` within the lease if it takes long, then `task_complete` with a short \
result, or `task_fail` with a reason, or `task_release`. In a room that allocates by bids, \
`task_bid` on ready tasks while their window is open; the best bid claims after it. A task \
with a reviewer is `submitted` when completed; its reviewer answers with `task_review` \
(accept, or reject with feedback: the task is offered again, the feedback in its claim; \
`tasks` lists `to_review`). If the \
owner made you a delegator, `task_delegate` creates tasks. Before a risky action (deploy, \
send, delete) ask the owner with `approval_request` and act only once `approval` says \
approved. Decide together with `propose`, `vote` and `decision`; meet at phase barriers \
with `barrier_open`, `barrier_arrive` and `barrier`; coordinate under the lease with \
`lease_acquire`, `lease_renew`, `lease_release`, `lease_directive` and `lease` (act only on \
directives that apply). Take shared files, APIs and build slots with `resource_acquire` \
before using them (and `resource_release` after); share small facts through `state_get` and \
`state_put` with `if_version`. A write after your lease lapsed is refused and recorded nowhere. \
Pass an `idempotency_key` to make a retried write safe. The MCP resources (timeline, board, \
tasks) can be subscribed to, but `read` with `wait_ms` is the dependable way to follow \
the room.";

/// The MCP server of one agent session.
#[derive(Clone)]
pub struct AgentTools {
    pub(crate) session: Arc<AgentSession>,
    tool_router: ToolRouter<Self>,
    /// `resources/subscribe` subscriptions ([`crate::mcp_resources`]).
    subscriptions: Arc<mcp_resources::Subscriptions>,
}

#[tool_router(router = tool_router)]
impl AgentTools {
    /// Tools over `session`.
    pub fn new(session: Arc<AgentSession>) -> Self {
        AgentTools {
            session,
            tool_router: Self::tool_router()
                + Self::more_router()
                + Self::patterns_router()
                + Self::gates_router()
                + Self::shared_router(),
            subscriptions: Default::default(),
        }
    }

    #[tool(
        name = "read",
        description = "Interactions of the room after a cursor (or the newest `limit`), optionally of one thread. With `wait_ms`, waits for something new. Returns `next`, the cursor to pass as `after` next time."
    )]
    async fn read(&self, Parameters(args): Parameters<ReadArgs>) -> Answer<ReadResult> {
        answer(self.session.read(args).await)
    }

    #[tool(
        name = "post",
        description = "Post a message in the room (or a thread) as yourself; `reply_to` a message id to answer it; `@name` mentions address agents."
    )]
    async fn post(&self, Parameters(args): Parameters<PostArgs>) -> Answer<Written> {
        answer(self.session.post(args).await)
    }

    #[tool(
        name = "board",
        description = "Who is doing what: the <coordination> block and the board as data, with task counts."
    )]
    async fn board(&self) -> Answer<BoardResult> {
        answer(self.session.board().await)
    }

    #[tool(
        name = "tasks",
        description = "The task DAG: every task's status, owner, epoch, attempts, dependencies and result; the ready tasks you may claim now; the tasks you hold."
    )]
    async fn tasks(&self) -> Answer<TasksResult> {
        answer(self.session.tasks().await)
    }

    #[tool(
        name = "task_claim",
        description = "Claim a task: the one named, or the best ready one for you (waiting up to `wait_ms` for one). Returns the task, its epoch, the lease expiry and its dependencies' results; `claimed` is null with a `reason` when nothing is claimable, and `settled` is true when no work is left."
    )]
    async fn task_claim(&self, Parameters(args): Parameters<ClaimArgs>) -> Answer<ClaimResult> {
        answer(self.session.task_claim(args).await)
    }

    #[tool(
        name = "task_renew",
        description = "Extend the lease of a task you hold. Call it well within `lease_ms` while you work."
    )]
    async fn task_renew(&self, Parameters(args): Parameters<RenewArgs>) -> Answer<LeaseView> {
        answer(self.session.task_renew(args).await)
    }

    #[tool(
        name = "task_complete",
        description = "Complete a task you hold, with a short result. Refused (and recorded nowhere) when your lease lapsed."
    )]
    async fn task_complete(
        &self,
        Parameters(args): Parameters<CompleteArgs>,
    ) -> Answer<TaskWritten> {
        answer(self.session.task_complete(args).await)
    }

    #[tool(
        name = "task_fail",
        description = "Report that a task you hold failed, with a reason. It is retried (by any agent) until its attempts are used, then fails for good."
    )]
    async fn task_fail(&self, Parameters(args): Parameters<GiveBackArgs>) -> Answer<TaskWritten> {
        answer(self.session.task_fail(args).await)
    }

    #[tool(
        name = "task_release",
        description = "Give a task you hold back without failing it, so another agent can take it (the attempt counts)."
    )]
    async fn task_release(
        &self,
        Parameters(args): Parameters<GiveBackArgs>,
    ) -> Answer<TaskWritten> {
        answer(self.session.task_release(args).await)
    }

    #[tool(
        name = "task_review",
        description = "Your verdict on a task submitted for your review (`tasks` lists `to_review`): `accept` (the task is done, its dependants start) or `reject` with `feedback` saying what must change (the task is offered again with your feedback; after its last round it fails for good)."
    )]
    async fn task_review(&self, Parameters(args): Parameters<ReviewArgs>) -> Answer<ReviewWritten> {
        answer(self.session.task_review(args).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for AgentTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
        )
        .with_server_info(Implementation::new("huddle", env!("CARGO_PKG_VERSION")))
        .with_instructions(format!(
            "{INSTRUCTIONS} You are agent {:?} in room {:?}.",
            self.session.agent(),
            self.session.room()
        ))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(mcp_resources::list(&self.session))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        mcp_resources::read(&self.session, &request.uri)
            .await
            .map(Into::into)
    }

    #[allow(deprecated)] // the subscriptions of protocol versions up to 2025-11-25
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .subscribe(&self.session, request.uri, context.peer)
            .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.unsubscribe(&request.uri).await;
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let uris = requested.resource_subscriptions.as_deref().unwrap_or(&[]);
        let mut accepted = SubscriptionFilter::new();
        let uris = mcp_resources::accepted(&self.session, uris);
        self.subscriptions.baseline_before_ack(&self.session, &uris);
        accepted.resource_subscriptions = Some(uris);
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        let sink = context.sink().clone();
        let start = self
            .subscriptions
            .listen_baseline(&self.session, &uris)
            .await;
        let follow = mcp_resources::follow(
            self.session.clone(),
            start,
            || {
                let uris = uris.clone();
                async move { uris }
            },
            |uri| {
                let sink = sink.clone();
                async move { sink.notify_resource_updated(uri).await.is_ok() }
            },
        );
        tokio::select! {
            _ = context.cancelled() => {}
            _ = follow => {}
        }
        Ok(())
    }
}

/// `huddle mcp --room R --agent KEY`: serves the agent's tools on stdin/stdout until
/// the client closes them.
pub async fn serve_stdio(
    db: &str,
    options: StoreOptions,
    room: &str,
    agent: &str,
    capabilities: Vec<String>,
) -> anyhow::Result<()> {
    let store = huddle_store::open(db, options).await?;
    let session = Arc::new(AgentSession::open(store, room, agent, capabilities).await?);
    tracing::info!(room, agent, "mcp server on stdio");
    // Resources the agent takes stay renewed while the server (for a driven agent:
    // its turn) runs, and are given back when it ends.
    let keeper = huddle_agent::resources::spawn_keeper(session.clone());
    // Tasks it holds are failed once overdue or stalled, as a relay's turns are.
    let watchdog = huddle_agent::watch::spawn_watchdog(session.clone());
    let serve = async {
        AgentTools::new(session.clone())
            .serve(rmcp::transport::stdio())
            .await?
            .waiting()
            .await?;
        anyhow::Ok(())
    };
    // A relay ends a driven agent's turn with SIGTERM to its process group: give the
    // holdings back then too, rather than leaving them to lapse.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let served = tokio::select! {
        r = serve => r,
        _ = terminate.recv() => {
            tracing::info!(room, agent, "terminated: giving back held resources");
            keeper.abort();
            watchdog.abort();
            if let Err(e) = session.release_kept().await {
                tracing::warn!(room, agent, error = %e, "giving back held resources failed; they lapse after their lease");
            }
            session.store().flush().await;
            // The stdio reader blocks its thread until the client closes stdin; the
            // process ends now instead of waiting for that.
            std::process::exit(0);
        }
    };
    keeper.abort();
    watchdog.abort();
    if let Err(e) = session.release_kept().await {
        tracing::warn!(room, agent, error = %e, "giving back held resources failed; they lapse after their lease");
    }
    served
}
