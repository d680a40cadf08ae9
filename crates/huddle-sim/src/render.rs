//! The human forms: the scenario report, the coordination bench's table, and the
//! lines of a live view.

use std::fmt::Write as _;

use huddle_core::board::PresenceState;

use crate::coord::CoordReport;
use crate::report::ScenarioReport;
use crate::tally::Tally;

/// Seconds with two decimals from milliseconds.
pub fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// The report's first line: whether every task was done exactly once, and how close
/// the run came to the best possible schedule (its makespan over the lower bound).
pub fn verdict(r: &ScenarioReport) -> String {
    let twice = r.duplicated_tasks();
    let worked_twice = r.duplicates.worked_twice;
    let outcome = if r.missed == 0 && twice == 0 && worked_twice == 0 && r.done == r.tasks {
        format!("{}/{} tasks done once each, 0 missed", r.done, r.tasks)
    } else {
        format!(
            "{}/{} tasks done, {} missed, {twice} completed more than once, \
             {worked_twice} worked twice",
            r.done, r.tasks, r.missed
        )
    };
    format!(
        "{outcome}; {:.2} x the best possible schedule",
        r.makespan.ratio
    )
}

/// The human form of a report.
pub fn scenario(r: &ScenarioReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", verdict(r));
    let config = if r.config.is_empty() {
        "defaults".to_string()
    } else {
        r.config
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "room {} on {}: {} tasks ({}), {} agents on {} relays, {config}, failure rate {:.2}",
        r.room, r.backend, r.tasks, r.workload, r.agents, r.relays, r.failure_rate
    );
    if let Some(why) = &r.stopped_early {
        let _ = writeln!(s, "  STOPPED EARLY: {why}");
    }
    let m = &r.makespan;
    let _ = writeln!(
        s,
        "  done        {} / {}   missed {}{}   abandoned {}",
        r.done,
        r.tasks,
        r.missed,
        if r.missed_ids.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                r.missed_ids
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        r.abandoned
    );
    let _ = writeln!(
        s,
        "  duplicates  {} accepted completions   {} tasks with >1 task.completed row ({} rows)   {} tasks worked twice",
        r.duplicates.accepted, r.duplicates.raw_rows, r.duplicates.completed_rows, r.duplicates.worked_twice
    );
    let _ = writeln!(
        s,
        "  makespan    {}   ideal {} = max(work/agents {}, critical path {})   ratio {:.3}",
        secs(m.makespan_ms),
        secs(m.ideal_ms),
        secs(m.work_per_agent_ms),
        secs(m.critical_path_ms),
        m.ratio
    );
    let _ = writeln!(
        s,
        "              vs work/agents {:.3}   vs a zero-overhead greedy schedule ({}) {:.3}   utilisation {:.0} %",
        m.ratio_work,
        secs(m.greedy_ms),
        m.ratio_greedy,
        m.utilisation * 100.0
    );
    let _ = writeln!(
        s,
        "  turns       {} started, {} failed, {} tasks retried ({} extra attempts)",
        r.turns.started, r.turns.failed, r.turns.retried_tasks, r.turns.extra_attempts
    );
    let _ = writeln!(
        s,
        "  claims      pickup (task ready and agent free -> claimed) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms;   ready -> claimed p50 {:.1} ms, p99 {:.1} ms",
        r.pickup.p50_ms, r.pickup.p99_ms, r.pickup.max_ms, r.claim_wait.p50_ms, r.claim_wait.p99_ms
    );
    let _ = writeln!(
        s,
        "  relays      {} (fold hashes {})",
        r.per_relay
            .iter()
            .map(|l| format!(
                "{}: {} agents, {} turns, {}/{} task claims won",
                l.summary.relay,
                l.agents,
                l.summary.turns_started,
                l.store.task_won,
                l.store.task_acquires
            ))
            .collect::<Vec<_>>()
            .join("; "),
        if r.converged { "agree" } else { "DIFFER" }
    );
    let _ = writeln!(s, "  tokens      {}", r.tokens);
    if r.per_agent.len() <= 40 {
        let _ = writeln!(
            s,
            "\n  {:<10} {:<8} {:>6} {:>6} {:>7} {:>8}",
            "agent", "relay", "tasks", "turns", "failed", "tokens"
        );
        for a in &r.per_agent {
            let _ = writeln!(
                s,
                "  {:<10} {:<8} {:>6} {:>6} {:>7} {:>8}",
                a.agent, a.relay, a.tasks_done, a.turns, a.failed_turns, a.tokens
            );
        }
    } else {
        let done: Vec<u64> = r.per_agent.iter().map(|a| a.tasks_done).collect();
        let _ = writeln!(
            s,
            "  per agent   tasks min {} / max {} over {} agents",
            done.iter().min().unwrap_or(&0),
            done.iter().max().unwrap_or(&0),
            done.len()
        );
    }
    s
}

/// The coordination bench's table: one line per agent count, then wake latency.
pub fn coord(r: &CoordReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "coordination scenario on {}: {} {} x {} ms, {} relays, allocation {}, frontier by {}{}{}",
        r.backend,
        r.tasks,
        match r.chain {
            Some(c) => format!("tasks (a {c}-step chain beside independent ones)"),
            None => "independent tasks".to_string(),
        },
        r.task_ms,
        r.relays,
        r.allocation,
        r.order,
        r.max_wakes
            .map(|w| format!(", max wakes/pass {w}"))
            .unwrap_or_default(),
        r.max_tick_ms
            .map(|t| format!(", max tick {t} ms"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "{:>6} {:>5} {:>6} {:>4} {:>10} {:>9} {:>9} {:>6} {:>7} {:>16} {:>13} {:>8} {:>6}",
        "agents",
        "done",
        "missed",
        "dup",
        "turns/task",
        "makespan",
        "ideal",
        "ratio",
        "target",
        "pickup p50/99",
        "claims won/try",
        "acq ms",
        "conv"
    );
    for run in &r.runs {
        let rep = &run.report;
        let (won, tried, acq_ms) = rep.per_relay.iter().fold((0, 0, 0.0), |(w, t, a), l| {
            (
                w + l.store.task_won,
                t + l.store.task_acquires,
                a + l.store.acquire_mean_ms / rep.per_relay.len().max(1) as f64,
            )
        });
        let dup = rep.duplicated_tasks();
        let _ = writeln!(
            s,
            "{:>6} {:>5} {:>6} {:>4} {:>10.2} {:>9} {:>9} {:>6.3} {:>7} {:>16} {:>13} {:>8.2} {:>6}",
            run.agents,
            rep.done,
            rep.missed,
            dup,
            rep.turns_per_task(),
            secs(rep.makespan.makespan_ms),
            secs(rep.makespan.ideal_ms),
            rep.makespan.ratio,
            match run.target {
                Some(t) if run.meets_targets => format!("<={t:.2} ok"),
                Some(t) => format!("<={t:.2} MISS"),
                None if run.meets_targets => "-".to_string(),
                None => "MISS".to_string(),
            },
            format!("{:.0}/{:.0} ms", rep.pickup.p50_ms, rep.pickup.p99_ms),
            format!("{won}/{tried}"),
            acq_ms,
            if rep.converged { "yes" } else { "NO" }
        );
        if let Some(why) = &rep.stopped_early {
            let _ = writeln!(s, "       stopped early: {why}");
        }
    }
    if let Some(w) = &r.wake {
        let _ = writeln!(
            s,
            "wake latency on {} ({} probes at idle, {} lost): append->arrival p50 {:.2} ms p99 {:.2} ms; commit->arrival p50 {:.2} ms p99 {:.2} ms; append alone p50 {:.2} ms",
            w.backend,
            w.samples,
            w.lost,
            w.append_to_arrival.p50_ms,
            w.append_to_arrival.p99_ms,
            w.commit_to_arrival.p50_ms,
            w.commit_to_arrival.p99_ms,
            w.append.p50_ms
        );
    }
    s
}

/// The live view's task line: the fold's counts.
pub fn task_counts(tally: &Tally) -> String {
    let s = tally.dag.summary(&tally.room);
    let failed: u64 = tally.agents.values().map(|a| a.failed_turns).sum();
    format!(
        "ready {} · claimed {} · waiting {} · abandoned {} · failed turns {}",
        s.ready, s.claimed, s.waiting, s.abandoned, failed
    )
}

/// The live view's line for one agent: its relay, tasks done, presence and what it
/// works on, and whether it is working. `None` until the room is on the board.
pub fn agent_status(tally: &Tally, agent: &str, relay: &str) -> Option<(String, bool)> {
    let room = &tally.room;
    let board = tally.board.room(room)?;
    let done = tally.agents.get(agent).map_or(0, |a| a.tasks_done);
    let mut working = false;
    let (state, on) = match board.presence.get(agent) {
        Some(p) => {
            let on =
                p.on.as_ref()
                    .map(|o| {
                        let label = o
                            .label
                            .as_deref()
                            .or_else(|| tally.dag.task(room, &o.id).map(|t| t.label.as_str()))
                            .unwrap_or("");
                        format!("{:<14} {}", o.id, clip(label, 60))
                    })
                    .unwrap_or_default();
            working = p.state == PresenceState::Working;
            (p.state.as_str(), on)
        }
        None => ("-", String::new()),
    };
    Some((
        format!("{agent:<10} {relay:<8} {done:>4} done  {state:<8} {on}"),
        working,
    ))
}

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}
