-- Trust: the database decides who wrote a row and whether the claim it names is live.
--
-- * Every interaction row's `relay` is the writing role (`session_user`); the insert
--   trigger refuses any other value.
-- * Each claim records the role that acquired it (`acquired_by`). Relays use claims
--   only through the SECURITY DEFINER functions below, which act for the calling
--   role alone: a relay role needs no UPDATE on external_claim.
-- * A task's `task.claimed` / `task.completed` / `task.failed` / `task.released` row
--   and an agent's reply (`message.posted`, role agent, with a parent) are accepted
--   only when the claim they name (`task/<room>/<task>` at the body's epoch, or
--   `reply/<room>/<parent>`) is held by the row's actor, was acquired by the writing
--   role, and is live or was closed by this very row.
--
-- Roles (the schema owner, huddle_relay, huddle_reader) and their grants are made by
-- `huddle admin init`; this migration only revokes what PUBLIC would otherwise get.

ALTER TABLE external_claim ADD COLUMN acquired_by text NOT NULL DEFAULT session_user;

CREATE FUNCTION huddle_claim_acquire(p_key text, p_holder text, p_ttl_us bigint)
RETURNS TABLE (o_holder text, o_epoch bigint, o_expires_us bigint, o_won boolean,
               o_closed_by bytea)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
WITH up AS (
INSERT INTO external_claim AS c
    (key, holder, epoch, expires_at, acquired_at, renewed_at, acquired_by)
VALUES (p_key, p_holder, 1, now() + p_ttl_us * interval '1 microsecond', now(), now(),
        session_user)
ON CONFLICT (key) DO UPDATE SET
    holder = EXCLUDED.holder,
    epoch = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                 THEN c.epoch ELSE c.epoch + 1 END,
    expires_at = EXCLUDED.expires_at,
    acquired_at = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                       THEN c.acquired_at ELSE now() END,
    acquired_by = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                       THEN c.acquired_by ELSE EXCLUDED.acquired_by END,
    renewed_at = now()
-- A live claim is extended only for the role that acquired it: the same holder name
-- presented by another role finds it held.
WHERE c.closed_by IS NULL
  AND (c.expires_at <= now()
       OR (c.holder = EXCLUDED.holder AND c.acquired_by = EXCLUDED.acquired_by))
RETURNING c.holder, c.epoch, c.expires_at)
SELECT holder, epoch, (extract(epoch FROM expires_at) * 1000000)::int8, true, NULL::bytea
FROM up
UNION ALL
SELECT x.holder, x.epoch, (extract(epoch FROM x.expires_at) * 1000000)::int8, false,
       x.closed_by
FROM external_claim x WHERE x.key = p_key AND NOT EXISTS (SELECT 1 FROM up)
$$;

CREATE FUNCTION huddle_claim_renew(p_key text, p_holder text, p_epoch bigint,
                                   p_ttl_us bigint)
RETURNS TABLE (o_holder text, o_epoch bigint, o_expires_us bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
UPDATE external_claim
SET expires_at = now() + p_ttl_us * interval '1 microsecond', renewed_at = now()
WHERE key = p_key AND holder = p_holder AND epoch = p_epoch AND closed_by IS NULL
  AND expires_at > now() AND acquired_by = session_user
RETURNING holder, epoch, (extract(epoch FROM expires_at) * 1000000)::int8
$$;

CREATE FUNCTION huddle_claim_release(p_key text, p_holder text, p_epoch bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    UPDATE external_claim SET expires_at = now()
    WHERE key = p_key AND holder = p_holder AND epoch = p_epoch AND expires_at > now()
      AND acquired_by = session_user;
    RETURN FOUND;
END;
$$;

-- The fence of an append: the claim is still exactly (key, holder, epoch), unexpired,
-- not closed and acquired by the calling role; locked FOR SHARE until the append's
-- transaction ends.
CREATE FUNCTION huddle_claim_fence(p_key text, p_holder text, p_epoch bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM 1 FROM external_claim
    WHERE key = p_key AND holder = p_holder AND epoch = p_epoch AND closed_by IS NULL
      AND expires_at > now() AND acquired_by = session_user
    FOR SHARE;
    RETURN FOUND;
END;
$$;

-- The fence of a closing append: checks the claim as huddle_claim_fence does and
-- closes it with p_by; a claim already closed by p_by passes (an idempotent retry).
CREATE FUNCTION huddle_claim_fence_close(p_key text, p_holder text, p_epoch bigint,
                                         p_by bytea)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    UPDATE external_claim SET closed_by = p_by, expires_at = least(expires_at, now())
    WHERE key = p_key AND holder = p_holder AND epoch = p_epoch
      AND acquired_by = session_user
      AND ((closed_by IS NULL AND expires_at > now()) OR closed_by = p_by);
    RETURN FOUND;
END;
$$;

CREATE FUNCTION huddle_check_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    doc jsonb;
    claim_key text;
    want_epoch bigint;
BEGIN
    IF NEW.relay IS DISTINCT FROM session_user THEN
        RAISE EXCEPTION 'huddle: role % may not write a row attributed to %',
            session_user, NEW.relay
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'the relay column is always the writing role; leave it out';
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
    ELSIF NEW.verb = 'message.posted' AND NEW.role = 'agent' AND NEW.parent IS NOT NULL THEN
        claim_key := 'reply/' || NEW.room || '/' || encode(NEW.parent, 'hex');
    ELSE
        RETURN NEW;
    END IF;
    -- A duplicate (an idempotent retry) writes nothing: nothing to check.
    IF EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id) THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM external_claim x
    WHERE x.key = claim_key AND x.holder = NEW.actor
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

CREATE TRIGGER interaction_checked
    BEFORE INSERT ON interaction
    FOR EACH ROW EXECUTE FUNCTION huddle_check_insert();

REVOKE ALL ON FUNCTION huddle_claim_acquire(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_claim_renew(text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_claim_release(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_claim_fence(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_claim_fence_close(text, text, bigint, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_check_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_refuse_mutation() FROM PUBLIC;
