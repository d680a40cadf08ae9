//! Throwaway databases for `huddle demo` and `huddle bench coord` without `--db`.

use std::path::PathBuf;

/// A fresh directory under the system's temporary directory, removed on drop.
pub struct ScratchDir {
    dir: PathBuf,
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
        Ok(ScratchDir { dir })
    }

    /// The path of database file `name` in the directory.
    pub fn db(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "temporary directory not removed");
        }
    }
}
