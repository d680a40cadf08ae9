-- Plan 0052: task generations. A retried task (the owner's `!retry`) is claimed under
-- `task/<room>/<task>/<generation>` (generation 0 keeps `task/<room>/<task>`), and its
-- task rows carry the generation in the body (absent = 0): the fence trigger of 0003
-- names the claim of that generation.
DROP TRIGGER interaction_task_fence;

CREATE TRIGGER interaction_task_fence BEFORE INSERT ON interaction
WHEN NEW.verb IN ('task.claimed', 'task.completed', 'task.failed', 'task.released')
BEGIN
    SELECT RAISE(ABORT, 'huddle: task row refused: its claim is not live and held by its actor at its epoch')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND NOT EXISTS (
        SELECT 1 FROM external_claim c
        WHERE json_valid(NEW.body)
          AND json_type(NEW.body, '$.task') = 'text'
          AND json_type(NEW.body, '$.epoch') = 'integer'
          AND c.key = 'task/' || NEW.room || '/' || json_extract(NEW.body, '$.task')
                      || CASE
                           WHEN json_type(NEW.body, '$.generation') = 'integer'
                                AND json_extract(NEW.body, '$.generation') > 0
                           THEN '/' || json_extract(NEW.body, '$.generation')
                           ELSE ''
                         END
          AND c.holder = NEW.actor
          AND c.epoch = json_extract(NEW.body, '$.epoch')
          AND ((c.closed_by IS NULL
                AND c.expires_at > (CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000))
               OR c.closed_by = NEW.id));
END;
