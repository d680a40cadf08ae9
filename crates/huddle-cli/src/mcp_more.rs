//! More tools of `huddle mcp` (plan 0021): bids. A second tool router of
//! [`AgentTools`], added to the first in [`AgentTools::new`]; glue only, as in
//! [`crate::mcp`].

use huddle_agent::{BidArgs, BidResult};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use crate::mcp::{answer, AgentTools, Answer};

#[tool_router(router = more_router, vis = "pub(crate)")]
impl AgentTools {
    #[tool(
        name = "task_bid",
        description = "Bid on a ready task while its bid window is open (rooms with `allocation bid`): your `load` is the score, lower wins (default: the tasks you hold). `decline: true` declines instead. One answer per task attempt; the first counts. After the window closes the best bidder claims it with task_claim."
    )]
    async fn task_bid(&self, Parameters(args): Parameters<BidArgs>) -> Answer<BidResult> {
        answer(self.session.task_bid(args).await)
    }
}
