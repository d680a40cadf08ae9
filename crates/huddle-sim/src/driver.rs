//! The simulated agent: a [`Driver`] that works each task of a workload for the time
//! the workload gives it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use huddle_relay::driver::{Driver, SplitMix64, TurnOutcome, TurnRequest};
use tokio_util::sync::CancellationToken;

use crate::workload::Workload;

/// Work and tokens per task id, shared by every agent of a run.
pub type WorkTable = Arc<HashMap<String, (Duration, u64)>>;

/// A simulated agent that works each task for the workload's duration, fails with a
/// seeded probability (each attempt rolls again), and reports the task's tokens.
pub struct WorkloadDriver {
    work: WorkTable,
    failure_rate: f64,
    seed: u64,
    /// Duration of anything that is not a workload task (a message reply).
    other: Duration,
}

impl WorkloadDriver {
    /// A driver for `workload`.
    pub fn new(work: WorkTable, failure_rate: f64, seed: u64, other: Duration) -> Self {
        WorkloadDriver {
            work,
            failure_rate,
            seed,
            other,
        }
    }

    /// The work table of a workload.
    pub fn table(workload: &Workload) -> WorkTable {
        Arc::new(
            workload
                .tasks
                .iter()
                .map(|t| (t.id.clone(), (t.work, t.tokens)))
                .collect(),
        )
    }
}

#[async_trait]
impl Driver for WorkloadDriver {
    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome {
        if request.too_late() {
            return TurnOutcome::NotStarted;
        }
        // A review takes what a message takes, not the task's work.
        let (work, tokens) = request
            .task
            .as_deref()
            .filter(|_| !request.review)
            .and_then(|t| self.work.get(t).copied())
            .unwrap_or((self.other, 100));
        let mut rng = SplitMix64::new(
            self.seed,
            &format!("{}|{}", request.agent, request.subject()),
        );
        let fails = rng.next_f64() < self.failure_rate;
        tracing::trace!(agent = %request.agent, task = ?request.task, "simulated work starts");
        // A failing turn notices part-way through.
        let spent = if fails {
            work.mul_f64(0.25 + 0.5 * rng.next_f64())
        } else {
            work
        };
        tokio::select! {
            _ = cancel.cancelled() => TurnOutcome::Cancelled,
            _ = tokio::time::sleep(spent) => {
                tracing::trace!(agent = %request.agent, task = ?request.task, "simulated work ends");
                if fails {
                    TurnOutcome::failed("simulated failure", tokens / 2)
                } else {
                    let what = request.task.as_deref().unwrap_or("the message");
                    if request.review {
                        return TurnOutcome::replied(
                            format!("ACCEPT: {} reviewed {what}", request.agent),
                            tokens,
                        );
                    }
                    TurnOutcome::replied(format!("{} finished {what}", request.agent), tokens)
                }
            }
        }
    }
}
