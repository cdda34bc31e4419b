-- name: api_key_insert
INSERT INTO __schema__.api_keys (key_id, name, key_hash, scopes)
VALUES ($1, $2, $3, $4::text[])
ON CONFLICT DO NOTHING
RETURNING created_at

-- name: api_key_get
SELECT key_id, name, key_hash, scopes, created_at, revoked_at
FROM __schema__.api_keys WHERE key_id = $1

-- name: api_key_list
SELECT key_id, name, key_hash, scopes, created_at, revoked_at
FROM __schema__.api_keys ORDER BY revoked_at IS NOT NULL, name, created_at

-- name: api_key_revoke
UPDATE __schema__.api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL

-- name: api_rate_take
-- The fleet-wide submit quota (api/ratelimit.py): refill the key's bucket for the time since
-- its last take ($2 tokens a second, at most $3), hand out up to $4 whole tokens, and return
-- what was handed out and what is left. ON CONFLICT ... DO UPDATE reads the row's old values in
-- every SET expression, so the refill is spelt out in each; one statement, one row lock.
INSERT INTO __schema__.api_rate AS b (key_id, tokens, granted, at)
VALUES ($1, $3::float8 - least(floor($3::float8), $4::float8),
        least(floor($3::float8), $4::float8), now())
ON CONFLICT (key_id) DO UPDATE SET
    granted = least(floor(
        least($3::float8, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $2::float8)
    ), $4::float8),
    tokens = least($3::float8,
        b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $2::float8)
        - least(floor(
            least($3::float8, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $2::float8)
        ), $4::float8),
    at = now()
RETURNING granted, tokens
