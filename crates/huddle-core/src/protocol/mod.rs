//! The wire vocabulary: everything that says what an interaction means.
//!
//! The bodies of the coordination verbs ([`coord`], [`turn`], [`room`], [`task`],
//! [`decision`], [`barrier`], [`lease`]), claim keys and fencing epochs
//! ([`claims`]), the checks on names, and the helpers every fold uses to read a body
//! defensively. Folds, policies and the synchronizer all depend on this module; it
//! depends only on the record ([`crate::model`], [`crate::verbs`], [`crate::limits`]).
//! The bodies of `config.set` live with their keys in [`crate::config`].
//!
//! Every body here serialises exactly as documented in `docs/protocol/`; changing a
//! field changes the ids of the interactions that carry it.

pub mod barrier;
pub mod claims;
pub mod coord;
pub mod decision;
mod fields;
pub mod lease;
pub mod relay;
pub mod room;
pub mod task;
pub mod turn;

pub use claims::{
    command_result_key, directed_reply_key, drive_key, message_effect_key, reply_key,
    reply_key_for, review_effect_key, review_key, reviewdrive_key, room_of_claim, task_effect_key,
    task_key, task_key_at, task_round_effect_key, taskdrive_key, taskdrive_key_at, ClaimEpoch,
    ClaimKey, ClaimRef, ROOM_CLAIM_KINDS,
};
pub use coord::{
    CoordNoteBody, DesignationBody, NoticeBody, PresenceBody, PresenceState, Subject, SubjectKind,
};
pub(crate) use fields::{closing_key, deadline_from, hash_parts, parse_body, valid_name};
pub use fields::{truncate_text, PPM, SYSTEM_ACTOR};
pub use relay::RelayHeartbeatBody;
pub use room::{
    nonce_from, AgentRegisteredBody, ArchiveDigest, MessageBody, RoomArchivedBody, RoomCreatedBody,
    RoomSettledBody, DEFAULT_PRIORITY,
};
pub use turn::{
    carried_turn, carry_turn, PermissionEntry, PlanEntry, TokensBody, ToolCallEntry, TurnActivity,
    TurnFailedBody, TurnProgressBody, TurnPromptedBody, TurnRepliedBody, TurnUsageBody,
    MAX_ACTIVITY_ENTRIES, MAX_ACTIVITY_TEXT, MAX_PROGRESS_BYTES, MAX_PROGRESS_NOTES,
};
