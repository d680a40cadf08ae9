-- Plan 0094: one claim a task turn. A claim taken to drive its holder's turn records
-- the relay that drives it; a live claim is extended only for the same holder and the
-- same driver (NULL and NULL count as the same). Claims taken before have none.
ALTER TABLE external_claim ADD COLUMN driver TEXT;
