//! Resource leases on the claims table: what [`crate::Claims::acquire_resources`]
//! answers, the checks every backend makes before it, and the listing of a room's
//! holdings.
//!
//! Every backend decides an acquisition in **one transaction under one lock** (the
//! room's): it reads the room's live resource claims by the database clock, applies
//! the rule of [`huddle_core::resources::blockers`] (Postgres: the same rule in SQL,
//! migration 0007), and either takes every wanted resource — each a claim
//! `resource/<room>/<holder>/<mode>/<name>` upserted like [`crate::Claims::acquire`],
//! in the global order — or changes nothing and names what is in the way.

use huddle_core::resources::{
    ordered, parse_resource_key, room_prefix, Blocked, Holding, Mode, ResourceName, Wanted,
};
use huddle_core::validate_name;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::traits::{ClaimRow, Claims};

/// The outcome of [`crate::Claims::acquire_resources`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResourcesAcquired {
    /// The caller holds every wanted resource now, in the global order.
    Won(Vec<Holding>),
    /// Nothing was taken: these holdings of others are in the way.
    Blocked(Vec<Blocked>),
}

impl ResourcesAcquired {
    /// Whether the caller won.
    pub fn won(&self) -> bool {
        matches!(self, ResourcesAcquired::Won(_))
    }
}

/// Checks what every backend checks before an acquisition: room and holder are names
/// (no `/`), and the wanted set is valid ([`ordered`]); returns it in the global order.
pub(crate) fn checked_request(
    limits: &huddle_core::Limits,
    room: &str,
    holder: &str,
    wanted: &[Wanted],
) -> Result<Vec<Wanted>> {
    validate_name("room", room, limits)?;
    validate_name("holder", holder, limits)?;
    ordered(wanted.to_vec()).map_err(|e| StoreError::Backend(e.to_string()))
}

/// A resource claim row read back as a holding; `None` for a key of another shape
/// (written around the store).
pub fn holding(row: &ClaimRow) -> Option<Holding> {
    let (_, holder, mode, name) = parse_resource_key(&row.state.key)?;
    if holder != row.state.holder {
        return None;
    }
    Some(Holding {
        key: row.state.key.clone(),
        holder: holder.to_string(),
        name,
        mode,
        epoch: row.state.epoch,
        expires_at: row.state.expires_at,
    })
}

/// The live holdings of `room`, by claim key (the database's view at its clock).
pub async fn live_holdings(claims: &dyn Claims, room: &str) -> Result<Vec<Holding>> {
    Ok(claims
        .list_claims(&room_prefix(room))
        .await?
        .iter()
        .filter(|r| r.live)
        .filter_map(holding)
        .collect())
}

/// The holdings a won acquisition reports, one per wanted resource in order, from the
/// claim states each upsert returned.
pub(crate) fn won_holding(
    holder: &str,
    name: &ResourceName,
    mode: Mode,
    state: crate::traits::ClaimState,
) -> Holding {
    Holding {
        key: state.key,
        holder: holder.to_string(),
        name: name.clone(),
        mode,
        epoch: state.epoch,
        expires_at: state.expires_at,
    }
}
