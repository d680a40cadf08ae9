-- Archived rooms (plan 0057): the ledger's one exception to append-only. A room's
-- owner archives a settled room as a whole, after exporting it; the store does it in
-- one BEGIN IMMEDIATE transaction (writers are serialized, so nothing races it): it
-- records the room here (marked `removing`), inserts the room's `room.archived` row
-- first (so its rowid is above every removed row's, and no removed rowid is ever
-- reused), deletes the room's other rows and its claims, and clears the mark. From
-- then on the insert trigger refuses every row of the room but that one. SQLite has no
-- roles: whoever can write the file can drop these triggers (docs/security.md).

CREATE TABLE archived_room (
    room        TEXT PRIMARY KEY,
    archived_id BLOB NOT NULL CHECK (length(archived_id) = 32),
    rows        INTEGER NOT NULL CHECK (rows >= 0),
    archived_by TEXT NOT NULL,
    archived_at INTEGER NOT NULL,               -- µs since the Unix epoch
    removing    INTEGER NOT NULL DEFAULT 0
);

DROP TRIGGER interaction_no_delete;

CREATE TRIGGER interaction_no_delete BEFORE DELETE ON interaction
WHEN NOT EXISTS (SELECT 1 FROM archived_room WHERE room = OLD.room AND removing = 1)
BEGIN
    SELECT RAISE(ABORT, 'huddle: interactions are append-only (DELETE refused: rows leave the ledger only when the owner archives a settled room, huddle room archive)');
END;

CREATE TRIGGER interaction_archived_room BEFORE INSERT ON interaction
WHEN EXISTS (SELECT 1 FROM archived_room WHERE room = NEW.room AND archived_id <> NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'huddle: room is archived: nothing can be added to it (an archived room cannot be reused; choose another room name)');
END;

-- A `room.archived` row is written only by archiving its room: relays stop serving a
-- room when they read one, so a forged one would silence a live room.
CREATE TRIGGER interaction_archived_row BEFORE INSERT ON interaction
WHEN NEW.verb = 'room.archived'
 AND NOT EXISTS (SELECT 1 FROM archived_room WHERE room = NEW.room AND archived_id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'huddle: a room.archived row is written only by archiving the room (huddle room archive)');
END;
