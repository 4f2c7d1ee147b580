-- The backfill store (sundial_common.stores.backfills): durable backfills of a recurring job's past range,
-- created by the API and advanced by the leader of the job's shard under its fence.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.

-- name: insert_backfill
-- A backfill with nothing missing ($9 = 0) is DONE, and finished, at once: job retention keeps a job while a
-- backfill of it has no finished_at (prune_ended_jobs), so one left without would keep its job for ever.
WITH backfill AS (
    INSERT INTO backfills (id, tenant_id, job_id, shard, range_from, range_to, overlap_policy, rate_per_sec, state,
                           total, actor, traceparent, finished_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $9::int = 0 THEN 'DONE' ELSE 'RUNNING' END, $9, $10, $11,
            CASE WHEN $9::int = 0 THEN now() END)
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor, detail)
    SELECT tenant_id, 'job', job_id, 'backfill', NULL, $10,
           jsonb_build_object('backfillId', id, 'from', range_from, 'to', range_to, 'total', total)
    FROM backfill
)
SELECT * FROM backfill;

-- name: get_backfill
-- With `finished`: its executions that reached a final state (executions_backfill_idx).
SELECT b.*,
       (SELECT count(*) FROM executions e
        WHERE e.backfill_id = b.id AND e.phase IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) AS finished
FROM backfills b WHERE b.id = $1 AND b.tenant_id = $2;

-- name: job_backfills
-- A job's backfills, newest first (ids are UUIDv7), those older than $3 (NULL: from the newest), at most $4;
-- backfills_job_idx. With `finished` as get_backfill counts it.
SELECT b.*,
       (SELECT count(*) FROM executions e
        WHERE e.backfill_id = b.id AND e.phase IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) AS finished
FROM backfills b
WHERE b.job_id = $1 AND b.tenant_id = $2 AND ($3::uuid IS NULL OR b.id < $3)
ORDER BY b.id DESC
LIMIT $4;

-- name: existing_occurrences
-- The nominal times of [$2, $3) that already have an execution (every partition's occurrence key, 0018).
SELECT scheduled_for FROM executions WHERE job_id = $1 AND scheduled_for >= $2 AND scheduled_for < $3;

-- name: cancel_backfill
WITH changed AS (
    UPDATE backfills SET state = 'CANCELLED', finished_at = now()
    WHERE id = $1 AND tenant_id = $2 AND state = 'RUNNING'
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor, detail)
    SELECT tenant_id, 'job', job_id, 'backfill_cancel', $3, jsonb_build_object('backfillId', id) FROM changed
)
SELECT * FROM changed;

-- name: any_running
-- Before the fenced transaction (a write): has this shard a running backfill of a tenant not SUSPENDED?
-- (backfills_running_idx; a suspended tenant's backfill waits for its resume, its cursor where it was.)
SELECT EXISTS (
    SELECT 1 FROM backfills b WHERE b.shard = $1 AND b.state = 'RUNNING'
      AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = b.tenant_id AND s.state = 'SUSPENDED')
);

-- name: running_backfills
-- The leader's step: this shard's running backfills with their job, locked for the transaction (a cancel
-- waits for it, and is then final). `open`: its executions still PENDING or RUNNING (BUFFER_ONE waits).
-- Not a SUSPENDED tenant's (it waits for the resume), nor those of the tenants ($3) or pools ($4) the
-- fair-dispatch limits hold back this pass (sundial_dispatcher.limits).
SELECT b.*, now() AS db_now, j.type, j.schedule, j.timezone, j.interval_sec, j.run_list, j.start_at, j.end_at,
       j.run_at, j.next_nominal_at, j.next_fire_at, j.jitter_sec, j.pool, j.handler, j.payload, j.retry_policy,
       j.timeout_sec, j.state AS job_state,
       CASE WHEN b.overlap_policy = 'BUFFER_ONE' THEN
           (SELECT count(*) FROM executions e WHERE e.backfill_id = b.id AND e.phase = 'OPEN')
       ELSE 0 END AS open
FROM backfills b JOIN jobs j ON j.id = b.job_id
WHERE b.shard = $1 AND b.state = 'RUNNING'
  AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = b.tenant_id AND s.state = 'SUSPENDED')
  AND NOT b.tenant_id = ANY($3::text[]) AND NOT j.pool = ANY($4::text[])
ORDER BY b.id
LIMIT $2
FOR UPDATE OF b SKIP LOCKED;

-- name: insert_backfill_executions
-- One execution per occurrence; one that already has its execution is left alone: the leader skipped the
-- nominal times existing_occurrences found (any day's partition), and the occurrence key of today's partition
-- (ON CONFLICT without a target, migration 0018) catches one created since.
WITH inserted AS (
    INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,
                            max_attempts, timeout_sec, trace_id, traceparent, fire_at, backfill_id, priority)
    SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, $9, $10, e.pool, e.handler, 'PENDING', e.max_attempts,
           e.timeout_sec, e.trace_id, e.traceparent, e.scheduled_for, e.backfill_id,
           (SELECT j.priority FROM jobs j WHERE j.id = e.job_id)
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[], $7::int[],
                $8::int[], $11::text[], $12::text[], $13::uuid[])
         AS e (id, tenant_id, job_id, scheduled_for, pool, handler, max_attempts, timeout_sec, trace_id, traceparent,
               backfill_id)
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id, state, backfill_id
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'dispatch', state, $14, jsonb_build_object('backfillId', backfill_id)
    FROM inserted
)
SELECT id FROM inserted;

-- name: advance_backfills
-- Each stepped backfill: its cursor, what it created, when its budget was spent, DONE at the end of its range.
UPDATE backfills b
SET cursor_at = a.cursor_at, created = b.created + a.created, stepped_at = now(),
    state = CASE WHEN a.done THEN 'DONE' ELSE b.state END,
    finished_at = CASE WHEN a.done THEN now() ELSE b.finished_at END
FROM unnest($1::uuid[], $2::timestamptz[], $3::int[], $4::bool[]) AS a (id, cursor_at, created, done)
WHERE b.id = a.id AND b.state = 'RUNNING';
