-- Plan 0067: a batch acquire without a function call per claim.
--
-- `huddle_claim_acquire_batch` (0008) called `huddle_claim_acquire` once per request:
-- a SECURITY DEFINER call with its own `SET search_path` (the setting saved and
-- restored each time) and a set-returning call materialised in a tuplestore, which
-- together cost about as much as the upsert itself. The batch is already SECURITY
-- DEFINER with the same search path, so it now runs the same upsert and the same read
-- of a claim not won itself. Same signature, same answers, same order of rows locked.
-- `huddle_claim_acquire` becomes the batch of one (same signature and answers), so the
-- upsert is written in one place.

CREATE OR REPLACE FUNCTION huddle_claim_acquire_batch(p_keys text[], p_holders text[],
                                                      p_ttl_us bigint[], p_after int[])
RETURNS TABLE (o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n int := coalesce(array_length(p_keys, 1), 0);
    won boolean[] := array_fill(false, ARRAY[greatest(n, 1)]);
    c_expires timestamptz;
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
        INSERT INTO external_claim AS c
            (key, holder, epoch, expires_at, acquired_at, renewed_at, acquired_by)
        VALUES (p_keys[i], p_holders[i], 1, now() + p_ttl_us[i] * interval '1 microsecond',
                now(), now(), session_user)
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

CREATE OR REPLACE FUNCTION huddle_claim_acquire(p_key text, p_holder text, p_ttl_us bigint)
RETURNS TABLE (o_holder text, o_epoch bigint, o_expires_us bigint, o_won boolean,
               o_closed_by bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    RETURN QUERY
    SELECT b.o_holder, b.o_epoch, b.o_expires_us, b.o_won, b.o_closed_by
    FROM huddle_claim_acquire_batch(ARRAY[p_key], ARRAY[p_holder], ARRAY[p_ttl_us],
                                    ARRAY[0]) AS b;
END;
$$;
