-- Plan 0090: one relay writes an owner command's results, elected by the claim
-- `cmdresult/<room>/<command>`. Such a claim belongs to its room: archiving the room
-- removes it, and `prune-claims` treats it as the room's. The list of room-scoped
-- kinds is `ROOM_CLAIM_KINDS` in huddle-core.
CREATE OR REPLACE FUNCTION huddle_claim_room(p_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog AS $$
SELECT CASE WHEN split_part(p_key, '/', 1) IN
    ('reply', 'drive', 'task', 'taskdrive', 'review', 'reviewdrive', 'lease', 'resource',
     'cmdresult')
  THEN nullif(split_part(p_key, '/', 2), '') END
$$;
