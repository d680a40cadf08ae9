-- Plan 0053: review gates. A reviewer's verdict (`task.reviewed`) is accepted only
-- under the live review claim `review/<room>/<task>[/<generation>]` held by its actor at
-- the body's epoch, or closed by this very row (as the task rows of 0008).
CREATE TRIGGER interaction_review_fence BEFORE INSERT ON interaction
WHEN NEW.verb = 'task.reviewed'
BEGIN
    SELECT RAISE(ABORT, 'huddle: review row refused: its review claim is not live and held by its actor at its epoch')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND NOT EXISTS (
        SELECT 1 FROM external_claim c
        WHERE json_valid(NEW.body)
          AND json_type(NEW.body, '$.task') = 'text'
          AND json_type(NEW.body, '$.epoch') = 'integer'
          AND c.key = 'review/' || NEW.room || '/' || json_extract(NEW.body, '$.task')
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
