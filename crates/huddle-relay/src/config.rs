//! The relay's configuration file, `huddle.toml`.
//!
//! ```toml
//! relay = "relay-a"                 # this relay's id (claims for drives are held by it)
//! database = "./huddle.db"          # or postgres://...; HUDDLE_DB overrides it
//! rooms = ["lobby"]
//! sign = true                       # sign every row written (the owner registers the key)
//! key = "./relay-a.key"             # default: HUDDLE_RELAY_KEY, else the keys directory
//! snapshot = "./relay-a.snapshot"   # resume from a snapshot of the folds
//!                                   # (default: <relay>.snapshot beside this file; false: none)
//! snapshot_every_rows = 100000      # rows folded between two snapshots while running
//! snapshot_min_interval_ms = 60000  # and at most this often
//! batch_hold_ms = 2                 # how long a task result waits for others to share its write
//! batches_in_flight = 2             # batches of results and claims sent at once (1 - 4;
//!                                   # default 2 on Postgres, 1 on SQLite)
//!
//! [[agent]]
//! key = "ada"                       # the agent's id in rooms and claims
//! name = "Ada"
//! capabilities = ["rust", "sql"]
//! priority = 10                     # rank under `responder role-priority`, lower first
//! driver = "sim"                    # "sim", "exec" or "acp"
//! sim = { turn_ms = 300, failure_rate = 0.0, tokens = 120, seed = 7 }
//!
//! [[agent]]
//! key = "bob"
//! driver = "exec"
//! exec = { command = ["./my-agent", "--quiet"], timeout_ms = 120000 }
//! mcp = false                       # withhold huddle's MCP tools (offered by default)
//!
//! [[agent]]
//! key = "cleo"
//! driver = "acp"                    # an Agent Client Protocol agent, kept running
//! acp = { preset = "claude-code", cwd = "./work/cleo", permissions = "read-only" }
//! ```
//!
//! Unknown keys and bad values are rejected at start with the file, the line and the
//! reason.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use huddle_core::{validate_name, Limits};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::driver::{
    AcpDriver, AcpSettings, Driver, ExecDriver, ExecSettings, McpLaunch, SimDriver, SimSettings,
};

/// A configuration error, naming the file and, when known, the line.
#[derive(Debug, Error)]
#[error("{file}{}: {reason}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

/// Which driver runs an agent's turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// The built-in simulator.
    Sim,
    /// A command per turn.
    Exec,
    /// A long-lived Agent Client Protocol agent.
    Acp,
}

impl DriverKind {
    /// The name used in `huddle.toml`.
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Sim => "sim",
            DriverKind::Exec => "exec",
            DriverKind::Acp => "acp",
        }
    }
}

/// One hosted agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's key: its id in rooms and claims.
    pub key: String,
    /// Display name (defaults to the key).
    #[serde(default)]
    pub name: Option<String>,
    /// Declared capabilities, matched against tasks' needs when bidding.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Rank under `responder role-priority`: lower answers first (default 100).
    #[serde(default)]
    pub priority: Option<u32>,
    /// Driver kind.
    pub driver: DriverKind,
    /// Simulator settings (for `driver = "sim"`).
    #[serde(default)]
    pub sim: Option<SimSettings>,
    /// Exec settings (for `driver = "exec"`).
    #[serde(default)]
    pub exec: Option<ExecSettings>,
    /// ACP settings (for `driver = "acp"`).
    #[serde(default)]
    pub acp: Option<AcpSettings>,
    /// Whether the agent is offered huddle's MCP tools (exec: `HUDDLE_MCP`; acp: the
    /// sessions' `mcpServers`), so that it can also act for itself. On by default.
    #[serde(default = "offer_mcp")]
    pub mcp: bool,
}

fn offer_mcp() -> bool {
    true
}

impl AgentConfig {
    /// Starts the agent's driver: an ACP agent's process is started and initialised
    /// here, so a command that is missing or fails to initialise is reported at
    /// relay start.
    ///
    /// `mcp` is how to start huddle's MCP server (the relay's program and database);
    /// the agent is offered it unless its `mcp = false`. The simulator ignores it.
    pub async fn start_driver(&self, mcp: Option<&McpLaunch>) -> Result<Arc<dyn Driver>, String> {
        let fail = |e: String| format!("agent {:?}: {e}", self.key);
        let mcp = mcp.filter(|_| self.mcp).map(|m| McpLaunch {
            capabilities: self.capabilities.clone(),
            ..m.clone()
        });
        Ok(match self.driver {
            DriverKind::Sim => Arc::new(SimDriver::new(self.sim.clone().unwrap_or_default())),
            DriverKind::Exec => match (&self.exec, mcp) {
                (Some(exec), Some(mcp)) => Arc::new(ExecDriver::new(exec.clone()).with_mcp(mcp)),
                (Some(exec), None) => Arc::new(ExecDriver::new(exec.clone())),
                (None, _) => return Err(fail("no exec table".into())),
            },
            DriverKind::Acp => match &self.acp {
                Some(acp) => Arc::new(
                    AcpDriver::start_offering(&self.key, acp.clone(), mcp)
                        .await
                        .map_err(fail)?,
                ),
                None => return Err(fail("no acp table".into())),
            },
        })
    }
}

/// The whole relay configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// This relay's id.
    pub relay: String,
    /// Database URL; the `HUDDLE_DB` environment variable overrides it.
    #[serde(default = "default_database")]
    pub database: String,
    /// Rooms this relay's agents join.
    pub rooms: Vec<String>,
    /// Hosted agents.
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentConfig>,
    /// Whether the relay signs every row it writes with its key (plan 0031). The room
    /// owner registers the public key with `!config relay-keys`.
    #[serde(default)]
    pub sign: bool,
    /// The relay's key file when it signs (relative to this file), created (mode
    /// 0600) when absent. Default: `HUDDLE_RELAY_KEY`, else `relays/<relay>.key` in
    /// the keys directory (`$HUDDLE_KEYS`, `$XDG_CONFIG_HOME/huddle/keys` or
    /// `~/.config/huddle/keys`).
    #[serde(default)]
    pub key: Option<String>,
    /// Postgres only: the relay's pooled connections (default 3, 1 to 64), beside its
    /// LISTEN connection. More let more writes run at once; on a database with few
    /// cores they mostly contend (plan 0060 measures it).
    #[serde(default)]
    pub pool: Option<usize>,
    /// The snapshot file of the relay's folds (plan 0063): a restart resumes from it
    /// instead of reading its rooms from the first row. A path (relative to this
    /// file), `true` (the default: `<relay>.snapshot` beside this file) or `false`
    /// (every start reads from the first row). See [`RelayConfig::snapshot_path`].
    #[serde(default)]
    pub snapshot: Option<SnapshotSetting>,
    /// Rows folded between two snapshots written while the relay runs (default
    /// 100,000; at most one a minute).
    #[serde(default)]
    pub snapshot_every_rows: Option<u64>,
    /// The shortest time between two snapshots written while the relay runs, in
    /// milliseconds (default 60,000).
    #[serde(default)]
    pub snapshot_min_interval_ms: Option<u64>,
    /// How long a task turn's result waits for other task turns of the relay to end
    /// so their results share one write, in milliseconds (default 2; 0: never).
    #[serde(default)]
    pub batch_hold_ms: Option<u64>,
    /// How many batches of task results and claim acquisitions may be in flight at
    /// once (plan 0087; 1 to 4, default 1).
    #[serde(default)]
    pub batches_in_flight: Option<usize>,
}

/// `snapshot = ...` in `huddle.toml`: a path, or on / off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SnapshotSetting {
    /// `true`: the default file; `false`: none.
    On(bool),
    /// This file.
    Path(String),
}

impl<'de> Deserialize<'de> for SnapshotSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = SnapshotSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a snapshot file path, true (the default file) or false (none)")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<SnapshotSetting, E> {
                Ok(SnapshotSetting::On(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SnapshotSetting, E> {
                Ok(SnapshotSetting::Path(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

fn default_database() -> String {
    "./huddle.db".to_string()
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl RelayConfig {
    /// Reads and checks a file; relative paths in it (the SQLite database, an exec
    /// program given as a path, `cwd`) are taken relative to the file's directory
    /// ([`RelayConfig::resolve_paths`]). `HUDDLE_DB` (when set and non-empty)
    /// overrides the database URL.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            reason: format!("cannot read: {e}"),
        })?;
        let mut cfg = Self::parse(&file, &text)?;
        cfg.resolve_paths(path.parent().unwrap_or(Path::new("")));
        if let Ok(db) = std::env::var("HUDDLE_DB") {
            if !db.trim().is_empty() {
                cfg.database = db;
            }
        }
        Ok(cfg)
    }

    /// Makes the relative paths of the file relative to `dir`, its directory: the
    /// SQLite database file, an exec program named by a path (containing `/`; a bare
    /// name is looked up on `PATH`) and the exec / ACP `cwd`.
    pub fn resolve_paths(&mut self, dir: &Path) {
        if dir.as_os_str().is_empty() {
            return;
        }
        let under = |p: &str| -> String {
            if Path::new(p).is_absolute() {
                p.to_string()
            } else {
                dir.join(p).display().to_string()
            }
        };
        if let Ok(huddle_store::Backend::Sqlite(file)) = huddle_store::parse_url(&self.database) {
            if !file.is_empty() && !file.starts_with(":memory:") {
                self.database = under(&file);
            }
        }
        self.key = self.key.as_deref().map(under);
        self.snapshot = Some(match self.snapshot_path() {
            Some(p) => SnapshotSetting::Path(under(&p.display().to_string())),
            None => SnapshotSetting::On(false),
        });
        for a in &mut self.agents {
            if let Some(exec) = &mut a.exec {
                if let Some(program) = exec.command.first_mut() {
                    if program.contains('/') {
                        *program = under(program);
                    }
                }
                exec.cwd = exec.cwd.as_deref().map(under);
            }
            if let Some(acp) = &mut a.acp {
                acp.cwd = acp.cwd.as_deref().map(under);
            }
        }
    }

    /// The snapshot file the relay keeps, if any: the `snapshot` path, or by default
    /// `<relay>.snapshot` beside this file; `None` with `snapshot = false`.
    pub fn snapshot_path(&self) -> Option<std::path::PathBuf> {
        match &self.snapshot {
            Some(SnapshotSetting::On(false)) => None,
            Some(SnapshotSetting::Path(p)) => Some(p.into()),
            None | Some(SnapshotSetting::On(true)) => {
                Some(format!("{}.snapshot", self.relay).into())
            }
        }
    }

    /// Parses and checks configuration text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        let cfg: RelayConfig = toml::from_str(text).map_err(|e| ConfigError {
            file: file.to_string(),
            line: e.span().map(|s| line_of(text, s.start)),
            reason: e.message().to_string(),
        })?;
        cfg.check().map_err(|(needle, reason)| ConfigError {
            file: file.to_string(),
            line: needle.and_then(|n| text.find(&n)).map(|o| line_of(text, o)),
            reason,
        })?;
        Ok(cfg)
    }

    /// Semantic checks. On error, returns text to locate the line by, and the reason.
    fn check(&self) -> Result<(), (Option<String>, String)> {
        let limits = Limits::default();
        validate_name("relay", &self.relay, &limits)
            .map_err(|e| (Some("relay".to_string()), e.to_string()))?;
        if self.rooms.is_empty() {
            return Err((
                Some("rooms".into()),
                "rooms must list at least one room".into(),
            ));
        }
        for room in &self.rooms {
            validate_name("room", room, &limits)
                .map_err(|e| (Some(format!("\"{room}\"")), format!("rooms: {e}")))?;
        }
        if self.key.is_some() && !self.sign {
            return Err((
                Some("key".into()),
                "key is given but sign is not true: add `sign = true` to sign with it".into(),
            ));
        }
        if matches!(&self.snapshot, Some(SnapshotSetting::Path(p)) if p.trim().is_empty()) {
            return Err((
                Some("snapshot".into()),
                "snapshot must be a file path, true (the default file) or false (none)".into(),
            ));
        }
        if self.snapshot_every_rows == Some(0) {
            return Err((
                Some("snapshot_every_rows".into()),
                "snapshot_every_rows must be at least 1".into(),
            ));
        }
        let most = crate::runtime::MAX_BATCHES_IN_FLIGHT;
        if let Some(n) = self.batches_in_flight.filter(|n| !(1..=most).contains(n)) {
            return Err((
                Some("batches_in_flight".into()),
                format!("batches_in_flight must be between 1 and {most}, not {n}"),
            ));
        }
        if let Some(pool) = self.pool.filter(|p| !(1..=64).contains(p)) {
            return Err((
                Some("pool".into()),
                format!("pool must be between 1 and 64 connections, not {pool}"),
            ));
        }
        let mut keys = BTreeSet::new();
        for a in &self.agents {
            let at = Some(format!("\"{}\"", a.key));
            validate_name("agent key", &a.key, &limits).map_err(|e| (at.clone(), e.to_string()))?;
            if !keys.insert(a.key.clone()) {
                return Err((at, format!("agent {:?} is listed twice", a.key)));
            }
            let mine = a.driver.name();
            for (name, given) in [
                ("sim", a.sim.is_some()),
                ("exec", a.exec.is_some()),
                ("acp", a.acp.is_some()),
            ] {
                if given && name != mine {
                    return Err((
                        at,
                        format!(
                            "agent {:?}: driver is {mine} but an {name} table is given",
                            a.key
                        ),
                    ));
                }
            }
            match a.driver {
                DriverKind::Sim => {
                    if let Some(sim) = &a.sim {
                        sim.validate()
                            .map_err(|r| (at.clone(), format!("agent {:?}: sim.{r}", a.key)))?;
                    }
                }
                DriverKind::Exec => {
                    let Some(exec) = &a.exec else {
                        return Err((at, format!("agent {:?}: driver is exec but there is no exec table with a command", a.key)));
                    };
                    exec.validate()
                        .map_err(|r| (at.clone(), format!("agent {:?}: exec.{r}", a.key)))?;
                }
                DriverKind::Acp => {
                    let Some(acp) = &a.acp else {
                        return Err((at, format!("agent {:?}: driver is acp but there is no acp table (acp = {{ preset = \"claude-code\" }} or acp = {{ command = [...] }})", a.key)));
                    };
                    acp.validate()
                        .map_err(|r| (at.clone(), format!("agent {:?}: acp.{r}", a.key)))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
relay = "relay-a"
rooms = ["lobby"]

[[agent]]
key = "ada"
capabilities = ["rust"]
driver = "sim"
sim = { turn_ms = 10, seed = 3 }

[[agent]]
key = "bob"
driver = "exec"
exec = { command = ["cat"] }
"#;

    #[test]
    fn parses_a_good_file() {
        let c = RelayConfig::parse("huddle.toml", GOOD).expect("good config");
        assert_eq!(c.relay, "relay-a");
        assert_eq!(c.database, "./huddle.db");
        assert_eq!(c.pool, None);
        let c = RelayConfig::parse(
            "huddle.toml",
            &GOOD.replace("rooms = [", "pool = 5\nrooms = ["),
        )
        .expect("a pool size");
        assert_eq!(c.pool, Some(5));
        assert_eq!(c.agents.len(), 2);
        assert_eq!(c.agents[0].sim.as_ref().map(|s| s.turn_ms), Some(10));
        assert_eq!(
            c.agents[1].exec.as_ref().map(|e| e.timeout_ms),
            Some(300_000)
        );
    }

    const ACP: &str = r#"
relay = "relay-a"
rooms = ["lobby"]

[[agent]]
key = "ada"
driver = "acp"
acp = { command = ["claude-code-acp"], cwd = "./work/ada", permissions = "read-only", turn_timeout_ms = 600000 }

[[agent]]
key = "cleo"
driver = "acp"
acp = { preset = "codex", permissions = ["read", "edit"] }
"#;

    #[test]
    fn parses_acp_agents() {
        let c = RelayConfig::parse("huddle.toml", ACP).expect("good config");
        let ada = c.agents[0].acp.as_ref().expect("acp");
        assert_eq!(ada.resolved_command(), ["claude-code-acp"]);
        assert_eq!(ada.cwd.as_deref(), Some("./work/ada"));
        let cleo = c.agents[1].acp.as_ref().expect("acp");
        assert_eq!(cleo.resolved_command(), ["codex-acp"]);
        assert_eq!(cleo.turn_timeout_ms, 600_000);
        assert_eq!(
            cleo.permissions,
            crate::driver::PermissionPolicy::Kinds(vec!["read".into(), "edit".into()])
        );
    }

    #[test]
    fn bad_acp_settings_name_line_and_reason() {
        let cases = [
            (
                ACP.replace("preset = \"codex\"", "preset = \"vim\""),
                13,
                "vim",
            ),
            (ACP.replace("\"read-only\"", "\"yolo\""), 6, "yolo"),
            (
                ACP.replace("[\"read\", \"edit\"]", "[\"teleport\"]"),
                11,
                "teleport",
            ),
            (
                ACP.replace("preset = \"codex\", ", ""),
                11,
                "command or preset",
            ),
            (
                ACP.replace("turn_timeout_ms = 600000", "turn_timeout_ms = 0"),
                6,
                "turn_timeout_ms",
            ),
            (ACP.replace("cwd = ", "colour = \"x\", cwd = "), 8, "colour"),
            (
                ACP.replace(
                    "acp = { preset = \"codex\", permissions = [\"read\", \"edit\"] }",
                    "",
                ),
                11,
                "no acp table",
            ),
            (
                ACP.replace(
                    "driver = \"acp\"\nacp = { preset",
                    "driver = \"sim\"\nacp = { preset",
                ),
                11,
                "driver is sim but an acp table",
            ),
        ];
        for (text, line, needle) in cases {
            let e = RelayConfig::parse("f.toml", &text).unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert!(e.reason.contains(needle), "{e} lacks {needle:?}");
        }
    }

    #[test]
    fn the_snapshot_is_kept_beside_the_file_unless_turned_off() {
        let relay = RelayConfig::parse("f.toml", GOOD).expect("good").relay;
        let with = |line: &str| {
            let mut c = RelayConfig::parse(
                "f.toml",
                &GOOD.replace("rooms = [", &format!("{line}\nrooms = [")),
            )?;
            c.resolve_paths(Path::new("/etc/huddle"));
            Ok::<_, ConfigError>(c.snapshot_path())
        };
        let default = Some(std::path::PathBuf::from(format!(
            "/etc/huddle/{relay}.snapshot"
        )));
        assert_eq!(with("").expect("default"), default);
        assert_eq!(with("snapshot = true").expect("on"), default);
        assert_eq!(with("snapshot = false").expect("off"), None);
        assert_eq!(
            with("snapshot = \"state/r.snap\"").expect("path"),
            Some("/etc/huddle/state/r.snap".into())
        );
        assert_eq!(
            with("snapshot = \"/var/r.snap\"").expect("absolute"),
            Some("/var/r.snap".into())
        );
        // Read in its own directory, the default is relative to it.
        let c = RelayConfig::parse("f.toml", GOOD).expect("good");
        assert_eq!(c.snapshot_path(), Some(format!("{relay}.snapshot").into()));
        for bad in ["snapshot = \"\"", "snapshot = 3", "snapshot_every_rows = 0"] {
            let e = with(bad).expect_err(bad);
            assert!(e.to_string().contains("snapshot"), "{bad}: {e}");
        }
    }

    #[test]
    fn batches_in_flight_is_bounded() {
        let with = |line: &str| RelayConfig::parse("f.toml", &format!("{line}\n{GOOD}"));
        assert_eq!(with("").expect("default").batches_in_flight, None);
        assert_eq!(
            with("batches_in_flight = 2")
                .expect("two")
                .batches_in_flight,
            Some(2)
        );
        for bad in ["batches_in_flight = 0", "batches_in_flight = 5"] {
            let e = with(bad).expect_err(bad);
            assert!(
                e.to_string()
                    .contains("batches_in_flight must be between 1 and 4"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn paths_resolve_against_the_file_directory() {
        let text = GOOD
            .replace("rooms = [", "database = \"sqlite://data/h.db\"\nrooms = [")
            .replace(
                "exec = { command = [\"cat\"] }",
                "exec = { command = [\"./bin/agent\", \"./arg\"], cwd = \"work\" }",
            );
        let mut c = RelayConfig::parse("f.toml", &text).expect("good config");
        c.resolve_paths(Path::new("/etc/huddle"));
        assert_eq!(c.database, "/etc/huddle/data/h.db");
        let exec = c.agents[1].exec.as_ref().expect("exec");
        assert_eq!(exec.command, ["/etc/huddle/./bin/agent", "./arg"]);
        assert_eq!(exec.cwd.as_deref(), Some("/etc/huddle/work"));
        let signing = GOOD.replace("rooms = [", "sign = true\nkey = \"keys/a.key\"\nrooms = [");
        let mut c = RelayConfig::parse("f.toml", &signing).expect("good config");
        assert!(c.sign);
        c.resolve_paths(Path::new("/etc/huddle"));
        assert_eq!(c.key.as_deref(), Some("/etc/huddle/keys/a.key"));
        // Absolute paths, bare program names and Postgres URLs stay as they are.
        let mut c = RelayConfig::parse(
            "f.toml",
            &GOOD.replace("rooms = [", "database = \"postgres://h/db\"\nrooms = ["),
        )
        .expect("good");
        c.resolve_paths(Path::new("/etc/huddle"));
        assert_eq!(c.database, "postgres://h/db");
        assert_eq!(
            c.agents[1].exec.as_ref().map(|e| e.command.clone()),
            Some(vec!["cat".to_string()])
        );
    }

    #[test]
    fn an_agent_may_have_a_priority() {
        let text = GOOD.replace("key = \"bob\"", "key = \"bob\"\npriority = 5");
        let c = RelayConfig::parse("huddle.toml", &text).expect("good config");
        assert_eq!(
            (c.agents[0].priority, c.agents[1].priority),
            (None, Some(5))
        );
        let bad = GOOD.replace("key = \"bob\"", "key = \"bob\"\npriority = -1");
        let e = RelayConfig::parse("huddle.toml", &bad).unwrap_err();
        assert!(
            e.reason.contains("priority") || e.reason.contains("invalid value"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_name_file_and_line() {
        let text = GOOD.replace(
            "capabilities = [\"rust\"]",
            "capabilities = [\"rust\"]\ncolour = \"blue\"",
        );
        let e = RelayConfig::parse("huddle.toml", &text).unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(e.to_string().starts_with("huddle.toml:8:"), "{e}");
        assert!(e.reason.contains("colour"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected_with_reason_and_line() {
        let cases = [
            (
                GOOD.replace("driver = \"sim\"", "driver = \"magic\""),
                "magic",
            ),
            (GOOD.replace("turn_ms = 10", "turn_ms = -1"), ""),
            (
                GOOD.replace("seed = 3", "seed = 3, failure_rate = 2.0"),
                "failure_rate",
            ),
            (
                GOOD.replace("key = \"bob\"", "key = \"ada\""),
                "listed twice",
            ),
            (
                GOOD.replace("exec = { command = [\"cat\"] }", ""),
                "no exec table",
            ),
            (
                GOOD.replace("rooms = [\"lobby\"]", "rooms = []"),
                "at least one room",
            ),
            (GOOD.replace("\"lobby\"", "\"a/b\""), "'/'"),
            (
                GOOD.replace("rooms = [", "key = \"a.key\"\nrooms = ["),
                "sign is not true",
            ),
            (
                GOOD.replace("rooms = [", "sign = \"yes\"\nrooms = ["),
                "bool",
            ),
            (
                GOOD.replace("rooms = [", "pool = 0\nrooms = ["),
                "between 1 and 64",
            ),
            (
                GOOD.replace("rooms = [", "pool = 65\nrooms = ["),
                "between 1 and 64",
            ),
        ];
        for (text, needle) in cases {
            let e = RelayConfig::parse("f.toml", &text).unwrap_err();
            assert!(e.line.is_some(), "no line for {e}");
            assert!(e.reason.contains(needle), "{e} lacks {needle:?}");
        }
    }
}
