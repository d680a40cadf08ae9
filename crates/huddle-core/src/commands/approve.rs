//! The `!approve` / `!deny` parser: the owner's answer to an approval request
//! ([`crate::approval`]).
//!
//! ```text
//! !approve ID
//! !deny ID [reason...]
//! ```
//!
//! The id must name a pending request of the room (the [`super::ParseContext`] says
//! which); the reason is the rest of the message, trimmed.

use crate::approval::{valid_approval_id, ApprovalStatus, MAX_APPROVAL_TEXT_BYTES};
use crate::config::shorten;

use super::{CommandWord, ParseContext};

/// A parsed `!approve` or `!deny`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalCommand {
    /// The request answered.
    pub id: String,
    /// [`ApprovalStatus::Approved`] or [`ApprovalStatus::Denied`].
    pub verdict: ApprovalStatus,
    /// The reason of a deny, if given.
    pub reason: Option<String>,
}

impl ApprovalCommand {
    /// The reply confirming the answer.
    pub fn reply_text(&self) -> String {
        match (&self.verdict, &self.reason) {
            (ApprovalStatus::Approved, _) => format!("Approved {}.", self.id),
            (_, Some(r)) => format!("Denied {}: {r}", self.id),
            _ => format!("Denied {}.", self.id),
        }
    }
}

/// Why a `!approve` / `!deny` was rejected; nothing is recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No id after the command word.
    #[error("`{word}` needs the id of an approval request, e.g. `{word} ap-1a2b3c4d`; `huddle approvals` lists them")]
    MissingId {
        /// `!approve` or `!deny`.
        word: &'static str,
    },
    /// An id that cannot be one.
    #[error("`{id}` is not an approval id (1 to 64 letters, digits, `-` or `_`)")]
    BadId {
        /// As typed (shortened).
        id: String,
    },
    /// No request with this id in the room.
    #[error("there is no approval request `{id}` in this room; `huddle approvals` lists them")]
    Unknown {
        /// The id.
        id: String,
    },
    /// The request was answered before; the first answer stands.
    #[error("approval request `{id}` was already {status}; the first answer stands")]
    Answered {
        /// The id.
        id: String,
        /// How it was answered.
        status: &'static str,
    },
    /// Words after `!approve ID`.
    #[error("unexpected `{token}` after `!approve {id}`; only `!deny` takes a reason")]
    Unexpected {
        /// The id.
        id: String,
        /// The extra word (shortened).
        token: String,
    },
}

/// Parses a `!approve` (`word` = [`CommandWord::Approve`]) or `!deny` message.
pub fn parse_approval(
    text: &str,
    word: CommandWord,
    ctx: &ParseContext<'_>,
) -> Result<ApprovalCommand, ApprovalError> {
    let (name, verdict) = match word {
        CommandWord::Deny => ("!deny", ApprovalStatus::Denied),
        _ => ("!approve", ApprovalStatus::Approved),
    };
    let rest = text
        .trim_start()
        .strip_prefix(name)
        .unwrap_or_default()
        .trim_start();
    let id_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let (id, tail) = rest.split_at(id_end);
    if id.is_empty() {
        return Err(ApprovalError::MissingId { word: name });
    }
    if !valid_approval_id(id) {
        return Err(ApprovalError::BadId { id: shorten(id) });
    }
    let tail = tail.trim();
    let reason = match verdict {
        ApprovalStatus::Approved if !tail.is_empty() => {
            let token = tail.split_whitespace().next().unwrap_or_default();
            return Err(ApprovalError::Unexpected {
                id: id.to_string(),
                token: shorten(token),
            });
        }
        _ if tail.is_empty() => None,
        _ => Some(crate::protocol::truncate_text(
            tail,
            MAX_APPROVAL_TEXT_BYTES,
        )),
    };
    match (ctx.approval)(id) {
        None => Err(ApprovalError::Unknown { id: id.to_string() }),
        Some(ApprovalStatus::Pending) => Ok(ApprovalCommand {
            id: id.to_string(),
            verdict,
            reason,
        }),
        Some(done) => Err(ApprovalError::Answered {
            id: id.to_string(),
            status: done.as_str(),
        }),
    }
}
