-- The dispatch store (sundial_common.stores.dispatch): what a shard's leader writes under its fence
-- (first attempts and retries), and the execution outbox the dispatcher and sweeper publish from.
-- State changes are compare-and-swap (DESIGN invariant 3): they name the state they expect and
-- return the rows they changed; zero rows means another actor won and the caller does nothing.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.
-- A batch of executions is found by primary key (see the note opening executions.sql).

-- name: take_shard
-- A new term begins: Postgres issues its fencing token, one more than the shard's recorded fence, so tokens
-- only grow whatever etcd remembers (a rebuilt or restored etcd restarts its revisions). Taking the row lock
-- waits for a dispatch transaction of the previous term in flight; once this commits, every later write of
-- that term finds a larger token recorded (raise_fence below) and is rejected. A shard never led before
-- starts at 1. (Fences recorded before tokens came from here hold etcd revisions: they continue from those.)
INSERT INTO shard_fence AS f (shard, token, holder) VALUES ($1, 1, $2)
ON CONFLICT (shard) DO UPDATE SET token = f.token + 1, holder = excluded.holder, updated_at = now()
RETURNING token;

-- name: raise_fence
-- DESIGN invariant 4: the shard's token only grows. No row back = a newer term has begun (take_shard).
INSERT INTO shard_fence AS f (shard, token, holder) VALUES ($1, $2, $3)
ON CONFLICT (shard) DO UPDATE SET token = excluded.token, holder = excluded.holder, updated_at = now()
WHERE f.token <= excluded.token
RETURNING token;

-- name: shard_fences
-- The admin view: per shard, the highest leadership token that has written and who held it.
SELECT shard, token, holder, updated_at FROM shard_fence ORDER BY shard;

-- name: lock_due_jobs
-- The claimed members that are due in Postgres, locked so nobody moves them while this transaction
-- dispatches them, under the fences of their shards raised in the same statement (raise_fence above, DESIGN
-- invariant 4). One statement serves every shard of the transaction (a dispatcher process commits the passes of
-- the shards it leads together: sundial_dispatcher.group_commit): $3/$4 are the shards and their terms' tokens,
-- $6 each claim's shard. The fences are raised in shard order, so two transactions that share shards take their
-- rows in the same order. The lateral subquery reads a fence's row before any of its shard's jobs, so a fence
-- row is locked before its jobs', in the order a newer term's transaction takes them.
-- A row per raised fence (raised_shard) and its shard's due jobs; a shard without any row is fenced out (a
-- newer term has begun: nothing of it may be written); a row of NULL job columns = the fence is ours and
-- nothing is due.
-- Due: an active job whose next fire is at or before the claimed score, or a live job with a trigger pending
-- at or before it. A member scored later than the job's next fire (a BUFFER_ONE hold, a re-added member)
-- still dispatches it; one scored earlier (stale) matches nothing.
-- The open executions of jobs with an overlap policy other than ALLOW are filled in from
-- open_executions_of_jobs, asked only when the batch has such jobs: executions is partitioned by day (migration 0018) and a lookup by job
-- here would plan every partition's index for every dispatch (10 ms a batch with 40 partitions).
-- The job's columns the dispatch reads, not j.*: asyncpg decodes every column returned for every job locked, and
-- the others (its name, labels and retry policy, two of them jsonb decoded in Python, its priority, version,
-- missed fires, delay, creation and update times) are the insert's to read from the row (insert_executions) or
-- nobody's here. A column the planner (sundial_dispatcher.dispatcher, spec_from_row), the message, the breakers'
-- HOLD (hold_first_fires) or this store read must be listed: a Record's get() of a column not returned is None,
-- not an error (tests/integration/test_dispatch_path.py checks the dispatcher reads only what is here).
WITH fence AS (
    INSERT INTO shard_fence AS f (shard, token, holder)
    SELECT s.shard, s.token, $5 FROM unnest($3::int[], $4::bigint[]) AS s (shard, token) ORDER BY s.shard
    ON CONFLICT (shard) DO UPDATE SET token = excluded.token, holder = excluded.holder, updated_at = now()
    WHERE f.token <= excluded.token
    RETURNING shard
)
SELECT fence.shard AS raised_shard, due.* FROM fence LEFT JOIN LATERAL (
    SELECT j.id, j.tenant_id, j.type, j.state, j.shard, j.pool, j.handler, j.payload, j.timeout_sec, j.traceparent,
           j.schedule, j.timezone, j.run_at, j.interval_sec, j.run_list, j.start_at, j.end_at, j.max_runs,
           j.jitter_sec, j.next_fire_at, j.next_nominal_at, j.fire_count, j.overlap_policy, j.catchup_policy,
           j.catchup_window_sec, j.trigger_at, j.trigger_execution_id, j.trigger_traceparent, j.breaker,
           c.due AS claimed_due, NULL::uuid[] AS open_execution_ids, NULL::text[] AS open_execution_states
    FROM jobs j
    -- Scores are epoch milliseconds; fire times are written at millisecond precision, compared at it too.
    JOIN unnest($1::uuid[], $2::timestamptz[], $6::int[]) AS c (id, due, shard) ON j.id = c.id
    WHERE c.shard = fence.shard AND j.shard = fence.shard
      AND ((j.state = 'ACTIVE' AND date_trunc('milliseconds', j.next_fire_at) <= c.due)
           OR (j.state <> 'CANCELLED' AND j.trigger_at <= c.due))
    ORDER BY j.id
    FOR UPDATE OF j
) AS due ON true;

-- name: open_executions_of_jobs
-- Each job's executions still open (PENDING or RUNNING), oldest first: one probe of executions_job_open_idx
-- per job and partition.
SELECT e.job_id, array_agg(e.id ORDER BY e.scheduled_for) AS ids, array_agg(e.state ORDER BY e.scheduled_for) AS states
FROM executions e
WHERE e.job_id = ANY($1::uuid[]) AND e.phase = 'OPEN'
GROUP BY e.job_id;

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
-- One row per occurrence; a SKIPPED one (overlap policy) is terminal at once and never published. With the
-- batch's executions, its jobs' moves ($11-$18), in the same statement (data-modifying CTEs: one round trip).
-- Each dispatched job moves to its next occurrence, with compare-and-set on the one it was at; a job with no
-- next occurrence is COMPLETED. A job only holding a trigger (advance = false) keeps its schedule. Missed
-- fires (catch-up) and completions are audited.
-- What an execution inherits from its job (tenant, pool, handler, timeout, priority, shard, maxAttempts of its
-- retry policy) comes from its job's move (advanced's RETURNING), not from arrays sent back: asyncpg encodes each
-- array element in the dispatcher and Postgres unnests it, and 9 of the 17 arrays an execution had were these.
-- lock_due_jobs locked those rows earlier in this transaction, so they are the versions the planner saw (no other
-- transaction can change them before commit), and the move changes none of these columns. Read from the move,
-- not from jobs again: a join of the batch to jobs cost ~70 µs more backend CPU an execution than the arrays it
-- replaced (bench/workloads/dispatch_insert.py). So every execution needs its job's move in the batch
-- (the planner always makes one: PostgresDispatchStore checks it), and an execution whose job did not move
-- (its compare-and-set failed, which the lock rules out) is not created either.
-- Each execution carries its shard's term token: $9/$10 are the transaction's shards and tokens (one statement
-- for every shard of the transaction, lock_due_jobs above), joined on the job's shard; a shard missing there
-- is a NULL token, which the NOT NULL column refuses (the transaction fails: no execution is written unfenced).
-- The trace id is the traceparent's second field (W3C), as the planner's span has both.
-- An array whose every element is its column's default comes empty (nearly always: state PENDING, not triggered,
-- no note, one run, none missed, advancing, no trigger; no next fire for a one-off): unnest() pads it with NULLs,
-- read here as that default, and the dispatcher encodes 7 elements per one-shot execution instead of 16
-- (PostgresDispatchStore's insert_arguments).
-- ON CONFLICT without a target: executions is partitioned by id (migration 0018), so the occurrence key
-- (job_id, scheduled_for) is a unique index of each partition, an arbiter only when no target is named.
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
    FROM (SELECT id, prev, next_fire_at, next_nominal_at, coalesce(runs, 1) AS runs, coalesce(missed, 0) AS missed,
                 coalesce(advance, true) AS advance, coalesce(trigger_done, false) AS trigger_done
          FROM unnest($11::uuid[], $12::timestamptz[], $13::timestamptz[], $14::timestamptz[], $15::int[],
                      $16::bigint[], $17::bool[], $18::bool[])
               AS a (id, prev, next_fire_at, next_nominal_at, runs, missed, advance, trigger_done)) AS a
    WHERE j.id = a.id AND (NOT a.advance OR (j.next_fire_at = a.prev AND j.state = 'ACTIVE'))
    RETURNING j.id, j.tenant_id, j.state, a.advance, a.missed, j.shard, j.pool, j.handler, j.timeout_sec,
              j.priority, coalesce((j.retry_policy ->> 'maxAttempts')::int, 1) AS max_attempts
), inserted AS (
    INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,
                            max_attempts, timeout_sec, trace_id, traceparent, fire_at, triggered, error,
                            finished_at, priority)
    SELECT e.id, j.tenant_id, j.id, e.scheduled_for, j.shard, f.token, j.pool, j.handler, e.state, j.max_attempts,
           j.timeout_sec, nullif(split_part(e.traceparent, '-', 2), ''), e.traceparent, e.fire_at, e.triggered,
           e.note, CASE WHEN e.state = 'SKIPPED' THEN now() END, j.priority
    FROM (SELECT id, job_id, scheduled_for, fire_at, coalesce(state, 'PENDING') AS state,
                 coalesce(triggered, false) AS triggered, note, traceparent
          FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[], $4::timestamptz[], $5::text[], $6::bool[],
                      $7::text[], $8::text[])
               AS e (id, job_id, scheduled_for, fire_at, state, triggered, note, traceparent)) AS e
    JOIN advanced j ON j.id = e.job_id
    LEFT JOIN unnest($9::int[], $10::bigint[]) AS f (shard, token) ON f.shard = j.shard
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id, state, error
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, CASE WHEN state = 'SKIPPED' THEN 'skip' ELSE 'dispatch' END, NULL, state,
           $19, CASE WHEN error IS NOT NULL THEN jsonb_build_object('reason', error) END
    FROM inserted
    UNION ALL
    SELECT tenant_id, 'job', id, 'complete', 'ACTIVE', 'COMPLETED', $19, NULL FROM advanced
    WHERE advance AND state = 'COMPLETED'
    UNION ALL
    SELECT tenant_id, 'job', id, 'missed', NULL, NULL, $19, jsonb_build_object('missedFires', missed) FROM advanced
    WHERE missed > 0
)
SELECT id FROM inserted;

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
       e.attempt, e.timeout_sec, e.traceparent, e.fire_at, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'OPEN' AND e.state = 'PENDING'
  AND ((e.published_at IS NULL AND coalesce(e.pending_since, e.created_at) < $1) OR e.published_at < $2)
ORDER BY e.created_at
LIMIT $3;

-- name: pending_after
-- Every PENDING execution, a page at a time in id order after $1: the broker restarted empty and lost every
-- message it held, so each PENDING execution's message may be gone (the sweeper sends them all again).
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
       e.attempt, e.timeout_sec, e.traceparent, e.fire_at, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'OPEN' AND e.state = 'PENDING' AND e.id > $1
ORDER BY e.id
LIMIT $2;

-- name: pending_among
-- Those of the given executions still PENDING, with their payloads: a republish after a broker restart that
-- failed for them is tried again at the next pass.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
       e.attempt, e.timeout_sec, e.traceparent, e.fire_at, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.id = ANY($1::uuid[]) AND e.state = 'PENDING'
ORDER BY e.id;

-- name: republished
UPDATE executions SET published_at = now() WHERE id = ANY($1::uuid[]) AND state || '' = 'PENDING';

-- name: published_pending_pools
-- The pools with PENDING executions published and not started, each with the oldest such publish: the pools whose
-- consumer groups the sweeper reads to learn which messages the broker dropped. Through the open rows' index.
SELECT pool, min(published_at) AS oldest
FROM executions
WHERE phase = 'OPEN' AND state = 'PENDING' AND published_at IS NOT NULL
GROUP BY pool;

-- name: passed_pending
-- A pool's PENDING executions published before $2, the instant its consumer group had acknowledged every message
-- appended before: their messages are no longer in the topic (the broker dropped them), so they are sent again.
SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, e.shard, e.fence_token, e.pool, e.handler,
       e.attempt, e.timeout_sec, e.traceparent, e.fire_at, j.payload
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.phase = 'OPEN' AND e.state = 'PENDING' AND e.pool = $1 AND e.published_at < $2
ORDER BY e.created_at
LIMIT $3;

-- name: retry_ranges
-- Scheduled retries due before $4, a page of every shard of $1 in one statement: per shard, after its keyset
-- position ($2, $3), up to $5 of them; the hydrator promotes them into the hot window beside the jobs. One index
-- range scan on executions_retry_idx per shard under the LATERAL (it was one statement per shard).
SELECT s.shard, e.id, e.next_attempt_at
FROM unnest($1::int[], $2::timestamptz[], $3::uuid[]) AS s (shard, after_due, after_id)
CROSS JOIN LATERAL (
    SELECT id, next_attempt_at FROM executions
    WHERE shard = s.shard AND next_attempt_at IS NOT NULL
      AND (next_attempt_at, id) > (s.after_due, s.after_id) AND next_attempt_at < $4
    ORDER BY next_attempt_at, id
    LIMIT $5
) AS e
ORDER BY s.shard, e.next_attempt_at, e.id;

-- name: overdue_retries
-- Scheduled retries that should have been dispatched before $2 and were not, every shard of $1 in one statement
-- (up to $3 per shard, oldest first): their hot-window member was lost (Redis flushed, a dispatcher died after
-- claiming it, the writer could not reach Redis). It was one statement per shard every overdue interval.
SELECT s.shard, e.id, e.next_attempt_at
FROM unnest($1::int[]) AS s (shard)
CROSS JOIN LATERAL (
    SELECT id, next_attempt_at FROM executions
    WHERE shard = s.shard AND next_attempt_at IS NOT NULL AND next_attempt_at < $2
    ORDER BY next_attempt_at, id
    LIMIT $3
) AS e;

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
