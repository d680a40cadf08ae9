-- Agents' bearer tokens for `huddle mcp --http` (plan 0023). A token is
-- `huddle_<id>_<secret>`; only the blake3 hash of the whole token is stored, so the
-- database never holds a usable secret. `huddle admin token add|list|remove`.
CREATE TABLE agent_token (
    id           TEXT PRIMARY KEY,   -- the token's public part, shown by `token list`
    hash         TEXT NOT NULL,      -- blake3 of the whole token, 64 hex digits
    agent        TEXT NOT NULL,      -- the agent the token acts as
    room         TEXT NOT NULL,      -- the one room it acts in
    capabilities TEXT NOT NULL,      -- JSON array of strings
    created_us   INTEGER NOT NULL    -- µs since the Unix epoch
);
