//! Approval gates: an agent asks the room owner before an action (deploy, send,
//! delete) and waits for the answer.
//!
//! - An `approval.requested` row opens a request: body
//!   `{"approval": ID, "action": TEXT, "details": TEXT?}`, by whoever asks (an agent).
//!   The first row with an id in a room counts; later ones are ignored and counted.
//! - The answer is the owner's signed command `!approve ID` or `!deny ID [reason]`
//!   (`commands`): the command message itself is the answer, no row is derived. The
//!   owner authority ([`crate::commands::OwnerAuthority`]) verifies it like every
//!   owner command and records the verdict here; an answer to an unknown id, or to a
//!   request already answered, is a rejected command (the first answer stands).
//!   Anyone else's `!approve` is text.
//!
//! Exact bodies and grammar: `docs/protocol/commands.md` ("Approvals").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Interaction, InteractionId, Timestamp};

/// Longest approval id, in bytes.
pub const MAX_APPROVAL_ID_BYTES: usize = 64;
/// Longest `action`, `details` or deny reason kept, in bytes (longer text is cut).
pub const MAX_APPROVAL_TEXT_BYTES: usize = 4_096;

/// The body of `approval.requested`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequestBody {
    /// The id the owner answers (`[A-Za-z0-9_-]{1,64}`).
    pub approval: String,
    /// What the requester wants to do.
    pub action: String,
    /// More about it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
}

impl ApprovalRequestBody {
    /// The JSON body.
    pub fn to_body(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Whether `id` may name an approval: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn valid_approval_id(id: &str) -> bool {
    // The characters of a task id, shorter (it is typed in `!approve ID`).
    id.len() <= MAX_APPROVAL_ID_BYTES && crate::protocol::task::valid_task_id(id)
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalStatus {
    /// Not answered yet.
    Pending,
    /// The owner approved it.
    Approved,
    /// The owner denied it.
    Denied,
}

impl ApprovalStatus {
    /// `pending`, `approved` or `denied`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
        }
    }
}

/// The owner's answer to a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    /// Approved or denied.
    pub status: ApprovalStatus,
    /// Who answered (the owner).
    pub by: String,
    /// The deny reason, if one was given.
    pub reason: Option<String>,
    /// When (database clock).
    pub at: Timestamp,
    /// The command message.
    pub message: InteractionId,
}

/// One request and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The id.
    pub id: String,
    /// Who asked.
    pub requested_by: String,
    /// What for.
    pub action: String,
    /// More about it.
    pub details: Option<String>,
    /// When it was asked (database clock).
    pub requested_at: Timestamp,
    /// The request row.
    pub request: InteractionId,
    /// The thread it was asked in, if any.
    pub thread: Option<String>,
    /// The owner's answer, once given.
    pub answer: Option<ApprovalAnswer>,
}

impl Approval {
    /// Pending, approved or denied.
    pub fn status(&self) -> ApprovalStatus {
        self.answer
            .as_ref()
            .map_or(ApprovalStatus::Pending, |a| a.status)
    }
}

/// The approval requests of every room and their answers. Fed by the owner authority.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Approvals {
    rooms: BTreeMap<String, BTreeMap<String, Approval>>,
    ignored: u64,
}

impl Approvals {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds an `approval.requested` row: the first request with an id counts.
    pub fn request(&mut self, i: &Interaction) {
        let Ok(b) = serde_json::from_value::<ApprovalRequestBody>(i.body.clone()) else {
            self.ignored += 1;
            return;
        };
        if !valid_approval_id(&b.approval) || b.action.trim().is_empty() {
            self.ignored += 1;
            return;
        }
        let room = self.rooms.entry(i.room.clone()).or_default();
        if room.contains_key(&b.approval) {
            self.ignored += 1;
            return;
        }
        room.insert(
            b.approval.clone(),
            Approval {
                id: b.approval,
                requested_by: i.actor.clone(),
                action: cut(&b.action),
                details: b.details.as_deref().map(cut),
                requested_at: i.at,
                request: i.id,
                thread: i.thread.clone(),
                answer: None,
            },
        );
    }

    /// Records a verified owner answer to a pending request (the parser already
    /// refused unknown and answered ids; this keeps the first answer regardless).
    pub fn answer(&mut self, room: &str, id: &str, answer: ApprovalAnswer) {
        if let Some(a) = self.rooms.get_mut(room).and_then(|r| r.get_mut(id)) {
            if a.answer.is_none() {
                a.answer = Some(answer);
            }
        }
    }

    /// A request.
    pub fn get(&self, room: &str, id: &str) -> Option<&Approval> {
        self.rooms.get(room).and_then(|r| r.get(id))
    }

    /// A request's status, `None` when there is no such request.
    pub fn status(&self, room: &str, id: &str) -> Option<ApprovalStatus> {
        self.get(room, id).map(Approval::status)
    }

    /// A request's status as it was before `message` was folded: a request this
    /// very message answered is still pending. What a reader that folds a command
    /// before executing it (a relay replying to it) parses with.
    pub fn status_before(
        &self,
        room: &str,
        id: &str,
        message: InteractionId,
    ) -> Option<ApprovalStatus> {
        let a = self.get(room, id)?;
        match &a.answer {
            Some(answer) if answer.message == message => Some(ApprovalStatus::Pending),
            _ => Some(a.status()),
        }
    }

    /// Every request of a room, by id.
    pub fn room(&self, room: &str) -> impl Iterator<Item = &Approval> {
        self.rooms.get(room).into_iter().flat_map(|r| r.values())
    }

    /// The room's unanswered requests, oldest first.
    pub fn pending(&self, room: &str) -> Vec<&Approval> {
        let mut out: Vec<&Approval> = self
            .room(room)
            .filter(|a| a.status() == ApprovalStatus::Pending)
            .collect();
        out.sort_by_key(|a| a.requested_at);
        out
    }

    /// Malformed or duplicate `approval.requested` rows, ignored.
    pub fn ignored_rows(&self) -> u64 {
        self.ignored
    }
}

fn cut(text: &str) -> String {
    crate::protocol::truncate_text(text, MAX_APPROVAL_TEXT_BYTES)
}
