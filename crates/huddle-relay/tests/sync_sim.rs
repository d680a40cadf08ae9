//! A deterministic simulation of several relays, each running a `Synchronizer`,
//! against the in-memory store (`huddle_store::memory`) on a manual clock: the same
//! claims and ledger semantics as SQLite and Postgres (the store conformance suite
//! holds it to them), with simulated time.
//!
//! It drives the synchronizers the way `huddle-relay`'s runtime does: feed events,
//! perform intents in order against the store, answer acquires with `ClaimResult`,
//! report turn endings and lost claims. Time moves only when the simulation moves it,
//! so every run is the same.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use huddle_core::config::{Allocation, Responder, RoomConfig};
use huddle_core::sync::{
    ClaimAnswer, ClaimOutcome, ResourcesAnswer, TurnId, TurnOutcome, TurnStart, TurnWork,
};
use huddle_core::{
    ClaimEpoch, Event, Fold, Intent, Interaction, LocalAgent, NewInteraction, Position, Role,
    Synchronizer, TaskDag, TaskStatus, Timestamp, Verb,
};
use huddle_store::memory::{ManualClock, MemoryStore};
use huddle_store::{
    Acquired, ClaimRequest, Claims, Fence, Ledger, Store, StoreError, StoreOptions,
};
use serde_json::json;

const MS: i64 = 1_000; // µs
const S: i64 = 1_000_000; // µs
const T0: Timestamp = Timestamp(1_700_000_000 * S);
const ROOM: &str = "lobby";

// ---------------------------------------------------------------------------------
// Relays
// ---------------------------------------------------------------------------------

struct RunningTurn {
    ends_at: Timestamp,
    outcome: TurnOutcome,
}

struct Relay {
    id: String,
    sync: Synchronizer,
    /// This relay's handle on the shared store.
    store: Arc<MemoryStore>,
    cursor: Position,
    turns: BTreeMap<TurnId, RunningTurn>,
    state: RelayState,
    stopped: bool,
    read_once: bool,
    /// How far behind the ledger this relay reads, µs: its view shows only rows
    /// committed at least this long ago, while its claims are answered by the store
    /// as it is now (a relay whose reads lag, as under load).
    lag: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RelayState {
    Running,
    /// Killed: never stepped again.
    Dead,
    /// Paused (SIGSTOP) until this time, then resumes with its old state.
    PausedUntil(Timestamp),
}

/// How agents behave.
#[derive(Clone)]
struct AgentModel {
    /// How long a task turn takes, µs.
    task_time: i64,
    /// How long a reply turn takes, µs.
    reply_time: i64,
    /// Fail the first attempt of every task whose index is divisible by this.
    fail_every: Option<usize>,
    /// Reviewers reject every task's first submission (and accept the next).
    reject_first: bool,
}

struct Sim {
    /// The owner's handle on the store (the relays hold their own).
    store: MemoryStore,
    /// The store's clock, set to `now` before every write.
    clock: ManualClock,
    /// Every row of the ledger so far, read forward from the store by [`Sim::refresh`].
    rows: Vec<Interaction>,
    /// Fenced appends the store refused.
    refused_appends: usize,
    relays: Vec<Relay>,
    now: Timestamp,
    model: AgentModel,
    /// Turns started, by subject key, across relays.
    started: BTreeMap<String, usize>,
}

fn options(relay: &str) -> StoreOptions {
    StoreOptions {
        relay: relay.to_string(),
        ..StoreOptions::default()
    }
}

impl Sim {
    fn new(layout: &[&[&str]], config: RoomConfig, model: AgentModel) -> Self {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(options("owner-cli"), clock.clone());
        let relays = layout
            .iter()
            .enumerate()
            .map(|(i, agents)| {
                let id = format!("relay{i}");
                let agents = agents
                    .iter()
                    .map(|a| LocalAgent::new(*a).with_capabilities(["work"]))
                    .collect();
                let mut sync = Synchronizer::new(id.clone(), [ROOM], agents);
                sync.handle(Event::Config {
                    room: ROOM.into(),
                    thread: None,
                    config: config.clone(),
                });
                Relay {
                    store: Arc::new(store.handle(options(&id))),
                    id,
                    sync,
                    cursor: Position::START,
                    turns: BTreeMap::new(),
                    state: RelayState::Running,
                    stopped: false,
                    read_once: false,
                    lag: 0,
                }
            })
            .collect();
        Sim {
            store,
            clock,
            rows: Vec::new(),
            refused_appends: 0,
            relays,
            now: T0,
            model,
            started: BTreeMap::new(),
        }
    }

    /// Reads the ledger forward into `rows`.
    async fn refresh(&mut self) {
        let after = self.rows.last().map_or(Position::START, |r| r.position);
        let batch = self
            .store
            .read_forward(after, usize::MAX)
            .await
            .expect("read");
        assert!(
            batch.skipped.is_empty(),
            "corrupt rows: {:?}",
            batch.skipped
        );
        self.rows.extend(batch.rows);
    }

    /// The owner appends rows (e.g. a delegated DAG, messages).
    async fn owner_append(&mut self, rows: Vec<NewInteraction>) {
        self.clock.set(self.now);
        self.store.append(rows).await.expect("owner append");
        self.refresh().await;
    }

    async fn step_relay(&mut self, r: usize) {
        let now = self.now;
        match self.relays[r].state {
            RelayState::Dead => return,
            RelayState::PausedUntil(t) if now < t => return,
            RelayState::PausedUntil(_) => self.relays[r].state = RelayState::Running,
            RelayState::Running => {}
        }
        let mut queue: VecDeque<Event> = VecDeque::new();
        let due = self.relays[r].sync.next_wakeup().is_none_or(|w| now >= w);
        if due {
            queue.push_back(Event::Tick { now });
        }
        let relay = &mut self.relays[r];
        let batch = relay
            .store
            .read_forward(relay.cursor, usize::MAX)
            .await
            .expect("read");
        // A lagging relay sees only the rows committed `lag` ago (the manual clock
        // only moves forward, so they are a prefix).
        let seen_until = now - relay.lag;
        let mut rows = batch.rows;
        if let Some(cut) = rows.iter().position(|row| row.at > seen_until) {
            rows.truncate(cut);
            relay.cursor = rows.last().map_or(relay.cursor, |row| row.position);
        } else {
            relay.cursor = batch.next;
        }
        if !rows.is_empty() || !relay.read_once {
            relay.read_once = true;
            queue.push_back(Event::Ledger {
                rows,
                caught_up: true,
            });
        }
        // Everything committed before `seen_until` is folded.
        queue.push_back(Event::Covered { as_of: seen_until });
        let ended: Vec<TurnId> = self.relays[r]
            .turns
            .iter()
            .filter(|(_, t)| t.ends_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(t) = self.relays[r].turns.remove(&id) {
                queue.push_back(Event::TurnEnded {
                    turn: id,
                    outcome: t.outcome,
                    tokens: 10,
                    activity: Default::default(),
                });
            }
        }
        let mut guard = 0;
        while let Some(ev) = queue.pop_front() {
            guard += 1;
            assert!(guard < 100_000, "event storm on {}", self.relays[r].id);
            let intents = self.relays[r].sync.handle(ev);
            self.perform(r, intents, &mut queue).await;
        }
    }

    /// Performs intents in order against the store, as the relay's executor does.
    async fn perform(&mut self, r: usize, intents: Vec<Intent>, queue: &mut VecDeque<Event>) {
        self.clock.set(self.now);
        let store = Arc::clone(&self.relays[r].store);
        let mut refused: BTreeSet<(String, ClaimEpoch)> = BTreeSet::new();
        for intent in intents {
            match intent {
                Intent::Acquire {
                    key,
                    holder,
                    driver,
                    ttl,
                    then,
                    write,
                    ..
                } => {
                    // A chained acquire goes in one batch with the first, as the
                    // relay's executor sends it; the first with its driver.
                    let mut first = ClaimRequest::new(key.clone(), holder.clone(), ttl);
                    first.driver = driver;
                    let mut requests = vec![first];
                    if let Some(c) = &then {
                        requests.push(
                            ClaimRequest::new(c.key.clone(), c.holder.clone(), c.ttl).after(0),
                        );
                    }
                    // A fresh hand-off's rows go with its claims (plan 0058).
                    let appends: Vec<huddle_store::ConditionalAppend> = write
                        .filter(|w| (requests.len() == 2) == w.then_epoch.is_some())
                        .map(|w| huddle_store::ConditionalAppend {
                            when_won: std::iter::once((0, w.epoch))
                                .chain(w.then_epoch.map(|e| (1, e)))
                                .collect(),
                            rows: w.batch,
                        })
                        .into_iter()
                        .collect();
                    let handoff = store
                        .acquire_and_append(&requests, appends)
                        .await
                        .expect("acquire");
                    let written = handoff.appended.first().is_some_and(Option::is_some);
                    let out = handoff.acquired;
                    let answer_of = |a: &Acquired| {
                        let (epoch, expires_at) = (a.state().epoch, a.state().expires_at);
                        if a.won() {
                            ClaimAnswer::Won { epoch, expires_at }
                        } else if a.closed() {
                            ClaimAnswer::Closed
                        } else {
                            ClaimAnswer::Lost { epoch, expires_at }
                        }
                    };
                    let answer = answer_of(out[0].as_ref().expect("first request is tried"));
                    let then = out.get(1).and_then(|a| a.as_ref()).map(answer_of);
                    queue.push_back(Event::ClaimResult(ClaimOutcome {
                        key,
                        holder,
                        answer,
                        then,
                        written,
                    }));
                }
                Intent::Append {
                    fences,
                    close,
                    batch,
                } => {
                    let fences: Vec<Fence> = fences.iter().map(Fence::from).collect();
                    let appended = store.append_under(&fences, close, batch).await;
                    match appended {
                        Ok(_) => {}
                        Err(StoreError::Fenced { key, epoch, .. }) => {
                            self.refused_appends += 1;
                            refused.insert((key.clone(), epoch));
                            queue.push_back(Event::ClaimLost { key, epoch });
                        }
                        Err(e) => panic!("append on {}: {e}", self.relays[r].id),
                    }
                }
                Intent::StartTurn(start) => {
                    if start
                        .claims
                        .iter()
                        .any(|c| refused.contains(&(c.key.clone(), c.epoch)))
                    {
                        continue;
                    }
                    self.start_turn(r, &start);
                }
                Intent::Renew {
                    key,
                    holder,
                    epoch,
                    ttl,
                } => {
                    let renewed = store.renew(&key, &holder, epoch, ttl).await.expect("renew");
                    if renewed.is_none() {
                        queue.push_back(Event::ClaimLost { key, epoch });
                    }
                }
                Intent::Release { key, holder, epoch } => {
                    store.release(&key, &holder, epoch).await.expect("release");
                }
                Intent::Cancel { turn } => {
                    if self.relays[r].turns.remove(&turn).is_some() {
                        queue.push_back(Event::TurnEnded {
                            turn,
                            outcome: TurnOutcome::Cancelled,
                            tokens: 1,
                            activity: Default::default(),
                        });
                    }
                }
                Intent::AcquireResources {
                    room,
                    holder,
                    wanted,
                    ttl,
                    key,
                    epoch,
                } => {
                    let answer = match store
                        .acquire_resources(&room, &holder, &wanted, ttl)
                        .await
                        .expect("acquire resources")
                    {
                        huddle_store::ResourcesAcquired::Won(held) => ResourcesAnswer::Won(held),
                        huddle_store::ResourcesAcquired::Blocked(b) => ResourcesAnswer::Blocked {
                            until: b.iter().map(|b| b.by.expires_at).min().expect("a blocker"),
                        },
                    };
                    queue.push_back(Event::ResourcesResult { key, epoch, answer });
                }
                Intent::Stopped => self.relays[r].stopped = true,
            }
        }
    }
    fn start_turn(&mut self, r: usize, start: &TurnStart) {
        *self.started.entry(start.subject.key()).or_default() += 1;
        let (time, outcome) = match &start.work {
            TurnWork::Task(t) => {
                let index: usize = t.id.trim_start_matches('t').parse().unwrap_or(1);
                let fail = self
                    .model
                    .fail_every
                    .is_some_and(|k| index.checked_rem(k) == Some(0) && t.attempt == 1);
                let outcome = if fail {
                    TurnOutcome::Failed {
                        reason: "simulated failure".into(),
                    }
                } else {
                    TurnOutcome::Replied {
                        text: format!("result of {}", t.id),
                    }
                };
                (self.model.task_time, outcome)
            }
            TurnWork::Reply(m) => (
                self.model.reply_time,
                TurnOutcome::Replied {
                    text: format!("{} answers {}", start.agent, m.id.short()),
                },
            ),
            TurnWork::Review(v) => (
                self.model.reply_time,
                TurnOutcome::Replied {
                    text: if self.model.reject_first && v.round == 1 {
                        format!("REJECT: {} needs another pass", v.id)
                    } else {
                        format!("ACCEPT {} looks right", v.id)
                    },
                },
            ),
        };
        self.relays[r].turns.insert(
            start.turn.clone(),
            RunningTurn {
                ends_at: self.now + time,
                outcome,
            },
        );
    }

    /// Steps every relay every `step` µs until `done` or `limit` µs; returns the µs
    /// it took.
    async fn run(&mut self, step: i64, limit: i64, done: impl Fn(&Sim) -> bool) -> i64 {
        while self.now < T0 + limit {
            for r in 0..self.relays.len() {
                self.step_relay(r).await;
            }
            self.refresh().await;
            if done(self) {
                return self.now - T0;
            }
            self.now += step;
        }
        panic!("simulation did not finish within {} s", limit / S);
    }

    fn dag(&self) -> TaskDag {
        TaskDag::rebuild(&self.rows)
    }

    fn rows(&self, verb: Verb) -> impl Iterator<Item = &Interaction> {
        self.rows.iter().filter(move |r| r.verb == verb)
    }
}

/// A deterministic DAG: task `i` depends on up to two earlier tasks.
fn delegate(n: usize, assignees: &[&str]) -> (Vec<NewInteraction>, Vec<Vec<usize>>) {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut rows = Vec::new();
    let mut deps = Vec::new();
    for i in 0..n {
        let mut d: Vec<usize> = Vec::new();
        if i > 0 {
            for _ in 0..(rand() % 3) {
                // Mostly recent tasks, so the DAG has depth.
                let back = 1 + (rand() as usize % 20).min(i - 1);
                let j = i - back;
                if !d.contains(&j) {
                    d.push(j);
                }
            }
        }
        let mut body = json!({
            "task": format!("t{i:03}"),
            "label": format!("step {i}"),
            "deps": d.iter().map(|j| format!("t{j:03}")).collect::<Vec<_>>(),
            "needs": ["work"],
        });
        if !assignees.is_empty() {
            body["assignee"] = json!(assignees[i % assignees.len()]);
        }
        rows.push(NewInteraction::new(
            ROOM,
            Verb::TaskCreated,
            "ana",
            Role::Owner,
            body,
        ));
        deps.push(d);
    }
    (rows, deps)
}

fn all_tasks_settled(sim: &Sim) -> bool {
    let dag = sim.dag();
    let s = dag.summary(ROOM);
    s.total > 0 && s.done + s.abandoned == s.total
}

/// Every task completed exactly once (one `task.completed` row, accepted), and no task
/// was claimed before all its dependencies were completed.
async fn check_exactly_once_and_order(sim: &mut Sim, n: usize, deps: &[Vec<usize>]) {
    // Let every relay read the tail of the ledger (a lagging one, once its lag passed).
    let lag = sim.relays.iter().map(|r| r.lag).max().unwrap_or(0);
    for _ in 0..2 + lag / (100 * MS) {
        sim.now += 100 * MS;
        for r in 0..sim.relays.len() {
            sim.step_relay(r).await;
        }
    }
    sim.refresh().await;
    let sim = &*sim;
    let dag = sim.dag();
    let mut completed_at: BTreeMap<String, Position> = BTreeMap::new();
    for r in sim.rows(Verb::TaskCompleted) {
        let task = r.body["task"].as_str().unwrap().to_string();
        assert!(
            completed_at.insert(task.clone(), r.position).is_none(),
            "task {task} has two task.completed rows"
        );
    }
    assert_eq!(completed_at.len(), n, "every task completed");
    for i in 0..n {
        let id = format!("t{i:03}");
        assert_eq!(
            dag.task(ROOM, &id).unwrap().status,
            TaskStatus::Done,
            "{id}"
        );
    }
    for r in sim.rows(Verb::TaskClaimed) {
        let task = r.body["task"].as_str().unwrap();
        let i: usize = task[1..].parse().unwrap();
        for d in &deps[i] {
            let dep = format!("t{d:03}");
            assert!(
                completed_at[&dep] < r.position,
                "{task} claimed before its dependency {dep} completed"
            );
        }
    }
    // Every relay folded the same state.
    let hashes: BTreeSet<[u8; 32]> = sim
        .relays
        .iter()
        .filter(|r| r.state != RelayState::Dead)
        .map(|r| r.sync.tasks().state_hash())
        .collect();
    assert_eq!(hashes.len(), 1, "relays disagree on the task DAG");
    assert_eq!(*hashes.iter().next().unwrap(), dag.state_hash());
}

fn agents(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn layout(names: &[Vec<String>]) -> Vec<Vec<&str>> {
    names
        .iter()
        .map(|v| v.iter().map(String::as_str).collect())
        .collect()
}

async fn run_dag(
    relays: usize,
    per_relay: usize,
    n: usize,
    config: RoomConfig,
    model: AgentModel,
) -> (Sim, Vec<Vec<usize>>, i64) {
    let names: Vec<Vec<String>> = (0..relays)
        .map(|r| agents(&format!("r{r}a"), per_relay))
        .collect();
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, config, model);
    let (rows, deps) = delegate(n, &[]);
    sim.owner_append(rows).await;
    let took = sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    (sim, deps, took)
}

fn model(task_ms: i64) -> AgentModel {
    AgentModel {
        task_time: task_ms * MS,
        reply_time: 500 * MS,
        fail_every: None,
        reject_first: false,
    }
}

/// The makespan of an ideal central scheduler with no coordination cost: whenever an
/// agent is free it takes the lowest ready task at once.
fn greedy_makespan(deps: &[Vec<usize>], agents: usize, duration: i64) -> i64 {
    let n = deps.len();
    let mut done_at: Vec<Option<i64>> = vec![None; n];
    let mut started = vec![false; n];
    let mut free_at = vec![0i64; agents];
    let mut finished = 0;
    let mut now = 0;
    while finished < n {
        for slot in free_at.iter_mut() {
            if *slot > now {
                continue;
            }
            let next = (0..n).find(|i| {
                !started[*i]
                    && deps[*i]
                        .iter()
                        .all(|d| done_at[*d].is_some_and(|t| t <= now))
            });
            if let Some(i) = next {
                started[i] = true;
                done_at[i] = Some(now + duration);
                *slot = now + duration;
                finished += 1;
            }
        }
        now = free_at
            .iter()
            .chain(done_at.iter().flatten())
            .copied()
            .filter(|t| *t > now)
            .min()
            .unwrap_or(now + 1);
    }
    done_at.into_iter().flatten().max().unwrap_or(0)
}

#[tokio::test]
async fn three_hundred_tasks_pull_six_agents_three_relays() {
    let (mut sim, deps, took) = run_dag(3, 2, 300, RoomConfig::default(), model(1_000)).await;
    check_exactly_once_and_order(&mut sim, 300, &deps).await;
    // No duplicate work without failures: one turn per task.
    assert!(sim.started.values().all(|n| *n == 1), "a task ran twice");
    let ideal = greedy_makespan(&deps, 6, S);
    eprintln!(
        "pull 6 agents: makespan {:.1} s, ideal scheduler {:.1} s, ratio {:.2}",
        took as f64 / 1e6,
        ideal as f64 / 1e6,
        took as f64 / ideal as f64
    );
    assert!(
        took * 100 <= ideal * 110,
        "makespan {took} vs ideal {ideal}"
    );
    // Termination is derived: every relay sees the room quiescent.
    for r in &sim.relays {
        assert!(r.sync.is_quiescent(ROOM), "{} not quiescent", r.id);
    }
}

#[tokio::test]
async fn three_hundred_tasks_pull_thirty_agents_three_relays() {
    let (mut sim, deps, took) = run_dag(3, 10, 300, RoomConfig::default(), model(5_000)).await;
    check_exactly_once_and_order(&mut sim, 300, &deps).await;
    assert!(sim.started.values().all(|n| *n == 1), "a task ran twice");
    let ideal = greedy_makespan(&deps, 30, 5 * S);
    eprintln!(
        "pull 30 agents: makespan {:.1} s, ideal scheduler {:.1} s, ratio {:.2}",
        took as f64 / 1e6,
        ideal as f64 / 1e6,
        took as f64 / ideal as f64
    );
    // Coordination costs at most a simulation step or two per DAG level.
    assert!(
        took * 100 <= ideal * 110,
        "makespan {took} vs ideal {ideal}"
    );
}

/// Review gates across relays: every task is reviewed by `rev`, hosted on two relays,
/// which rejects each first submission and accepts the second. Each task is then
/// worked exactly twice (generations 0 and 1), each submission judged exactly once,
/// and no dependant is claimed before its dependency was accepted.
#[tokio::test]
async fn reviews_run_once_per_round_and_gate_dependants() {
    let m = AgentModel {
        reject_first: true,
        ..model(1_000)
    };
    let names = vec![
        vec!["w0".to_string(), "w1".into(), "rev".into()],
        vec!["w2".to_string(), "rev".into()],
        vec!["w3".to_string()],
    ];
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, RoomConfig::default(), m);
    let n = 40;
    let (mut rows, deps) = delegate(n, &[]);
    for r in &mut rows {
        r.body["review"] = json!({"agent": "rev", "rounds": 3});
        r.body["needs"] = json!([]);
    }
    sim.owner_append(rows).await;
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    for _ in 0..2 {
        sim.now += 100 * MS;
        for r in 0..sim.relays.len() {
            sim.step_relay(r).await;
        }
    }
    sim.refresh().await;
    let dag = sim.dag();
    let mut accepted_at: BTreeMap<String, Position> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in sim.rows(Verb::TaskReviewed) {
        let task = r.body["task"].as_str().unwrap().to_string();
        let verdict = r.body["verdict"].as_str().unwrap().to_string();
        if verdict == "accept" {
            accepted_at.insert(task.clone(), r.position);
        }
        verdicts.entry(task).or_default().push(verdict);
    }
    for i in 0..n {
        let id = format!("t{i:03}");
        let t = dag.task(ROOM, &id).unwrap();
        assert_eq!(
            (t.status, t.generation, t.rejections),
            (TaskStatus::Done, 1, 1),
            "{id}"
        );
        assert_eq!(
            verdicts[&id],
            ["reject", "accept"],
            "{id}: one verdict per round"
        );
        assert_eq!(
            sim.started[&format!("task:{id}")],
            2,
            "{id}: worked once per round"
        );
        assert_eq!(
            sim.started[&format!("review:{id}")],
            2,
            "{id}: reviewed once per round"
        );
    }
    let completions = sim.rows(Verb::TaskCompleted).count();
    assert_eq!(completions, 2 * n, "one submission per round");
    for r in sim.rows(Verb::TaskClaimed) {
        let task = r.body["task"].as_str().unwrap();
        let i: usize = task[1..].parse().unwrap();
        for d in &deps[i] {
            let dep = format!("t{d:03}");
            assert!(
                accepted_at[&dep] < r.position,
                "{task} claimed before {dep} was accepted"
            );
        }
    }
    let hashes: BTreeSet<[u8; 32]> = sim
        .relays
        .iter()
        .map(|r| r.sync.tasks().state_hash())
        .collect();
    assert_eq!(hashes.len(), 1, "relays disagree on the task DAG");
}

#[tokio::test]
async fn failures_are_retried_and_still_complete_once() {
    let m = AgentModel {
        fail_every: Some(7),
        ..model(1_000)
    };
    let (mut sim, deps, _) = run_dag(2, 3, 120, RoomConfig::default(), m).await;
    check_exactly_once_and_order(&mut sim, 120, &deps).await;
    let failed = sim.rows(Verb::TaskFailed).count();
    assert_eq!(failed, (0..120).filter(|i| i % 7 == 0).count());
}

/// Relays whose reads lag behind the ledger (by up to more than a turn) decide on
/// views that miss other relays' claims and failures: every task still completes
/// exactly once, and no retry starts before the back-off after its failed attempt —
/// a claim won over a failure the view did not show yet waits for a view that does.
#[tokio::test]
async fn relays_reading_late_still_wait_out_every_back_off() {
    let config = RoomConfig {
        retry_backoff_ms: 3_000,
        ..RoomConfig::default()
    };
    let names: Vec<Vec<String>> = (0..3).map(|r| agents(&format!("r{r}a"), 2)).collect();
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let m = AgentModel {
        fail_every: Some(3),
        ..model(1_000)
    };
    let mut sim = Sim::new(&refs, config.clone(), m);
    sim.relays[1].lag = 1_500 * MS;
    sim.relays[2].lag = 2_500 * MS;
    let n = 60;
    let (rows, deps) = delegate(n, &[]);
    sim.owner_append(rows).await;
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    check_exactly_once_and_order(&mut sim, n, &deps).await;
    // Each task ran once, plus once more for a failed first attempt.
    let failing = (0..n).filter(|i| i % 3 == 0).count();
    assert_eq!(sim.started.values().sum::<usize>(), n + failing);
    assert_eq!(sim.rows(Verb::TaskFailed).count(), failing);
    // Every retry was claimed no earlier than its failure plus the back-off.
    let mut failed_at: BTreeMap<String, (Timestamp, u32)> = BTreeMap::new();
    let mut attempts: BTreeMap<String, u32> = BTreeMap::new();
    let mut retries = 0;
    for r in &sim.rows {
        let Some(task) = r.body["task"].as_str() else {
            continue;
        };
        match r.verb {
            Verb::TaskFailed => {
                failed_at.insert(task.to_string(), (r.at, attempts[task]));
            }
            Verb::TaskClaimed => {
                *attempts.entry(task.to_string()).or_default() += 1;
                if let Some((at, used)) = failed_at.get(task) {
                    let back = huddle_core::pacing::retry_backoff_ms(&config, ROOM, task, *used);
                    let earliest = Timestamp(at.0 + back as i64 * MS);
                    assert!(
                        r.at >= earliest,
                        "{task}: attempt {} claimed at {:?}, before its back-off ended at {earliest:?}",
                        attempts[task],
                        r.at
                    );
                    retries += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!(retries, failing);
}

#[tokio::test]
async fn contract_net_bid_allocation() {
    let config = RoomConfig {
        allocation: Allocation::Bid,
        ..RoomConfig::default()
    };
    let (mut sim, deps, took) = run_dag(2, 3, 100, config, model(3_000)).await;
    check_exactly_once_and_order(&mut sim, 100, &deps).await;
    let bids = sim.rows(Verb::TaskBid).count();
    let rejections = sim.rows(Verb::TaskRejected).count();
    eprintln!(
        "bid: makespan {:.1} s, {bids} bids, {rejections} rejections",
        took as f64 / 1e6
    );
    // Agents bid on one open window at a time; windows that close without a bid
    // fall back to pull, so not every task is bid on.
    assert!(bids > 0 && rejections > 0);
    // Every bidder that did not win its task was told.
    let dag = sim.dag();
    for r in sim.rows(Verb::TaskBid) {
        let task = r.body["task"].as_str().unwrap();
        let attempt = r.body["attempt"].as_u64().unwrap() as u32;
        let t = dag.task(ROOM, task).unwrap();
        if attempt == t.attempts && t.owner.as_deref() != Some(r.actor.as_str()) {
            assert!(
                t.rejected.contains_key(&r.actor),
                "{} never told it lost {task}",
                r.actor
            );
        }
    }
}

#[tokio::test]
async fn push_allocation_goes_to_assignees() {
    let config = RoomConfig {
        allocation: Allocation::Push,
        ..RoomConfig::default()
    };
    let names = vec![agents("p", 2), agents("q", 2)];
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, config, model(1_000));
    let (rows, deps) = delegate(60, &["p0", "q1"]);
    sim.owner_append(rows).await;
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    check_exactly_once_and_order(&mut sim, 60, &deps).await;
    for r in sim.rows(Verb::TaskCompleted) {
        let i: usize = r.body["task"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(r.actor, ["p0", "q1"][i % 2]);
    }
}

#[tokio::test]
async fn a_killed_relay_is_failed_over_within_ttl_and_a_tick() {
    let config = RoomConfig {
        claim_ttl_ms: 4_000,
        ..RoomConfig::default()
    };
    let names = vec![agents("k", 2), agents("m", 2), agents("n", 2)];
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, config, model(2_000));
    let (rows, deps) = delegate(150, &[]);
    sim.owner_append(rows).await;
    // Run a while, then kill relay 0 in the middle of its turns.
    sim.run(100 * MS, 20 * S, |s| s.now >= T0 + 10 * S).await;
    assert!(
        !sim.relays[0].turns.is_empty(),
        "relay 0 should be mid-turn"
    );
    let orphaned: Vec<String> = sim.relays[0]
        .sync
        .live_turns()
        .iter()
        .map(|(t, _, _)| t.0.clone())
        .collect();
    sim.relays[0].state = RelayState::Dead;
    let killed_at = sim.now;
    // Watch the orphaned tasks: each must be claimed again within TTL + one tick (+
    // one simulation step of slack).
    let orphan_tasks: Vec<String> = orphaned
        .iter()
        .map(|t| t.split('/').nth(2).unwrap().to_string())
        .collect();
    let retaken = |s: &Sim| {
        let dag = s.dag();
        orphan_tasks.iter().all(|id| {
            let t = dag.task(ROOM, id).unwrap();
            t.status == TaskStatus::Done || t.claimed_at.is_some_and(|c| c > killed_at)
        })
    };
    sim.run(100 * MS, 3_600 * S, retaken).await;
    let failover = sim.now - killed_at;
    eprintln!("failover after {:.1} s", failover as f64 / 1e6);
    assert!(
        failover <= 4 * S + S + 200 * MS,
        "failover took {failover} µs"
    );
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    check_exactly_once_and_order(&mut sim, 150, &deps).await;
}

#[tokio::test]
async fn a_paused_relay_never_completes_under_its_stale_epoch() {
    let config = RoomConfig {
        claim_ttl_ms: 4_000,
        ..RoomConfig::default()
    };
    let names = vec![agents("s", 2), agents("u", 2)];
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, config, model(3_000));
    let (rows, deps) = delegate(40, &[]);
    sim.owner_append(rows).await;
    sim.run(100 * MS, 20 * S, |s| s.now >= T0 + 2 * S).await;
    assert!(!sim.relays[0].turns.is_empty());
    let held: Vec<String> = sim.relays[0]
        .sync
        .live_turns()
        .iter()
        .map(|(t, _, _)| t.0.split('/').nth(2).unwrap().to_string())
        .collect();
    // Paused for three TTLs: its turns "finish" meanwhile, but its claims lapse.
    let paused_at = sim.now;
    sim.relays[0].state = RelayState::PausedUntil(sim.now + 12 * S);
    // The tasks it held are claimed again within TTL + one reconcile tick (+ one
    // simulation step), long before it resumes.
    let retaken = |s: &Sim| {
        let dag = s.dag();
        held.iter().all(|id| {
            let t = dag.task(ROOM, id).unwrap();
            t.status == TaskStatus::Done || t.claimed_at.is_some_and(|c| c > paused_at)
        })
    };
    sim.run(100 * MS, 3_600 * S, retaken).await;
    let failover = sim.now - paused_at;
    assert!(
        failover <= 4 * S + S + 200 * MS,
        "failover after a pause took {failover} µs"
    );
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    check_exactly_once_and_order(&mut sim, 40, &deps).await;
    assert!(
        sim.refused_appends > 0,
        "stale appends were refused by the fence"
    );
}

#[tokio::test]
async fn exactly_one_reply_per_message_with_three_relays() {
    for responder in [Responder::Race, Responder::RolePriority] {
        let config = RoomConfig {
            responder,
            ..RoomConfig::default()
        };
        // bo is hosted on two relays: drive election picks one of them.
        let layout: Vec<&[&str]> = vec![&["bo", "cy"], &["bo", "dee"], &["eve", "fay"]];
        let mut sim = Sim::new(&layout, config, model(1_000));
        sim.run(100 * MS, 5 * S, |s| s.now >= T0 + S).await;
        let mut ids = Vec::new();
        for i in 0..60 {
            let text = if i % 5 == 0 {
                format!("@fay question {i}")
            } else {
                format!("question {i}")
            };
            let m = NewInteraction::new(
                ROOM,
                Verb::MessagePosted,
                "ana",
                Role::Human,
                json!({ "text": text }),
            );
            ids.push(m.id());
            sim.owner_append(vec![m]).await;
            sim.run(100 * MS, 3_600 * S, |s| {
                s.now >= T0 + S + (i + 1) * 300 * MS
            })
            .await;
        }
        let answered = |s: &Sim| {
            let replied: BTreeSet<&str> = s
                .rows(Verb::TurnReplied)
                .filter_map(|r| r.body["subject"]["id"].as_str())
                .collect();
            ids.iter().all(|id| replied.contains(id.to_hex().as_str()))
        };
        sim.run(100 * MS, 3_600 * S, answered).await;
        sim.run(100 * MS, 3_600 * S, |s| s.now >= T0 + 120 * S)
            .await;
        let mut replies: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in sim
            .rows(Verb::MessagePosted)
            .filter(|r| r.role == Role::Agent)
        {
            replies
                .entry(r.parent.unwrap().to_hex())
                .or_default()
                .push(r.actor.clone());
        }
        for (i, id) in ids.iter().enumerate() {
            let who = replies.get(&id.to_hex()).cloned().unwrap_or_default();
            assert_eq!(
                who.len(),
                1,
                "message {i} answered by {who:?} ({responder:?})"
            );
            if i % 5 == 0 {
                assert_eq!(who, vec!["fay".to_string()], "mentioned agent answers");
            }
        }
        assert_eq!(sim.rows(Verb::TurnReplied).count(), ids.len());
        assert!(
            sim.started.values().all(|n| *n == 1),
            "a reply turn ran twice ({responder:?})"
        );
    }
}

#[tokio::test]
async fn a_silent_designated_responder_degrades_to_a_race() {
    let config = RoomConfig {
        responder: Responder::Designated,
        responder_agent: Some("ghost".into()),
        ..RoomConfig::default()
    };
    let layout: Vec<&[&str]> = vec![&["bo"], &["cy"]];
    let mut sim = Sim::new(&layout, config, model(1_000));
    // ghost registered once and went silent.
    sim.owner_append(vec![NewInteraction::new(
        ROOM,
        Verb::AgentRegistered,
        "ghost",
        Role::Agent,
        json!({}),
    )])
    .await;
    sim.run(100 * MS, 5 * S, |s| s.now >= T0 + S).await;
    let m = NewInteraction::new(
        ROOM,
        Verb::MessagePosted,
        "ana",
        Role::Human,
        json!({"text": "anyone"}),
    );
    let posted_at = sim.now;
    sim.owner_append(vec![m]).await;
    sim.run(100 * MS, 60 * S, |s| {
        s.rows(Verb::TurnPrompted).count() == 1
    })
    .await;
    let prompted = sim.rows(Verb::TurnPrompted).next().unwrap().at;
    assert!(
        prompted - posted_at >= 1_500 * MS,
        "others waited the window"
    );
    assert!(prompted - posted_at <= 1_800 * MS, "and then answered");
    sim.run(100 * MS, 60 * S, |s| s.rows(Verb::TurnReplied).count() == 1)
        .await;
    sim.run(100 * MS, 60 * S, |s| s.now >= T0 + 30 * S).await;
    assert_eq!(sim.rows(Verb::TurnReplied).count(), 1);
}

#[tokio::test]
async fn shutdown_hands_tasks_back() {
    let names = vec![agents("x", 2), agents("y", 2)];
    let l = layout(&names);
    let refs: Vec<&[&str]> = l.iter().map(Vec::as_slice).collect();
    let mut sim = Sim::new(&refs, RoomConfig::default(), model(4_000));
    let (rows, deps) = delegate(30, &[]);
    sim.owner_append(rows).await;
    sim.run(100 * MS, 20 * S, |s| s.now >= T0 + S).await;
    let out = sim.relays[0].sync.handle(Event::Shutdown);
    let mut q = VecDeque::new();
    sim.perform(0, out, &mut q).await;
    while let Some(ev) = q.pop_front() {
        let out = sim.relays[0].sync.handle(ev);
        sim.perform(0, out, &mut q).await;
    }
    sim.refresh().await;
    assert!(sim.relays[0].stopped);
    assert!(sim.rows(Verb::TaskReleased).count() >= 1);
    sim.relays[0].state = RelayState::Dead;
    // The rest finish everything well before a TTL would have lapsed.
    sim.run(100 * MS, 3_600 * S, all_tasks_settled).await;
    check_exactly_once_and_order(&mut sim, 30, &deps).await;
}
