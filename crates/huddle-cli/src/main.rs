//! `huddle`: the command-line tool. Flag definitions and glue; the work is done by
//! the library crates.

mod admin;
mod archive_cmds;
mod bench_coord;
mod bench_ledger;
mod bench_sched;
mod bench_startup;
mod bench_stats;
mod bench_tasks;
mod demo;
mod keys;
mod ledger_cmds;
mod mcp;
mod mcp_http;
mod mcp_more;
mod mcp_resources;
mod output;
mod pattern_cmds;
mod relay_cmd;
mod relay_metrics;
mod resource_cmds;
mod scratch;
mod serve;
mod shared_state_cmds;
mod state_cmds;
mod status_cmds;
mod task_cmds;
mod task_show;
mod trace_cmds;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// huddle: coordination for groups of AI agents that share a room.
#[derive(Parser, Debug)]
#[command(name = "huddle", version, about, long_about = None)]
pub struct Cli {
    /// Database: `postgres://...`, `sqlite://PATH` or a file path [default:
    /// ./huddle.db; for `relay`, the configuration file's].
    #[arg(long, global = true, env = "HUDDLE_DB")]
    pub db: Option<String>,

    /// Identity of this process as a writer (stored with each row on SQLite).
    #[arg(long, global = true, env = "HUDDLE_RELAY_ID", default_value = "cli")]
    pub relay_id: String,

    /// This writer's signing key file: every row the command writes is signed with it
    /// (as --relay-id; on Postgres as the database role), for rooms that register it
    /// (`!config relay-keys`). `huddle writer-key ID` creates one. (`huddle relay`
    /// signs only with `sign = true` in its file.)
    #[arg(long, global = true, env = "HUDDLE_RELAY_KEY", value_name = "PATH")]
    pub relay_key: Option<std::path::PathBuf>,

    /// Log filter (e.g. `info`, `huddle_store=debug`); also `RUST_LOG` [default:
    /// `warn`; for `relay`, `warn,huddle=info`: its start-up lines].
    #[arg(long, global = true, env = "HUDDLE_LOG")]
    pub log: Option<String>,

    /// Fallback poll interval for following the ledger, in milliseconds.
    #[arg(long, global = true, env = "HUDDLE_POLL_MS", default_value_t = 1000)]
    pub poll_ms: u64,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the database schema.
    Migrate,
    /// Rooms.
    Room {
        #[command(subcommand)]
        command: RoomCommand,
    },
    /// Post a message to a room (as its owner when ID owns the room). The owner's
    /// messages are signed with the owner's key; a command without the key is posted
    /// as an ordinary message, not executed, and huddle exits with status 3. In a room
    /// that requires signatures a message nobody's registered key signs is not posted.
    Post {
        /// Room to post in.
        #[arg(long)]
        room: String,
        /// Who is speaking.
        #[arg(long = "as", value_name = "ID")]
        actor: String,
        /// Thread inside the room.
        #[arg(long)]
        thread: Option<String>,
        /// Answer this message (its id, or a unique prefix of at least 6 hex digits):
        /// the reply wakes the message's author only, when that is an agent, and goes
        /// in the message's thread unless --thread says otherwise.
        #[arg(long, value_name = "ID")]
        reply_to: Option<String>,
        /// The message text; `-` reads it from standard input.
        text: String,
        /// Wait for the reply to this message (an owner command's answer or an
        /// agent's reply), up to SECS seconds [default: 60], and print it; exits
        /// non-zero when none comes.
        #[arg(long, value_name = "SECS", num_args = 0..=1, require_equals = true,
              default_missing_value = "60")]
        wait: Option<f64>,
        /// The owner's key file [default: $HUDDLE_KEYS/ID.key, else
        /// $XDG_CONFIG_HOME/huddle/keys/ID.key, else ~/.config/huddle/keys/ID.key].
        #[arg(long, env = "HUDDLE_OWNER_KEY", value_name = "PATH")]
        key: Option<std::path::PathBuf>,
    },
    /// Print a room's interactions.
    Tail {
        /// Room to print.
        #[arg(long)]
        room: String,
        /// Keep printing new interactions as they arrive.
        #[arg(long)]
        follow: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Only this thread's interactions (`-` for the room's top level).
        #[arg(long)]
        thread: Option<String>,
        /// Only these verbs, comma-separated; `task.` (ending in a dot) means every
        /// `task.*` verb.
        #[arg(long, value_delimiter = ',')]
        verb: Vec<String>,
        /// Only interactions newer than this long ago (`30s`, `10m`, `1h30m`).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
    /// Host agents (from a huddle.toml) until interrupted; prints a JSON summary on
    /// exit. `--db` / `HUDDLE_DB` override the file's database.
    Relay {
        /// The relay configuration file.
        #[arg(long, default_value = "huddle.toml")]
        config: std::path::PathBuf,
        /// Start every configured agent, check that it can run turns (an ACP agent
        /// is initialised), report one line per agent and exit.
        #[arg(long)]
        check: bool,
        /// Serve this relay's metrics (the Prometheus / OpenMetrics text format) on
        /// http://ADDR/metrics: PORT (on 127.0.0.1) or IP:PORT (port 0 picks a free
        /// one); prints the URL when listening.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Allow a --metrics address that is not loopback (anyone who reaches it reads
        /// the relay's metrics).
        #[arg(long, requires = "metrics")]
        metrics_allow_remote: bool,
    },
    /// Create (when absent) and show writer ID's signing key, printed as `ID=<public
    /// key>`: the entry the room owner registers with `!config relay-keys`. The key
    /// file is --relay-key, else HUDDLE_RELAY_KEY, else relays/ID.key in the keys
    /// directory ($HUDDLE_KEYS, $XDG_CONFIG_HOME/huddle/keys, ~/.config/huddle/keys).
    /// On Postgres ID is the relay's database role.
    WriterKey {
        /// The writer: a relay id (`relay` in huddle.toml) or a --relay-id.
        id: String,
    },
    /// Measure huddle beside a plain-SQL baseline in the same run.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Simulated agents in several relays work a delegated task DAG, with a live
    /// board and a report (a temporary SQLite file unless --db is given).
    Demo(demo::DemoArgs),
    /// A room's board: presence per agent, designations, notices.
    Board {
        /// Room to show.
        #[arg(long)]
        room: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// The relays serving a room (or every room): online or offline by their liveness
    /// lease, the agents they host, version, how far behind the ledger they were and
    /// their last heartbeat.
    Status {
        /// Only the relays of this room.
        #[arg(long)]
        room: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Waits until a room settles (nothing ready, claimed or running; a relay
    /// records it as `room.settled`): exits 0 when every task is done, 2 when some
    /// are abandoned or blocked, 124 when --timeout passes first.
    Wait {
        /// Room to wait for.
        #[arg(long)]
        room: String,
        /// Give up after this many seconds (default: wait as long as it takes).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// The causal tree of a message, owner command or task: every row it caused, with
    /// time, actor, writer and epoch, each created task's life (ready, claimed,
    /// turns, completion, failures, re-takes) and where it stopped and why.
    Trace {
        /// The room.
        #[arg(long)]
        room: String,
        /// A task id of the room, or an interaction id (a prefix of at least 6 hex
        /// digits will do).
        id: String,
        /// JSON output (a tree of nodes).
        #[arg(long)]
        json: bool,
    },
    /// A room's task DAG: counts, the ready frontier, every task's status and owner.
    Tasks {
        /// Room to show.
        #[arg(long)]
        room: String,
        /// JSON output.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Draw the table again whenever the DAG changes, until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// A room's quorum decisions: status, outcome, votes and who has not voted.
    Decisions {
        /// Room to show.
        #[arg(long)]
        room: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// A room's phase barriers: status, who checked in, who is missing.
    Barriers {
        /// Room to show.
        #[arg(long)]
        room: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// A room's leases (the coordinator): holder, epoch, expiry and the latest
    /// directives, each checked against the epoch; `acquire`, `renew`, `release` act
    /// on the lease as an agent (the MCP tools of the same names).
    #[command(args_conflicts_with_subcommands = true)]
    Lease {
        #[command(subcommand)]
        command: Option<pattern_cmds::LeaseCommand>,
        /// Room to show.
        #[arg(long, required = true)]
        room: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Propose a quorum decision as an agent (the `propose` MCP tool).
    Propose(pattern_cmds::Propose),
    /// Vote on a decision as an agent (the `vote` MCP tool).
    Vote(pattern_cmds::Vote),
    /// Open a barrier or check in at one, as an agent (the `barrier_open` and
    /// `barrier_arrive` MCP tools).
    Barrier {
        #[command(subcommand)]
        command: pattern_cmds::BarrierCommand,
    },
    /// A room's approval requests: pending first, with how the owner answers
    /// (`!approve ID` / `!deny ID [reason]`), then the answered ones.
    Approvals {
        /// Room to show.
        #[arg(long)]
        room: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Ask the room owner before an action, or see where a request stands, as an
    /// agent (the `approval_request` and `approval` MCP tools).
    Approval {
        #[command(subcommand)]
        command: pattern_cmds::ApprovalCommand,
    },
    /// Serve one agent's tools (read, post, board, tasks, task_claim, ...) over the
    /// Model Context Protocol on stdin/stdout; with --http, every agent that has a
    /// token (`huddle admin token add`) over streamable HTTP.
    Mcp {
        #[command(flatten)]
        who: Option<task_cmds::Identity>,
        /// Print the snippet that registers this server (with these --room, --agent,
        /// --capabilities and --db, or this --http address) in an MCP client, and exit.
        #[arg(long, value_name = "CLIENT")]
        print_config: Option<mcp_more::Client>,
        /// Serve MCP streamable HTTP on ADDR (e.g. 127.0.0.1:8765; port 0 picks one)
        /// at /mcp, for the agents of the database's tokens; prints the URL.
        #[arg(long, value_name = "ADDR", conflicts_with_all = ["room", "agent", "capabilities"])]
        http: Option<std::net::SocketAddr>,
        /// With --http: allow an address that is not loopback (put TLS in front).
        #[arg(long, requires = "http")]
        allow_remote: bool,
    },
    /// An agent's task operations without MCP (the same calls as `huddle mcp`'s
    /// tools): claim, renew, complete, fail, release, bid, delegate; and `show`, one
    /// task's attempts and result.
    Task {
        #[command(subcommand)]
        command: task_cmds::TaskCommand,
    },
    /// Database roles on Postgres: `init`, `add-relay`, `remove-relay`, `add-owner`,
    /// `add-reader`, ... (run with the administrator's `--db`).
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
    /// Shared resources (files by path glob, APIs, build slots): take, renew,
    /// release as an agent (the `resource_*` MCP tools), or list who holds what.
    Resource {
        #[command(subcommand)]
        command: resource_cmds::ResourceCommand,
    },
    /// The git pre-commit guard: refuse a commit touching a path another agent holds
    /// exclusively (`install` it in a repository; `check` is what it runs).
    Guard {
        #[command(subcommand)]
        command: resource_cmds::GuardCommand,
    },
    /// A room's versioned shared state: get, put (with --if-version), list.
    State {
        #[command(subcommand)]
        command: shared_state_cmds::StateCommand,
    },
    /// A read-only web dashboard, HTTP API and Prometheus metrics for every room of
    /// the database (docs/http.md); prints the URL, serves until interrupted.
    Serve(serve::ServeArgs),
    /// List claims: key, holder, epoch and expiry (by the database clock).
    Claims {
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only this room's claims (replies, tasks, leases, resources).
        #[arg(long)]
        room: Option<String>,
        /// Only live claims: unexpired (released and finished ones are expired).
        #[arg(long)]
        live: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `huddle bench ...`
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Append throughput (batch 1, 10, 100) and contended claim acquisitions, huddle
    /// beside plain SQL on the same database.
    Ledger {
        /// Seconds measured per scenario and side.
        #[arg(long, default_value_t = 6.0)]
        seconds: f64,
        /// Concurrent writers / contenders.
        #[arg(long, default_value_t = 4)]
        writers: usize,
        /// Batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
        batches: Vec<usize>,
        /// Run the whole bench this many times, each round in a scratch database of
        /// its own with the side that goes first alternating, and report every
        /// scenario's smallest, median and largest ratio.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// JSON report instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The coordination-strategies scenario (300 URLs; 6 / 30 / 300 agents over 3
    /// relays): duplicates, missed tasks, makespan against the ideal, wake latency.
    Coord(bench_coord::CoordArgs),
    /// Task hand-out throughput end to end (N tasks, A agents over R relay
    /// processes, turn length T) beside a plain-SQL job queue on the same database.
    Tasks(bench_tasks::TasksArgs),
    /// The synchronizer's own cost per task as the DAG grows (no database: every
    /// intent answered from memory).
    Sched(bench_sched::SchedArgs),
    /// A relay process's start-up time (to its first reply) and peak memory on a
    /// ledger whose other rooms hold many rows, beside the same relay with its room
    /// alone; any `huddle` binary (--huddle), in a scratch database beside --db.
    Startup(bench_startup::StartupArgs),
}

/// `huddle room ...`
#[derive(Subcommand, Debug)]
pub enum RoomCommand {
    /// Create a room with its owner. Creating it again with the same owner is a no-op.
    Create {
        /// Room name.
        room: String,
        /// The owner's id: only the owner's `!delegate` / `!config`, signed with the
        /// owner's key, are executed.
        #[arg(long)]
        owner: String,
        /// The owner's key file, created (mode 0600) when absent [default:
        /// $HUDDLE_KEYS/OWNER.key, else $XDG_CONFIG_HOME/huddle/keys/OWNER.key, else
        /// ~/.config/huddle/keys/OWNER.key].
        #[arg(long, env = "HUDDLE_OWNER_KEY", value_name = "PATH")]
        key: Option<std::path::PathBuf>,
    },
    /// Every room in the database: owner and number of rows.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Archive a settled room, as its owner: every row is exported to FILE (JSON
    /// lines, then the `room.archived` row signed with the owner's key), then removed
    /// from the ledger with the room's claims, leaving the `room.archived` row. The
    /// room can never be used again; relays refuse to serve it.
    Archive {
        /// Room name.
        room: String,
        /// The file to export to (must not exist).
        #[arg(long, value_name = "FILE")]
        to: std::path::PathBuf,
        /// The owner's id [default: the room's owner, whose key must be at hand].
        #[arg(long)]
        owner: Option<String>,
        /// The owner's key file [default: as for `room create`].
        #[arg(long, env = "HUDDLE_OWNER_KEY", value_name = "PATH")]
        key: Option<std::path::PathBuf>,
    },
    /// Check an archive file: every row's id is the hash of its content, the count
    /// and digest are those its `room.archived` row records, and the owner's
    /// signature verifies against the room's key. Needs no database.
    VerifyArchive {
        /// The archive file.
        file: std::path::PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Replace the room owner's key: a new key pair is made, the rotation is signed
    /// with the current key and appended, and the key file then holds the new key
    /// (the old one is kept beside it as `NAME.key.retired-<key id>`). Commands signed
    /// with the old key no longer count once the rotation is in the ledger.
    RotateKey {
        /// Room name.
        room: String,
        /// The owner's id.
        #[arg(long)]
        owner: String,
        /// The owner's current key file [default: as for `room create`].
        #[arg(long, env = "HUDDLE_OWNER_KEY", value_name = "PATH")]
        key: Option<std::path::PathBuf>,
    },
}

/// Logs go to stderr, coloured only when it is a terminal. The default filter is
/// `warn`; a relay also logs its start-up lines (`huddle=info`).
fn init_tracing(filter: Option<&str>, command: &Command) {
    use std::io::IsTerminal as _;
    let default = match command {
        Command::Relay { .. } => "warn,huddle=info",
        _ => "warn",
    };
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter.unwrap_or(default)))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(env)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// Whether `command` may run without an existing database: it creates one (`migrate`,
/// `room create`, `demo`, `bench`), explains itself (`admin` on SQLite), checks its
/// own (`relay`) or opens none. The others need an existing one, so that a typo in
/// `--db` is an error rather than a new empty database.
fn may_lack_database(command: &Command) -> bool {
    matches!(
        command,
        Command::Migrate
            | Command::Room {
                command: RoomCommand::Create { .. }
            }
            | Command::Demo(_)
            | Command::Bench { .. }
            | Command::Admin { .. }
            | Command::Relay { .. }
            | Command::WriterKey { .. }
            | Command::Room {
                command: RoomCommand::VerifyArchive { .. }
            }
            | Command::Mcp {
                print_config: Some(_),
                ..
            }
    )
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes
    // away (`huddle tail | head`) instead of failing on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    init_tracing(cli.log.as_deref(), &cli.command);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<status_cmds::WaitEnded>() => {
            eprintln!("huddle: {e}");
            let code = e
                .downcast_ref::<status_cmds::WaitEnded>()
                .map_or(1, |w| w.code);
            ExitCode::from(code)
        }
        Err(e) if e.is::<ledger_cmds::NotSigned>() => {
            eprintln!("huddle: {e}");
            ExitCode::from(ledger_cmds::EXIT_NOT_SIGNED)
        }
        Err(e) if e.is::<shared_state_cmds::Stale>() => {
            eprintln!("huddle: {e}");
            ExitCode::from(shared_state_cmds::EXIT_STALE)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `huddle writer-key ID`: the key file made when absent, its entry printed alone on
/// stdout (so a script can capture it), where it is on stderr.
fn writer_key(id: &str, given: Option<&std::path::Path>) -> anyhow::Result<()> {
    huddle_core::config::binding::check_writer_name(id)
        .map_err(|e| anyhow::anyhow!("writer {id:?}: {e}"))?;
    let path = keys::writer_key_path(id, given)?;
    let (secret, created) = keys::load_or_create(&path)?;
    let what = if created { "created" } else { "key" };
    eprintln!(
        "{what} {}; the room owner registers it with `!config relay-keys {id}=<key>` \
         (with every other writer's entry)",
        path.display()
    );
    println!("{id}={}", secret.public().to_hex());
    Ok(())
}

/// The default database when neither `--db` nor `HUDDLE_DB` is given.
pub const DEFAULT_DB: &str = "./huddle.db";

async fn run(cli: Cli) -> anyhow::Result<()> {
    let db = cli.db.clone().unwrap_or_else(|| DEFAULT_DB.to_string());
    let mut options = huddle_store::StoreOptions {
        relay: cli.relay_id.clone(),
        poll_interval: Duration::from_millis(cli.poll_ms.max(1)),
        ..Default::default()
    };
    let signs = !matches!(
        cli.command,
        Command::Relay { .. } | Command::WriterKey { .. }
    );
    if let (Some(path), true) = (&cli.relay_key, signs) {
        let secret = keys::load(path)?.ok_or_else(|| {
            anyhow::anyhow!(
                "no writer key at {} (--relay-key / HUDDLE_RELAY_KEY); create it with \
                 `huddle --relay-key {} writer-key {}`",
                path.display(),
                path.display(),
                cli.relay_id
            )
        })?;
        options.signer = Some(secret);
    }
    if !may_lack_database(&cli.command) {
        ledger_cmds::require_database(&db)?;
    }
    match cli.command {
        Command::Migrate => ledger_cmds::migrate(&db, options).await,
        Command::Room {
            command: RoomCommand::Create { room, owner, key },
        } => ledger_cmds::room_create(&db, options, &room, &owner, key.as_deref()).await,
        Command::Room {
            command: RoomCommand::List { json },
        } => ledger_cmds::room_list(&db, options, json).await,
        Command::Room {
            command:
                RoomCommand::Archive {
                    room,
                    to,
                    owner,
                    key,
                },
        } => {
            archive_cmds::room_archive(&db, options, &room, &to, owner.as_deref(), key.as_deref())
                .await
        }
        Command::Room {
            command: RoomCommand::VerifyArchive { file, json },
        } => archive_cmds::verify_archive(&file, json),
        Command::Room {
            command: RoomCommand::RotateKey { room, owner, key },
        } => ledger_cmds::room_rotate_key(&db, options, &room, &owner, key.as_deref()).await,
        Command::Post {
            room,
            actor,
            thread,
            reply_to,
            text,
            key,
            wait,
        } => {
            let wait = match wait {
                Some(secs) if secs.is_finite() && secs > 0.0 => Some(Duration::from_secs_f64(secs)),
                Some(secs) => anyhow::bail!("--wait={secs}: give a positive number of seconds"),
                None => None,
            };
            let to = ledger_cmds::Speaker {
                actor: &actor,
                thread,
                reply_to: reply_to.as_deref(),
                key: key.as_deref(),
                wait,
            };
            ledger_cmds::post(&db, options, &room, to, &text).await
        }
        Command::Tail {
            room,
            follow,
            json,
            thread,
            verb,
            since,
        } => {
            let filter = ledger_cmds::TailFilter::new(thread, verb, since.as_deref())?;
            ledger_cmds::tail(&db, options, &room, follow, json, &filter).await
        }
        Command::Bench {
            command:
                BenchCommand::Ledger {
                    seconds,
                    writers,
                    batches,
                    rounds,
                    json,
                },
        } => {
            if writers == 0 || batches.contains(&0) || seconds <= 0.0 {
                anyhow::bail!("writers, batch sizes and seconds must be positive");
            }
            let report = bench_ledger::run(bench_ledger::LedgerBenchOptions {
                db: db.clone(),
                seconds,
                writers,
                batches,
                signer: options.signer.clone(),
                rounds,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", bench_ledger::render(&report));
            }
            Ok(())
        }
        Command::Relay {
            config,
            check: true,
            ..
        } => relay_cmd::check(&config).await,
        Command::Relay {
            config,
            check: false,
            metrics,
            metrics_allow_remote,
        } => {
            let metrics = metrics
                .map(|m| relay_metrics::parse_addr(&m, metrics_allow_remote))
                .transpose()?;
            relay_cmd::run(&config, cli.db.clone(), cli.poll_ms, metrics).await
        }
        Command::Demo(args) => demo::run(args, cli.db.clone(), options).await,
        Command::Board { room, json } => state_cmds::board(&db, options, &room, json).await,
        Command::Tasks {
            room, watch: true, ..
        } => state_cmds::tasks_watch(&db, options, &room).await,
        Command::Tasks { room, json, .. } => state_cmds::tasks(&db, options, &room, json).await,
        Command::Trace { room, id, json } => {
            trace_cmds::trace(&db, options, &room, &id, json).await
        }
        Command::Wait { room, timeout } => status_cmds::wait(&db, options, &room, timeout).await,
        Command::Status { room, json } => {
            status_cmds::status(&db, options, room.as_deref(), json).await
        }
        Command::Decisions { room, json } => {
            pattern_cmds::show(&db, options, &room, json, pattern_cmds::Kind::Decisions).await
        }
        Command::Barriers { room, json } => {
            pattern_cmds::show(&db, options, &room, json, pattern_cmds::Kind::Barriers).await
        }
        Command::Approvals { room, json } => {
            pattern_cmds::show(&db, options, &room, json, pattern_cmds::Kind::Approvals).await
        }
        Command::Lease {
            command: Some(command),
            ..
        } => pattern_cmds::lease(&db, options, command).await,
        Command::Lease { room, json, .. } => {
            let room = room.unwrap_or_default();
            pattern_cmds::show(&db, options, &room, json, pattern_cmds::Kind::Leases).await
        }
        Command::Approval { command } => pattern_cmds::approval(&db, options, command).await,
        Command::Propose(p) => pattern_cmds::propose(&db, options, p).await,
        Command::Vote(v) => pattern_cmds::vote(&db, options, v).await,
        Command::Barrier { command } => pattern_cmds::barrier(&db, options, command).await,
        Command::Bench {
            command: BenchCommand::Sched(args),
        } => {
            let lines = bench_sched::run(&args);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&lines)?);
            } else {
                print!("{}", bench_sched::render(&args, &lines));
            }
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Startup(args),
        } => {
            let json = args.json;
            let report = bench_startup::run(args, db.clone()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", bench_startup::render(&report));
            }
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Tasks(args),
        } => {
            let json = args.json;
            let report = bench_tasks::run(args, db.clone()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", bench_tasks::render(&report));
            }
            if !report.clean() {
                anyhow::bail!("a run stopped early or ran a task other than exactly once");
            }
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Coord(args),
        } => {
            let json = args.json;
            let report = bench_coord::run(args, cli.db.clone(), options).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", huddle_sim::render::coord(&report));
            }
            if report.runs.iter().any(|r| !r.report.clean()) {
                anyhow::bail!("a run missed or duplicated tasks");
            }
            Ok(())
        }
        Command::Mcp {
            print_config: Some(client),
            http: Some(addr),
            ..
        } => {
            mcp_http::print_config(addr, client);
            Ok(())
        }
        Command::Mcp {
            http: Some(addr),
            allow_remote,
            ..
        } => mcp_http::serve(&db, options, addr, allow_remote).await,
        Command::Mcp { who: None, .. } => {
            anyhow::bail!("huddle mcp needs --room and --agent (stdio), or --http ADDR")
        }
        Command::Mcp {
            who: Some(who),
            print_config: Some(client),
            ..
        } => mcp_more::print_config(&db, &who, client),
        Command::Mcp {
            who: Some(who),
            print_config: None,
            ..
        } => mcp::serve_stdio(&db, options, &who.room, &who.agent, who.capabilities).await,
        Command::Task { command } => task_cmds::run(&db, options, command).await,
        Command::Admin { command } => admin::run(&db, options, command).await,
        Command::Claims {
            prefix,
            room,
            live,
            json,
        } => ledger_cmds::claims(&db, options, &prefix, room.as_deref(), live, json).await,
        Command::WriterKey { id } => writer_key(&id, cli.relay_key.as_deref()),
        Command::Serve(args) => serve::run(&db, options, args).await,
        Command::Resource { command } => resource_cmds::run(&db, options, command).await,
        Command::Guard { command } => resource_cmds::guard(&db, options, command).await,
        Command::State { command } => shared_state_cmds::run(&db, options, command).await,
    }
}
