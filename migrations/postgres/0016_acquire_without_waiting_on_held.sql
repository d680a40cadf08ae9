-- Plan 0088: a batch acquire does not wait on a claim it cannot win.
--
-- A relay sends its finished turns' results (under the claims they close) and its
-- next hand-off (acquiring the claims of the tasks it hands out) as one statement
-- (plan 0082): `huddle_append_under` locks the fences in key order, then
-- `huddle_handoff` the acquisitions in key order — two orders. A relay asks for a
-- task whose `task.claimed` it has not read yet; when two relays' statements cross —
-- one writing under `b` and asking for `a`, the other writing under `a` and asking for
-- `b` — each held one row and waited for the other's: a deadlock, found after the
-- server's `deadlock_timeout` and one statement aborted. Short of that, such a
-- request waited for the other relay's whole statement to commit only to be refused.
--
-- Every request of a batch now reads its claim first: one another holder keeps live
-- (or that the same holder name keeps for another role), or a closed one, cannot be
-- won, and is answered as the claim stands, without taking its row lock. Only a claim
-- that is free, lapsed or the requester's own is upserted (and locked) as before. The
-- answers are the ones the upsert gave: the upsert's own condition, negated.
-- (Locking every row of the statement in one key order first was tried: it holds the
-- contended rows for the whole statement, and three relays' hand-offs slowed by a
-- third.)

CREATE OR REPLACE FUNCTION huddle_claim_acquire_batch(p_keys text[], p_holders text[],
                                                      p_ttl_us bigint[], p_after int[])
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
        -- A claim that cannot be won is answered as it stands, unlocked.
        SELECT x.holder, x.epoch, x.expires_at, x.acquired_by, x.closed_by
        INTO c_holder, o_epoch, c_expires, c_by, c_closed
        FROM external_claim x WHERE x.key = p_keys[i];
        IF FOUND AND (c_closed IS NOT NULL
                      OR (c_expires > now()
                          AND NOT (c_holder = p_holders[i] AND c_by = session_user))) THEN
            o_idx := i;
            o_holder := c_holder;
            o_expires_us := (extract(epoch FROM c_expires) * 1000000)::int8;
            o_won := false;
            o_closed_by := c_closed;
            RETURN NEXT;
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
