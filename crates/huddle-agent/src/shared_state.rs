//! Versioned shared state in an agent's hands: `state_get`, `state_put` and
//! `state_list` over the room's `state.put` rows (`huddle_core::shared_state`).
//!
//! A put makes version `read + 1` of its key, appended with the idempotency key of
//! that version. The database keeps one row per idempotency key and checks that the
//! version's predecessor exists (migration 0007), so it alone decides which of two
//! writers that read the same version wins: the other's append returns the
//! winner's id, and the put is refused as stale with the current version and value.
//! A put without `if_version` goes on top of whatever is current, trying again when
//! it loses such a race.

use huddle_core::shared_state::{check_key, state_idempotency_key, StatePutBody};
use huddle_core::{NewInteraction, Role, Verb};

use crate::error::{AgentError, Result};
use crate::resource_views::{
    StateGetArgs, StateListResult, StatePutArgs, StateVersionView, StateView, StateWritten,
};
use crate::session::{AgentSession, Folded};
use crate::views::written;

/// How often a put without `if_version` tries again after losing a race.
const BLIND_TRIES: usize = 16;

/// The view of `key` in `st`.
pub(crate) fn state_view(st: &Folded, room: &str, key: &str, history: bool) -> StateView {
    let fold = st.patterns.shared_state();
    view_of(fold, room, key, history)
}

/// The view of `key` in a shared-state fold.
pub fn view_of(
    fold: &huddle_core::shared_state::SharedStateFold,
    room: &str,
    key: &str,
    history: bool,
) -> StateView {
    let versions = fold.history(room, key);
    let current = versions.last();
    StateView {
        key: key.to_string(),
        version: current.map_or(0, |v| v.version),
        value: current.map_or(serde_json::Value::Null, |v| v.value.clone()),
        by: current.map(|v| v.by.clone()),
        at: current.map(|v| v.at),
        history: if history {
            versions[..versions.len().saturating_sub(1)]
                .iter()
                .map(StateVersionView::from)
                .collect()
        } else {
            Vec::new()
        },
    }
}

impl AgentSession {
    /// `state_get`: a key's current version and value (version 0 and null when it
    /// was never put), with its history when asked.
    pub async fn state_get(&self, args: StateGetArgs) -> Result<StateView> {
        check_key(&args.key).map_err(AgentError::BadArgument)?;
        let st = self.synced().await?;
        Ok(state_view(&st, &self.room, &args.key, args.history))
    }

    /// `state_list`: every key of the room with its current version and value.
    pub async fn state_list(&self) -> Result<StateListResult> {
        let st = self.synced().await?;
        let keys = st
            .patterns
            .shared_state()
            .list(&self.room)
            .into_iter()
            .map(|(k, _)| state_view(&st, &self.room, k, false))
            .collect();
        Ok(StateListResult { keys })
    }

    /// `state_put`: writes the next version of a key; with `if_version`, only when
    /// that is still the current version (refused as stale otherwise, with the
    /// current version and value).
    pub async fn state_put(&self, args: StatePutArgs) -> Result<StateWritten> {
        check_key(&args.key).map_err(AgentError::BadArgument)?;
        let key = args.key.as_str();
        for _ in 0..BLIND_TRIES {
            let mut st = self.synced().await?;
            let current = st.patterns.shared_state().version(&self.room, key);
            let read = args.if_version.unwrap_or(current);
            if read < current {
                return Err(self.stale(&st, key, read));
            }
            let version = read + 1;
            let body = StatePutBody {
                key: key.to_string(),
                version,
                value: args.value.clone(),
            };
            let row = NewInteraction::new(
                self.room.as_str(),
                Verb::StatePut,
                self.agent.as_str(),
                Role::Agent,
                serde_json::to_value(&body).unwrap_or_default(),
            )
            .with_idempotency_key(state_idempotency_key(&self.room, version, key));
            let ours = row.id();
            let out = match self.store.append(vec![row]).await {
                Ok(out) => out,
                // The database refuses a version whose predecessor it does not hold:
                // `if_version` named a version that was never written.
                Err(huddle_store::StoreError::Backend(why)) if why.contains("state.put refused") => {
                    return Err(AgentError::BadArgument(format!(
                        "key {key:?} has no version {read} (it is at version {current}); read it first"
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            self.store.flush().await;
            self.catch_up(&mut st).await?;
            if out.first().is_some_and(|a| a.id == ours) {
                tracing::debug!(room = %self.room, agent = %self.agent, key, version, "state put");
                let mut state = state_view(&st, &self.room, key, false);
                if state.version < version {
                    // The row is ours but not readable yet (a reader's horizon).
                    state = StateView {
                        key: key.to_string(),
                        version,
                        value: args.value.clone(),
                        by: Some(self.agent.clone()),
                        at: None,
                        history: Vec::new(),
                    };
                }
                return Ok(StateWritten {
                    state,
                    written: written(&out)?,
                });
            }
            // Another writer's version `version` is in the ledger.
            if args.if_version.is_some() {
                let winner = match out.first() {
                    Some(a) => self.store.get(a.id).await?,
                    None => None,
                };
                let mut e = self.stale(&st, key, read);
                if let (Some(w), AgentError::StaleVersion { current, value, .. }) = (winner, &mut e)
                {
                    if let Ok(b) = serde_json::from_value::<StatePutBody>(w.body) {
                        if b.version > *current {
                            *current = b.version;
                            *value = b.value.to_string();
                        }
                    }
                }
                return Err(e);
            }
        }
        Err(AgentError::BadArgument(format!(
            "key {key:?} changed under every one of {BLIND_TRIES} tries; try again"
        )))
    }

    fn stale(&self, st: &Folded, key: &str, read: u64) -> AgentError {
        let now = state_view(st, &self.room, key, false);
        AgentError::StaleVersion {
            key: key.to_string(),
            read,
            current: now.version.max(read + 1),
            value: now.value.to_string(),
        }
    }
}
