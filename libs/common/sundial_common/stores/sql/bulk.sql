-- The bulk-operations store (sundial_common.stores.bulk): operations, their fixed selections and the actions
-- the runner takes on each selected row, audited in the same statement as the change.

-- name: insert_operation
-- No row back: the tenant already created an operation under this Idempotency-Key ($10): see operation_by_key.
INSERT INTO bulk_operations (id, tenant_id, created_by, target, action, filter, rate_per_sec, idempotency_key,
                             request_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: operation_by_key
SELECT * FROM bulk_operations WHERE tenant_id = $1 AND idempotency_key = $2;

-- name: get_operation
-- $2 NULL: any tenant's (an admin token).
SELECT * FROM bulk_operations WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2);

-- name: list_operations
-- Newest first, after the cursor's id; $1 NULL: every tenant's (an admin token).
SELECT * FROM bulk_operations
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::uuid IS NULL OR id < $2)
ORDER BY id DESC LIMIT $3;

-- name: list_items
-- An operation's items in the order they are acted on, after the cursor's seq; $4: only this outcome.
SELECT * FROM bulk_operation_items
WHERE operation_id = $1 AND seq > $2 AND ($4::text IS NULL OR outcome = $4)
ORDER BY seq LIMIT $3;

-- name: cancel_operation
-- PREPARING: CANCELLED at once. RUNNING: the runner stops before its next batch (it reads this in the batch's
-- transaction, so no item is acted on after the cancel commits).
UPDATE bulk_operations
SET state = CASE WHEN state = 'PREPARING' THEN 'CANCELLED' ELSE state END,
    finished_at = CASE WHEN state = 'PREPARING' THEN now() ELSE finished_at END,
    cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2) AND state IN ('PREPARING', 'RUNNING')
RETURNING *;

-- name: active_operations
SELECT * FROM bulk_operations WHERE state IN ('PREPARING', 'RUNNING') ORDER BY id LIMIT $1;

-- name: lock_preparing
SELECT * FROM bulk_operations WHERE id = $1 AND state = 'PREPARING' FOR UPDATE;

-- name: select_executions
-- The executions an operation selects, all in one statement so a dry run counts exactly what a run fixes:
-- the count, a sample of $16, and (with an operation id, $14, and at most $15 selected) the selection written as
-- its items. $1 tenant; $2 the watermark (NULL: now); $3 states; $4 pool; $5 handler; $6 labels the job has;
-- $7 the job's name prefix; $8 priority; $9/$10 scheduled range; $11/$12 finished range; $13 job ids; $17 the
-- action, which keeps only the rows it can act on; $18 (NULL: none) a bound on the rows looked at, for a count
-- that stops once past the limit (the create's check: no sample, no items).
WITH sel AS MATERIALIZED (
    SELECT e.id, e.job_id, e.state, e.pool, e.handler, e.scheduled_for, e.finished_at
    FROM executions e
    WHERE e.tenant_id = $1 AND e.created_at <= coalesce($2::timestamptz, now())
      AND ($3::text[] IS NULL OR e.state = ANY($3))
      AND ($4::text IS NULL OR e.pool = $4) AND ($5::text IS NULL OR e.handler = $5)
      AND ($8::text IS NULL OR e.priority = $8)
      AND ($9::timestamptz IS NULL OR e.scheduled_for >= $9) AND ($10::timestamptz IS NULL OR e.scheduled_for < $10)
      AND ($11::timestamptz IS NULL OR e.finished_at >= $11) AND ($12::timestamptz IS NULL OR e.finished_at < $12)
      AND ($13::uuid[] IS NULL OR e.job_id = ANY($13))
      AND ($6::jsonb IS NULL AND $7::text IS NULL OR EXISTS (
          SELECT 1 FROM jobs j WHERE j.id = e.job_id AND j.tenant_id = $1
            AND ($6::jsonb IS NULL OR j.labels @> $6) AND ($7::text IS NULL OR starts_with(j.name, $7))))
      AND CASE $17::text
          WHEN 'redrive' THEN (e.state = 'DEAD' AND e.next_attempt_at IS NULL)
                           OR (e.state = 'FAILED' AND e.held_by IS NOT NULL AND e.next_attempt_at IS NOT NULL)
          WHEN 'cancel' THEN e.state IN ('PENDING', 'RUNNING') OR e.next_attempt_at IS NOT NULL
          ELSE false END
    LIMIT $18::bigint
), items AS (
    INSERT INTO bulk_operation_items (operation_id, seq, target_id)
    SELECT $14, row_number() OVER (ORDER BY id), id FROM sel
    WHERE $14::uuid IS NOT NULL AND (SELECT count(*) FROM sel) <= $15
    RETURNING 1
)
SELECT (SELECT count(*) FROM sel) AS total, (SELECT count(*) FROM items) AS fixed,
       ARRAY(SELECT jsonb_build_object('id', id, 'jobId', job_id, 'state', state, 'pool', pool, 'handler', handler,
                                       'scheduledFor', scheduled_for, 'finishedAt', finished_at)
             FROM sel ORDER BY id LIMIT $16) AS sample;

-- name: select_jobs
-- The jobs an operation selects (as select_executions; the scheduled range is the job's next fire, $11/$12 are
-- refused for jobs by the API).
WITH sel AS MATERIALIZED (
    SELECT j.id, j.name, j.state, j.pool, j.handler, j.next_fire_at
    FROM jobs j
    WHERE j.tenant_id = $1 AND j.created_at <= coalesce($2::timestamptz, now())
      AND ($3::text[] IS NULL OR j.state = ANY($3))
      AND ($4::text IS NULL OR j.pool = $4) AND ($5::text IS NULL OR j.handler = $5)
      AND ($6::jsonb IS NULL OR j.labels @> $6) AND ($7::text IS NULL OR starts_with(j.name, $7))
      AND ($8::text IS NULL OR j.priority = $8)
      AND ($9::timestamptz IS NULL OR j.next_fire_at >= $9) AND ($10::timestamptz IS NULL OR j.next_fire_at < $10)
      AND ($11::timestamptz IS NULL OR true) AND ($12::timestamptz IS NULL OR true)
      AND ($13::uuid[] IS NULL OR j.id = ANY($13))
      AND CASE $17::text
          WHEN 'pause' THEN j.state = 'ACTIVE'
          WHEN 'resume' THEN j.state = 'PAUSED'
          WHEN 'cancel' THEN j.state IN ('ACTIVE', 'PAUSED')
          WHEN 'trigger' THEN j.state <> 'CANCELLED'
          ELSE false END
    LIMIT $18::bigint
), items AS (
    INSERT INTO bulk_operation_items (operation_id, seq, target_id)
    SELECT $14, row_number() OVER (ORDER BY id), id FROM sel
    WHERE $14::uuid IS NOT NULL AND (SELECT count(*) FROM sel) <= $15
    RETURNING 1
)
SELECT (SELECT count(*) FROM sel) AS total, (SELECT count(*) FROM items) AS fixed,
       ARRAY(SELECT jsonb_build_object('id', id, 'name', name, 'state', state, 'pool', pool, 'handler', handler,
                                       'nextFireAt', next_fire_at)
             FROM sel ORDER BY id LIMIT $16) AS sample;

-- name: start_operation
-- PREPARING → RUNNING with its selection fixed ($2 items); none: SUCCEEDED at once.
UPDATE bulk_operations
SET state = CASE WHEN $2::bigint = 0 THEN 'SUCCEEDED' ELSE 'RUNNING' END, total = $2, started_at = now(),
    finished_at = CASE WHEN $2::bigint = 0 THEN now() END, updated_at = now()
WHERE id = $1 AND state = 'PREPARING'
RETURNING *;

-- name: lock_running
-- The batch's transaction starts here: the operation, locked so a cancel waits for the batch and is then final.
SELECT * FROM bulk_operations WHERE id = $1 AND state = 'RUNNING' FOR UPDATE;

-- name: next_items
SELECT seq, target_id FROM bulk_operation_items WHERE operation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3;

-- name: record_outcomes
-- One batch's outcomes and the operation's counters and cursor, in the batch's transaction.
WITH items AS (
    UPDATE bulk_operation_items i SET outcome = o.outcome, reason = o.reason, acted_at = now()
    FROM unnest($2::bigint[], $3::text[], $4::text[]) AS o (seq, outcome, reason)
    WHERE i.operation_id = $1 AND i.seq = o.seq
    RETURNING 1
)
UPDATE bulk_operations
SET done = done + (SELECT count(*) FROM unnest($3::text[]) o WHERE o = 'DONE'),
    skipped = skipped + (SELECT count(*) FROM unnest($3::text[]) o WHERE o = 'SKIPPED'),
    failed = failed + (SELECT count(*) FROM unnest($3::text[]) o WHERE o = 'FAILED'),
    cursor_seq = greatest(cursor_seq, (SELECT max(s) FROM unnest($2::bigint[]) s)),
    state = CASE WHEN (SELECT max(s) FROM unnest($2::bigint[]) s) >= total THEN 'SUCCEEDED' ELSE state END,
    finished_at = CASE WHEN (SELECT max(s) FROM unnest($2::bigint[]) s) >= total THEN now() ELSE finished_at END,
    updated_at = now()
WHERE id = $1
RETURNING *;

-- name: finish_operation
-- RUNNING or PREPARING → CANCELLED or FAILED.
UPDATE bulk_operations SET state = $2, error = $3, finished_at = now(), updated_at = now()
WHERE id = $1 AND state IN ('PREPARING', 'RUNNING')
RETURNING *;

-- name: resumed_operation
-- A runner took over a RUNNING operation whose previous holder stopped mid-way.
UPDATE bulk_operations SET resumes = resumes + 1, updated_at = now() WHERE id = $1 AND state = 'RUNNING';

-- name: purge_finished
-- Retention: operations finished more than $1 days ago go, with their items (ON DELETE CASCADE).
WITH gone AS (
    DELETE FROM bulk_operations
    WHERE id IN (SELECT id FROM bulk_operations
                 WHERE finished_at < now() - make_interval(days => $1) ORDER BY finished_at LIMIT $2)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: redrive_held_execution
-- A FAILED execution held by a retry breaker: its next attempt is due now (the breaker's gate judges it again, as
-- any retry), its hold clock starts again, and it gets one more attempt if it had used them up.
WITH changed AS (
    UPDATE executions
    SET next_attempt_at = now(), held_since = NULL, max_attempts = greatest(max_attempts, attempt + 1)
    WHERE id = $1 AND tenant_id = $2 AND state = 'FAILED' AND held_by IS NOT NULL AND next_attempt_at IS NOT NULL
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'retry_request', 'FAILED', 'FAILED', $3,
           jsonb_build_object('nextAttempt', attempt + 1)
    FROM changed
)
SELECT * FROM changed;

-- name: redrive_executions
-- A batch of a re-drive, as retry_dead_execution and redrive_held_execution do one by one: a DEAD execution gets
-- one more attempt, due now; a FAILED one a breaker holds is due now (the gate judges it again) with its hold
-- clock restarted. Either way the dispatcher takes it from there like any retry. Ids by ANY (one index scan on
-- their partitions, see executions.sql); the CAS filters as texteq for the same reason.
WITH changed AS (
    UPDATE executions e
    SET next_attempt_at = now(), held_since = NULL,
        max_attempts = CASE WHEN texteq(e.state, 'DEAD') THEN e.attempt + 1
                            ELSE greatest(e.max_attempts, e.attempt + 1) END
    WHERE e.id = ANY($1::uuid[]) AND e.tenant_id = $2
      AND ((texteq(e.state, 'DEAD') AND e.next_attempt_at IS NULL)
           OR (texteq(e.state, 'FAILED') AND e.held_by IS NOT NULL AND e.next_attempt_at IS NOT NULL))
    RETURNING e.id, e.tenant_id, e.state, e.attempt, e.shard, e.next_attempt_at
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'retry_request', state, state, $3,
           jsonb_build_object('nextAttempt', attempt + 1, 'bulkOperationId', $4::uuid)
    FROM changed
)
SELECT id, attempt, shard, next_attempt_at FROM changed;

-- name: cancel_executions
-- A batch of a cancel, as cancel_execution does one by one: PENDING or waiting for a retry → CANCELLED; RUNNING →
-- its cancel requested (its worker reads it from here at its next heartbeat).
WITH previous AS (
    SELECT id, state FROM executions
    WHERE id = ANY($1::uuid[]) AND tenant_id = $2 AND (state IN ('PENDING', 'RUNNING') OR next_attempt_at IS NOT NULL)
    FOR UPDATE
), changed AS (
    UPDATE executions e
    SET state = CASE WHEN p.state = 'RUNNING' THEN e.state ELSE 'CANCELLED' END,
        cancel_requested_at = coalesce(e.cancel_requested_at, now()),
        next_attempt_at = NULL,
        finished_at = CASE WHEN p.state = 'RUNNING' THEN e.finished_at ELSE now() END
    FROM previous p WHERE e.id = p.id AND e.id = ANY($1::uuid[])
    RETURNING e.id, e.tenant_id, e.state, p.state AS from_state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'CANCELLED' THEN 'cancel' ELSE 'cancel_request' END,
           from_state, state, $3, jsonb_build_object('bulkOperationId', $4::uuid)
    FROM changed
)
SELECT id, state FROM changed;

-- name: execution_states
SELECT id, state FROM executions WHERE id = ANY($1::uuid[]) AND tenant_id = $2;

-- name: job_pools
-- A bulk trigger's batch: the pool of each of its jobs that still exists ($2 the tenant).
SELECT id, pool FROM jobs WHERE id = ANY($1::uuid[]) AND tenant_id = $2;

-- name: pools_named
-- A bulk trigger's batch: the pools its jobs run in.
SELECT * FROM pools WHERE name = ANY($1::text[]);
