//! `post` with `progress`: an interim note on a message the agent is answering.

use std::sync::atomic::Ordering;

use huddle_core::protocol::{reply_key_for, Subject, TurnProgressBody, MAX_PROGRESS_NOTES};
use huddle_core::{InteractionId, NewInteraction, Role, Verb};
use huddle_store::{Fence, StoreError};

use crate::error::{AgentError, Result};
use crate::session::AgentSession;
use crate::views::{written, PostArgs, Written};

impl AgentSession {
    /// Writes a `turn.progress` note on `reply_to`, fenced by the reply claim this
    /// agent holds on it (a relay driving the agent's turn holds it in the agent's
    /// name): only the agent answering a message may say how the answer is going.
    pub(crate) async fn progress_note(&self, args: PostArgs) -> Result<Written> {
        let Some(p) = args.reply_to.as_deref() else {
            return Err(AgentError::BadArgument(
                "a progress note needs reply_to: the message you are answering".into(),
            ));
        };
        let id: InteractionId = p.parse().map_err(|_| {
            AgentError::BadArgument(format!(
                "reply_to {p:?} is not an interaction id (64 hex digits)"
            ))
        })?;
        let message = match self.store.get(id).await? {
            Some(m) if m.room == self.room && m.verb == Verb::MessagePosted => m,
            _ => {
                return Err(AgentError::BadArgument(format!(
                    "reply_to {p}: no such message in this room"
                )))
            }
        };
        let each = self.names_several(&message).await?;
        let key = reply_key_for(&self.room, &id, &self.agent, each);
        let held = self
            .store
            .list_claims(&key)
            .await?
            .into_iter()
            .find(|c| c.state.key == key && c.live && c.state.holder == self.agent);
        let Some(claim) = held else {
            return Err(AgentError::NotHolder {
                task: format!("reply to {}", id.short()),
                why: "you are not answering that message now (no live reply claim of yours); \
                      a progress note is for the message you are working on"
                    .into(),
            });
        };
        let seq = self.progress_notes.fetch_add(1, Ordering::Relaxed) + 1;
        if seq > MAX_PROGRESS_NOTES {
            return Err(AgentError::BadArgument(format!(
                "at most {MAX_PROGRESS_NOTES} progress notes per session"
            )));
        }
        let body =
            TurnProgressBody::new("", Subject::message(id), claim.state.epoch, seq, &args.text);
        let mut row = NewInteraction::new(
            self.room.as_str(),
            Verb::TurnProgress,
            self.agent.as_str(),
            Role::Agent,
            serde_json::to_value(&body).unwrap_or_default(),
        )
        .with_parent(id);
        row.thread = message.thread.clone();
        let fence = Fence {
            key,
            holder: self.agent.clone(),
            epoch: claim.state.epoch,
        };
        match self.store.append_under(&[fence], false, vec![row]).await {
            Ok(out) => written(&out),
            Err(StoreError::Fenced { .. }) => Err(AgentError::LeaseLost(format!(
                "your hold on the reply to {} lapsed; the note was not recorded",
                id.short()
            ))),
            Err(e) => Err(e.into()),
        }
    }
}
