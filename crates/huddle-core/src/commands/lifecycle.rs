//! The `!retry` and `!cancel` parsers: the owner steers tasks that already exist.
//!
//! ```text
//! !retry a b                    a and b, if abandoned or cancelled, get a fresh
//!                               budget of the room's max-attempts and run again
//! !cancel a                     a will not run (a running attempt is stopped)
//! !cancel a with dependants     neither will any task that waits for a
//! ```
//!
//! Ids are separated by white space or commas; each must be a task of the room. The
//! command derives one `task.retried` / `task.cancelled` row per id (role owner,
//! parent = the command; [`super::derived_rows`]); the task fold applies each only
//! where it makes sense at that point of the ledger (a retry only to an abandoned or
//! cancelled task, a cancel only to a task not done), and `huddle tasks` shows the
//! outcome. A retried task is claimed under fresh claim keys (its generation), so the
//! closed claims of its earlier attempts never stand in the way.

use crate::config::shorten;

/// Most tasks one `!retry` or `!cancel` names.
pub const MAX_LIFECYCLE_TASKS: usize = 100;

/// A parsed `!retry`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryCommand {
    /// The tasks, in the order named, without duplicates.
    pub tasks: Vec<String>,
}

/// A parsed `!cancel`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelCommand {
    /// The tasks, in the order named, without duplicates.
    pub tasks: Vec<String>,
    /// `with dependants`: every task that waits for them is cancelled too.
    pub dependants: bool,
}

impl RetryCommand {
    /// The reply confirming the command (the same text on every relay).
    pub fn reply_text(&self, attempts: u32) -> String {
        format!(
            "Retrying {}: each that is abandoned or cancelled is open again with {attempts} \
             more attempt{} (a task that is neither is left as it is; `huddle tasks` shows \
             where each stands).",
            self.tasks.join(", "),
            if attempts == 1 { "" } else { "s" }
        )
    }
}

impl CancelCommand {
    /// The reply confirming the command (the same text on every relay).
    pub fn reply_text(&self) -> String {
        let also = if self.dependants {
            " and every task that waits for them"
        } else {
            ""
        };
        format!(
            "Cancelling {}{also}: none of them will run, and a running attempt is stopped \
             (a done task stays done). Tasks that wait for a cancelled one show it in \
             `huddle tasks`; `!retry` opens a task again.",
            self.tasks.join(", ")
        )
    }
}

/// Why a `!retry` or `!cancel` was rejected; nothing is changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// No task named.
    #[error("name at least one task: `{word} ID [ID ...]{extra}`")]
    NoTask {
        /// The command word.
        word: &'static str,
        /// The rest of the form.
        extra: &'static str,
    },
    /// A word that is not a task id.
    #[error("`{token}` is not a task id (ids use only letters, digits, `_` and `-`)")]
    BadId {
        /// The word (shortened).
        token: String,
    },
    /// A task the room does not have.
    #[error("room has no task `{id}` (`huddle tasks` lists them)")]
    UnknownTask {
        /// The id.
        id: String,
    },
    /// Too many tasks.
    #[error("more than {MAX_LIFECYCLE_TASKS} tasks in one command")]
    TooMany,
}

/// Parses `!retry ID [ID ...]` against the room's tasks.
pub fn parse_retry(
    text: &str,
    task_exists: &dyn Fn(&str) -> bool,
) -> Result<RetryCommand, LifecycleError> {
    let rest = text.trim_start().strip_prefix("!retry").unwrap_or(text);
    let words: Vec<&str> = split(rest);
    let tasks = ids(&words, task_exists, "!retry", "")?;
    Ok(RetryCommand { tasks })
}

/// Parses `!cancel ID [ID ...] [with dependants]` against the room's tasks.
pub fn parse_cancel(
    text: &str,
    task_exists: &dyn Fn(&str) -> bool,
) -> Result<CancelCommand, LifecycleError> {
    let rest = text.trim_start().strip_prefix("!cancel").unwrap_or(text);
    let mut words: Vec<&str> = split(rest);
    let n = words.len();
    let dependants = n >= 2
        && words[n - 2].eq_ignore_ascii_case("with")
        && (words[n - 1].eq_ignore_ascii_case("dependants")
            || words[n - 1].eq_ignore_ascii_case("dependents"));
    if dependants {
        words.truncate(n - 2);
    }
    let tasks = ids(&words, task_exists, "!cancel", " [with dependants]")?;
    Ok(CancelCommand { tasks, dependants })
}

fn split(rest: &str) -> Vec<&str> {
    rest.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect()
}

fn ids(
    words: &[&str],
    task_exists: &dyn Fn(&str) -> bool,
    word: &'static str,
    extra: &'static str,
) -> Result<Vec<String>, LifecycleError> {
    if words.is_empty() {
        return Err(LifecycleError::NoTask { word, extra });
    }
    if words.len() > MAX_LIFECYCLE_TASKS {
        return Err(LifecycleError::TooMany);
    }
    let mut out: Vec<String> = Vec::new();
    for w in words {
        if !crate::protocol::task::valid_task_id(w) {
            return Err(LifecycleError::BadId { token: shorten(w) });
        }
        if !task_exists(w) {
            return Err(LifecycleError::UnknownTask { id: w.to_string() });
        }
        if !out.iter().any(|t| t == w) {
            out.push(w.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(id: &str) -> bool {
        matches!(id, "a" | "b" | "c")
    }

    #[test]
    fn forms_are_read() {
        assert_eq!(
            parse_retry("!retry a, b a", &exists).unwrap().tasks,
            ["a", "b"]
        );
        let c = parse_cancel("!cancel c with dependants", &exists).unwrap();
        assert_eq!((c.tasks, c.dependants), (vec!["c".to_string()], true));
        let c = parse_cancel("!cancel a b", &exists).unwrap();
        assert!(!c.dependants);
    }

    #[test]
    fn bad_forms_say_what_to_write() {
        for (text, want) in [
            ("!retry", "name at least one task: `!retry ID [ID ...]`"),
            (
                "!cancel with dependants",
                "`!cancel ID [ID ...] [with dependants]`",
            ),
            ("!retry zz", "room has no task `zz`"),
            ("!cancel a.b", "`a.b` is not a task id"),
            ("!cancel a with", "room has no task `with`"),
        ] {
            let e = if text.starts_with("!retry") {
                parse_retry(text, &exists).unwrap_err().to_string()
            } else {
                parse_cancel(text, &exists).unwrap_err().to_string()
            };
            assert!(e.contains(want), "{text}: {e}");
        }
        let many = format!("!retry {}", vec!["a"; 101].join(" "));
        assert_eq!(
            parse_retry(&many, &exists).unwrap_err(),
            LifecycleError::TooMany
        );
    }
}
