//! Throwaway PostgreSQL clusters and one fresh database per test.
//!
//! [`PgCluster`] runs a private server from the machine's `initdb`/`pg_ctl` in a
//! temporary directory (as the `postgres` system user when the tests run as root,
//! because PostgreSQL refuses to run as root). [`test_database`] hands each test a
//! fresh database, on [`TEST_DATABASE_URL_ENV`] when it is set, else on one cluster
//! shared by the whole test process and stopped when the process exits.
//!
//! A machine without PostgreSQL is a loud failure that says how to fix it, never a
//! silent skip.

use std::ffi::CString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// Environment variable naming an existing server to create test databases on, as a
/// `postgres://user:password@host:port/dbname` URL whose user may `CREATE DATABASE`.
pub const TEST_DATABASE_URL_ENV: &str = "HUDDLE_TEST_DATABASE_URL";

/// Environment variable naming the directory holding `initdb` and `pg_ctl`, when they
/// are neither on `PATH` nor under `/usr/lib/postgresql/<version>/bin`.
pub const PG_BINDIR_ENV: &str = "HUDDLE_PG_BINDIR";

const HOW_TO_FIX: &str = "How to fix: install the PostgreSQL server binaries (`initdb` and \
`pg_ctl`, e.g. `apt-get install postgresql` on Debian/Ubuntu, which puts them in \
/usr/lib/postgresql/<version>/bin; or set HUDDLE_PG_BINDIR to their directory), or point \
HUDDLE_TEST_DATABASE_URL at a running server, e.g. \
HUDDLE_TEST_DATABASE_URL=postgres://postgres:secret@127.0.0.1:5432/postgres (its user must \
be allowed to CREATE DATABASE).";

/// Why a cluster could not be created, started or stopped. The message says what to do.
#[derive(Clone, Debug)]
pub struct ClusterError(String);

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterError {}

fn err(msg: impl Into<String>) -> ClusterError {
    ClusterError(msg.into())
}

#[derive(Clone, Copy, Debug)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A private PostgreSQL server in a temporary directory, listening on a free
/// `127.0.0.1` port with settings tuned for tests (`fsync = off`, 300 connections).
///
/// Dropping it stops the server (`-m immediate`) and removes the directory.
pub struct PgCluster {
    dir: TempDir,
    data: PathBuf,
    log: PathBuf,
    bindir: PathBuf,
    run_as: Option<RunAs>,
    port: u16,
    running: Mutex<bool>,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .finish()
    }
}

impl PgCluster {
    /// Creates and starts a cluster; panics with a message saying how to fix the
    /// machine when that is impossible. See [`PgCluster::try_start`].
    pub fn start() -> PgCluster {
        match PgCluster::try_start() {
            Ok(c) => c,
            Err(e) => panic!(
                "huddle-testkit could not start a PostgreSQL cluster: {e}\n\n\
                 How to fix: install the PostgreSQL server binaries (`initdb` and `pg_ctl`, \
                 e.g. `apt-get install postgresql`), or set {PG_BINDIR_ENV} to their directory. \
                 (This test runs its own cluster, so {TEST_DATABASE_URL_ENV} does not replace them.)"
            ),
        }
    }

    /// Creates and starts a cluster: finds `initdb`/`pg_ctl` (`HUDDLE_PG_BINDIR`, then
    /// `PATH`, then the highest `/usr/lib/postgresql/<version>/bin`), runs `initdb`
    /// into a temporary directory (as the `postgres` user when running as root) and
    /// starts the server on a free port, its unix socket in that directory.
    pub fn try_start() -> Result<PgCluster, ClusterError> {
        sweep_stale_clusters();
        let bindir = find_bindir()?;
        let run_as = run_as()?;
        let dir = tempfile::Builder::new()
            .prefix("huddle-pg-")
            .tempdir()
            .map_err(|e| err(format!("cannot create a temporary directory: {e}")))?;
        fs::write(dir.path().join("owner.pid"), std::process::id().to_string())
            .map_err(|e| err(format!("cannot write in {}: {e}", dir.path().display())))?;
        if let Some(r) = run_as {
            chown(dir.path(), r)?;
        }
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");
        let mut cluster = PgCluster {
            dir,
            data,
            log,
            bindir,
            run_as,
            port: 0,
            running: Mutex::new(false),
        };
        cluster.initdb()?;
        let mut last = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            cluster.append_conf(&format!("port = {}\n", cluster.port))?;
            match cluster.start_again() {
                Ok(()) => return Ok(cluster),
                // Most likely someone took the port between our probe and the start.
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| err("the server did not start")))
    }

    fn initdb(&self) -> Result<(), ClusterError> {
        let mut cmd = self.command("initdb");
        cmd.arg("-D").arg(&self.data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
        ]);
        run(cmd, "initdb")?;
        let socket_dir = self.dir.path().display().to_string().replace('\'', "''");
        self.append_conf(&format!(
            "\n# huddle-testkit: a throwaway cluster for tests\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\n\
             fsync = off\n\
             synchronous_commit = on\n\
             full_page_writes = off\n\
             max_connections = 300\n\
             shared_buffers = 64MB\n\
             max_wal_size = 1GB\n\
             log_min_messages = warning\n"
        ))
    }

    fn append_conf(&self, text: &str) -> Result<(), ClusterError> {
        let path = self.data.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| err(format!("cannot write {}: {e}", path.display())))
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        if let Some(r) = self.run_as {
            // std drops root's supplementary groups when it switches uid.
            cmd.uid(r.uid).gid(r.gid);
        }
        cmd.current_dir(self.dir.path())
            .env_remove("PGDATA")
            .env_remove("PGPORT")
            .env_remove("PGHOST")
            .stdin(Stdio::null());
        cmd
    }

    fn pg_ctl(&self, action: &str, mode: Option<&str>) -> Result<(), ClusterError> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.data).args(["-w", "-t", "60", "-s"]);
        if action == "start" {
            cmd.arg("-l").arg(&self.log);
        }
        if let Some(m) = mode {
            cmd.args(["-m", m]);
        }
        cmd.arg(action);
        run(cmd, &format!("pg_ctl {action}")).map_err(|e| {
            err(format!(
                "{e}\n--- server log ({}) ---\n{}",
                self.log.display(),
                self.log_tail()
            ))
        })
    }

    /// Starts the server again after [`PgCluster::stop`], same directory and port:
    /// a "restarted database" for tests.
    pub fn start_again(&self) -> Result<(), ClusterError> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if !*running {
            self.pg_ctl("start", None)?;
            *running = true;
        }
        Ok(())
    }

    /// Stops the server (`-m fast`: sessions are cut, clients see their connections
    /// close). The directory stays, so [`PgCluster::start_again`] resumes it.
    pub fn stop(&self) -> Result<(), ClusterError> {
        self.stop_with("fast")
    }

    /// Stops the server as a crash would (`-m immediate`).
    pub fn kill(&self) -> Result<(), ClusterError> {
        self.stop_with("immediate")
    }

    /// [`PgCluster::stop`] then [`PgCluster::start_again`].
    pub fn restart(&self) -> Result<(), ClusterError> {
        self.stop()?;
        self.start_again()
    }

    fn stop_with(&self, mode: &str) -> Result<(), ClusterError> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if *running {
            self.pg_ctl("stop", Some(mode))?;
            *running = false;
        }
        Ok(())
    }

    /// Whether the server is up (as far as this handle knows).
    pub fn is_running(&self) -> bool {
        *self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the data directory, the unix socket and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The superuser URL of the `postgres` database.
    pub fn admin_url(&self) -> String {
        self.url_for("postgres")
    }

    /// The superuser URL of database `db`.
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The last lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Stops the server at once and removes its directory; used at process exit,
    /// where the value itself is never dropped.
    fn shutdown_now(&self) {
        let _ = self.kill();
        let _ = fs::remove_dir_all(self.dir.path());
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.kill();
        // The TempDir removes the directory (root may remove postgres's files).
    }
}

/// A fresh, empty database for one test.
#[derive(Debug)]
pub struct TestDb {
    /// URL to connect to it.
    pub url: String,
    /// Its name.
    pub name: String,
    /// On an external server: the admin URL to drop it from when done.
    drop_from: Option<String>,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Databases on the process-wide cluster vanish with it; on an external server
        // drop ours (WITH (FORCE) cuts sessions a test left open).
        let Some(admin) = self.drop_from.take() else {
            return;
        };
        let name = self.name.clone();
        let dropper = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                if let Err(e) = admin_execute(&admin, &sql).await {
                    eprintln!("huddle-testkit: could not drop test database {name}: {e}");
                }
            });
        });
        let _ = dropper.join();
    }
}

static SHARED: OnceLock<Result<PgCluster, String>> = OnceLock::new();
static AT_EXIT: Once = Once::new();
static COUNTER: AtomicU64 = AtomicU64::new(0);

extern "C" fn stop_shared_cluster() {
    if let Some(Ok(cluster)) = SHARED.get() {
        cluster.shutdown_now();
    }
}

fn shared_cluster() -> &'static PgCluster {
    let result = SHARED.get_or_init(|| {
        let started = PgCluster::try_start().map_err(|e| e.to_string());
        if started.is_ok() {
            AT_EXIT.call_once(|| {
                // SAFETY: registers a plain `extern "C" fn` with no captured state.
                unsafe {
                    libc::atexit(stop_shared_cluster);
                }
            });
        }
        started
    });
    match result {
        Ok(c) => c,
        Err(e) => panic!(
            "huddle Postgres tests need a database, and none is available.\n\
             {TEST_DATABASE_URL_ENV} is not set and starting a private cluster failed:\n{e}\n\n{HOW_TO_FIX}"
        ),
    }
}

/// A fresh database for one test: created on [`TEST_DATABASE_URL_ENV`] when it is
/// set, else on one cluster started on first use and stopped when the process exits.
///
/// Its default collation is ICU English ([`test_database_collated`]`("en")`), as on
/// many production databases, so nothing passes only because the cluster happens to
/// sort text byte by byte; on a server without ICU (or before Postgres 15) it is the
/// cluster's, said once on stderr.
///
/// Panics, with a message saying how to fix the machine, when neither works: a
/// missing Postgres is a loud failure, never a silent skip.
pub async fn test_database() -> TestDb {
    static ICU: OnceLock<bool> = OnceLock::new();
    if *ICU.get().unwrap_or(&true) {
        match try_create_test_database(&icu_options("en")).await {
            Ok(db) => {
                let _ = ICU.set(true);
                return db;
            }
            Err(icu) => {
                // Only a server that creates plain databases but not this one lacks
                // ICU; any other failure is reported as the plain creation's.
                let db = create_test_database("").await;
                if ICU.set(false).is_ok() {
                    eprintln!(
                        "huddle-testkit: test databases take the cluster's default collation: \
                         the server could not create one collated as ICU English ({icu})"
                    );
                }
                return db;
            }
        }
    }
    create_test_database("").await
}

/// The `CREATE DATABASE` options of a database whose default collation is the ICU
/// locale `icu_locale`.
fn icu_options(icu_locale: &str) -> String {
    assert!(
        icu_locale
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "not an ICU locale name: {icu_locale:?}"
    );
    format!(" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '{icu_locale}'")
}

/// [`test_database`] whose default collation is the ICU locale `icu_locale` (`en`,
/// say) rather than the cluster's: text then sorts as people read it, not byte by
/// byte, as on many production databases.
pub async fn test_database_collated(icu_locale: &str) -> TestDb {
    create_test_database(&icu_options(icu_locale)).await
}

/// Creates the database with `options` after its name, or panics saying how to fix
/// the machine.
async fn create_test_database(options: &str) -> TestDb {
    match try_create_test_database(options).await {
        Ok(db) => db,
        Err(e) => panic!("{e}\n\n{HOW_TO_FIX}"),
    }
}

/// Creates the database with `options` after its name.
async fn try_create_test_database(options: &str) -> Result<TestDb, String> {
    let external = std::env::var(TEST_DATABASE_URL_ENV)
        .ok()
        .filter(|u| !u.trim().is_empty());
    let admin = match &external {
        Some(url) => url.trim().to_string(),
        None => shared_cluster().admin_url(),
    };
    let name = format!(
        "huddle_t_{}_{}_{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() % 1_000_000_000)
            .unwrap_or(0),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    if let Err(e) = admin_execute(&admin, &format!("CREATE DATABASE \"{name}\"{options}")).await {
        let origin = match &external {
            Some(_) => format!("{TEST_DATABASE_URL_ENV}={}", redact(&admin)),
            None => "the private test cluster".to_string(),
        };
        return Err(format!(
            "huddle-testkit could not create a test database on {origin}: {e}"
        ));
    }
    Ok(TestDb {
        url: url_with_database(&admin, &name),
        name,
        drop_from: external.map(|_| admin),
    })
}

async fn admin_execute(url: &str, sql: &str) -> Result<(), String> {
    let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(30), connect)
        .await
        .map_err(|_| "connecting timed out after 30 s".to_string())?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let driver = tokio::spawn(connection);
    let result = client
        .batch_execute(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"));
    drop(client);
    let _ = driver.await;
    result
}

/// `url` with its database name replaced by `db` (query parameters kept).
pub fn url_with_database(url: &str, db: &str) -> String {
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

fn redact(url: &str) -> String {
    // postgres://user:secret@host -> postgres://user:***@host
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

fn run(mut cmd: Command, what: &str) -> Result<(), ClusterError> {
    let out = cmd
        .output()
        .map_err(|e| err(format!("cannot run {what} ({:?}): {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(err(format!(
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

fn has_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

fn find_bindir() -> Result<PathBuf, ClusterError> {
    if let Some(dir) = std::env::var_os(PG_BINDIR_ENV) {
        let dir = PathBuf::from(dir);
        if has_binaries(&dir) {
            return Ok(dir);
        }
        return Err(err(format!(
            "{PG_BINDIR_ENV}={} holds no initdb and pg_ctl.",
            dir.display()
        )));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_binaries(&dir) {
                // Resolve symlinks (/usr/local/bin/pg_ctl -> .../15/bin/pg_ctl) so both
                // come from the same installation.
                let initdb = fs::canonicalize(dir.join("initdb")).unwrap_or(dir.join("initdb"));
                let real = initdb
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or(dir.clone());
                return Ok(if has_binaries(&real) { real } else { dir });
            }
        }
    }
    let mut versions: Vec<(Vec<u64>, PathBuf)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Ok(version) = name
                .split('.')
                .map(str::parse::<u64>)
                .collect::<Result<Vec<_>, _>>()
            else {
                continue;
            };
            let bin = entry.path().join("bin");
            if has_binaries(&bin) {
                versions.push((version, bin));
            }
        }
    }
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        err("no `initdb`/`pg_ctl` found on PATH or under /usr/lib/postgresql/*/bin.")
    })
}

fn run_as() -> Result<Option<RunAs>, ClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new("postgres").map_err(|e| err(e.to_string()))?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live, correctly sized storage owned here.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return Err(err(
            "the tests run as root, and PostgreSQL refuses to run as root, but there is no \
             `postgres` system user to run it as. Create one (`useradd --system postgres`), \
             run the tests as an ordinary user, or set HUDDLE_TEST_DATABASE_URL.",
        ));
    }
    Ok(Some(RunAs {
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
    }))
}

fn chown(path: &Path, r: RunAs) -> Result<(), ClusterError> {
    std::os::unix::fs::chown(path, Some(r.uid), Some(r.gid))
        .map_err(|e| err(format!("cannot chown {} to postgres: {e}", path.display())))
}

fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| err(format!("cannot find a free port on 127.0.0.1: {e}")))
}

/// Stops and removes clusters left behind by test processes that died without
/// running their exit hook (killed, aborted). Only clusters whose creating process
/// is gone are touched.
fn sweep_stale_clusters() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("huddle-pg-"));
        if !is_ours {
            continue;
        }
        let Some(owner) = fs::read_to_string(path.join("owner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(owner, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if alive {
            continue;
        }
        let data = path.join("data");
        let postmaster = fs::read_to_string(data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<i32>().ok()));
        if let Some(pid) = postmaster {
            // SAFETY: SIGQUIT is postgres's "immediate shutdown"; pid is the
            // postmaster recorded in that cluster's own data directory.
            unsafe {
                libc::kill(pid, libc::SIGQUIT);
            }
        }
        let _ = fs::remove_dir_all(&path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_replaced_in_urls() {
        assert_eq!(
            url_with_database("postgres://u:p@h:5/postgres", "x"),
            "postgres://u:p@h:5/x"
        );
        assert_eq!(
            url_with_database("postgres://u@h:5/postgres?sslmode=disable", "x"),
            "postgres://u@h:5/x?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db".to_string()
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db".to_string());
    }

    #[test]
    fn a_cluster_starts_stops_and_starts_again() {
        let cluster = PgCluster::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let url = cluster.admin_url();
        rt.block_on(async {
            admin_execute(&url, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
                .await
                .expect("first session");
        });
        cluster.stop().expect("stop");
        assert!(!cluster.is_running());
        rt.block_on(async {
            assert!(admin_execute(&url, "SELECT 1").await.is_err());
        });
        cluster.start_again().expect("start again");
        rt.block_on(async {
            // Same port, same data.
            admin_execute(&url, "DO $$ BEGIN IF (SELECT count(*) FROM t) <> 1 THEN RAISE EXCEPTION 'lost'; END IF; END $$")
                .await
                .expect("data survives a restart");
        });
        let dir = cluster.dir().to_path_buf();
        drop(cluster);
        assert!(!dir.exists(), "dropping a cluster removes its directory");
    }

    #[tokio::test]
    async fn test_databases_are_fresh_and_distinct() {
        let a = test_database().await;
        let b = test_database().await;
        assert_ne!(a.name, b.name);
        admin_execute(&a.url, "CREATE TABLE only_in_a (x int)")
            .await
            .expect("create in a");
        admin_execute(&b.url, "CREATE TABLE only_in_a (x int)")
            .await
            .expect("b does not see a's table");
    }
}
