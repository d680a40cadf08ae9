//! The store seams: [`Ledger`] and [`Claims`].

use std::time::Duration;

use async_trait::async_trait;
use huddle_core::{Interaction, InteractionId, Limits, NewInteraction, Position, Timestamp};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::Result;

/// A claim's fencing token: strictly increases every time the claim changes hands or
/// is re-taken after expiry (including by its former holder). The same type as
/// core's [`huddle_core::ClaimEpoch`], so an epoch passes from the store to the
/// synchronizer and back unconverted; stored as a `BIGINT`.
pub use huddle_core::ClaimEpoch as Epoch;

/// The outcome of appending one interaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    /// The id of the row now in the ledger. For a duplicate (same content or same
    /// idempotency key) this is the id of the row that was already there.
    pub id: InteractionId,
    /// Whether this call inserted the row (false for a duplicate).
    pub inserted: bool,
}

/// A row a reader could not accept: corrupt or foreign. Skipped, counted, logged; it
/// never blocks the cursor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedRow {
    /// Where it sits in the ledger.
    pub position: Position,
    /// Why it was refused.
    pub reason: String,
}

/// One read-forward step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadBatch {
    /// Verified interactions, in ledger order; a `task.lot` row's items in its place
    /// (each at the lot's position, plan 0080), unless read with
    /// [`Ledger::read_room_rows`].
    pub rows: Vec<Interaction>,
    /// Rows that failed verification, in ledger order.
    pub skipped: Vec<SkippedRow>,
    /// The cursor to read from next: past every row returned or skipped. Equal to the
    /// `after` given when nothing new was readable.
    pub next: Position,
    /// Committed rows of what was read lie past `next` (Postgres, after a short read):
    /// held back behind an older transaction still open — the gap-free cursor waits
    /// for it — or committed since the read. Reading again shortly returns them; a
    /// reader that must see a write it just made (a one-shot command in a new
    /// process) reads again while this is set.
    pub held_back: bool,
}

/// What the appender presents to write under a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// Claim key.
    pub key: String,
    /// Holder that must still hold the claim.
    pub holder: String,
    /// Epoch the claim must still be at.
    pub epoch: Epoch,
}

impl From<&huddle_core::sync::ClaimRef> for Fence {
    /// The fence a write under this claim presents.
    fn from(c: &huddle_core::sync::ClaimRef) -> Self {
        Fence {
            key: c.key.clone(),
            holder: c.holder.clone(),
            epoch: c.epoch,
        }
    }
}

/// A claim row as the database holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimState {
    /// Key, e.g. `task/<room>/<task>`.
    pub key: String,
    /// Current holder.
    pub holder: String,
    /// Current epoch.
    pub epoch: Epoch,
    /// Database time (µs since the Unix epoch) at which the lease lapses.
    pub expires_at: Timestamp,
}

/// The outcome of [`Claims::acquire`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Acquired {
    /// The caller holds the claim now (new, re-taken after expiry, or renewed by the
    /// same holder).
    Won(ClaimState),
    /// Someone else holds an unexpired claim.
    HeldBy(ClaimState),
    /// The work the claim stood for is finished: the write that finished it closed the
    /// claim ([`Ledger::append_under`] with `close`), and nobody may take it again.
    /// `state` is the claim as it was closed (its last holder and epoch).
    Closed {
        /// The claim as it was closed.
        state: ClaimState,
        /// The id of the interaction whose append closed it.
        by: InteractionId,
    },
}

impl Acquired {
    /// The claim state, whoever holds it.
    pub fn state(&self) -> &ClaimState {
        match self {
            Acquired::Won(s) | Acquired::HeldBy(s) => s,
            Acquired::Closed { state, .. } => state,
        }
    }

    /// Whether the claim is closed for good.
    pub fn closed(&self) -> bool {
        matches!(self, Acquired::Closed { .. })
    }

    /// Whether the caller won.
    pub fn won(&self) -> bool {
        matches!(self, Acquired::Won(_))
    }
}

/// The id a closing append closes its claims with: its first interaction's. `None`
/// when not closing; an error for a closing append with nothing in it.
pub(crate) fn closing_id(close: bool, batch: &[NewInteraction]) -> Result<Option<InteractionId>> {
    match (close, batch.first()) {
        (false, _) => Ok(None),
        (true, Some(first)) => Ok(Some(first.id())),
        (true, None) => Err(crate::StoreError::Backend(
            "a closing append needs at least one interaction (its id closes the claims)".into(),
        )),
    }
}

/// `rooms` without repeats, sorted: what a multi-room read asks the database for.
pub(crate) fn distinct_rooms(rooms: &[String]) -> Vec<String> {
    let mut out = rooms.to_vec();
    out.sort();
    out.dedup();
    out
}

/// One claim of a batch acquire ([`Claims::acquire_batch`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// Claim key.
    pub key: String,
    /// Holder to take it for.
    pub holder: String,
    /// Lease length.
    pub ttl: Duration,
    /// Tried only when the request at this index (an earlier one of the same batch)
    /// was won: a review's drive claim after its review claim. `None`: always tried.
    pub after: Option<usize>,
    /// The relay that runs the holder's turn under the claim, when it is taken for one
    /// (plan 0094): a live claim is extended only for the same holder **and** the
    /// same driver (none and none count as the same); the same holder with another
    /// driver finds it held. So one claim elects both the agent and the one relay
    /// that drives it, even when several relays host that agent. Renew, release and
    /// fences need not name it: the driver changes only when the claim is re-taken
    /// after it lapsed, which moves the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

impl ClaimRequest {
    /// A request tried whatever the others get.
    pub fn new(key: impl Into<String>, holder: impl Into<String>, ttl: Duration) -> Self {
        ClaimRequest {
            key: key.into(),
            holder: holder.into(),
            ttl,
            after: None,
            driver: None,
        }
    }

    /// This request, taken for `driver` to drive the holder's turn
    /// ([`ClaimRequest::driver`]).
    pub fn driven_by(mut self, driver: impl Into<String>) -> Self {
        self.driver = Some(driver.into());
        self
    }

    /// This request, tried only when request `index` of the batch was won.
    pub fn after(mut self, index: usize) -> Self {
        self.after = Some(index);
        self
    }
}

/// Checks a batch acquire's shape: keys in strictly increasing byte order (so any two
/// batches lock the claim rows they share in the same order and never wait for each
/// other in a cycle), and every condition naming an earlier request.
pub(crate) fn check_claim_batch(requests: &[ClaimRequest]) -> Result<()> {
    for (i, r) in requests.iter().enumerate() {
        if i > 0 && requests[i - 1].key.as_bytes() >= r.key.as_bytes() {
            return Err(crate::StoreError::Backend(format!(
                "a batch acquire takes its keys in increasing byte order, without repeats: {:?} comes after {:?}",
                r.key,
                requests[i - 1].key
            )));
        }
        if r.after.is_some_and(|j| j >= i) {
            return Err(crate::StoreError::Backend(format!(
                "request {i} ({:?}) of a batch acquire waits for request {:?}, which is not before it",
                r.key, r.after
            )));
        }
    }
    Ok(())
}

/// Whether a request of a batch acquire is tried, given the answers `out` to the
/// requests before it: always, or when the request it waits for was won.
pub(crate) fn tried(r: &ClaimRequest, out: &[Option<Acquired>]) -> bool {
    r.after.is_none_or(|j| {
        out.get(j)
            .and_then(Option::as_ref)
            .is_some_and(Acquired::won)
    })
}

/// Rows a hand-off writes with its claims ([`Store::acquire_and_append`]): appended
/// in the transaction of the batch acquire, under the claims it names, only when each
/// of them was won at exactly the epoch expected (the rows carry those epochs).
#[derive(Clone, Debug, PartialEq)]
pub struct ConditionalAppend {
    /// `(request index, epoch)`: each request must have been won at that epoch.
    pub when_won: Vec<(usize, Epoch)>,
    /// The rows (not empty).
    pub rows: Vec<NewInteraction>,
}

/// A write under claims sent ahead of a hand-off ([`Store::append_then_hand_off`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FencedWrite {
    /// The claims it is written under.
    pub fences: Vec<Fence>,
    /// Whether the write closes them ([`Ledger::append_under`]).
    pub close: bool,
    /// The rows (not empty).
    pub rows: Vec<NewInteraction>,
}

/// What [`Store::acquire_and_append`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// One answer per request, as [`Claims::acquire_batch`] gives them.
    pub acquired: Vec<Option<Acquired>>,
    /// Per conditional append: the rows written (`None`: its conditions did not all
    /// hold, or it could not be written; nothing of it is in the ledger then, and the
    /// caller writes the rows itself under the claims it won).
    pub appended: Vec<Option<Vec<Appended>>>,
}

/// Verifies a stored row and adds what it stands for to `rows`: the row, or a lot's
/// items when `unpack` (a lot that does not unpack is refused either way, so the
/// stored and the unpacked reads skip the same rows). The reason when it is skipped.
pub(crate) fn read_row(
    raw: huddle_core::RawRow,
    unpack: bool,
    rows: &mut Vec<Interaction>,
) -> std::result::Result<(), String> {
    if unpack {
        return raw.read_into(rows).map_err(|e| e.to_string());
    }
    let row = raw.verify().map_err(|e| e.to_string())?;
    if row.verb == huddle_core::Verb::TaskLot {
        row.clone()
            .unpacked(&Limits::default())
            .map_err(|e| e.to_string())?;
    }
    rows.push(row);
    Ok(())
}

/// The fences of `append` when every one of its conditions holds in `acquired`.
pub fn conditions_hold(
    append: &ConditionalAppend,
    requests: &[ClaimRequest],
    acquired: &[Option<Acquired>],
) -> Option<Vec<Fence>> {
    append
        .when_won
        .iter()
        .map(|(i, epoch)| match acquired.get(*i)? {
            Some(Acquired::Won(c)) if c.epoch == *epoch => Some(Fence {
                key: requests.get(*i)?.key.clone(),
                holder: c.holder.clone(),
                epoch: *epoch,
            }),
            _ => None,
        })
        .collect()
}

/// Checks the conditional appends of a hand-off: each names requests of the batch,
/// and has rows.
pub(crate) fn check_appends(
    requests: &[ClaimRequest],
    appends: &[ConditionalAppend],
) -> Result<()> {
    for (n, a) in appends.iter().enumerate() {
        if a.rows.is_empty() || a.when_won.is_empty() {
            return Err(crate::StoreError::Backend(format!(
                "conditional append {n} of a hand-off has no rows or no condition"
            )));
        }
        if a.rows.iter().any(|r| r.idempotency_key.is_some()) {
            return Err(crate::StoreError::Backend(format!(
                "conditional append {n} of a hand-off has a row with an idempotency key; \
                 hand-off rows are identified by their content"
            )));
        }
        if let Some((i, _)) = a.when_won.iter().find(|(i, _)| *i >= requests.len()) {
            return Err(crate::StoreError::Backend(format!(
                "conditional append {n} of a hand-off names request {i}, which the batch does not have"
            )));
        }
    }
    Ok(())
}

/// A claim as listed by [`Claims::list_claims`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRow {
    /// The row.
    pub state: ClaimState,
    /// Whether it is unexpired by the database clock at listing time.
    pub live: bool,
    /// The relay it was taken to drive the holder's turn for, if any
    /// ([`ClaimRequest::driver`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

/// A doorbell: its value changes whenever new rows may be readable (a local append,
/// a NOTIFY, another process's commit, a reconnect). It is a hint, never a record.
pub type Doorbell = watch::Receiver<u64>;

/// The append-only ledger.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// The limits checked before every write.
    fn limits(&self) -> &Limits;

    /// Appends a batch in one transaction. Every interaction is validated first; one
    /// invalid interaction refuses the whole batch with nothing written. Duplicates
    /// (same id, or same idempotency key) are no-ops that return the existing id.
    async fn append(&self, batch: Vec<NewInteraction>) -> Result<Vec<Appended>>;

    /// Like [`Ledger::append`], but in the same transaction checks that the claim
    /// `fence.key` is still held by `fence.holder` at `fence.epoch`, unexpired and not
    /// closed; otherwise nothing is written and [`crate::StoreError::Fenced`] is
    /// returned. The one-fence, non-closing form of [`Ledger::append_under`].
    async fn append_fenced(
        &self,
        fence: &Fence,
        batch: Vec<NewInteraction>,
    ) -> Result<Vec<Appended>> {
        self.append_under(std::slice::from_ref(fence), false, batch)
            .await
    }

    /// Appends `batch` under every claim in `fences`, in one transaction: each must be
    /// held by its holder at its epoch, unexpired and not closed, or nothing is written
    /// and [`crate::StoreError::Fenced`] names the first that failed.
    ///
    /// With `close`, the same transaction closes every fenced claim with the id of
    /// the batch's first interaction: the write that finishes the work makes sure no
    /// one ever acquires it again ([`Acquired::Closed`]). A retry of a closing append
    /// that already committed (an ambiguous commit) is accepted: a claim closed by this
    /// very batch passes its fence, and the rows dedupe. `close` needs a non-empty
    /// batch.
    async fn append_under(
        &self,
        fences: &[Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> Result<Vec<Appended>>;

    /// Reads up to `limit` committed rows after `after`, in ledger order. Never skips a
    /// committed row, even when transactions commit out of sequence order.
    async fn read_forward(&self, after: Position, limit: usize) -> Result<ReadBatch>;

    /// Like [`Ledger::read_forward`] but only rows of `room`: [`Ledger::read_rooms`]
    /// with one room. Backends may override this with an indexed query.
    async fn read_room(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch> {
        self.read_rooms(&[room.to_string()], after, limit).await
    }

    /// Like [`Ledger::read_forward`] but only rows of `rooms` (repeats ignored; no
    /// rooms, no rows): up to `limit` committed rows of those rooms after `after`, in
    /// ledger order, never skipping one, even when transactions commit out of
    /// sequence order (rows the read may not take yet, behind a transaction still
    /// open, are read on a later pass, as with [`Ledger::read_forward`]). `next` is
    /// past every row returned or skipped; rows of other rooms before it are never
    /// returned.
    ///
    /// This is how a relay reads: its cost follows the rows of the rooms it serves,
    /// not the ledger's. Backends override it with an indexed read; the default pages
    /// through [`Ledger::read_forward`] and filters (correct, not cheap; skipped rows
    /// of any room are reported, since their room cannot be trusted).
    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> Result<ReadBatch> {
        let mut out = ReadBatch {
            next: after,
            ..ReadBatch::default()
        };
        if rooms.is_empty() {
            return Ok(out);
        }
        loop {
            let want = limit.saturating_sub(out.rows.len() + out.skipped.len());
            if want == 0 {
                return Ok(out);
            }
            let page = self.read_forward(out.next, want).await?;
            let short = page.rows.len() + page.skipped.len() < want;
            out.next = page.next;
            out.held_back = page.held_back;
            out.skipped.extend(page.skipped);
            out.rows
                .extend(page.rows.into_iter().filter(|r| rooms.contains(&r.room)));
            if short {
                return Ok(out);
            }
        }
    }

    /// Like [`Ledger::read_room`], but the rows as they are stored: a `task.lot` row is
    /// returned as itself (checked as its readers check it: a lot they would skip is
    /// skipped here too), not as its items. What an export that must match the
    /// database row for row reads (`huddle room archive`); everything else reads
    /// items.
    async fn read_room_rows(&self, room: &str, after: Position, limit: usize) -> Result<ReadBatch>;

    /// One row by id, if present and valid: a row, never an item of a lot (a
    /// `task.lot` row is returned as itself).
    async fn get(&self, id: InteractionId) -> Result<Option<Interaction>>;

    /// A doorbell receiver for this store.
    fn doorbell(&self) -> Doorbell;

    /// The database clock, µs since the Unix epoch.
    async fn now(&self) -> Result<Timestamp>;

    /// The fallback poll interval subscriptions use between doorbells.
    fn poll_interval(&self) -> Duration;

    /// Waits (briefly, bounded) until every doorbell for this handle's appends has
    /// been sent. Appends never wait for their doorbell; a process that appends and
    /// then exits calls this so other processes wake at once rather than at their
    /// fallback poll. The default does nothing.
    async fn flush(&self) {}
}

/// Leased claims. Expiry is always judged by the database clock.
#[async_trait]
pub trait Claims: Send + Sync + 'static {
    /// Takes `key` for `holder` for `ttl` when it is free, expired, or already held by
    /// `holder` (then the lease is extended and the epoch kept). The epoch increases
    /// whenever the holder changes or an expired claim is re-taken. A closed claim is
    /// never taken: the answer is [`Acquired::Closed`]. The claim is taken without a
    /// driver ([`Claims::acquire_request`]).
    async fn acquire(&self, key: &str, holder: &str, ttl: Duration) -> Result<Acquired> {
        self.acquire_request(&ClaimRequest::new(key, holder, ttl))
            .await
    }

    /// [`Claims::acquire`] for one request, with its driver: a live claim is kept
    /// (extended, its epoch kept) only for the same holder and the same driver
    /// ([`ClaimRequest::driver`]). `request.after` is ignored.
    async fn acquire_request(&self, request: &ClaimRequest) -> Result<Acquired>;

    /// Takes several claims in one go (one statement and one commit where the backend
    /// can), in the order given, each exactly as [`Claims::acquire`] would. A request
    /// with [`ClaimRequest::after`] is tried only when that earlier request was won;
    /// its answer is `None` when it was not tried. Keys must come in strictly
    /// increasing byte order (so batches that share claims take them in one order);
    /// a batch that breaks that, or a condition naming a later request, is refused
    /// with nothing taken. The default takes them one by one.
    async fn acquire_batch(&self, requests: &[ClaimRequest]) -> Result<Vec<Option<Acquired>>> {
        check_claim_batch(requests)?;
        let mut out: Vec<Option<Acquired>> = Vec::with_capacity(requests.len());
        for r in requests {
            let tried = tried(r, &out);
            out.push(if tried {
                Some(self.acquire_request(r).await?)
            } else {
                None
            });
        }
        Ok(out)
    }

    /// Extends the lease only for the exact `(holder, epoch)` while unexpired. `None`
    /// means the claim is lost and the holder must stop.
    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: Epoch,
        ttl: Duration,
    ) -> Result<Option<ClaimState>>;

    /// Expires the claim now if it is `(holder, epoch)`; the row stays so the epoch
    /// never goes backwards. Returns whether it was released.
    async fn release(&self, key: &str, holder: &str, epoch: Epoch) -> Result<bool>;

    /// Lists claims whose key starts with `prefix` (all when empty), by key.
    async fn list_claims(&self, prefix: &str) -> Result<Vec<ClaimRow>>;

    /// Takes every resource of `wanted` for `holder` in `room` for `ttl`, all or
    /// nothing, in one transaction under the room's lock, judged by the database
    /// clock: [`crate::resources::ResourcesAcquired::Won`] with one holding per
    /// resource in the global order (each a claim `resource/<room>/<holder>/<mode>/
    /// <name>`, its epoch kept when the holder already held it live, bumped
    /// otherwise; a holding of the same resource in another mode is given back), or
    /// [`crate::resources::ResourcesAcquired::Blocked`] naming every holding of
    /// another holder in the way and changing nothing. The rule is
    /// [`huddle_core::resources::blockers`]. Renew and release each holding with
    /// [`Claims::renew`] and [`Claims::release`].
    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> Result<crate::resources::ResourcesAcquired>;
}

/// An owner's archive of a room, as [`Store::archive_room`] is asked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchiveRequest {
    /// How many rows of the room the export read: every row the room holds. The store
    /// refuses when the room holds another number (rows are never removed otherwise,
    /// so equal counts mean the exported rows are all of them).
    pub rows: u64,
    /// The `room.archived` row to leave, signed by the owner; its room is the room
    /// archived and its body records `rows`.
    pub archived: NewInteraction,
}

/// What [`Store::archive_room`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveOutcome {
    /// The id of the `room.archived` row left in the ledger.
    pub id: InteractionId,
    /// Rows removed (every row of the room but that one).
    pub rows_removed: u64,
    /// Claims of the room removed.
    pub claims_removed: u64,
}

/// Why a store refused to archive a room; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveRefusal {
    /// The room holds another number of rows than the export read: a row was added
    /// since (export again).
    #[error("it holds {now} rows, {exported} were exported: it changed since the export")]
    Changed {
        /// Rows exported.
        exported: u64,
        /// Rows the room holds now.
        now: u64,
    },
    /// A claim of the room is live: work is in progress.
    #[error("it is not settled: live claims {}", .0.join(", "))]
    LiveClaims(Vec<String>),
    /// The writer may not archive it (on Postgres: neither the role that created the
    /// room nor an administrator, or a relay role).
    #[error("{0}")]
    NotAllowed(String),
    /// The room was archived before.
    #[error("it is archived already")]
    Archived,
    /// There is no room by that name (no `room.created`).
    #[error("there is no such room")]
    NoRoom,
    /// The row to leave is not a `room.archived` row recording the count.
    #[error("{0}")]
    BadRow(String),
}

/// What [`Store::prune_claims`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedClaims {
    /// `relay/<id>` leases expired for longer than asked.
    pub relay_leases: u64,
    /// Claims of archived rooms.
    pub archived_rooms: u64,
}

impl ArchiveRequest {
    /// Checks the shape every backend checks first: a `room.archived` row whose body
    /// records `rows`.
    pub(crate) fn check(&self) -> std::result::Result<(), ArchiveRefusal> {
        let recorded = self.archived.body.get("rows").and_then(|r| r.as_u64());
        if self.archived.verb != huddle_core::Verb::RoomArchived || recorded != Some(self.rows) {
            return Err(ArchiveRefusal::BadRow(format!(
                "not a room.archived row recording {} rows",
                self.rows
            )));
        }
        Ok(())
    }
}

/// A complete store: ledger plus claims.
#[async_trait]
pub trait Store: Ledger + Claims {
    /// `"sqlite"` or `"postgres"`.
    fn backend_name(&self) -> &'static str;

    /// The writer this store's appends are attributed to (their `relay` column): the
    /// configured relay id, on Postgres the connection's database role. `None` when
    /// it is not known before writing (a Postgres URL without a user).
    fn writer(&self) -> Option<String> {
        None
    }

    /// The public key this store signs its appends with (`StoreOptions::signer`), if
    /// it signs.
    fn signer(&self) -> Option<huddle_core::keys::WriterKey> {
        None
    }

    /// A hand-off in one go: `requests` are acquired as by [`Claims::acquire_batch`],
    /// and each of `appends` whose claims were all won at the epochs it expects is
    /// appended under them — in the same transaction where the backend can (one
    /// statement and one commit on Postgres, one `BEGIN IMMEDIATE` on SQLite), with
    /// the same database checks as any fenced append. An append whose conditions do
    /// not hold writes nothing. The default acquires, then appends each satisfied
    /// one under its fences (an append that fails is reported as not written).
    async fn acquire_and_append(
        &self,
        requests: &[ClaimRequest],
        appends: Vec<ConditionalAppend>,
    ) -> Result<Handoff> {
        check_appends(requests, &appends)?;
        let acquired = self.acquire_batch(requests).await?;
        let mut appended = Vec::with_capacity(appends.len());
        for a in appends {
            let written = match conditions_hold(&a, requests, &acquired) {
                Some(fences) => self.append_under(&fences, false, a.rows).await.ok(),
                None => None,
            };
            appended.push(written);
        }
        Ok(Handoff { acquired, appended })
    }

    /// A fenced write, then a hand-off (plan 0082): `first` is appended as by
    /// [`Ledger::append_under`], then the hand-off is performed as by
    /// [`Store::acquire_and_append`]. Postgres does both in one statement — one
    /// transaction, one commit — so when `first` is refused (`Err(Fenced)`) nothing of
    /// the call is done. The default makes the two calls in turn: `first` is written
    /// or refused before the hand-off is sent, and an error after it was written
    /// leaves it written. Either way a caller that does not know the outcome may send
    /// the call again, identical: `first`'s rows deduplicate and its closing fences
    /// accept the same closing row again.
    async fn append_then_hand_off(
        &self,
        first: FencedWrite,
        requests: &[ClaimRequest],
        appends: Vec<ConditionalAppend>,
    ) -> Result<(Vec<Appended>, Handoff)> {
        let written = self
            .append_under(&first.fences, first.close, first.rows)
            .await?;
        let handoff = self.acquire_and_append(requests, appends).await?;
        Ok((written, handoff))
    }

    /// Archives a settled room: in one transaction, checks that the room exists, is
    /// not archived, holds exactly `request.rows` rows and has no live claim (and on
    /// Postgres that this writer's role created it or administers the database),
    /// inserts `request.archived`, removes every other row of the room and its
    /// claims, and closes the room: from then on every append of another row to it is
    /// refused. Refusals are [`crate::StoreError::ArchiveRefused`], with nothing
    /// changed. This is the only way rows leave the ledger; the caller exports them
    /// first (`huddle room archive`).
    async fn archive_room(&self, request: ArchiveRequest) -> Result<ArchiveOutcome>;

    /// Removes claim rows that can never matter again: `relay/<id>` leases expired
    /// for longer than `older_than` (each names one process as holder, and no row
    /// carries its epoch), and every claim of an archived room (nothing can be written
    /// there again). Claims of live rooms are never removed: their epochs must never
    /// go backwards and a closed one must stay closed. On Postgres only the
    /// administrator may (`huddle admin prune-claims`).
    async fn prune_claims(&self, older_than: Duration) -> Result<PrunedClaims>;
}
