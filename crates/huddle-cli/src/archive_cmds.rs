//! `huddle room archive`, `huddle room verify-archive` and `huddle admin
//! prune-claims` (plan 0057): glue around `Store::archive_room`,
//! `Store::prune_claims` and `huddle_core::archive`.
//!
//! An archive file is JSON lines: every row of the room as `huddle tail --json`
//! prints it, in ledger order, then the signed `room.archived` row (its content, as
//! written). It is written and synced to disk before anything is removed.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use huddle_core::archive::{archived_row, ArchiveCheck, ArchiveSummary};
use huddle_core::{Fold, Interaction, NewInteraction, Position, Verb};
use huddle_store::{ArchiveRefusal, ArchiveRequest, Store, StoreError, StoreOptions};

use crate::keys;
use crate::ledger_cmds::{claim_rows, open};

/// How many times an archive exports again when rows arrived during its export.
const ATTEMPTS: u32 = 3;

/// The room's `room.archived` row, if it was archived.
pub async fn archived(store: &dyn Store, room: &str) -> anyhow::Result<Option<Interaction>> {
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room(room, cursor, 1000).await?;
        if let Some(row) = batch
            .rows
            .into_iter()
            .find(|r| r.verb == Verb::RoomArchived)
        {
            return Ok(Some(row));
        }
        if batch.next == cursor {
            return Ok(None);
        }
        cursor = batch.next;
    }
}

/// What to say about an archived room.
pub fn archived_note(room: &str, row: &Interaction) -> String {
    let rows = row.body.get("rows").and_then(|r| r.as_u64()).unwrap_or(0);
    format!(
        "room {room} was archived by its owner {} ({rows} rows exported and removed); it \
         cannot be used again (`huddle room verify-archive FILE` reads its archive)",
        row.actor
    )
}

/// Every row of `room` as stored (a `task.lot` as itself, not as its items: the
/// archive matches the database row for row), in ledger order; a row the store could
/// not verify makes the export fail (it could not be archived faithfully).
async fn export(store: &dyn Store, room: &str) -> anyhow::Result<Vec<Interaction>> {
    let mut rows = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_room_rows(room, cursor, 5000).await?;
        if let Some(s) = batch.skipped.first() {
            bail!(
                "room {room} holds a row that does not verify (at {}: {}); it cannot be \
                 exported faithfully, so the room is not archived",
                s.position,
                s.reason
            );
        }
        if batch.next == cursor {
            return Ok(rows);
        }
        cursor = batch.next;
        rows.extend(batch.rows);
    }
}

/// Why the exported room is not settled, if it is not: the test of `huddle wait`
/// (nothing ready, claimed, submitted or running; when it has tasks, a relay's
/// `room.settled` with its current counts).
fn unsettled(room: &str, rows: &[Interaction]) -> Option<String> {
    let mut authority = huddle_core::OwnerAuthority::new();
    let mut tally = huddle_sim::Tally::new(room);
    let mut last: Option<huddle_core::protocol::RoomSettledBody> = None;
    // What readers see: a lot's items (the export checked that every lot unpacks).
    let limits = huddle_core::Limits::default();
    for r in rows
        .iter()
        .flat_map(|r| r.clone().unpacked(&limits).unwrap_or_default())
    {
        authority.apply(&r);
        if authority.admits(&r) {
            tally.apply(&r);
            if r.verb == Verb::RoomSettled {
                last = serde_json::from_value(r.body.clone()).ok();
            }
        }
    }
    let s = tally.dag.summary(room);
    let running = tally
        .board
        .room(room)
        .map(|b| b.open_turns().len())
        .unwrap_or(0);
    if !tally.dag.is_settled(room) || running > 0 {
        return Some(format!(
            "{} ready, {} claimed, {} in review, {running} turns running",
            s.ready, s.claimed, s.submitted
        ));
    }
    let confirmed = last.is_some_and(|b| {
        b.total == s.total
            && b.done == s.done
            && b.abandoned == s.abandoned
            && b.blocked == s.blocked
    });
    if s.total > 0 && !confirmed {
        return Some(
            "no relay has recorded it settled with its current task counts (room.settled)".into(),
        );
    }
    None
}

/// Writes the archive to `path` through a temporary file beside it, synced before it
/// is renamed into place (and the directory after), so a complete file exists before
/// anything is removed from the ledger.
fn write_archive(
    path: &Path,
    rows: &[Interaction],
    archived: &NewInteraction,
) -> anyhow::Result<()> {
    let partial = PathBuf::from(format!("{}.partial", path.display()));
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for row in rows {
        serde_json::to_writer(&mut out, row)?;
        out.write_all(b"\n")?;
    }
    serde_json::to_writer(&mut out, archived)?;
    out.write_all(b"\n")?;
    let file = out
        .into_inner()
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", partial.display()))?;
    file.sync_all()
        .with_context(|| format!("cannot sync {}", partial.display()))?;
    drop(file);
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot move {} to {}", partial.display(), path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// `huddle room archive ROOM --to FILE`: by the room's owner (its key signs the
/// `room.archived` row), a settled room only; exported to FILE, then removed.
pub async fn room_archive(
    url: &str,
    options: StoreOptions,
    room: &str,
    to: &Path,
    owner_flag: Option<&str>,
    key_flag: Option<&Path>,
) -> anyhow::Result<()> {
    if to.exists() {
        bail!(
            "{} exists: give a new file for the archive (nothing was changed)",
            to.display()
        );
    }
    let store = open(url, options).await?;
    if let Some(row) = archived(&*store, room).await? {
        bail!("{}", archived_note(room, &row));
    }
    for attempt in 1..=ATTEMPTS {
        let rows = export(&*store, room).await?;
        let mut authority = huddle_core::OwnerAuthority::new();
        for r in &rows {
            authority.apply(r);
        }
        let config = authority.config();
        let (Some(owner), Some(room_key)) = (config.owner(room), config.owner_key(room)) else {
            bail!(
                "there is no room {room} with an owner key to archive (create rooms with \
                 `huddle room create`)"
            );
        };
        let owner = owner.to_string();
        if let Some(asked) = owner_flag.filter(|o| *o != owner) {
            bail!("room {room} is owned by {owner}, not {asked}: only its owner archives it");
        }
        let path = keys::key_path(&owner, key_flag)?;
        let Some(secret) = keys::load(&path)? else {
            bail!(
                "no owner key for {owner} at {} (use --key PATH or HUDDLE_OWNER_KEY): only \
                 the room's owner archives it",
                path.display()
            );
        };
        if secret.public() != room_key {
            bail!(
                "the key in {} ({}) is not room {room}'s owner key ({}): only the room's \
                 owner archives it",
                path.display(),
                secret.public().short(),
                room_key.short()
            );
        }
        if let Some(why) = unsettled(room, &rows) {
            bail!(
                "room {room} is not settled ({why}): wait for it (`huddle wait --room {room}`) \
                 or cancel what is left (`!cancel`), then archive it"
            );
        }
        let live: Vec<String> = claim_rows(&*store, "", Some(room), true)
            .await?
            .into_iter()
            .map(|c| c.state.key)
            .collect();
        if !live.is_empty() {
            bail!(
                "room {room} is not settled: live claims {} (work is in progress)",
                live.join(", ")
            );
        }
        let archived = secret.sign(archived_row(room, &owner, rows.iter().map(|r| &r.id)));
        // The file must verify before anything is removed.
        let mut check = ArchiveCheck::new(room);
        for r in &rows {
            check.row(r)?;
        }
        let summary = check.finish(&archived)?;
        write_archive(to, &rows, &archived)?;
        let request = ArchiveRequest {
            rows: rows.len() as u64,
            archived,
        };
        match store.archive_room(request).await {
            Ok(out) => {
                store.flush().await;
                println!(
                    "room {room} archived to {}: {} rows (digest {}), {} claims removed; the \
                     ledger keeps its room.archived row {}",
                    to.display(),
                    out.rows_removed,
                    &summary.digest[..16],
                    out.claims_removed,
                    out.id.short()
                );
                return Ok(());
            }
            Err(StoreError::ArchiveRefused {
                reason: ArchiveRefusal::Changed { exported, now },
                ..
            }) if attempt < ATTEMPTS => {
                tracing::info!(
                    room,
                    exported,
                    now,
                    "rows arrived during the export; exporting again"
                );
                let _ = std::fs::remove_file(to);
            }
            Err(e @ StoreError::ArchiveRefused { .. }) => {
                let _ = std::fs::remove_file(to);
                return Err(e.into());
            }
            Err(e) => bail!(
                "{e}; the export in {} is kept: the archive may or may not have happened \
                 (`huddle tail --room {room}` shows whether its room.archived row is there)",
                to.display()
            ),
        }
    }
    bail!("room {room} kept changing while it was exported ({ATTEMPTS} tries); try again")
}

/// Reads and checks an archive file.
pub fn verify_file(path: &Path) -> anyhow::Result<ArchiveSummary> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut lines: Vec<String> = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        if !line.trim().is_empty() {
            lines.push(line);
        }
    }
    let Some(last) = lines.pop() else {
        bail!("{} is empty: not an archive", path.display());
    };
    let archived: NewInteraction = serde_json::from_str(&last).with_context(|| {
        format!(
            "{}: the last line is not the room.archived row",
            path.display()
        )
    })?;
    let mut check = ArchiveCheck::new(&archived.room);
    for (i, line) in lines.iter().enumerate() {
        let row: Interaction = serde_json::from_str(line)
            .with_context(|| format!("{}: line {} is not an interaction", path.display(), i + 1))?;
        check
            .row(&row)
            .with_context(|| format!("{}: line {}", path.display(), i + 1))?;
    }
    check
        .finish(&archived)
        .with_context(|| format!("{} does not verify", path.display()))
}

/// `huddle room verify-archive FILE`.
pub fn verify_archive(path: &Path, json_out: bool) -> anyhow::Result<()> {
    let s = verify_file(path)?;
    if json_out {
        println!(
            "{}",
            serde_json::json!({
                "room": s.room,
                "owner": s.owner,
                "rows": s.rows,
                "digest": s.digest,
                "archived": s.archived.to_string(),
            })
        );
    } else {
        println!(
            "{}: archive of room {} by its owner {}: {} rows, digest {}, room.archived row {}; \
             every id, the count, the digest and the owner's signature verify",
            path.display(),
            s.room,
            s.owner,
            s.rows,
            s.digest,
            s.archived
        );
    }
    Ok(())
}

/// `huddle admin prune-claims [--older-than DUR]`.
pub async fn prune_claims(db: &str, options: StoreOptions, older_than: &str) -> anyhow::Result<()> {
    let ms = huddle_core::config::parse_duration(older_than)
        .map_err(|e| anyhow::anyhow!("--older-than {older_than}: {e} (e.g. 168h, 12h, 30m)"))?;
    let store = open(db, options).await?;
    let pruned = store
        .prune_claims(std::time::Duration::from_millis(ms))
        .await
        .map_err(|e| match e {
            StoreError::Backend(m) if m.contains("permission denied") => anyhow::anyhow!(
                "{m}: only the database administrator prunes claims (run with its --db)"
            ),
            e => e.into(),
        })?;
    println!(
        "pruned {} relay leases expired for more than {older_than} and {} claims of archived rooms",
        pruned.relay_leases, pruned.archived_rooms
    );
    Ok(())
}
