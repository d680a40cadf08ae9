//! The scenario report: everything a run reports, built from a [`Tally`] of the
//! room after every relay stopped, plus what the relays and their store meters
//! counted.

use std::collections::BTreeMap;
use std::time::Instant;

use huddle_core::{TaskStatus, Timestamp};
use huddle_relay::RelaySummary;
use serde::Serialize;

use crate::meter::MeterReport;
use crate::runner::ScenarioOptions;
use crate::tally::Tally;
use crate::workload::Workload;

/// Percentiles of a sample, milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of samples in µs.
    pub fn of_us(samples: &[i64]) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        let mut v = samples.to_vec();
        v.sort_unstable();
        let at = |p: f64| {
            let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
            round2(v[rank - 1] as f64 / 1000.0)
        };
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64 / 1000.0;
        Percentiles {
            n: v.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: round2(*v.last().unwrap_or(&0) as f64 / 1000.0),
            mean_ms: round2(mean),
        }
    }
}

/// Rounded to two decimals.
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Per-agent line of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AgentLine {
    /// Agent key.
    pub agent: String,
    /// The relay hosting it.
    pub relay: String,
    /// Completions accepted.
    pub tasks_done: u64,
    /// Turns prompted.
    pub turns: u64,
    /// Turns failed.
    pub failed_turns: u64,
    /// Tokens.
    pub tokens: u64,
}

/// Duplicates, three ways.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Duplicates {
    /// Tasks with more than one completion accepted by the task fold (target 0).
    pub accepted: usize,
    /// Tasks with more than one `task.completed` row in the ledger, accepted or not.
    pub raw_rows: usize,
    /// `task.completed` rows in the ledger.
    pub completed_rows: u64,
    /// Tasks whose work finished more than once (a turn replied, e.g. after its claim
    /// was lost); their extra results were never accepted.
    pub worked_twice: usize,
}

/// Makespan against the ideal.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Makespan {
    /// From the `!delegate` message to the last accepted completion (database clock).
    pub makespan_ms: f64,
    /// max(total work ÷ agents, critical path): a lower bound.
    pub ideal_ms: f64,
    /// Total work ÷ agents.
    pub work_per_agent_ms: f64,
    /// The longest dependency chain.
    pub critical_path_ms: f64,
    /// A greedy schedule of the same DAG with zero coordination overhead.
    pub greedy_ms: f64,
    /// makespan ÷ ideal.
    pub ratio: f64,
    /// makespan ÷ (total work ÷ agents).
    pub ratio_work: f64,
    /// makespan ÷ greedy: the share coordination adds.
    pub ratio_greedy: f64,
    /// Total work ÷ (agents × makespan).
    pub utilisation: f64,
}

/// Turn counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Turns {
    /// Turns prompted.
    pub started: u64,
    /// Turns failed (simulated failures, cancellations).
    pub failed: u64,
    /// Done tasks that needed more than one attempt.
    pub retried_tasks: usize,
    /// Attempts beyond the first, over all tasks.
    pub extra_attempts: u64,
    /// Failure reasons and counts.
    pub reasons: BTreeMap<String, u64>,
}

/// One relay's view at the end.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RelayLine {
    /// What the relay returned.
    pub summary: RelaySummary,
    /// What its store handle counted.
    pub store: MeterReport,
    /// Agents it hosted.
    pub agents: usize,
}

/// Everything a scenario run reports.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ScenarioReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The room.
    pub room: String,
    /// Workload kind.
    pub workload: String,
    /// Agents.
    pub agents: usize,
    /// Relays.
    pub relays: usize,
    /// `!config` applied before delegating.
    pub config: BTreeMap<String, String>,
    /// Turn failure probability.
    pub failure_rate: f64,
    /// Tasks delegated.
    pub tasks: usize,
    /// Tasks done.
    pub done: usize,
    /// Tasks not done (abandoned, blocked behind an abandoned task, or left over).
    pub missed: usize,
    /// Tasks failed for good.
    pub abandoned: usize,
    /// Ids of missed tasks (at most 50).
    pub missed_ids: Vec<String>,
    /// Duplicates.
    pub duplicates: Duplicates,
    /// Makespan.
    pub makespan: Makespan,
    /// Ready → claimed (accepted claims), database clock; includes waiting for a
    /// free agent.
    pub claim_wait: Percentiles,
    /// Pickup: max(task ready, agent free) → claimed; the cost of one hand-off.
    pub pickup: Percentiles,
    /// Turns.
    pub turns: Turns,
    /// Tokens over every turn.
    pub tokens: u64,
    /// Per agent.
    pub per_agent: Vec<AgentLine>,
    /// Per relay.
    pub per_relay: Vec<RelayLine>,
    /// Whether every relay folded the same task and board state as the report.
    pub converged: bool,
    /// Whether the run stopped on a timeout or stall instead of settling.
    pub stopped_early: Option<String>,
    /// Wall time of the whole run, ms.
    pub wall_ms: f64,
}

impl ScenarioReport {
    /// Whether the run met the invariants: every task done exactly once.
    pub fn clean(&self) -> bool {
        self.missed == 0 && self.duplicates.accepted == 0 && self.duplicates.raw_rows == 0
    }

    /// Agent turns the relays started (real executions of the driver, not rows) per
    /// completed task: exactly 1.00 when no task ran twice and no turn failed.
    pub fn turns_per_task(&self) -> f64 {
        let started: u64 = self.per_relay.iter().map(|l| l.summary.turns_started).sum();
        started as f64 / self.done.max(1) as f64
    }

    /// Tasks completed more than once, counting accepted completions or raw rows,
    /// whichever finds more.
    pub fn duplicated_tasks(&self) -> usize {
        self.duplicates.accepted.max(self.duplicates.raw_rows)
    }
}

/// What a report is built from.
pub(crate) struct ReportInput<'a> {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// How the scenario ran.
    pub options: &'a ScenarioOptions,
    /// What it ran.
    pub workload: &'a Workload,
    /// A fold of the whole room after every relay stopped.
    pub tally: &'a Tally,
    /// Database time of the first `!delegate`; `None` when nothing was delegated.
    pub delegate_at: Option<Timestamp>,
    /// Agent → relay hosting it.
    pub relay_of: &'a BTreeMap<String, String>,
    /// What each relay returned and counted.
    pub per_relay: Vec<RelayLine>,
    /// Why the run stopped early, if it did.
    pub stopped_early: Option<String>,
    /// When the run started.
    pub wall: Instant,
}

/// Builds the report.
pub(crate) fn report(input: ReportInput<'_>) -> ScenarioReport {
    let ReportInput {
        backend,
        options,
        workload,
        tally,
        delegate_at,
        relay_of,
        per_relay,
        stopped_early,
        wall,
    } = input;
    let room = tally.room.clone();
    let summary = tally.dag.summary(&room);
    let tasks = workload.tasks.len();
    let done = summary.done;
    let missed_ids: Vec<String> = workload
        .tasks
        .iter()
        .filter(|t| {
            tally
                .dag
                .task(&room, &t.id)
                .is_none_or(|x| x.status != TaskStatus::Done)
        })
        .map(|t| t.id.clone())
        .collect();
    let more_than_once =
        |per_task: BTreeMap<&str, u32>| per_task.values().filter(|n| **n > 1).count();
    let duplicates = Duplicates {
        accepted: more_than_once(tally.completions_per_task(true)),
        raw_rows: more_than_once(tally.completions_per_task(false)),
        completed_rows: tally.completions.len() as u64,
        worked_twice: tally.worked.values().filter(|n| **n > 1).count(),
    };
    let agents = options.agents.max(1);
    let work = workload.total_work().as_secs_f64() * 1000.0;
    let per_agent_ms = work / agents as f64;
    let critical = workload.critical_path().as_secs_f64() * 1000.0;
    let greedy = workload.greedy_makespan(agents).as_secs_f64() * 1000.0;
    let ideal = per_agent_ms.max(critical);
    let makespan_ms = tally
        .last_done_at
        .zip(delegate_at)
        .map(|(at, delegate_at)| (at - delegate_at).max(0) as f64 / 1000.0)
        .unwrap_or(0.0);
    let ratio = |x: f64| {
        if x > 0.0 {
            round3(makespan_ms / x)
        } else {
            0.0
        }
    };
    let makespan = Makespan {
        makespan_ms: round2(makespan_ms),
        ideal_ms: round2(ideal),
        work_per_agent_ms: round2(per_agent_ms),
        critical_path_ms: round2(critical),
        greedy_ms: round2(greedy),
        ratio: ratio(ideal),
        ratio_work: ratio(per_agent_ms),
        ratio_greedy: ratio(greedy),
        utilisation: if makespan_ms > 0.0 {
            round3(work / (agents as f64 * makespan_ms))
        } else {
            0.0
        },
    };
    let mut retried_tasks = 0;
    let mut extra_attempts = 0u64;
    if let Some(r) = tally.dag.room(&room) {
        for t in r.tasks.values() {
            extra_attempts += u64::from(t.attempts.saturating_sub(1));
            if t.status == TaskStatus::Done && t.attempts > 1 {
                retried_tasks += 1;
            }
        }
    }
    let turns = Turns {
        started: tally.agents.values().map(|a| a.turns).sum(),
        failed: tally.agents.values().map(|a| a.failed_turns).sum(),
        retried_tasks,
        extra_attempts,
        reasons: tally.failure_reasons.clone(),
    };
    let per_agent: Vec<AgentLine> = tally
        .agents
        .iter()
        .map(|(agent, a)| AgentLine {
            agent: agent.clone(),
            relay: relay_of.get(agent).cloned().unwrap_or_default(),
            tasks_done: a.tasks_done,
            turns: a.turns,
            failed_turns: a.failed_turns,
            tokens: a.tokens,
        })
        .collect();
    let hashes = tally.state_hashes();
    let converged = per_relay
        .iter()
        .all(|r| r.summary.tasks_hash == hashes.tasks && r.summary.board_hash == hashes.board);
    ScenarioReport {
        backend,
        room,
        workload: workload.kind.to_string(),
        agents: options.agents,
        relays: options.relays,
        config: options.config.iter().cloned().collect(),
        failure_rate: options.failure_rate,
        tasks,
        done,
        missed: missed_ids.len(),
        abandoned: summary.abandoned,
        missed_ids: missed_ids.into_iter().take(50).collect(),
        duplicates,
        makespan,
        claim_wait: Percentiles::of_us(&tally.claim_waits_us),
        pickup: Percentiles::of_us(&tally.pickups_us),
        turns,
        tokens: tally.agents.values().map(|a| a.tokens).sum(),
        per_agent,
        per_relay,
        converged,
        stopped_early,
        wall_ms: round2(wall.elapsed().as_secs_f64() * 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).map(|x| x * 1000).collect();
        let p = Percentiles::of_us(&v);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
        assert_eq!(Percentiles::of_us(&[]).n, 0);
    }
}
