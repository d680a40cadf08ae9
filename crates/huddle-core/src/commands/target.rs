//! The `@agent` and thread arguments of `!stop` and `!watch`, checked the same way.

use crate::config::{check_agent_name, shorten};
use crate::limits::Limits;
use crate::model::validate_name;

/// A bad `@agent` or thread argument.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Not an agent name.
    #[error("`{token}` is not an agent: {why}")]
    BadAgent {
        /// As typed (shortened).
        token: String,
        /// What is wrong with it.
        why: String,
    },
    /// Not a thread name.
    #[error("`{token}` is not a thread name: {why}")]
    BadThread {
        /// As typed (shortened).
        token: String,
        /// What is wrong with it.
        why: String,
    },
}

/// The agent named by `token` (`@name`, with the `@` already removed as `name`).
pub(super) fn agent_arg(token: &str, name: &str) -> Result<String, TargetError> {
    check_agent_name(name).map_err(|why| TargetError::BadAgent {
        token: shorten(token),
        why,
    })?;
    Ok(name.to_string())
}

/// The thread named by `token`.
pub(super) fn thread_arg(token: &str) -> Result<String, TargetError> {
    validate_name("thread", token, &Limits::default()).map_err(|e| TargetError::BadThread {
        token: shorten(token),
        why: e.to_string(),
    })?;
    Ok(token.to_string())
}
