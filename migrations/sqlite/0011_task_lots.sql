-- Plan 0080: task lots. A `task.lot` row carries several task turns' rows of one room
-- as items (`{"items": [{verb, actor, role, thread?, parent?, caused_by?, body}, ...]}`);
-- readers unpack it into the items. The insert check applies to every item what 0008
-- applies to the row it stands for, and refuses the whole lot when one item fails:
-- role `system`, no thread or causes, 1 to 64 items, each a task turn's row by an
-- agent, and every `task.claimed` / `task.completed` / `task.failed` item under its
-- task claim `task/<room>/<task>[/<generation>]`, held by the item's actor at the
-- item's epoch, live or closed by this very lot.
-- (SQLite runs the triggers of one event latest first: the shape is checked first.)
CREATE TRIGGER interaction_lot_fence BEFORE INSERT ON interaction
WHEN NEW.verb = 'task.lot'
BEGIN
    SELECT RAISE(ABORT, 'huddle: task.lot refused: an item''s task claim is not live and held by its actor at its epoch')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND EXISTS (
        SELECT 1 FROM json_each(NEW.body, '$.items') it
        WHERE json_extract(it.value, '$.verb') IN ('task.claimed', 'task.completed', 'task.failed')
          AND NOT EXISTS (
            SELECT 1 FROM external_claim c
            WHERE json_type(it.value, '$.body.task') = 'text'
              AND json_type(it.value, '$.body.epoch') = 'integer'
              AND c.key = 'task/' || NEW.room || '/' || json_extract(it.value, '$.body.task')
                          || CASE
                               WHEN json_type(it.value, '$.body.generation') = 'integer'
                                    AND json_extract(it.value, '$.body.generation') > 0
                               THEN '/' || json_extract(it.value, '$.body.generation')
                               ELSE ''
                             END
              AND c.holder = json_extract(it.value, '$.actor')
              AND c.epoch = json_extract(it.value, '$.body.epoch')
              AND ((c.closed_by IS NULL
                    AND c.expires_at > (CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000))
                   OR c.closed_by = NEW.id)));
END;

CREATE TRIGGER interaction_lot_shape BEFORE INSERT ON interaction
WHEN NEW.verb = 'task.lot'
BEGIN
    SELECT RAISE(ABORT, 'huddle: task.lot refused: it is not a system row of 1 to 64 task turn rows by agents')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND (NEW.role IS NOT 'system' OR NEW.thread IS NOT NULL OR NEW.parent IS NOT NULL
           OR length(NEW.caused_by) > 0
           OR NOT json_valid(NEW.body)
           OR json_type(NEW.body) IS NOT 'object'
           OR json_type(NEW.body, '$.items') IS NOT 'array'
           OR (SELECT count(*) FROM json_each(NEW.body)) <> 1
           OR json_array_length(NEW.body, '$.items') NOT BETWEEN 1 AND 64
           OR EXISTS (
               SELECT 1 FROM json_each(NEW.body, '$.items') it
               WHERE it.type IS NOT 'object'
                  OR json_type(it.value, '$.verb') IS NOT 'text'
                  OR json_extract(it.value, '$.verb') NOT IN
                       ('task.claimed', 'turn.prompted', 'task.completed', 'turn.replied',
                        'task.failed', 'turn.failed')
                  OR json_type(it.value, '$.role') IS NOT 'text'
                  OR json_extract(it.value, '$.role') IS NOT 'agent'
                  OR json_type(it.value, '$.actor') IS NOT 'text'
                  OR json_type(it.value, '$.body') IS NOT 'object'));
END;
