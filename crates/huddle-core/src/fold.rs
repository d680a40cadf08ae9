//! Folds: deterministic projections of the ledger into state.
//!
//! A fold is applied to interactions in ledger order (by [`crate::Position`]), never
//! by wall-clock time, random numbers or hash-map iteration order. Its state can be
//! hashed, so relays can check that they converged: the same interactions give
//! byte-identical state everywhere.

use serde::Serialize;

use crate::canonical::canonical_json;
use crate::model::Interaction;

/// A deterministic, incremental projection of interactions into state.
pub trait Fold {
    /// Applies one interaction (the next in ledger order). Must never panic on any
    /// interaction, however malformed its body: a bad body is ignored (and may be
    /// noted in the state).
    fn apply(&mut self, interaction: &Interaction);

    /// A hash of the whole state, equal on every relay that folded the same rows.
    fn state_hash(&self) -> [u8; 32];

    /// Folds `interactions` (in ledger order) from scratch: the full rebuild, equal to
    /// applying them one by one to an empty state.
    fn rebuild<'a, I>(interactions: I) -> Self
    where
        I: IntoIterator<Item = &'a Interaction>,
        Self: Default + Sized,
    {
        let mut fold = Self::default();
        fold.apply_all(interactions);
        fold
    }

    /// Applies every interaction in order.
    fn apply_all<'a, I>(&mut self, interactions: I)
    where
        I: IntoIterator<Item = &'a Interaction>,
        Self: Sized,
    {
        for i in interactions {
            self.apply(i);
        }
    }
}

/// Hashes any serialisable state canonically (sorted keys): use `BTreeMap`s or
/// sorted `Vec`s in fold state so the serialisation itself is deterministic.
pub fn hash_state<T: Serialize>(state: &T) -> [u8; 32] {
    let value = serde_json::to_value(state).unwrap_or(serde_json::Value::Null);
    *blake3::hash(canonical_json(&value).as_bytes()).as_bytes()
}
