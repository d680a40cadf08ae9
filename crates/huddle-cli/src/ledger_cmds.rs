//! Ledger commands: migrate, room create, post, tail, claims.

use std::sync::Arc;

use anyhow::{bail, Context};
use huddle_core::{NewInteraction, Position, Role, Verb};
use huddle_store::{Store, StoreOptions, Subscription};
use serde_json::json;

use crate::output;

/// Opens the store at `url`, applying migrations, with a message that names it.
pub async fn open(url: &str, options: StoreOptions) -> anyhow::Result<Arc<dyn Store>> {
    huddle_store::open(url, options)
        .await
        .with_context(|| format!("cannot open the database {url:?}"))
}

/// The owner named by the room's first `room.created`, if the room exists.
pub async fn room_owner(store: &dyn Store, room: &str) -> anyhow::Result<Option<String>> {
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await?;
        for row in &batch.rows {
            if row.verb == Verb::RoomCreated {
                if let Some(owner) = row.body.get("owner").and_then(|o| o.as_str()) {
                    return Ok(Some(owner.to_string()));
                }
            }
        }
        if batch.next == cursor {
            return Ok(None);
        }
        cursor = batch.next;
    }
}

/// `huddle migrate`
pub async fn migrate(url: &str, options: StoreOptions) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    println!(
        "{} database {url} is migrated and ready",
        store.backend_name()
    );
    Ok(())
}

/// `huddle room create`
pub async fn room_create(
    url: &str,
    options: StoreOptions,
    room: &str,
    owner: &str,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    if let Some(existing) = room_owner(&*store, room).await? {
        if existing == owner {
            println!("room {room} already exists, owned by {owner}");
            return Ok(());
        }
        bail!("room {room} already exists and is owned by {existing}");
    }
    let created = NewInteraction::new(
        room,
        Verb::RoomCreated,
        owner,
        Role::Owner,
        json!({ "owner": owner }),
    );
    let out = store.append(vec![created]).await?;
    store.flush().await;
    // A concurrent creator may have won: the first room.created is the room.
    let winner = room_owner(&*store, room).await?.unwrap_or_default();
    if winner != owner {
        bail!("room {room} was just created by someone else, owned by {winner}");
    }
    println!(
        "created room {room} owned by {owner} ({})",
        out[0].id.short()
    );
    Ok(())
}

/// `huddle post`
pub async fn post(
    url: &str,
    options: StoreOptions,
    room: &str,
    actor: &str,
    thread: Option<String>,
    text: &str,
) -> anyhow::Result<()> {
    let text = if text == "-" {
        let mut buf = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut buf)
            .context("cannot read the message from standard input")?;
        buf
    } else {
        text.to_string()
    };
    let store = open(url, options).await?;
    let Some(owner) = room_owner(&*store, room).await? else {
        bail!("there is no room {room:?}; create it with `huddle room create {room} --owner ID`");
    };
    let role = if owner == actor {
        Role::Owner
    } else {
        Role::Human
    };
    let mut message = NewInteraction::new(
        room,
        Verb::MessagePosted,
        actor,
        role,
        json!({ "text": text }),
    );
    message.thread = thread;
    let out = store.append(vec![message]).await?;
    store.flush().await;
    println!("{}", out[0].id);
    Ok(())
}

/// `huddle tail`
pub async fn tail(
    url: &str,
    options: StoreOptions,
    room: &str,
    follow: bool,
    json_out: bool,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    let print = |rows: &[huddle_core::Interaction]| -> anyhow::Result<()> {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for row in rows.iter().filter(|r| r.room == room) {
            if json_out {
                writeln!(out, "{}", serde_json::to_string(row)?)?;
            } else {
                writeln!(out, "{}", output::line(row))?;
            }
        }
        out.flush()?;
        Ok(())
    };
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await?;
        print(&batch.rows)?;
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    if !follow {
        return Ok(());
    }
    let ledger: Arc<dyn huddle_store::Ledger> = store;
    let mut sub = Subscription::new(ledger, cursor, 1000);
    loop {
        tokio::select! {
            batch = sub.next() => match batch {
                Ok(batch) => print(&batch.rows)?,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "database unavailable; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.into()),
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// `huddle claims`
pub async fn claims(
    url: &str,
    options: StoreOptions,
    prefix: &str,
    json_out: bool,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    let rows = store.list_claims(prefix).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no claims");
    }
    for row in rows {
        println!(
            "{} held by {} epoch {} {} {}",
            row.state.key,
            row.state.holder,
            row.state.epoch,
            if row.live { "until" } else { "expired at" },
            output::format_time(row.state.expires_at)
        );
    }
    Ok(())
}
