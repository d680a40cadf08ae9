-- The ledger and the claims table (SQLite).
--
-- Appends run in BEGIN IMMEDIATE, so writers are serialized and the rowid (seq) is
-- assigned in commit order: the cursor is simply the rowid.
CREATE TABLE interaction (
    seq             INTEGER PRIMARY KEY,
    id              BLOB NOT NULL UNIQUE CHECK (length(id) = 32),
    room            TEXT NOT NULL,
    thread          TEXT,
    verb            TEXT NOT NULL,
    actor           TEXT NOT NULL,
    role            TEXT NOT NULL,
    parent          BLOB,
    caused_by       BLOB NOT NULL DEFAULT x'',  -- concatenated 32-byte ids
    body            TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    at              INTEGER NOT NULL,           -- µs since the Unix epoch, SQLite clock
    relay           TEXT NOT NULL
);

CREATE INDEX interaction_room ON interaction (room, seq);

-- Invariant 1: no code path updates or deletes an interaction.
CREATE TRIGGER interaction_no_update BEFORE UPDATE ON interaction
BEGIN
    SELECT RAISE(ABORT, 'huddle: interactions are append-only (UPDATE refused)');
END;

CREATE TRIGGER interaction_no_delete BEFORE DELETE ON interaction
BEGIN
    SELECT RAISE(ABORT, 'huddle: interactions are append-only (DELETE refused)');
END;

-- Claims: the one mutable table. Released rows are expired, never deleted.
CREATE TABLE external_claim (
    key         TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       INTEGER NOT NULL CHECK (epoch > 0),
    expires_at  INTEGER NOT NULL,               -- µs since the Unix epoch
    acquired_at INTEGER NOT NULL,
    renewed_at  INTEGER NOT NULL
);
