-- Plan 0086: claim keys compare byte by byte.
--
-- A claim key is a `/`-separated path (docs/protocol.md, "Claim keys"). The key
-- column took the database's default collation, so a prefix listing
-- (`starts_with(key, $1)`) could not use the primary key's index and read every claim
-- ever taken: 30 ms a call at 40,000 claims, and a relay lists one key each time it
-- loses a claim. In the "C" collation (byte order, the order the relays lock claims
-- in and SQLite's `BINARY`) a prefix is a range of the index, `[prefix, bound)`, and
-- every key comparison is a byte comparison rather than a locale-aware one.
-- Only the index is rebuilt: the column's bytes do not change.

ALTER TABLE external_claim ALTER COLUMN key TYPE text COLLATE "C";
