//! The report fold: one incremental fold of a room with everything a report, a live
//! view or a test's assertions need — the task DAG, the board, per-agent counts,
//! hand-off latencies, and every completion and accepted claim with its position.

use std::collections::BTreeMap;

use huddle_core::board::{SubjectKind, TurnFailedBody, TurnRepliedBody};
use huddle_core::protocol::carried_turn;
use huddle_core::tasks::{TaskClaimedBody, TaskCompletedBody};
use huddle_core::{Board, ClaimEpoch, Fold, Interaction, Role, TaskDag, Timestamp, Verb};
use serde::{Deserialize, Serialize};

/// What one agent did, from the ledger.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct AgentTally {
    /// Completions the task fold accepted from it.
    pub tasks_done: u64,
    /// Turns it was prompted for.
    pub turns: u64,
    /// Turns that failed (including cancelled ones).
    pub failed_turns: u64,
    /// Tokens of all its turns.
    pub tokens: u64,
}

/// One `task.completed` row of the room and whether the fold accepted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Position of the row among every row given to [`Tally::apply`].
    pub index: usize,
    /// The task.
    pub task: String,
    /// Who appended it.
    pub actor: String,
    /// The claim epoch it presented.
    pub epoch: ClaimEpoch,
    /// Database time.
    pub at: Timestamp,
    /// Whether the fold counted it: its actor held the task at that epoch.
    pub accepted: bool,
}

/// One `task.claimed` row of the room that the fold accepted: it moved the task's
/// epoch and made its actor the owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Position of the row among every row given to [`Tally::apply`].
    pub index: usize,
    /// The task.
    pub task: String,
    /// The new owner.
    pub actor: String,
    /// The claim epoch.
    pub epoch: ClaimEpoch,
    /// The attempt it started.
    pub attempt: u32,
    /// Database time.
    pub at: Timestamp,
}

/// The board's and the task DAG's state hashes, lower-case hex, as a relay hosting
/// only this room reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateHashes {
    /// Board fold hash.
    pub board: String,
    /// Task DAG fold hash.
    pub tasks: String,
}

/// An incremental fold of one room: the task DAG, the board, and the counts reports
/// and tests need. Give it every row in ledger order; rows of other rooms only
/// advance [`Completion::index`] / [`Claim::index`].
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// The room.
    pub room: String,
    /// The task DAG fold.
    pub dag: TaskDag,
    /// The board fold.
    pub board: Board,
    /// Every `task.completed` row, accepted or not, in ledger order.
    pub completions: Vec<Completion>,
    /// Every accepted `task.claimed` row, in ledger order.
    pub claims: Vec<Claim>,
    /// Task turns that replied (work finished), per task.
    pub worked: BTreeMap<String, u32>,
    /// Per agent.
    pub agents: BTreeMap<String, AgentTally>,
    /// Failed-turn reasons and counts.
    pub failure_reasons: BTreeMap<String, u64>,
    /// Ready → accepted claim, µs, one per accepted claim of a ready task (includes
    /// waiting for a free agent).
    pub claim_waits_us: Vec<i64>,
    /// Pickup: from the later of "the task is ready" and "the claiming agent is
    /// free" (its last turn ended, or it registered) to the accepted claim, µs. The
    /// coordination cost of one hand-off.
    pub pickups_us: Vec<i64>,
    /// When each agent last became free (database time).
    pub free_since: BTreeMap<String, Timestamp>,
    /// Database time of the first `task.created`.
    pub first_created_at: Option<Timestamp>,
    /// Database time of the last accepted completion.
    pub last_done_at: Option<Timestamp>,
    /// Rows of the room folded.
    pub rows: u64,
    /// Rows given to [`Tally::apply`], of any room.
    seen: usize,
}

impl Tally {
    /// An empty tally of `room`.
    pub fn new(room: &str) -> Self {
        Tally {
            room: room.to_string(),
            ..Default::default()
        }
    }

    /// Folds one row (rows of other rooms are counted for positions, not folded).
    pub fn apply(&mut self, row: &Interaction) {
        let index = self.seen;
        self.seen += 1;
        if row.room != self.room {
            return;
        }
        self.rows += 1;
        match row.verb {
            Verb::TaskClaimed => self.claimed(index, row),
            Verb::TaskCompleted => self.completed(index, row),
            _ => {
                if row.verb == Verb::TaskCreated {
                    self.first_created_at.get_or_insert(row.at);
                }
                if row.verb == Verb::AgentRegistered && row.role == Role::Agent {
                    self.agents.entry(row.actor.clone()).or_default();
                    self.free_since.entry(row.actor.clone()).or_insert(row.at);
                }
                self.fold(row);
            }
        }
        // A turn's start or end: its `turn.*` row, or the task row carrying it.
        if row.role == Role::Agent {
            if let Some((verb, body)) = carried_turn(row.verb, &row.body) {
                self.turn(row, verb, body);
            }
        }
    }

    /// A turn's `turn.*` row (`verb`, `body`) by agent `row.actor`.
    fn turn(&mut self, row: &Interaction, verb: Verb, body: &serde_json::Value) {
        match verb {
            Verb::TurnPrompted => {
                self.agents.entry(row.actor.clone()).or_default().turns += 1;
            }
            Verb::TurnReplied => {
                self.free_since.insert(row.actor.clone(), row.at);
                if let Ok(b) = TurnRepliedBody::deserialize(body) {
                    let a = self.agents.entry(row.actor.clone()).or_default();
                    a.tokens += b.tokens;
                    if b.subject.kind == SubjectKind::Task {
                        *self.worked.entry(b.subject.id).or_default() += 1;
                    }
                }
            }
            _ => {
                self.free_since.insert(row.actor.clone(), row.at);
                let a = self.agents.entry(row.actor.clone()).or_default();
                a.failed_turns += 1;
                if let Ok(b) = TurnFailedBody::deserialize(body) {
                    a.tokens += b.tokens;
                    *self.failure_reasons.entry(b.reason).or_default() += 1;
                }
            }
        }
    }

    fn fold(&mut self, row: &Interaction) {
        self.dag.apply(row);
        self.board.apply(row);
    }

    fn claimed(&mut self, index: usize, row: &Interaction) {
        let Some(body) = TaskClaimedBody::parse(&row.body) else {
            return self.fold(row); // the DAG counts it as malformed
        };
        let task = body.task.as_str();
        let since = self.dag.ready_since(&self.room, task);
        let before = self.dag.task(&self.room, task).map(|t| t.epoch);
        self.fold(row);
        let Some(t) = self.dag.task(&self.room, task) else {
            return;
        };
        let accepted = before.is_some_and(|epoch| epoch != t.epoch)
            && t.owner.as_deref() == Some(row.actor.as_str());
        // An accepted claim made its actor the owner, at the claim's epoch.
        let (true, Some(epoch)) = (accepted, t.epoch) else {
            return;
        };
        self.claims.push(Claim {
            index,
            task: task.to_string(),
            actor: row.actor.clone(),
            epoch,
            attempt: t.attempts,
            at: row.at,
        });
        if let Some(since) = since {
            self.claim_waits_us.push((row.at - since).max(0));
            if let Some(free) = self.free_since.get(&row.actor) {
                self.pickups_us.push((row.at - since.max(*free)).max(0));
            }
        }
    }

    fn completed(&mut self, index: usize, row: &Interaction) {
        let body = TaskCompletedBody::parse(&row.body);
        let accepted = body.as_ref().is_some_and(|b| {
            self.dag
                .task(&self.room, &b.task)
                .is_some_and(|t| t.is_held_by(&row.actor, b.epoch))
        });
        self.fold(row);
        let Some(b) = body else {
            return;
        };
        if accepted {
            self.agents.entry(row.actor.clone()).or_default().tasks_done += 1;
            self.last_done_at = Some(row.at);
        }
        self.completions.push(Completion {
            index,
            task: b.task,
            actor: row.actor.clone(),
            epoch: b.epoch,
            at: row.at,
            accepted,
        });
    }

    /// `task.completed` rows per task: every row, or only the accepted ones.
    pub fn completions_per_task(&self, accepted_only: bool) -> BTreeMap<&str, u32> {
        let mut out: BTreeMap<&str, u32> = BTreeMap::new();
        for c in self
            .completions
            .iter()
            .filter(|c| c.accepted || !accepted_only)
        {
            *out.entry(c.task.as_str()).or_default() += 1;
        }
        out
    }

    /// Agents registered on the board.
    pub fn registered(&self) -> usize {
        self.board.room(&self.room).map_or(0, |b| b.agents.len())
    }

    /// Whether every expected task exists and none is ready or claimed.
    pub fn settled(&self, expected: usize) -> bool {
        let s = self.dag.summary(&self.room);
        s.total >= expected && s.ready == 0 && s.claimed == 0
    }

    /// The board's and the task DAG's state hashes.
    pub fn state_hashes(&self) -> StateHashes {
        StateHashes {
            board: hex::encode(self.board.state_hash()),
            tasks: hex::encode(self.dag.state_hash()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::{NewInteraction, Position};
    use huddle_store::{Ledger, StoreOptions};
    use serde_json::{json, Value};

    /// The rows, appended one by one to a fresh in-memory ledger (which, unlike the
    /// SQL backends, does not refuse task rows without a live claim: these tests feed
    /// the fold forged rows on purpose) and read back.
    async fn stored(rows: Vec<(&str, Verb, &str, Role, Value)>) -> Vec<Interaction> {
        let store = huddle_store::memory::MemoryStore::new(StoreOptions::default());
        for (room, verb, actor, role, body) in rows {
            let row = NewInteraction::new(room, verb, actor, role, body);
            store.append(vec![row]).await.expect("append");
        }
        let batch = store
            .read_forward(Position::START, 100)
            .await
            .expect("read back");
        batch.rows
    }

    fn created(task: &str) -> (&'static str, Verb, &'static str, Role, Value) {
        let body = json!({ "task": task, "label": task });
        ("lobby", Verb::TaskCreated, "olga", Role::Owner, body)
    }

    fn claimed<'a>(
        task: &str,
        agent: &'a str,
        epoch: i64,
    ) -> (&'static str, Verb, &'a str, Role, Value) {
        let body = json!({ "task": task, "epoch": epoch, "attempt": 1 });
        ("lobby", Verb::TaskClaimed, agent, Role::Agent, body)
    }

    fn completed<'a>(
        task: &str,
        agent: &'a str,
        epoch: i64,
        n: u32,
    ) -> (&'static str, Verb, &'a str, Role, Value) {
        // `result` keeps otherwise identical rows distinct.
        let body = json!({ "task": task, "epoch": epoch, "result": format!("take {n}") });
        ("lobby", Verb::TaskCompleted, agent, Role::Agent, body)
    }

    #[tokio::test]
    async fn completions_and_claims_are_judged_as_the_task_fold_judges_them() {
        let rows = stored(vec![
            created("a"),
            (
                "elsewhere",
                Verb::MessagePosted,
                "x",
                Role::Agent,
                json!({ "text": "hi" }),
            ),
            claimed("a", "ada", 1),
            // A stale claim (same epoch) and a completion from a non-holder: refused.
            claimed("a", "bo", 1),
            completed("a", "bo", 1, 1),
            completed("a", "ada", 1, 2),
            // A second completion after done: recorded, not accepted.
            completed("a", "ada", 1, 3),
        ])
        .await;
        assert_eq!(rows.len(), 7);
        let mut t = Tally::new("lobby");
        for r in &rows {
            t.apply(r);
        }
        assert_eq!(t.rows, 6, "the other room's row is not folded");
        let claims: Vec<(usize, &str, ClaimEpoch)> = t
            .claims
            .iter()
            .map(|c| (c.index, c.actor.as_str(), c.epoch))
            .collect();
        assert_eq!(claims, vec![(2, "ada", ClaimEpoch(1))]);
        let completions: Vec<(usize, &str, bool)> = t
            .completions
            .iter()
            .map(|c| (c.index, c.actor.as_str(), c.accepted))
            .collect();
        assert_eq!(
            completions,
            vec![(4, "bo", false), (5, "ada", true), (6, "ada", false)]
        );
        assert_eq!(t.completions_per_task(true)["a"], 1);
        assert_eq!(t.completions_per_task(false)["a"], 3);
        assert_eq!(t.agents["ada"].tasks_done, 1);
        assert_eq!(t.agents.get("bo").map_or(0, |a| a.tasks_done), 0);
        assert_eq!(t.claim_waits_us, vec![(rows[2].at - rows[0].at).max(0)]);
        assert_eq!(t.last_done_at, Some(rows[5].at));
    }

    #[tokio::test]
    async fn state_hashes_are_the_folds_hashes_in_hex_and_differ_for_different_states() {
        let rows = stored(vec![created("a"), created("b")]).await;
        let mut one = Tally::new("lobby");
        one.apply(&rows[0]);
        let mut two = one.clone();
        two.apply(&rows[1]);
        let h = one.state_hashes();
        assert_eq!(h.tasks, hex::encode(one.dag.state_hash()));
        assert_eq!(h.board, hex::encode(one.board.state_hash()));
        assert_eq!(h.tasks.len(), 64);
        assert_ne!(h.tasks, two.state_hashes().tasks);
    }

    /// A row as read at position `pos` and database time `at_ms`.
    fn read_at(pos: u64, at_ms: i64, n: NewInteraction) -> Interaction {
        let id = n.id();
        Interaction::as_read(
            n,
            id,
            Position::new(0, pos),
            Timestamp(1_700_000_000_000_000 + at_ms * 1_000),
            "r0",
            None,
        )
    }

    /// The same two task turns (one replied, one failed) written in four rows a turn
    /// and in two (plan 0095, the task rows carrying the turns) tally alike.
    #[test]
    fn turns_carried_by_task_rows_tally_as_turn_rows() {
        let ix =
            |verb, actor: &str, role, body| NewInteraction::new("lobby", verb, actor, role, body);
        let turn = |task: &str, extra: Value| {
            let mut t = json!({"turn": format!("t/lobby/{task}/ada/1.1"),
                               "subject": {"kind": "task", "id": task}, "epoch": 1});
            for (k, v) in extra.as_object().unwrap() {
                t[k] = v.clone();
            }
            t
        };
        // (at ms, task row, its turn row)
        let steps = [
            (
                10,
                (
                    Verb::TaskClaimed,
                    json!({"task": "a", "epoch": 1, "attempt": 1}),
                ),
                (Verb::TurnPrompted, turn("a", json!({"drive_epoch": 1}))),
            ),
            (
                20,
                (
                    Verb::TaskCompleted,
                    json!({"task": "a", "epoch": 1, "result": "ok", "tokens": 7}),
                ),
                (Verb::TurnReplied, turn("a", json!({"tokens": 7}))),
            ),
            (
                30,
                (
                    Verb::TaskClaimed,
                    json!({"task": "b", "epoch": 1, "attempt": 1}),
                ),
                (Verb::TurnPrompted, turn("b", json!({"drive_epoch": 1}))),
            ),
            (
                40,
                (
                    Verb::TaskFailed,
                    json!({"task": "b", "epoch": 1, "reason": "exit 1"}),
                ),
                (
                    Verb::TurnFailed,
                    turn("b", json!({"reason": "exit 1", "tokens": 3})),
                ),
            ),
        ];
        let head = [
            ix(
                Verb::TaskCreated,
                "olga",
                Role::Owner,
                json!({"task": "a", "label": "a"}),
            ),
            ix(
                Verb::TaskCreated,
                "olga",
                Role::Owner,
                json!({"task": "b", "label": "b"}),
            ),
            ix(Verb::AgentRegistered, "ada", Role::Agent, json!({})),
        ];
        let (mut four, mut two) = (Tally::new("lobby"), Tally::new("lobby"));
        let mut pos = 0;
        for row in head {
            pos += 1;
            let r = read_at(pos, 0, row);
            four.apply(&r);
            two.apply(&r);
        }
        for (at, (verb, body), (turn_verb, turn_body)) in steps {
            pos += 1;
            four.apply(&read_at(
                pos,
                at,
                ix(verb, "ada", Role::Agent, body.clone()),
            ));
            four.apply(&read_at(
                pos + 100,
                at,
                ix(turn_verb, "ada", Role::Agent, turn_body.clone()),
            ));
            let mut carrying = body;
            carrying["turn"] = turn_body;
            two.apply(&read_at(pos, at, ix(verb, "ada", Role::Agent, carrying)));
        }
        assert_eq!(four.agents, two.agents);
        assert_eq!(four.agents["ada"].turns, 2);
        assert_eq!(four.agents["ada"].tokens, 10);
        assert_eq!(four.agents["ada"].failed_turns, 1);
        assert_eq!(four.worked, two.worked);
        assert_eq!(four.failure_reasons, two.failure_reasons);
        assert_eq!(four.free_since, two.free_since);
        assert_eq!(four.pickups_us, two.pickups_us);
        assert_eq!(four.board.state_hash(), two.board.state_hash());
        assert_eq!(four.dag.state_hash(), two.dag.state_hash());
    }
}
