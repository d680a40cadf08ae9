-- Plan 0080: task lots.
--
-- A `task.lot` row carries several task turns' rows of one room as items
-- (`{"items": [{verb, actor, role, thread?, parent?, caused_by?, body}, ...]}`); readers
-- unpack it into the items. The insert check applies to every item what it applies to
-- the row the item stands for, all in one statement, and refuses the whole lot when one
-- item fails:
-- - the envelope: role `system`, no thread or causes, a body of exactly 1 to 64 items;
-- - every item a task turn's row (`task.claimed`, `turn.prompted`, `task.completed`,
--   `turn.replied`, `task.failed`, `turn.failed`) by an agent;
-- - no item's agent bound (`huddle admin bind-agent`) to other writers only;
-- - every `task.claimed` / `task.completed` / `task.failed` item under its task claim
--   (`task/<room>/<task>[/<generation>]`) held by the item's actor at the item's epoch,
--   acquired by the writing role, live or closed by this very lot; the claims are
--   locked FOR SHARE until the lot commits, as a single row's are.
-- Everything else is as in 0010.

CREATE FUNCTION huddle_check_lot(p_id bytea, p_room text, p_role text, p_thread text,
                                 p_parent bytea, p_caused_by bytea[], p_body text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    doc jsonb;
    n int;
    bad text;
    fenced int;
    r record;
BEGIN
    -- A duplicate (an idempotent retry) writes nothing: nothing to check.
    IF EXISTS (SELECT 1 FROM interaction WHERE id = p_id) THEN
        RETURN;
    END IF;
    IF p_role IS DISTINCT FROM 'system' OR p_thread IS NOT NULL OR p_parent IS NOT NULL
       OR cardinality(p_caused_by) > 0 THEN
        RAISE EXCEPTION 'huddle: task.lot refused: a lot is a system row with no thread or causes'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    BEGIN
        doc := p_body::jsonb;
    EXCEPTION WHEN others THEN
        doc := NULL;
    END;
    IF doc IS NULL OR jsonb_typeof(doc) IS DISTINCT FROM 'object'
       OR jsonb_typeof(doc -> 'items') IS DISTINCT FROM 'array'
       OR (SELECT count(*) FROM jsonb_object_keys(doc)) <> 1 THEN
        RAISE EXCEPTION 'huddle: task.lot refused: its body is not exactly {"items": [...]}'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    n := jsonb_array_length(doc -> 'items');
    IF n < 1 OR n > 64 THEN
        RAISE EXCEPTION 'huddle: task.lot refused: it has % items; a lot has 1 to 64', n
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT string_agg(i::text, ', ' ORDER BY i) INTO bad
    FROM jsonb_array_elements(doc -> 'items') WITH ORDINALITY AS it(item, i)
    WHERE jsonb_typeof(item) IS DISTINCT FROM 'object'
       OR item ->> 'verb' IS NULL
       OR item ->> 'verb' NOT IN ('task.claimed', 'turn.prompted', 'task.completed',
                                 'turn.replied', 'task.failed', 'turn.failed')
       OR jsonb_typeof(item -> 'role') IS DISTINCT FROM 'string'
       OR item ->> 'role' IS DISTINCT FROM 'agent'
       OR jsonb_typeof(item -> 'actor') IS DISTINCT FROM 'string'
       OR jsonb_typeof(item -> 'body') IS DISTINCT FROM 'object';
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'huddle: task.lot refused: item(s) % (from 1) are not a task turn''s row by an agent', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- An agent the administrator bound to relay roles may be written only by them.
    SELECT string_agg(DISTINCT a.agent, ', ') INTO bad
    FROM (SELECT DISTINCT item ->> 'actor' AS agent
          FROM jsonb_array_elements(doc -> 'items') AS it(item)) a
    WHERE EXISTS (SELECT 1 FROM agent_binding b WHERE b.room = p_room AND b.agent = a.agent)
      AND NOT EXISTS (SELECT 1 FROM agent_binding b
                      WHERE b.room = p_room AND b.agent = a.agent AND b.writer = session_user);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'huddle: role % may not write as agent(s) % in room %: bound to other writers (huddle admin bind-agent)',
            session_user, bad, p_room
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'host the agent on a relay it is bound to, or ask the administrator to bind it to this role';
    END IF;
    -- The fenced items: every one names a task and an epoch ...
    SELECT count(*),
           string_agg(i::text, ', ' ORDER BY i) FILTER (
               WHERE NOT (coalesce(jsonb_typeof(item -> 'body' -> 'task') = 'string', false)
                          AND CASE
                                WHEN jsonb_typeof(item -> 'body' -> 'epoch') = 'number'
                                     AND (item -> 'body' ->> 'epoch') ~ '^[0-9]{1,19}$'
                                THEN (item -> 'body' ->> 'epoch')::numeric
                                     <= 9223372036854775807
                                ELSE false
                              END))
    INTO fenced, bad
    FROM jsonb_array_elements(doc -> 'items') WITH ORDINALITY AS it(item, i)
    WHERE item ->> 'verb' IN ('task.claimed', 'task.completed', 'task.failed');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'huddle: task.lot refused: item(s) % (from 1) name no task and claim epoch', bad
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF fenced = 0 THEN
        RETURN;
    END IF;
    -- ... under its claim, live and held by its actor at its epoch for this role, or
    -- closed by this lot; locked until the lot commits. One primary-key probe per
    -- item, as a single row's check makes (a join over the items would be planned
    -- once, generically, as a scan of every claim).
    FOR r IN
        SELECT 'task/' || p_room || '/' || (item -> 'body' ->> 'task')
                 || CASE WHEN jsonb_typeof(item -> 'body' -> 'generation') = 'number'
                              AND (item -> 'body' ->> 'generation') ~ '^[1-9][0-9]{0,9}$'
                         THEN '/' || (item -> 'body' ->> 'generation') ELSE '' END AS key,
               item ->> 'actor' AS holder,
               (item -> 'body' ->> 'epoch')::bigint AS epoch
        FROM jsonb_array_elements(doc -> 'items') AS it(item)
        WHERE item ->> 'verb' IN ('task.claimed', 'task.completed', 'task.failed')
    LOOP
        PERFORM 1 FROM external_claim x
        WHERE x.key = r.key AND x.holder = r.holder AND x.epoch = r.epoch
          AND x.acquired_by = session_user
          AND ((x.closed_by IS NULL AND x.expires_at > now()) OR x.closed_by = p_id)
        FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'huddle: task.lot refused: claim % is not live and held by % at epoch % for role %',
                r.key, r.holder, r.epoch, session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION huddle_check_lot(bytea, text, text, text, bytea, bytea[], text) FROM PUBLIC;

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
    IF NEW.verb = 'task.lot' THEN
        PERFORM huddle_check_lot(NEW.id, NEW.room, NEW.role, NEW.thread, NEW.parent,
                                 NEW.caused_by, NEW.body);
        RETURN NEW;
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
    IF NEW.verb IN ('task.claimed', 'task.completed', 'task.failed', 'task.released',
                    'task.reviewed') THEN
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
        IF NEW.verb = 'task.reviewed' THEN
            claim_key := 'review/' || NEW.room || '/' || (doc ->> 'task');
        ELSE
            claim_key := 'task/' || NEW.room || '/' || (doc ->> 'task');
        END IF;
        -- A later generation (after a retry or a rejection) is claimed under its own
        -- key (plans 0052, 0053).
        IF jsonb_typeof(doc -> 'generation') = 'number'
           AND (doc ->> 'generation') ~ '^[1-9][0-9]{0,9}$' THEN
            claim_key := claim_key || '/' || (doc ->> 'generation');
        END IF;
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
