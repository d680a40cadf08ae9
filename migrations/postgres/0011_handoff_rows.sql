-- Plan 0058: a hand-off in one statement.
--
-- `huddle_handoff` takes a batch of claims exactly as `huddle_claim_acquire_batch`
-- (0008) does and, in the same statement and transaction, inserts the rows of every
-- group whose claims were all won at the epochs the caller expected (a relay writes a
-- fresh task's `task.claimed` and `turn.prompted` with its claims: it knows the epochs
-- a never-taken claim starts at). The rows are inserted by the calling role, so the
-- insert trigger checks them as for any fenced append; a group whose conditions do not
-- hold writes nothing. It runs as the caller (SECURITY INVOKER).
--
-- Conditions: parallel arrays of (group, 1-based request index, epoch). Rows: the
-- columns of `huddle_append_under` plus each row's group. Returns one row per request
-- tried (o_kind 0, as `huddle_claim_acquire_batch`) then one per row inserted (o_kind
-- 1: o_id, o_ikey).

CREATE FUNCTION huddle_handoff(
    p_keys text[], p_holders text[], p_ttl_us bigint[], p_after int[],
    p_cond_group int[], p_cond_idx int[], p_cond_epoch bigint[],
    p_row_group int[],
    p_ids bytea[], p_rooms text[], p_threads text[], p_verbs text[], p_actors text[],
    p_roles text[], p_parents bytea[], p_causes bytea[], p_bodies text[], p_ikeys text[],
    p_sigs text[])
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
    FOR r IN SELECT * FROM huddle_claim_acquire_batch(p_keys, p_holders, p_ttl_us, p_after) LOOP
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

REVOKE ALL ON FUNCTION huddle_handoff(text[], text[], bigint[], int[], int[], int[], bigint[],
    int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[],
    text[]) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay') THEN
        GRANT EXECUTE ON FUNCTION huddle_handoff(text[], text[], bigint[], int[], int[], int[],
            bigint[], int[], bytea[], text[], text[], text[], text[], text[], bytea[], bytea[],
            text[], text[], text[]) TO huddle_relay;
    END IF;
END;
$$;
