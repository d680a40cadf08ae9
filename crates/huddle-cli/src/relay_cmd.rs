//! `huddle relay --config huddle.toml`: host agents until interrupted.

use std::path::Path;

use anyhow::Context;
use huddle_core::sync::LocalAgent;
use huddle_relay::config::{DriverKind, RelayConfig};
use huddle_relay::driver::McpLaunch;
use huddle_relay::{HostedAgent, Relay, RelayOptions};
use huddle_store::StoreOptions;
use tokio_util::sync::CancellationToken;

/// The hosted agents a configuration describes, their drivers started (an ACP agent's
/// process is started and initialised here, so a bad command fails the relay's start).
pub async fn hosted_agents(cfg: &RelayConfig) -> anyhow::Result<Vec<HostedAgent>> {
    let mcp = mcp_launch(cfg)?;
    let mut agents = Vec::new();
    for a in &cfg.agents {
        let driver = a
            .start_driver(mcp.as_ref())
            .await
            .map_err(anyhow::Error::msg)?;
        // An exec agent's program is looked up now, not at its first turn.
        let what = match a.driver {
            DriverKind::Exec => driver.check().await.map_err(|e| {
                anyhow::anyhow!(
                    "agent {:?}: {e} (on PATH, or as a path relative to the configuration file)",
                    a.key
                )
            })?,
            kind => kind.name().to_string(),
        };
        tracing::info!(agent = %a.key, capabilities = ?a.capabilities, "hosting agent: {what}");
        agents.push(HostedAgent {
            local: LocalAgent::new(a.key.clone())
                .with_capabilities(a.capabilities.clone())
                .with_priority(
                    a.priority
                        .unwrap_or(huddle_core::protocol::DEFAULT_PRIORITY),
                ),
            name: a.name.clone().unwrap_or_else(|| a.key.clone()),
            driver,
        });
    }
    Ok(agents)
}

/// How hosted agents start huddle's MCP server: this very program, on the relay's
/// database, writing as the relay (its id and, when it signs, its key). `None`
/// (agents are not offered it) when the program's path is unknown.
fn mcp_launch(cfg: &RelayConfig) -> anyhow::Result<Option<McpLaunch>> {
    let key = match cfg.sign {
        true => Some(relay_key_path(cfg)?),
        false => None,
    };
    Ok(match std::env::current_exe() {
        Ok(program) => Some(McpLaunch {
            program,
            database: cfg.database.clone(),
            capabilities: Vec::new(),
            writer: Some(cfg.relay.clone()),
            key,
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot find this program's path; agents are not offered huddle's MCP tools");
            None
        }
    })
}

/// The relay's key file when it signs: its `key`, else `HUDDLE_RELAY_KEY`, else
/// `relays/<relay>.key` in the keys directory.
fn relay_key_path(cfg: &RelayConfig) -> anyhow::Result<std::path::PathBuf> {
    crate::keys::writer_key_path(&cfg.relay, cfg.key.as_deref().map(Path::new))
}

/// The relay's signing key when `sign = true`: read, or created (mode 0600) when
/// absent.
fn relay_signer(cfg: &RelayConfig) -> anyhow::Result<Option<huddle_core::keys::WriterSecret>> {
    if !cfg.sign {
        return Ok(None);
    }
    let path = relay_key_path(cfg)?;
    let (secret, created) = crate::keys::load_or_create(&path)?;
    if created {
        tracing::info!(path = %path.display(), "created the relay's signing key");
    }
    Ok(Some(secret))
}

/// `huddle relay --check`: starts every configured agent's driver, asks it whether it
/// can run turns, prints one line per agent and fails if any cannot.
pub async fn check(config: &Path) -> anyhow::Result<()> {
    ignore_sigpipe();
    let cfg = RelayConfig::load(config)?;
    let mcp = mcp_launch(&cfg)?;
    let mut failed = 0;
    for a in &cfg.agents {
        let result = match a.start_driver(mcp.as_ref()).await {
            Ok(driver) => driver.check().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(what) => println!("ok    {}: {what}", a.key),
            Err(e) => {
                failed += 1;
                println!("FAIL  {}: {e}", a.key);
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} agents cannot run", cfg.agents.len());
    }
    Ok(())
}

/// Runs a relay from a configuration file until Ctrl-C or SIGTERM; prints its
/// summary (JSON) on exit. With `metrics`, serves the relay's metrics there while it
/// runs (and prints their URL first).
pub async fn run(
    config: &Path,
    db_override: Option<String>,
    poll_ms: u64,
    metrics: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    ignore_sigpipe();
    let mut cfg = RelayConfig::load(config)?;
    if let Some(db) = db_override {
        cfg.database = db;
    }
    crate::ledger_cmds::require_database(&cfg.database)?;
    let mut options = StoreOptions {
        relay: cfg.relay.clone(),
        poll_interval: std::time::Duration::from_millis(poll_ms.max(1)),
        signer: relay_signer(&cfg)?,
        ..Default::default()
    };
    if let Some(pool) = cfg.pool {
        options.pool_size = pool;
    }
    // A relay started while its database is away (restarting, failing over) waits for
    // it; a bad URL or schema fails at once.
    let mut delay = std::time::Duration::from_millis(100);
    let store = loop {
        match huddle_store::open(&cfg.database, options.clone()).await {
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "database unavailable; waiting for it");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            other => {
                break other
                    .with_context(|| format!("cannot open the database {:?}", cfg.database))?
            }
        }
    };
    check_rooms(&*store, &cfg).await?;
    if let Some(key) = store.signer() {
        let writer = store.writer().unwrap_or_else(|| cfg.relay.clone());
        tracing::info!(
            writer = %writer,
            "signing every row with key {key}; the room owner registers it with \
             `!config relay-keys {writer}={key}`"
        );
    }
    // Bound before agents start, so a taken port fails the start cleanly.
    let metrics_server = match metrics {
        Some(addr) => Some(crate::relay_metrics::MetricsServer::bind(addr).await?),
        None => None,
    };
    let agents = hosted_agents(&cfg).await?;
    let batches_in_flight = cfg
        .batches_in_flight
        .unwrap_or_else(|| huddle_relay::runtime::default_batches_in_flight(&cfg.database));
    let signals = stop_signals();
    tracing::info!(
        relay = %cfg.relay,
        agents = agents.len(),
        rooms = ?cfg.rooms,
        batches_in_flight,
        "relay starting"
    );
    let relay = Relay::new(
        store,
        cfg.relay.clone(),
        cfg.rooms.clone(),
        agents,
        RelayOptions {
            snapshot: cfg.snapshot_path(),
            snapshot_every_rows: cfg
                .snapshot_every_rows
                .unwrap_or(huddle_relay::snapshot::DEFAULT_EVERY_ROWS),
            snapshot_min_interval: cfg
                .snapshot_min_interval_ms
                .map(std::time::Duration::from_millis)
                .unwrap_or(RelayOptions::default().snapshot_min_interval),
            batch_hold: cfg
                .batch_hold_ms
                .map(std::time::Duration::from_millis)
                .unwrap_or(huddle_relay::runtime::DEFAULT_BATCH_HOLD),
            batches_in_flight,
            ..RelayOptions::default()
        },
    );
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        signals.await;
        stop.cancel();
    });
    // The metrics server outlives the relay's shutdown grace, so the last counts can
    // be scraped until the relay exits.
    let metrics_stop = CancellationToken::new();
    let _stop_metrics = metrics_stop.clone().drop_guard();
    if let Some(server) = metrics_server {
        tokio::spawn(server.serve(relay.metrics(), metrics_stop));
    }
    let summary = relay.run(shutdown).await?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

/// Fails, naming every missing room and the command that creates it, unless all of
/// the relay's rooms exist (and naming an archived one, which can never be served);
/// logs one line per room.
async fn check_rooms(store: &dyn huddle_store::Store, cfg: &RelayConfig) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for room in &cfg.rooms {
        match crate::ledger_cmds::room_owner(store, room).await? {
            Some(owner) => tracing::info!(room = %room, owner = %owner, "joining room"),
            None => {
                if let Some(row) = crate::archive_cmds::archived(store, room).await? {
                    return Err(huddle_relay::RelayError::RoomArchived {
                        room: room.clone(),
                        owner: row.actor.clone(),
                        rows: row.body.get("rows").and_then(|r| r.as_u64()).unwrap_or(0),
                    }
                    .into());
                }
                missing.push(room.as_str());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let create: Vec<String> = missing
        .iter()
        .map(|r| format!("`huddle room create {r} --owner ID`"))
        .collect();
    anyhow::bail!(
        "{} not exist in {:?}; create {} with {}, or fix `rooms` in the configuration",
        match missing.as_slice() {
            [one] => format!("room {one:?} does"),
            many => format!(
                "rooms {} do",
                many.iter()
                    .map(|r| format!("{r:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        cfg.database,
        if missing.len() == 1 { "it" } else { "them" },
        create.join(" and ")
    )
}

/// `main` gives SIGPIPE its default action for the output commands; a relay writes
/// prompts into agents' pipes, and an agent that exits without reading its prompt
/// must fail its turn, not end the relay.
fn ignore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to "ignore" has no handler to race with.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// The signals that stop the relay (SIGTERM, SIGINT), registered when this is called:
/// before the start line, so a signal sent as soon as the relay says it is starting
/// stops it cleanly instead of killing it with the default disposition. The future
/// ends at the first of them.
fn stop_signals() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            match (term, int) {
                (Some(mut term), Some(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Some(mut one), None) | (None, Some(mut one)) => {
                    one.recv().await;
                }
                (None, None) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
