//! `huddle bench sched`: the synchronizer's own cost per task as the DAG grows, with
//! no database, process or clock in the way.
//!
//! One synchronizer hosting `--agents` agents is given `--tasks` independent tasks
//! (or chains, `--lanes`); every intent is answered at once from memory (acquires won,
//! appends become the next ledger rows, turns reply immediately), so the wall time
//! per completed task is the decision and fold work alone: what invariant 12 ("an
//! event costs what it changes") is about. Flat across task counts means incremental.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use clap::Args;
use huddle_core::protocol::{CoordNoteBody, DesignationBody, TurnActivity};
use huddle_core::sync::{ClaimAnswer, ClaimOutcome, TurnOutcome};
use huddle_core::{
    ClaimEpoch, Event, Intent, Interaction, LocalAgent, NewInteraction, Position, Role,
    Synchronizer, Timestamp, Verb,
};
use serde::Serialize;
use serde_json::json;

/// Flags of `huddle bench sched`.
#[derive(Args, Debug, Clone)]
pub struct SchedArgs {
    /// Task counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub tasks: Vec<usize>,
    /// Agents of the one synchronizer.
    #[arg(long, default_value_t = 16)]
    pub agents: usize,
    /// Chains instead of independent tasks (0: independent).
    #[arg(long, default_value_t = 0)]
    pub lanes: usize,
    /// Messages the room's agents answered before the tasks arrive (one designation
    /// note each, folded before the clock starts): a room with a long conversation
    /// behind it.
    #[arg(long, default_value_t = 0)]
    pub history: usize,
    /// JSON report instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One task count.
#[derive(Clone, Debug, Serialize)]
pub struct SchedLine {
    /// Tasks.
    pub tasks: usize,
    /// Tasks done when the run ended (every one, unless the synchronizer stalled).
    pub done: usize,
    /// Wall seconds to fold and hand out every task (creation rows excluded).
    pub seconds: f64,
    /// CPU seconds of the same (the measure on a shared machine).
    pub cpu_seconds: f64,
    /// Tasks completed per CPU second.
    pub per_s: f64,
    /// CPU microseconds per task.
    pub us_per_task: f64,
    /// Events handled per task.
    pub events_per_task: f64,
}

/// A ledger in memory that gives rows positions and times.
struct MemLedger {
    next: u64,
    now: Timestamp,
}

impl MemLedger {
    fn row(&mut self, n: NewInteraction) -> Interaction {
        self.next += 1;
        let id = n.id();
        Interaction::as_read(n, id, Position::new(0, self.next), self.now, "bench", None)
    }
}

/// CPU seconds this thread has used.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the calling thread's CPU clock.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn one(args: &SchedArgs, n: usize) -> SchedLine {
    let room = "bench";
    let agents = (0..args.agents.max(1))
        .map(|i| LocalAgent::new(format!("a{i:03}")))
        .collect();
    let mut sync = Synchronizer::new("r1", [room], agents);
    let mut ledger = MemLedger {
        next: 0,
        now: Timestamp(1_700_000_000_000_000),
    };
    let mut epochs: BTreeMap<String, i64> = BTreeMap::new();
    let mut events: VecDeque<Event> = VecDeque::new();
    let mut rows: Vec<Interaction> = Vec::new();
    sync.handle(Event::Tick { now: ledger.now });
    if args.history > 0 {
        let answered: Vec<Interaction> = (0..args.history)
            .map(|i| {
                let agent = format!("a{:03}", i % args.agents.max(1));
                let message = NewInteraction::new(
                    room,
                    Verb::MessagePosted,
                    "owner",
                    Role::Owner,
                    json!({"text": format!("question {i}")}),
                )
                .id();
                ledger.row(NewInteraction::new(
                    room,
                    Verb::CoordNote,
                    agent.as_str(),
                    Role::Agent,
                    CoordNoteBody::Designation(DesignationBody {
                        message,
                        agent: agent.clone(),
                        epoch: ClaimEpoch(1),
                    })
                    .to_body(),
                ))
            })
            .collect();
        sync.handle(Event::Ledger {
            rows: answered,
            caught_up: true,
        });
    }
    let created: Vec<Interaction> = (0..n)
        .map(|i| {
            let deps: Vec<String> = if args.lanes > 0 && i >= args.lanes {
                vec![format!("t{:06}", i - args.lanes)]
            } else {
                Vec::new()
            };
            ledger.row(NewInteraction::new(
                room,
                Verb::TaskCreated,
                "owner",
                Role::Owner,
                json!({"task": format!("t{i:06}"), "label": "job", "deps": deps}),
            ))
        })
        .collect();
    events.push_back(Event::Ledger {
        rows: created,
        caught_up: true,
    });
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let mut handled = 0u64;
    loop {
        let event = if !rows.is_empty() {
            Event::Ledger {
                rows: std::mem::take(&mut rows),
                caught_up: true,
            }
        } else if let Some(e) = events.pop_front() {
            e
        } else {
            break;
        };
        handled += 1;
        for intent in sync.handle(event) {
            match intent {
                Intent::Acquire {
                    key,
                    holder,
                    then,
                    write,
                    ..
                } => {
                    let expires_at = ledger.now.saturating_add(60_000_000);
                    let mut won = |key: &str| {
                        let e = epochs.entry(key.to_string()).or_insert(0);
                        *e += 1;
                        ClaimAnswer::Won {
                            epoch: ClaimEpoch(*e),
                            expires_at,
                        }
                    };
                    let answer = won(&key);
                    // A chained acquire (a review's drive claim) is won in the same call,
                    // as the relay's store does.
                    let then = then.map(|c| won(&c.key));
                    // A fresh hand-off's rows go in with its claims when they were won
                    // at the epochs the rows carry, as the relay's store does.
                    let written = match (&write, answer.won(), then.and_then(|t| t.won())) {
                        (Some(w), Some(e), t) if e == w.epoch && t == w.then_epoch => {
                            for r in &w.batch {
                                rows.push(ledger.row(r.clone()));
                            }
                            true
                        }
                        _ => false,
                    };
                    events.push_back(Event::ClaimResult(ClaimOutcome {
                        key,
                        holder,
                        answer,
                        then,
                        written,
                    }));
                }
                Intent::Append { batch, .. } => {
                    for r in batch {
                        let row = ledger.row(r);
                        rows.push(row);
                    }
                }
                Intent::StartTurn(start) => {
                    ledger.now = ledger.now.saturating_add(1_000);
                    events.push_back(Event::TurnEnded {
                        turn: start.turn,
                        outcome: TurnOutcome::Replied { text: "ok".into() },
                        tokens: 1,
                        activity: TurnActivity::default(),
                    });
                }
                _ => {}
            }
        }
        if sync.tasks().summary(room).done >= n {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let finished = sync.tasks().summary(room).done;
    let done = finished.max(1);
    SchedLine {
        tasks: n,
        done: finished,
        seconds,
        cpu_seconds: cpu,
        per_s: done as f64 / cpu.max(1e-9),
        us_per_task: cpu * 1e6 / done as f64,
        events_per_task: handled as f64 / done as f64,
    }
}

/// Runs the bench, printing progress to stderr.
pub fn run(args: &SchedArgs) -> Vec<SchedLine> {
    args.tasks
        .iter()
        .map(|&n| {
            eprintln!("scheduling {n} tasks in memory ...");
            one(args, n)
        })
        .collect()
}

/// A markdown table.
pub fn render(args: &SchedArgs, lines: &[SchedLine]) -> String {
    let shape = if args.lanes > 0 {
        format!("{} lanes", args.lanes)
    } else {
        "independent".into()
    };
    let history = if args.history > 0 {
        format!(", {} answered messages before", args.history)
    } else {
        String::new()
    };
    let mut s = format!(
        "one synchronizer, {} agents, {shape}{history}, intents answered from memory\n\n\
         | tasks | wall s | CPU s | tasks per CPU s | CPU µs/task | events/task |\n|---:|---:|---:|---:|---:|---:|\n",
        args.agents
    );
    for l in lines {
        s.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.0} | {:.1} | {:.1} |\n",
            l.tasks, l.seconds, l.cpu_seconds, l.per_s, l.us_per_task, l.events_per_task
        ));
    }
    s
}
