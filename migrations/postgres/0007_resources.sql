-- Shared resources and versioned shared state (plans 0042, 0043).
--
-- * Resource leases are claims `resource/<room>/<holder>/<mode>/<name>`, taken only
--   through huddle_resource_acquire: one transaction that locks the room's row of
--   resource_scope, reads the room's live resource claims at the database clock,
--   applies the conflict rule (glob overlap for `file:` resources, exact names for
--   the others; exclusive, shared, permits) and upserts every wanted claim, or
--   changes nothing and returns the holdings in the way. Renew and release are the
--   claim functions of 0003.
-- * A `state.put` row must carry the idempotency key `state/<room>/<version>/<key>`
--   and, past version 1, its predecessor must be in the ledger: versions of a key are
--   dense, and the unique index on idempotency keys keeps one row per version.

ALTER TABLE external_claim ADD COLUMN resource_room text;
CREATE INDEX external_claim_resource_room ON external_claim (resource_room)
    WHERE resource_room IS NOT NULL;

-- One row per room that ever had a resource acquisition: its row lock serializes the
-- room's acquisitions.
CREATE TABLE resource_scope (room text PRIMARY KEY);

-- Whether two segment patterns share a string: `*` is any run of characters, `?` one
-- character, anything else itself. The dynamic programme of huddle-core's glob.rs,
-- over the same canonical text: ok[i][j] says a[i..] and b[j..] share a string.
CREATE FUNCTION huddle_segment_overlap(p text, q text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog AS $$
DECLARE
    a text[] := regexp_split_to_array(p, '');
    b text[] := regexp_split_to_array(q, '');
    n int := coalesce(array_length(a, 1), 0);
    m int := coalesce(array_length(b, 1), 0);
    w int := m + 1;
    ok boolean[];
    i int;
    j int;
    v boolean;
    sa boolean;
    sb boolean;
BEGIN
    IF p = '' THEN n := 0; END IF;
    IF q = '' THEN m := 0; w := 1; END IF;
    ok := array_fill(false, ARRAY[(n + 1) * w]);
    FOR i IN REVERSE n..0 LOOP
        FOR j IN REVERSE m..0 LOOP
            IF i = n AND j = m THEN
                v := true;
            ELSE
                sa := i < n AND a[i + 1] = '*';
                sb := j < m AND b[j + 1] = '*';
                v := (sa AND ok[(i + 1) * w + j + 1]) OR (sb AND ok[i * w + j + 2]);
                IF NOT v AND i < n AND j < m THEN
                    IF sa AND NOT sb THEN
                        v := ok[i * w + j + 2];
                    ELSIF sb AND NOT sa THEN
                        v := ok[(i + 1) * w + j + 1];
                    ELSIF NOT sa AND NOT sb THEN
                        v := (a[i + 1] = b[j + 1] OR a[i + 1] = '?' OR b[j + 1] = '?')
                             AND ok[(i + 1) * w + j + 2];
                    END IF;
                END IF;
            END IF;
            ok[i * w + j + 1] := coalesce(v, false);
        END LOOP;
    END LOOP;
    RETURN ok[1];
END;
$$;

-- Whether two path globs (canonical text) match a common path: the same programme
-- over `/`-separated segments, where a `**` segment is any run of segments.
CREATE FUNCTION huddle_glob_overlap(p text, q text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, public AS $$
DECLARE
    a text[] := string_to_array(p, '/');
    b text[] := string_to_array(q, '/');
    n int := coalesce(array_length(a, 1), 0);
    m int := coalesce(array_length(b, 1), 0);
    w int := m + 1;
    ok boolean[];
    i int;
    j int;
    v boolean;
    sa boolean;
    sb boolean;
BEGIN
    ok := array_fill(false, ARRAY[(n + 1) * w]);
    FOR i IN REVERSE n..0 LOOP
        FOR j IN REVERSE m..0 LOOP
            IF i = n AND j = m THEN
                v := true;
            ELSE
                sa := i < n AND a[i + 1] = '**';
                sb := j < m AND b[j + 1] = '**';
                v := (sa AND ok[(i + 1) * w + j + 1]) OR (sb AND ok[i * w + j + 2]);
                IF NOT v AND i < n AND j < m THEN
                    IF sa AND NOT sb THEN
                        v := ok[i * w + j + 2];
                    ELSIF sb AND NOT sa THEN
                        v := ok[(i + 1) * w + j + 1];
                    ELSIF NOT sa AND NOT sb THEN
                        v := ok[(i + 1) * w + j + 2]
                             AND huddle_segment_overlap(a[i + 1], b[j + 1]);
                    END IF;
                END IF;
            END IF;
            ok[i * w + j + 1] := coalesce(v, false);
        END LOOP;
    END LOOP;
    RETURN ok[1];
END;
$$;

-- Whether two resource names can stand for a common thing: same kind, and equal
-- names, or (kind `file`) overlapping globs.
CREATE FUNCTION huddle_resource_touches(a text, b text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, public AS $$
SELECT CASE
    WHEN split_part(a, ':', 1) <> split_part(b, ':', 1) THEN false
    WHEN a = b THEN true
    WHEN split_part(a, ':', 1) = 'file' THEN huddle_glob_overlap(substr(a, 6), substr(b, 6))
    ELSE false
END
$$;

-- The live resource claims of a room at p_at, read back from their keys; `own` when
-- held by p_holder for the calling role.
CREATE FUNCTION huddle_resource_live(p_room text, p_holder text, p_at timestamptz)
RETURNS TABLE (key text, holder text, epoch bigint, expires_us bigint, mode text,
               name text, own boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, public AS $$
SELECT x.key, x.holder, x.epoch, (extract(epoch FROM x.expires_at) * 1000000)::int8,
       split_part(r.rest, '/', 2),
       substr(r.rest, length(split_part(r.rest, '/', 1)) + length(split_part(r.rest, '/', 2)) + 3),
       x.holder = p_holder AND x.acquired_by = session_user
FROM external_claim x
CROSS JOIN LATERAL (SELECT substr(x.key, length(p_room) + 11) AS rest) r
WHERE x.resource_room = p_room
  AND x.closed_by IS NULL
  AND x.expires_at > p_at
  AND starts_with(x.key, 'resource/' || p_room || '/')
  AND split_part(r.rest, '/', 1) = x.holder
  AND (split_part(r.rest, '/', 2) IN ('exclusive', 'shared')
       OR split_part(r.rest, '/', 2) ~ '^permits-[1-9][0-9]{0,3}$')
$$;

-- Takes every wanted resource (p_names[k] in mode p_modes[k], in the order given:
-- the caller's global order) for p_holder in p_room, all or nothing. Returns one row
-- per wanted resource with o_won = true, or the holdings in the way with o_won =
-- false (o_wanted names the resource each blocks) and changes nothing.
CREATE FUNCTION huddle_resource_acquire(p_room text, p_holder text, p_names text[],
                                        p_modes text[], p_ttl_us bigint)
RETURNS TABLE (o_wanted text, o_key text, o_holder text, o_epoch bigint,
               o_expires_us bigint, o_won boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n_wanted int := coalesce(array_length(p_names, 1), 0);
    t timestamptz;
    k int;
    got bigint;
    blocked boolean := false;
    n_touching bigint;
    n_other bigint;
    cap int;
    new_key text;
BEGIN
    IF p_room IS NULL OR p_room = '' OR strpos(p_room, '/') > 0
       OR p_holder IS NULL OR p_holder = '' OR strpos(p_holder, '/') > 0 THEN
        RAISE EXCEPTION 'huddle: resource acquire: room and holder must be names without ''/'''
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n_wanted = 0 OR n_wanted > 64 OR n_wanted <> coalesce(array_length(p_modes, 1), 0) THEN
        RAISE EXCEPTION 'huddle: resource acquire: 1 to 64 resources, one mode each'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR k IN 1..n_wanted LOOP
        IF p_names[k] IS NULL OR p_names[k] !~ '^[a-z][a-z0-9_-]{0,31}:.'
           OR p_modes[k] IS NULL
           OR NOT (p_modes[k] IN ('exclusive', 'shared')
                   OR p_modes[k] ~ '^permits-[1-9][0-9]{0,3}$') THEN
            RAISE EXCEPTION 'huddle: resource acquire: bad resource % or mode %',
                p_names[k], p_modes[k] USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    INSERT INTO resource_scope (room) VALUES (p_room) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM resource_scope s WHERE s.room = p_room FOR UPDATE;
    t := clock_timestamp();

    FOR k IN 1..n_wanted LOOP
        IF p_modes[k] = 'exclusive' THEN
            RETURN QUERY SELECT p_names[k], l.key, l.holder, l.epoch, l.expires_us, false
                FROM huddle_resource_live(p_room, p_holder, t) l
                WHERE NOT l.own AND huddle_resource_touches(l.name, p_names[k])
                ORDER BY l.key COLLATE "C";
        ELSIF p_modes[k] = 'shared' THEN
            RETURN QUERY SELECT p_names[k], l.key, l.holder, l.epoch, l.expires_us, false
                FROM huddle_resource_live(p_room, p_holder, t) l
                WHERE NOT l.own AND huddle_resource_touches(l.name, p_names[k])
                  AND l.mode <> 'shared'
                ORDER BY l.key COLLATE "C";
        ELSE
            SELECT count(*), count(*) FILTER (WHERE l.mode NOT LIKE 'permits-%'),
                   least(substr(p_modes[k], 9)::int,
                         min(substr(l.mode, 9)::int) FILTER (WHERE l.mode LIKE 'permits-%'))
            INTO n_touching, n_other, cap
            FROM huddle_resource_live(p_room, p_holder, t) l
            WHERE NOT l.own AND huddle_resource_touches(l.name, p_names[k]);
            IF n_other > 0 THEN
                RETURN QUERY SELECT p_names[k], l.key, l.holder, l.epoch, l.expires_us, false
                    FROM huddle_resource_live(p_room, p_holder, t) l
                    WHERE NOT l.own AND huddle_resource_touches(l.name, p_names[k])
                      AND l.mode NOT LIKE 'permits-%'
                    ORDER BY l.key COLLATE "C";
            ELSIF n_touching >= cap THEN
                RETURN QUERY SELECT p_names[k], l.key, l.holder, l.epoch, l.expires_us, false
                    FROM huddle_resource_live(p_room, p_holder, t) l
                    WHERE NOT l.own AND huddle_resource_touches(l.name, p_names[k])
                    ORDER BY l.key COLLATE "C";
            ELSE
                CONTINUE;
            END IF;
        END IF;
        GET DIAGNOSTICS got = ROW_COUNT;
        blocked := blocked OR got > 0;
    END LOOP;
    IF blocked THEN
        RETURN;
    END IF;

    FOR k IN 1..n_wanted LOOP
        -- A holding of the same resource in another mode is given back.
        UPDATE external_claim x SET expires_at = t
        FROM huddle_resource_live(p_room, p_holder, t) l
        WHERE x.key = l.key AND l.own AND l.name = p_names[k] AND l.mode <> p_modes[k];
        new_key := 'resource/' || p_room || '/' || p_holder || '/' || p_modes[k] || '/'
                   || p_names[k];
        RETURN QUERY
        INSERT INTO external_claim AS c
            (key, holder, epoch, expires_at, acquired_at, renewed_at, acquired_by,
             resource_room)
        VALUES (new_key, p_holder, 1, t + p_ttl_us * interval '1 microsecond', t, t,
                session_user, p_room)
        ON CONFLICT (key) DO UPDATE SET
            holder = EXCLUDED.holder,
            epoch = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > t
                         THEN c.epoch ELSE c.epoch + 1 END,
            expires_at = EXCLUDED.expires_at,
            acquired_at = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > t
                               THEN c.acquired_at ELSE t END,
            acquired_by = CASE WHEN c.holder = EXCLUDED.holder AND c.expires_at > t
                               THEN c.acquired_by ELSE EXCLUDED.acquired_by END,
            renewed_at = t,
            resource_room = EXCLUDED.resource_room
        WHERE c.closed_by IS NULL
          AND (c.expires_at <= t
               OR (c.holder = EXCLUDED.holder AND c.acquired_by = EXCLUDED.acquired_by))
        RETURNING p_names[k], c.key, c.holder, c.epoch,
                  (extract(epoch FROM c.expires_at) * 1000000)::int8, true;
        GET DIAGNOSTICS got = ROW_COUNT;
        IF got = 0 THEN
            RAISE EXCEPTION 'huddle: resource claim % is closed or held for another role', new_key
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
END;
$$;

-- A state.put carries the idempotency key of its version, and its predecessor exists.
CREATE FUNCTION huddle_check_state_put() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    doc jsonb;
    v bigint;
    k text;
BEGIN
    BEGIN
        doc := NEW.body::jsonb;
        IF jsonb_typeof(doc -> 'version') = 'number' AND jsonb_typeof(doc -> 'key') = 'string' THEN
            v := (doc ->> 'version')::bigint;
            k := doc ->> 'key';
        END IF;
    EXCEPTION WHEN others THEN
        v := NULL;
    END;
    IF v IS NULL OR v < 1 OR k IS NULL THEN
        RAISE EXCEPTION 'huddle: state.put refused: its body names no key and version'
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.idempotency_key IS DISTINCT FROM ('state/' || NEW.room || '/' || v || '/' || k) THEN
        RAISE EXCEPTION 'huddle: state.put refused: version % of % must carry the idempotency key %',
            v, k, 'state/' || NEW.room || '/' || v || '/' || k
            USING ERRCODE = 'check_violation';
    END IF;
    IF v > 1 AND NOT EXISTS (
        SELECT 1 FROM interaction
        WHERE idempotency_key = 'state/' || NEW.room || '/' || (v - 1) || '/' || k
          AND verb = 'state.put') THEN
        RAISE EXCEPTION 'huddle: state.put refused: version % of % has no version % before it',
            v, k, v - 1 USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER interaction_state_put
    BEFORE INSERT ON interaction
    FOR EACH ROW WHEN (NEW.verb = 'state.put')
    EXECUTE FUNCTION huddle_check_state_put();

REVOKE ALL ON resource_scope FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_resource_acquire(text, text, text[], text[], bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_resource_live(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION huddle_check_state_put() FROM PUBLIC;
