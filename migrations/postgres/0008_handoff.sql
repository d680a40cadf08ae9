-- Cheaper hand-offs (plan 0034): the same checks as migration 0003, in fewer round
-- trips and with cached plans.
--
-- * `huddle_claim_acquire` becomes PL/pgSQL: a SQL-language SECURITY DEFINER function
--   is never inlined, so its body was parsed and planned again on every call; PL/pgSQL
--   keeps its plans for the session. Same signature, same answers.
-- * `huddle_claim_acquire_batch` takes several claims in one statement, in the order
--   given (callers pass them in byte order of the key, so two batches never wait for
--   each other's rows in opposite orders); a request may name an earlier one that must
--   have been won for it to be tried (a task's drive claim after its task claim).
-- * `huddle_append_under` is a fenced append in one statement: every fence checked (and
--   closed, for a closing append) exactly as `huddle_claim_fence[_close]` do, then the
--   rows inserted by the calling role, so the insert trigger (0003, 0004, 0006) checks them as
--   before. A fence that does not hold raises SQLSTATE HUF01 naming it, and the
--   statement writes nothing. It runs as the caller (SECURITY INVOKER).

CREATE OR REPLACE FUNCTION huddle_claim_acquire(p_key text, p_holder text, p_ttl_us bigint)
RETURNS TABLE (o_holder text, o_epoch bigint, o_expires_us bigint, o_won boolean,
               o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    c_expires timestamptz;
BEGIN
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
    -- A live claim is extended only for the role that acquired it: the same holder
    -- name presented by another role finds it held.
    WHERE c.closed_by IS NULL
      AND (c.expires_at <= now()
           OR (c.holder = EXCLUDED.holder AND c.acquired_by = EXCLUDED.acquired_by))
    RETURNING c.holder, c.epoch, c.expires_at INTO o_holder, o_epoch, c_expires;
    IF FOUND THEN
        o_expires_us := (extract(epoch FROM c_expires) * 1000000)::int8;
        o_won := true;
        o_closed_by := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    -- Not applied: the row is locked by the upsert, and this statement's snapshot is
    -- newer than it, so the row as it stands is read.
    SELECT x.holder, x.epoch, (extract(epoch FROM x.expires_at) * 1000000)::int8, false,
           x.closed_by
    INTO o_holder, o_epoch, o_expires_us, o_won, o_closed_by
    FROM external_claim x WHERE x.key = p_key;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END;
$$;

CREATE FUNCTION huddle_claim_acquire_batch(p_keys text[], p_holders text[],
                                           p_ttl_us bigint[], p_after int[])
RETURNS TABLE (o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n int := coalesce(array_length(p_keys, 1), 0);
    won boolean[] := array_fill(false, ARRAY[greatest(n, 1)]);
    r record;
BEGIN
    IF coalesce(array_length(p_holders, 1), 0) <> n OR coalesce(array_length(p_ttl_us, 1), 0) <> n
       OR coalesce(array_length(p_after, 1), 0) <> n THEN
        RAISE EXCEPTION 'huddle: a batch acquire needs one holder, lease and condition per key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. n LOOP
        -- p_after[i] = 0: unconditional; j > 0: only when request j (earlier) was won.
        IF p_after[i] < 0 OR p_after[i] >= i THEN
            RAISE EXCEPTION 'huddle: request % of a batch acquire waits for request %, which is not before it',
                i, p_after[i] USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_after[i] > 0 AND NOT won[p_after[i]] THEN
            CONTINUE;
        END IF;
        SELECT * INTO r FROM huddle_claim_acquire(p_keys[i], p_holders[i], p_ttl_us[i]);
        IF FOUND THEN
            won[i] := r.o_won;
            o_idx := i;
            o_holder := r.o_holder;
            o_epoch := r.o_epoch;
            o_expires_us := r.o_expires_us;
            o_won := r.o_won;
            o_closed_by := r.o_closed_by;
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;

CREATE FUNCTION huddle_append_under(
    p_keys text[], p_holders text[], p_epochs bigint[], p_close bytea,
    p_ids bytea[], p_rooms text[], p_threads text[], p_verbs text[], p_actors text[],
    p_roles text[], p_parents bytea[], p_causes bytea[], p_bodies text[], p_ikeys text[],
    p_sigs text[])
RETURNS TABLE (o_id bytea, o_ikey text)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
DECLARE
    held boolean;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF p_close IS NULL THEN
            held := huddle_claim_fence(p_keys[i], p_holders[i], p_epochs[i]);
        ELSE
            held := huddle_claim_fence_close(p_keys[i], p_holders[i], p_epochs[i], p_close);
        END IF;
        IF NOT coalesce(held, false) THEN
            RAISE EXCEPTION 'huddle: fence % (%) does not hold', i, p_keys[i]
                USING ERRCODE = 'HUF01', DETAIL = i::text;
        END IF;
    END LOOP;
    IF coalesce(array_length(p_ids, 1), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO interaction AS x
        (id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key, sig)
    SELECT t.id, t.room, t.thread, t.verb, t.actor, t.role, t.parent,
           CASE WHEN octet_length(t.causes) = 0 THEN '{}'::bytea[]
                ELSE ARRAY(SELECT substring(t.causes FROM g * 32 + 1 FOR 32)
                           FROM generate_series(0, octet_length(t.causes) / 32 - 1) AS g
                           ORDER BY g)
           END,
           t.body, t.ikey, t.sig
    FROM unnest(p_ids, p_rooms, p_threads, p_verbs, p_actors, p_roles, p_parents, p_causes,
                p_bodies, p_ikeys, p_sigs)
         WITH ORDINALITY AS t(id, room, thread, verb, actor, role, parent, causes, body,
                              ikey, sig, ord)
    ORDER BY t.ord
    ON CONFLICT DO NOTHING
    RETURNING x.id, x.idempotency_key;
END;
$$;

REVOKE ALL ON FUNCTION huddle_claim_acquire_batch(text[], text[], bigint[], int[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_append_under(text[], text[], bigint[], bytea, bytea[], text[],
    text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[]) FROM PUBLIC;

-- `huddle admin init` grants these too; here for a database set up before this
-- migration existed.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay') THEN
        GRANT EXECUTE ON FUNCTION huddle_claim_acquire_batch(text[], text[], bigint[], int[])
            TO huddle_relay;
        GRANT EXECUTE ON FUNCTION huddle_append_under(text[], text[], bigint[], bytea,
            bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[])
            TO huddle_relay;
    END IF;
END;
$$;
