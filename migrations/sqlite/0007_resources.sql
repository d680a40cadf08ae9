-- Versioned shared state (plan 0043): a `state.put` row must carry the idempotency key
-- `state/<room>/<version>/<key>` and, past version 1, its predecessor must be in the
-- ledger, so versions of a key are dense and the unique index on idempotency keys
-- keeps one row per version. (Resource leases need no schema on SQLite: an
-- acquisition is one BEGIN IMMEDIATE transaction over external_claim.)
CREATE TRIGGER interaction_state_put BEFORE INSERT ON interaction
WHEN NEW.verb = 'state.put'
BEGIN
    SELECT RAISE(ABORT, 'huddle: state.put refused: it must carry the idempotency key state/<room>/<version>/<key> of a version whose predecessor is in the ledger')
    WHERE NOT (
        json_valid(NEW.body)
        AND json_type(NEW.body, '$.version') = 'integer'
        AND json_extract(NEW.body, '$.version') >= 1
        AND json_type(NEW.body, '$.key') = 'text'
        AND NEW.idempotency_key IS ('state/' || NEW.room || '/'
            || json_extract(NEW.body, '$.version') || '/' || json_extract(NEW.body, '$.key'))
        AND (json_extract(NEW.body, '$.version') = 1 OR EXISTS (
            SELECT 1 FROM interaction p
            WHERE p.idempotency_key = 'state/' || NEW.room || '/'
                || (json_extract(NEW.body, '$.version') - 1) || '/' || json_extract(NEW.body, '$.key')
              AND p.verb = 'state.put')));
END;
