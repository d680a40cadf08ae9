//! The derived indexes of one room's tasks, kept up to date as rows are folded so a
//! query or an event costs what it reads or changes, never a scan of the room
//! (DESIGN.md invariant 12).
//!
//! ```text
//!   fold one row ──> RoomTasks mutates task X ──> RoomIndex::touch(X)
//!                                                   ├─ class (ready / waiting / blocked / ...) and counts
//!                                                   ├─ frontier:   BTreeSet<FrontierKey>        (ready tasks)
//!                                                   ├─ by_since:   BTreeSet<(ready_since, id)>  (timers)
//!                                                   ├─ claimed, notices_due: BTreeSet<id>
//!                                                   ├─ claims:     by owner, by claim time (re-takes)
//!                                                   └─ X done / X abandoned / X created:
//!                                                        propagate to dependents[X] (counts only)
//! ```
//!
//! Per task the index keeps two counters over its dependencies: `undone` (not done,
//! missing ones included) — the task is ready when it is open and `undone == 0` —
//! and `unfinishable` (missing, or unable ever to finish) — it can finish when it is
//! not abandoned and `unfinishable == 0`, the least fixpoint that
//! [`RoomIndex::from_scratch`] computes with a work list. A task's "can finish" flips
//! at most twice (on by its creation or its last dependency's, off when it or a
//! dependency is abandoned, which is final), so the propagation is amortised over the
//! edges of the DAG.
//!
//! The index is not part of the fold's serialised state: it is a function of the
//! tasks, so the state hash is the same as without it, and a deserialised fold
//! rebuilds it ([`RoomIndex::from_scratch`]). The property tests of the module check
//! that the incrementally kept index equals the from-scratch one after every row.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{Task, TaskStatus, TaskSummary, DEFAULT_TASK_PRIORITY};
use crate::model::Timestamp;

/// The rank of a ready task in the frontier, compared before its id. Lower ranks go
/// first: the lower `priority`, then the longer critical path (`path`, the longest
/// chain of sizes from the task through the tasks of its `!delegate` that wait for
/// it), so the start of a long chain is handed out before short independent work.
///
/// It is a function of the task's own `task.created` row, which never changes, so a
/// ready task is never re-keyed. (A task created later that waits for an earlier one
/// does not lengthen the earlier task's path: see plan 0039.)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontierRank {
    /// The task's priority (lower first).
    pub priority: u32,
    /// Its critical path, longest first.
    pub path: Reverse<u64>,
}

impl Default for FrontierRank {
    fn default() -> Self {
        FrontierRank {
            priority: DEFAULT_TASK_PRIORITY,
            path: Reverse(1),
        }
    }
}

impl FrontierRank {
    /// The rank of `task` in its room's frontier.
    pub fn of(task: &Task) -> FrontierRank {
        FrontierRank {
            priority: task.priority,
            path: Reverse(task.path),
        }
    }
}

/// The order of the ready frontier: rank, then task id (the final tiebreak, so two
/// tasks never tie).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontierKey {
    /// The scheduling rank.
    pub rank: FrontierRank,
    /// The task id.
    pub id: String,
}

/// Which [`TaskSummary`] count a task falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Done,
    Claimed,
    Submitted,
    Abandoned,
    Cancelled,
    Ready,
    Waiting,
    Blocked,
}

/// What the index derives for one task.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Derived {
    /// Dependencies not done (missing ones included).
    undone: u32,
    /// Dependencies missing or unable ever to finish.
    unfinishable: u32,
    /// Whether the task can still finish (or has).
    finishable: bool,
    class: Class,
    /// Its frontier key and ready time while it is ready.
    ready: Option<(FrontierKey, Timestamp)>,
    /// While it is claimed: the owner ("" for none) and claim time it is filed under
    /// in `claims_by_owner` and `claims_by_time`.
    claim: Option<(String, Option<Timestamp>)>,
}

/// The derived indexes of one room. See the [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct RoomIndex {
    /// Ids whose class, frontier entry or blockers changed, while a journal is kept.
    journal: Option<Vec<String>>,
    /// Task ids naming each id as a dependency (created or not).
    dependents: BTreeMap<String, BTreeSet<String>>,
    derived: BTreeMap<String, Derived>,
    frontier: BTreeSet<FrontierKey>,
    by_since: BTreeSet<(Timestamp, String)>,
    claimed: BTreeSet<String>,
    /// The claimed tasks by owner ("" for a claimed task without one), and by claim
    /// time (`None`, unknown, first): the two ways a re-take pass finds the few
    /// claimed tasks it may probe without walking the claimed set (plan 0089).
    claims_by_owner: BTreeMap<String, BTreeSet<String>>,
    claims_by_time: BTreeSet<(Option<Timestamp>, String)>,
    /// Submitted tasks waiting for their reviewer's verdict.
    in_review: BTreeSet<String>,
    notices_due: BTreeSet<String>,
    summary: TaskSummary,
}

impl PartialEq for RoomIndex {
    fn eq(&self, o: &Self) -> bool {
        self.dependents == o.dependents
            && self.derived == o.derived
            && self.frontier == o.frontier
            && self.by_since == o.by_since
            && self.claimed == o.claimed
            && self.claims_by_owner == o.claims_by_owner
            && self.claims_by_time == o.claims_by_time
            && self.in_review == o.in_review
            && self.notices_due == o.notices_due
            && self.summary == o.summary
    }
}

impl Eq for RoomIndex {}

/// Whether `t` cannot finish by itself: abandoned or cancelled (until the owner's
/// `!retry` opens it again).
fn abandoned(t: &Task) -> bool {
    matches!(t.status, TaskStatus::Abandoned | TaskStatus::Cancelled)
}

impl RoomIndex {
    /// The index of `tasks` computed from nothing: the reference the incremental
    /// index is tested against, and how a deserialised fold gets its index.
    pub fn from_scratch(tasks: &BTreeMap<String, Task>) -> RoomIndex {
        let mut ix = RoomIndex::default();
        // Least fixpoint of "can finish" (a work list over the dependents).
        let mut dependents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut missing: BTreeMap<&str, usize> = BTreeMap::new();
        let mut queue: Vec<&str> = Vec::new();
        for t in tasks.values() {
            for d in &t.deps {
                dependents
                    .entry(d.as_str())
                    .or_default()
                    .push(t.id.as_str());
                ix.dependents
                    .entry(d.clone())
                    .or_default()
                    .insert(t.id.clone());
            }
            if abandoned(t) {
                continue;
            }
            missing.insert(t.id.as_str(), t.deps.len());
            if t.deps.is_empty() {
                queue.push(t.id.as_str());
            }
        }
        let mut finishable: BTreeSet<&str> = BTreeSet::new();
        while let Some(id) = queue.pop() {
            if !finishable.insert(id) {
                continue;
            }
            for dep in dependents.get(id).into_iter().flatten() {
                if let Some(n) = missing.get_mut(dep) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        queue.push(dep);
                    }
                }
            }
        }
        for t in tasks.values() {
            let undone = t
                .deps
                .iter()
                .filter(|d| tasks.get(*d).is_none_or(|d| d.status != TaskStatus::Done))
                .count();
            let unfinishable = t
                .deps
                .iter()
                .filter(|d| !finishable.contains(d.as_str()))
                .count();
            let d = Derived {
                undone: u32::try_from(undone).unwrap_or(u32::MAX),
                unfinishable: u32::try_from(unfinishable).unwrap_or(u32::MAX),
                finishable: finishable.contains(t.id.as_str()),
                class: Class::Blocked,
                ready: None,
                claim: None,
            };
            ix.derived.insert(t.id.clone(), d);
            ix.summary.total += 1;
            ix.summary.blocked += 1;
            ix.place(tasks, &t.id);
        }
        ix
    }

    /// Indexes a newly created task: its counters, its place, and (when it can
    /// finish) one less unfinishable dependency for the tasks that named it before it
    /// existed. Call after inserting it into `tasks`.
    pub(super) fn created(&mut self, tasks: &BTreeMap<String, Task>, id: &str) {
        let Some(t) = tasks.get(id) else {
            return;
        };
        let undone = t
            .deps
            .iter()
            .filter(|d| tasks.get(*d).is_none_or(|d| d.status != TaskStatus::Done))
            .count();
        let unfinishable = t
            .deps
            .iter()
            .filter(|d| self.derived.get(*d).is_none_or(|x| !x.finishable))
            .count();
        for d in &t.deps {
            self.dependents
                .entry(d.clone())
                .or_default()
                .insert(t.id.clone());
        }
        self.derived.insert(
            t.id.clone(),
            Derived {
                undone: u32::try_from(undone).unwrap_or(u32::MAX),
                unfinishable: u32::try_from(unfinishable).unwrap_or(u32::MAX),
                finishable: false,
                class: Class::Blocked,
                ready: None,
                claim: None,
            },
        );
        self.summary.total += 1;
        self.summary.blocked += 1;
        // A creation is a change even when the task starts where it was put (blocked).
        if let Some(j) = &mut self.journal {
            j.push(t.id.clone());
        }
        self.refresh_finishable(tasks, id);
        self.place(tasks, id);
    }

    /// Re-derives task `id` after its status, owner, epoch or notice changed: its
    /// class, its frontier and timer entries, the claimed set, the notices due, and
    /// what follows for its dependents when it became done or abandoned.
    pub(super) fn touch(&mut self, tasks: &BTreeMap<String, Task>, id: &str) {
        let was_done = self.derived.get(id).is_some_and(|d| d.class == Class::Done);
        self.refresh_finishable(tasks, id);
        self.place(tasks, id);
        let is_done = tasks.get(id).is_some_and(|t| t.status == TaskStatus::Done);
        if is_done && !was_done {
            let dependents: Vec<String> = self
                .dependents
                .get(id)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            for d in dependents {
                if let Some(x) = self.derived.get_mut(&d) {
                    x.undone = x.undone.saturating_sub(1);
                }
                self.place(tasks, &d);
            }
        }
    }

    /// Recomputes whether `id` can finish and, when that flipped, carries the change
    /// to its dependents (transitively).
    fn refresh_finishable(&mut self, tasks: &BTreeMap<String, Task>, id: &str) {
        let mut work = vec![id.to_string()];
        while let Some(id) = work.pop() {
            let (Some(t), Some(x)) = (tasks.get(&id), self.derived.get_mut(&id)) else {
                continue;
            };
            let now = !abandoned(t) && x.unfinishable == 0;
            if now == x.finishable {
                continue;
            }
            x.finishable = now;
            for d in self.dependents.get(&id).into_iter().flatten() {
                // What blocks `d` changed even when its own class does not (a task
                // already blocked by one failed dependency, now by a second one).
                if let Some(j) = &mut self.journal {
                    j.push(d.clone());
                }
                if let Some(y) = self.derived.get_mut(d) {
                    y.unfinishable = if now {
                        y.unfinishable.saturating_sub(1)
                    } else {
                        y.unfinishable.saturating_add(1)
                    };
                    work.push(d.clone());
                }
            }
            // Its class (blocked or waiting) may have changed with it.
            self.place(tasks, &id);
        }
    }

    /// Puts task `id` in the class, sets and counts its current state says.
    fn place(&mut self, tasks: &BTreeMap<String, Task>, id: &str) {
        let (Some(t), Some(x)) = (tasks.get(id), self.derived.get(id)) else {
            return;
        };
        let class = match t.status {
            TaskStatus::Done => Class::Done,
            TaskStatus::Claimed => Class::Claimed,
            TaskStatus::Submitted => Class::Submitted,
            TaskStatus::Abandoned => Class::Abandoned,
            TaskStatus::Cancelled => Class::Cancelled,
            TaskStatus::Open if x.undone == 0 => Class::Ready,
            TaskStatus::Open if x.finishable => Class::Waiting,
            TaskStatus::Open => Class::Blocked,
        };
        let ready = (class == Class::Ready).then(|| {
            let key = FrontierKey {
                rank: FrontierRank::of(t),
                id: t.id.clone(),
            };
            (key, ready_since(tasks, t))
        });
        let old_class = x.class;
        let old_ready = x.ready.clone();
        // Where it is filed among the claims, and where it was (copied only on a move).
        let claim =
            (class == Class::Claimed).then(|| (t.owner.as_deref().unwrap_or(""), t.claimed_at));
        let claim_moved = claim != x.claim.as_ref().map(|(o, at)| (o.as_str(), *at));
        let old_claim = if claim_moved { x.claim.clone() } else { None };
        if old_class != class || old_ready != ready {
            if let Some(j) = &mut self.journal {
                j.push(t.id.clone());
            }
        }
        if old_class != class {
            let old = self.count(old_class);
            *old = old.saturating_sub(1);
            *self.count(class) += 1;
            // A dependency that failed for good or was cancelled (or is open again)
            // changes what blocks its dependents, whatever their own class.
            let ends = |c: Class| matches!(c, Class::Abandoned | Class::Cancelled);
            if ends(old_class) || ends(class) {
                if let Some(j) = &mut self.journal {
                    j.extend(self.dependents.get(&t.id).into_iter().flatten().cloned());
                }
            }
        }
        if old_ready != ready {
            if let Some((key, since)) = old_ready {
                self.frontier.remove(&key);
                self.by_since.remove(&(since, key.id));
            }
            if let Some((key, since)) = &ready {
                self.frontier.insert(key.clone());
                self.by_since.insert((*since, key.id.clone()));
            }
        }
        if class != old_class {
            if class == Class::Claimed {
                self.claimed.insert(t.id.clone());
            } else if old_class == Class::Claimed {
                self.claimed.remove(&t.id);
            }
        }
        if claim_moved {
            if let Some((owner, at)) = old_claim {
                if let Some(ids) = self.claims_by_owner.get_mut(&owner) {
                    ids.remove(&t.id);
                    if ids.is_empty() {
                        self.claims_by_owner.remove(&owner);
                    }
                }
                self.claims_by_time.remove(&(at, t.id.clone()));
            }
            if let Some((owner, at)) = claim {
                self.claims_by_owner
                    .entry(owner.to_string())
                    .or_default()
                    .insert(t.id.clone());
                self.claims_by_time.insert((at, t.id.clone()));
            }
        }
        let claim = claim_moved.then(|| claim.map(|(o, at)| (o.to_string(), at)));
        if class == Class::Submitted {
            self.in_review.insert(t.id.clone());
        } else {
            self.in_review.remove(&t.id);
        }
        if class == Class::Abandoned && !t.notified {
            self.notices_due.insert(t.id.clone());
        } else {
            self.notices_due.remove(&t.id);
        }
        if let Some(x) = self.derived.get_mut(id) {
            x.class = class;
            x.ready = ready;
            if let Some(claim) = claim {
                x.claim = claim;
            }
        }
    }

    fn count(&mut self, class: Class) -> &mut usize {
        let s = &mut self.summary;
        match class {
            Class::Done => &mut s.done,
            Class::Claimed => &mut s.claimed,
            Class::Submitted => &mut s.submitted,
            Class::Abandoned => &mut s.abandoned,
            Class::Cancelled => &mut s.cancelled,
            Class::Ready => &mut s.ready,
            Class::Waiting => &mut s.waiting,
            Class::Blocked => &mut s.blocked,
        }
    }

    /// The ids of the tasks that name `id` as a dependency.
    pub(super) fn dependents_of(&self, id: &str) -> Vec<String> {
        self.dependents
            .get(id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Starts keeping a journal of the tasks whose class or frontier entry changes.
    pub(super) fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The journal kept since the last call (empty when none is kept).
    pub(super) fn take_journal(&mut self) -> Vec<String> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Ready tasks in frontier order.
    pub fn frontier(&self) -> impl DoubleEndedIterator<Item = &FrontierKey> + '_ {
        self.frontier.iter()
    }

    /// How many tasks are ready.
    pub fn frontier_len(&self) -> usize {
        self.frontier.len()
    }

    /// Whether task `id` can still finish (or has): `None` when there is no such task.
    pub fn can_finish(&self, id: &str) -> Option<bool> {
        self.derived.get(id).map(|x| x.finishable)
    }

    /// Whether task `id` is open but can never run: a dependency is missing,
    /// abandoned, or cannot finish itself (blocked, or in a cycle).
    pub fn is_blocked(&self, id: &str) -> bool {
        self.derived
            .get(id)
            .is_some_and(|x| x.class == Class::Blocked)
    }

    /// Whether task `id` failed for good or was cancelled (it cannot finish by
    /// itself).
    pub fn is_final(&self, id: &str) -> bool {
        self.derived
            .get(id)
            .is_some_and(|x| matches!(x.class, Class::Abandoned | Class::Cancelled))
    }

    /// Whether task `id` is ready.
    pub fn is_ready(&self, id: &str) -> bool {
        self.derived.get(id).is_some_and(|x| x.ready.is_some())
    }

    /// The frontier key of task `id` while it is ready.
    pub fn frontier_key(&self, id: &str) -> Option<&FrontierKey> {
        self.derived
            .get(id)
            .and_then(|x| x.ready.as_ref())
            .map(|(k, _)| k)
    }

    /// When ready task `id` became ready.
    pub fn ready_since(&self, id: &str) -> Option<Timestamp> {
        self.derived
            .get(id)
            .and_then(|x| x.ready.as_ref())
            .map(|r| r.1)
    }

    /// Ready tasks that became ready at or after `from`, earliest first (ties by id).
    pub fn ready_since_from(
        &self,
        from: Timestamp,
    ) -> impl Iterator<Item = (Timestamp, &str)> + '_ {
        self.by_since
            .range((from, String::new())..)
            .map(|(t, id)| (*t, id.as_str()))
    }

    /// Ids of claimed tasks, sorted.
    pub fn claimed(&self) -> impl Iterator<Item = &str> + '_ {
        self.claimed.iter().map(String::as_str)
    }

    /// Ids of the claimed tasks `owner` holds ("" : those without an owner), sorted.
    pub fn claimed_by(&self, owner: &str) -> impl Iterator<Item = &str> + '_ {
        self.claims_by_owner
            .get(owner)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The claimed tasks by claim time, earliest first (an unknown time before all):
    /// `(claimed at, id)`.
    pub fn claimed_by_time(&self) -> impl Iterator<Item = (Option<Timestamp>, &str)> + '_ {
        self.claims_by_time
            .iter()
            .map(|(at, id)| (*at, id.as_str()))
    }

    /// Ids of submitted tasks waiting for their reviewer, sorted.
    pub fn in_review(&self) -> impl Iterator<Item = &str> + '_ {
        self.in_review.iter().map(String::as_str)
    }

    /// Ids of abandoned tasks whose owner notice is not folded yet, sorted.
    pub fn notices_due(&self) -> impl Iterator<Item = &str> + '_ {
        self.notices_due.iter().map(String::as_str)
    }

    /// Counts by derived state.
    pub fn summary(&self) -> TaskSummary {
        self.summary
    }
}

/// When ready task `t` became ready: the latest of its creation, its dependencies'
/// completions and its last give-back.
fn ready_since(tasks: &BTreeMap<String, Task>, t: &Task) -> Timestamp {
    let mut since = t.created_at;
    for d in &t.deps {
        if let Some(done) = tasks.get(d).and_then(|d| d.done_at) {
            since = since.max(done);
        }
    }
    if let Some(back) = t.returned_at {
        since = since.max(back);
    }
    since
}
