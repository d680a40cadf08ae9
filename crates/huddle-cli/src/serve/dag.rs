//! The task DAG as an SVG: a layered layout (columns by the longest dependency chain
//! from a root, rows ordered by the mean row of each task's dependencies), nodes
//! coloured by status, edges for dependencies, and the critical path — the chain with
//! the largest total size — drawn thick.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use huddle_core::TaskStatus;

use super::pages::esc;
use crate::state_cmds::{TaskLine, TasksView};

const NODE_W: f64 = 170.0;
const NODE_H: f64 = 46.0;
const GAP_X: f64 = 70.0;
const GAP_Y: f64 = 14.0;
const MARGIN: f64 = 20.0;

/// The status word a task is drawn with (its CSS class): `waiting`, `ready`,
/// `claimed`, `submitted` (waiting for its reviewer), `done`, `blocked`, `abandoned`,
/// `cancelled` (by the owner's `!cancel`),
/// or `retrying` (open again after a failed attempt).
pub fn status_word(t: &TaskLine) -> &'static str {
    match (t.status, t.ready) {
        (TaskStatus::Done, _) => "done",
        (TaskStatus::Claimed, _) => "claimed",
        (TaskStatus::Submitted, _) => "submitted",
        (TaskStatus::Abandoned, _) => "abandoned",
        (TaskStatus::Cancelled, _) => "cancelled",
        (TaskStatus::Open, _) if !t.blocked_by.is_empty() => "blocked",
        (TaskStatus::Open, true) if t.attempts > 0 => "retrying",
        (TaskStatus::Open, true) => "ready",
        (TaskStatus::Open, false) => "waiting",
    }
}

/// Each task's column: 0 for a task with no (known) dependency, else one more than
/// its deepest dependency's. Tasks left in a cycle (which `!delegate` refuses, so only
/// from several commands' rows) go in one column after the rest.
fn layers(view: &TasksView) -> BTreeMap<&str, usize> {
    let ids: BTreeSet<&str> = view.tasks.iter().map(|t| t.id.as_str()).collect();
    let deps: BTreeMap<&str, Vec<&str>> = view
        .tasks
        .iter()
        .map(|t| {
            let known = t
                .deps
                .iter()
                .map(String::as_str)
                .filter(|d| ids.contains(d) && *d != t.id)
                .collect();
            (t.id.as_str(), known)
        })
        .collect();
    let mut waiting_on: BTreeMap<&str, usize> = deps.iter().map(|(k, v)| (*k, v.len())).collect();
    let mut dependents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (t, ds) in &deps {
        for d in ds {
            dependents.entry(d).or_default().push(t);
        }
    }
    let mut layer: BTreeMap<&str, usize> = BTreeMap::new();
    let mut queue: Vec<&str> = waiting_on
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| *k)
        .collect();
    while let Some(t) = queue.pop() {
        let l = deps[t]
            .iter()
            .filter_map(|d| layer.get(d))
            .map(|l| l + 1)
            .max()
            .unwrap_or(0);
        layer.insert(t, l);
        for next in dependents.get(t).into_iter().flatten() {
            if let Some(n) = waiting_on.get_mut(next) {
                *n -= 1;
                if *n == 0 {
                    queue.push(next);
                }
            }
        }
    }
    let last = layer.values().max().map_or(0, |l| l + 1);
    for t in ids {
        layer.entry(t).or_insert(last);
    }
    layer
}

/// The critical path: the chain of dependencies with the largest total size, as the
/// set of its tasks, ending at the task where that total is largest (ties by id).
fn critical_path<'a>(view: &'a TasksView, layer: &BTreeMap<&str, usize>) -> BTreeSet<&'a str> {
    let by_id: BTreeMap<&str, &TaskLine> = view.tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    let mut order: Vec<&TaskLine> = view.tasks.iter().collect();
    order.sort_by_key(|t| {
        (
            layer.get(t.id.as_str()).copied().unwrap_or(0),
            t.id.as_str(),
        )
    });
    let mut best: BTreeMap<&str, (u64, Option<&str>)> = BTreeMap::new();
    for t in &order {
        let here = layer.get(t.id.as_str()).copied().unwrap_or(0);
        let prev = t
            .deps
            .iter()
            .filter(|d| layer.get(d.as_str()).is_some_and(|l| *l < here))
            .filter_map(|d| best.get_key_value(d.as_str()).map(|(k, v)| (*k, v.0)))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)));
        let total = u64::from(t.size.max(1)) + prev.map_or(0, |p| p.1);
        best.insert(t.id.as_str(), (total, prev.map(|p| p.0)));
    }
    let mut path = BTreeSet::new();
    let end = best
        .iter()
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))
        .map(|(k, _)| *k);
    let mut at = end;
    while let Some(id) = at {
        if let Some((k, _)) = by_id.get_key_value(id) {
            path.insert(*k);
        }
        at = best.get(id).and_then(|b| b.1);
    }
    path
}

/// The SVG of the room's task DAG (empty-state text when it has no tasks).
pub fn svg(view: &TasksView) -> String {
    if view.tasks.is_empty() {
        return "<p class=\"empty\">no tasks yet (the owner seeds them with <code>!delegate</code>)</p>"
            .to_string();
    }
    let layer = layers(view);
    let critical = critical_path(view, &layer);
    let columns = layer.values().max().map_or(1, |l| l + 1);
    // Rows: column by column, each task at the mean row of its dependencies (one
    // barycentre sweep), ties by id.
    let mut row_of: BTreeMap<&str, f64> = BTreeMap::new();
    let mut tallest = 0usize;
    for col in 0..columns {
        let mut here: Vec<(&TaskLine, f64)> = view
            .tasks
            .iter()
            .filter(|t| layer.get(t.id.as_str()) == Some(&col))
            .map(|t| {
                let placed: Vec<f64> = t
                    .deps
                    .iter()
                    .filter_map(|d| row_of.get(d.as_str()).copied())
                    .collect();
                let key = if placed.is_empty() {
                    f64::MAX
                } else {
                    placed.iter().sum::<f64>() / placed.len() as f64
                };
                (t, key)
            })
            .collect();
        here.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.id.cmp(&b.0.id)));
        tallest = tallest.max(here.len());
        for (i, (t, _)) in here.iter().enumerate() {
            row_of.insert(t.id.as_str(), i as f64);
        }
    }
    let x = |col: usize| MARGIN + col as f64 * (NODE_W + GAP_X);
    let y = |row: f64| MARGIN + row * (NODE_H + GAP_Y);
    let width = x(columns) - GAP_X + MARGIN;
    let height = y(tallest as f64) - GAP_Y + MARGIN;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg id=\"dag\" xmlns=\"http://www.w3.org/2000/svg\" preserveAspectRatio=\"xMinYMin meet\" viewBox=\"0 0 {width:.0} {height:.0}\" \
         data-width=\"{width:.0}\" data-height=\"{height:.0}\" role=\"img\" \
         aria-label=\"task DAG: {} tasks\">",
        view.tasks.len()
    );
    out.push_str("<g class=\"edges\">");
    for t in &view.tasks {
        let (Some(tl), Some(tr)) = (layer.get(t.id.as_str()), row_of.get(t.id.as_str())) else {
            continue;
        };
        for d in &t.deps {
            let (Some(dl), Some(dr)) = (layer.get(d.as_str()), row_of.get(d.as_str())) else {
                continue;
            };
            let (x1, y1) = (x(*dl) + NODE_W, y(*dr) + NODE_H / 2.0);
            let (x2, y2) = (x(*tl), y(*tr) + NODE_H / 2.0);
            let mid = (x1 + x2) / 2.0;
            let class = if critical.contains(t.id.as_str()) && critical.contains(d.as_str()) {
                "edge critical"
            } else {
                "edge"
            };
            let _ = write!(
                out,
                "<path class=\"{class}\" data-from=\"{}\" data-to=\"{}\" \
                 d=\"M{x1:.1},{y1:.1} C{mid:.1},{y1:.1} {mid:.1},{y2:.1} {x2:.1},{y2:.1}\"/>",
                esc(d),
                esc(&t.id)
            );
        }
    }
    out.push_str("</g><g class=\"nodes\">");
    for t in &view.tasks {
        let (Some(col), Some(row)) = (layer.get(t.id.as_str()), row_of.get(t.id.as_str())) else {
            continue;
        };
        let status = status_word(t);
        let crit = if critical.contains(t.id.as_str()) {
            " critical"
        } else {
            ""
        };
        let (nx, ny) = (x(*col), y(*row));
        let who = match &t.owner {
            Some(o) => format!("{} · attempt {}/{}", o, t.attempts, t.max_attempts),
            None if t.attempts > 0 => format!("attempt {}/{}", t.attempts, t.max_attempts),
            None => status.to_string(),
        };
        let _ = write!(
            out,
            "<g class=\"node {status}{crit}\" data-task=\"{id}\" data-status=\"{status}\" \
             transform=\"translate({nx:.1},{ny:.1})\">\
             <title>{id}: {label} ({status})</title>\
             <rect width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"6\"/>\
             <text x=\"8\" y=\"18\" class=\"id\">{short}</text>\
             <text x=\"8\" y=\"36\" class=\"who\">{who}</text></g>",
            id = esc(&t.id),
            label = esc(&t.label),
            short = esc(&clip(&t.id, 20)),
            who = esc(&clip(&who, 26)),
        );
    }
    out.push_str("</g></svg>");
    out
}

/// `text` cut to `n` characters (with `…`).
fn clip(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        return text.to_string();
    }
    let mut s: String = text.chars().take(n.saturating_sub(1)).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use huddle_core::tasks::TaskSummary;

    fn task(id: &str, deps: &[&str], size: u32) -> TaskLine {
        TaskLine {
            id: id.into(),
            label: format!("<b>{id}</b>"),
            status: TaskStatus::Open,
            ready: deps.is_empty(),
            owner: None,
            epoch: None,
            attempts: 0,
            max_attempts: 3,
            deps: deps.iter().map(|d| d.to_string()).collect(),
            assignee: None,
            needs: vec![],
            priority: 0,
            size,
            path: 0,
            uses: vec![],
            completions: 0,
            last_reason: None,
            result: None,
            blocked_by: vec![],
            due_ms: None,
            due_at: None,
            retry_at: None,
            reviewer: None,
            rejections: 0,
            review_rounds: None,
            feedback: None,
            undo: None,
            compensates: None,
        }
    }

    fn view(tasks: Vec<TaskLine>) -> TasksView {
        TasksView {
            room: "r".into(),
            summary: TaskSummary::default(),
            ready: vec![],
            tasks,
            refused: 0,
            malformed: 0,
        }
    }

    #[test]
    fn layers_follow_the_longest_chain_and_the_critical_path_the_largest_size() {
        // a -> b -> d, a -> c -> d, c is large; e alone.
        let v = view(vec![
            task("a", &[], 1),
            task("b", &["a"], 1),
            task("c", &["a"], 5),
            task("d", &["b", "c"], 1),
            task("e", &[], 1),
        ]);
        let l = layers(&v);
        assert_eq!((l["a"], l["b"], l["c"], l["d"], l["e"]), (0, 1, 1, 2, 0));
        let cp = critical_path(&v, &l);
        assert_eq!(cp, ["a", "c", "d"].into_iter().collect());
        let s = svg(&v);
        assert_eq!(s.matches("<g class=\"node ").count(), 5);
        assert_eq!(s.matches("<path class=\"edge").count(), 4);
        assert_eq!(s.matches("class=\"edge critical\"").count(), 2);
        assert!(!s.contains("<b>") && s.contains("&lt;b&gt;"), "{s}");
    }

    #[test]
    fn cycles_and_missing_dependencies_do_not_hang_or_vanish() {
        let v = view(vec![
            task("x", &["y"], 1),
            task("y", &["x"], 1),
            task("z", &["missing"], 1),
        ]);
        let l = layers(&v);
        assert_eq!(l.len(), 3);
        let s = svg(&v);
        assert_eq!(s.matches("<g class=\"node ").count(), 3);
    }
}
