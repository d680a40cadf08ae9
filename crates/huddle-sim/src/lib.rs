//! # huddle-sim
//!
//! The scenario machinery behind `huddle demo`, `huddle bench coord` and the
//! end-to-end tests: simulated agents in several in-process relays work a delegated
//! task DAG on a real ledger, and one fold of that ledger judges the run.
//!
//! - [`workload`]: task DAGs with known work per task, their lower bounds and the
//!   `!delegate` text that creates them.
//! - [`driver`]: [`WorkloadDriver`], the simulated agent.
//! - [`meter`]: [`MeteredStore`], a store wrapper counting one relay's claims and
//!   appends.
//! - [`tally`]: [`Tally`], the one report fold of a room (task DAG, board, per-agent
//!   counts, hand-off latencies, every completion and accepted claim).
//! - [`report`]: [`ScenarioReport`], built from a tally after the relays stopped.
//! - [`runner`]: [`run`], which starts the relays, posts the owner's commands and
//!   waits for the room to settle, feeding a [`Progress`] display.
//! - [`coord`] and [`wake`]: the coordination-strategies bench and the wake latency.
//! - [`render`]: the human forms of the reports and of a live view's lines.
//!
//! ```no_run
//! # async fn demo() -> Result<(), huddle_sim::SimError> {
//! use std::time::Duration;
//! use huddle_sim::{run, Quiet, ScenarioOptions, Workload};
//!
//! let workload = Workload::pipeline(60, 1, Duration::from_millis(20));
//! let options = ScenarioOptions {
//!     db: "/tmp/huddle-demo.db".into(),
//!     store: Default::default(),
//!     room: None,
//!     agents: 6,
//!     relays: 3,
//!     config: vec![("allocation".into(), "pull".into())],
//!     failure_rate: 0.0,
//!     seed: 1,
//!     timeout: Duration::from_secs(60),
//!     stall: Duration::from_secs(10),
//!     relay: Default::default(),
//! };
//! let report = run(&options, &workload, &mut Quiet).await?;
//! assert!(report.clean(), "{}", huddle_sim::render::scenario(&report));
//! # Ok(())
//! # }
//! ```
//!
//! Everything a report says comes from the ledger (database clock), except the
//! relays' summaries and the store meters, which the relays' own handles count.
#![warn(missing_docs)]

pub mod coord;
pub mod driver;
pub mod error;
pub mod meter;
pub mod render;
pub mod report;
pub mod runner;
pub mod tally;
pub mod wake;
pub mod workload;

pub use driver::WorkloadDriver;
pub use error::SimError;
pub use meter::{Meter, MeterReport, MeteredStore};
pub use report::{Percentiles, ScenarioReport};
pub use runner::{run, Allocation, Progress, Quiet, ScenarioOptions, OWNER};
pub use tally::{Claim, Completion, StateHashes, Tally};
pub use workload::{agent_names, WorkTask, Workload};
