//! Key files: where they live, creating them (mode 0600) and reading them.
//!
//! The key of owner NAME is, in order: the `--key PATH` flag, the file named by
//! `HUDDLE_OWNER_KEY`, `$HUDDLE_KEYS/NAME.key`, `$XDG_CONFIG_HOME/huddle/keys/NAME.key`,
//! `$HOME/.config/huddle/keys/NAME.key`. The signing key of writer ID (a relay, or a
//! command run with `--relay-key`; plan 0031) is the given path (a relay's `key`,
//! `--relay-key`), else the file named by `HUDDLE_RELAY_KEY`, else `relays/ID.key` in
//! the same keys directory. A key file holds the 64 hex digits of the Ed25519 secret
//! and a newline.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use huddle_core::signing::OwnerSecret;

fn env(k: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(k).filter(|v| !v.is_empty())
}

/// The keys directory: `$HUDDLE_KEYS`, `$XDG_CONFIG_HOME/huddle/keys` or
/// `$HOME/.config/huddle/keys`.
fn keys_dir() -> Option<PathBuf> {
    if let Some(dir) = env("HUDDLE_KEYS") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = env("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(dir).join("huddle/keys"));
    }
    env("HOME").map(|home| PathBuf::from(home).join(".config/huddle/keys"))
}

/// Where owner `name`'s key file is (it may not exist yet).
pub fn key_path(name: &str, flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = env("HUDDLE_OWNER_KEY") {
        return Ok(PathBuf::from(p));
    }
    match keys_dir() {
        Some(dir) => Ok(dir.join(format!("{name}.key"))),
        None => bail!(
            "no place for owner keys: set HUDDLE_KEYS, XDG_CONFIG_HOME or HOME, or pass --key"
        ),
    }
}

/// Where writer `id`'s signing key file is (it may not exist yet): `given`, else
/// `HUDDLE_RELAY_KEY`, else `relays/ID.key` in the keys directory.
pub fn writer_key_path(id: &str, given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = env("HUDDLE_RELAY_KEY") {
        return Ok(PathBuf::from(p));
    }
    match keys_dir() {
        Some(dir) => Ok(dir.join("relays").join(format!("{id}.key"))),
        None => bail!(
            "no place for writer keys: set HUDDLE_KEYS, XDG_CONFIG_HOME or HOME, or give the \
             key's path"
        ),
    }
}

/// Reads the key at `path`; `Ok(None)` when there is no such file.
pub fn load(path: &Path) -> anyhow::Result<Option<OwnerSecret>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "the key file is readable by others; chmod 600 it"
            );
        }
    }
    let secret = text
        .trim()
        .parse()
        .with_context(|| format!("{} is not a huddle key file", path.display()))?;
    Ok(Some(secret))
}

/// The key at `path`, created (mode 0600, directories 0700) when absent. Two
/// processes creating it at once end with the same key: the file appears whole, by
/// a hard link that fails if another process was first.
pub fn load_or_create(path: &Path) -> anyhow::Result<(OwnerSecret, bool)> {
    if let Some(secret) = load(path)? {
        return Ok((secret, false));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    create_private_dir(dir)?;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness for a key: {e}"))?;
    let secret = OwnerSecret::from_seed(seed);
    let tmp = tempfile_in(dir)?;
    {
        let mut f = open_private(&tmp)?;
        writeln!(f, "{}", secret.to_hex())?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok((secret, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let secret = load(path)?.context("the key file vanished while being created")?;
            Ok((secret, false))
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// `path` with `suffix` appended to its file name.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// After a rotation: keeps the old key at `<path>.retired-<old key id>` and moves the
/// next key (at `next`) into `path`. Returns where the old key went.
pub fn retire(
    path: &Path,
    old: &huddle_core::signing::OwnerKey,
    next: &Path,
) -> anyhow::Result<PathBuf> {
    let retired = with_suffix(path, &format!(".retired-{}", old.short()));
    std::fs::rename(path, &retired)
        .with_context(|| format!("cannot move {} to {}", path.display(), retired.display()))?;
    std::fs::rename(next, path)
        .with_context(|| format!("cannot move {} to {}", next.display(), path.display()))?;
    Ok(retired)
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

fn open_private(path: &Path) -> anyhow::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
        .with_context(|| format!("cannot create {}", path.display()))
}

fn tempfile_in(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(dir.join(format!(
        ".key-{}-{}.tmp",
        std::process::id(),
        u64::from_le_bytes(nonce)
    )))
}
