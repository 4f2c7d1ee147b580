-- The pool-target store (sundial_common.stores.pool_targets): where an HTTP pool's executions are POSTed and
-- the sealed secrets they are signed with.

-- name: put_target
-- Set a pool's target; $5 NULL keeps the secrets it has (a first target must bring them).
INSERT INTO pool_targets (pool, tenant_id, url, paths, secrets, updated_by)
VALUES ($1, $2, $3, $4, COALESCE($5, ''), $6)
ON CONFLICT (pool) DO UPDATE
SET tenant_id = EXCLUDED.tenant_id, url = EXCLUDED.url, paths = EXCLUDED.paths,
    secrets = COALESCE($5, pool_targets.secrets), updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING *;

-- name: get_target
SELECT * FROM pool_targets WHERE pool = $1;

-- name: delete_target
DELETE FROM pool_targets WHERE pool = $1 RETURNING pool;
