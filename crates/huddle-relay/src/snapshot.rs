//! A relay's snapshot file: the state its folds reached and where in the ledger, so a
//! restart reads on from there instead of from the first row (plan 0063).
//!
//! The file is one JSON header line, then the body (CBOR). The header names the
//! format, the build that wrote it (a hash of the executable: fold logic may change
//! between builds), a fingerprint of what the relay hosts, the cursor, the last row
//! folded (id and position) and the body's length and BLAKE3 hash. A snapshot is
//! trusted only when every one of those checks out ([`read`]) and the ledger still
//! holds that last row where the snapshot says ([`Snapshot::check_ledger`]); anything
//! else is a [`Refused`] with its reason, and the relay reads from the first row.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use huddle_core::sync::{from_cbor, to_cbor, LocalAgent, SyncOptions};
use huddle_core::thread::ThreadWindow;
use huddle_core::{Interaction, InteractionId, Position};
use huddle_store::Store;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The snapshot format; bumped when the layout of the state changes.
pub const FORMAT: u32 = 1;

/// Rows folded between two snapshots written while the relay runs (default).
pub const DEFAULT_EVERY_ROWS: u64 = 100_000;

/// Why a snapshot was not used.
#[derive(Debug, Error)]
pub enum Refused {
    /// No file yet.
    #[error("no snapshot at {0} yet")]
    Missing(PathBuf),
    /// The file could not be read.
    #[error("cannot read {path}: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The header line is missing or malformed.
    #[error("the header is malformed: {0}")]
    Header(String),
    /// Written in another format.
    #[error("format {found}, this relay reads format {FORMAT}")]
    Format {
        /// The file's format.
        found: u32,
    },
    /// Written by another build of huddle.
    #[error("written by another build ({found}), this one is {ours}")]
    Build {
        /// The file's build.
        found: String,
        /// This build.
        ours: String,
    },
    /// Written by a relay hosting other rooms, agents or options.
    #[error(
        "written for another relay configuration (relay id, rooms, agents or options changed)"
    )]
    Fingerprint,
    /// The body is not as long as the header says.
    #[error("the body is {found} bytes, the header says {expected}")]
    Length {
        /// The header's length.
        expected: u64,
        /// The body's.
        found: u64,
    },
    /// The body's hash is not the header's.
    #[error("the body's hash does not match the header (corrupt or altered)")]
    Hash,
    /// The body does not decode.
    #[error("the body does not decode: {0}")]
    Decode(String),
    /// The ledger no longer holds the last row folded.
    #[error("the ledger does not hold the last row folded ({0}): another or an older database")]
    LedgerMissing(String),
    /// The ledger holds it at another position.
    #[error("the ledger holds the last row folded at {found}, the snapshot says {expected}")]
    LedgerMoved {
        /// The snapshot's position.
        expected: Position,
        /// The ledger's.
        found: Position,
    },
    /// The ledger could not be asked.
    #[error("cannot check the ledger: {0}")]
    Store(String),
}

/// The state of a relay's folds, as saved.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RelayState {
    /// [`huddle_core::sync::Synchronizer::save_state`].
    pub sync: Vec<u8>,
    /// The owner-command authority ([`crate::commands::CommandHandler::save_state`]).
    pub commands: Vec<u8>,
    /// The `<thread>` windows.
    pub threads: ThreadWindow,
    /// The recent messages of each served room.
    pub recent: BTreeMap<String, VecDeque<Interaction>>,
    /// `room.archived` rows folded for rooms the relay was configured to serve.
    pub archived: Vec<Interaction>,
}

/// A snapshot: the state and where it stands in the ledger.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Read on from here.
    pub cursor: Position,
    /// The last row folded, when any.
    pub last: Option<(InteractionId, Position)>,
    /// Rows folded into the state, from the first row.
    pub rows: u64,
    /// The state.
    pub state: RelayState,
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    build: String,
    fingerprint: String,
    cursor: String,
    last: Option<(String, String)>,
    rows: u64,
    body_len: u64,
    body_hash: String,
}

/// What the relay hosts, hashed: a snapshot written under another configuration is
/// not used (its open messages, for one, depend on which agents are local).
pub fn fingerprint(
    relay: &str,
    rooms: &[String],
    agents: &[LocalAgent],
    options: &SyncOptions,
) -> String {
    let mut rooms = rooms.to_vec();
    rooms.sort();
    let mut agents = agents.to_vec();
    agents.sort_by(|a, b| a.key.cmp(&b.key));
    blake3::hash(&to_cbor(&(relay, rooms, agents, options)))
        .to_hex()
        .to_string()
}

/// This build: a hash of the running executable (a rebuilt relay folds with the
/// logic it was built with, so it does not trust a state folded by another build).
pub fn build_id() -> Option<&'static str> {
    static BUILD: OnceLock<Option<String>> = OnceLock::new();
    BUILD
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            let mut hasher = blake3::Hasher::new();
            hasher.update_reader(std::fs::File::open(exe).ok()?).ok()?;
            Some(hasher.finalize().to_hex()[..16].to_string())
        })
        .as_deref()
}

/// Writes `snapshot` to `path`: to a temporary file beside it (mode 0600), synced, then
/// renamed over the old one, so a crash leaves the old snapshot or the new, never half.
pub fn write(path: &Path, fingerprint: &str, snapshot: &Snapshot) -> std::io::Result<u64> {
    let build = build_id().ok_or_else(|| std::io::Error::other("cannot read the executable"))?;
    let body = to_cbor(&snapshot.state);
    let header = Header {
        format: FORMAT,
        build: build.to_string(),
        fingerprint: fingerprint.to_string(),
        cursor: snapshot.cursor.to_string(),
        last: snapshot.last.map(|(id, p)| (id.to_hex(), p.to_string())),
        rows: snapshot.rows,
        body_len: body.len() as u64,
        body_hash: blake3::hash(&body).to_hex().to_string(),
    };
    let mut line = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    line.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // A name of this process's own: two writers never share a temporary file.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&tmp)?;
        f.write_all(&line)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // A full disk or a vanished directory leaves the previous snapshot as it was.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((line.len() + body.len()) as u64)
}

/// Reads and checks the snapshot at `path` against this build and `fingerprint`.
pub fn read(path: &Path, fingerprint: &str) -> Result<Snapshot, Refused> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Refused::Missing(path.to_path_buf()))
        }
        Err(error) => {
            return Err(Refused::Unreadable {
                path: path.to_path_buf(),
                error,
            })
        }
    };
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| Refused::Header("no header line".into()))?;
    let header: Header =
        serde_json::from_slice(&bytes[..nl]).map_err(|e| Refused::Header(e.to_string()))?;
    if header.format != FORMAT {
        return Err(Refused::Format {
            found: header.format,
        });
    }
    let ours = build_id().unwrap_or("unknown");
    if header.build != ours {
        return Err(Refused::Build {
            found: header.build,
            ours: ours.to_string(),
        });
    }
    if header.fingerprint != fingerprint {
        return Err(Refused::Fingerprint);
    }
    let body = &bytes[nl + 1..];
    if body.len() as u64 != header.body_len {
        return Err(Refused::Length {
            expected: header.body_len,
            found: body.len() as u64,
        });
    }
    if blake3::hash(body).to_hex().as_str() != header.body_hash {
        return Err(Refused::Hash);
    }
    let bad = |what: &str, v: &str| Refused::Header(format!("bad {what} {v:?}"));
    let cursor: Position = header
        .cursor
        .parse()
        .map_err(|_| bad("cursor", &header.cursor))?;
    let last = match &header.last {
        None => None,
        Some((id, p)) => Some((
            id.parse::<InteractionId>().map_err(|_| bad("row id", id))?,
            p.parse::<Position>().map_err(|_| bad("position", p))?,
        )),
    };
    let state: RelayState = from_cbor(body).map_err(|e| Refused::Decode(e.to_string()))?;
    Ok(Snapshot {
        cursor,
        last,
        rows: header.rows,
        state,
    })
}

impl Snapshot {
    /// Checks that the ledger still holds the last row folded, at the same position:
    /// a snapshot of another database, or of this one before it was restored from an
    /// older backup, is refused.
    pub async fn check_ledger(&self, store: &dyn Store) -> Result<(), Refused> {
        let Some((id, position)) = self.last else {
            return Ok(());
        };
        match store.get(id).await {
            Ok(Some(row)) if row.position == position => Ok(()),
            Ok(Some(row)) => Err(Refused::LedgerMoved {
                expected: position,
                found: row.position,
            }),
            // A lot's item is not a row of its own (plan 0080): it is found among the
            // items read at its lot's position (nothing lies between the position just
            // before it and it).
            Ok(None) if position.minor > 0 => {
                let before = Position {
                    major: position.major,
                    minor: position.minor - 1,
                };
                match store.read_forward(before, 1).await {
                    Ok(batch)
                        if batch
                            .rows
                            .iter()
                            .any(|r| r.id == id && r.position == position) =>
                    {
                        Ok(())
                    }
                    Ok(_) => Err(Refused::LedgerMissing(id.short())),
                    Err(e) => Err(Refused::Store(e.to_string())),
                }
            }
            Ok(None) => Err(Refused::LedgerMissing(id.short())),
            Err(e) => Err(Refused::Store(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            cursor: Position::new(3, 9),
            last: Some((InteractionId([7; 32]), Position::new(3, 8))),
            rows: 42,
            state: RelayState {
                sync: vec![1, 2, 3],
                commands: vec![4, 5],
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written_and_every_alteration_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("r.snapshot");
        assert!(matches!(read(&path, "fp"), Err(Refused::Missing(_))));
        write(&path, "fp", &sample()).expect("write");
        let back = read(&path, "fp").expect("read");
        assert_eq!(back.cursor, Position::new(3, 9));
        assert_eq!(back.last, sample().last);
        assert_eq!(back.rows, 42);
        assert_eq!(back.state.sync, vec![1, 2, 3]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(matches!(read(&path, "other"), Err(Refused::Fingerprint)));

        let good = std::fs::read(&path).expect("bytes");
        let nl = good.iter().position(|b| *b == b'\n').expect("header");
        let with = |bytes: Vec<u8>| {
            std::fs::write(&path, bytes).expect("write");
            read(&path, "fp")
        };
        // A flipped bit in the body.
        let mut flipped = good.clone();
        *flipped.last_mut().expect("body") ^= 0x80;
        assert!(matches!(with(flipped), Err(Refused::Hash)));
        // Cut short.
        assert!(matches!(
            with(good[..good.len() - 1].to_vec()),
            Err(Refused::Length { .. })
        ));
        // No header line; a header that is not JSON.
        assert!(matches!(with(b"garbage".to_vec()), Err(Refused::Header(_))));
        assert!(matches!(
            with(b"{nope\nbody".to_vec()),
            Err(Refused::Header(_))
        ));
        // Another format or build, named in the header.
        let header = String::from_utf8(good[..nl].to_vec()).expect("utf8");
        let body = &good[nl..];
        let edited = |from: &str, to: &str| {
            let mut b = header.replacen(from, to, 1).into_bytes();
            b.extend_from_slice(body);
            b
        };
        assert!(matches!(
            with(edited("\"format\":1", "\"format\":99")),
            Err(Refused::Format { found: 99 })
        ));
        let build = build_id().expect("build");
        assert!(matches!(
            with(edited(build, "0000000000000000")),
            Err(Refused::Build { .. })
        ));
        // A body whose hash matches but does not decode.
        let junk = b"\xff\xff\xff".to_vec();
        let mut h: serde_json::Value = serde_json::from_str(&header).expect("json");
        h["body_len"] = junk.len().into();
        h["body_hash"] = blake3::hash(&junk).to_hex().to_string().into();
        let mut b = serde_json::to_vec(&h).expect("json");
        b.push(b'\n');
        b.extend_from_slice(&junk);
        assert!(matches!(with(b), Err(Refused::Decode(_))));
        // Intact again: read.
        assert!(with(good).is_ok());
    }

    #[test]
    fn a_failed_write_leaves_the_old_snapshot_and_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The target is a directory: the rename fails.
        let target = dir.path().join("r.snapshot");
        std::fs::create_dir(&target).expect("dir");
        std::fs::write(target.join("keep"), b"x").expect("file");
        assert!(write(&target, "fp", &sample()).is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("r.snapshot")]);
        // A good snapshot survives a failed rewrite of it.
        let good = dir.path().join("g.snapshot");
        write(&good, "fp", &sample()).expect("write");
        let before = std::fs::read(&good).expect("bytes");
        let blocked = dir.path().join("g.snapshot").join("nested");
        assert!(write(&blocked, "fp", &sample()).is_err());
        assert_eq!(std::fs::read(&good).expect("bytes"), before);
    }

    #[test]
    fn the_fingerprint_follows_what_the_relay_hosts_not_the_order_it_is_listed_in() {
        let o = SyncOptions::default();
        let (a, b) = (LocalAgent::new("a"), LocalAgent::new("b"));
        let rooms = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let base = fingerprint("r", &rooms(&["x", "y"]), &[a.clone(), b.clone()], &o);
        assert_eq!(
            base,
            fingerprint("r", &rooms(&["y", "x"]), &[b.clone(), a.clone()], &o)
        );
        assert_ne!(
            base,
            fingerprint("r2", &rooms(&["x", "y"]), &[a.clone(), b.clone()], &o)
        );
        assert_ne!(
            base,
            fingerprint("r", &rooms(&["x"]), &[a.clone(), b.clone()], &o)
        );
        assert_ne!(base, fingerprint("r", &rooms(&["x", "y"]), &[a], &o));
    }
}
