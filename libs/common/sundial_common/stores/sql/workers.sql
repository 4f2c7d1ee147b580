-- The workers store (sundial_common.stores.workers): worker incarnations and what an earlier one left running.

-- name: begin_incarnation
-- The next incarnation of a worker identity (1 for a new one), as of the database's clock.
INSERT INTO worker_incarnations AS w (worker_id, pool, incarnation, host, pid, started_at)
VALUES ($1, $2, 1, $3, $4, now())
ON CONFLICT (worker_id) DO UPDATE
SET pool = excluded.pool, incarnation = w.incarnation + 1, host = excluded.host, pid = excluded.pid,
    started_at = now()
RETURNING worker_id, incarnation, started_at;

-- name: orphaned_attempts
-- RUNNING attempts of this identity started before its current incarnation began: an earlier incarnation's,
-- whose handlers died with it. With the job's retry policy (the backoff of the lost attempt).
SELECT e.id, e.tenant_id, e.job_id, e.shard, e.worker_id, e.attempt, e.started_at, e.traceparent, j.retry_policy
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'OPEN' AND e.state = 'RUNNING' AND e.worker_id = $1 AND e.started_at < $2
ORDER BY e.started_at
LIMIT $3;
