-- Plans 0031 and 0032.
--
-- * Writers' row signatures (0031): a writer that signs stores, beside each row it
--   writes, `ed25519:<public key hex>:<signature hex>` over its name (the `relay`
--   column, here the writing role) and the row's content id. Like `relay` it is not
--   part of the content. Readers verify it on every read (Postgres has no Ed25519);
--   the owner registers writers' keys with `!config relay-keys`.
-- * Agents bound to relay roles (0032): `agent_binding` is kept by the administrator
--   (`huddle admin bind-agent`, `unbind-agent`, `sync-agents`); the insert check
--   refuses a role-`agent` row whose actor is bound in its room to other roles.
--   Relays may read the table, never write it.

ALTER TABLE interaction ADD COLUMN sig text;

CREATE TABLE agent_binding (
    room     text NOT NULL,
    agent    text NOT NULL,
    writer   text NOT NULL,     -- a relay's database role
    bound_us bigint NOT NULL,   -- µs since the Unix epoch
    PRIMARY KEY (room, agent, writer)
);

REVOKE ALL ON agent_binding FROM PUBLIC;

-- `huddle admin init` grants this too; here for a database set up before this
-- migration existed.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_reader') THEN
        GRANT SELECT ON agent_binding TO huddle_reader;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION huddle_check_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    doc jsonb;
    claim_key text;
    own_key text;
    want_epoch bigint;
    bound_to text;
    bound_here boolean;
BEGIN
    IF NEW.relay IS DISTINCT FROM session_user THEN
        RAISE EXCEPTION 'huddle: role % may not write a row attributed to %',
            session_user, NEW.relay
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'the relay column is always the writing role; leave it out';
    END IF;
    -- An agent the administrator bound to relay roles may be written only by them.
    IF NEW.role = 'agent' THEN
        SELECT string_agg(b.writer, ', ' ORDER BY b.writer),
               bool_or(b.writer = session_user)
        INTO bound_to, bound_here
        FROM agent_binding b WHERE b.room = NEW.room AND b.agent = NEW.actor;
        -- (A duplicate writes nothing, so it is not refused.)
        IF bound_to IS NOT NULL AND NOT bound_here
           AND NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id) THEN
            RAISE EXCEPTION 'huddle: role % may not write as agent % in room %: it is bound to % (huddle admin bind-agent)',
                session_user, NEW.actor, NEW.room, bound_to
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'host the agent on a relay it is bound to, or ask the administrator to bind it to this role';
        END IF;
    END IF;
    IF NEW.verb IN ('task.claimed', 'task.completed', 'task.failed', 'task.released') THEN
        BEGIN
            doc := NEW.body::jsonb;
            want_epoch := (doc ->> 'epoch')::bigint;
        EXCEPTION WHEN others THEN
            want_epoch := NULL;
        END;
        IF want_epoch IS NULL OR jsonb_typeof(doc -> 'epoch') IS DISTINCT FROM 'number'
           OR jsonb_typeof(doc -> 'task') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'huddle: % refused: its body names no task and claim epoch',
                NEW.verb USING ERRCODE = 'insufficient_privilege';
        END IF;
        claim_key := 'task/' || NEW.room || '/' || (doc ->> 'task');
        own_key := claim_key;
    ELSIF NEW.verb = 'message.posted' AND NEW.role = 'agent' AND NEW.parent IS NOT NULL THEN
        claim_key := 'reply/' || NEW.room || '/' || encode(NEW.parent, 'hex');
        -- A message naming several agents: each replies under its own claim.
        own_key := claim_key || '/' || NEW.actor;
    ELSE
        RETURN NEW;
    END IF;
    -- A duplicate (an idempotent retry) writes nothing: nothing to check.
    IF EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id) THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM external_claim x
    WHERE x.key IN (claim_key, own_key) AND x.holder = NEW.actor
      AND (want_epoch IS NULL OR x.epoch = want_epoch)
      AND x.acquired_by = session_user
      AND ((x.closed_by IS NULL AND x.expires_at > now()) OR x.closed_by = NEW.id)
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'huddle: % refused: claim % is not live and held by % at epoch % for role %',
            NEW.verb, claim_key, NEW.actor, coalesce(want_epoch::text, 'any'), session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

