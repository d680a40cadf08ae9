//! Ledger commands: migrate, room create, post, tail, claims.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use huddle_core::commands::command_word;
use huddle_core::config::binding::signing_refusal;
use huddle_core::{ConfigFold, Fold, NewInteraction, Position, Role, Verb};
use huddle_store::{Store, StoreOptions, Subscription};
use serde_json::json;

use crate::{keys, output};

/// The exit status of `huddle post` when an owner command was posted as an ordinary
/// message because it could not be signed.
pub const EXIT_NOT_SIGNED: u8 = 3;

/// `huddle post` posted the text, but not as an owner command: why.
#[derive(Debug, thiserror::Error)]
#[error("posted as an ordinary message; it will NOT be executed as an owner command: {0}")]
pub struct NotSigned(pub String);

/// Opens the store at `url`, applying migrations, with a message that names it.
pub async fn open(url: &str, options: StoreOptions) -> anyhow::Result<Arc<dyn Store>> {
    huddle_store::open(url, options)
        .await
        .with_context(|| format!("cannot open the database {url:?}"))
}

/// Fails with "no such database" (and how to make one) when `url` names a SQLite
/// file that does not exist, so that a typo in `--db` does not quietly create an
/// empty database. Postgres reports a missing database when it connects.
pub fn require_database(url: &str) -> anyhow::Result<()> {
    if let Ok(huddle_store::Backend::Sqlite(path)) = huddle_store::parse_url(url) {
        let in_memory = path.is_empty() || path.starts_with(":memory:");
        if !in_memory && !Path::new(&path).exists() {
            bail!(
                "no such database {path:?}: create it with `huddle --db {url} migrate` \
                 (or `huddle --db {url} room create ROOM --owner ID`), or fix --db / HUDDLE_DB"
            );
        }
    }
    Ok(())
}

/// Fails with the command that creates room `room` when it does not exist; returns
/// its owner.
pub async fn existing_room(store: &dyn Store, room: &str) -> anyhow::Result<String> {
    match room_owner(store, room).await? {
        Some(owner) => Ok(owner),
        None => match crate::archive_cmds::archived(store, room).await? {
            Some(row) => bail!("{}", crate::archive_cmds::archived_note(room, &row)),
            None => bail!(
                "there is no room {room:?}; create it with `huddle room create {room} --owner ID`"
            ),
        },
    }
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

/// The room's owners, keys and config as the relays fold them: every row of the
/// room read through the owner authority, so only verified commands count.
pub async fn room_authority(store: &dyn Store, room: &str) -> anyhow::Result<ConfigFold> {
    let mut authority = huddle_core::OwnerAuthority::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await?;
        for row in &batch.rows {
            authority.apply(row);
        }
        if batch.next == cursor {
            return Ok(authority.config().clone());
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

/// `huddle room create`: records the owner's public key in `room.created`; the
/// owner's key file is created when absent (mode 0600).
pub async fn room_create(
    url: &str,
    options: StoreOptions,
    room: &str,
    owner: &str,
    key_flag: Option<&Path>,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    if let Some(existing) = room_owner(&*store, room).await? {
        if existing == owner {
            println!("room {room} already exists, owned by {owner}");
            return Ok(());
        }
        bail!("room {room} already exists and is owned by {existing}");
    }
    if let Some(row) = crate::archive_cmds::archived(&*store, room).await? {
        bail!(
            "{}: choose another room name",
            crate::archive_cmds::archived_note(room, &row)
        );
    }
    huddle_core::validate_name("owner", owner, &huddle_core::Limits::default())?;
    let path = keys::key_path(owner, key_flag)?;
    let (secret, fresh) = keys::load_or_create(&path)?;
    let key = secret.public();
    let created = NewInteraction::new(
        room,
        Verb::RoomCreated,
        owner,
        Role::Owner,
        json!({ "owner": owner, "key": key.to_hex() }),
    );
    let out = store.append(vec![created]).await?;
    store.flush().await;
    // A concurrent creator may have won: the first room.created is the room.
    let winner = room_authority(&*store, room).await?;
    if winner.owner(room) != Some(owner) || winner.owner_key(room) != Some(key) {
        bail!(
            "room {room} was just created by someone else, owned by {}",
            winner.owner(room).unwrap_or("nobody")
        );
    }
    println!(
        "created room {room} owned by {owner} ({}); owner key {} {} {}",
        out[0].id.short(),
        key.short(),
        if fresh { "generated in" } else { "from" },
        path.display()
    );
    Ok(())
}

/// `huddle room rotate-key`. Safe to run again after any failure: the next key waits
/// in `<key file>.next` until the rotation is in the ledger, so a retry signs the same
/// rotation (the same row) and the key file is replaced only once the ledger shows the
/// new key.
pub async fn room_rotate_key(
    url: &str,
    options: StoreOptions,
    room: &str,
    owner: &str,
    key_flag: Option<&Path>,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    let authority = room_authority(&*store, room).await?;
    let Some(current_owner) = authority.owner(room) else {
        bail!("room {room} does not exist (create it with `huddle room create`)");
    };
    if current_owner != owner {
        bail!("room {room} is owned by {current_owner}, not {owner}");
    }
    let Some(room_key) = authority.owner_key(room) else {
        bail!("room {room} has no owner key to rotate");
    };
    let path = keys::key_path(owner, key_flag)?;
    let next_path = keys::with_suffix(&path, ".next");
    let Some(secret) = keys::load(&path)? else {
        bail!(
            "no key file at {}: the owner's current key is needed to sign the rotation",
            path.display()
        );
    };
    if secret.public() != room_key {
        // A rotation that landed before its key files were swapped: finish the swap.
        if let Some(next) = keys::load(&next_path)? {
            if next.public() == room_key {
                let retired = keys::retire(&path, &secret.public(), &next_path)?;
                println!(
                    "room {room}: owner key {} is already in the ledger; {} now holds it (old key kept in {})",
                    room_key.short(),
                    path.display(),
                    retired.display()
                );
                return Ok(());
            }
        }
        bail!(
            "{} holds key {}, but room {room}'s owner key is {}: pass the current key with --key",
            path.display(),
            secret.public().short(),
            room_key.short()
        );
    }
    let (next, _) = keys::load_or_create(&next_path)?;
    let rotation = secret.sign(NewInteraction::new(
        room,
        Verb::RoomKeyRotated,
        owner,
        Role::Owner,
        json!({ "key": next.public().to_hex() }),
    ));
    store.append(vec![rotation]).await?;
    store.flush().await;
    let after = room_authority(&*store, room).await?;
    if after.owner_key(room) != Some(next.public()) {
        bail!(
            "the rotation was written but room {room}'s key is still {}: another rotation may have raced it",
            after.owner_key(room).map(|k| k.short()).unwrap_or_default()
        );
    }
    let retired = keys::retire(&path, &secret.public(), &next_path)?;
    println!(
        "room {room}: owner key rotated from {} to {}; {} holds the new key (old key kept in {})",
        secret.public().short(),
        next.public().short(),
        path.display(),
        retired.display()
    );
    Ok(())
}

/// Who posts with `huddle post`, where, and in answer to what.
pub struct Speaker<'a> {
    /// Who is speaking.
    pub actor: &'a str,
    /// The thread, if any.
    pub thread: Option<String>,
    /// The message answered (an id or a unique prefix).
    pub reply_to: Option<&'a str>,
    /// The owner key file flag.
    pub key: Option<&'a Path>,
    /// `--wait`: how long to wait for the reply, if at all.
    pub wait: Option<std::time::Duration>,
}

/// Whether `row` answers `message`: a message (an agent's reply or huddle's answer to
/// an owner command) with `message` as parent.
fn answers(row: &huddle_core::Interaction, message: huddle_core::InteractionId) -> bool {
    row.parent == Some(message) && row.verb == Verb::MessagePosted
}

/// Waits up to `limit` for the first answer to `message` in `room` — a message whose
/// parent is `message`: an agent's reply, or huddle's answer to an owner command —
/// reading the room forward from `after` (any cursor from before `message` was
/// appended), then every new row as the store's doorbell rings. `Ok(None)` when none
/// came in time. `huddle post --wait` and `huddle serve --owner` both wait so.
pub async fn await_answer(
    store: Arc<dyn Store>,
    room: &str,
    message: huddle_core::InteractionId,
    after: Position,
    limit: std::time::Duration,
) -> anyhow::Result<Option<huddle_core::Interaction>> {
    let is_answer = |r: &huddle_core::Interaction| r.room == room && answers(r, message);
    let wait = async {
        let mut cursor = after;
        loop {
            let batch = store.read_room(room, cursor, 1000).await?;
            if let Some(row) = batch.rows.into_iter().find(is_answer) {
                return Ok(row);
            }
            if batch.next == cursor {
                break;
            }
            cursor = batch.next;
        }
        let ledger: Arc<dyn huddle_store::Ledger> = store.clone();
        let mut sub = Subscription::for_rooms(ledger, vec![room.to_string()], cursor, 1000);
        loop {
            match sub.next().await {
                Ok(batch) => {
                    if let Some(row) = batch.rows.into_iter().find(is_answer) {
                        return Ok(row);
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "database unavailable; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(anyhow::Error::from(e)),
            }
        }
    };
    match tokio::time::timeout(limit, wait).await {
        Ok(found) => found.map(Some),
        Err(_) => Ok(None),
    }
}

/// Waits up to `limit` for the first answer to `message` in `room` and prints it.
async fn wait_for_answer(
    store: Arc<dyn Store>,
    room: &str,
    message: huddle_core::InteractionId,
    limit: std::time::Duration,
) -> anyhow::Result<()> {
    match await_answer(store, room, message, Position::START, limit).await? {
        Some(row) => {
            let text = row.body.get("text").and_then(|t| t.as_str()).unwrap_or("");
            println!("{} ({}): {text}", row.actor, row.role);
            Ok(())
        }
        None => bail!(
            "no reply to {} within {} s (is a relay running for room {room}? `huddle tail --room {room}` shows what happened)",
            message.short(),
            limit.as_secs_f64()
        ),
    }
}

/// Shortest id prefix `--reply-to` accepts.
const MIN_ID_PREFIX: usize = 6;

/// The interaction of `room` whose id is `wanted` or starts with it.
async fn find_interaction(
    store: &dyn Store,
    room: &str,
    wanted: &str,
) -> anyhow::Result<huddle_core::Interaction> {
    let wanted = wanted.trim().to_ascii_lowercase();
    if wanted.len() < MIN_ID_PREFIX || !wanted.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "--reply-to {wanted:?} is not an interaction id: give the id (64 hex digits, as \
             `huddle tail` prints it) or a prefix of at least {MIN_ID_PREFIX} of them"
        );
    }
    if let Ok(id) = wanted.parse::<huddle_core::InteractionId>() {
        match store.get(id).await? {
            Some(row) if row.room == room => return Ok(row),
            Some(_) => bail!("--reply-to: there is no interaction {wanted} in room {room}"),
            // Not a row: an item of a task lot is found by reading the room.
            None => {}
        }
    }
    let mut found: Vec<huddle_core::Interaction> = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await?;
        found.extend(
            batch
                .rows
                .into_iter()
                .filter(|r| r.id.to_string().starts_with(&wanted)),
        );
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("--reply-to: no interaction in room {room} has an id starting with {wanted}"),
        n => bail!(
            "--reply-to: {n} interactions in room {room} have ids starting with {wanted} ({}): give more digits",
            found
                .iter()
                .take(5)
                .map(|r| r.id.to_string()[..12].to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The owner's key as a poster has it: the file it is read from (named in errors) and
/// the key, if the file exists.
pub struct OwnerKey<'a> {
    /// Where the key is read from.
    pub path: &'a Path,
    /// The key; `None` when there is no such file.
    pub secret: Option<&'a huddle_core::signing::OwnerSecret>,
}

/// A message to append: who says what where.
pub struct Outgoing<'a> {
    /// The room.
    pub room: &'a str,
    /// Who says it.
    pub actor: &'a str,
    /// `owner` when the actor owns the room, else `human`.
    pub role: Role,
    /// The text.
    pub text: &'a str,
    /// The thread, if any.
    pub thread: Option<String>,
    /// The message answered, if any (its thread is used when none is given).
    pub parent: Option<&'a huddle_core::Interaction>,
    /// The owner's key, for an owner (`None`: not at hand).
    pub key: Option<OwnerKey<'a>>,
}

/// The message `huddle post` (and `huddle serve --owner`) appends, and — for an
/// owner command that cannot be signed with the room's owner key — why it will not be
/// executed. An owner's command is signed with the owner's key; the owner's other
/// messages are signed when the key is the room's. `config` is the room's as the
/// owner authority folds it (owner and key). Fails when every reader would ignore the
/// row (the room requires signatures the poster cannot make).
pub fn compose_message(
    store: &dyn Store,
    config: &ConfigFold,
    out: Outgoing<'_>,
) -> anyhow::Result<(NewInteraction, Option<String>)> {
    let Outgoing {
        room,
        actor,
        role,
        text,
        thread,
        parent,
        key,
    } = out;
    // A nonce makes every post a new message: the same text said twice is said twice.
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness for a nonce: {e}"))?;
    let nonce = huddle_core::protocol::nonce_from(&seed);
    let mut message = NewInteraction::new(
        room,
        Verb::MessagePosted,
        actor,
        role,
        json!({ "text": text, "nonce": nonce }),
    );
    message.thread = thread;
    if let Some(parent) = parent {
        if message.thread.is_none() {
            message.thread = parent.thread.clone();
        }
        message = message.with_parent(parent.id);
    }
    let mut not_signed = None;
    let is_command = command_word(text).is_some();
    let mut owner_signed = false;
    let room_key = config.owner_key(room);
    if let (Role::Owner, Some(key)) = (role, key.as_ref()) {
        match (key.secret, room_key) {
            (Some(secret), Some(k)) if secret.public() == k => {
                message = secret.sign(message);
                owner_signed = true;
            }
            // The owner's other messages are signed when the key is at hand (a room
            // that requires signatures counts them then); without it they are posted
            // as they are.
            _ if !is_command => {}
            (_, None) => {
                not_signed = Some(format!("room {room} has no owner key to sign for"));
            }
            (Some(secret), Some(k)) => {
                not_signed = Some(format!(
                    "the key in {} ({}) is not the room's owner key ({})",
                    key.path.display(),
                    secret.public().short(),
                    k.short()
                ));
            }
            (None, Some(_)) => {
                not_signed = Some(format!(
                    "no owner key for {actor} at {} (use --key PATH or HUDDLE_OWNER_KEY)",
                    key.path.display()
                ));
            }
        }
    }
    // A row every reader would ignore is not posted: the room requires signatures
    // (or registers keys for this writer) and neither the owner's key nor a
    // registered writer key signs it.
    if let (false, Some(writer)) = (owner_signed, store.writer()) {
        let effective = config.effective(room, None);
        let signer = store.signer();
        if let Err(e) = signing_refusal(&effective, room, &writer, signer.as_ref()) {
            let owner = not_signed
                .map(|why| format!("; it is not signed with the owner's key either: {why}"))
                .unwrap_or_default();
            anyhow::bail!("not posted, every reader would ignore it: {e}{owner}");
        }
    }
    Ok((message, not_signed))
}

/// `huddle post`. An owner command (`!delegate`, `!config`) by the room's owner is
/// signed with the owner's key; without that key the text is posted as an ordinary
/// message and [`NotSigned`] says why.
pub async fn post(
    url: &str,
    options: StoreOptions,
    room: &str,
    speaker: Speaker<'_>,
    text: &str,
) -> anyhow::Result<()> {
    let Speaker {
        actor,
        thread,
        reply_to,
        key: key_flag,
        wait,
    } = speaker;
    let text = if text == "-" {
        let mut buf = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut buf)
            .context("cannot read the message from standard input")?;
        buf
    } else {
        text.to_string()
    };
    let store = open(url, options).await?;
    let owner = existing_room(&*store, room).await?;
    let role = if owner == actor {
        Role::Owner
    } else {
        Role::Human
    };
    let parent = match reply_to {
        Some(wanted) => Some(find_interaction(&*store, room, wanted).await?),
        None => None,
    };
    let config = room_authority(&*store, room).await?;
    // The owner's key: a command needs it (a file that cannot be read is an error); the
    // owner's other messages use it when it is at hand.
    let key = match role {
        Role::Owner => {
            let path = keys::key_path(actor, key_flag)?;
            let secret = if command_word(&text).is_some() {
                keys::load(&path)?
            } else {
                keys::load(&path).ok().flatten()
            };
            Some((path, secret))
        }
        _ => None,
    };
    let (message, not_signed) = compose_message(
        &*store,
        &config,
        Outgoing {
            room,
            actor,
            role,
            text: &text,
            thread,
            parent: parent.as_ref(),
            key: key.as_ref().map(|(path, secret)| OwnerKey {
                path,
                secret: secret.as_ref(),
            }),
        },
    )?;
    let out = store.append(vec![message]).await?;
    store.flush().await;
    println!("{}", out[0].id);
    if let Some(why) = not_signed {
        return Err(NotSigned(why).into());
    }
    match wait {
        Some(limit) => wait_for_answer(store, room, out[0].id, limit).await,
        None => Ok(()),
    }
}

/// Which rows `huddle tail` prints.
#[derive(Debug, Default)]
pub struct TailFilter {
    /// `Some(None)`: the room's top level only; `Some(Some(t))`: thread `t` only.
    thread: Option<Option<String>>,
    /// Exact verbs, or families (`task.`); empty: every verb.
    verbs: Vec<String>,
    /// Rows at or after this time only (µs since the Unix epoch, this machine's clock).
    since_us: Option<i64>,
}

impl TailFilter {
    /// From `--thread`, `--verb` and `--since`; an unknown verb or a bad duration is an
    /// error naming it (and, for verbs, what there is).
    pub fn new(
        thread: Option<String>,
        verbs: Vec<String>,
        since: Option<&str>,
    ) -> anyhow::Result<TailFilter> {
        let known: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
        for v in &verbs {
            let ok = if v.ends_with('.') {
                known.iter().any(|k| k.starts_with(v.as_str()))
            } else {
                known.contains(&v.as_str())
            };
            if !ok {
                anyhow::bail!(
                    "--verb {v}: no such verb (verbs: {}; `task.` means every task.* verb)",
                    known.join(", ")
                );
            }
        }
        let since_us = match since {
            None => None,
            Some(text) => {
                let ms = huddle_core::config::parse_duration(text)
                    .map_err(|e| anyhow::anyhow!("--since {text}: {e} (e.g. 30s, 10m, 1h30m)"))?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_micros() as i64)
                    .unwrap_or(0);
                Some(now.saturating_sub((ms as i64).saturating_mul(1000)))
            }
        };
        Ok(TailFilter {
            thread: thread.map(|t| (t != "-").then_some(t)),
            verbs,
            since_us,
        })
    }

    /// Whether `row` is printed.
    pub fn admits(&self, row: &huddle_core::Interaction) -> bool {
        if let Some(thread) = &self.thread {
            if row.thread != *thread {
                return false;
            }
        }
        if !self.verbs.is_empty() {
            let verb = row.verb.as_str();
            let hit = self.verbs.iter().any(|v| {
                if v.ends_with('.') {
                    verb.starts_with(v.as_str())
                } else {
                    verb == v
                }
            });
            if !hit {
                return false;
            }
        }
        self.since_us.is_none_or(|t| row.at.as_micros() >= t)
    }
}

/// `huddle tail`
pub async fn tail(
    url: &str,
    options: StoreOptions,
    room: &str,
    follow: bool,
    json_out: bool,
    filter: &TailFilter,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    existing_room(&*store, room).await?;
    let print = |rows: &[huddle_core::Interaction]| -> anyhow::Result<()> {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for row in rows.iter().filter(|r| r.room == room && filter.admits(r)) {
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
    let mut sub = Subscription::for_rooms(ledger, vec![room.to_string()], cursor, 1000);
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
    room: Option<&str>,
    live: bool,
    json_out: bool,
) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    if let Some(room) = room {
        existing_room(&*store, room).await?;
    }
    let rows = claim_rows(&*store, prefix, room, live).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no claims");
    }
    for row in rows {
        let driven = row
            .driver
            .as_deref()
            .map_or(String::new(), |d| format!(" driven by {d}"));
        println!(
            "{} held by {}{driven} epoch {} {} {}",
            row.state.key,
            row.state.holder,
            row.state.epoch,
            if row.live { "until" } else { "expired at" },
            output::format_time(row.state.expires_at)
        );
    }
    Ok(())
}

/// The claims `huddle claims --json` prints (and `huddle serve` answers): keys
/// starting with `prefix`, only `room`'s when given, only live ones with `live`.
pub async fn claim_rows(
    store: &dyn Store,
    prefix: &str,
    room: Option<&str>,
    live: bool,
) -> anyhow::Result<Vec<huddle_store::ClaimRow>> {
    Ok(store
        .list_claims(prefix)
        .await?
        .into_iter()
        .filter(|r| !live || r.live)
        // Every room-scoped key is `<kind>/<room>/...` (names hold no `/`).
        .filter(|r| room.is_none_or(|room| r.state.key.split('/').nth(1) == Some(room)))
        .collect())
}

/// One room of `huddle room list`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RoomRow {
    /// The room.
    pub room: String,
    /// Its owner (from its first `room.created`); `None` for rows in a room that was
    /// never created.
    pub owner: Option<String>,
    /// How many rows the room has.
    pub rows: u64,
    /// Whether its owner archived it (its rows but the `room.archived` one are gone,
    /// so it has no owner any more).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub archived: bool,
    /// Database time of its latest row (for the dashboard; not in `--json`).
    #[serde(skip)]
    pub last_at: Option<huddle_core::Timestamp>,
}

/// `huddle room list`: every room in the ledger with its owner and row count.
pub async fn room_list(url: &str, options: StoreOptions, json_out: bool) -> anyhow::Result<()> {
    let store = open(url, options).await?;
    let rooms = room_rows(&*store).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rooms)?);
        return Ok(());
    }
    if rooms.is_empty() {
        println!("no rooms (create one with `huddle room create ROOM --owner ID`)");
    }
    for r in &rooms {
        if r.archived {
            println!("{}  archived (its room.archived row alone is left)", r.room);
            continue;
        }
        println!(
            "{}  owner {}  {} rows",
            r.room,
            r.owner.as_deref().unwrap_or("(none: never created)"),
            r.rows
        );
    }
    Ok(())
}

/// Every room in the ledger with its owner and row count, by name: what `huddle room
/// list --json` prints (and `huddle serve` answers).
pub async fn room_rows(store: &dyn Store) -> anyhow::Result<Vec<RoomRow>> {
    let mut rooms = RoomRows::default();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_forward(cursor, 1000).await?;
        for row in &batch.rows {
            rooms.apply(row);
        }
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
    }
    Ok(rooms.rows())
}

/// The fold behind `huddle room list`: every room's owner (its first `room.created`),
/// rows and latest row, folded row by row (so `huddle serve` keeps one and reads only
/// what is new).
#[derive(Debug, Default)]
pub struct RoomRows {
    rooms: std::collections::BTreeMap<String, RoomRow>,
}

impl RoomRows {
    /// Folds one verified row.
    pub fn apply(&mut self, row: &huddle_core::Interaction) {
        let entry = self
            .rooms
            .entry(row.room.clone())
            .or_insert_with(|| RoomRow {
                room: row.room.clone(),
                owner: None,
                rows: 0,
                archived: false,
                last_at: None,
            });
        entry.rows += 1;
        entry.last_at = entry.last_at.max(Some(row.at));
        entry.archived |= row.verb == Verb::RoomArchived;
        if entry.owner.is_none() && row.verb == Verb::RoomCreated {
            entry.owner = row
                .body
                .get("owner")
                .and_then(|o| o.as_str())
                .map(String::from);
        }
    }

    /// Every room, by name.
    pub fn rows(&self) -> Vec<RoomRow> {
        self.rooms.values().cloned().collect()
    }

    /// One room, if it has rows.
    pub fn get(&self, room: &str) -> Option<&RoomRow> {
        self.rooms.get(room)
    }
}
