-- Trust: a task's `task.claimed` / `task.completed` / `task.failed` / `task.released`
-- row and an agent's reply (`message.posted`, role agent, with a parent) are accepted
-- only when the claim they name (`task/<room>/<task>` at the body's epoch, or
-- `reply/<room>/<parent>`) is held by the row's actor and is live or was closed by
-- this very row. The check runs in the inserting transaction. SQLite has no roles:
-- whoever can write the file can drop these triggers (see docs/security.md).
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
          AND c.holder = NEW.actor
          AND c.epoch = json_extract(NEW.body, '$.epoch')
          AND ((c.closed_by IS NULL
                AND c.expires_at > (CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000))
               OR c.closed_by = NEW.id));
END;

CREATE TRIGGER interaction_reply_fence BEFORE INSERT ON interaction
WHEN NEW.verb = 'message.posted' AND NEW.role = 'agent' AND NEW.parent IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'huddle: agent reply refused: its reply claim is not live and held by its actor')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND NOT EXISTS (
        SELECT 1 FROM external_claim c
        WHERE c.key = 'reply/' || NEW.room || '/' || lower(hex(NEW.parent))
          AND c.holder = NEW.actor
          AND ((c.closed_by IS NULL
                AND c.expires_at > (CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000))
               OR c.closed_by = NEW.id));
END;
