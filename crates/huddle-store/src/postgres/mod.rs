//! The Postgres backend: many relays on many machines share one database.
//!
//! - **Appends** are one `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`
//!   per batch (a prepared, cached statement), so identical content or a repeated
//!   idempotency key is a no-op that reports the existing id.
//! - **Reading forward** uses the gap-free cursor `(txid, seq)`: only rows of
//!   transactions older than `pg_snapshot_xmin(pg_current_snapshot())` are read, so a
//!   transaction that took a lower sequence number but commits later is read on a
//!   later pass instead of being skipped. Every row is decoded defensively and
//!   verified; corrupt or foreign rows are skipped, counted and logged.
//! - **The doorbell**: after a commit the store rings its own bell and asks a
//!   background task to `NOTIFY` on its own connection (`synchronous_commit = off`,
//!   coalesced). One dedicated LISTEN connection per store rings the bell for other
//!   stores' appends and re-LISTENs after a drop.
//! - **Claims** are single statements judged by the database clock; a fenced append
//!   locks the claim row `FOR SHARE` in the append's transaction. They go through
//!   the SECURITY DEFINER functions of migration 0003, which act for the calling
//!   role only (a claim records the role that acquired it), so a relay role needs no
//!   UPDATE on `external_claim`.
//! - **Trust** (migration 0003): every row's `relay` is the writing role, and the
//!   insert trigger refuses task and reply rows whose claim is not live, held by the
//!   row's actor at its epoch and acquired by the writing role. The roles themselves
//!   are made by [`admin`].
//!
//! Pooled sessions carry `application_name` and `idle_in_transaction_session_timeout`,
//! so one stuck session cannot hold back every reader's cursor for long.

pub mod admin;
mod doorbell;
pub(crate) mod errors;
pub(crate) mod migrate;
mod resources;
mod sql;
#[cfg(feature = "testing")]
mod test_backend;

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use huddle_core::{
    Interaction, InteractionId, Limits, NewInteraction, Position, RawRow, Timestamp,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, Row, Statement};

use crate::traits::{
    Acquired, Appended, ArchiveOutcome, ArchiveRefusal, ArchiveRequest, ClaimRequest, ClaimRow,
    ClaimState, Claims, Doorbell, Epoch, Fence, Ledger, PrunedClaims, ReadBatch, SkippedRow, Store,
};
use crate::{Result, StoreError, StoreOptions};
use errors::{map_pg, map_pool};

#[cfg(feature = "testing")]
pub use test_backend::{PgHeldAppend, PgTestBackend};

/// Postgres-only settings. [`PgOptions::default`] suits production.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// `application_name` of pooled sessions (the LISTEN session is always
    /// `huddle-listen`, the NOTIFY session `huddle-notify`).
    pub application_name: String,
    /// `idle_in_transaction_session_timeout` of every session the store opens: a
    /// session that stalls inside a transaction is cut after this long, so it cannot
    /// hold back every reader's cursor (default 30 s).
    pub idle_in_transaction_timeout: Duration,
    /// How long to wait for a new connection (default 10 s).
    pub connect_timeout: Duration,
    /// How long an operation waits for a free pooled connection (default 30 s).
    pub pool_wait_timeout: Duration,
    /// First delay before the LISTEN connection reconnects (default 100 ms); doubles
    /// up to [`PgOptions::listen_backoff_max`].
    pub listen_backoff_min: Duration,
    /// Longest delay between LISTEN reconnect attempts (default 2 s).
    pub listen_backoff_max: Duration,
    /// Whether the store LISTENs (default true). Without it no other store's append
    /// rings its doorbell: its subscriptions read forward every
    /// [`StoreOptions::poll_interval`] only, and the server sends it no notifications.
    /// For a reader that need not hear of appends at once (`huddle bench tasks`'
    /// observer), so that it adds no listener to the ones it measures. Its own appends
    /// still NOTIFY the others.
    pub listen: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            application_name: "huddle".into(),
            idle_in_transaction_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            pool_wait_timeout: Duration::from_secs(30),
            listen_backoff_min: Duration::from_millis(100),
            listen_backoff_max: Duration::from_secs(2),
            listen: true,
        }
    }
}

/// `application_name` of the dedicated LISTEN session (tests find it by this name).
pub const LISTEN_APPLICATION_NAME: &str = "huddle-listen";
/// `application_name` of the dedicated NOTIFY session.
pub const NOTIFY_APPLICATION_NAME: &str = "huddle-notify";

/// The Postgres store: a connection pool for appends, reads and claims, plus one
/// LISTEN and one NOTIFY connection of its own. Background tasks stop when the store
/// is dropped.
pub struct PgStore {
    pool: Pool,
    options: StoreOptions,
    session: Config,
    bell: Arc<watch::Sender<u64>>,
    notifier: Arc<doorbell::Notifier>,
    connect_timeout: Duration,
    recheck: Arc<doorbell::Recheck>,
    listening: watch::Receiver<bool>,
    skipped: AtomicU64,
    tasks: Vec<JoinHandle<()>>,
    /// The role this store writes as (`session_user`), asked once at connect when it
    /// signs: the writer its row signatures name.
    signing_as: Option<String>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("relay", &self.options.relay)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/db`), applies pending
    /// migrations under an advisory lock and starts the doorbell tasks, with
    /// [`PgOptions::default`]. Must be called inside a Tokio runtime.
    pub async fn connect(url: &str, options: StoreOptions) -> Result<Self> {
        Self::connect_with(url, options, PgOptions::default()).await
    }

    /// [`PgStore::connect`] with Postgres-only settings.
    pub async fn connect_with(url: &str, options: StoreOptions, pg: PgOptions) -> Result<Self> {
        let base: Config = url
            .parse()
            .map_err(|e| StoreError::Config(format!("bad Postgres URL: {e}")))?;
        let session = session_config(&base, &pg, &pg.application_name, &[]);
        migrate::migrate(&session).await?;
        let signing_as = match options.signer {
            Some(_) => Some(session_user(&session).await?),
            None => None,
        };

        let manager = Manager::from_config(
            session.clone(),
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(pg.pool_wait_timeout))
            .create_timeout(Some(pg.connect_timeout))
            .recycle_timeout(Some(pg.connect_timeout))
            .build()
            .map_err(|e| StoreError::Config(format!("connection pool: {e}")))?;

        let (bell, _) = watch::channel(0u64);
        let bell = Arc::new(bell);
        let notifier = doorbell::Notifier::new();
        let own = instance_token();
        let mut listen_cfg = session_config(&base, &pg, LISTEN_APPLICATION_NAME, &[]);
        // A silently dead peer (cable pulled) is noticed by keepalives, not by us.
        listen_cfg
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(15))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        let notify_cfg = session_config(
            &base,
            &pg,
            NOTIFY_APPLICATION_NAME,
            &["synchronous_commit=off"],
        );
        let (listening_tx, listening) = watch::channel(false);
        let mut tasks = Vec::with_capacity(2);
        if pg.listen {
            tasks.push(tokio::spawn(doorbell::listen_loop(
                listen_cfg,
                bell.clone(),
                listening_tx,
                own.clone(),
                pg.listen_backoff_min,
                pg.listen_backoff_max,
            )));
        }
        tasks.push(tokio::spawn(doorbell::notify_loop(
            notify_cfg,
            notifier.clone(),
            own,
        )));
        // Rechecks back off to at most 1 s (or the poll, if shorter) during a long block.
        let recheck = doorbell::Recheck::new(
            Duration::from_millis(10),
            options.poll_interval.min(Duration::from_secs(1)),
        );
        Ok(PgStore {
            pool,
            options,
            session,
            bell,
            notifier,
            connect_timeout: pg.connect_timeout,
            recheck,
            listening,
            skipped: AtomicU64::new(0),
            tasks,
            signing_as,
        })
    }

    /// How many rows this store's reads refused as corrupt or foreign (each sighting
    /// counts).
    pub fn skipped_total(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Waits until the NOTIFY for every append made so far on this store has been
    /// sent (or has failed), at most about twice the connect timeout. Appends never
    /// wait for their NOTIFY; a process that appends and exits at once (a one-shot
    /// command) calls this first so other relays wake now rather than at their
    /// fallback poll.
    pub async fn flush_doorbell(&self) {
        self.notifier.flush(self.connect_timeout * 2).await;
    }

    /// Waits (at most `timeout`) until this store's LISTEN connection is up, so that
    /// whatever other stores or processes commit from then on rings its doorbell;
    /// returns whether it is. Subscriptions need not wait (the first LISTEN rings the
    /// bell and they read forward); this is for a caller that must know the doorbell
    /// is live, such as a test that proves a wake-up came from another process.
    /// Always false for a store that does not listen ([`PgOptions::listen`]).
    pub async fn wait_listening(&self, timeout: Duration) -> bool {
        let mut listening = self.listening.clone();
        let up = tokio::time::timeout(timeout, listening.wait_for(|up| *up))
            .await
            .is_ok_and(|r| r.is_ok());
        up
    }

    /// The configuration pooled sessions connect with (application name,
    /// `idle_in_transaction_session_timeout`, connect timeout).
    pub fn session_config(&self) -> &Config {
        &self.session
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(map_pool)
    }

    /// Checks the batch and every item; returns each item's id and canonical body
    /// text (each body encoded once).
    fn validate<N: Borrow<NewInteraction>>(
        &self,
        batch: &[N],
    ) -> Result<(Vec<InteractionId>, Vec<String>)> {
        crate::checked_batch(&self.options.limits, batch)
    }

    /// The `sig` column of each row with these ids: signed as this store's role when
    /// it signs.
    fn signatures(&self, ids: &[InteractionId]) -> Vec<Option<String>> {
        let writer = self.signing_as.as_deref().unwrap_or_default();
        ids.iter()
            .map(|id| crate::row_signature(self.options.signer.as_ref(), writer, id))
            .collect()
    }

    /// Rings the local bell and asks for one (coalesced) NOTIFY.
    fn appended(&self, out: &[Appended]) {
        if out.iter().any(|a| a.inserted) {
            doorbell::ring(&self.bell);
            self.notifier.request();
        }
    }

    /// Reads forward, over all rooms or some (then on the room index; `next` is past
    /// the last row of those rooms returned).
    /// `unpack`: a lot's items in its place (every reader), or the lot itself
    /// ([`Ledger::read_room_rows`]).
    async fn read(
        &self,
        scope: Scope<'_>,
        after: Position,
        limit: usize,
        unpack: bool,
    ) -> Result<ReadBatch> {
        if limit == 0 || matches!(scope, Scope::Rooms(rooms) if rooms.is_empty()) {
            return Ok(ReadBatch {
                next: after,
                ..ReadBatch::default()
            });
        }
        let (read_sql, held_sql) = match scope {
            Scope::All => (sql::READ_FORWARD, sql::HELD_BACK),
            Scope::Room(_) => (sql::READ_ROOM, sql::HELD_BACK_ROOM),
            Scope::Rooms(_) => (sql::READ_ROOMS, sql::HELD_BACK_ROOMS),
        };
        let client = self.client().await?;
        let read = client.prepare_cached(read_sql).await.map_err(map_pg)?;
        let txid = after.major.to_string();
        // Positions come from this ledger, so minor fits; clamp a hand-made one.
        let seq = i64::try_from(after.minor).unwrap_or(i64::MAX);
        let asked = limit.min(100_000);
        let limit = i64::try_from(asked).unwrap_or(100_000);
        let room_param: Option<&str> = match scope {
            Scope::Room(room) => Some(room),
            _ => None,
        };
        let rooms_param: Vec<&str> = match scope {
            Scope::Rooms(rooms) => rooms.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        let mut read_params: Vec<&(dyn ToSql + Sync)> = vec![&txid, &seq, &limit];
        match scope {
            Scope::All => {}
            Scope::Room(_) => read_params.push(&room_param),
            Scope::Rooms(_) => read_params.push(&rooms_param),
        }
        let rows = client.query(&read, &read_params).await.map_err(map_pg)?;
        let mut next = after;
        if let Some(last) = rows.last() {
            next = decode_row(last)?.0;
        }
        // A short read may have stopped at the horizon: if committed rows lie past the
        // cursor now, ring again shortly (see `sql::HELD_BACK`). A full read needs no
        // check: its reader reads again at once.
        let held_back = if rows.len() < asked {
            let held = client.prepare_cached(held_sql).await.map_err(map_pg)?;
            let next_txid = next.major.to_string();
            let next_seq = i64::try_from(next.minor).unwrap_or(i64::MAX);
            let mut held_params: Vec<&(dyn ToSql + Sync)> = vec![&next_txid, &next_seq];
            match scope {
                Scope::All => {}
                Scope::Room(_) => held_params.push(&room_param),
                Scope::Rooms(_) => held_params.push(&rooms_param),
            }
            let row = client
                .query_one(&held, &held_params)
                .await
                .map_err(map_pg)?;
            row.try_get::<_, bool>(0).map_err(map_pg)?
        } else {
            false
        };
        drop(client);
        self.recheck.after_read(held_back, &self.bell);
        let (rows, skipped) = self.decode_rows(rows, unpack)?;
        Ok(ReadBatch {
            rows,
            skipped,
            next,
            held_back,
        })
    }

    fn decode_rows(
        &self,
        rows: Vec<Row>,
        unpack: bool,
    ) -> Result<(Vec<Interaction>, Vec<SkippedRow>)> {
        let mut good = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        for row in rows {
            let (position, raw) = decode_row(&row)?;
            match raw.and_then(|r| crate::traits::read_row(r, unpack, &mut good)) {
                Ok(()) => {}
                Err(reason) => {
                    tracing::warn!(%position, %reason, "skipping a corrupt or foreign ledger row");
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    skipped.push(SkippedRow { position, reason });
                }
            }
        }
        Ok((good, skipped))
    }
}

/// Which rows a read-forward covers.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Every room.
    All,
    /// One room.
    Room(&'a str),
    /// Several rooms, without repeats.
    Rooms(&'a [String]),
}

/// The role a session with `config` logs in as (`session_user`).
async fn session_user(config: &Config) -> Result<String> {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(map_pg)?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let row = client
        .query_one("SELECT session_user::text", &[])
        .await
        .map_err(map_pg);
    drop(client);
    let _ = driver.await;
    row?.try_get(0).map_err(map_pg)
}

/// `plan_cache_mode` of every session the store opens, unless the URL sets its own.
///
/// Every statement huddle sends is prepared once per session and run many times, and
/// under the default (`auto`) Postgres plans it anew at every execution whenever its
/// plan for the actual values looks cheaper than the generic one — which, for the
/// statements that take arrays (`unnest($n)` is estimated at 100 rows without its
/// value) and the PL/pgSQL expressions that fold a known NULL away, is always. The
/// multi-room read spent twice as long planning as running, and planning was a fifth
/// of the server's CPU while handing out tasks (plan 0065). Every statement's
/// generic plan uses the same indexes as its custom ones: keys and cursors are
/// equalities and ranges on btree columns, and no partial index depends on a value.
const PLAN_CACHE_MODE: &str = "force_generic_plan";

/// The pool's per-session settings on top of the URL's.
fn session_config(base: &Config, pg: &PgOptions, app: &str, extra: &[&str]) -> Config {
    let mut cfg = base.clone();
    cfg.application_name(app);
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(pg.connect_timeout);
    }
    // Generic plans first, so a URL's own `-c plan_cache_mode=...` still wins.
    let mut opts = format!(
        "-c plan_cache_mode={PLAN_CACHE_MODE} {}",
        cfg.get_options().unwrap_or_default()
    );
    let idle_ms = pg
        .idle_in_transaction_timeout
        .as_millis()
        .clamp(1, i32::MAX as u128);
    opts.push_str(&format!(
        " -c idle_in_transaction_session_timeout={idle_ms}"
    ));
    for e in extra {
        opts.push_str(" -c ");
        opts.push_str(e);
    }
    cfg.options(opts.trim());
    cfg
}

/// A token identifying this store's own NOTIFYs, so its listener ignores them (the
/// local bell already rang).
fn instance_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{:x}-{:x}-{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn micros(d: Duration) -> i64 {
    // Ten years is long enough for any lease and keeps `now() + ttl` in range.
    const MAX: u128 = 10 * 365 * 24 * 3600 * 1_000_000;
    d.as_micros().min(MAX) as i64
}

/// Decodes one row. The position must decode (it is how the cursor moves past the
/// row); any other column that does not decode makes the row a skipped one.
fn decode_row(row: &Row) -> Result<(Position, std::result::Result<RawRow, String>)> {
    let txid: String = row.try_get(0).map_err(map_pg)?;
    let seq: i64 = row.try_get(1).map_err(map_pg)?;
    let major = txid
        .parse::<u64>()
        .map_err(|e| StoreError::Backend(format!("unreadable txid {txid:?}: {e}")))?;
    let minor = u64::try_from(seq)
        .map_err(|_| StoreError::Backend(format!("negative sequence number {seq}")))?;
    let position = Position::new(major, minor);
    let raw = (|| {
        fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
            row: &'a Row,
            idx: usize,
            name: &str,
        ) -> std::result::Result<T, String> {
            row.try_get(idx)
                .map_err(|e| format!("column {name} unreadable: {e}"))
        }
        let caused_by: Vec<Option<Vec<u8>>> = col(row, 9, "caused_by")?;
        let caused_by = caused_by
            .into_iter()
            .map(|c| c.ok_or_else(|| "caused_by holds a NULL".to_string()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RawRow {
            id: col(row, 2, "id")?,
            position,
            room: col(row, 3, "room")?,
            thread: col(row, 4, "thread")?,
            verb: col(row, 5, "verb")?,
            actor: col(row, 6, "actor")?,
            role: col(row, 7, "role")?,
            parent: col(row, 8, "parent")?,
            caused_by,
            body: col(row, 10, "body")?,
            at: Timestamp(col(row, 11, "at")?),
            relay: col(row, 12, "relay")?,
            sig: col(row, 13, "sig")?,
        })
    })();
    Ok((position, raw))
}

/// What [`insert_batch`] runs on: a pooled connection or transaction (statements
/// prepared once per session and cached) or a plain test session.
#[async_trait]
trait Session: Sync {
    async fn statement(&self, sql: &str) -> std::result::Result<Statement, tokio_postgres::Error>;
    async fn rows(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error>;
}

#[async_trait]
impl Session for deadpool_postgres::Object {
    async fn statement(&self, sql: &str) -> std::result::Result<Statement, tokio_postgres::Error> {
        self.prepare_cached(sql).await
    }
    async fn rows(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.query(statement, params).await
    }
}

#[async_trait]
impl Session for deadpool_postgres::Transaction<'_> {
    async fn statement(&self, sql: &str) -> std::result::Result<Statement, tokio_postgres::Error> {
        self.prepare_cached(sql).await
    }
    async fn rows(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.query(statement, params).await
    }
}

#[cfg(feature = "testing")]
impl PgStore {
    /// On one pooled session: its `plan_cache_mode`, and for each statement it has
    /// prepared, the text and how many generic and custom plans it has made
    /// (`pg_prepared_statements`). Tests prove with it that statements are planned once.
    pub async fn session_plans(&self) -> Result<(String, Vec<(String, i64, i64)>)> {
        let client = self.client().await?;
        let mode: String = client
            .query_one("SHOW plan_cache_mode", &[])
            .await
            .map_err(map_pg)?
            .try_get(0)
            .map_err(map_pg)?;
        let rows = client
            .query(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
                &[],
            )
            .await
            .map_err(map_pg)?;
        let plans = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<std::result::Result<_, tokio_postgres::Error>>()
            .map_err(map_pg)?;
        Ok((mode, plans))
    }
}

/// A plain session outside the pool (the test backend's held append).
#[cfg(feature = "testing")]
#[async_trait]
impl Session for tokio_postgres::Client {
    async fn statement(&self, sql: &str) -> std::result::Result<Statement, tokio_postgres::Error> {
        self.prepare(sql).await
    }
    async fn rows(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        self.query(statement, params).await
    }
}

/// Inserts `batch` with one statement and resolves duplicates. `ids` are the batch's
/// content ids, in order.
/// Inserts a batch with no conflict handling ([`sql::APPEND_PLAIN`]).
async fn insert_plain(
    client: &deadpool_postgres::Object,
    batch: &[NewInteraction],
    ids: &[InteractionId],
    bodies: &[String],
    sigs: &[Option<String>],
) -> std::result::Result<(), tokio_postgres::Error> {
    if let ([n], [id], [body], [sig]) = (batch, ids, bodies, sigs) {
        let causes: Vec<&[u8]> = n.caused_by.iter().map(|c| &c.0[..]).collect();
        let parent = n.parent.as_ref().map(|p| &p.0[..]);
        let statement = client.prepare_cached(sql::APPEND_ONE).await?;
        client
            .execute(
                &statement,
                &[
                    &&id.0[..],
                    &n.room,
                    &n.thread,
                    &n.verb.as_str(),
                    &n.actor,
                    &n.role.as_str(),
                    &parent,
                    &causes,
                    &body.as_str(),
                    &n.idempotency_key,
                    sig,
                ],
            )
            .await?;
        return Ok(());
    }
    let columns = Columns::new(batch, ids, bodies, sigs);
    let statement = client.prepare_cached(sql::APPEND_PLAIN).await?;
    client.execute(&statement, &columns.params()).await?;
    Ok(())
}

/// The column arrays of a batch, as the append statements take them.
struct Columns<'a> {
    ids: Vec<&'a [u8]>,
    rooms: Vec<&'a str>,
    threads: Vec<Option<&'a str>>,
    verbs: Vec<&'a str>,
    actors: Vec<&'a str>,
    roles: Vec<&'a str>,
    parents: Vec<Option<&'a [u8]>>,
    causes: Vec<Vec<u8>>,
    bodies: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    sigs: &'a [Option<String>],
}

impl<'a> Columns<'a> {
    fn new<N: Borrow<NewInteraction>>(
        batch: &'a [N],
        ids: &'a [InteractionId],
        bodies: &'a [String],
        sigs: &'a [Option<String>],
    ) -> Self {
        let batch = batch.iter().map(Borrow::borrow);
        Columns {
            ids: ids.iter().map(|i| &i.0[..]).collect(),
            rooms: batch.clone().map(|n| n.room.as_str()).collect(),
            threads: batch.clone().map(|n| n.thread.as_deref()).collect(),
            verbs: batch.clone().map(|n| n.verb.as_str()).collect(),
            actors: batch.clone().map(|n| n.actor.as_str()).collect(),
            roles: batch.clone().map(|n| n.role.as_str()).collect(),
            parents: batch
                .clone()
                .map(|n| n.parent.as_ref().map(|p| &p.0[..]))
                .collect(),
            causes: batch
                .clone()
                .map(|n| n.caused_by.iter().flat_map(|c| c.0).collect())
                .collect(),
            bodies: bodies.iter().map(String::as_str).collect(),
            keys: batch
                .clone()
                .map(|n| n.idempotency_key.as_deref())
                .collect(),
            sigs,
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 11] {
        [
            &self.ids,
            &self.rooms,
            &self.threads,
            &self.verbs,
            &self.actors,
            &self.roles,
            &self.parents,
            &self.causes,
            &self.bodies,
            &self.keys,
            &self.sigs,
        ]
    }
}

async fn insert_batch<C: Session>(
    client: &C,
    batch: &[NewInteraction],
    ids: &[InteractionId],
    bodies: &[String],
    sigs: &[Option<String>],
) -> std::result::Result<Vec<Appended>, tokio_postgres::Error> {
    let columns = Columns::new(batch, ids, bodies, sigs);
    let params = columns.params();
    let statement = client.statement(sql::APPEND).await?;
    let rows = client.rows(&statement, &params).await?;
    resolve_inserted(client, batch, ids, rows).await
}

/// A batch acquire's parameters (`huddle_claim_acquire_batch`, and the first four and
/// the last of `huddle_handoff`): parallel arrays of keys, holders, leases (µs),
/// conditions (1-based index of the request that must have been won, 0 for none) and
/// drivers, one element per request.
struct RequestParams<'a> {
    keys: Vec<&'a str>,
    holders: Vec<&'a str>,
    ttls: Vec<i64>,
    after: Vec<i32>,
    drivers: Vec<Option<&'a str>>,
}

impl<'a> RequestParams<'a> {
    fn new(requests: &'a [ClaimRequest]) -> RequestParams<'a> {
        RequestParams {
            keys: requests.iter().map(|r| r.key.as_str()).collect(),
            holders: requests.iter().map(|r| r.holder.as_str()).collect(),
            ttls: requests.iter().map(|r| micros(r.ttl)).collect(),
            after: requests
                .iter()
                .map(|r| r.after.map_or(0, one_based))
                .collect(),
            drivers: requests.iter().map(|r| r.driver.as_deref()).collect(),
        }
    }

    /// Keys, holders, leases and conditions, in that order (the drivers go last).
    fn params(&self) -> [&(dyn ToSql + Sync); 4] {
        [&self.keys, &self.holders, &self.ttls, &self.after]
    }
}

/// A 0-based index as SQL's 1-based one. Indexes fit: a batch this long is not sent.
fn one_based(i: usize) -> i32 {
    i32::try_from(i + 1).unwrap_or(i32::MAX)
}

/// `huddle_append_under`'s first four parameters: the parallel key, holder and epoch
/// arrays of the fences, and the id of the row that closes them (if it does). The
/// rows' [`Columns`] follow them.
struct FenceParams<'a> {
    /// The fences in key order, as sent: every write locks the claims it is fenced by
    /// in the order batch acquires lock theirs, so two writers whose claims overlap
    /// cannot deadlock (one relay's write under claims it won beside another relay's
    /// acquisition of some of them did, in `bench tasks`).
    sorted: Vec<&'a Fence>,
    keys: Vec<&'a str>,
    holders: Vec<&'a str>,
    epochs: Vec<i64>,
    closing: Option<Vec<u8>>,
}

impl<'a> FenceParams<'a> {
    fn new(fences: &'a [Fence], closing: Option<InteractionId>) -> FenceParams<'a> {
        let mut sorted: Vec<&Fence> = fences.iter().collect();
        sorted.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        FenceParams {
            keys: sorted.iter().map(|f| f.key.as_str()).collect(),
            holders: sorted.iter().map(|f| f.holder.as_str()).collect(),
            epochs: sorted.iter().map(|f| f.epoch.get()).collect(),
            closing: closing.map(|id| id.0.to_vec()),
            sorted,
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 4] {
        [&self.keys, &self.holders, &self.epochs, &self.closing]
    }
}

/// The fence a [`sql::FENCE_REFUSED`] error names (its 1-based index into the fences
/// as sent is the error's detail), as [`StoreError::Fenced`].
fn fence_refused(e: tokio_postgres::Error, fences: &[&Fence]) -> StoreError {
    let index = e
        .as_db_error()
        .and_then(|d| d.detail())
        .and_then(|d| d.trim().parse::<usize>().ok())
        .and_then(|i| i.checked_sub(1))
        .filter(|i| *i < fences.len())
        .unwrap_or(0);
    match fences.get(index) {
        Some(fence) => StoreError::Fenced {
            key: fence.key.clone(),
            holder: fence.holder.clone(),
            epoch: fence.epoch,
        },
        None => map_pg(e),
    }
}

/// Each item's outcome from the `(id, idempotency_key)` rows an insert returned: an
/// item not among them was a duplicate, and a duplicate idempotency key answers the
/// id stored under that key (read with one more statement, only when there is one).
async fn resolve_inserted<C: Session>(
    client: &C,
    batch: &[NewInteraction],
    ids: &[InteractionId],
    rows: Vec<Row>,
) -> std::result::Result<Vec<Appended>, tokio_postgres::Error> {
    let mut inserted: HashSet<(Vec<u8>, Option<String>)> = HashSet::with_capacity(rows.len());
    for row in rows {
        inserted.insert((row.try_get(0)?, row.try_get(1)?));
    }
    let mut out = Vec::with_capacity(batch.len());
    let mut lookup: Vec<&str> = Vec::new();
    for (n, id) in batch.iter().zip(ids) {
        let pair = (id.0.to_vec(), n.idempotency_key.clone());
        let was_inserted = inserted.remove(&pair);
        if !was_inserted {
            if let Some(k) = &n.idempotency_key {
                lookup.push(k);
            }
        }
        out.push(Appended {
            id: *id,
            inserted: was_inserted,
        });
    }
    if !lookup.is_empty() {
        // A duplicate key returns the first row's id, whatever its content. A keyed
        // item that collided on content instead (its key is not stored) keeps its own
        // id, which is already in the ledger.
        let statement = client.statement(sql::IDS_BY_KEY).await?;
        let mut by_key: HashMap<String, InteractionId> = HashMap::new();
        for row in client.rows(&statement, &[&lookup]).await? {
            let key: String = row.try_get(0)?;
            let id: Vec<u8> = row.try_get(1)?;
            if let Ok(id) = InteractionId::from_slice(&id) {
                by_key.insert(key, id);
            }
        }
        for (a, n) in out.iter_mut().zip(batch) {
            if let (false, Some(k)) = (a.inserted, &n.idempotency_key) {
                if let Some(existing) = by_key.get(k) {
                    a.id = *existing;
                }
            }
        }
    }
    Ok(out)
}

fn claim_state(key: &str, row: &Row) -> Result<ClaimState> {
    Ok(ClaimState {
        key: key.to_string(),
        holder: row.try_get(0).map_err(map_pg)?,
        epoch: Epoch(row.try_get(1).map_err(map_pg)?),
        expires_at: Timestamp(row.try_get(2).map_err(map_pg)?),
    })
}

/// An acquire that did not win: held by someone else, or closed (column 4 is
/// `closed_by`).
fn lost_claim(key: &str, row: &Row) -> Result<Acquired> {
    let state = claim_state(key, row)?;
    let closed_by: Option<Vec<u8>> = row.try_get(4).map_err(map_pg)?;
    Ok(match closed_by {
        None => Acquired::HeldBy(state),
        Some(by) => Acquired::Closed {
            state,
            by: InteractionId::from_slice(&by).map_err(|e| {
                StoreError::Backend(format!("claim {key:?} has a bad closed_by: {e}"))
            })?,
        },
    })
}

/// The answers of a batch acquire from its rows (`huddle_claim_acquire_batch`'s
/// columns starting at `offset`): one per request tried; an error when a tried request
/// went unanswered.
fn batch_answers<'r>(
    requests: &[ClaimRequest],
    rows: impl Iterator<Item = &'r Row>,
    offset: usize,
) -> Result<Vec<Option<Acquired>>> {
    let mut out: Vec<Option<Acquired>> = vec![None; requests.len()];
    let mut answered = vec![false; requests.len()];
    for row in rows {
        let idx: i32 = row.try_get(offset).map_err(map_pg)?;
        let Some(i) = usize::try_from(idx).ok().and_then(|i| i.checked_sub(1)) else {
            return Err(StoreError::Backend(format!(
                "batch acquire answered for request {idx}"
            )));
        };
        let Some(r) = requests.get(i) else {
            return Err(StoreError::Backend(format!(
                "batch acquire answered for request {idx} of {}",
                requests.len()
            )));
        };
        answered[i] = true;
        let won: bool = row.try_get(offset + 4).map_err(map_pg)?;
        let state = ClaimState {
            key: r.key.clone(),
            holder: row.try_get(offset + 1).map_err(map_pg)?,
            epoch: Epoch(row.try_get(offset + 2).map_err(map_pg)?),
            expires_at: Timestamp(row.try_get(offset + 3).map_err(map_pg)?),
        };
        out[i] = Some(if won {
            Acquired::Won(state)
        } else {
            let closed_by: Option<Vec<u8>> = row.try_get(offset + 5).map_err(map_pg)?;
            match closed_by {
                None => Acquired::HeldBy(state),
                Some(by) => Acquired::Closed {
                    by: InteractionId::from_slice(&by).map_err(|e| {
                        StoreError::Backend(format!("claim {:?} has a bad closed_by: {e}", r.key))
                    })?,
                    state,
                },
            }
        });
    }
    // A request that was tried answers a row: one the batch left unanswered had
    // its condition unmet, or its row vanished (deleted by hand) mid-statement.
    for (i, r) in requests.iter().enumerate() {
        let tried = crate::traits::tried(r, &out);
        if tried && !answered[i] {
            return Err(StoreError::Backend(format!(
                "claim {:?} neither acquired nor found",
                r.key
            )));
        }
    }
    Ok(out)
}

#[async_trait]
impl Ledger for PgStore {
    fn limits(&self) -> &Limits {
        &self.options.limits
    }

    async fn flush(&self) {
        self.flush_doorbell().await;
    }

    async fn append(&self, batch: Vec<NewInteraction>) -> Result<Vec<Appended>> {
        let (ids, bodies) = self.validate(&batch)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let sigs = self.signatures(&ids);
        let client = self.client().await?;
        // One statement is its own transaction: the whole batch or nothing. Plain
        // insert first; a duplicate in the batch (rare) falls back to the statement
        // that skips duplicates and reports them.
        let out = match insert_plain(&client, &batch, &ids, &bodies, &sigs).await {
            Ok(()) => ids
                .iter()
                .map(|id| Appended {
                    id: *id,
                    inserted: true,
                })
                .collect(),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                insert_batch(&client, &batch, &ids, &bodies, &sigs)
                    .await
                    .map_err(map_pg)?
            }
            Err(e) => return Err(map_pg(e)),
        };
        drop(client);
        self.appended(&out);
        Ok(out)
    }

    async fn append_under(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Result<Vec<Appended>> {
        let (ids, bodies) = self.validate(&batch)?;
        let closing = crate::traits::closing_id(close, &batch)?;
        // One statement, so one round trip and one implicit transaction: the fences
        // are checked (and closed) and the rows inserted by `huddle_append_under`.
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::APPEND_UNDER)
            .await
            .map_err(map_pg)?;
        let fenced = FenceParams::new(fences, closing);
        let sigs = self.signatures(&ids);
        let columns = Columns::new(&batch, &ids, &bodies, &sigs);
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(15);
        params.extend(fenced.params());
        params.extend(columns.params());
        let rows = match client.query(&statement, &params).await {
            Ok(rows) => rows,
            Err(e) if e.code().map(|c| c.code()) == Some(sql::FENCE_REFUSED) => {
                return Err(fence_refused(e, &fenced.sorted));
            }
            Err(e) => return Err(map_pg(e)),
        };
        let out = resolve_inserted(&client, &batch, &ids, rows)
            .await
            .map_err(map_pg)?;
        drop(client);
        self.appended(&out);
        Ok(out)
    }

    async fn read_forward(&self, after: Position, limit: usize) -> Result<ReadBatch> {
        self.read(Scope::All, after, limit, true).await
    }

    async fn read_room(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        self.read(Scope::Room(room), after, limit, true).await
    }

    async fn read_room_rows(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        self.read(Scope::Room(room), after, limit, false).await
    }

    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> Result<ReadBatch> {
        let rooms = crate::traits::distinct_rooms(rooms);
        self.read(Scope::Rooms(&rooms), after, limit, true).await
    }

    async fn get(&self, id: InteractionId) -> Result<Option<Interaction>> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql::GET).await.map_err(map_pg)?;
        let rows = client
            .query(&statement, &[&&id.0[..]])
            .await
            .map_err(map_pg)?;
        drop(client);
        let (mut good, _) = self.decode_rows(rows, false)?;
        Ok(good.pop())
    }

    fn doorbell(&self) -> Doorbell {
        self.bell.subscribe()
    }

    async fn now(&self) -> Result<Timestamp> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql::NOW).await.map_err(map_pg)?;
        let row = client.query_one(&statement, &[]).await.map_err(map_pg)?;
        row.try_get(0).map(Timestamp).map_err(map_pg)
    }

    fn poll_interval(&self) -> Duration {
        self.options.poll_interval
    }
}

impl PgStore {
    /// A batch acquire in one statement (`huddle_claim_acquire_batch`), the drivers
    /// with it.
    async fn batch_acquire(&self, requests: &[ClaimRequest]) -> Result<Vec<Option<Acquired>>> {
        let request = RequestParams::new(requests);
        let mut params: Vec<&(dyn ToSql + Sync)> = request.params().to_vec();
        params.push(&request.drivers);
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::ACQUIRE_BATCH)
            .await
            .map_err(map_pg)?;
        let rows = client.query(&statement, &params).await.map_err(map_pg)?;
        drop(client);
        batch_answers(requests, rows.iter(), 0)
    }
}

#[async_trait]
impl Claims for PgStore {
    async fn acquire_request(&self, request: &ClaimRequest) -> Result<Acquired> {
        if request.driver.is_some() {
            // Taken for a driver: the batch statement carries it.
            let one = ClaimRequest {
                after: None,
                ..request.clone()
            };
            let mut answers = self.batch_acquire(std::slice::from_ref(&one)).await?;
            return match answers.pop().flatten() {
                Some(a) => Ok(a),
                None => Err(StoreError::Backend(format!(
                    "claim {:?} was not answered",
                    request.key
                ))),
            };
        }
        let (key, holder) = (request.key.as_str(), request.holder.as_str());
        let ttl = micros(request.ttl);
        let client = self.client().await?;
        let acquire = client
            .prepare_cached(sql::ACQUIRE_OR_HOLDER)
            .await
            .map_err(map_pg)?;
        // One round trip in the common case. No row back means the conflicting row was
        // committed after the statement's snapshot (or deleted by hand): ask again.
        for _ in 0..3 {
            if let Some(row) = client
                .query_opt(&acquire, &[&key, &holder, &ttl])
                .await
                .map_err(map_pg)?
            {
                let won: bool = row.try_get(3).map_err(map_pg)?;
                return if won {
                    Ok(Acquired::Won(claim_state(key, &row)?))
                } else {
                    lost_claim(key, &row)
                };
            }
            let current = client.prepare_cached(sql::CLAIM).await.map_err(map_pg)?;
            if let Some(row) = client.query_opt(&current, &[&key]).await.map_err(map_pg)? {
                return lost_claim(key, &row);
            }
        }
        Err(StoreError::Backend(format!(
            "claim {key:?} neither acquired nor found"
        )))
    }

    async fn acquire_batch(&self, requests: &[ClaimRequest]) -> Result<Vec<Option<Acquired>>> {
        crate::traits::check_claim_batch(requests)?;
        match requests {
            [] => return Ok(Vec::new()),
            [one] if one.driver.is_none() => {
                return Ok(vec![Some(
                    self.acquire(&one.key, &one.holder, one.ttl).await?,
                )])
            }
            _ => {}
        }
        self.batch_acquire(requests).await
    }

    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> Result<Option<ClaimState>> {
        let ttl = micros(ttl);
        let client = self.client().await?;
        let statement = client.prepare_cached(sql::RENEW).await.map_err(map_pg)?;
        client
            .query_opt(&statement, &[&key, &holder, &epoch.get(), &ttl])
            .await
            .map_err(map_pg)?
            .map(|row| claim_state(key, &row))
            .transpose()
    }

    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> Result<bool> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql::RELEASE).await.map_err(map_pg)?;
        let row = client
            .query_one(&statement, &[&key, &holder, &epoch.get()])
            .await
            .map_err(map_pg)?;
        Ok(row.try_get::<_, Option<bool>>(0).map_err(map_pg)? == Some(true))
    }

    async fn list_claims(&self, prefix: &str) -> Result<Vec<ClaimRow>> {
        let client = self.client().await?;
        let upper = crate::prefix_upper_bound(prefix);
        let statement = client
            .prepare_cached(match upper {
                Some(_) => sql::LIST_CLAIMS,
                None => sql::LIST_CLAIMS_UNBOUNDED,
            })
            .await
            .map_err(map_pg)?;
        let rows = match &upper {
            Some(upper) => client.query(&statement, &[&prefix, upper]).await,
            None => client.query(&statement, &[&prefix]).await,
        }
        .map_err(map_pg)?;
        rows.iter()
            .map(|row| {
                Ok(ClaimRow {
                    state: ClaimState {
                        key: row.try_get(0).map_err(map_pg)?,
                        holder: row.try_get(1).map_err(map_pg)?,
                        epoch: Epoch(row.try_get(2).map_err(map_pg)?),
                        expires_at: Timestamp(row.try_get(3).map_err(map_pg)?),
                    },
                    live: row.try_get(4).map_err(map_pg)?,
                    driver: row.try_get(5).map_err(map_pg)?,
                })
            })
            .collect()
    }

    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> Result<crate::ResourcesAcquired> {
        let wanted = crate::resources::checked_request(&self.options.limits, room, holder, wanted)?;
        resources::acquire(self, room, holder, &wanted, ttl).await
    }
}

impl PgStore {
    /// A hand-off (`huddle_handoff`), after `first` (`huddle_append_under`) in the
    /// same statement when given (plan 0082): one transaction, one commit; a fence of
    /// `first` that does not hold aborts the whole statement (`Err(Fenced)`).
    async fn handoff(
        &self,
        first: Option<crate::FencedWrite>,
        requests: &[ClaimRequest],
        appends: Vec<crate::ConditionalAppend>,
    ) -> Result<(Vec<Appended>, crate::Handoff)> {
        crate::traits::check_claim_batch(requests)?;
        crate::traits::check_appends(requests, &appends)?;
        let batch: Vec<&NewInteraction> = appends.iter().flat_map(|a| &a.rows).collect();
        let (ids, bodies) = self.validate(&batch)?;
        let sigs = self.signatures(&ids);
        let request = RequestParams::new(requests);
        let mut cond_group: Vec<i32> = Vec::new();
        let mut cond_idx: Vec<i32> = Vec::new();
        let mut cond_epoch: Vec<i64> = Vec::new();
        let mut row_group: Vec<i32> = Vec::with_capacity(batch.len());
        for (g, a) in appends.iter().enumerate() {
            for (i, e) in &a.when_won {
                cond_group.push(one_based(g));
                cond_idx.push(one_based(*i));
                cond_epoch.push(e.get());
            }
            row_group.extend(std::iter::repeat_n(one_based(g), a.rows.len()));
        }
        let columns = Columns::new(&batch, &ids, &bodies, &sigs);
        // `first`'s parameters, as `append_under` sends them.
        let first_rows: &[NewInteraction] = first.as_ref().map_or(&[], |f| f.rows.as_slice());
        let (first_ids, first_bodies) = self.validate(first_rows)?;
        let closing = match &first {
            Some(f) => crate::traits::closing_id(f.close, &f.rows)?,
            None => None,
        };
        let fences: &[Fence] = first.as_ref().map_or(&[], |f| f.fences.as_slice());
        let first_fenced = FenceParams::new(fences, closing);
        let first_sigs = self.signatures(&first_ids);
        let first_columns = Columns::new(first_rows, &first_ids, &first_bodies, &first_sigs);
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(35);
        if first.is_some() {
            params.extend(first_fenced.params());
            params.extend(first_columns.params());
        }
        params.extend(request.params());
        params.extend([
            &cond_group as &(dyn ToSql + Sync),
            &cond_idx,
            &cond_epoch,
            &row_group,
        ]);
        params.extend(columns.params());
        params.push(&request.drivers);
        let client = self.client().await?;
        let text = if first.is_some() {
            sql::APPEND_THEN_HANDOFF
        } else {
            sql::HANDOFF
        };
        let statement = client.prepare_cached(text).await.map_err(map_pg)?;
        let rows = match client.query(&statement, &params).await {
            Ok(rows) => rows,
            Err(e) if first.is_some() && e.code().map(|c| c.code()) == Some(sql::FENCE_REFUSED) => {
                return Err(fence_refused(e, &first_fenced.sorted));
            }
            Err(e) => return Err(map_pg(e)),
        };
        drop(client);
        let kind = |r: &Row| r.try_get::<_, i32>(0).unwrap_or(-1);
        let acquired = batch_answers(requests, rows.iter().filter(|r| kind(r) == 0), 1)?;
        let mut inserted: HashSet<Vec<u8>> = HashSet::new();
        for r in rows.iter().filter(|r| kind(r) == 1 || kind(r) == 2) {
            inserted.insert(r.try_get(7).map_err(map_pg)?);
        }
        let first_out: Vec<Appended> = first_ids
            .iter()
            .map(|id| Appended {
                id: *id,
                inserted: inserted.contains(&id.0[..]),
            })
            .collect();
        let mut appended = Vec::with_capacity(appends.len());
        let mut next = 0usize;
        let mut all = first_out.clone();
        for a in &appends {
            let these = &ids[next..next + a.rows.len()];
            next += a.rows.len();
            if crate::traits::conditions_hold(a, requests, &acquired).is_none() {
                appended.push(None);
                continue;
            }
            let out: Vec<Appended> = these
                .iter()
                .map(|id| Appended {
                    id: *id,
                    inserted: inserted.contains(&id.0[..]),
                })
                .collect();
            all.extend(out.iter().copied());
            appended.push(Some(out));
        }
        self.appended(&all);
        Ok((first_out, crate::Handoff { acquired, appended }))
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    async fn archive_room(&self, request: ArchiveRequest) -> Result<ArchiveOutcome> {
        let room = request.archived.room.clone();
        let refused = |reason| StoreError::ArchiveRefused {
            room: room.clone(),
            reason,
        };
        request.check().map_err(refused)?;
        let (ids, bodies) = self.validate(std::slice::from_ref(&request.archived))?;
        let (id, body) = (ids[0], &bodies[0]);
        let sig = self.signatures(&ids).pop().flatten();
        let rows = i64::try_from(request.rows).map_err(|_| {
            refused(ArchiveRefusal::BadRow(format!(
                "{} rows is more than a ledger holds",
                request.rows
            )))
        })?;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::ARCHIVE_ROOM)
            .await
            .map_err(map_pg)?;
        let answer = client
            .query_one(
                &statement,
                &[
                    &room,
                    &rows,
                    &&id.0[..],
                    &request.archived.actor,
                    body,
                    &sig,
                ],
            )
            .await;
        drop(client);
        let row = match answer {
            Ok(row) => row,
            Err(e) => {
                let reason = e.as_db_error().and_then(|d| {
                    let detail = d.detail().unwrap_or_default();
                    match d.code().code() {
                        "HUA01" => Some(ArchiveRefusal::Changed {
                            exported: request.rows,
                            now: detail.trim().parse().unwrap_or(0),
                        }),
                        "HUA02" => Some(ArchiveRefusal::LiveClaims(
                            detail.split_whitespace().map(str::to_string).collect(),
                        )),
                        "HUA03" => Some(ArchiveRefusal::NotAllowed(
                            d.message().trim_start_matches("huddle: ").to_string(),
                        )),
                        "HUA04" if d.message().contains("archived already") => {
                            Some(ArchiveRefusal::Archived)
                        }
                        "HUA04" => Some(ArchiveRefusal::NoRoom),
                        "HUA06" => Some(ArchiveRefusal::BadRow(
                            d.message().trim_start_matches("huddle: ").to_string(),
                        )),
                        _ => None,
                    }
                });
                return Err(match reason {
                    Some(reason) => refused(reason),
                    None => map_pg(e),
                });
            }
        };
        let rows_removed: i64 = row.try_get(0).map_err(map_pg)?;
        let claims_removed: i64 = row.try_get(1).map_err(map_pg)?;
        self.appended(&[Appended { id, inserted: true }]);
        Ok(ArchiveOutcome {
            id,
            rows_removed: u64::try_from(rows_removed).unwrap_or(0),
            claims_removed: u64::try_from(claims_removed).unwrap_or(0),
        })
    }

    async fn prune_claims(&self, older_than: Duration) -> Result<PrunedClaims> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::PRUNE_CLAIMS)
            .await
            .map_err(map_pg)?;
        let row = client
            .query_one(&statement, &[&micros(older_than)])
            .await
            .map_err(map_pg)?;
        let relay: i64 = row.try_get(0).map_err(map_pg)?;
        let archived: i64 = row.try_get(1).map_err(map_pg)?;
        Ok(PrunedClaims {
            relay_leases: u64::try_from(relay).unwrap_or(0),
            archived_rooms: u64::try_from(archived).unwrap_or(0),
        })
    }

    /// The URL's user: the session's role, which the database records as `relay`.
    fn writer(&self) -> Option<String> {
        self.signing_as
            .clone()
            .or_else(|| self.session.get_user().map(str::to_string))
    }

    fn signer(&self) -> Option<huddle_core::keys::WriterKey> {
        self.options.signer.as_ref().map(|s| s.public())
    }

    async fn acquire_and_append(
        &self,
        requests: &[ClaimRequest],
        appends: Vec<crate::ConditionalAppend>,
    ) -> Result<crate::Handoff> {
        Ok(self.handoff(None, requests, appends).await?.1)
    }

    async fn append_then_hand_off(
        &self,
        first: crate::FencedWrite,
        requests: &[ClaimRequest],
        appends: Vec<crate::ConditionalAppend>,
    ) -> Result<(Vec<Appended>, crate::Handoff)> {
        if first.rows.iter().any(|r| r.idempotency_key.is_some()) {
            // A keyed row's duplicate is resolved by a second statement: two calls.
            let written = self
                .append_under(&first.fences, first.close, first.rows)
                .await?;
            return Ok((written, self.acquire_and_append(requests, appends).await?));
        }
        self.handoff(Some(first), requests, appends).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every node of an `EXPLAIN (FORMAT JSON)` plan, depth first.
    fn plan_nodes(plan: &Value) -> Vec<&Value> {
        let mut out = vec![plan];
        if let Some(children) = plan["Plans"].as_array() {
            for child in children {
                out.extend(plan_nodes(child));
            }
        }
        out
    }

    /// A session on a fresh database where the planner avoids sequential and bitmap
    /// scans whenever an index can serve (a tiny table would otherwise be scanned).
    async fn planning_session() -> (huddle_testkit::TestDb, PgStore, deadpool_postgres::Object) {
        let db = huddle_testkit::test_database().await;
        let store = PgStore::connect(&db.url, StoreOptions::default())
            .await
            .expect("connect");
        let client = store.client().await.expect("client");
        client
            .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
            .await
            .expect("set");
        (db, store, client)
    }

    /// The JSON plan of `sql` prepared as `q_<name>` and executed with `params`.
    async fn explain(
        client: &tokio_postgres::Client,
        name: &str,
        sql: &str,
        params: &str,
    ) -> Value {
        client
            .batch_execute(&format!("PREPARE q_{name} AS {sql}"))
            .await
            .expect("prepare");
        // The simple protocol returns the json column as text.
        let messages = client
            .simple_query(&format!("EXPLAIN (FORMAT JSON) EXECUTE q_{name}{params}"))
            .await
            .expect("explain");
        let text = messages
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
                _ => None,
            })
            .expect("a plan row");
        serde_json::from_str(text).expect("plan JSON")
    }

    /// The read statements must stay index range scans on `(txid, seq)` however
    /// large the ledger grows: the horizon is computed once (an InitPlan), not per row.
    ///
    /// The plan is read as JSON, by node type, relation, index and parent
    /// relationship, which every supported Postgres major version reports alike (the
    /// text form names an InitPlan's output `$0` before version 17 and
    /// `(InitPlan 1).col1` from it on).
    #[tokio::test]
    async fn reads_use_the_cursor_index() {
        let (_db, _store, client) = planning_session().await;
        for (name, sql, params) in [
            ("read_forward", sql::READ_FORWARD, "('0', 0, 100)"),
            ("held_back", sql::HELD_BACK, "('0', 0)"),
            ("read_room", sql::READ_ROOM, "('0', 0, 100, 'lobby')"),
            ("held_back_room", sql::HELD_BACK_ROOM, "('0', 0, 'lobby')"),
            (
                "read_rooms",
                sql::READ_ROOMS,
                "('0', 0, 100, '{lobby,hall}')",
            ),
            (
                "held_back_rooms",
                sql::HELD_BACK_ROOMS,
                "('0', 0, '{lobby,hall}')",
            ),
        ] {
            let explained = explain(&client, name, sql, params).await;
            let nodes = plan_nodes(&explained[0]["Plan"]);
            let shown = serde_json::to_string_pretty(&explained).unwrap_or_default();
            let index = if name.contains("room") {
                "interaction_room"
            } else {
                "interaction_cursor"
            };
            let scans: Vec<&Value> = nodes
                .iter()
                .copied()
                .filter(|n| n["Relation Name"] == "interaction")
                .collect();
            assert!(
                !scans.is_empty()
                    && scans.iter().all(|n| {
                        matches!(
                            n["Node Type"].as_str(),
                            Some("Index Scan" | "Index Only Scan")
                        ) && n["Index Name"] == index
                    }),
                "{name} does not read interaction through {index} alone:\n{shown}"
            );
            // The multi-room read merges its rooms' ranges with one sort of at most
            // rooms × limit rows, above the per-room scans: every scan itself comes in
            // index order.
            let sorts: Vec<&Value> = nodes
                .iter()
                .copied()
                .filter(|n| n["Node Type"].as_str().is_some_and(|t| t.contains("Sort")))
                .collect();
            if name == "read_rooms" {
                let root = &explained[0]["Plan"];
                assert!(
                    sorts.len() == 1
                        && root["Node Type"] == "Limit"
                        && root["Plans"][0]["Node Type"] == "Sort",
                    "{name}: one merge of the rooms' ranges, at the top, each range read in \
                     index order:\n{shown}"
                );
            } else {
                assert!(
                    sorts.is_empty(),
                    "{name}: rows must come in index order, not sorted (by text!):\n{shown}"
                );
            }
            if name.starts_with("read") {
                assert!(
                    scans.iter().any(|n| n["Index Cond"]
                        .as_str()
                        .is_some_and(|c| c.contains("txid <"))),
                    "{name}: the horizon must bound the index scan:\n{shown}"
                );
                assert!(
                    nodes.iter().any(|n| n["Parent Relationship"] == "InitPlan"),
                    "{name}: the horizon should be computed once per statement:\n{shown}"
                );
            }
        }
    }

    /// Listing the claims under a prefix (a relay lists one key each time it loses a
    /// claim) is a range of the primary key's index, not a read of every claim ever
    /// taken, in a generic plan as in a custom one.
    #[tokio::test]
    async fn claim_listing_is_a_range_of_the_key_index() {
        let (_db, _store, client) = planning_session().await;
        for mode in ["force_custom_plan", "force_generic_plan"] {
            client
                .batch_execute(&format!("DEALLOCATE ALL; SET plan_cache_mode = {mode}"))
                .await
                .expect("set");
            let explained = explain(
                &client,
                "list_claims",
                sql::LIST_CLAIMS,
                "('task/r/t1', 'task/r/t2')",
            )
            .await;
            let nodes = plan_nodes(&explained[0]["Plan"]);
            let shown = serde_json::to_string_pretty(&explained).unwrap_or_default();
            assert!(
                nodes
                    .iter()
                    .all(|n| !n["Node Type"].as_str().is_some_and(|t| t.contains("Sort")))
                    && nodes.iter().any(|n| n["Relation Name"] == "external_claim"
                        && n["Index Name"] == "external_claim_pkey"
                        && n["Index Cond"]
                            .as_str()
                            .is_some_and(|c| c.contains("key >="))),
                "{mode}: listing a prefix must be a range of external_claim_pkey:\n{shown}"
            );
        }
    }
}
