//! The `!watch` / `!unwatch` parser: the owner makes an agent follow a thread.
//!
//! ```text
//! !watch @ada [THREAD]      ada follows THREAD (default: the thread the command is in)
//! !unwatch @ada [THREAD]    ada stops following it
//! ```
//!
//! A broadcast in a watched thread goes to its watchers first: they contend at once,
//! every other agent one responder window later (the fallback when no watcher is
//! there). Every relay folds the commands in ledger order, so all agree on who
//! watches what.

use crate::config::shorten;

use super::target::{agent_arg, thread_arg, TargetError};
use super::CommandWord;

/// A parsed `!watch` or `!unwatch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCommand {
    /// The agent.
    pub agent: String,
    /// The thread.
    pub thread: String,
    /// `true` for `!watch`, `false` for `!unwatch`.
    pub watch: bool,
}

impl WatchCommand {
    /// The reply confirming the command.
    pub fn reply_text(&self) -> String {
        if self.watch {
            format!(
                "{} now follows thread {}: its broadcasts go to {} first.",
                self.agent, self.thread, self.agent
            )
        } else {
            format!("{} no longer follows thread {}.", self.agent, self.thread)
        }
    }
}

/// Why a `!watch` / `!unwatch` was rejected; nothing changes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// No `@agent`.
    #[error("`{word}` needs an agent, e.g. `{word} @ada` in a thread, or `{word} @ada THREAD`")]
    MissingAgent {
        /// The command word.
        word: &'static str,
    },
    /// A bad `@agent` or thread.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Posted outside a thread and naming none.
    #[error(
        "`{word}` is about a thread: post it in the thread, or name it (`{word} @ada THREAD`)"
    )]
    NoThread {
        /// The command word.
        word: &'static str,
    },
    /// More words than `@agent [thread]`.
    #[error("unexpected `{token}`; the form is `!watch @agent [thread]`")]
    Unexpected {
        /// The extra word (shortened).
        token: String,
    },
}

/// Parses a `!watch` (`word` = [`CommandWord::Watch`]) or `!unwatch` posted in
/// `thread`.
pub fn parse_watch(
    text: &str,
    word: CommandWord,
    thread: Option<&str>,
) -> Result<WatchCommand, WatchError> {
    let (name, watch) = match word {
        CommandWord::Unwatch => ("!unwatch", false),
        _ => ("!watch", true),
    };
    let rest = text.trim_start().strip_prefix(name).unwrap_or(text);
    let mut words = rest.split_whitespace();
    let Some(first) = words.next() else {
        return Err(WatchError::MissingAgent { word: name });
    };
    let Some(agent) = first.strip_prefix('@') else {
        return Err(WatchError::MissingAgent { word: name });
    };
    let agent = agent_arg(first, agent)?;
    let named = words.next().map(thread_arg).transpose()?;
    if let Some(extra) = words.next() {
        return Err(WatchError::Unexpected {
            token: shorten(extra),
        });
    }
    let Some(thread) = named.or_else(|| thread.map(str::to_string)) else {
        return Err(WatchError::NoThread { word: name });
    };
    Ok(WatchCommand {
        agent,
        thread,
        watch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_and_unwatch_parse_in_a_thread_or_naming_one() {
        let w = parse_watch("!watch @ada", CommandWord::Watch, Some("t1")).unwrap();
        assert_eq!(
            w,
            WatchCommand {
                agent: "ada".into(),
                thread: "t1".into(),
                watch: true
            }
        );
        let u = parse_watch(" !unwatch @ada t2", CommandWord::Unwatch, None).unwrap();
        assert_eq!(
            u,
            WatchCommand {
                agent: "ada".into(),
                thread: "t2".into(),
                watch: false
            }
        );
        assert!(w.reply_text().contains("ada now follows thread t1"));
    }

    #[test]
    fn bad_forms_say_what_is_wrong() {
        for (text, thread, want) in [
            ("!watch", Some("t1"), "needs an agent"),
            ("!watch ada", Some("t1"), "needs an agent"),
            ("!watch @", Some("t1"), "is not an agent"),
            ("!watch @ada", None, "is about a thread"),
            ("!watch @ada t1 t2", None, "unexpected `t2`"),
        ] {
            let e = parse_watch(text, CommandWord::Watch, thread)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
