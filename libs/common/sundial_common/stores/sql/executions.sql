-- The execution store (sundial_common.stores.executions): executions and their attempts, from the API's
-- reads and cancels through the worker's start and finish to the sweeper's scans and dead letters.
-- State changes are compare-and-swap (DESIGN invariant 3): they name the state they expect and
-- return the rows they changed; zero rows means another actor won and the caller does nothing.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.
--
-- A batch of executions is found by primary key, never through the index of open states: a state filter
-- is written `e.state || '' = 'RUNNING'` (in the batches `texteq(e.state, 'RUNNING')`, see below), which no
-- index can serve. Otherwise the planner, which
-- guesses 10 elements for a parameter array and whose statistics lag a table growing by thousands of
-- rows a second, drove the join from executions_open_idx: every call scanned all PENDING (or
-- RUNNING) rows, or rescanned the array once per such row. Under a backlog that made one 250-row
-- finish cost 100 ms instead of 3 ms (a bench at a steady 5,000/s), and the backlog grew.
--
-- executions and execution_attempts are partitioned by day of the id (migration 0018). A batch joined from
-- unnest() alone would be pruned at run time, row by row, but planned over every partition: 4-6 ms of planning
-- per call at 40 partitions (the default retention), more than the call's execution. So every batch also names
-- its ids in a form the planner prunes with (plan_cache_mode is force_custom_plan: the arrays are constants):
-- `e.id = ANY($1)` on executions, a range of the batch's smallest and largest id on execution_attempts. Each
-- one on purpose:
-- * ANY on executions: one index scan that reads exactly the batch, whatever the statistics; a range of
--   whole days was tried (bench/workloads/storage.py): on a partition not analysed yet the planner guessed it at 0.5 % and
--   a 50-row start read the whole day.
-- * The CAS filters are written `texteq(e.state, 'PENDING')`: a function call, which no index serves (see
--   above) and whose selectivity the planner guesses at a third. As operators (an unknown expression at
--   0.5 %, worker_id by its statistics) they made the planner expect one row of the 250 it reads by ANY,
--   and it rescanned the unnest() for each row found: 250 x 250 rows, 10-20 ms a call. A third keeps the
--   hash join of the batch with the rows read.
-- * A range on execution_attempts, not ANY: its rows are probed per execution (a nested loop), and an ANY in
--   the probe's index condition sorts and walks the whole array at every probe.

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

-- name: executions_of_trace
-- GET /v1/executions?traceId=…[&state=…]: one tenant's executions of one trace (executions_trace_idx),
-- newest first.
SELECT * FROM executions
WHERE trace_id = $2 AND tenant_id = $1 AND ($5::text IS NULL OR state = $5) AND ($3::uuid IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4;

-- name: list_executions
-- GET /v1/executions: one tenant's executions, newest first, keyset on the id (UUIDv7). One index range per
-- state asked for ($2, every state when no filter) on executions_tenant_phase_idx, merged: a listing of all of
-- a tenant's executions needs no index of its own (which every execution write would pay for). The index has
-- the phase (migration 0023: OPEN for PENDING and RUNNING, so a start changes no index), the state is read on
-- the heap: PENDING's range and RUNNING's are both the tenant's open rows. Optional filters: job ($5), pool
-- ($6), handler ($7), scheduled_for in [$8, $9).
SELECT e.* FROM unnest($2::text[]) AS s (state)
CROSS JOIN LATERAL (
    SELECT * FROM executions x
    WHERE x.tenant_id = $1 AND x.phase = CASE WHEN s.state IN ('PENDING', 'RUNNING') THEN 'OPEN' ELSE s.state END
      AND x.state = s.state AND ($3::uuid IS NULL OR x.id < $3)
      AND ($5::uuid IS NULL OR x.job_id = $5)
      AND ($6::text IS NULL OR x.pool = $6)
      AND ($7::text IS NULL OR x.handler = $7)
      AND ($8::timestamptz IS NULL OR x.scheduled_for >= $8)
      AND ($9::timestamptz IS NULL OR x.scheduled_for < $9)
    ORDER BY x.id DESC
    LIMIT $4
) e
ORDER BY e.id DESC
LIMIT $4;

-- name: start_executions
-- PENDING -> RUNNING for a batch of delivered messages. A duplicate delivery, or a message for an
-- attempt that is no longer current, matches no row and is acknowledged without running.
-- published_at: the message's broker timestamp, unless the dispatcher has marked it already.
-- $5, $6: the smallest and largest of the ids (the attempts' partitions, see the note at the top).
-- $7: per claim, the instant its handler is launched if that is still to come (a message published ahead, claimed
-- just before it is due: sundial_worker.holding), else NULL; started_at is the later of it and now().
WITH started AS (
    UPDATE executions e
    SET state = 'RUNNING', worker_id = $3, started_at = greatest(now(), m.launch_at),
        published_at = coalesce(e.published_at, m.published_at, now())
    FROM unnest($1::uuid[], $2::int[], $4::timestamptz[], $7::timestamptz[])
         AS m (id, attempt, published_at, launch_at)
    WHERE e.id = ANY($1::uuid[]) AND e.id = m.id AND e.attempt = m.attempt AND texteq(e.state, 'PENDING')
    RETURNING e.id, e.attempt, e.tenant_id, e.job_id, e.scheduled_for, e.fire_at, e.started_at, e.trace_id
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
    WHERE s.attempt > 1 AND a.execution_id = s.id AND a.execution_id BETWEEN $5 AND $6
      AND a.attempt < s.attempt AND a.progress IS NOT NULL
    ORDER BY a.attempt DESC LIMIT 1
) previous ON true;

-- name: start_executions_as
-- start_executions with a worker id per claim ($3): the gateway's gathered starts of several callers in one
-- statement. A claim named twice matches its row once (the first to the update wins); the returned worker_id
-- says whose start was accepted.
WITH started AS (
    UPDATE executions e
    SET state = 'RUNNING', worker_id = m.worker_id, started_at = now(),
        published_at = coalesce(e.published_at, m.published_at, now())
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::timestamptz[]) AS m (id, attempt, worker_id, published_at)
    WHERE e.id = ANY($1::uuid[]) AND e.id = m.id AND e.attempt = m.attempt AND texteq(e.state, 'PENDING')
    RETURNING e.id, e.attempt, e.tenant_id, e.job_id, e.scheduled_for, e.fire_at, e.started_at, e.trace_id,
              e.worker_id
), attempts AS (
    INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, started_at)
    SELECT id, attempt, tenant_id, worker_id, 'RUNNING', started_at FROM started
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'start', 'PENDING', 'RUNNING', worker_id FROM started
)
SELECT s.*, j.retry_policy, previous.progress AS previous_progress
FROM started s
JOIN jobs j ON j.id = s.job_id
LEFT JOIN LATERAL (
    SELECT a.progress FROM execution_attempts a
    WHERE s.attempt > 1 AND a.execution_id = s.id AND a.execution_id BETWEEN $5 AND $6
      AND a.attempt < s.attempt AND a.progress IS NOT NULL
    ORDER BY a.attempt DESC LIMIT 1
) previous ON true;

-- name: finish_executions
-- RUNNING -> how the attempt ended, only for the attempt this worker owns. A worker that lost its claim
-- (the sweeper moved on) gets zero rows and its result is dropped.
-- A FAILED or TIMED_OUT attempt schedules the next one $7 ms after its end (the worker computed the backoff) if
-- attempts are left and $7 is not negative (a negative delay: a failure no retry can mend); the last one leaves the execution DEAD, and one whose cancel was requested CANCELLED.
-- The attempt row keeps how the attempt itself ended, with the handler's traceback ($10) and log tail ($11).
-- $8, $9: the smallest and largest of the ids. $12: when the handler was launched, for an attempt claimed ahead of
-- its instant (started_at held the instant it was to be launched at), else NULL. $13: when the handler ended (the
-- worker writes its outcomes a few at a time), else NULL: now; never after now (a worker clock ahead of the
-- database's) nor before the start. The retry breaker's trigger counts the attempts a statement moves out of
-- RUNNING, whatever end they record (migration 0039).
WITH finished AS (
    UPDATE executions e
    SET state = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NOT NULL THEN 'CANCELLED'
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND (e.attempt >= e.max_attempts OR f.delay_ms < 0) THEN 'DEAD'
            ELSE f.state END,
        next_attempt_at = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NULL AND e.attempt < e.max_attempts
                 AND f.delay_ms >= 0
            THEN greatest(least(f.finished_at, now()), f.started_at, e.started_at) + f.delay_ms * interval '1 millisecond'
            END,
        result = f.result, error = f.error, started_at = coalesce(f.started_at, e.started_at),
        finished_at = greatest(least(f.finished_at, now()), f.started_at, e.started_at)
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::jsonb[], $5::text[], $7::bigint[], $10::text[], $11::text[],
                $12::timestamptz[], $13::timestamptz[])
         AS f (id, attempt, state, result, error, delay_ms, traceback, log_tail, started_at, finished_at)
    WHERE e.id = ANY($1::uuid[]) AND e.id = f.id AND e.attempt = f.attempt
      AND texteq(e.state, 'RUNNING') AND texteq(e.worker_id, $6)
    RETURNING e.id, e.attempt, e.tenant_id, e.pool, e.state, e.error, e.finished_at, e.started_at, e.shard,
              e.next_attempt_at, f.state AS attempt_state, f.traceback, f.log_tail
), attempts AS (
    UPDATE execution_attempts a
    SET state = finished.attempt_state, error = finished.error, finished_at = finished.finished_at,
        started_at = finished.started_at,
        traceback = finished.traceback, log_tail = finished.log_tail
    FROM finished
    WHERE a.execution_id = finished.id AND a.execution_id BETWEEN $8 AND $9 AND a.attempt = finished.attempt
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'finish', 'RUNNING', attempt_state, $6,
           -- the exception's class (readable: only the message is sealed), e.g. PoolRefused for a worker refusal
           jsonb_build_object('attempt', attempt, 'nextAttemptAt', next_attempt_at,
                              'errorClass', substring(error from '^([A-Za-z_][A-Za-z0-9_.]*)'))
    FROM finished
    UNION ALL
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'DEAD' THEN 'dead' ELSE 'cancel' END, attempt_state, state,
           $6, jsonb_build_object('attempt', attempt)
    FROM finished WHERE state <> attempt_state
)
SELECT id, attempt, tenant_id, pool, state, attempt_state, shard, next_attempt_at FROM finished;

-- name: finish_executions_as
-- finish_executions with a worker id per outcome ($6): the gateway's gathered finishes of several callers in one
-- statement; each attempt is ended only if it is RUNNING under its own outcome's worker.
WITH finished AS (
    UPDATE executions e
    SET state = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NOT NULL THEN 'CANCELLED'
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND (e.attempt >= e.max_attempts OR f.delay_ms < 0) THEN 'DEAD'
            ELSE f.state END,
        next_attempt_at = CASE
            WHEN f.state IN ('FAILED', 'TIMED_OUT') AND e.cancel_requested_at IS NULL AND e.attempt < e.max_attempts
                 AND f.delay_ms >= 0
            THEN greatest(least(f.finished_at, now()), f.started_at, e.started_at) + f.delay_ms * interval '1 millisecond'
            END,
        result = f.result, error = f.error, started_at = coalesce(f.started_at, e.started_at),
        finished_at = greatest(least(f.finished_at, now()), f.started_at, e.started_at)
    FROM unnest($1::uuid[], $2::int[], $3::text[], $4::jsonb[], $5::text[], $7::bigint[], $10::text[], $11::text[],
                $6::text[], $12::timestamptz[], $13::timestamptz[])
         AS f (id, attempt, state, result, error, delay_ms, traceback, log_tail, worker_id, started_at, finished_at)
    WHERE e.id = ANY($1::uuid[]) AND e.id = f.id AND e.attempt = f.attempt
      AND texteq(e.state, 'RUNNING') AND texteq(e.worker_id, f.worker_id)
    RETURNING e.id, e.attempt, e.tenant_id, e.pool, e.state, e.error, e.finished_at, e.started_at, e.shard,
              e.next_attempt_at, f.state AS attempt_state, f.traceback, f.log_tail, f.worker_id
), attempts AS (
    UPDATE execution_attempts a
    SET state = finished.attempt_state, error = finished.error, finished_at = finished.finished_at,
        started_at = finished.started_at,
        traceback = finished.traceback, log_tail = finished.log_tail
    FROM finished
    WHERE a.execution_id = finished.id AND a.execution_id BETWEEN $8 AND $9 AND a.attempt = finished.attempt
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'finish', 'RUNNING', attempt_state, worker_id,
           -- the exception's class (readable: only the message is sealed), e.g. PoolRefused for a worker refusal
           jsonb_build_object('attempt', attempt, 'nextAttemptAt', next_attempt_at,
                              'errorClass', substring(error from '^([A-Za-z_][A-Za-z0-9_.]*)'))
    FROM finished
    UNION ALL
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'DEAD' THEN 'dead' ELSE 'cancel' END, attempt_state, state,
           worker_id, jsonb_build_object('attempt', attempt)
    FROM finished WHERE state <> attempt_state
)
SELECT id, attempt, tenant_id, pool, state, attempt_state, shard, next_attempt_at FROM finished;

-- name: record_progress
UPDATE execution_attempts a SET progress = $4
FROM executions e
WHERE a.execution_id = $1 AND a.attempt = $2 AND e.id = a.execution_id AND e.attempt = a.attempt
  AND e.state = 'RUNNING' AND e.worker_id = $3
RETURNING a.execution_id;

-- name: cancel_requested
-- Of the given RUNNING executions, those whose cancel has been requested (the worker's fallback when the
-- Redis flag was lost).
SELECT id FROM executions WHERE id = ANY($1::uuid[]) AND state || '' = 'RUNNING' AND cancel_requested_at IS NOT NULL;

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
    FROM previous p WHERE e.id = p.id AND e.id = $1  -- $1 again: planned on its partition only
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

-- name: running_executions
-- The sweeper's view of RUNNING executions, oldest first, keyset-paged on executions_open_idx (every open row,
-- the PENDING ones skipped on the heap; migration 0023): who runs each attempt, since when, its timeout, and
-- the job's retry policy (for the backoff of a lost attempt).
SELECT e.id, e.tenant_id, e.job_id, e.shard, e.worker_id, e.attempt, e.max_attempts, e.created_at, e.started_at,
       e.timeout_sec, e.cancel_requested_at, e.traceparent, j.retry_policy, now() AS db_now
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'OPEN' AND e.state = 'RUNNING' AND (e.created_at, e.id) > ($1, $2::uuid)
ORDER BY e.created_at, e.id
LIMIT $3;

-- name: fail_running
-- The sweeper ends attempts whose worker is gone (FAILED_WORKER_LOST) or ran past its timeout (TIMED_OUT),
-- compare-and-swap on the attempt and the worker it saw: a worker that finished meanwhile, or an attempt
-- that moved on, is left alone. Then as for a worker's failure: a retry $6 ms from now if attempts are left,
-- DEAD after the last, CANCELLED if a cancel was requested. $8, $9: the smallest and largest of the ids.
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
    WHERE e.id = ANY($1::uuid[]) AND e.id = f.id AND e.attempt = f.attempt AND texteq(e.state, 'RUNNING')
      AND e.worker_id = f.worker_id
    RETURNING e.id, e.attempt, e.tenant_id, e.pool, e.state, e.error, e.finished_at, e.shard, e.next_attempt_at,
              f.state AS attempt_state, f.worker_id AS lost_worker
), attempts AS (
    UPDATE execution_attempts a
    SET state = failed.attempt_state, error = failed.error, finished_at = failed.finished_at
    FROM failed
    WHERE a.execution_id = failed.id AND a.execution_id BETWEEN $8 AND $9 AND a.attempt = failed.attempt
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
SELECT id, attempt, tenant_id, pool, state, attempt_state, shard, next_attempt_at FROM failed;

-- name: dead_letters
-- The sundial.dlq outbox: DEAD executions whose dead letter is not published yet, oldest first.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.pool, e.handler, e.attempt, e.max_attempts, e.error,
       e.finished_at, e.trace_id, e.traceparent, j.name AS job_name, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'DEAD' AND e.dlq_published_at IS NULL
ORDER BY e.finished_at
LIMIT $1;

-- name: mark_dead_lettered
UPDATE executions SET dlq_published_at = now() WHERE id = ANY($1::uuid[]) AND state = 'DEAD';

-- name: count_dead
-- The sweeper's sample of sundial_dead_letter_queue_size{tenant}: DEAD executions per tenant, one range of
-- executions_tenant_phase_idx per tenant that has jobs (not a scan of every execution).
SELECT t.tenant_id,
       (SELECT count(*) FROM executions e WHERE e.tenant_id = t.tenant_id AND e.phase = 'DEAD') AS dead
FROM (SELECT DISTINCT tenant_id FROM jobs) t;

-- name: pending_by_pool
-- Executions waiting for a worker (PENDING: dispatched, not started), per pool: how many, and the creation of the
-- oldest. $1: one tenant's only (NULL: every tenant's); $2: one pool (NULL: every pool). Open rows only
-- (executions_open_idx, or executions_tenant_phase_idx for a tenant): a backlog, not a scan of the history.
SELECT pool, count(*) AS pending, min(created_at) AS oldest
FROM executions
WHERE phase = 'OPEN' AND state = 'PENDING' AND ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR pool = $2)
GROUP BY pool;

-- name: attempts_ended_by
-- Of these (execution, attempt) pairs, the attempts this worker's own finish already ended, and how: a finish
-- written again after its acknowledgement was lost (Postgres restarted between the commit and the reply) finds
-- its own outcome here — its audit row names this worker — not the sweeper's or another actor's.
-- $3, $4: the smallest and largest of the ids.
SELECT a.execution_id, a.state
FROM execution_attempts a
JOIN unnest($1::uuid[], $2::int[]) AS r (execution_id, attempt)
  ON a.execution_id = r.execution_id AND a.attempt = r.attempt
WHERE a.execution_id BETWEEN $3 AND $4 AND a.worker_id = $5 AND a.finished_at IS NOT NULL
  AND EXISTS (
      SELECT 1 FROM audit_log l
      WHERE l.entity_id = a.execution_id AND l.action = 'finish' AND l.actor = $5
        AND l.detail ->> 'attempt' = a.attempt::text
  );
