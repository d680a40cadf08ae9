//! The task operations: `tasks`, `task_claim`, `task_renew`, `task_complete`,
//! `task_fail`, `task_release`.
//!
//! They write exactly what a relay writes for a task turn (`docs/protocol.md`,
//! "Exactly once"), fenced by the task claim `task/<room>/<task>` held by the agent.
//! There is no task-drive claim: no relay drives an agent that acts for itself.

use std::time::Duration;

use huddle_core::policy::{claim_right, losing_bidders, retake_right, ClaimRight};
use huddle_core::protocol::task_key_at;
use huddle_core::tasks::{
    truncate_text, Task, TaskClaimedBody, TaskCompletedBody, TaskEndedBody, TaskRejectedBody,
    MAX_RESULT_BYTES,
};
use huddle_core::{ClaimEpoch, NewInteraction, Role, TaskStatus, Timestamp, Verb};
use huddle_store::{Acquired, Fence, StoreError};
use tokio::time::Instant;

use crate::error::{AgentError, Result};
use crate::session::{AgentSession, Folded, MAX_WAIT_MS};
use crate::views::{
    status_name, written, ClaimArgs, ClaimResult, ClaimedTask, CompleteArgs, DependencyView,
    FeedbackView, GiveBackArgs, LeaseView, RenewArgs, TaskView, TaskWritten, TasksResult, Written,
};

/// Most claims one best-next call tries before it reports nothing claimable.
const MAX_TRIES: usize = 16;

/// What one attempt at a named task came to.
enum Try {
    Claimed(Box<ClaimedTask>),
    /// Not this one (held, closed, not claimable any more): why.
    Skip(AgentError),
}

impl AgentSession {
    fn lease_ms(&self, st: &Folded) -> u64 {
        st.config().effective(&self.room, None).claim_ttl_ms.max(1)
    }

    fn task<'a>(&self, st: &'a Folded, id: &str) -> Result<&'a Task> {
        st.dag
            .task(&self.room, id)
            .ok_or_else(|| AgentError::NoTask(id.to_string()))
    }

    fn view(&self, st: &Folded, t: &Task) -> TaskView {
        TaskView::of(t, st.dag.is_ready(&self.room, &t.id))
    }

    /// Who may claim the ready task `t` now; `None` when it is not ready.
    fn right(&self, st: &Folded, t: &Task, now: Timestamp) -> Option<ClaimRight> {
        let since = st.dag.ready_since(&self.room, &t.id)?;
        let config = st.config().effective(&self.room, None);
        Some(claim_right(&config, t, since, now))
    }

    /// Ready tasks this agent may claim now (policy and capabilities), by id.
    fn ready_for_me(&self, st: &Folded, now: Timestamp) -> Vec<String> {
        let config = st.config().effective(&self.room, None);
        st.dag
            .ready_frontier(&self.room)
            .into_iter()
            .filter(|t| {
                // A task waiting out its back-off is nobody's yet, as on every relay.
                !huddle_core::pacing::backing_off(&config, &self.room, t, now)
                    && self
                        .right(st, t, now)
                        .is_some_and(|r| r.allows(&self.agent, &self.capabilities, t))
            })
            .map(|t| t.id.clone())
            .collect()
    }

    /// `tasks`: the DAG, and the ready tasks this agent may claim now.
    pub async fn tasks(&self) -> Result<TasksResult> {
        let now = self.store.now().await?;
        let st = self.synced().await?;
        let Some(room) = st.dag.room(&self.room) else {
            return Ok(TasksResult {
                summary: Default::default(),
                ready_for_you: Vec::new(),
                yours: Vec::new(),
                to_review: Vec::new(),
                tasks: Vec::new(),
            });
        };
        let ready_for_you = self.ready_for_me(&st, now);
        let yours = st
            .dag
            .claimed(&self.room)
            .into_iter()
            .filter(|t| t.owner.as_deref() == Some(self.agent.as_str()))
            .map(|t| t.id.clone())
            .collect();
        let to_review = st
            .dag
            .in_review(&self.room)
            .filter(|t| t.review.as_ref().is_some_and(|r| r.agent == self.agent))
            .map(|t| t.id.clone())
            .collect();
        Ok(TasksResult {
            summary: st.dag.summary(&self.room).into(),
            ready_for_you,
            yours,
            to_review,
            tasks: room.tasks.values().map(|t| self.view(&st, t)).collect(),
        })
    }

    /// `task_claim`: the named task, or the best next one for this agent (waiting up
    /// to `wait_ms` for one).
    pub async fn task_claim(&self, args: ClaimArgs) -> Result<ClaimResult> {
        if let Some(id) = args.task.as_deref() {
            let mut st = self.synced().await?;
            let now = self.store.now().await?;
            let t = self.task(&st, id)?;
            if let Some(why) = self.benched_why(&st, now) {
                return Err(not_claimable(id, why));
            }
            match t.status {
                TaskStatus::Done | TaskStatus::Abandoned | TaskStatus::Cancelled => {
                    return Err(AgentError::NotClaimable {
                        task: id.to_string(),
                        why: format!("it is {} already; nothing to do", status_name(t)),
                    })
                }
                TaskStatus::Submitted => {
                    return Err(AgentError::NotClaimable {
                        task: id.to_string(),
                        why: format!(
                            "its work was submitted for review by {}; it is claimable again \
                             only if the reviewer rejects it",
                            t.review
                                .as_ref()
                                .map_or("its reviewer", |r| r.agent.as_str())
                        ),
                    })
                }
                TaskStatus::Open => match self.right(&st, t, now) {
                    None => {
                        return Err(AgentError::NotClaimable {
                            task: id.to_string(),
                            why: format!(
                                "its dependencies are not all done ({}); claim it once they are",
                                t.deps.join(", ")
                            ),
                        })
                    }
                    Some(r) if !r.allows(&self.agent, &self.capabilities, t) => {
                        return Err(AgentError::NotClaimable {
                            task: id.to_string(),
                            why: refusal(&r, t),
                        })
                    }
                    Some(_) => {
                        let config = st.config().effective(&self.room, None);
                        if let Some(at) = huddle_core::pacing::retry_at(&config, &self.room, t)
                            .filter(|at| now < *at)
                        {
                            return Err(backing_off(id, at));
                        }
                    }
                },
                // Held: the store grants it only once the lease lapsed (or to us).
                TaskStatus::Claimed => {
                    let config = st.config().effective(&self.room, None);
                    if !retake_right(&config, t).allows(&self.agent, &self.capabilities, t) {
                        return Err(AgentError::NotClaimable {
                            task: id.to_string(),
                            why: "you lack a capability it needs".into(),
                        });
                    }
                }
            }
            return match self.try_claim(&mut st, id).await? {
                Try::Claimed(c) => Ok(ClaimResult {
                    claimed: Some(*c),
                    reason: None,
                    settled: false,
                }),
                Try::Skip(why) => Err(why),
            };
        }
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        let deadline = Instant::now() + wait;
        loop {
            let result = self.claim_best().await?;
            if result.claimed.is_some() || result.settled || !self.wait_for_news(deadline).await {
                return Ok(result);
            }
        }
    }

    /// One pass of best-next: ready tasks this agent may take, in an order of its
    /// own; then held tasks whose lease should have lapsed.
    async fn claim_best(&self) -> Result<ClaimResult> {
        let mut st = self.synced().await?;
        let now = self.store.now().await?;
        if let Some(why) = self.benched_why(&st, now) {
            return Ok(ClaimResult {
                claimed: None,
                reason: Some(why),
                settled: false,
            });
        }
        let lease_us = (self.lease_ms(&st) as i64).saturating_mul(1000);
        let mut ready = self.ready_for_me(&st, now);
        ready.sort_by_cached_key(|id| (spread(&self.agent, &self.room, id), id.clone()));
        let config = st.config().effective(&self.room, None);
        let mut lapsed: Vec<(Timestamp, String)> = st
            .dag
            .claimed(&self.room)
            .into_iter()
            .filter_map(|t| {
                let at = t.claimed_at?;
                (at.saturating_add(lease_us) <= now
                    && retake_right(&config, t).allows(&self.agent, &self.capabilities, t))
                .then(|| (at, t.id.clone()))
            })
            .collect();
        lapsed.sort();
        let candidates = ready
            .into_iter()
            .chain(lapsed.into_iter().map(|(_, id)| id))
            .take(MAX_TRIES);
        let mut skipped = 0usize;
        for id in candidates {
            match self.try_claim(&mut st, &id).await? {
                Try::Claimed(c) => {
                    return Ok(ClaimResult {
                        claimed: Some(*c),
                        reason: None,
                        settled: false,
                    })
                }
                Try::Skip(_) => skipped += 1,
            }
        }
        let s = st.dag.summary(&self.room);
        let settled = s.ready == 0 && s.claimed == 0 && s.waiting == 0;
        let reason = if settled {
            format!(
                "no task is left to do in this room ({} done, {} abandoned, {} blocked)",
                s.done, s.abandoned, s.blocked
            )
        } else {
            format!(
                "nothing is claimable for you now ({} ready, {} held by agents, {} waiting for dependencies{}); call task_claim with wait_ms, or read with wait_ms, and try again",
                s.ready,
                s.claimed,
                s.waiting,
                if skipped > 0 {
                    format!("; {skipped} taken by others just now")
                } else {
                    String::new()
                }
            )
        };
        Ok(ClaimResult {
            claimed: None,
            reason: Some(reason),
            settled,
        })
    }

    /// Acquires `task/<room>/<id>` and, once the fold has read up to the acquisition,
    /// records the claim as the relay would.
    async fn try_claim(&self, st: &mut Folded, id: &str) -> Result<Try> {
        let generation = self.generation_of(st, id);
        let key = task_key_at(&self.room, id, generation);
        let lease_ms = self.lease_ms(st);
        let won = match self
            .store
            .acquire(&key, &self.agent, Duration::from_millis(lease_ms))
            .await?
        {
            Acquired::Won(c) => c,
            Acquired::HeldBy(c) => {
                return Ok(Try::Skip(AgentError::HeldBy {
                    task: id.to_string(),
                    holder: c.holder,
                    epoch: c.epoch,
                    expires_at: c.expires_at,
                }))
            }
            Acquired::Closed { .. } => {
                return Ok(Try::Skip(not_claimable(
                    id,
                    "it is finished (its claim is closed); nothing to do".into(),
                )))
            }
        };
        // Act on the claim only with the ledger read up to the acquisition.
        self.catch_up(st).await?;
        let epoch = won.epoch;
        let fence = Fence {
            key: key.clone(),
            holder: self.agent.clone(),
            epoch,
        };
        let t = self.task(st, id)?.clone();
        if t.is_held_by(&self.agent, epoch) {
            st.mine.insert(id.to_string(), epoch);
            st.activity.insert(id.to_string(), Instant::now());
            return Ok(Try::Claimed(Box::new(self.claimed(
                st,
                &t,
                epoch,
                t.attempts,
                won.expires_at,
                true,
            ))));
        }
        let fresh = t.epoch.is_none_or(|e| epoch > e)
            && (t.status == TaskStatus::Claimed || st.dag.is_ready(&self.room, id));
        if !fresh {
            self.store.release(&key, &self.agent, epoch).await?;
            return Ok(Try::Skip(not_claimable(
                id,
                format!("it is {} now", status_name(&t)),
            )));
        }
        // Chosen on an older view, it may have failed meanwhile: its retry waits out
        // the back-off from the time the claim was won (plan 0070).
        let won_at = won
            .expires_at
            .saturating_sub((lease_ms as i64).saturating_mul(1000));
        let config = st.config().effective(&self.room, None);
        if let Some(at) =
            huddle_core::pacing::retry_at(&config, &self.room, &t).filter(|at| won_at < *at)
        {
            self.store.release(&key, &self.agent, epoch).await?;
            return Ok(Try::Skip(backing_off(id, at)));
        }
        let attempt = t.next_attempt();
        let claimed = NewInteraction::new(
            self.room.as_str(),
            Verb::TaskClaimed,
            self.agent.as_str(),
            Role::Agent,
            TaskClaimedBody {
                task: id.to_string(),
                epoch,
                attempt,
                generation,
            }
            .to_body(),
        );
        if t.status == TaskStatus::Claimed && t.attempts >= t.max_attempts {
            // The lapsed attempt was the last: this claim records that the task
            // failed for good, and closes the claim with it (as a relay does).
            self.store
                .append_under(std::slice::from_ref(&fence), true, vec![claimed])
                .await?;
            self.catch_up(st).await?;
            return Ok(Try::Skip(not_claimable(
                id,
                format!(
                    "its last allowed attempt ({} of {}) lapsed; it failed for good",
                    t.attempts, t.max_attempts
                ),
            )));
        }
        let mut batch = vec![claimed];
        for loser in losing_bidders(&t, &self.agent) {
            batch.push(NewInteraction::new(
                self.room.as_str(),
                Verb::TaskRejected,
                self.agent.as_str(),
                Role::Agent,
                TaskRejectedBody {
                    task: id.to_string(),
                    attempt,
                    agent: loser.to_string(),
                    winner: self.agent.clone(),
                }
                .to_body(),
            ));
        }
        match self.store.append_under(&[fence], false, batch).await {
            Ok(_) => {}
            Err(StoreError::Fenced { .. }) => {
                return Ok(Try::Skip(not_claimable(
                    id,
                    "the claim lapsed before it was recorded; try again".into(),
                )))
            }
            Err(e) => return Err(e.into()),
        }
        self.store.flush().await;
        self.catch_up(st).await?;
        st.mine.insert(id.to_string(), epoch);
        st.activity.insert(id.to_string(), Instant::now());
        tracing::info!(room = %self.room, agent = %self.agent, task = id, epoch = epoch.get(), attempt, "task claimed");
        let t = self.task(st, id)?.clone();
        Ok(Try::Claimed(Box::new(self.claimed(
            st,
            &t,
            epoch,
            attempt,
            won.expires_at,
            false,
        ))))
    }

    fn claimed(
        &self,
        st: &Folded,
        t: &Task,
        epoch: ClaimEpoch,
        attempt: u32,
        expires_at: Timestamp,
        resumed: bool,
    ) -> ClaimedTask {
        let dependencies = t
            .deps
            .iter()
            .filter_map(|d| st.dag.task(&self.room, d))
            .map(|d| DependencyView {
                id: d.id.clone(),
                label: d.label.clone(),
                result: d.result.clone(),
            })
            .collect();
        ClaimedTask {
            task: self.view(st, t),
            epoch,
            attempt,
            expires_at,
            lease_ms: self.lease_ms(st),
            resumed,
            dependencies,
            effect_key: huddle_core::protocol::task_round_effect_key(
                &self.room,
                &t.id,
                t.rejections,
            ),
            trace: t.command.map(|c| c.to_string()).unwrap_or_default(),
            review_feedback: match (&t.review, &t.feedback) {
                (Some(r), Some(f)) if t.rejections > 0 => Some(FeedbackView {
                    reviewer: r.agent.clone(),
                    round: t.rejections,
                    feedback: f.clone(),
                    rejected_result: t.rejected_result.clone(),
                }),
                _ => None,
            },
            compensates: t.compensates.as_ref().map(|c| {
                let undone = st.dag.task(&self.room, c);
                DependencyView {
                    id: c.clone(),
                    label: undone.map(|x| x.label.clone()).unwrap_or_default(),
                    result: undone.and_then(|x| x.result.clone()),
                }
            }),
        }
    }

    /// The epoch a write about `task` presents: the given one, or the one the fold
    /// records for this agent.
    fn epoch_of(&self, st: &Folded, id: &str, given: Option<ClaimEpoch>) -> Result<ClaimEpoch> {
        let t = self.task(st, id)?;
        if let Some(e) = given.or_else(|| st.mine.get(id).copied()) {
            return Ok(e);
        }
        match (&t.owner, t.epoch) {
            (Some(o), Some(e)) if *o == self.agent && t.status == TaskStatus::Claimed => Ok(e),
            _ => Err(AgentError::NotHolder {
                task: id.to_string(),
                why: match &t.owner {
                    Some(o) if t.status == TaskStatus::Claimed => {
                        format!("{o} holds it; claim a task with task_claim first")
                    }
                    _ => format!(
                        "it is {} and not claimed by you{}; claim it with task_claim first",
                        status_name(t),
                        t.last_reason
                            .as_deref()
                            .map(|r| format!(" (its last attempt: {})", truncate_text(r, 200)))
                            .unwrap_or_default()
                    ),
                },
            }),
        }
    }

    /// Why a write under `(agent, epoch)` about `id` was refused, with the fold read
    /// forward.
    async fn explain_refusal(&self, st: &mut Folded, id: &str, epoch: ClaimEpoch) -> AgentError {
        if let Err(e) = self.catch_up(st).await {
            return e;
        }
        let lease = self.lease_ms(st);
        let Some(t) = st.dag.task(&self.room, id) else {
            return AgentError::NoTask(id.to_string());
        };
        let others = t.owner.as_deref().filter(|o| *o != self.agent);
        let why = match (t.status, others, t.epoch) {
            (TaskStatus::Done, _, e) => format!(
                "task {id:?} is already done (by {} at epoch {}); your claim at epoch {epoch} lapsed and your result was not recorded",
                t.owner.as_deref().unwrap_or("?"),
                e.map_or_else(|| "?".to_string(), |e| e.to_string())
            ),
            (_, Some(o), Some(e)) if e > epoch => format!(
                "your claim on task {id:?} at epoch {epoch} lapsed and {o} took it at epoch {e}; nothing was recorded: drop this task and claim another"
            ),
            (TaskStatus::Abandoned, _, _) => format!(
                "task {id:?} failed for good; your claim at epoch {epoch} is over and nothing was recorded"
            ),
            _ => format!(
                "your claim on task {id:?} at epoch {epoch} is no longer live (it lapsed: not renewed within the room's claim-ttl of {lease} ms, or it was released); nothing was recorded: claim it again with task_claim (a new attempt) and then write"
            ),
        };
        AgentError::LeaseLost(why)
    }

    /// Appends `row` under the task claim `(agent, epoch)`, closing the claim when
    /// `close`; a refused fence is explained.
    async fn write_under(
        &self,
        st: &mut Folded,
        id: &str,
        epoch: ClaimEpoch,
        close: bool,
        rows: Vec<NewInteraction>,
    ) -> Result<Written> {
        let fence = Fence {
            key: self.key_of(st, id),
            holder: self.agent.clone(),
            epoch,
        };
        match self.store.append_under(&[fence], close, rows).await {
            Ok(out) => {
                self.store.flush().await;
                self.catch_up(st).await?;
                written(&out)
            }
            Err(StoreError::Fenced { .. }) => Err(self.explain_refusal(st, id, epoch).await),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn row(
        &self,
        verb: Verb,
        body: serde_json::Value,
        key: Option<String>,
    ) -> NewInteraction {
        let row = NewInteraction::new(
            self.room.as_str(),
            verb,
            self.agent.as_str(),
            Role::Agent,
            body,
        );
        match key {
            Some(k) => row.with_idempotency_key(k),
            None => row,
        }
    }

    /// `task_renew`: extends the lease of a task this agent holds.
    pub async fn task_renew(&self, args: RenewArgs) -> Result<LeaseView> {
        let mut st = self.synced().await?;
        let epoch = self.epoch_of(&st, &args.task, args.epoch)?;
        let lease_ms = self.lease_ms(&st);
        let key = self.key_of(&st, &args.task);
        match self
            .store
            .renew(&key, &self.agent, epoch, Duration::from_millis(lease_ms))
            .await?
        {
            Some(c) => {
                st.activity.insert(args.task.clone(), Instant::now());
                Ok(LeaseView {
                    task: args.task,
                    epoch,
                    expires_at: c.expires_at,
                    lease_ms,
                })
            }
            None => Err(self.explain_refusal(&mut st, &args.task, epoch).await),
        }
    }

    /// `task_complete`: records the result under the claim and closes the claim: the
    /// task is never taken again. A stale claim is refused and nothing is recorded.
    pub async fn task_complete(&self, args: CompleteArgs) -> Result<TaskWritten> {
        // An attempt past its deadline (or silent past the stall timeout) is failed, not
        // completed, as a relay would have stopped it.
        if let Some((_, why)) = self
            .watch_held()
            .await?
            .into_iter()
            .find(|(t, _)| *t == args.task)
        {
            return Err(AgentError::LeaseLost(format!(
                "task {:?} was failed instead ({why}); nothing was recorded: claim it again \
                 with task_claim for another attempt",
                args.task
            )));
        }
        let mut st = self.synced().await?;
        let epoch = match self.epoch_of(&st, &args.task, args.epoch) {
            Ok(e) => e,
            // A retry of a completion that already committed: the fold says done (or
            // submitted for review) by us.
            Err(e) => match st.dag.task(&self.room, &args.task) {
                Some(t)
                    if matches!(t.status, TaskStatus::Done | TaskStatus::Submitted)
                        && t.owner.as_deref() == Some(self.agent.as_str())
                        && t.epoch.is_some() =>
                {
                    t.epoch.expect("checked by the guard")
                }
                _ => return Err(e),
            },
        };
        let body = TaskCompletedBody {
            task: args.task.clone(),
            epoch,
            result: args
                .result
                .as_deref()
                .map(|r| truncate_text(r, MAX_RESULT_BYTES)),
            tokens: None,
            generation: self.generation_of(&st, &args.task),
        };
        let key = self.idempotency(args.idempotency_key.as_deref())?;
        let row = self.row(Verb::TaskCompleted, body.to_body(), key);
        // The work's end as a turn row, as a relay writes one: the board shows it and
        // the circuit breaker's run of failures ends.
        let turn = self.turn_row(&st, &args.task, epoch, None);
        let written = self
            .write_under(&mut st, &args.task, epoch, true, vec![row, turn])
            .await?;
        st.mine.remove(&args.task);
        st.activity.remove(&args.task);
        tracing::info!(room = %self.room, agent = %self.agent, task = %args.task, epoch = epoch.get(), "task completed");
        self.task_written(&st, args.task, epoch, written)
    }

    /// `task_fail`: gives the attempt back with a reason; the task is retried (by
    /// anyone) until its attempts are used, then fails for good.
    pub async fn task_fail(&self, args: GiveBackArgs) -> Result<TaskWritten> {
        self.give_back(Verb::TaskFailed, args).await
    }

    /// `task_release`: gives the task back without failing it (an attempt is used,
    /// as for a relay that stops).
    pub async fn task_release(&self, args: GiveBackArgs) -> Result<TaskWritten> {
        self.give_back(Verb::TaskReleased, args).await
    }

    async fn give_back(&self, verb: Verb, args: GiveBackArgs) -> Result<TaskWritten> {
        let mut st = self.synced().await?;
        let epoch = self.epoch_of(&st, &args.task, args.epoch)?;
        let t = self.task(&st, &args.task)?;
        // The fold abandons the task when its last allowed attempt is given back:
        // that write finishes it, so it closes the claim.
        let last = t.attempts >= t.max_attempts;
        let reason = args.reason.clone().unwrap_or_else(|| match verb {
            Verb::TaskReleased => "released by the agent".to_string(),
            _ => "failed (no reason given)".to_string(),
        });
        let body = TaskEndedBody {
            task: args.task.clone(),
            epoch,
            reason: truncate_text(&reason, MAX_RESULT_BYTES),
            generation: t.generation,
        };
        let key = self.idempotency(args.idempotency_key.as_deref())?;
        let row = self.row(verb, body.to_body(), key);
        let mut rows = vec![row];
        if verb == Verb::TaskFailed {
            // A failure counts for the circuit breaker as a driven agent's does.
            rows.push(self.turn_row(&st, &args.task, epoch, Some(&body.reason)));
        }
        let written = self
            .write_under(&mut st, &args.task, epoch, last, rows)
            .await?;
        st.mine.remove(&args.task);
        st.activity.remove(&args.task);
        if !last {
            let key = self.key_of(&st, &args.task);
            self.store.release(&key, &self.agent, epoch).await?;
        }
        tracing::info!(room = %self.room, agent = %self.agent, task = %args.task, epoch = epoch.get(), verb = %verb, "task given back");
        self.task_written(&st, args.task, epoch, written)
    }

    /// The `turn.replied` (`failed: None`) or `turn.failed` row that records the end of
    /// this agent's work on task `id` under `epoch`, as a relay records a turn's end.
    /// Its turn id, `s/<room>/<task>/<agent>/<epoch>.g<generation>`, is the agent's
    /// own ("self").
    pub(crate) fn turn_row(
        &self,
        st: &Folded,
        id: &str,
        epoch: ClaimEpoch,
        failed: Option<&str>,
    ) -> NewInteraction {
        use huddle_core::protocol::{Subject, TurnFailedBody, TurnRepliedBody};
        let t = st.dag.task(&self.room, id);
        let generation = t.map_or(0, |t| t.generation);
        let subject = Subject::task(id, t.map(|t| truncate_text(&t.label, 200)));
        let turn = format!("s/{}/{id}/{}/{epoch}.g{generation}", self.room, self.agent);
        let body = match failed {
            None => serde_json::to_value(TurnRepliedBody {
                turn,
                subject,
                epoch,
                tokens: 0,
                reply: None,
                activity: Default::default(),
            }),
            Some(reason) => serde_json::to_value(TurnFailedBody {
                turn,
                subject,
                epoch,
                reason: truncate_text(reason, MAX_RESULT_BYTES),
                tokens: 0,
                activity: Default::default(),
            }),
        }
        .unwrap_or_default();
        let verb = if failed.is_some() {
            Verb::TurnFailed
        } else {
            Verb::TurnReplied
        };
        self.row(verb, body, None)
    }

    /// The generation of task `id` in the folded view (0 when unknown).
    fn generation_of(&self, st: &Folded, id: &str) -> u32 {
        st.dag.task(&self.room, id).map_or(0, |t| t.generation)
    }

    /// The claim key of task `id`'s current generation in the folded view.
    fn key_of(&self, st: &Folded, id: &str) -> String {
        task_key_at(&self.room, id, self.generation_of(st, id))
    }

    fn task_written(
        &self,
        st: &Folded,
        task: String,
        epoch: ClaimEpoch,
        written: Written,
    ) -> Result<TaskWritten> {
        let status = status_name(self.task(st, &task)?);
        Ok(TaskWritten {
            task,
            epoch,
            written,
            status,
        })
    }
}

/// Why `right` does not let this agent claim `t`.
fn refusal(right: &ClaimRight, t: &Task) -> String {
    match right {
        ClaimRight::Bidding { closes_at } => format!(
            "the room allocates by bids and the bid window is open until {closes_at} µs; claim after it closes (the best bidder goes first)"
        ),
        ClaimRight::Only(a) => format!("it is reserved for {a} for now; pick another task"),
        ClaimRight::Anyone => format!(
            "it needs capabilities [{}] that you did not declare",
            t.needs.join(", ")
        ),
    }
}

/// The refusal of a task still waiting out its back-off until `at`.
fn backing_off(id: &str, at: huddle_core::Timestamp) -> AgentError {
    not_claimable(
        id,
        format!(
            "its last attempt failed and it backs off until {} (retry-backoff); claim it then",
            huddle_core::board::format_timestamp(at)
        ),
    )
}

fn not_claimable(id: &str, why: String) -> AgentError {
    AgentError::NotClaimable {
        task: id.to_string(),
        why,
    }
}

/// A rank of `task` for `agent`, so agents spread over the frontier instead of all
/// contending for the lowest ids.
fn spread(agent: &str, room: &str, task: &str) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    for part in [agent, room, task] {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}
