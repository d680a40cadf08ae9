-- The database floor of a task hand-off, today and with "lots" (plan 0078).
--
-- Not part of huddle: throwaway wrappers for `scripts/lot-floor/run.sh`, loaded into a
-- scratch database that `huddle migrate` set up. Each wrapper builds the arrays a relay
-- sends and calls huddle's own functions (`huddle_handoff`, `huddle_append_under`), so
-- the claims, the fences, the insert triggers and the indexes are the real ones.
--
-- today: a hand-off of K fresh tasks (task + task-drive claim each, `task.claimed` and
--        `turn.prompted` rows), then one completion per task (`task.completed` and
--        `turn.replied`, closing its two claims), each its own transaction.
-- lot:   the same claims, but one container row per hand-off and one per completion
--        (the K items' bodies inside it), plus the set query a container row's insert
--        check would run (every item's task claim held, at its epoch, in one query).

CREATE SEQUENCE floor_task;

CREATE FUNCTION floor_id(p text) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT decode(md5(p) || md5(p || '.'), 'hex')
$$;

CREATE FUNCTION floor_check_lot(p_keys text[], p_holders text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    SELECT count(*) INTO n FROM external_claim x
    JOIN unnest(p_keys, p_holders) AS w(key, holder) ON x.key = w.key
    WHERE x.holder = w.holder AND x.epoch = 1 AND x.acquired_by = session_user;
    IF n <> coalesce(array_length(p_keys, 1), 0) THEN
        RAISE EXCEPTION 'floor: % of % lot claims held', n, array_length(p_keys, 1);
    END IF;
END;
$$;

-- Hand off tasks base .. base + k - 1 in one statement.
CREATE FUNCTION floor_handoff(p_base bigint, p_k int, p_lot boolean) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := '{}'; holders text[] := '{}'; ttl bigint[] := '{}'; after int[] := '{}';
    cg int[] := '{}'; ci int[] := '{}'; ce bigint[] := '{}'; rg int[] := '{}';
    ids bytea[] := '{}'; rooms text[] := '{}'; threads text[] := '{}'; verbs text[] := '{}';
    actors text[] := '{}'; roles text[] := '{}'; parents bytea[] := '{}';
    causes bytea[] := '{}'; bodies text[] := '{}'; ikeys text[] := '{}'; sigs text[] := '{}';
    items text[] := '{}'; tkeys text[] := '{}'; tholders text[] := '{}';
    t text; agent text; claimed text; prompted text; n int;
BEGIN
    FOR j IN 0 .. p_k - 1 LOOP
        t := 'task-' || (p_base + j);
        agent := 'agent-' || ((p_base + j) % 16);
        keys := keys || ('task/floor/' || t) || ('taskdrive/floor/' || t);
        holders := holders || agent || 'relay-1'::text;
        ttl := ttl || 30000000::bigint || 30000000::bigint;
        after := after || 0 || (2 * j + 1);
        tkeys := tkeys || ('task/floor/' || t);
        tholders := tholders || agent;
        claimed := '{"attempt":1,"epoch":1,"task":"' || t || '"}';
        prompted := '{"drive_epoch":1,"epoch":1,"subject":{"id":"' || t
            || '","kind":"task","label":"fetch the pricing and product pages of Initech Pay"},"turn":"t/floor/'
            || t || '/' || agent || '/1.1"}';
        IF p_lot THEN
            cg := cg || 1 || 1; ci := ci || (2 * j + 1) || (2 * j + 2);
            ce := ce || 1::bigint || 1::bigint;
            items := items || ('{"agent":"' || agent || '","claimed":' || claimed
                                || ',"prompted":' || prompted || '}');
        ELSE
            cg := cg || (j + 1) || (j + 1); ci := ci || (2 * j + 1) || (2 * j + 2);
            ce := ce || 1::bigint || 1::bigint;
            rg := rg || (j + 1) || (j + 1);
            ids := ids || floor_id('c' || t) || floor_id('p' || t);
            rooms := rooms || 'floor'::text || 'floor'::text;
            threads := threads || NULL::text || NULL::text;
            verbs := verbs || 'task.claimed'::text || 'turn.prompted'::text;
            actors := actors || agent || agent;
            roles := roles || 'agent'::text || 'agent'::text;
            parents := parents || NULL::bytea || NULL::bytea;
            causes := causes || ''::bytea || ''::bytea;
            bodies := bodies || claimed || prompted;
            ikeys := ikeys || NULL::text || NULL::text;
            sigs := sigs || NULL::text || NULL::text;
        END IF;
    END LOOP;
    IF p_lot THEN
        rg := ARRAY[1];
        ids := ARRAY[floor_id('lot-c' || p_base)];
        rooms := ARRAY['floor']; threads := ARRAY[NULL::text]; verbs := ARRAY['task.lot'];
        actors := ARRAY['relay-1']; roles := ARRAY['system']; parents := ARRAY[NULL::bytea];
        causes := ARRAY[''::bytea];
        bodies := ARRAY['{"items":[' || array_to_string(items, ',') || ']}'];
        ikeys := ARRAY[NULL::text]; sigs := ARRAY[NULL::text];
    END IF;
    SELECT count(*) FILTER (WHERE o_kind = 1) INTO n
    FROM huddle_handoff(keys, holders, ttl, after, cg, ci, ce, rg, ids, rooms, threads,
                        verbs, actors, roles, parents, causes, bodies, ikeys, sigs);
    IF p_lot THEN
        PERFORM floor_check_lot(tkeys, tholders);
    END IF;
    IF n <> coalesce(array_length(ids, 1), 0) THEN
        RAISE EXCEPTION 'floor: hand-off wrote % of % rows', n, array_length(ids, 1);
    END IF;
    RETURN n;
END;
$$;

-- Complete tasks base + from .. base + from + k - 1 in one statement.
CREATE FUNCTION floor_complete(p_base bigint, p_from int, p_k int, p_lot boolean) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := '{}'; holders text[] := '{}'; epochs bigint[] := '{}';
    ids bytea[] := '{}'; rooms text[] := '{}'; threads text[] := '{}'; verbs text[] := '{}';
    actors text[] := '{}'; roles text[] := '{}'; parents bytea[] := '{}';
    causes bytea[] := '{}'; bodies text[] := '{}'; ikeys text[] := '{}'; sigs text[] := '{}';
    items text[] := '{}'; tkeys text[] := '{}'; tholders text[] := '{}';
    t text; agent text; replied text; completed text; n int; first_id bytea;
BEGIN
    FOR j IN p_from .. p_from + p_k - 1 LOOP
        t := 'task-' || (p_base + j);
        agent := 'agent-' || ((p_base + j) % 16);
        keys := keys || ('task/floor/' || t) || ('taskdrive/floor/' || t);
        holders := holders || agent || 'relay-1'::text;
        epochs := epochs || 1::bigint || 1::bigint;
        tkeys := tkeys || ('task/floor/' || t);
        tholders := tholders || agent;
        replied := '{"epoch":1,"subject":{"id":"' || t
            || '","kind":"task","label":"fetch the pricing and product pages of Initech Pay"},"tokens":542,"turn":"t/floor/'
            || t || '/' || agent || '/1.1"}';
        completed := '{"epoch":1,"result":"' || agent || ' finished ' || t
            || '","task":"' || t || '","tokens":542}';
        IF p_lot THEN
            items := items || ('{"agent":"' || agent || '","replied":' || replied
                                || ',"completed":' || completed || '}');
        ELSE
            ids := ids || floor_id('d' || t) || floor_id('r' || t);
            rooms := rooms || 'floor'::text || 'floor'::text;
            threads := threads || NULL::text || NULL::text;
            verbs := verbs || 'task.completed'::text || 'turn.replied'::text;
            actors := actors || agent || agent;
            roles := roles || 'agent'::text || 'agent'::text;
            parents := parents || NULL::bytea || NULL::bytea;
            causes := causes || ''::bytea || ''::bytea;
            bodies := bodies || completed || replied;
            ikeys := ikeys || NULL::text || NULL::text;
            sigs := sigs || NULL::text || NULL::text;
        END IF;
    END LOOP;
    IF p_lot THEN
        ids := ARRAY[floor_id('lot-d' || p_base || '/' || p_from)];
        rooms := ARRAY['floor']; threads := ARRAY[NULL::text]; verbs := ARRAY['task.lot'];
        actors := ARRAY['relay-1']; roles := ARRAY['system']; parents := ARRAY[NULL::bytea];
        causes := ARRAY[''::bytea];
        bodies := ARRAY['{"items":[' || array_to_string(items, ',') || ']}'];
        ikeys := ARRAY[NULL::text]; sigs := ARRAY[NULL::text];
        PERFORM floor_check_lot(tkeys, tholders);
    END IF;
    first_id := ids[1];
    SELECT count(*) INTO n
    FROM huddle_append_under(keys, holders, epochs, first_id, ids, rooms, threads, verbs,
                             actors, roles, parents, causes, bodies, ikeys, sigs);
    IF n <> array_length(ids, 1) THEN
        RAISE EXCEPTION 'floor: completion wrote % of % rows', n, array_length(ids, 1);
    END IF;
    RETURN n;
END;
$$;

-- The plain-SQL queue of `huddle bench tasks`.
CREATE TABLE floor_jobs (id bigint PRIMARY KEY, dep bigint, state smallint NOT NULL);
CREATE INDEX ON floor_jobs (id) WHERE state = 1;
CREATE INDEX ON floor_jobs (dep);
CREATE TABLE floor_done (id bigint NOT NULL, worker int NOT NULL, at timestamptz NOT NULL DEFAULT now());
