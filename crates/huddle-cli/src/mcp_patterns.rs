//! The pattern tools of `huddle mcp`: quorum decisions, phase barriers and the
//! coordinator lease ([`huddle_agent::pattern_views`]). A second tool router of
//! [`AgentTools`], combined with the first in `AgentTools::new`; glue only, like the
//! task tools.

use huddle_agent::pattern_views::{
    BarrierArgs, BarrierArriveArgs, BarrierOpenArgs, BarrierView, BarrierWritten, CoordinatorLease,
    DecisionArgs, DecisionView, DecisionWritten, DirectiveArgs, LeaseArgs, LeaseNameArgs,
    LeaseWritten, ProposeArgs, VoteArgs,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use super::{answer, AgentTools, Answer};

#[tool_router(router = patterns_router, vis = "pub(super)")]
impl AgentTools {
    #[tool(
        name = "propose",
        description = "Propose a quorum decision: an id, the options (default yes/no), the voters (a list, or a map agent -> weight), an optional quorum (count or weight; default a majority), and `window_ms` for voting. A thin margin (under 10 %, or your `min_margin`) escalates to the room owner instead of committing."
    )]
    async fn propose(&self, Parameters(args): Parameters<ProposeArgs>) -> Answer<DecisionWritten> {
        answer(self.session.propose(args).await)
    }

    #[tool(
        name = "vote",
        description = "Vote on a decision you are a voter of. Your first vote is final; voting again for the same option is a harmless retry."
    )]
    async fn vote(&self, Parameters(args): Parameters<VoteArgs>) -> Answer<DecisionWritten> {
        answer(self.session.vote(args).await)
    }

    #[tool(
        name = "decision",
        description = "A decision's state: status (open, committed, escalated, failed), the chosen option or leader, the tally and who has not voted. With `wait_ms`, waits for the outcome while it is open."
    )]
    async fn decision(&self, Parameters(args): Parameters<DecisionArgs>) -> Answer<DecisionView> {
        answer(self.session.decision(args).await)
    }

    #[tool(
        name = "barrier_open",
        description = "Open a barrier for a phase: the roster that must check in and `timeout_ms`. With `quorum`, the barrier passes at the timeout if that many checked in (the rest are dropped); without, a timeout escalates to the room owner."
    )]
    async fn barrier_open(
        &self,
        Parameters(args): Parameters<BarrierOpenArgs>,
    ) -> Answer<BarrierWritten> {
        answer(self.session.barrier_open(args).await)
    }

    #[tool(
        name = "barrier_arrive",
        description = "Check in at a barrier when you have finished its phase (you must be on its roster, before its timeout). Then call `barrier` with `wait_ms` to wait until the next phase may start."
    )]
    async fn barrier_arrive(
        &self,
        Parameters(args): Parameters<BarrierArriveArgs>,
    ) -> Answer<BarrierWritten> {
        answer(self.session.barrier_arrive(args).await)
    }

    #[tool(
        name = "barrier",
        description = "A barrier's state: waiting (with who is missing), passed (the next phase may start; `dropped` lists who was left behind) or escalated. With `wait_ms`, waits while it is waiting."
    )]
    async fn barrier(&self, Parameters(args): Parameters<BarrierArgs>) -> Answer<BarrierView> {
        answer(self.session.barrier(args).await)
    }

    #[tool(
        name = "lease_acquire",
        description = "Become the coordinator: take the lease (default `coordinator`) for `ttl_ms` (default 90000). Returns its epoch; refused while another agent holds it. Renew it well within the ttl."
    )]
    async fn lease_acquire(&self, Parameters(args): Parameters<LeaseArgs>) -> Answer<LeaseWritten> {
        answer(self.session.lease_acquire(args).await)
    }

    #[tool(
        name = "lease_renew",
        description = "Renew the lease you hold. Refused (stale_claim) once it lapsed and someone else took it: you are no longer the coordinator."
    )]
    async fn lease_renew(&self, Parameters(args): Parameters<LeaseArgs>) -> Answer<LeaseWritten> {
        answer(self.session.lease_renew(args).await)
    }

    #[tool(
        name = "lease_release",
        description = "Give up the lease you hold, so another agent can take it at once."
    )]
    async fn lease_release(
        &self,
        Parameters(args): Parameters<LeaseNameArgs>,
    ) -> Answer<LeaseWritten> {
        answer(self.session.lease_release(args).await)
    }

    #[tool(
        name = "lease_directive",
        description = "As the lease holder, issue a directive (any JSON) to the room. It carries your epoch and is refused once you lost the lease; readers act only on directives whose check is `applies`."
    )]
    async fn lease_directive(
        &self,
        Parameters(args): Parameters<DirectiveArgs>,
    ) -> Answer<LeaseWritten> {
        answer(self.session.lease_directive(args).await)
    }

    #[tool(
        name = "lease",
        description = "The lease's state: vacant, held (by whom, epoch, until when) or lapsed (take it over with lease_acquire), and its latest directives, each checked: act only on `applies`, ignore `stale`."
    )]
    async fn lease(&self, Parameters(args): Parameters<LeaseNameArgs>) -> Answer<CoordinatorLease> {
        answer(self.session.lease(args).await)
    }
}
