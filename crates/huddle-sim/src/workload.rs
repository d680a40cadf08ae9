//! Workloads: task DAGs with known work per task, their lower bounds, and the
//! `!delegate` text that creates them in a room.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use huddle_relay::driver::SplitMix64;

/// Most tasks one `!delegate` may carry (the parser's limit).
const DELEGATE_CHUNK: usize = 1000;

/// One task of a workload, with the work a simulated agent spends on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkTask {
    /// Task id.
    pub id: String,
    /// What to do.
    pub label: String,
    /// Tasks that must be done first.
    pub deps: Vec<String>,
    /// How long a simulated agent works on it.
    pub work: Duration,
    /// Tokens a successful turn costs.
    pub tokens: u64,
    /// The `push` assignee, if any.
    pub assignee: Option<String>,
}

/// A task DAG with known work per task, in dependency order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `pipeline`, `independent` or `chain`.
    pub kind: &'static str,
    /// The tasks; every task comes after its dependencies.
    pub tasks: Vec<WorkTask>,
    /// Delegate every task in a `!delegate` of its own (see
    /// [`Workload::delegate_messages`]): the parser then knows no task that waits for
    /// another, so every critical path is the task's own size and the frontier goes by
    /// id alone. The baseline critical-path-first is measured against.
    pub one_task_per_command: bool,
}

/// Milliseconds of work per unit of a task's `[size N]` in the `!delegate` text.
pub const SIZE_UNIT_MS: u64 = 10;

const COMPANIES: &[&str] = &[
    "Acme",
    "Northwind",
    "Globex",
    "Initech",
    "Umbrella",
    "Hooli",
    "Vandelay",
    "Soylent",
    "Tyrell",
    "Cyberdyne",
    "Wonka",
    "Oscorp",
    "Aperture",
    "Monarch",
    "Stark",
    "Wayne",
    "Dunder",
    "Massive",
    "Prestige",
    "Sirius",
];
const SECTORS: &[&str] = &[
    "Analytics",
    "Cloud",
    "Labs",
    "Systems",
    "Data",
    "Networks",
    "Robotics",
    "Health",
    "Pay",
    "Logistics",
];
const SEGMENTS: &[&str] = &[
    "fintech",
    "health",
    "logistics",
    "developer tools",
    "retail",
    "security",
    "data platform",
    "robotics",
];
/// Competitors per segment comparison.
const SEGMENT_SIZE: usize = 8;

fn ms(units: f64, unit: Duration) -> Duration {
    Duration::from_secs_f64((units * unit.as_secs_f64()).max(0.0))
}

impl Workload {
    /// A market-research pipeline of exactly `n` tasks, deterministic from `seed`:
    /// scope → sources / rubric → per competitor fetch → extract → summarize → score
    /// → per-segment comparison → draft → review → publish. Work is `unit` × a
    /// per-stage weight (0.5 – 4) with ±25 % seeded jitter. Fewer than 11 tasks give
    /// independent fetches.
    pub fn pipeline(n: usize, seed: u64, unit: Duration) -> Self {
        let mut rng = SplitMix64::new(seed, "huddle-demo-pipeline");
        let mut tasks = Vec::with_capacity(n);
        let mut push = |id: String, label: String, deps: Vec<String>, weight: f64| {
            let jitter = 0.75 + 0.5 * rng.next_f64();
            let units = weight * jitter;
            tasks.push(WorkTask {
                id,
                label,
                deps,
                work: ms(units, unit),
                tokens: (600.0 * units).round() as u64,
                assignee: None,
            });
        };
        let base = |k: usize| 6 + 4 * k + k.div_ceil(SEGMENT_SIZE);
        let names = company_names(seed, n);
        if n < base(1) {
            for (i, name) in names.iter().enumerate().take(n) {
                push(
                    format!("fetch-{:03}", i + 1),
                    format!("fetch the pricing and product pages of {name}"),
                    Vec::new(),
                    1.0,
                );
            }
            return Workload {
                kind: "pipeline",
                tasks,
                one_task_per_command: false,
            };
        }
        let mut k = 1;
        while base(k + 1) <= n {
            k += 1;
        }
        let extras = n - base(k);
        push(
            "scope".into(),
            "define the research scope and the questions to answer".into(),
            vec![],
            1.0,
        );
        push(
            "sources".into(),
            format!("compile the source list for {k} competitors"),
            vec!["scope".into()],
            1.5,
        );
        push(
            "rubric".into(),
            "draft the scoring rubric (price, features, positioning)".into(),
            vec!["scope".into()],
            1.5,
        );
        for (i, name) in names.iter().enumerate().take(k) {
            let c = i + 1;
            push(
                format!("fetch-{c:03}"),
                format!("fetch the pricing and product pages of {name}"),
                vec!["sources".into()],
                1.0,
            );
            push(
                format!("extract-{c:03}"),
                format!("extract features and prices from the pages of {name}"),
                vec![format!("fetch-{c:03}")],
                1.5,
            );
            push(
                format!("summarize-{c:03}"),
                format!("summarize the positioning of {name} in five bullets"),
                vec![format!("extract-{c:03}")],
                2.0,
            );
            push(
                format!("score-{c:03}"),
                format!("score {name} against the rubric"),
                vec![format!("summarize-{c:03}"), "rubric".into()],
                1.0,
            );
        }
        let segments = k.div_ceil(SEGMENT_SIZE);
        let mut draft_deps = Vec::new();
        for s in 0..segments {
            let members: Vec<String> = (s * SEGMENT_SIZE..((s + 1) * SEGMENT_SIZE).min(k))
                .map(|i| format!("score-{:03}", i + 1))
                .collect();
            let segment = SEGMENTS[s % SEGMENTS.len()];
            let round = s / SEGMENTS.len();
            let label = if round == 0 {
                format!("compare the {segment} segment on price, features and positioning")
            } else {
                format!(
                    "compare the {segment} segment (group {}) on price, features and positioning",
                    round + 1
                )
            };
            let id = format!("compare-{:02}", s + 1);
            draft_deps.push(id.clone());
            push(id, label, members, 2.5);
        }
        for e in 0..extras {
            let id = format!("interview-{}", e + 1);
            draft_deps.push(id.clone());
            push(
                id,
                format!("summarize analyst interview #{}", e + 1),
                vec!["sources".into()],
                2.0,
            );
        }
        push(
            "draft".into(),
            "draft the market report".into(),
            draft_deps,
            4.0,
        );
        push(
            "review".into(),
            "review the report for unsupported claims".into(),
            vec!["draft".into()],
            2.0,
        );
        push(
            "publish".into(),
            "publish the report to the owner".into(),
            vec!["review".into()],
            0.5,
        );
        Workload {
            kind: "pipeline",
            tasks,
            one_task_per_command: false,
        }
    }

    /// The coordination-strategies scenario: `n` independent URLs, each `work` long.
    pub fn independent(n: usize, work: Duration) -> Self {
        let tasks = (1..=n)
            .map(|i| WorkTask {
                id: format!("url-{i:03}"),
                label: format!("fetch and summarize https://competitor-{i:03}.example/pricing"),
                deps: Vec::new(),
                work,
                tokens: 800,
                assignee: None,
            })
            .collect();
        Workload {
            kind: "independent",
            tasks,
            one_task_per_command: false,
        }
    }

    /// A long chain beside short independent work: `chain` steps (`step-01` waits for
    /// nothing, each next one for the one before) and `fan` independent tasks
    /// (`fetch-001`, ...), all `work` long. Handed out by id, agents take the
    /// `fetch-*` tasks first and the chain starts late; critical path first, the chain
    /// starts at once and the fan fills the other agents.
    pub fn chain_and_fan(chain: usize, fan: usize, work: Duration) -> Self {
        let mut tasks = Vec::with_capacity(chain + fan);
        for i in 1..=fan {
            tasks.push(WorkTask {
                id: format!("fetch-{i:03}"),
                label: format!("fetch source {i}"),
                deps: Vec::new(),
                work,
                tokens: 400,
                assignee: None,
            });
        }
        for i in 1..=chain {
            tasks.push(WorkTask {
                id: format!("step-{i:02}"),
                label: format!("build stage {i} on the one before"),
                deps: if i > 1 {
                    vec![format!("step-{:02}", i - 1)]
                } else {
                    Vec::new()
                },
                work,
                tokens: 400,
                assignee: None,
            });
        }
        Workload {
            kind: "chain",
            tasks,
            one_task_per_command: false,
        }
    }

    /// Assigns tasks round-robin to `agents` (the plan an orchestrator would push).
    pub fn assign_round_robin(&mut self, agents: &[String]) {
        if agents.is_empty() {
            return;
        }
        for (i, t) in self.tasks.iter_mut().enumerate() {
            t.assignee = Some(agents[i % agents.len()].clone());
        }
    }

    /// Sum of every task's work.
    pub fn total_work(&self) -> Duration {
        self.tasks.iter().map(|t| t.work).sum()
    }

    /// The work of the longest task.
    pub fn longest_task(&self) -> Duration {
        self.tasks.iter().map(|t| t.work).max().unwrap_or_default()
    }

    /// The longest dependency chain, by work.
    pub fn critical_path(&self) -> Duration {
        let mut finish: HashMap<&str, Duration> = HashMap::new();
        let mut best = Duration::ZERO;
        for t in &self.tasks {
            let start = t
                .deps
                .iter()
                .filter_map(|d| finish.get(d.as_str()))
                .max()
                .copied()
                .unwrap_or_default();
            let end = start + t.work;
            best = best.max(end);
            finish.insert(&t.id, end);
        }
        best
    }

    /// The makespan of a greedy list schedule with zero coordination overhead: each
    /// free agent takes the ready task with the smallest id. What the DAG's shape
    /// allows `agents` agents when claiming costs nothing.
    pub fn greedy_makespan(&self, agents: usize) -> Duration {
        let agents = agents.max(1);
        let index: HashMap<&str, usize> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        let mut missing: Vec<usize> = self.tasks.iter().map(|t| t.deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for (i, t) in self.tasks.iter().enumerate() {
            for d in &t.deps {
                if let Some(&j) = index.get(d.as_str()) {
                    dependents[j].push(i);
                }
            }
        }
        let mut ready: BTreeSet<(&str, usize)> = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| missing[*i] == 0)
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        // (finish time, task) of running tasks.
        let mut running: BTreeSet<(Duration, usize)> = BTreeSet::new();
        let mut now = Duration::ZERO;
        let mut free = agents;
        loop {
            while free > 0 {
                let Some(first) = ready.iter().next().copied() else {
                    break;
                };
                ready.remove(&first);
                running.insert((now + self.tasks[first.1].work, first.1));
                free -= 1;
            }
            let Some(next) = running.iter().next().copied() else {
                return now;
            };
            running.remove(&next);
            now = next.0;
            free += 1;
            for &d in &dependents[next.1] {
                missing[d] -= 1;
                if missing[d] == 0 {
                    ready.insert((self.tasks[d].id.as_str(), d));
                }
            }
        }
    }

    /// The `!delegate` messages that create the workload (at most 1,000 tasks each,
    /// in dependency order, so each message only names tasks created before it; one
    /// per task with [`Workload::one_task_per_command`]). A task's work is its `[size
    /// N]` in units of [`SIZE_UNIT_MS`] (left out at 1), so the critical paths the
    /// parser computes follow the work.
    pub fn delegate_messages(&self) -> Vec<String> {
        let chunk = if self.one_task_per_command {
            1
        } else {
            DELEGATE_CHUNK
        };
        self.tasks
            .chunks(chunk)
            .map(|chunk| {
                let mut text = String::from("!delegate\n");
                for t in chunk {
                    text.push_str(&t.id);
                    text.push_str(": ");
                    text.push_str(&t.label);
                    if !t.deps.is_empty() {
                        text.push_str(" [after ");
                        text.push_str(&t.deps.join(", "));
                        text.push(']');
                    }
                    let size = (t.work.as_millis() as u64)
                        .div_ceil(SIZE_UNIT_MS)
                        .clamp(1, u64::from(huddle_core::tasks::MAX_TASK_SIZE));
                    if size > 1 {
                        text.push_str(&format!(" [size {size}]"));
                    }
                    if let Some(a) = &t.assignee {
                        text.push_str(" @");
                        text.push_str(a);
                    }
                    text.push('\n');
                }
                text
            })
            .collect()
    }
}

/// `k` distinct plausible company names, deterministic from `seed`.
fn company_names(seed: u64, k: usize) -> Vec<String> {
    let mut combos: Vec<String> = COMPANIES
        .iter()
        .flat_map(|c| SECTORS.iter().map(move |s| format!("{c} {s}")))
        .collect();
    let mut rng = SplitMix64::new(seed, "huddle-demo-names");
    for i in (1..combos.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        combos.swap(i, j);
    }
    (0..k)
        .map(|i| {
            let name = &combos[i % combos.len()];
            match i / combos.len() {
                0 => name.clone(),
                r => format!("{name} {}", r + 1),
            }
        })
        .collect()
}

/// Agent keys for `n` agents: first names for small groups, numbered beyond.
pub fn agent_names(n: usize) -> Vec<String> {
    const NAMES: &[&str] = &[
        "ada", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ida", "jo", "kai", "liv",
    ];
    if n <= NAMES.len() {
        NAMES[..n].iter().map(|s| s.to_string()).collect()
    } else {
        (1..=n).map(|i| format!("agent-{i:03}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::Role;

    #[test]
    fn pipeline_has_exactly_n_tasks_in_dependency_order() {
        for n in [1, 5, 10, 11, 14, 15, 40, 99, 300, 1234] {
            let w = Workload::pipeline(n, 7, Duration::from_millis(100));
            assert_eq!(w.tasks.len(), n, "n = {n}");
            let mut seen = std::collections::HashSet::new();
            for t in &w.tasks {
                for d in &t.deps {
                    assert!(seen.contains(d.as_str()), "{} before its dep {d}", t.id);
                }
                assert!(seen.insert(t.id.as_str()), "duplicate id {}", t.id);
            }
        }
    }

    #[test]
    fn pipeline_is_deterministic_from_the_seed() {
        let a = Workload::pipeline(300, 1, Duration::from_millis(100));
        let b = Workload::pipeline(300, 1, Duration::from_millis(100));
        let c = Workload::pipeline(300, 2, Duration::from_millis(100));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn delegate_text_parses_as_one_plan() {
        let w = Workload::pipeline(300, 3, Duration::from_millis(100));
        let msgs = w.delegate_messages();
        assert_eq!(msgs.len(), 1);
        let parsed = huddle_core::owner_command(Role::Owner, &msgs[0]);
        match parsed {
            Some(Ok(huddle_core::OwnerCommand::Delegate(plan))) => {
                assert_eq!(plan.tasks.len(), 300)
            }
            other => panic!("not a delegate plan: {other:?}"),
        }
    }

    #[test]
    fn a_chain_beside_a_fan_gains_from_critical_path_first() {
        let unit = Duration::from_millis(100);
        let w = Workload::chain_and_fan(20, 200, unit);
        assert_eq!(w.critical_path(), 20 * unit);
        // The greedy schedule goes by id: every fetch first, then the chain alone.
        assert_eq!(w.greedy_makespan(10), 40 * unit);
        let one = w.delegate_messages();
        assert_eq!(one.len(), 1);
        assert!(
            one[0].contains("step-02: build stage 2 on the one before [after step-01] [size 10]")
        );
        let apart = Workload {
            one_task_per_command: true,
            ..w
        }
        .delegate_messages();
        assert_eq!(apart.len(), 220);
        assert!(
            apart[200].starts_with("!delegate\nstep-01: "),
            "{}",
            apart[200]
        );
    }

    #[test]
    fn bounds_of_the_independent_scenario() {
        let w = Workload::independent(300, Duration::from_millis(100));
        assert_eq!(w.total_work(), Duration::from_secs(30));
        assert_eq!(w.critical_path(), Duration::from_millis(100));
        assert_eq!(w.greedy_makespan(6), Duration::from_secs(5));
        assert_eq!(w.greedy_makespan(300), Duration::from_millis(100));
        assert_eq!(w.greedy_makespan(1000), Duration::from_millis(100));
    }

    #[test]
    fn greedy_respects_the_critical_path() {
        let w = Workload::pipeline(300, 1, Duration::from_millis(100));
        let g = w.greedy_makespan(1000);
        assert_eq!(g, w.critical_path());
        assert!(w.greedy_makespan(6) >= w.total_work() / 6);
    }
}
