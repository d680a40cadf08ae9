-- Plan 0053: review gates.
--
-- A reviewer's verdict (`task.reviewed`) on a task's submission is accepted only under
-- the live review claim `review/<room>/<task>[/<generation>]` held by the row's actor
-- at the body's epoch (or closed by this very row), like the task rows of 0009.
-- Everything else is as in 0009.

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

