//! `huddle resource take|renew|release|list` and `huddle guard install|check`: shared
//! resources for agents and scripts without MCP (each write is the one
//! [`AgentSession`] call the MCP tool of the same name makes), and the git pre-commit
//! guard that refuses a commit touching a path another agent holds exclusively.
//!
//! The group is `resource`, not `lease`: `huddle lease acquire|renew|release` is the
//! coordinator lease of the patterns (one named lease per room, with directives),
//! while a resource is any number of files, APIs or slots with modes.
//!
//! [`AgentSession`]: huddle_agent::AgentSession

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use huddle_agent::resource_views::{
    HoldingView, ResourceAcquireArgs, ResourceNamesArgs, ResourceSpec, ResourcesWritten,
};
use huddle_core::resources::Mode;
use huddle_store::resources::live_holdings;
use huddle_store::StoreOptions;

use crate::ledger_cmds;
use crate::output::format_time;
use crate::state_cmds::emit;
use crate::task_cmds::{refusal, show, Agent};

/// `huddle resource ...`
#[derive(Subcommand, Debug)]
pub enum ResourceCommand {
    /// Take resources as an agent, all or none (the `resource_acquire` tool). With
    /// `-- COMMAND ...`, runs the command while holding them (renewed at a third of
    /// their lease), gives them back when it ends and exits with its status; without,
    /// they stay held until their lease lapses, a `renew` or a `release`.
    Take(Take),
    /// Extend resources the agent holds (all, or those named).
    Renew {
        #[command(flatten)]
        who: Agent,
        /// The resources [default: all the agent holds in the room].
        resources: Vec<String>,
        /// The new lease, ms [default: 60000].
        #[arg(long)]
        ttl_ms: Option<u64>,
    },
    /// Give back resources the agent holds (all, or those named).
    Release {
        #[command(flatten)]
        who: Agent,
        /// The resources [default: all the agent holds in the room].
        resources: Vec<String>,
    },
    /// Who holds which resources of a room, how and until when (the database's view).
    List {
        /// The room.
        #[arg(long)]
        room: String,
        /// Only file holdings covering this path.
        #[arg(long)]
        path: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `huddle resource take`.
#[derive(Args, Debug)]
pub struct Take {
    #[command(flatten)]
    who: Agent,
    /// Resources taken exclusively: `file:GLOB` or `kind:name`.
    resources: Vec<String>,
    /// A resource taken shared (repeatable).
    #[arg(long, value_name = "RESOURCE")]
    shared: Vec<String>,
    /// A resource taken as one of `--permits` holders (repeatable).
    #[arg(long, value_name = "RESOURCE")]
    permit: Vec<String>,
    /// How many may hold each `--permit` resource at once.
    #[arg(long, default_value_t = 1)]
    permits: u32,
    /// The lease, ms (500 to 3600000).
    #[arg(long, default_value_t = 60_000)]
    ttl_ms: u64,
    /// Wait up to this long for the resources, ms (at most 600000).
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// What for, shown on the board.
    #[arg(long)]
    reason: Option<String>,
    /// The command to run while holding the resources.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl Take {
    fn args(&self) -> ResourceAcquireArgs {
        let spec = |name: &String, mode: &str, permits| ResourceSpec {
            name: name.clone(),
            mode: Some(mode.into()),
            permits,
        };
        let mut resources: Vec<ResourceSpec> = self
            .resources
            .iter()
            .map(|n| spec(n, "exclusive", None))
            .collect();
        resources.extend(self.shared.iter().map(|n| spec(n, "shared", None)));
        resources.extend(
            self.permit
                .iter()
                .map(|n| spec(n, "permits", Some(self.permits))),
        );
        ResourceAcquireArgs {
            resources,
            ttl_ms: Some(self.ttl_ms),
            wait_ms: Some(self.wait_ms),
            reason: self.reason.clone(),
        }
    }
}

fn holding_line(out: &mut String, h: &HoldingView) {
    let _ = writeln!(
        out,
        "{} {} by {} (epoch {}) until {}",
        h.name,
        h.mode,
        h.holder,
        h.epoch,
        format_time(h.expires_at)
    );
}

fn written_lines(what: &str, w: &ResourcesWritten) -> String {
    let mut out = String::new();
    if w.resources.is_empty() {
        let _ = writeln!(out, "nothing {what}");
    }
    for h in &w.resources {
        out.push_str(what);
        out.push_str(": ");
        holding_line(&mut out, h);
    }
    out.trim_end().to_string()
}

/// Runs a `huddle resource` subcommand.
pub async fn run(db: &str, options: StoreOptions, c: ResourceCommand) -> anyhow::Result<()> {
    match c {
        ResourceCommand::Take(take) => take_and_run(db, options, take).await,
        ResourceCommand::Renew {
            who,
            resources,
            ttl_ms,
        } => {
            let me = who.open(db, options).await?;
            let r = me
                .resource_renew(ResourceNamesArgs { resources, ttl_ms })
                .await
                .map_err(refusal)?;
            show(who.json, &r, || written_lines("renewed", &r))
        }
        ResourceCommand::Release { who, resources } => {
            let me = who.open(db, options).await?;
            let r = me
                .resource_release(ResourceNamesArgs {
                    resources,
                    ttl_ms: None,
                })
                .await
                .map_err(refusal)?;
            show(who.json, &r, || written_lines("released", &r))
        }
        ResourceCommand::List { room, path, json } => {
            let store = ledger_cmds::open(db, options).await?;
            let mut held = live_holdings(&*store, &room).await?;
            if let Some(p) = &path {
                held.retain(|h| h.name.covers_path(p));
            }
            held.sort_by(|a, b| (&a.name, &a.holder).cmp(&(&b.name, &b.holder)));
            let views: Vec<HoldingView> = held.iter().map(HoldingView::from).collect();
            if json {
                return emit(&format!("{}\n", serde_json::to_string_pretty(&views)?));
            }
            let mut out = String::new();
            if views.is_empty() {
                let _ = writeln!(out, "room {room}: no resources held");
            }
            for v in &views {
                holding_line(&mut out, v);
            }
            emit(&out)
        }
    }
}

async fn take_and_run(db: &str, options: StoreOptions, take: Take) -> anyhow::Result<()> {
    let me = std::sync::Arc::new(take.who.open(db, options).await?);
    let r = me.resource_acquire(take.args()).await.map_err(refusal)?;
    if take.command.is_empty() {
        return show(take.who.json, &r, || written_lines("held", &r));
    }
    let keeper = tokio::spawn({
        let me = me.clone();
        async move { me.keep_resources().await }
    });
    let epochs: Vec<String> = r
        .resources
        .iter()
        .map(|h| format!("{}={}", h.name, h.epoch))
        .collect();
    let mut child = tokio::process::Command::new(&take.command[0])
        .args(&take.command[1..])
        .env("HUDDLE_RESOURCES", epochs.join("\n"))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {:?}", take.command[0]))?;
    let outcome = tokio::select! {
        status = child.wait() => Ok(status?),
        lost = keeper => Err(lost.unwrap_or_default()),
    };
    let status = match outcome {
        Ok(status) => status,
        Err(lost) => {
            // The command is no longer protected: stop it.
            let _ = child.start_kill();
            let _ = child.wait().await;
            let _ = me.release_kept().await;
            bail!(
                "lost resources {} while the command ran (their lease lapsed); the command was stopped",
                lost.join(", ")
            );
        }
    };
    me.release_kept().await.map_err(refusal)?;
    me.store().flush().await;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => bail!("the command ended by a signal ({status})"),
    }
}

/// `huddle guard ...`
#[derive(Subcommand, Debug)]
pub enum GuardCommand {
    /// Write a git pre-commit hook into a repository that refuses a commit touching
    /// a path another agent holds exclusively (`file:` resources of ROOM). The hook
    /// records this huddle binary, the database and the room; the committing agent is
    /// `$HUDDLE_AGENT`. Skip it for one commit with `HUDDLE_GUARD=off git commit ...`
    /// (or `git commit --no-verify`).
    Install {
        /// The room whose resources guard the repository.
        #[arg(long)]
        room: String,
        /// The repository [default: the current directory's].
        #[arg(long)]
        repo: Option<PathBuf>,
        /// Replace a pre-commit hook that huddle did not write.
        #[arg(long)]
        force: bool,
    },
    /// What the hook runs: refuses (exit 1, with each holder and expiry) when a
    /// staged path, or a path given, is held exclusively by another agent.
    Check {
        /// The room.
        #[arg(long)]
        room: String,
        /// The committing agent: its own holdings never block it.
        #[arg(long, env = "HUDDLE_AGENT")]
        agent: Option<String>,
        /// Paths to check instead of the staged ones.
        paths: Vec<String>,
    },
}

/// The first line huddle's hook carries, so `install` knows its own.
const HOOK_MARK: &str =
    "# huddle guard: refuses a commit touching a path another agent holds exclusively.";

/// Quotes `s` for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Runs `git` in `dir`, returning its standard output.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .context("cannot run git")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Runs a `huddle guard` subcommand.
pub async fn guard(db: &str, options: StoreOptions, c: GuardCommand) -> anyhow::Result<()> {
    match c {
        GuardCommand::Install { room, repo, force } => install(db, &room, repo, force),
        GuardCommand::Check { room, agent, paths } => {
            check(db, options, &room, agent.as_deref(), paths).await
        }
    }
}

fn install(db: &str, room: &str, repo: Option<PathBuf>, force: bool) -> anyhow::Result<()> {
    huddle_core::validate_name("room", room, &huddle_core::Limits::default())?;
    let repo = match repo {
        Some(r) => r,
        None => std::env::current_dir()?,
    };
    let hooks = String::from_utf8(git(&repo, &["rev-parse", "--git-path", "hooks"])?)?;
    let hooks = repo.join(hooks.trim());
    std::fs::create_dir_all(&hooks)
        .with_context(|| format!("cannot create {}", hooks.display()))?;
    let hook = hooks.join("pre-commit");
    if let Ok(existing) = std::fs::read_to_string(&hook) {
        if !existing.contains(HOOK_MARK) && !force {
            bail!(
                "{} exists and is not huddle's; pass --force to replace it, or call `huddle guard check --room {room}` from it",
                hook.display()
            );
        }
    }
    // A SQLite file is recorded by its absolute path: git runs hooks in the work tree.
    let db = match huddle_store::parse_url(db) {
        Ok(huddle_store::Backend::Sqlite(path)) if !path.starts_with(":memory:") => {
            std::path::absolute(&path)?.display().to_string()
        }
        _ => db.to_string(),
    };
    let exe = std::env::current_exe().context("cannot find the huddle binary")?;
    let script = format!(
        "#!/bin/sh\n{HOOK_MARK}\n# Written by `huddle guard install`. Skip it for one commit: HUDDLE_GUARD=off git commit ...\n# (or git commit --no-verify). The committing agent is $HUDDLE_AGENT.\n[ \"$HUDDLE_GUARD\" = off ] && exit 0\nexec {} --db {} guard check --room {}\n",
        sh_quote(&exe.display().to_string()),
        sh_quote(&db),
        sh_quote(room),
    );
    std::fs::write(&hook, script).with_context(|| format!("cannot write {}", hook.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))?;
    }
    println!("installed {} (room {room})", hook.display());
    Ok(())
}

async fn check(
    db: &str,
    options: StoreOptions,
    room: &str,
    agent: Option<&str>,
    paths: Vec<String>,
) -> anyhow::Result<()> {
    let paths = if paths.is_empty() {
        // Every path the commit adds, changes or deletes; a rename is both its paths.
        let out = git(
            &std::env::current_dir()?,
            &["diff", "--cached", "--name-only", "--no-renames", "-z"],
        )?;
        out.split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    } else {
        paths
    };
    if paths.is_empty() {
        return Ok(());
    }
    let store = ledger_cmds::open(db, options).await?;
    let held: Vec<_> = live_holdings(&*store, room)
        .await?
        .into_iter()
        .filter(|h| h.mode == Mode::Exclusive && h.name.kind() == "file")
        .filter(|h| Some(h.holder.as_str()) != agent)
        .collect();
    let mut refused = String::new();
    for path in &paths {
        for h in held.iter().filter(|h| h.name.covers_path(path)) {
            let _ = writeln!(
                refused,
                "  {path}: {} is held exclusively by {} (epoch {}) until {}",
                h.name,
                h.holder,
                h.epoch,
                format_time(h.expires_at)
            );
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    eprint!(
        "huddle guard: this commit touches paths another agent holds exclusively (room {room}):\n{refused}\
         Nothing was committed. Wait until they are released (`huddle resource list --room {room}`), \
         or commit anyway with HUDDLE_GUARD=off git commit ... (or git commit --no-verify).\n"
    );
    std::process::exit(1);
}
