-- Directed replies (plan 0026): a message naming several agents is answered once by
-- each, under the agent's own reply claim `reply/<room>/<parent>/<agent>`. An agent's
-- reply is accepted under that claim or the message's one claim `reply/<room>/<parent>`.
DROP TRIGGER interaction_reply_fence;

CREATE TRIGGER interaction_reply_fence BEFORE INSERT ON interaction
WHEN NEW.verb = 'message.posted' AND NEW.role = 'agent' AND NEW.parent IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'huddle: agent reply refused: its reply claim is not live and held by its actor')
    WHERE NOT EXISTS (SELECT 1 FROM interaction WHERE id = NEW.id)
      AND NOT EXISTS (
        SELECT 1 FROM external_claim c
        WHERE c.key IN ('reply/' || NEW.room || '/' || lower(hex(NEW.parent)),
                        'reply/' || NEW.room || '/' || lower(hex(NEW.parent)) || '/' || NEW.actor)
          AND c.holder = NEW.actor
          AND ((c.closed_by IS NULL
                AND c.expires_at > (CAST(round(unixepoch('subsec') * 1000.0) AS INTEGER) * 1000))
               OR c.closed_by = NEW.id));
END;
