-- The ledger and the claims table (Postgres).
--
-- interaction: append-only. Readers follow the gap-free cursor (txid, seq) bounded by
-- pg_snapshot_xmin(pg_current_snapshot()), so rows of transactions that commit out of
-- sequence order are never skipped.
CREATE TABLE interaction (
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    txid            xid8 NOT NULL DEFAULT pg_current_xact_id(),
    id              bytea NOT NULL PRIMARY KEY CHECK (octet_length(id) = 32),
    room            text NOT NULL,
    thread          text,
    verb            text NOT NULL,
    actor           text NOT NULL,
    role            text NOT NULL,
    parent          bytea,
    caused_by       bytea[] NOT NULL DEFAULT '{}',
    body            text NOT NULL,
    idempotency_key text UNIQUE,
    at              timestamptz NOT NULL DEFAULT now(),
    relay           text NOT NULL DEFAULT session_user
);

CREATE UNIQUE INDEX interaction_cursor ON interaction (txid, seq);
CREATE INDEX interaction_room ON interaction (room, txid, seq);

-- Invariant 1: no code path updates or deletes an interaction.
CREATE FUNCTION huddle_refuse_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'huddle: interactions are append-only (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER interaction_append_only
    BEFORE UPDATE OR DELETE ON interaction
    FOR EACH ROW EXECUTE FUNCTION huddle_refuse_mutation();

CREATE TRIGGER interaction_no_truncate
    BEFORE TRUNCATE ON interaction
    FOR EACH STATEMENT EXECUTE FUNCTION huddle_refuse_mutation();

-- Claims: the one mutable table. Released rows are expired, never deleted, so an
-- epoch never goes backwards.
CREATE TABLE external_claim (
    key         text PRIMARY KEY,
    holder      text NOT NULL,
    epoch       bigint NOT NULL CHECK (epoch > 0),
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now()
);
