-- Agents' bearer tokens for `huddle mcp --http` (plan 0023). A token is
-- `huddle_<id>_<secret>`; only the blake3 hash of the whole token is stored, so the
-- database never holds a usable secret. `huddle admin token add|list|remove`, run by
-- the administrator, write the table; the servers (relay roles) only read it.
CREATE TABLE agent_token (
    id           text PRIMARY KEY,   -- the token's public part, shown by `token list`
    hash         text NOT NULL,      -- blake3 of the whole token, 64 hex digits
    agent        text NOT NULL,      -- the agent the token acts as
    room         text NOT NULL,      -- the one room it acts in
    capabilities text NOT NULL,      -- JSON array of strings
    created_us   bigint NOT NULL     -- µs since the Unix epoch
);

REVOKE ALL ON agent_token FROM PUBLIC;

-- `huddle admin init` grants this too; here for a database set up before this
-- migration existed.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'huddle_relay') THEN
        GRANT SELECT ON agent_token TO huddle_relay;
    END IF;
END;
$$;
