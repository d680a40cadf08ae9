-- Archived rooms and pruned claims (plan 0057).
--
-- The ledger's one exception to append-only: a room's owner archives a settled room
-- as a whole, after exporting it. huddle_room_archive does it in one transaction: it
-- checks the room (the caller, the row count the export saw, no live claim), records
-- it in archived_room, inserts the room's `room.archived` row and deletes every other
-- row of the room and its claims. From then on the insert trigger refuses every row of
-- the room but that one. Nothing else may delete: relay and writer roles have no
-- DELETE on interaction at all, and the delete trigger refuses the rest (the schema
-- owner and superusers included) unless the row's room is being removed by
-- huddle_room_archive, a mark that lives only inside its transaction.

CREATE TABLE archived_room (
    room        text PRIMARY KEY,
    archived_id bytea NOT NULL CHECK (octet_length(archived_id) = 32),
    rows        bigint NOT NULL CHECK (rows >= 0),
    archived_by text NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    removing    boolean NOT NULL DEFAULT false
);

-- The room a claim key belongs to: `<kind>/<room>/...` for the room-scoped kinds
-- (names hold no `/`); NULL for the others (`relay/<id>`).
CREATE FUNCTION huddle_claim_room(p_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog AS $$
SELECT CASE WHEN split_part(p_key, '/', 1) IN
    ('reply', 'drive', 'task', 'taskdrive', 'review', 'reviewdrive', 'lease', 'resource')
  THEN nullif(split_part(p_key, '/', 2), '') END
$$;

-- UPDATE stays refused by interaction_append_only (0001); DELETE moves to a trigger
-- of its own that lets huddle_room_archive remove the room it is archiving.
DROP TRIGGER interaction_append_only ON interaction;
CREATE TRIGGER interaction_append_only
    BEFORE UPDATE ON interaction
    FOR EACH ROW EXECUTE FUNCTION huddle_refuse_mutation();

CREATE FUNCTION huddle_check_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM archived_room WHERE room = OLD.room AND removing) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'huddle: interactions are append-only (DELETE refused: rows leave the ledger only when the owner archives a settled room, huddle room archive)';
END;
$$;

CREATE TRIGGER interaction_no_delete
    BEFORE DELETE ON interaction
    FOR EACH ROW EXECUTE FUNCTION huddle_check_delete();

-- Nothing is added to an archived room but its own `room.archived` row, and no
-- `room.archived` row is added anywhere but by huddle_room_archive (relays stop
-- serving a room when they read one: a forged one would silence a live room). (A row racing
-- the archive cannot slip in: huddle_room_archive holds a SHARE lock on interaction,
-- which waits for every insert in flight and holds new ones back until it commits;
-- this check then runs with a fresh snapshot and sees the room archived.)
--
-- It runs for every row appended, so it is as cheap as a trigger gets: SECURITY
-- INVOKER with no SET clause (a definer function with `SET search_path` cost about
-- 10 µs more per row, measured), every name and operator schema-qualified, reading
-- archived_room, which every role may read (room names and counts the ledger shows
-- anyway) and only huddle_room_archive writes.
CREATE FUNCTION huddle_check_archived() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.verb OPERATOR(pg_catalog.=) 'room.archived' THEN
        IF NOT EXISTS (SELECT 1 FROM public.archived_room a
                       WHERE a.room OPERATOR(pg_catalog.=) NEW.room
                         AND a.archived_id OPERATOR(pg_catalog.=) NEW.id) THEN
            RAISE EXCEPTION 'huddle: a room.archived row is written only by archiving the room (huddle room archive)'
                USING ERRCODE = 'HUA05';
        END IF;
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM public.archived_room a
               WHERE a.room OPERATOR(pg_catalog.=) NEW.room
                 AND NOT (a.archived_id OPERATOR(pg_catalog.=) NEW.id)) THEN
        RAISE EXCEPTION 'huddle: room % is archived: nothing can be added to it', NEW.room
            USING ERRCODE = 'HUA05',
                  HINT = 'an archived room cannot be reused; choose another room name';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER interaction_archived_room
    BEFORE INSERT ON interaction
    FOR EACH ROW EXECUTE FUNCTION huddle_check_archived();

-- Archives p_room: checks, records, inserts the `room.archived` row (p_id, p_actor,
-- p_body, p_sig; role owner) and removes the room's other rows and its claims.
-- Returns how many rows and claims were removed. Refusals (nothing changed):
--   HUA01 the room does not hold exactly p_rows rows (it changed since the export);
--         DETAIL: the count now
--   HUA02 a claim of the room is live; DETAIL: the live keys
--   HUA03 the caller may not archive it: only the role that wrote the room's first
--         `room.created`, or an administrator (superuser, member of huddle_owner),
--         never a relay role. Inside this SECURITY DEFINER function current_user is
--         the function's owner, so the caller is session_user.
--   HUA04 no such room, or archived already
--   HUA06 the row is not a `room.archived` row recording p_rows
CREATE FUNCTION huddle_room_archive(p_room text, p_rows bigint, p_id bytea, p_actor text,
                                    p_body text, p_sig text)
RETURNS TABLE (o_rows bigint, o_claims bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public
SET lock_timeout = '30s' AS $$
DECLARE
    creator text;
    is_admin boolean;
    is_relay boolean;
    have bigint;
    live text;
    removed bigint;
    claims bigint;
    doc jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM archived_room WHERE room = p_room) THEN
        RAISE EXCEPTION 'huddle: room % is archived already', p_room USING ERRCODE = 'HUA04';
    END IF;
    SELECT i.relay INTO creator FROM interaction i
    WHERE i.room = p_room AND i.verb = 'room.created'
    ORDER BY i.txid, i.seq LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'huddle: there is no room % to archive', p_room USING ERRCODE = 'HUA04';
    END IF;
    is_admin := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user)
        OR (EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_owner')
            AND pg_has_role(session_user, 'huddle_owner', 'MEMBER'));
    is_relay := EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay')
        AND pg_has_role(session_user, 'huddle_relay', 'MEMBER');
    IF NOT coalesce(is_admin, false) AND (is_relay OR creator IS DISTINCT FROM session_user) THEN
        RAISE EXCEPTION 'huddle: role % may not archive room %: only the role that created it (%) or an administrator may',
            session_user, p_room, creator USING ERRCODE = 'HUA03';
    END IF;
    BEGIN
        doc := p_body::jsonb;
    EXCEPTION WHEN others THEN
        doc := NULL;
    END;
    IF doc IS NULL OR jsonb_typeof(doc -> 'rows') IS DISTINCT FROM 'number'
       OR (doc ->> 'rows')::numeric IS DISTINCT FROM p_rows::numeric
       OR octet_length(p_id) IS DISTINCT FROM 32 THEN
        RAISE EXCEPTION 'huddle: not a room.archived row recording % rows', p_rows
            USING ERRCODE = 'HUA06';
    END IF;
    -- The room's claims first, then the table: a fenced append holding one of them
    -- FOR SHARE finishes before this waits for the table, never the other way round.
    PERFORM 1 FROM external_claim WHERE huddle_claim_room(key) = p_room FOR UPDATE;
    LOCK TABLE interaction IN SHARE MODE;
    SELECT count(*) INTO have FROM interaction WHERE room = p_room;
    IF have <> p_rows THEN
        RAISE EXCEPTION 'huddle: room % holds % rows, % were exported: it changed since the export',
            p_room, have, p_rows USING ERRCODE = 'HUA01', DETAIL = have::text;
    END IF;
    SELECT string_agg(key, ' ' ORDER BY key COLLATE "C") INTO live FROM external_claim
    WHERE huddle_claim_room(key) = p_room AND closed_by IS NULL AND expires_at > now();
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'huddle: room % is not settled: live claims %', p_room, live
            USING ERRCODE = 'HUA02', DETAIL = live;
    END IF;
    INSERT INTO archived_room (room, archived_id, rows, archived_by, removing)
    VALUES (p_room, p_id, p_rows, session_user, true);
    INSERT INTO interaction (id, room, verb, actor, role, body, sig)
    VALUES (p_id, p_room, 'room.archived', p_actor, 'owner', p_body, p_sig);
    DELETE FROM interaction WHERE room = p_room AND id <> p_id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM external_claim WHERE huddle_claim_room(key) = p_room;
    GET DIAGNOSTICS claims = ROW_COUNT;
    DELETE FROM resource_scope WHERE room = p_room;
    UPDATE archived_room SET removing = false WHERE room = p_room;
    RETURN QUERY SELECT removed, claims;
END;
$$;

-- Prunes claim rows that can never matter again (plan 0057): `relay/<id>` leases
-- expired for longer than p_older_than_us (their holder names one process, so no later
-- claim can be mistaken for one of theirs; no row carries their epoch), and every
-- claim of an archived room (nothing can be written there again). Returns the counts.
-- Granted to nobody: the administrator runs it (as the owner or a superuser).
CREATE FUNCTION huddle_prune_claims(p_older_than_us bigint)
RETURNS TABLE (o_relay bigint, o_archived bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    relays bigint;
    archived bigint;
BEGIN
    DELETE FROM external_claim
    WHERE starts_with(key, 'relay/') AND closed_by IS NULL
      AND expires_at < now() - greatest(p_older_than_us, 0) * interval '1 microsecond';
    GET DIAGNOSTICS relays = ROW_COUNT;
    DELETE FROM external_claim c
    WHERE EXISTS (SELECT 1 FROM archived_room a WHERE a.room = huddle_claim_room(c.key));
    GET DIAGNOSTICS archived = ROW_COUNT;
    RETURN QUERY SELECT relays, archived;
END;
$$;

REVOKE ALL ON archived_room FROM PUBLIC;
GRANT SELECT ON archived_room TO PUBLIC;
REVOKE ALL ON FUNCTION huddle_check_delete() FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_check_archived() FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_room_archive(text, bigint, bytea, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_prune_claims(bigint) FROM PUBLIC;
