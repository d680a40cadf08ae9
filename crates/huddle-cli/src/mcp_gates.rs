//! The delegation and approval tools of `huddle mcp` (plan 0024): `task_delegate`,
//! `approval_request`, `approval`. A tool router of [`AgentTools`], combined with the
//! others in `AgentTools::new`; glue only, like the task tools.

use huddle_agent::approvals::{ApprovalArgs, ApprovalRequestArgs, ApprovalRequested, ApprovalView};
use huddle_agent::{DelegateArgs, DelegateResult};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use super::{answer, AgentTools, Answer};

#[tool_router(router = gates_router, vis = "pub(super)")]
impl AgentTools {
    #[tool(
        name = "task_delegate",
        description = "Create tasks, one per line as `id: label [after dep1, dep2] [@agent]` (the owner's !delegate grammar and limits; dependencies may name existing tasks, ids must be new). Only for agents the room owner listed with `!config delegators ...`; others are refused (not_delegator). All or nothing: a plan with problems creates nothing and the error lists each problem with its line."
    )]
    async fn task_delegate(
        &self,
        Parameters(args): Parameters<DelegateArgs>,
    ) -> Answer<DelegateResult> {
        answer(self.session.task_delegate(args).await)
    }

    #[tool(
        name = "approval_request",
        description = "Ask the room owner before an action (deploy, send, delete): `action` in one line, optional `details`. Returns an id; the owner answers `!approve ID` or `!deny ID [reason]`. With `wait_ms` (at most 60000) waits for the answer; otherwise check later with `approval`. Act only when the status is `approved`."
    )]
    async fn approval_request(
        &self,
        Parameters(args): Parameters<ApprovalRequestArgs>,
    ) -> Answer<ApprovalRequested> {
        answer(self.session.approval_request(args).await)
    }

    #[tool(
        name = "approval",
        description = "Where an approval request stands: pending, approved or denied (with the owner's reason). With `wait_ms`, waits while it is pending."
    )]
    async fn approval(&self, Parameters(args): Parameters<ApprovalArgs>) -> Answer<ApprovalView> {
        answer(self.session.approval(args).await)
    }
}
