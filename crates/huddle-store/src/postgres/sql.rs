//! The SQL the Postgres store runs, in one place.
//!
//! Times cross the wire as microseconds since the Unix epoch (`int8`); `xid8`
//! transaction ids as text (tokio-postgres has no `xid8` codec), cast on the
//! parameter side so the `(txid, seq)` index stays usable.

/// The notification channel every store LISTENs on and NOTIFYs.
pub(crate) const CHANNEL: &str = "huddle";

/// The insert of a batch from column arrays, rows in batch order; the caused_by
/// column arrives as concatenated 32-byte ids.
macro_rules! insert_rows {
    () => {
        "INSERT INTO interaction
    (id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key, sig)
SELECT t.id, t.room, t.thread, t.verb, t.actor, t.role, t.parent,
       CASE WHEN octet_length(t.causes) = 0 THEN '{}'::bytea[]
            ELSE ARRAY(SELECT substring(t.causes FROM g * 32 + 1 FOR 32)
                       FROM generate_series(0, octet_length(t.causes) / 32 - 1) AS g
                       ORDER BY g)
       END,
       t.body, t.ikey, t.sig
FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::bytea[], $8::bytea[], $9::text[], $10::text[], $11::text[])
     WITH ORDINALITY AS t(id, room, thread, verb, actor, role, parent, causes, body, ikey, sig,
                          ord)
ORDER BY t.ord"
    };
}

/// Appends a batch in one statement. Parameters are parallel arrays, one element per
/// interaction; `$8` holds each row's causes concatenated (32 bytes each), split back
/// here because Postgres arrays cannot be ragged (the subquery runs only for rows that
/// have causes). `ORDER BY ord` keeps sequence numbers in batch order. Duplicates (same id, or same idempotency key) are skipped;
/// `RETURNING` names the rows actually inserted.
pub(crate) const APPEND: &str = concat!(
    insert_rows!(),
    "\nON CONFLICT DO NOTHING\nRETURNING id, idempotency_key"
);

/// A batch of one, the most common append: a plain `VALUES` row (no unnest, no
/// ordering, `caused_by` bound as an array). Measured against the unnest form on the
/// 2-core bench machine it is what closes most of the gap to a plain insert.
pub(crate) const APPEND_ONE: &str = "\
INSERT INTO interaction
    (id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key, sig)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// The common case of [`APPEND`]: the same rows with no conflict handling and
/// nothing returned. Speculative insertion (`ON CONFLICT`) costs measurably more per
/// row, and duplicates are rare, so a batch is tried this way first; a unique
/// violation (nothing written: one statement is one transaction) falls back to
/// [`APPEND`].
pub(crate) const APPEND_PLAIN: &str = insert_rows!();

/// The ids already stored under some idempotency keys.
pub(crate) const IDS_BY_KEY: &str = "\
SELECT idempotency_key, id FROM interaction WHERE idempotency_key = ANY($1::text[])";

/// A fenced append in one statement (migration 0008's `huddle_append_under`): the
/// fences `$1..$3` (parallel arrays) checked, and closed with `$4` when it is not
/// NULL, then the rows of the column arrays `$5..$15` inserted as by [`APPEND`].
/// A fence that does not hold raises [`FENCE_REFUSED`] with its 1-based index as
/// the error's detail; nothing is written. Returns the rows actually inserted.
pub(crate) const APPEND_UNDER: &str = "SELECT o_id, o_ikey FROM huddle_append_under(\
$1::text[], $2::text[], $3::int8[], $4::bytea, $5::bytea[], $6::text[], $7::text[], \
$8::text[], $9::text[], $10::text[], $11::bytea[], $12::bytea[], $13::text[], $14::text[], \
$15::text[])";

/// The SQLSTATE `huddle_append_under` raises for a fence that does not hold.
pub(crate) const FENCE_REFUSED: &str = "HUF01";

/// Several claims in one statement (migration 0018's `huddle_claim_acquire_batch`):
/// parallel arrays of keys, holders, leases (µs), conditions (1-based index of the
/// request that must have been won, 0 for none) and drivers (NULL for none). One row
/// per request tried: its 1-based index, then the columns of [`ACQUIRE_OR_HOLDER`].
pub(crate) const ACQUIRE_BATCH: &str = "SELECT o_idx, o_holder, o_epoch, o_expires_us, \
o_won, o_closed_by FROM huddle_claim_acquire_batch($1::text[], $2::text[], $3::int8[], \
$4::int4[], $5::text[])";

/// A hand-off in one statement (migration 0018's `huddle_handoff`): the batch acquire
/// `$1..$4` as [`ACQUIRE_BATCH`], the conditions `$5..$7` (group, 1-based request,
/// epoch), each row's group `$8`, the row columns `$9..$19` as [`APPEND_UNDER`]'s
/// `$5..$15`, and the requests' drivers `$20` ([`ACQUIRE_BATCH`]'s `$5`). Rows with
/// `o_kind` 0 answer the requests as [`ACQUIRE_BATCH`] does;
/// rows with `o_kind` 1 name the rows inserted.
pub(crate) const HANDOFF: &str = "SELECT o_kind, o_idx, o_holder, o_epoch, o_expires_us, \
o_won, o_closed_by, o_id, o_ikey FROM huddle_handoff($1::text[], $2::text[], $3::int8[], \
$4::int4[], $5::int4[], $6::int4[], $7::int8[], $8::int4[], $9::bytea[], $10::text[], \
$11::text[], $12::text[], $13::text[], $14::text[], $15::bytea[], $16::bytea[], $17::text[], \
$18::text[], $19::text[], $20::text[])";

/// A fenced write, then a hand-off, in one statement (plan 0082): [`APPEND_UNDER`]
/// with `$1..$15`, then [`HANDOFF`] with `$16..$35`. The write's inserted rows come
/// first, with `o_kind` 2 (ids in `o_id`); a fence of the write that does not hold
/// raises [`FENCE_REFUSED`] and the whole statement — the hand-off too — is undone.
/// (An `Append` node runs its inputs in order: the write before the claims.)
pub(crate) const APPEND_THEN_HANDOFF: &str = "SELECT 2, NULL::int4, NULL::text, NULL::int8, \
NULL::int8, NULL::bool, NULL::bytea, w.o_id, w.o_ikey FROM huddle_append_under($1::text[], \
$2::text[], $3::int8[], $4::bytea, $5::bytea[], $6::text[], $7::text[], $8::text[], $9::text[], \
$10::text[], $11::bytea[], $12::bytea[], $13::text[], $14::text[], $15::text[]) AS w \
UNION ALL SELECT o_kind, o_idx, o_holder, o_epoch, o_expires_us, o_won, o_closed_by, o_id, \
o_ikey FROM huddle_handoff($16::text[], $17::text[], $18::int8[], $19::int4[], $20::int4[], \
$21::int4[], $22::int8[], $23::int4[], $24::bytea[], $25::text[], $26::text[], $27::text[], \
$28::text[], $29::text[], $30::bytea[], $31::bytea[], $32::text[], $33::text[], $34::text[], \
$35::text[])";

/// The columns every read decodes, in this order. (The first is named `txid` but is
/// text: ORDER BY must name `interaction.txid`, or it would sort by the text.)
macro_rules! row_columns {
    () => {
        "txid::text, seq, id, room, thread, verb, actor, role, parent, caused_by, body,
(extract(epoch FROM at) * 1000000)::int8, relay, sig"
    };
}

/// The read horizon: the oldest transaction still running (in this statement's
/// snapshot) that may write to this database. Every transaction below it has ended,
/// so no row below it can still appear.
///
/// It is `pg_snapshot_xmin(pg_current_snapshot())`, except that transactions
/// `pg_stat_activity` shows running in *another* database of the cluster are passed
/// over: they cannot write here, and otherwise any long transaction anywhere on the
/// server would stall every reader. A transaction that cannot be placed (it ended
/// meanwhile, belongs to a role whose sessions we may not see, is prepared) counts as
/// ours, so the horizon is never too high. It is an uncorrelated scalar subquery, so
/// Postgres evaluates it once per statement and the `(txid, seq)` index stays usable.
macro_rules! horizon {
    () => {
        "(SELECT CASE
    WHEN pg_snapshot_xmin(s.snap) = pg_snapshot_xmax(s.snap) THEN pg_snapshot_xmax(s.snap)
    ELSE coalesce((
        SELECT min(x.xid) FROM pg_snapshot_xip(s.snap) AS x(xid)
        WHERE NOT EXISTS (
            SELECT 1 FROM pg_stat_activity AS a
            WHERE a.backend_xid = x.xid::xid AND a.datname <> current_database())
    ), pg_snapshot_xmax(s.snap))
  END
  FROM (SELECT pg_current_snapshot() AS snap) AS s)"
    };
}

/// Reads forward from `($1, $2)`: only rows of transactions below the horizon, so a
/// row of a transaction that commits later can never appear behind the cursor.
pub(crate) const READ_FORWARD: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM interaction
WHERE (txid, seq) > ($1::text::xid8, $2::int8)
  AND txid < ",
    horizon!(),
    "
ORDER BY interaction.txid, interaction.seq
LIMIT $3"
);

/// [`READ_FORWARD`] for one room (`$4`), on the `(room, txid, seq)` index.
pub(crate) const READ_ROOM: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM interaction
WHERE room = $4
  AND (txid, seq) > ($1::text::xid8, $2::int8)
  AND txid < ",
    horizon!(),
    "
ORDER BY interaction.txid, interaction.seq
LIMIT $3"
);

/// [`READ_FORWARD`] for several rooms (`$4`, without repeats), in one statement: one
/// snapshot and one horizon. For each room a `LATERAL` range scan of the `(room, txid,
/// seq)` index returns at most `$3` rows past the cursor and below the horizon; the
/// union is ordered by `(txid, seq)` and cut at `$3`. Every room's first `$3` rows are
/// candidates, so no row of these rooms between the cursor and the last row returned
/// is left out; the sort is over at most `rooms × $3` rows. The position columns are
/// repeated at the end (`o_txid`, `o_seq`) for the outer ordering, which must not sort
/// by the text form.
pub(crate) const READ_ROOMS: &str = concat!(
    "SELECT x.* FROM unnest($4::text[]) AS r(name)
CROSS JOIN LATERAL (
  SELECT ",
    row_columns!(),
    ", interaction.txid AS o_txid, interaction.seq AS o_seq
  FROM interaction
  WHERE interaction.room = r.name
    AND (interaction.txid, interaction.seq) > ($1::text::xid8, $2::int8)
    AND interaction.txid < ",
    horizon!(),
    "
  ORDER BY interaction.txid, interaction.seq
  LIMIT $3) AS x
ORDER BY x.o_txid, x.o_seq
LIMIT $3"
);

/// Whether any committed row lies after `($1, $2)`, the cursor a read just reached.
/// Asked (in a statement of its own, so with a newer snapshot than the read's) after a
/// read that returned fewer rows than asked: a row it finds was either held back by an
/// older transaction that was still running at the read (nothing rings the bell when
/// such a transaction ends) or committed since; either way the store re-rings itself
/// so the reader comes back. Checking against the read's own horizon instead would
/// race: the holding transaction may end between the two statements, and its held-back
/// rows would then wait for the fallback poll.
///
/// Written as "the first row past the cursor, in index order" rather than `EXISTS`:
/// the planner drops the ordering inside `EXISTS`, and the generic plan of a prepared
/// statement (used from its sixth execution on) then estimates a third of the table
/// past any cursor and scans the whole table sequentially — every row, on every read
/// that finds nothing new (measured: 2.6 ms per call at 20,000 rows, the largest
/// cost of a hand-off). Ordered with `LIMIT 1`, every plan is one index probe.
pub(crate) const HELD_BACK: &str = "SELECT (
    SELECT seq FROM interaction
    WHERE (txid, seq) > ($1::text::xid8, $2::int8)
    ORDER BY txid, seq LIMIT 1) IS NOT NULL";

/// [`HELD_BACK`] for one room (`$3`).
pub(crate) const HELD_BACK_ROOM: &str = "SELECT (
    SELECT seq FROM interaction
    WHERE room = $3
      AND (txid, seq) > ($1::text::xid8, $2::int8)
    ORDER BY room, txid, seq LIMIT 1) IS NOT NULL";

/// [`HELD_BACK`] for several rooms (`$3`): one index probe per room.
pub(crate) const HELD_BACK_ROOMS: &str = "SELECT EXISTS (
    SELECT 1 FROM unnest($3::text[]) AS r(name)
    WHERE (SELECT i.seq FROM interaction AS i
           WHERE i.room = r.name
             AND (i.txid, i.seq) > ($1::text::xid8, $2::int8)
           ORDER BY i.room, i.txid, i.seq LIMIT 1) IS NOT NULL)";

/// One row by id.
pub(crate) const GET: &str = concat!("SELECT ", row_columns!(), " FROM interaction WHERE id = $1");

/// The database clock.
pub(crate) const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";

/// Takes a claim (`huddle_claim_acquire`, migration 0003): one upsert whose update
/// applies only when the row is expired or already held by the same holder for the
/// same database role; the epoch stays for that holder's unexpired claim and increases
/// in every other case. When the upsert did not apply, the same statement answers with
/// the current holder (`won` false). When the conflicting row was committed after this
/// statement's snapshot, neither branch returns a row and the caller asks again.
pub(crate) const ACQUIRE_OR_HOLDER: &str = "SELECT * FROM huddle_claim_acquire($1, $2, $3)";

/// The claim as it stands (after an acquire lost).
pub(crate) const CLAIM: &str = "\
SELECT holder, epoch, (extract(epoch FROM expires_at) * 1000000)::int8, NULL::bool,
       closed_by
FROM external_claim WHERE key = $1";

/// Extends the lease of exactly `(key, holder, epoch)` while unexpired, when this
/// role acquired it.
pub(crate) const RENEW: &str = "SELECT * FROM huddle_claim_renew($1, $2, $3, $4)";

/// Expires exactly `(key, holder, epoch)` now, when this role acquired it; the row
/// stays so the epoch never goes backwards.
pub(crate) const RELEASE: &str = "SELECT huddle_claim_release($1, $2, $3)";

/// The columns and table of the claim listings below.
macro_rules! list_claims_from {
    () => {
        "SELECT key, holder, epoch, (extract(epoch FROM expires_at) * 1000000)::int8,
       expires_at > now(), driver
FROM external_claim
"
    };
}

/// Claims whose key lies in `[$1, $2)`: the keys starting with the prefix `$1` when
/// `$2` is its [`crate::prefix_upper_bound`], in byte order of the key (a range of the
/// primary key's index, whose collation is "C" since migration 0015).
pub(crate) const LIST_CLAIMS: &str = concat!(
    list_claims_from!(),
    "WHERE key >= $1 AND key < $2\nORDER BY key"
);

/// [`LIST_CLAIMS`] for a prefix with no upper bound (empty, or only `U+10FFFF`).
pub(crate) const LIST_CLAIMS_UNBOUNDED: &str =
    concat!(list_claims_from!(), "WHERE key >= $1\nORDER BY key");

/// Archives a room (migration 0012's `huddle_room_archive`): the room, the rows its
/// export read, then the `room.archived` row's id, actor, canonical body and `sig`.
/// Answers the rows and claims removed; refusals are SQLSTATEs `HUA01`..`HUA06`.
pub(crate) const ARCHIVE_ROOM: &str = "SELECT o_rows, o_claims FROM huddle_room_archive(\
$1::text, $2::int8, $3::bytea, $4::text, $5::text, $6::text)";

/// Prunes claims (migration 0012's `huddle_prune_claims`): relay leases expired for
/// longer than `$1` µs, and claims of archived rooms. Answers both counts.
pub(crate) const PRUNE_CLAIMS: &str =
    "SELECT o_relay, o_archived FROM huddle_prune_claims($1::int8)";
