-- The pool-token store (sundial_common.stores.pool_tokens): the registry of pool tokens, read by the worker
-- gateway on use. A token is never deleted, only revoked: its id stays refused.

-- name: create_token
INSERT INTO pool_tokens (id, pool, tenant, subject, created_by, ttl_sec)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: get_token
SELECT * FROM pool_tokens WHERE id = $1;

-- name: list_tokens
-- A pool's tokens, newest first.
SELECT * FROM pool_tokens WHERE pool = $1 ORDER BY created_at DESC, id LIMIT $2;

-- name: revoke_token
-- Revoke a pool's token; a token already revoked keeps its first revocation time. No row: not this pool's token.
UPDATE pool_tokens SET revoked_at = coalesce(revoked_at, now())
WHERE id = $1 AND pool = $2
RETURNING *;
