-- Every SQL statement Sundial runs, by name. Loaded by sundial_common.queries.
-- State changes are compare-and-swap (DESIGN invariant 3): they name the state they expect and
-- return the rows they changed; zero rows means another actor won and the caller does nothing.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.
--
-- A batch of executions is found by primary key, never through the index of open states: a state filter
-- is written `e.state || '' = 'RUNNING'`, which no index can serve. Otherwise the planner, which
-- guesses 10 elements for a parameter array and whose statistics lag a table growing by thousands of
-- rows a second, drove the join from executions_open_idx: every call scanned all PENDING (or
-- RUNNING) rows, or rescanned the array once per such row. Under a backlog that made one 250-row
-- finish cost 100 ms instead of 3 ms (bench W3 at 5,000/s), and the backlog grew.

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
-- Only executions still waiting: a started one has its broker timestamp as published_at already.
UPDATE executions SET published_at = now()
WHERE id = ANY($1::uuid[]) AND published_at IS NULL AND state || '' = 'PENDING';

-- name: stale_pending
-- PENDING executions whose message was never published, or was published and never picked up
-- (the broker may have lost it): the execution row is the outbox, so they can be sent again.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
       e.attempt, e.timeout_sec, e.traceparent, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.state = 'PENDING'
  AND ((e.published_at IS NULL AND coalesce(e.pending_since, e.created_at) < $1) OR e.published_at < $2)
ORDER BY e.created_at
LIMIT $3;

-- name: republished
UPDATE executions SET published_at = now() WHERE id = ANY($1::uuid[]) AND state || '' = 'PENDING';

-- name: start_executions
-- PENDING -> RUNNING for a batch of delivered messages. A duplicate delivery, or a message for an
-- attempt that is no longer current, matches no row and is acknowledged without running.
-- published_at: the message's broker timestamp, unless the dispatcher has marked it already.
WITH started AS (
    UPDATE executions e
    SET state = 'RUNNING', worker_id = $3, started_at = now(),
        published_at = coalesce(e.published_at, m.published_at, now())
    FROM unnest($1::uuid[], $2::int[], $4::timestamptz[]) AS m (id, attempt, published_at)
    WHERE e.id = m.id AND e.attempt = m.attempt AND e.state || '' = 'PENDING'
    RETURNING e.id, e.attempt, e.tenant_id, e.job_id, e.scheduled_for, e.started_at, e.trace_id
), attempts AS (
    INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, started_at)
    SELECT id, attempt, tenant_id, $3, 'RUNNING', started_at FROM started
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'start', 'PENDING', 'RUNNING', $3 FROM started
)
-- With the job's retry policy (the worker computes the backoff of a failure) and the last progress an
-- earlier attempt checkpointed (ctx.previous_progress, to resume a long job).
SELECT s.*, j.retry_policy, previous.progress AS previous_progress
FROM started s
JOIN jobs j ON j.id = s.job_id
LEFT JOIN LATERAL (
    SELECT a.progress FROM execution_attempts a
    WHERE s.attempt > 1 AND a.execution_id = s.id AND a.attempt < s.attempt AND a.progress IS NOT NULL
    ORDER BY a.attempt DESC LIMIT 1
) previous ON true;

-- name: finish_executions
-- RUNNING -> how the attempt ended, only for the attempt this worker owns. A worker that lost its claim
-- (the sweeper moved on) gets zero rows and its result is dropped.
-- A FAILED or TIMED_OUT attempt schedules the next one $7 ms from now (the worker computed the backoff) if
-- attempts are left; the last one leaves the execution DEAD, and one whose cancel was requested CANCELLED.
-- The attempt row keeps how the attempt itself ended.
WITH finished AS (
    UPDATE executions e
    SET state = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NOT NULL THEN 'CANCELLED'
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.attempt >= e.max_attempts THEN 'DEAD'
            ELSE f.state END,
        next_attempt_at = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NULL AND e.attempt < e.max_attempts
            THEN now() + f.delay_ms * interval '1 millisecond' END,
        result = f.result, error = f.error, finished_at = now()
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::jsonb[], $5::text[], $7::bigint[])
         AS f (id, attempt, state, result, error, delay_ms)
    WHERE e.id = f.id AND e.attempt = f.attempt AND e.state || '' = 'RUNNING' AND e.worker_id = $6
    RETURNING e.id, e.attempt, e.tenant_id, e.state, e.error, e.finished_at, e.shard, e.next_attempt_at,
              f.state AS attempt_state
), attempts AS (
    UPDATE execution_attempts a
    SET state = finished.attempt_state, error = finished.error, finished_at = finished.finished_at
    FROM finished
    WHERE a.execution_id = finished.id AND a.attempt = finished.attempt
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'finish', 'RUNNING', attempt_state, $6,
           jsonb_build_object('attempt', attempt, 'nextAttemptAt', next_attempt_at)
    FROM finished
    UNION ALL
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'DEAD' THEN 'dead' ELSE 'cancel' END, attempt_state, state,
           $6, jsonb_build_object('attempt', attempt)
    FROM finished WHERE state <> attempt_state
)
SELECT id, attempt, state, attempt_state, shard, next_attempt_at FROM finished;

-- name: record_progress
UPDATE execution_attempts a SET progress = $4
FROM executions e
WHERE a.execution_id = $1 AND a.attempt = $2 AND e.id = a.execution_id AND e.attempt = a.attempt
  AND e.state = 'RUNNING' AND e.worker_id = $3
RETURNING a.execution_id;

-- ============================================================================================
-- Reliable execution (issue 4): retries, the sweeper's scans, cancellation, dead letters, idempotency.
-- ============================================================================================

-- name: retry_range
-- Scheduled retries of one shard due in [$2, $3), after the keyset position ($2, $4): the hydrator promotes
-- them into the hot window beside the jobs. An index range scan on executions_retry_idx.
SELECT id, next_attempt_at FROM executions
WHERE shard = $1 AND next_attempt_at IS NOT NULL
  AND (next_attempt_at, id) > ($2, $4::uuid) AND next_attempt_at < $3
ORDER BY next_attempt_at, id
LIMIT $5;

-- name: overdue_retries
-- Scheduled retries of one shard that should have been dispatched before $2 and were not: their hot-window
-- member was lost (Redis flushed, a dispatcher died after claiming it, the writer could not reach Redis).
SELECT id, next_attempt_at FROM executions
WHERE shard = $1 AND next_attempt_at IS NOT NULL AND next_attempt_at < $2
ORDER BY next_attempt_at, id
LIMIT $3;

-- name: dispatch_retries
-- The claimed retry members that are due in Postgres move to their next attempt: back to PENDING with
-- attempt + 1, stamped with this leader's fence token (the caller raised the fence in this transaction).
-- Compare-and-swap on the retryable state and on the retry still being scheduled at or before the claimed
-- score: a cancelled, already retried or re-scheduled execution matches nothing. The previous attempt's
-- error stays until the new attempt ends; its worker and times go.
WITH due AS (
    SELECT e.id, e.state
    FROM executions e
    JOIN unnest($1::uuid[], $2::timestamptz[]) AS c (id, due) ON e.id = c.id
    WHERE e.shard = $3 AND e.next_attempt_at IS NOT NULL
      AND date_trunc('milliseconds', e.next_attempt_at) <= c.due
      AND e.state IN ('FAILED', 'TIMED_OUT', 'FAILED_WORKER_LOST', 'DEAD')
    ORDER BY e.id
    FOR UPDATE OF e
), retried AS (
    UPDATE executions e
    SET state = 'PENDING', attempt = e.attempt + 1, next_attempt_at = NULL, fence_token = $4, worker_id = NULL,
        started_at = NULL, finished_at = NULL, result = NULL, published_at = NULL, pending_since = now(),
        dlq_published_at = NULL
    FROM due WHERE e.id = due.id
    RETURNING e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
              e.attempt, e.timeout_sec, e.traceparent, due.state AS from_state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'retry', from_state, 'PENDING', $5,
           jsonb_build_object('attempt', attempt, 'fenceToken', fence_token)
    FROM retried
)
SELECT r.*, j.payload FROM retried r JOIN jobs j ON j.id = r.job_id;

-- name: retries_not_due
-- Claimed retry members that matched nothing, with when their retry is scheduled now (a member that raced
-- ahead of a re-scheduled retry goes back at the right score).
SELECT id, next_attempt_at FROM executions WHERE id = ANY($1::uuid[]) AND shard = $2 AND next_attempt_at IS NOT NULL;

-- name: running_executions
-- The sweeper's view of RUNNING executions, oldest first, keyset-paged on executions_open_idx: who runs each
-- attempt, since when, its timeout, and the job's retry policy (for the backoff of a lost attempt).
SELECT e.id, e.tenant_id, e.job_id, e.shard, e.worker_id, e.attempt, e.max_attempts, e.created_at, e.started_at,
       e.timeout_sec, e.cancel_requested_at, j.retry_policy, now() AS db_now
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.state = 'RUNNING' AND (e.created_at, e.id) > ($1, $2::uuid)
ORDER BY e.created_at, e.id
LIMIT $3;

-- name: fail_running
-- The sweeper ends attempts whose worker is gone (FAILED_WORKER_LOST) or ran past its timeout (TIMED_OUT),
-- compare-and-swap on the attempt and the worker it saw: a worker that finished meanwhile, or an attempt
-- that moved on, is left alone. Then as for a worker's failure: a retry $6 ms from now if attempts are left,
-- DEAD after the last, CANCELLED if a cancel was requested.
WITH failed AS (
    UPDATE executions e
    SET state = CASE
            WHEN e.cancel_requested_at IS NOT NULL THEN 'CANCELLED'
            WHEN e.attempt >= e.max_attempts THEN 'DEAD'
            ELSE f.state END,
        next_attempt_at = CASE
            WHEN e.cancel_requested_at IS NULL AND e.attempt < e.max_attempts
            THEN now() + f.delay_ms * interval '1 millisecond' END,
        error = f.error, finished_at = now()
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::bigint[])
         AS f (id, attempt, worker_id, state, error, delay_ms)
    WHERE e.id = f.id AND e.attempt = f.attempt AND e.state || '' = 'RUNNING' AND e.worker_id = f.worker_id
    RETURNING e.id, e.attempt, e.tenant_id, e.state, e.error, e.finished_at, e.shard, e.next_attempt_at,
              f.state AS attempt_state, f.worker_id AS lost_worker
), attempts AS (
    UPDATE execution_attempts a
    SET state = failed.attempt_state, error = failed.error, finished_at = failed.finished_at
    FROM failed
    WHERE a.execution_id = failed.id AND a.attempt = failed.attempt
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'sweep', 'RUNNING', attempt_state, $7,
           jsonb_build_object('attempt', attempt, 'worker', lost_worker, 'nextAttemptAt', next_attempt_at)
    FROM failed
    UNION ALL
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'DEAD' THEN 'dead' ELSE 'cancel' END, attempt_state, state,
           $7, jsonb_build_object('attempt', attempt)
    FROM failed WHERE state <> attempt_state
)
SELECT id, attempt, state, attempt_state, shard, next_attempt_at FROM failed;

-- name: cancel_requested
-- Of the given RUNNING executions, those whose cancel has been requested (the worker's fallback when the
-- Redis flag was lost).
SELECT id FROM executions WHERE id = ANY($1::uuid[]) AND state || '' = 'RUNNING' AND cancel_requested_at IS NOT NULL;

-- name: dead_letters
-- The sundial.dlq outbox: DEAD executions whose dead letter is not published yet, oldest first.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.pool, e.handler, e.attempt, e.max_attempts, e.error,
       e.finished_at, e.trace_id, j.name AS job_name, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.state = 'DEAD' AND e.dlq_published_at IS NULL
ORDER BY e.finished_at
LIMIT $1;

-- name: mark_dead_lettered
UPDATE executions SET dlq_published_at = now() WHERE id = ANY($1::uuid[]) AND state = 'DEAD';

-- name: list_executions_by_state
-- GET /v1/executions?state=…: one tenant's executions in one state, newest first, keyset on the id (UUIDv7).
SELECT * FROM executions
WHERE tenant_id = $1 AND state = $2 AND ($3::uuid IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4;

-- name: cancel_execution
-- POST /v1/executions/{id}/cancel. PENDING, or waiting for a retry: CANCELLED at once (a worker's start CAS
-- then fails, a claimed retry member matches nothing). RUNNING: the cancel is requested and its worker,
-- told through Redis (or this column), stops the handler and records CANCELLED. Anything else: no row.
WITH previous AS (
    SELECT id, state FROM executions
    WHERE id = $1 AND tenant_id = $2 AND (state IN ('PENDING', 'RUNNING') OR next_attempt_at IS NOT NULL)
    FOR UPDATE
), changed AS (
    UPDATE executions e
    SET state = CASE WHEN p.state = 'RUNNING' THEN e.state ELSE 'CANCELLED' END,
        cancel_requested_at = coalesce(e.cancel_requested_at, now()),
        next_attempt_at = NULL,
        finished_at = CASE WHEN p.state = 'RUNNING' THEN e.finished_at ELSE now() END
    FROM previous p WHERE e.id = p.id
    RETURNING e.*, p.state AS from_state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'CANCELLED' THEN 'cancel' ELSE 'cancel_request' END,
           from_state, state, $3
    FROM changed
)
SELECT * FROM changed;

-- name: retry_dead_execution
-- POST /v1/executions/{id}/retry: a DEAD execution gets one more attempt, scheduled now; the dispatcher
-- moves it to PENDING through the hot window like any retry. No row: not DEAD, or its retry is scheduled.
WITH changed AS (
    UPDATE executions
    SET next_attempt_at = now(), max_attempts = attempt + 1
    WHERE id = $1 AND tenant_id = $2 AND state = 'DEAD' AND next_attempt_at IS NULL
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'retry_request', 'DEAD', 'DEAD', $3,
           jsonb_build_object('nextAttempt', attempt + 1)
    FROM changed
)
SELECT * FROM changed;

-- name: claim_idempotency_key
-- Take the key for this request: a new key, one past its expiry, or (same body only) an in-flight claim
-- whose request died. No row: someone else holds it; read it with get_idempotency_key.
INSERT INTO idempotency_keys AS k (tenant_id, key, request_hash, token, state, locked_until, expires_at)
VALUES ($1, $2, $3, $4, 'IN_FLIGHT', now() + $5 * interval '1 second', now() + $6 * interval '1 second')
ON CONFLICT (tenant_id, key) DO UPDATE
SET request_hash = excluded.request_hash, token = excluded.token, state = 'IN_FLIGHT',
    locked_until = excluded.locked_until, expires_at = excluded.expires_at, status_code = NULL, headers = NULL,
    body = NULL, resource_id = NULL, created_at = now()
WHERE k.expires_at < now()
   OR (k.state = 'IN_FLIGHT' AND k.locked_until < now() AND k.request_hash = excluded.request_hash)
RETURNING token;

-- name: get_idempotency_key
SELECT *, locked_until < now() AS lock_expired FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND expires_at >= now();

-- name: complete_idempotency_key
-- In the transaction that created the resource: the key now answers with this response. No row: the claim
-- was taken over (this request outlived its lock), and the caller rolls its work back.
UPDATE idempotency_keys
SET state = 'DONE', status_code = $4, headers = $5, body = $6, resource_id = $7, locked_until = NULL
WHERE tenant_id = $1 AND key = $2 AND token = $3 AND state = 'IN_FLIGHT'
RETURNING key;

-- name: release_idempotency_key
-- The request failed without creating anything: let a retry with the key run at once.
DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 AND token = $3 AND state = 'IN_FLIGHT';

-- name: purge_idempotency_keys
-- Keys past their 24 hours, a batch at a time (the sweeper), on idempotency_keys_expiry_idx.
DELETE FROM idempotency_keys k
USING (SELECT tenant_id, key FROM idempotency_keys WHERE expires_at < now() ORDER BY expires_at LIMIT $1) old
WHERE k.tenant_id = old.tenant_id AND k.key = old.key;
