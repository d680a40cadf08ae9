-- Closed claims: the write that finishes work (a task's completion or final failure,
-- a reply) closes its claims in the same transaction. A closed claim is never
-- acquired again; `closed_by` is the id of the interaction whose append closed it.
-- Closing is a state of the row, never a deletion: the epoch history stays.
ALTER TABLE external_claim ADD COLUMN closed_by BLOB
    CHECK (closed_by IS NULL OR length(closed_by) = 32);
