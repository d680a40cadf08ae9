//! # huddle-agent
//!
//! What an agent can do in a huddle room by itself, rather than being driven by a
//! relay: read the room (long-polling on the store's doorbell), post, see the board
//! and the task DAG, bid on tasks, claim, renew, complete, fail or release them, and
//! take part in the coordination patterns (quorum decisions, phase barriers, the
//! coordinator lease; [`pattern_views`]). One
//! implementation, [`AgentSession`], serves every front end: `huddle mcp` (the Model
//! Context Protocol) publishes its operations as tools, with the argument and result
//! types of [`views`] as their JSON schemas.
//!
//! The session writes what a relay writes for a task, under the same claim
//! (`task/<room>/<task>`, holder = the agent) and the same fences, so every guarantee
//! of `docs/protocol.md` ("Exactly once") holds for an agent that acts for itself:
//! a completion counts only under the live claim and closes it; a stale one is
//! refused and recorded nowhere. The agent's identity is fixed when the session is
//! opened; no operation takes an actor from its arguments.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use huddle_agent::{AgentSession, views::{ClaimArgs, CompleteArgs}};
//! let store = huddle_store::open("sqlite://huddle.db", Default::default()).await?;
//! let me = AgentSession::open(store, "lobby", "bo", vec!["rust".into()]).await?;
//! if let Some(c) = me.task_claim(ClaimArgs::default()).await?.claimed {
//!     me.task_complete(CompleteArgs {
//!         task: c.task.id.clone(),
//!         result: Some("done".into()),
//!         ..Default::default()
//!     }).await?;
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod approvals;
mod bids;
mod delegate;
pub mod error;
pub mod pattern_views;
mod patterns;
mod progress;
pub mod resource_views;
pub mod resources;
mod reviews;
mod session;
mod shared_state;
mod tasks;
pub mod views;
pub mod watch;

pub use bids::{BidArgs, BidResult};
pub use delegate::{DelegateArgs, DelegateResult};
pub use error::{AgentError, Result};
pub use patterns::{lease_key, Patterns, MAX_WINDOW_MS};
pub use session::{AgentSession, MAX_WAIT_MS};
pub use shared_state::view_of as state_view_of;
