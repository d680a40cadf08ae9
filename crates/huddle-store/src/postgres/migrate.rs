//! Applying [`crate::migrations::POSTGRES`] under an advisory lock.

use tokio_postgres::{Client, Config, NoTls};

use super::errors::map_pg;
use crate::migrations::{self, Migration, MIGRATION_LOCK};
use crate::{Result, StoreError};

/// Applies pending migrations on a dedicated session that holds
/// `pg_advisory_lock(MIGRATION_LOCK)` throughout, so relays starting together
/// serialise here and each sees the schema complete. The lock is a session lock: it is
/// released by the unlock below or, if anything fails, when the session closes.
pub(crate) async fn migrate(config: &Config) -> Result<()> {
    let (mut client, connection) = config.connect(NoTls).await.map_err(map_pg)?;
    let driver = tokio::spawn(connection);
    let result = migrate_on(&mut client).await;
    drop(client);
    let _ = driver.await;
    result
}

/// [`migrate`] on an open session (`huddle admin init` runs it as the schema owner).
/// The advisory lock is released at the end, or when the session closes.
pub(crate) async fn migrate_on(client: &mut Client) -> Result<()> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(map_pg)?;
    let exists: bool = client
        .query_one("SELECT to_regclass('huddle_migration') IS NOT NULL", &[])
        .await
        .map_err(map_pg)?
        .try_get(0)
        .map_err(map_pg)?;
    if !exists {
        client
            .batch_execute(
                "CREATE TABLE huddle_migration (
                    version    bigint PRIMARY KEY,
                    name       text NOT NULL,
                    checksum   text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )",
            )
            .await
            .map_err(|e| wrap("creating huddle_migration", e))?;
    }
    let mut applied = Vec::new();
    for row in client
        .query(
            "SELECT version, checksum FROM huddle_migration ORDER BY version",
            &[],
        )
        .await
        .map_err(map_pg)?
    {
        let version: i64 = row.try_get(0).map_err(map_pg)?;
        let checksum: String = row.try_get(1).map_err(map_pg)?;
        applied.push((version, checksum));
    }
    let todo =
        migrations::pending(migrations::POSTGRES, &applied).map_err(StoreError::Migration)?;
    for m in todo {
        apply(client, m).await?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "applied Postgres migration"
        );
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(map_pg)?;
    Ok(())
}

async fn apply(client: &mut Client, m: &Migration) -> Result<()> {
    let what = format!("migration {} ({})", m.version, m.name);
    let tx = client.transaction().await.map_err(map_pg)?;
    tx.batch_execute(m.sql).await.map_err(|e| wrap(&what, e))?;
    tx.execute(
        "INSERT INTO huddle_migration (version, name, checksum) VALUES ($1, $2, $3)",
        &[&m.version, &m.name, &m.checksum()],
    )
    .await
    .map_err(|e| wrap(&what, e))?;
    tx.commit().await.map_err(|e| wrap(&what, e))
}

fn wrap(what: &str, e: tokio_postgres::Error) -> StoreError {
    let denied = e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
    match map_pg(e) {
        StoreError::Unavailable(m) => StoreError::Unavailable(m),
        StoreError::Backend(m) if denied => StoreError::Migration(format!(
            "{what}: {m}; this role may not change the schema: the database administrator \
             runs `huddle admin init` to apply migrations"
        )),
        other => StoreError::Migration(format!("{what}: {other}")),
    }
}
