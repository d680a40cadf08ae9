-- Directed replies (plan 0026): a message naming several agents is answered once by
-- each, under the agent's own reply claim `reply/<room>/<parent>/<agent>`. An agent's
-- reply is accepted under that claim or the message's one claim `reply/<room>/<parent>`;
-- everything else about the check is as in 0003.

CREATE OR REPLACE FUNCTION huddle_check_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    doc jsonb;
    claim_key text;
    own_key text;
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

