//! The shared-resource and shared-state tools of `huddle mcp`
//! ([`huddle_agent::resource_views`]): `resource_acquire`, `resource_renew`,
//! `resource_release`, `resources`, `state_get`, `state_put`, `state_list`. A tool
//! router of [`AgentTools`], combined with the others in `AgentTools::new`; glue
//! only, like the task tools. The server keeps what its agent acquired renewed while
//! it runs and gives it back when it ends ([`super::serve_stdio`]).

use huddle_agent::resource_views::{
    ResourceAcquireArgs, ResourceNamesArgs, ResourcesArgs, ResourcesResult, ResourcesWritten,
    StateGetArgs, StateListResult, StatePutArgs, StateView, StateWritten,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use super::{answer, AgentTools, Answer};

#[tool_router(router = shared_router, vis = "pub(super)")]
impl AgentTools {
    #[tool(
        name = "resource_acquire",
        description = "Take shared resources before you use them: files of the shared working tree as path globs (`file:src/**/*.rs`; `*`, `?`, `**`), or named things (`api:github`, `slot:build`), each `exclusive` (default), `shared`, or `permits` with a count. All are taken together or none; with `wait_ms` waits for them. This server renews them while it runs and gives them back when it ends; release them as soon as you are done. Another agent's commit touching a file you hold exclusively is refused by `huddle guard`."
    )]
    async fn resource_acquire(
        &self,
        Parameters(args): Parameters<ResourceAcquireArgs>,
    ) -> Answer<ResourcesWritten> {
        answer(self.session.resource_acquire(args).await)
    }

    #[tool(
        name = "resource_renew",
        description = "Extend resources you hold (all, or those named), optionally with a new `ttl_ms`. Needed only beyond this server's own renewal (for example after a long pause)."
    )]
    async fn resource_renew(
        &self,
        Parameters(args): Parameters<ResourceNamesArgs>,
    ) -> Answer<ResourcesWritten> {
        answer(self.session.resource_renew(args).await)
    }

    #[tool(
        name = "resource_release",
        description = "Give back resources you hold (all, or those named), so waiting agents can take them."
    )]
    async fn resource_release(
        &self,
        Parameters(args): Parameters<ResourceNamesArgs>,
    ) -> Answer<ResourcesWritten> {
        answer(self.session.resource_release(args).await)
    }

    #[tool(
        name = "resources",
        description = "Who holds which shared resources, how and until when (the database's view); with `path`, only file holdings covering that path. `mine` lists yours."
    )]
    async fn resources(
        &self,
        Parameters(args): Parameters<ResourcesArgs>,
    ) -> Answer<ResourcesResult> {
        answer(self.session.resources(args).await)
    }

    #[tool(
        name = "state_get",
        description = "A shared-state key's current version and value (version 0 and null when never put); `history` adds the earlier versions."
    )]
    async fn state_get(&self, Parameters(args): Parameters<StateGetArgs>) -> Answer<StateView> {
        answer(self.session.state_get(args).await)
    }

    #[tool(
        name = "state_put",
        description = "Write a shared-state key. Pass the version you read as `if_version`: if someone wrote since, nothing is written and the answer gives the current version and value, so apply your change to it and put again. Without `if_version` the last writer wins."
    )]
    async fn state_put(&self, Parameters(args): Parameters<StatePutArgs>) -> Answer<StateWritten> {
        answer(self.session.state_put(args).await)
    }

    #[tool(
        name = "state_list",
        description = "Every shared-state key of the room with its current version and value."
    )]
    async fn state_list(&self) -> Answer<StateListResult> {
        answer(self.session.state_list().await)
    }
}
