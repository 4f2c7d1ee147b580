-- Every SQL statement Sundial runs, by name. Loaded by sundial_common.queries.
-- State changes are compare-and-swap (DESIGN invariant 3): they name the state they expect and
-- return the rows they changed; zero rows means another actor won and the caller does nothing.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.

-- name: ping
SELECT 1;

-- name: insert_job
-- Creates the tenant on first use, the job, and its audit row in one statement.
WITH tenant AS (
    INSERT INTO tenants (id) VALUES ($2) ON CONFLICT (id) DO NOTHING
), job AS (
    INSERT INTO jobs (id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
                      payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT tenant_id, 'job', id, 'create', state, $19 FROM job
)
SELECT * FROM job;

-- name: get_job
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2;

-- name: cancel_job
-- A cancelled job fires no more; executions already dispatched are not touched here.
WITH previous AS (
    SELECT id, state FROM jobs WHERE id = $1 AND tenant_id = $2 AND state IN ('ACTIVE', 'PAUSED') FOR UPDATE
), job AS (
    UPDATE jobs j SET state = 'CANCELLED', next_fire_at = NULL, version = j.version + 1, updated_at = now()
    FROM previous WHERE j.id = previous.id
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT job.tenant_id, 'job', job.id, 'cancel', previous.state, 'CANCELLED', $3 FROM job JOIN previous USING (id)
)
SELECT * FROM job;

-- name: latest_executions
SELECT * FROM executions WHERE job_id = $1 ORDER BY scheduled_for DESC, id DESC LIMIT $2;

-- name: page_executions
-- Keyset pagination, newest first; ($2, $3) is the last row of the previous page.
SELECT * FROM executions
WHERE job_id = $1 AND ($2::timestamptz IS NULL OR (scheduled_for, id) < ($2, $3::uuid))
ORDER BY scheduled_for DESC, id DESC
LIMIT $4;

-- name: get_execution
SELECT * FROM executions WHERE id = $1 AND tenant_id = $2;

-- name: execution_attempts
SELECT * FROM execution_attempts WHERE execution_id = $1 ORDER BY attempt;

-- name: hydration_range
-- Active jobs of one shard due in [$2, $3), after the keyset position ($2, $4) so that many jobs at
-- one instant page correctly: an index range scan on jobs_due_idx, never a table scan.
SELECT id, next_fire_at FROM jobs
WHERE shard = $1 AND state = 'ACTIVE' AND next_fire_at IS NOT NULL
  AND (next_fire_at, id) > ($2, $4::uuid) AND next_fire_at < $3
ORDER BY next_fire_at, id
LIMIT $5;

-- name: overdue_jobs
-- Active jobs of one shard that should have fired before $2 and did not: their hot-window member
-- was lost (Redis flushed, a dispatcher died between claim and commit, an API replica missed it).
SELECT id, next_fire_at FROM jobs
WHERE shard = $1 AND state = 'ACTIVE' AND next_fire_at IS NOT NULL AND next_fire_at < $2
ORDER BY next_fire_at
LIMIT $3;

-- name: raise_fence
-- DESIGN invariant 4: the shard's token only grows. No row back = a newer leader has written.
INSERT INTO shard_fence AS f (shard, token, holder) VALUES ($1, $2, $3)
ON CONFLICT (shard) DO UPDATE SET token = excluded.token, holder = excluded.holder, updated_at = now()
WHERE f.token <= excluded.token
RETURNING token;

-- name: lock_due_jobs
-- The claimed members that still match Postgres (same job, same due time, still active), locked so
-- nobody moves them while this transaction dispatches them.
SELECT j.id, j.tenant_id, j.type, j.schedule, j.timezone, j.pool, j.handler, j.payload, j.retry_policy,
       j.timeout_sec, j.next_fire_at, j.traceparent
FROM jobs j
-- Scores are epoch milliseconds; fire times are written at millisecond precision, compared at it too.
JOIN unnest($1::uuid[], $2::timestamptz[]) AS c (id, due)
  ON j.id = c.id AND date_trunc('milliseconds', j.next_fire_at) = c.due
WHERE j.state = 'ACTIVE' AND j.shard = $3
ORDER BY j.id
FOR UPDATE OF j;

-- name: insert_executions
WITH inserted AS (
    INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,
                            max_attempts, timeout_sec, trace_id, traceparent)
    SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, $9, $10, e.pool, e.handler, 'PENDING',
           e.max_attempts, e.timeout_sec, e.trace_id, e.traceparent
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[],
                $7::int[], $8::int[], $11::text[], $12::text[])
         AS e (id, tenant_id, job_id, scheduled_for, pool, handler, max_attempts, timeout_sec, trace_id,
               traceparent)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id, tenant_id
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT tenant_id, 'execution', id, 'dispatch', 'PENDING', $13 FROM inserted
)
SELECT id FROM inserted;

-- name: advance_jobs
-- Compare-and-set on the old next_fire_at; a job with no next occurrence is COMPLETED.
UPDATE jobs j
SET next_fire_at = a.next_fire_at,
    state = CASE WHEN a.next_fire_at IS NULL THEN 'COMPLETED' ELSE j.state END,
    fire_count = j.fire_count + 1,
    updated_at = now()
FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) AS a (id, prev, next_fire_at)
WHERE j.id = a.id AND j.next_fire_at = a.prev AND j.state = 'ACTIVE'
RETURNING j.id;

-- name: mark_published
UPDATE executions SET published_at = now()
WHERE id = ANY($1::uuid[]) AND published_at IS NULL;

-- name: stale_pending
-- PENDING executions whose message was never published, or was published and never picked up
-- (the broker may have lost it): the execution row is the outbox, so they can be sent again.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
       e.attempt, e.timeout_sec, e.traceparent, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.state = 'PENDING'
  AND ((e.published_at IS NULL AND e.created_at < $1) OR e.published_at < $2)
ORDER BY e.created_at
LIMIT $3;

-- name: republished
UPDATE executions SET published_at = now() WHERE id = ANY($1::uuid[]) AND state = 'PENDING';

-- name: start_executions
-- PENDING -> RUNNING for a batch of delivered messages. A duplicate delivery, or a message for an
-- attempt that is no longer current, matches no row and is acknowledged without running.
WITH started AS (
    UPDATE executions e
    SET state = 'RUNNING', worker_id = $3, started_at = now()
    FROM unnest($1::uuid[], $2::int[]) AS m (id, attempt)
    WHERE e.id = m.id AND e.attempt = m.attempt AND e.state = 'PENDING'
    RETURNING e.id, e.attempt, e.tenant_id, e.job_id, e.scheduled_for, e.started_at, e.trace_id
), attempts AS (
    INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, started_at)
    SELECT id, attempt, tenant_id, $3, 'RUNNING', started_at FROM started
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'start', 'PENDING', 'RUNNING', $3 FROM started
)
SELECT * FROM started;

-- name: finish_executions
-- RUNNING -> a terminal state, only for the attempt this worker owns. A worker that lost its claim
-- (the sweeper moved on) gets zero rows and its result is dropped.
WITH finished AS (
    UPDATE executions e
    SET state = f.state, result = f.result, error = f.error, finished_at = now()
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::jsonb[], $5::text[]) AS f (id, attempt, state, result, error)
    WHERE e.id = f.id AND e.attempt = f.attempt AND e.state = 'RUNNING' AND e.worker_id = $6
    RETURNING e.id, e.attempt, e.tenant_id, e.state, e.error, e.finished_at
), attempts AS (
    UPDATE execution_attempts a
    SET state = finished.state, error = finished.error, finished_at = finished.finished_at
    FROM finished
    WHERE a.execution_id = finished.id AND a.attempt = finished.attempt
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'finish', 'RUNNING', state, $6 FROM finished
)
SELECT id, attempt, state FROM finished;

-- name: record_progress
UPDATE execution_attempts a SET progress = $4
FROM executions e
WHERE a.execution_id = $1 AND a.attempt = $2 AND e.id = a.execution_id AND e.attempt = a.attempt
  AND e.state = 'RUNNING' AND e.worker_id = $3
RETURNING a.execution_id;
