//! [`crate::Claims::acquire_resources`] on Postgres: one call of
//! `huddle_resource_acquire` (migration 0007), which locks the room's row of
//! `resource_scope`, applies the conflict rule in SQL at the database clock and takes
//! every claim or none, for the calling role.

use std::time::Duration;

use huddle_core::resources::{parse_resource_key, Blocked, Holding, ResourceName, Wanted};
use huddle_core::Timestamp;
use tokio_postgres::Row;

use super::errors::map_pg;
use super::{micros, PgStore};
use crate::error::{Result, StoreError};
use crate::resources::ResourcesAcquired;
use crate::traits::Epoch;

const ACQUIRE: &str = "SELECT * FROM huddle_resource_acquire($1, $2, $3, $4, $5)";

/// Takes `wanted` (already checked and in the global order).
pub(super) async fn acquire(
    store: &PgStore,
    room: &str,
    holder: &str,
    wanted: &[Wanted],
    ttl: Duration,
) -> Result<ResourcesAcquired> {
    let names: Vec<String> = wanted.iter().map(|w| w.name.to_string()).collect();
    let modes: Vec<String> = wanted.iter().map(|w| w.mode.as_text()).collect();
    let ttl = micros(ttl);
    let client = store.client().await?;
    let statement = client.prepare_cached(ACQUIRE).await.map_err(map_pg)?;
    let rows = client
        .query(&statement, &[&room, &holder, &names, &modes, &ttl])
        .await
        .map_err(map_pg)?;
    drop(client);
    let decoded = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    if decoded.iter().all(|(_, _, won)| *won) && decoded.len() == wanted.len() {
        return Ok(ResourcesAcquired::Won(
            decoded.into_iter().map(|(_, h, _)| h).collect(),
        ));
    }
    Ok(ResourcesAcquired::Blocked(
        decoded
            .into_iter()
            .filter(|(_, _, won)| !won)
            .map(|(wanted, by, _)| Blocked { wanted, by })
            .collect(),
    ))
}

fn decode(row: &Row) -> Result<(ResourceName, Holding, bool)> {
    let wanted: String = row.try_get(0).map_err(map_pg)?;
    let key: String = row.try_get(1).map_err(map_pg)?;
    let corrupt = |what: &str| StoreError::Backend(format!("resource claim {key:?}: {what}"));
    let wanted = ResourceName::parse(&wanted).map_err(|e| corrupt(&e.to_string()))?;
    let (_, _, mode, name) =
        parse_resource_key(&key).ok_or_else(|| corrupt("not a resource claim key"))?;
    let holding = Holding {
        holder: row.try_get(2).map_err(map_pg)?,
        epoch: Epoch(row.try_get(3).map_err(map_pg)?),
        expires_at: Timestamp(row.try_get(4).map_err(map_pg)?),
        name,
        mode,
        key: key.clone(),
    };
    let won: bool = row.try_get(5).map_err(map_pg)?;
    Ok((wanted, holding, won))
}
