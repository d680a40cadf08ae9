//! Fuzzes `!delegate`: never panics, and whatever it accepts is a valid plan.
#![no_main]

use std::collections::BTreeSet;

use huddle_core::commands::{owner_command, parse_delegate, MAX_TASKS};
use huddle_core::Role;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = owner_command(Role::Owner, text);
    let Ok(plan) = parse_delegate(text) else {
        return;
    };
    assert!(!plan.tasks.is_empty() && plan.tasks.len() <= MAX_TASKS);
    let mut placed = BTreeSet::new();
    for task in &plan.tasks {
        assert!(!task.label.is_empty());
        assert!(!task.id.is_empty() && task.id.len() <= 64);
        // Annotations are in range, and the critical path covers the task's size.
        assert!(task.priority.is_none_or(|p| p <= 1_000));
        assert!(task.size.is_none_or(|s| (1..=1_000_000).contains(&s)));
        assert!(task.attempts.is_none_or(|a| (1..=100).contains(&a)));
        assert!(task.path >= u64::from(task.size.unwrap_or(1)));
        assert!(task.needs.iter().all(|n| !n.is_empty() && !n.contains([',', ']'])));
        for dep in &task.deps {
            assert!(
                placed.contains(dep),
                "{} comes before its dependency {dep}",
                task.id
            );
        }
        assert!(placed.insert(task.id.clone()), "duplicate id {}", task.id);
    }
});
