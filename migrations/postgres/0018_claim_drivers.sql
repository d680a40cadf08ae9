-- Plan 0094: one claim a task turn.
--
-- A claim taken to drive its holder's turn records the relay that drives it
-- (`driver`). A live claim is extended only for the same holder, role *and* driver
-- (NULL and NULL count as the same); the same holder for another driver finds it
-- held. So a task claim held by an agent elects the one relay that runs the agent's
-- turn too, even when several relays (of one role) host the agent: the task-drive
-- claim it replaces is no longer taken. Renew, release and the fences need not name
-- the driver: it changes only when a lapsed claim is re-taken, which moves the epoch.
--
-- `huddle_claim_acquire_batch` and `huddle_handoff` gain a last parameter, the
-- drivers (one per request, NULL for none); their former signatures stay, taking
-- every claim without a driver, for relays of the release before.

ALTER TABLE external_claim ADD COLUMN driver text;

CREATE FUNCTION huddle_claim_acquire_batch(p_keys text[], p_holders text[],
                                           p_ttl_us bigint[], p_after int[],
                                           p_drivers text[])
RETURNS TABLE (o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n int := coalesce(array_length(p_keys, 1), 0);
    won boolean[] := array_fill(false, ARRAY[greatest(n, 1)]);
    c_expires timestamptz;
    c_holder text;
    c_by text;
    c_closed bytea;
    c_driver text;
BEGIN
    IF coalesce(array_length(p_holders, 1), 0) <> n OR coalesce(array_length(p_ttl_us, 1), 0) <> n
       OR coalesce(array_length(p_after, 1), 0) <> n
       OR coalesce(array_length(p_drivers, 1), 0) <> n THEN
        RAISE EXCEPTION 'huddle: a batch acquire needs one holder, lease, condition and driver per key'
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
        -- A claim that cannot be won is answered as it stands, unlocked.
        SELECT x.holder, x.epoch, x.expires_at, x.acquired_by, x.closed_by, x.driver
        INTO c_holder, o_epoch, c_expires, c_by, c_closed, c_driver
        FROM external_claim x WHERE x.key = p_keys[i];
        IF FOUND AND (c_closed IS NOT NULL
                      OR (c_expires > now()
                          AND NOT (c_holder = p_holders[i] AND c_by = session_user
                                   AND c_driver IS NOT DISTINCT FROM p_drivers[i]))) THEN
            o_idx := i;
            o_holder := c_holder;
            o_expires_us := (extract(epoch FROM c_expires) * 1000000)::int8;
            o_won := false;
            o_closed_by := c_closed;
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO external_claim AS c
            (key, holder, epoch, expires_at, acquired_at, renewed_at, acquired_by, driver)
        VALUES (p_keys[i], p_holders[i], 1, now() + p_ttl_us[i] * interval '1 microsecond',
                now(), now(), session_user, p_drivers[i])
        ON CONFLICT (key) DO UPDATE SET
            holder = EXCLUDED.holder,
            driver = EXCLUDED.driver,
            epoch = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                         THEN c.epoch ELSE c.epoch + 1 END,
            expires_at = EXCLUDED.expires_at,
            acquired_at = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                               THEN c.acquired_at ELSE now() END,
            acquired_by = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > now()
                               THEN c.acquired_by ELSE EXCLUDED.acquired_by END,
            renewed_at = now()
        -- A live claim is extended only for the role that acquired it and the driver
        -- it was taken for: the same holder name presented by another role, or for
        -- another driver, finds it held (so a live claim's driver never changes, and
        -- the epochs the CASEs keep are the same holder's, role's and driver's).
        WHERE c.closed_by IS NULL
          AND (c.expires_at <= now()
               OR (c.holder = EXCLUDED.holder AND c.acquired_by = EXCLUDED.acquired_by
                   AND c.driver IS NOT DISTINCT FROM EXCLUDED.driver))
        RETURNING c.holder, c.epoch, c.expires_at INTO o_holder, o_epoch, c_expires;
        IF FOUND THEN
            won[i] := true;
            o_idx := i;
            o_expires_us := (extract(epoch FROM c_expires) * 1000000)::int8;
            o_won := true;
            o_closed_by := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Not applied: the row is locked by the upsert, and this statement's snapshot
        -- is newer than it, so the row as it stands is read.
        SELECT x.holder, x.epoch, (extract(epoch FROM x.expires_at) * 1000000)::int8, false,
               x.closed_by
        INTO o_holder, o_epoch, o_expires_us, o_won, o_closed_by
        FROM external_claim x WHERE x.key = p_keys[i];
        IF FOUND THEN
            o_idx := i;
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION huddle_claim_acquire_batch(p_keys text[], p_holders text[],
                                                      p_ttl_us bigint[], p_after int[])
RETURNS TABLE (o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
SELECT * FROM huddle_claim_acquire_batch(
    p_keys, p_holders, p_ttl_us, p_after,
    array_fill(NULL::text, ARRAY[coalesce(array_length(p_keys, 1), 0)]))
$$;

CREATE OR REPLACE FUNCTION huddle_claim_acquire(p_key text, p_holder text, p_ttl_us bigint)
RETURNS TABLE (o_holder text, o_epoch bigint, o_expires_us bigint, o_won boolean,
               o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    RETURN QUERY
    SELECT b.o_holder, b.o_epoch, b.o_expires_us, b.o_won, b.o_closed_by
    FROM huddle_claim_acquire_batch(ARRAY[p_key], ARRAY[p_holder], ARRAY[p_ttl_us],
                                    ARRAY[0], ARRAY[NULL::text]) AS b;
END;
$$;

CREATE FUNCTION huddle_handoff(
    p_keys text[], p_holders text[], p_ttl_us bigint[], p_after int[],
    p_cond_group int[], p_cond_idx int[], p_cond_epoch bigint[],
    p_row_group int[],
    p_ids bytea[], p_rooms text[], p_threads text[], p_verbs text[], p_actors text[],
    p_roles text[], p_parents bytea[], p_causes bytea[], p_bodies text[], p_ikeys text[],
    p_sigs text[], p_drivers text[])
RETURNS TABLE (o_kind int, o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea, o_id bytea, o_ikey text)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
DECLARE
    n int := coalesce(array_length(p_keys, 1), 0);
    won_epoch bigint[] := array_fill(0::bigint, ARRAY[greatest(n, 1)]);
    ok_groups int[];
    r record;
BEGIN
    IF coalesce(array_length(p_cond_idx, 1), 0) <> coalesce(array_length(p_cond_group, 1), 0)
       OR coalesce(array_length(p_cond_epoch, 1), 0) <> coalesce(array_length(p_cond_group, 1), 0)
       OR coalesce(array_length(p_row_group, 1), 0) <> coalesce(array_length(p_ids, 1), 0) THEN
        RAISE EXCEPTION 'huddle: a hand-off needs one group, request and epoch per condition, and one group per row'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR r IN SELECT * FROM huddle_claim_acquire_batch(p_keys, p_holders, p_ttl_us, p_after, p_drivers) LOOP
        o_kind := 0;
        o_idx := r.o_idx;
        o_holder := r.o_holder;
        o_epoch := r.o_epoch;
        o_expires_us := r.o_expires_us;
        o_won := r.o_won;
        o_closed_by := r.o_closed_by;
        o_id := NULL;
        o_ikey := NULL;
        IF r.o_won THEN
            won_epoch[r.o_idx] := r.o_epoch;
        END IF;
        RETURN NEXT;
    END LOOP;
    SELECT array_agg(DISTINCT g.grp) INTO ok_groups
    FROM unnest(p_cond_group) AS g(grp)
    WHERE NOT EXISTS (
        SELECT 1 FROM unnest(p_cond_group, p_cond_idx, p_cond_epoch) AS c(grp, idx, epoch)
        WHERE c.grp = g.grp
          AND (c.idx < 1 OR c.idx > n OR won_epoch[c.idx] IS DISTINCT FROM c.epoch));
    IF ok_groups IS NULL OR coalesce(array_length(p_ids, 1), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO interaction AS x
            (id, room, thread, verb, actor, role, parent, caused_by, body, idempotency_key, sig)
        SELECT t.id, t.room, t.thread, t.verb, t.actor, t.role, t.parent,
               CASE WHEN octet_length(t.causes) = 0 THEN '{}'::bytea[]
                    ELSE ARRAY(SELECT substring(t.causes FROM s * 32 + 1 FOR 32)
                               FROM generate_series(0, octet_length(t.causes) / 32 - 1) AS s
                               ORDER BY s)
               END,
               t.body, t.ikey, t.sig
        FROM unnest(p_row_group, p_ids, p_rooms, p_threads, p_verbs, p_actors, p_roles,
                    p_parents, p_causes, p_bodies, p_ikeys, p_sigs)
             WITH ORDINALITY AS t(grp, id, room, thread, verb, actor, role, parent, causes,
                                  body, ikey, sig, ord)
        WHERE t.grp = ANY (ok_groups)
        ORDER BY t.ord
        ON CONFLICT DO NOTHING
        RETURNING x.id, x.idempotency_key)
    SELECT 1, NULL::int, NULL::text, NULL::bigint, NULL::bigint, NULL::boolean, NULL::bytea,
           ins.id, ins.idempotency_key
    FROM ins;
END;
$$;

CREATE OR REPLACE FUNCTION huddle_handoff(
    p_keys text[], p_holders text[], p_ttl_us bigint[], p_after int[],
    p_cond_group int[], p_cond_idx int[], p_cond_epoch bigint[],
    p_row_group int[],
    p_ids bytea[], p_rooms text[], p_threads text[], p_verbs text[], p_actors text[],
    p_roles text[], p_parents bytea[], p_causes bytea[], p_bodies text[], p_ikeys text[],
    p_sigs text[])
RETURNS TABLE (o_kind int, o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea, o_id bytea, o_ikey text)
LANGUAGE sql SET search_path = pg_catalog, public AS $$
SELECT * FROM huddle_handoff(
    p_keys, p_holders, p_ttl_us, p_after, p_cond_group, p_cond_idx, p_cond_epoch,
    p_row_group, p_ids, p_rooms, p_threads, p_verbs, p_actors, p_roles, p_parents,
    p_causes, p_bodies, p_ikeys, p_sigs,
    array_fill(NULL::text, ARRAY[coalesce(array_length(p_keys, 1), 0)]))
$$;

REVOKE ALL ON FUNCTION huddle_claim_acquire_batch(text[], text[], bigint[], int[], text[])
    FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_handoff(text[], text[], bigint[], int[], int[], int[], bigint[],
    int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[],
    text[], text[]) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay') THEN
        GRANT EXECUTE ON FUNCTION huddle_claim_acquire_batch(text[], text[], bigint[], int[],
            text[]) TO huddle_relay;
        GRANT EXECUTE ON FUNCTION huddle_handoff(text[], text[], bigint[], int[], int[], int[], bigint[],
    int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[],
    text[], text[]) TO huddle_relay;
    END IF;
END;
$$;
