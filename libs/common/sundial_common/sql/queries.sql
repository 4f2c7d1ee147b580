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
                      payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
                      interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
                      catchup_policy, catchup_window_sec, next_nominal_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $20, $21, $22, $23, $24, $25, $26, $27, $28, $29)
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT tenant_id, 'job', id, 'create', state, $19 FROM job
)
SELECT * FROM job;

-- name: insert_jobs
-- A batch of jobs as one JSON array of column values (POST /v1/jobs:batch): their tenants, the jobs and
-- their audit rows in one statement. Columns not named here take their defaults.
WITH input AS (
    SELECT * FROM jsonb_populate_recordset(NULL::jobs, $1::jsonb)
), tenant AS (
    INSERT INTO tenants (id) SELECT DISTINCT tenant_id FROM input ON CONFLICT (id) DO NOTHING
), job AS (
    INSERT INTO jobs (id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
                      payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
                      interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
                      catchup_policy, catchup_window_sec, next_nominal_at)
    SELECT id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
           payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
           interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
           catchup_policy, catchup_window_sec, next_nominal_at
    FROM input
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT tenant_id, 'job', id, 'create', state, $2 FROM job
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

-- name: pause_job
-- ACTIVE -> PAUSED. The job keeps its next occurrence; resuming hands it to the catch-up policy.
WITH previous AS (
    SELECT id FROM jobs WHERE id = $1 AND tenant_id = $2 AND state = 'ACTIVE' FOR UPDATE
), job AS (
    UPDATE jobs j SET state = 'PAUSED', version = j.version + 1, updated_at = now()
    FROM previous WHERE j.id = previous.id
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'job', id, 'pause', 'ACTIVE', 'PAUSED', $3 FROM job
)
SELECT * FROM job;

-- name: resume_job
-- PAUSED -> ACTIVE with the occurrence it had when paused: if that is past, the dispatcher fires it at once
-- and applies the catch-up policy to the occurrences missed meanwhile.
WITH previous AS (
    SELECT id FROM jobs WHERE id = $1 AND tenant_id = $2 AND state = 'PAUSED' FOR UPDATE
), job AS (
    UPDATE jobs j
    SET state = CASE WHEN j.next_fire_at IS NULL THEN 'COMPLETED' ELSE 'ACTIVE' END,
        version = j.version + 1, updated_at = now()
    FROM previous WHERE j.id = previous.id
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'job', id, 'resume', 'PAUSED', state, $3 FROM job
)
SELECT * FROM job;

-- name: trigger_job
-- Asks for one run now, outside the schedule; the dispatcher creates it (execution id $4) and clears this.
-- A trigger already pending is kept: a double click runs once.
WITH job AS (
    UPDATE jobs SET trigger_at = $3, trigger_execution_id = $4, updated_at = now()
    WHERE id = $1 AND tenant_id = $2 AND state <> 'CANCELLED' AND trigger_at IS NULL
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor, detail)
    SELECT tenant_id, 'job', id, 'trigger', $5, jsonb_build_object('executionId', $4::uuid) FROM job
)
SELECT * FROM job;

-- name: update_job
-- PATCH: compare-and-set on the version the client saw ($3) and on the occurrence the new values were
-- computed from ($4, the next fire read with it), so a dispatch committed in between is never overwritten.
WITH job AS (
    UPDATE jobs j
    SET name = $6, type = $7, schedule = $8, timezone = $9, run_at = $10, delay_seconds = $11, pool = $12,
        handler = $13, payload = $14, retry_policy = $15, timeout_sec = $16, priority = $17, interval_sec = $18,
        run_list = $19, start_at = $20, end_at = $21, max_runs = $22, jitter_sec = $23, overlap_policy = $24,
        catchup_policy = $25, catchup_window_sec = $26, next_fire_at = $27, next_nominal_at = $28, state = $29,
        version = j.version + 1, updated_at = now()
    WHERE j.id = $1 AND j.tenant_id = $2 AND j.version = $3 AND j.next_fire_at IS NOT DISTINCT FROM $4
      AND j.state = $5
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'job', id, 'update', $5, state, $30, $31 FROM job
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

-- name: overdue_triggers
-- Manual triggers still pending after $2: their hot-window member was lost. jobs_trigger_idx keeps it small.
SELECT id, trigger_at FROM jobs
WHERE shard = $1 AND trigger_at IS NOT NULL AND trigger_at < $2 AND state <> 'CANCELLED'
ORDER BY trigger_at
LIMIT $3;

-- name: raise_fence
-- DESIGN invariant 4: the shard's token only grows. No row back = a newer leader has written.
INSERT INTO shard_fence AS f (shard, token, holder) VALUES ($1, $2, $3)
ON CONFLICT (shard) DO UPDATE SET token = excluded.token, holder = excluded.holder, updated_at = now()
WHERE f.token <= excluded.token
RETURNING token;

-- name: shard_fences
-- The admin view: per shard, the highest leadership token that has written and who held it.
SELECT shard, token, holder, updated_at FROM shard_fence ORDER BY shard;

-- name: lock_due_jobs
-- The claimed members that are due in Postgres, locked so nobody moves them while this transaction
-- dispatches them: an active job whose next fire is at or before the claimed score, or a live job with a
-- trigger pending at or before it. A member scored later than the job's next fire (a BUFFER_ONE hold, a
-- re-added member) still dispatches it; one scored earlier (stale) matches nothing.
-- Jobs with an overlap policy other than ALLOW bring their executions still open (PENDING or RUNNING),
-- oldest first: one probe of executions_job_open_idx each, and no extra round trip.
SELECT j.*, c.due AS claimed_due, open.ids AS open_execution_ids, open.states AS open_execution_states
FROM jobs j
-- Scores are epoch milliseconds; fire times are written at millisecond precision, compared at it too.
JOIN unnest($1::uuid[], $2::timestamptz[]) AS c (id, due) ON j.id = c.id
LEFT JOIN LATERAL (
    SELECT array_agg(e.id ORDER BY e.scheduled_for) AS ids, array_agg(e.state ORDER BY e.scheduled_for) AS states
    FROM executions e
    WHERE j.overlap_policy <> 'ALLOW' AND e.job_id = j.id AND e.state IN ('PENDING', 'RUNNING')
) open ON true
WHERE j.shard = $3
  AND ((j.state = 'ACTIVE' AND date_trunc('milliseconds', j.next_fire_at) <= c.due)
       OR (j.state <> 'CANCELLED' AND j.trigger_at <= c.due))
ORDER BY j.id
FOR UPDATE OF j;

-- name: claimed_but_not_due
-- Claimed members that matched no due job, with where their job's member belongs now: its next fire if
-- active, or its pending trigger (NULL: nowhere). A member that raced ahead of a re-schedule is put back
-- at the right score instead of waiting for the hydrator's overdue scan.
SELECT j.id, c.due AS claimed_due,
       least(CASE WHEN j.state = 'ACTIVE' THEN j.next_fire_at END,
             CASE WHEN j.state <> 'CANCELLED' THEN j.trigger_at END) AS belongs_at
FROM jobs j
JOIN unnest($1::uuid[], $2::timestamptz[]) AS c (id, due) ON j.id = c.id
WHERE j.shard = $3;

-- name: insert_executions
-- One row per occurrence; a SKIPPED one (overlap policy) is terminal at once and never published.
WITH inserted AS (
    INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,
                            max_attempts, timeout_sec, trace_id, traceparent, fire_at, triggered, error,
                            finished_at)
    SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, $9, $10, e.pool, e.handler, e.state,
           e.max_attempts, e.timeout_sec, e.trace_id, e.traceparent, e.fire_at, e.triggered, e.note,
           CASE WHEN e.state = 'SKIPPED' THEN now() END
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[],
                $7::int[], $8::int[], $11::text[], $12::text[], $14::timestamptz[], $15::text[], $16::bool[],
                $17::text[])
         AS e (id, tenant_id, job_id, scheduled_for, pool, handler, max_attempts, timeout_sec, trace_id,
               traceparent, fire_at, state, triggered, note)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id, tenant_id, state, error
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'SKIPPED' THEN 'skip' ELSE 'dispatch' END, state, $13,
           CASE WHEN error IS NOT NULL THEN jsonb_build_object('reason', error) END
    FROM inserted
)
SELECT id FROM inserted;

-- name: advance_jobs
-- Moves each dispatched job to its next occurrence, with compare-and-set on the one it was at; a job with
-- no next occurrence is COMPLETED. A job only holding a trigger (advance = false) keeps its schedule.
-- Missed fires (catch-up) and completions are audited.
WITH advanced AS (
    UPDATE jobs j
    SET next_fire_at = CASE WHEN a.advance THEN a.next_fire_at ELSE j.next_fire_at END,
        next_nominal_at = CASE WHEN a.advance THEN a.next_nominal_at ELSE j.next_nominal_at END,
        state = CASE WHEN a.advance AND a.next_fire_at IS NULL THEN 'COMPLETED' ELSE j.state END,
        fire_count = j.fire_count + a.runs,
        missed_fires = j.missed_fires + a.missed,
        trigger_at = CASE WHEN a.trigger_done THEN NULL ELSE j.trigger_at END,
        trigger_execution_id = CASE WHEN a.trigger_done THEN NULL ELSE j.trigger_execution_id END,
        updated_at = now()
    FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::int[], $6::bigint[],
                $7::bool[], $8::bool[])
         AS a (id, prev, next_fire_at, next_nominal_at, runs, missed, advance, trigger_done)
    WHERE j.id = a.id AND (NOT a.advance OR (j.next_fire_at = a.prev AND j.state = 'ACTIVE'))
    RETURNING j.id, j.tenant_id, j.state, a.advance, a.missed
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'job', id, 'complete', 'ACTIVE', 'COMPLETED', $9, NULL FROM advanced
    WHERE advance AND state = 'COMPLETED'
    UNION ALL
    SELECT tenant_id, 'job', id, 'missed', NULL, NULL, $9, jsonb_build_object('missedFires', missed) FROM advanced
    WHERE missed > 0
)
SELECT id FROM advanced;

-- name: cancel_overlapping
-- Overlap policy CANCEL_RUNNING: the job's open executions are asked to stop. A PENDING one is cancelled
-- here (its worker's PENDING -> RUNNING swap then fails); a RUNNING one gets cancel_requested_at, which
-- its worker honours (as it does the Redis key sundial:cancel:<execution id>).
WITH flagged AS (
    UPDATE executions e
    SET cancel_requested_at = coalesce(e.cancel_requested_at, now()),
        state = CASE WHEN e.state = 'PENDING' THEN 'CANCELLED' ELSE e.state END,
        finished_at = CASE WHEN e.state = 'PENDING' THEN now() ELSE e.finished_at END,
        error = CASE WHEN e.state = 'PENDING' THEN 'cancelled: a newer occurrence started (CANCEL_RUNNING)'
                     ELSE e.error END
    WHERE e.id = ANY($1::uuid[]) AND e.state IN ('PENDING', 'RUNNING')
    RETURNING e.id, e.tenant_id, e.state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id,
           CASE WHEN state = 'CANCELLED' THEN 'cancel' ELSE 'cancel_request' END,
           CASE WHEN state = 'CANCELLED' THEN 'PENDING' ELSE 'RUNNING' END, state, $2,
           '{"reason": "overlapPolicy CANCEL_RUNNING"}'::jsonb
    FROM flagged
)
SELECT id, state FROM flagged;

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
