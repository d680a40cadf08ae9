//! Test support shared by the unit tests of every module: one way to turn a
//! writer's interaction into the row a store returns, ledgers with increasing
//! positions, builders for common rows, generated histories and interleavings.
//!
//! It sits beside [`crate::model`] in the layers, so a test of any module may use it
//! without importing a module above its own.
#![allow(dead_code)]

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::fold::Fold;
use crate::model::{Interaction, InteractionId, NewInteraction, Position, Role, Timestamp};
use crate::signing::OwnerSecret;
use crate::verbs::Verb;

/// Builds [`Interaction`]s with increasing positions.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ledger {
    pub rows: Vec<Interaction>,
}

impl Ledger {
    /// Appends an interaction at `at` (µs) and returns it.
    pub fn push(&mut self, n: NewInteraction, at: Timestamp) -> Interaction {
        let i = materialize(n, Position::new(0, self.rows.len() as u64 + 1), at);
        self.rows.push(i.clone());
        i
    }
}

/// Turns a `NewInteraction` into the row a store would return.
pub(crate) fn materialize(n: NewInteraction, position: Position, at: Timestamp) -> Interaction {
    let id = n.id();
    Interaction::as_read(n, id, position, at, "test-relay", None)
}

/// A row as a backend would return it, at ledger position `(0, pos)` and `at` µs,
/// optionally in a thread.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ledger_row(
    pos: u64,
    at: i64,
    room: &str,
    thread: Option<&str>,
    verb: Verb,
    actor: &str,
    role: Role,
    body: Value,
) -> Interaction {
    let mut n = NewInteraction::new(room, verb, actor, role, body);
    n.thread = thread.map(str::to_string);
    materialize(n, Position::new(0, pos), Timestamp(at))
}

/// The key of the test rooms' owner.
pub(crate) fn owner_secret() -> OwnerSecret {
    OwnerSecret::from_seed([0x0e; 32])
}

/// `room.created` at position `(0, pos)` naming `owner` and `key`'s public key.
pub(crate) fn created_with_key(
    pos: u64,
    room: &str,
    owner: &str,
    key: &OwnerSecret,
) -> Interaction {
    ledger_row(
        pos,
        0,
        room,
        None,
        Verb::RoomCreated,
        owner,
        Role::Owner,
        json!({"owner": owner, "key": key.public().to_hex()}),
    )
}

/// A `message.posted` by `actor` with role owner, signed by `key`, at `(0, pos)`.
pub(crate) fn signed_post(
    pos: u64,
    room: &str,
    thread: Option<&str>,
    actor: &str,
    text: &str,
    key: &OwnerSecret,
) -> Interaction {
    let mut n = NewInteraction::new(
        room,
        Verb::MessagePosted,
        actor,
        Role::Owner,
        json!({ "text": text }),
    );
    n.thread = thread.map(str::to_string);
    materialize(key.sign(n), Position::new(0, pos), Timestamp(0))
}

/// One second in µs.
pub(crate) const SEC: i64 = 1_000_000;

/// An interaction as read back, at database time `at` (position 0 until
/// [`positioned`] numbers it).
pub(crate) fn row(
    room: &str,
    verb: Verb,
    actor: &str,
    role: Role,
    at: Timestamp,
    body: Value,
) -> Interaction {
    from_new(NewInteraction::new(room, verb, actor, role, body), at)
}

/// An interaction from a writer's form (position 0 until [`positioned`] numbers it).
pub(crate) fn from_new(n: NewInteraction, at: Timestamp) -> Interaction {
    materialize(n, Position::START, at)
}

/// Numbers rows 1.. in the given ledger order.
pub(crate) fn positioned(rows: Vec<Interaction>) -> Vec<Interaction> {
    rows.into_iter()
        .enumerate()
        .map(|(n, mut r)| {
            r.position = Position::new(0, n as u64 + 1);
            r
        })
        .collect()
}

/// Every interleaving of `rows` that keeps each actor's own order: a shuffle of
/// the actor labels, the k-th occurrence of an actor taking its k-th row.
pub(crate) fn interleaving(rows: Vec<Interaction>) -> impl Strategy<Value = Vec<Interaction>> {
    let labels: Vec<String> = rows.iter().map(|r| r.actor.clone()).collect();
    Just(labels).prop_shuffle().prop_map(move |order| {
        let mut queues: std::collections::BTreeMap<
            String,
            std::collections::VecDeque<Interaction>,
        > = Default::default();
        for r in &rows {
            queues
                .entry(r.actor.clone())
                .or_default()
                .push_back(r.clone());
        }
        positioned(
            order
                .iter()
                .filter_map(|a| queues.get_mut(a).and_then(|q| q.pop_front()))
                .collect(),
        )
    })
}

/// Folds `rows` incrementally, checking at every step that a rebuild from scratch
/// gives the same hash, and returns the final fold.
pub(crate) fn fold_checked<F: Fold + Default + Clone>(rows: &[Interaction]) -> F {
    let mut f = F::default();
    for (n, r) in rows.iter().enumerate() {
        f.apply(r);
        let mut rebuilt = F::default();
        rebuilt.apply_all(&rows[..=n]);
        assert_eq!(
            f.state_hash(),
            rebuilt.state_hash(),
            "rebuild differs after row {n}"
        );
    }
    f
}

/// A new interaction in room `lobby`.
pub(crate) fn ix(verb: Verb, actor: &str, role: Role, body: Value) -> NewInteraction {
    NewInteraction::new("lobby", verb, actor, role, body)
}

/// One interaction in room `lobby` for every verb and body, verb by verb.
pub(crate) fn every_pair(
    verbs: &[Verb],
    bodies: &[Value],
    actor: &str,
    role: Role,
) -> Vec<NewInteraction> {
    verbs
        .iter()
        .flat_map(|v| bodies.iter().map(|b| ix(*v, actor, role, b.clone())))
        .collect()
}

/// `task.created` by the owner.
pub(crate) fn created(task: &str, deps: &[&str]) -> NewInteraction {
    ix(
        Verb::TaskCreated,
        "ana",
        Role::Owner,
        json!({"task": task, "label": format!("do {task}"), "deps": deps}),
    )
}

/// `task.claimed` by `agent`.
pub(crate) fn claimed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    ix(
        Verb::TaskClaimed,
        agent,
        Role::Agent,
        json!({"task": task, "epoch": epoch, "attempt": 1}),
    )
}

/// `task.completed` by `agent`.
pub(crate) fn completed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    ix(
        Verb::TaskCompleted,
        agent,
        Role::Agent,
        json!({"task": task, "epoch": epoch, "result": "ok"}),
    )
}

/// `task.failed` by `agent`.
pub(crate) fn failed(task: &str, agent: &str, epoch: i64) -> NewInteraction {
    ix(
        Verb::TaskFailed,
        agent,
        Role::Agent,
        json!({"task": task, "epoch": epoch, "reason": "boom"}),
    )
}

/// `task.bid` by `agent`.
pub(crate) fn bid(
    task: &str,
    agent: &str,
    attempt: u32,
    caps: &[&str],
    load: u32,
) -> NewInteraction {
    ix(
        Verb::TaskBid,
        agent,
        Role::Agent,
        json!({"task": task, "attempt": attempt, "capabilities": caps, "load": load}),
    )
}

/// `message.posted`.
pub(crate) fn message(actor: &str, role: Role, text: &str) -> NewInteraction {
    ix(Verb::MessagePosted, actor, role, json!({ "text": text }))
}

/// A fixed interaction id for tests.
#[allow(dead_code)]
pub(crate) fn some_id(n: u8) -> InteractionId {
    InteractionId([n; 32])
}

/// One interaction of a generated history, with the indices of the earlier
/// interactions it causally depends on.
#[derive(Clone, Debug)]
pub(crate) struct HistoryEvent {
    pub new: NewInteraction,
    pub at: Timestamp,
    pub deps: Vec<usize>,
}

/// Generates a valid coordination history from a stream of choices: tasks with
/// dependencies created by the owner, claims (epochs from a per-task counter, as the
/// claims table would hand out), re-takes of lapsed claims, completions, failures,
/// bids, rejections, forged and stale completions, presence notes, designations and
/// turns. Each event lists its causal predecessors: the actor's previous event, the
/// previous event fenced by the same claim key, and what the actor must have seen
/// (creation, dependencies' completions).
pub(crate) fn gen_history(n_tasks: usize, n_agents: usize, choices: &[u8]) -> Vec<HistoryEvent> {
    let agents: Vec<String> = (0..n_agents.max(1)).map(|i| format!("a{i}")).collect();
    let mut g = Gen {
        events: Vec::new(),
        last_of_actor: std::collections::BTreeMap::new(),
    };
    // Task graph: deps only on lower indices.
    let mut deps: Vec<Vec<usize>> = Vec::new();
    let mut c = choices.iter().copied().cycle();
    let mut next = || c.next().unwrap_or(0) as usize;
    for i in 0..n_tasks {
        let mut d = Vec::new();
        if i > 0 {
            for _ in 0..(next() % 3) {
                let j = next() % i;
                if !d.contains(&j) {
                    d.push(j);
                }
            }
        }
        deps.push(d);
    }
    let mut created: Vec<Option<usize>> = vec![None; n_tasks];
    let mut done: Vec<Option<usize>> = vec![None; n_tasks];
    let mut owner: Vec<Option<(usize, i64)>> = vec![None; n_tasks];
    let mut epoch: Vec<i64> = vec![0; n_tasks];
    let mut attempts: Vec<u32> = vec![0; n_tasks];
    let mut abandoned: Vec<bool> = vec![false; n_tasks];
    let mut fenced: Vec<Option<usize>> = vec![None; n_tasks];
    let mut bids: Vec<Vec<usize>> = vec![Vec::new(); n_tasks];
    let mut msg_epoch: [i64; 3] = [0; 3];
    let mut msg_last: [Option<usize>; 3] = [None; 3];
    let steps = choices.len();
    for step in 0..steps {
        let op = choices[step] as usize % 10;
        let pick = choices[(step * 7 + 3) % steps] as usize;
        let agent = pick % agents.len();
        let a = agents[agent].clone();
        let ready = |t: usize,
                     created: &Vec<Option<usize>>,
                     done: &Vec<Option<usize>>,
                     owner: &Vec<Option<(usize, i64)>>,
                     abandoned: &Vec<bool>| {
            created[t].is_some()
                && done[t].is_none()
                && owner[t].is_none()
                && !abandoned[t]
                && deps[t].iter().all(|d| done[*d].is_some())
        };
        match op {
            0 => {
                // Create the next task (dependencies may be created later).
                if let Some(t) = (0..n_tasks).find(|t| created[*t].is_none()) {
                    let dnames: Vec<String> = deps[t].iter().map(|d| format!("t{d}")).collect();
                    let body = json!({"task": format!("t{t}"), "label": format!("task {t}"), "deps": dnames});
                    let i = g.push("ana", Role::Owner, Verb::TaskCreated, body, vec![]);
                    created[t] = Some(i);
                }
            }
            1 | 2 => {
                // Claim a ready task.
                let cands: Vec<usize> = (0..n_tasks)
                    .filter(|t| ready(*t, &created, &done, &owner, &abandoned))
                    .collect();
                if cands.is_empty() {
                    continue;
                }
                let t = cands[pick % cands.len()];
                epoch[t] += 1;
                let mut d: Vec<usize> = vec![created[t].unwrap_or(0)];
                d.extend(deps[t].iter().filter_map(|x| done[*x]));
                d.extend(deps[t].iter().filter_map(|x| created[*x]));
                d.extend(fenced[t]);
                d.extend(bids[t].iter().copied());
                let body =
                    json!({"task": format!("t{t}"), "epoch": epoch[t], "attempt": attempts[t] + 1});
                let i = g.push(&a, Role::Agent, Verb::TaskClaimed, body, d);
                fenced[t] = Some(i);
                attempts[t] += 1;
                // Reject every other bidder in the same fenced sequence.
                let losers: Vec<usize> = bids[t].clone();
                bids[t].clear();
                for l in losers {
                    let loser = g.events[l].new.actor.clone();
                    if loser == a {
                        continue;
                    }
                    let body = json!({"task": format!("t{t}"), "attempt": attempts[t], "agent": loser, "winner": a});
                    let j = g.push(&a, Role::Agent, Verb::TaskRejected, body, vec![i]);
                    fenced[t] = Some(j);
                }
                owner[t] = Some((agent, epoch[t]));
                let turn = json!({"turn": format!("t{t}-{}", epoch[t]), "subject": {"kind": "task", "id": format!("t{t}")}, "epoch": epoch[t], "drive_epoch": 1});
                let j = g.push(
                    &a,
                    Role::Agent,
                    Verb::TurnPrompted,
                    turn,
                    fenced[t].into_iter().collect(),
                );
                fenced[t] = Some(j);
            }
            3 | 4 => {
                // The owner completes (or, on 4 with an odd pick, fails).
                let cands: Vec<usize> = (0..n_tasks).filter(|t| owner[*t].is_some()).collect();
                if cands.is_empty() {
                    continue;
                }
                let t = cands[pick % cands.len()];
                let Some((o, e)) = owner[t] else { continue };
                let oa = agents[o].clone();
                let fail = op == 4 && pick % 2 == 1;
                let verb = if fail {
                    Verb::TaskFailed
                } else {
                    Verb::TaskCompleted
                };
                let body =
                    json!({"task": format!("t{t}"), "epoch": e, "reason": "x", "result": "r"});
                let i = g.push(
                    &oa,
                    Role::Agent,
                    verb,
                    body,
                    fenced[t].into_iter().collect(),
                );
                fenced[t] = Some(i);
                let end_verb = if fail {
                    Verb::TurnFailed
                } else {
                    Verb::TurnReplied
                };
                let turn = json!({"turn": format!("t{t}-{e}"), "subject": {"kind": "task", "id": format!("t{t}")}, "epoch": e, "tokens": 5});
                let j = g.push(&oa, Role::Agent, end_verb, turn, vec![i]);
                fenced[t] = Some(j);
                owner[t] = None;
                if fail {
                    if attempts[t] >= 3 {
                        abandoned[t] = true;
                    }
                } else {
                    done[t] = Some(i);
                }
            }
            5 => {
                // A lapsed claim is re-taken by some agent (maybe the same one).
                let cands: Vec<usize> = (0..n_tasks).filter(|t| owner[*t].is_some()).collect();
                if cands.is_empty() {
                    continue;
                }
                let t = cands[pick % cands.len()];
                epoch[t] += 1;
                let body =
                    json!({"task": format!("t{t}"), "epoch": epoch[t], "attempt": attempts[t] + 1});
                let i = g.push(
                    &a,
                    Role::Agent,
                    Verb::TaskClaimed,
                    body,
                    fenced[t].into_iter().collect(),
                );
                fenced[t] = Some(i);
                bids[t].clear();
                if attempts[t] >= 3 {
                    abandoned[t] = true;
                    owner[t] = None;
                } else {
                    attempts[t] += 1;
                    owner[t] = Some((agent, epoch[t]));
                }
            }
            6 => {
                // Bid on a ready task.
                let cands: Vec<usize> = (0..n_tasks)
                    .filter(|t| ready(*t, &created, &done, &owner, &abandoned))
                    .collect();
                if cands.is_empty() {
                    continue;
                }
                let t = cands[pick % cands.len()];
                let mut d: Vec<usize> = vec![created[t].unwrap_or(0)];
                d.extend(deps[t].iter().filter_map(|x| done[*x]));
                d.extend(deps[t].iter().filter_map(|x| created[*x]));
                d.extend(fenced[t]);
                let body = json!({"task": format!("t{t}"), "attempt": attempts[t] + 1, "capabilities": ["x"], "load": pick % 3});
                let i = g.push(&a, Role::Agent, Verb::TaskBid, body, d);
                bids[t].push(i);
            }
            7 => {
                // A forged or stale completion: never from the current owner at its epoch.
                let cands: Vec<usize> = (0..n_tasks).filter(|t| created[*t].is_some()).collect();
                if cands.is_empty() {
                    continue;
                }
                let t = cands[pick % cands.len()];
                let (forger, e) = match owner[t] {
                    Some((o, e)) if o != agent => (a.clone(), e),
                    Some((o, e)) => (agents[o].clone(), e - 1),
                    None => (a.clone(), epoch[t]),
                };
                let body = json!({"task": format!("t{t}"), "epoch": e});
                let mut d: Vec<usize> = fenced[t].into_iter().collect();
                d.extend(created[t]);
                g.push(&forger, Role::Agent, Verb::TaskCompleted, body, d);
            }
            8 => {
                let states = ["working", "idle", "done", "failed"];
                let body = json!({"kind": "presence", "state": states[pick % 4], "note": format!("n{step}")});
                g.push(&a, Role::Agent, Verb::CoordNote, body, vec![]);
            }
            _ => {
                // A designation of one of three messages, epochs from the reply claim.
                let m = pick % 3;
                msg_epoch[m] += 1;
                let body = json!({"kind": "designation", "message": InteractionId([m as u8 + 1; 32]).to_hex(), "agent": a, "epoch": msg_epoch[m]});
                let i = g.push(
                    &a,
                    Role::Agent,
                    Verb::CoordNote,
                    body,
                    msg_last[m].into_iter().collect(),
                );
                msg_last[m] = Some(i);
            }
        }
    }
    g.events
}

struct Gen {
    events: Vec<HistoryEvent>,
    last_of_actor: std::collections::BTreeMap<String, usize>,
}

impl Gen {
    fn push(
        &mut self,
        actor: &str,
        role: Role,
        verb: Verb,
        body: Value,
        mut deps: Vec<usize>,
    ) -> usize {
        let i = self.events.len();
        if let Some(prev) = self.last_of_actor.get(actor) {
            deps.push(*prev);
        }
        deps.sort();
        deps.dedup();
        let new = NewInteraction::new("lobby", verb, actor, role, body).with_caused_by(vec![]);
        // Unique content per event, like real interactions (nonce in the parent).
        let new = new.with_parent(InteractionId(nonce(i)));
        self.events.push(HistoryEvent {
            new,
            at: Timestamp(1_000_000 + (i as i64) * 1_000),
            deps,
        });
        self.last_of_actor.insert(actor.to_string(), i);
        i
    }
}

fn nonce(i: usize) -> [u8; 32] {
    let mut b = [0xEEu8; 32];
    b[..8].copy_from_slice(&(i as u64).to_be_bytes());
    b
}

/// A linear extension of the causal order chosen by `order` (a stream of choices):
/// repeatedly takes one of the events whose predecessors are all placed.
pub(crate) fn linearize(events: &[HistoryEvent], order: &[u16]) -> Vec<Interaction> {
    let n = events.len();
    let mut placed = vec![false; n];
    let mut out = Vec::with_capacity(n);
    let mut k = 0usize;
    while out.len() < n {
        let avail: Vec<usize> = (0..n)
            .filter(|i| !placed[*i] && events[*i].deps.iter().all(|d| placed[*d]))
            .collect();
        let choice = if order.is_empty() {
            0
        } else {
            order[k % order.len()] as usize
        };
        k += 1;
        let i = avail[choice % avail.len()];
        placed[i] = true;
        let e = &events[i];
        out.push(materialize(
            e.new.clone(),
            Position::new(0, out.len() as u64 + 1),
            e.at,
        ));
    }
    out
}

/// A generated history (up to 9 tasks, 3 agents) and a stream of choices for
/// [`linearize`].
pub(crate) fn history_and_order() -> impl Strategy<Value = (Vec<HistoryEvent>, Vec<u16>)> {
    (
        1usize..10,
        1usize..4,
        prop::collection::vec(any::<u8>(), 1..150),
        prop::collection::vec(any::<u16>(), 1..64),
    )
        .prop_map(|(n_tasks, n_agents, choices, order)| {
            (gen_history(n_tasks, n_agents, &choices), order)
        })
}

/// The state hashes of `F` rebuilt over `history` in generation order and in the
/// interleaving `order` chooses: equal when the fold does not depend on how actors'
/// rows interleave.
pub(crate) fn hashes_in_two_orders<F: Fold + Default>(
    history: &[HistoryEvent],
    order: &[u16],
) -> ([u8; 32], [u8; 32]) {
    let reference = F::rebuild(&linearize(history, &[]));
    let shuffled = F::rebuild(&linearize(history, order));
    (reference.state_hash(), shuffled.state_hash())
}
