-- Plan 0088: a write then a hand-off locks its claims in one key order.
--
-- A relay sends its finished turns' results (under the claims they close) and its
-- next hand-off (acquiring the claims of the tasks it hands out) as one statement
-- (plan 0082). `huddle_append_under` locked the fences in key order, then
-- `huddle_handoff` the acquisitions in key order: two orders, not one. Two relays
-- whose statements cross — one writing under `b` and asking for `a`, the other
-- writing under `a` and asking for `b`, as a relay does for a task whose claim it has
-- not yet read — could each hold one row and wait for the other: a deadlock, found
-- after the server's `deadlock_timeout` and one statement aborted.
--
-- `huddle_append_then_handoff` first locks every existing claim row either part
-- names, in key order (bytewise: the key's collation is "C", migration 0015), then
-- runs the two functions as before. A key with no row yet is inserted by the
-- acquisition, in key order, as any batch acquire does.

CREATE FUNCTION huddle_claim_lock(p_keys text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    -- The rows are locked as they come out of the sort (the lock is above it in the
    -- plan): in key order. FOR NO KEY UPDATE is what the fences' close and the
    -- acquisitions' upsert take themselves.
    PERFORM 1 FROM external_claim WHERE key = ANY (p_keys) ORDER BY key FOR NO KEY UPDATE;
END;
$$;

CREATE FUNCTION huddle_append_then_handoff(
    p_fence_keys text[], p_fence_holders text[], p_fence_epochs bigint[], p_close bytea,
    p_w_ids bytea[], p_w_rooms text[], p_w_threads text[], p_w_verbs text[],
    p_w_actors text[], p_w_roles text[], p_w_parents bytea[], p_w_causes bytea[],
    p_w_bodies text[], p_w_ikeys text[], p_w_sigs text[],
    p_keys text[], p_holders text[], p_ttl_us bigint[], p_after int[],
    p_cond_group int[], p_cond_idx int[], p_cond_epoch bigint[],
    p_row_group int[],
    p_ids bytea[], p_rooms text[], p_threads text[], p_verbs text[], p_actors text[],
    p_roles text[], p_parents bytea[], p_causes bytea[], p_bodies text[], p_ikeys text[],
    p_sigs text[])
RETURNS TABLE (o_kind int, o_idx int, o_holder text, o_epoch bigint, o_expires_us bigint,
               o_won boolean, o_closed_by bytea, o_id bytea, o_ikey text)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM huddle_claim_lock(p_fence_keys || p_keys);
    -- The write's inserted rows (o_kind 2); a fence that does not hold raises HUF01
    -- and the whole statement is undone.
    RETURN QUERY
    SELECT 2, NULL::int, NULL::text, NULL::bigint, NULL::bigint, NULL::boolean, NULL::bytea,
           w.o_id, w.o_ikey
    FROM huddle_append_under(p_fence_keys, p_fence_holders, p_fence_epochs, p_close,
                             p_w_ids, p_w_rooms, p_w_threads, p_w_verbs, p_w_actors,
                             p_w_roles, p_w_parents, p_w_causes, p_w_bodies, p_w_ikeys,
                             p_w_sigs) AS w;
    RETURN QUERY
    SELECT h.o_kind, h.o_idx, h.o_holder, h.o_epoch, h.o_expires_us, h.o_won,
           h.o_closed_by, h.o_id, h.o_ikey
    FROM huddle_handoff(p_keys, p_holders, p_ttl_us, p_after, p_cond_group, p_cond_idx,
                        p_cond_epoch, p_row_group, p_ids, p_rooms, p_threads, p_verbs,
                        p_actors, p_roles, p_parents, p_causes, p_bodies, p_ikeys,
                        p_sigs) AS h;
END;
$$;

REVOKE ALL ON FUNCTION huddle_claim_lock(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_append_then_handoff(text[], text[], bigint[], bytea, bytea[],
    text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[],
    text[], text[], bigint[], int[], int[], int[], bigint[], int[], bytea[], text[], text[],
    text[], text[], text[], bytea[], bytea[], text[], text[], text[]) FROM PUBLIC;

-- `huddle admin init` grants these too; here for a database set up before this
-- migration existed.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay') THEN
        GRANT EXECUTE ON FUNCTION huddle_claim_lock(text[]) TO huddle_relay;
        GRANT EXECUTE ON FUNCTION huddle_append_then_handoff(text[], text[], bigint[], bytea,
            bytea[], text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[],
            text[], text[], text[], bigint[], int[], int[], int[], bigint[], int[], bytea[],
            text[], text[], text[], text[], text[], bytea[], bytea[], text[], text[], text[])
            TO huddle_relay;
    END IF;
END;
$$;
