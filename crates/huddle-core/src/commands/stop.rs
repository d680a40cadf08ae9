//! The `!stop` parser: the owner stops running turns.
//!
//! ```text
//! !stop                  every running turn in the room (or, posted in a thread, in it)
//! !stop @ada             ada's running turns (in the room, or the command's thread)
//! !stop THREAD           every running turn in thread THREAD
//! !stop @ada THREAD      ada's running turns in thread THREAD
//! ```
//!
//! Every relay cancels its own matching turns: the driver is told to stop (exec
//! processes are killed, ACP sessions get `session/cancel`), the claims are released
//! without a completion, and each turn's `turn.failed` says the owner stopped it. A
//! stopped task is offered again; a stopped reply lets another agent answer.

use crate::config::shorten;

use super::target::{agent_arg, thread_arg, TargetError};

/// A parsed `!stop`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopCommand {
    /// Only this agent's turns.
    pub agent: Option<String>,
    /// Only turns in this thread (the one named, else the command's own).
    pub thread: Option<String>,
}

impl StopCommand {
    /// The reply confirming the command (the same text on every relay).
    pub fn reply_text(&self, room: &str) -> String {
        let whose = match &self.agent {
            Some(a) => format!("{a}'s running turns"),
            None => "every running turn".to_string(),
        };
        let scope = match &self.thread {
            Some(t) => format!("in thread {t}"),
            None => format!("in room {room}"),
        };
        format!("Stopping {whose} {scope}: each ends without a completion and says why in its turn.failed.")
    }
}

/// Why a `!stop` was rejected; nothing is stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// A bad `@agent` or thread.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// More words than `[@agent] [thread]`.
    #[error("unexpected `{token}`; the form is `!stop [@agent] [thread]`")]
    Unexpected {
        /// The extra word (shortened).
        token: String,
    },
}

/// Parses a `!stop` message posted in `thread` (the command's own thread, if any).
pub fn parse_stop(text: &str, thread: Option<&str>) -> Result<StopCommand, StopError> {
    let rest = text.trim_start().strip_prefix("!stop").unwrap_or(text);
    let mut agent = None;
    let mut named_thread = None;
    for token in rest.split_whitespace() {
        if let Some(name) = token.strip_prefix('@') {
            if agent.is_some() || named_thread.is_some() {
                return Err(StopError::Unexpected {
                    token: shorten(token),
                });
            }
            agent = Some(agent_arg(token, name)?);
        } else if named_thread.is_none() {
            named_thread = Some(thread_arg(token)?);
        } else {
            return Err(StopError::Unexpected {
                token: shorten(token),
            });
        }
    }
    Ok(StopCommand {
        agent,
        thread: named_thread.or_else(|| thread.map(str::to_string)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_parse_and_default_to_the_commands_thread() {
        let p = |text: &str, thread: Option<&str>| parse_stop(text, thread).unwrap();
        assert_eq!(
            p("!stop", None),
            StopCommand {
                agent: None,
                thread: None
            }
        );
        assert_eq!(
            p("!stop", Some("t1")),
            StopCommand {
                agent: None,
                thread: Some("t1".into())
            }
        );
        assert_eq!(
            p("!stop @ada", None),
            StopCommand {
                agent: Some("ada".into()),
                thread: None
            }
        );
        assert_eq!(
            p("  !stop  @ada   t2 ", Some("t1")),
            StopCommand {
                agent: Some("ada".into()),
                thread: Some("t2".into())
            }
        );
        assert_eq!(
            p("!stop t2", None),
            StopCommand {
                agent: None,
                thread: Some("t2".into())
            }
        );
    }

    #[test]
    fn bad_forms_are_refused_with_what_is_wrong() {
        for (text, want) in [
            ("!stop @", "is not an agent"),
            ("!stop @a@b", "is not an agent"),
            ("!stop t2 @ada", "unexpected `@ada`"),
            ("!stop @ada t2 t3", "unexpected `t3`"),
            ("!stop @ada @bo", "unexpected `@bo`"),
        ] {
            let e = parse_stop(text, None).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn hostile_input_never_panics() {
        for text in [
            "!stop \u{0}",
            "!stop @\u{202e}x",
            &format!("!stop {}", "é".repeat(500)),
        ] {
            let _ = parse_stop(text, None);
        }
    }
}
