//! Throwaway databases for `huddle demo` and `huddle bench coord` without `--db`.

use std::path::PathBuf;

/// A fresh directory under the system's temporary directory, removed on drop unless
/// [`ScratchDir::keep`] was called.
pub struct ScratchDir {
    dir: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// Creates `<tmp>/<prefix>-<pid>-<nanos>`.
    pub fn create(prefix: &str) -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            anyhow::anyhow!("cannot create a temporary directory {}: {e}", dir.display())
        })?;
        Ok(ScratchDir { dir, keep: false })
    }

    /// Leaves the directory in place when this is dropped (what went wrong in it is
    /// to be read), and returns its path.
    pub fn keep(&mut self) -> &std::path::Path {
        self.keep = true;
        &self.dir
    }

    /// The path of database file `name` in the directory.
    pub fn db(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "temporary directory not removed");
        }
    }
}

/// A throwaway database beside the one a bench was pointed at: on Postgres a new
/// database on the same server (created here, dropped by [`ScratchDatabase::drop_now`]),
/// on SQLite a new file in the same directory (same file system). A bench measures
/// there, so it leaves nothing in the database it was given: no rows a relay would
/// later read, no tables.
pub struct ScratchDatabase {
    /// The scratch database's URL.
    pub url: String,
    kind: ScratchKind,
}

enum ScratchKind {
    Postgres { admin_url: String, name: String },
    Sqlite { path: PathBuf },
}

/// A name unique to this process and moment, for scratch databases and tables.
pub fn unique_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{}_{nanos}", std::process::id())
}

/// `url` with its database name replaced by `db` (query parameters kept).
fn url_with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[authority_start..]
        .find('/')
        .map(|i| authority_start + i)
        .unwrap_or(base.len());
    format!("{}/{db}{query}", &base[..authority_end])
}

impl ScratchDatabase {
    /// Creates a scratch database next to `url` (schema applied on first open).
    pub async fn create(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let name = format!("{prefix}_{}", unique_tag());
        match huddle_store::parse_url(url)? {
            huddle_store::Backend::Postgres(admin_url) => {
                let (client, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", redact(url)))?;
                let driver = tokio::spawn(conn);
                client
                    .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "cannot create the scratch database {name} (the bench measures in a \
                             database of its own and drops it afterwards; the role needs CREATEDB): {e}"
                        )
                    })?;
                drop(client);
                let _ = driver.await;
                Ok(ScratchDatabase {
                    url: url_with_database(&admin_url, &name),
                    kind: ScratchKind::Postgres { admin_url, name },
                })
            }
            huddle_store::Backend::Sqlite(path) => {
                let given = PathBuf::from(&path);
                let dir = match given.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => std::env::temp_dir(),
                };
                let path = dir.join(format!("{name}.db"));
                Ok(ScratchDatabase {
                    url: format!("sqlite://{}", path.display()),
                    kind: ScratchKind::Sqlite { path },
                })
            }
        }
    }

    /// Drops the scratch database (every connection to it must be closed).
    pub async fn drop_now(self) -> anyhow::Result<()> {
        match &self.kind {
            ScratchKind::Postgres { admin_url, name } => {
                let (client, conn) =
                    tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
                let driver = tokio::spawn(conn);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot drop the scratch database {name}: {e}"))?;
                drop(client);
                let _ = driver.await;
            }
            ScratchKind::Sqlite { path } => {
                for suffix in ["", "-wal", "-shm", huddle_store::sqlite::BELL_SUFFIX] {
                    let mut p = path.clone().into_os_string();
                    p.push(suffix);
                    match std::fs::remove_file(&p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            anyhow::bail!("cannot remove {}: {e}", PathBuf::from(p).display())
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// `postgres://user:secret@host` as `postgres://user:***@host`.
fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let Some(at) = url[start..].find('@').map(|i| start + i) else {
        return url.to_string();
    };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}
