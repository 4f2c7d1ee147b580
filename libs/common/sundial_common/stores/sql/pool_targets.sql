-- The pool-target store (sundial_common.stores.pool_targets): where an HTTP pool's executions are POSTed, the
-- sealed secrets they are signed with, and the completion tokens of attempts a target accepted (202).

-- name: put_target
-- Set a pool's target; $5 NULL keeps the secrets it has (a first target must bring them).
INSERT INTO pool_targets (pool, tenant_id, url, paths, secrets, updated_by)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (pool) DO UPDATE
SET tenant_id = EXCLUDED.tenant_id, url = EXCLUDED.url, paths = EXCLUDED.paths,
    secrets = COALESCE($5, pool_targets.secrets), updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING *;

-- name: get_target
SELECT * FROM pool_targets WHERE pool = $1;

-- name: delete_target
DELETE FROM pool_targets WHERE pool = $1 RETURNING pool;

-- name: record_acceptance
-- An attempt its target accepted: the hash of the token its completion must bring. Written again (the same
-- attempt redelivered to this worker) it keeps the first token, which the target already has.
INSERT INTO target_acceptances (execution_id, attempt, worker_id, tenant_id, token_hash)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (execution_id, attempt) DO NOTHING
RETURNING execution_id;

-- name: get_acceptance
SELECT * FROM target_acceptances WHERE execution_id = $1 AND attempt = $2;

-- name: forget_acceptance
DELETE FROM target_acceptances WHERE execution_id = $1 AND attempt = $2;

-- name: prune_acceptances
-- Acceptances older than $1 seconds: their attempts ended long ago (completed, timed out or lost).
DELETE FROM target_acceptances WHERE created_at < now() - $1 * interval '1 second';
