-- The job store (sundial_common.stores.jobs): jobs' definitions and lifecycle, and the hydrator's scans
-- of the jobs coming due.
-- State changes are compare-and-swap (DESIGN invariant 3): they name the state they expect and
-- return the rows they changed; zero rows means another actor won and the caller does nothing.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.

-- name: insert_job
-- The job and its audit row in one statement. The API creates jobs only for registered tenants (its
-- authentication checks the registry); a direct caller of the store (tests, the bench's loaders) gets its
-- tenant registered with the registry's defaults, as the foreign key needs.
WITH tenant AS (
    INSERT INTO tenants (id) VALUES ($2) ON CONFLICT (id) DO NOTHING
), job AS (
    INSERT INTO jobs (id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
                      payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
                      interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
                      catchup_policy, catchup_window_sec, next_nominal_at, labels, breaker, key, key_digest)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33)
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT tenant_id, 'job', id, 'create', state, $19 FROM job
)
SELECT * FROM job;

-- name: insert_jobs
-- Jobs as one JSON array (POST /v1/jobs:batch, and concurrent single creates written together: the API's group
-- commit): jobs of any tenants, each object holding one job's column values and the `actor` of its audit row.
-- The jobs and their audit rows in one statement, so one commit makes every job durable at once (tenants as
-- for insert_job). Columns not named here take their defaults.
WITH input AS (
    SELECT j.*, e ->> 'actor' AS actor
    FROM jsonb_array_elements($1::jsonb) AS e, LATERAL jsonb_populate_record(NULL::jobs, e) AS j
), tenant AS (
    INSERT INTO tenants (id) SELECT DISTINCT tenant_id FROM input ON CONFLICT (id) DO NOTHING
), job AS (
    INSERT INTO jobs (id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
                      payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
                      interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
                      catchup_policy, catchup_window_sec, next_nominal_at, labels, breaker, key, key_digest)
    SELECT id, tenant_id, name, type, schedule, timezone, run_at, delay_seconds, pool, handler,
           payload, retry_policy, timeout_sec, priority, state, shard, next_fire_at, traceparent,
           interval_sec, run_list, start_at, end_at, max_runs, jitter_sec, overlap_policy,
           catchup_policy, catchup_window_sec, next_nominal_at, labels, breaker, key, key_digest
    FROM input
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor)
    SELECT job.tenant_id, 'job', job.id, 'create', job.state, input.actor FROM job JOIN input USING (id)
)
SELECT * FROM job;

-- name: get_job
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2;

-- name: get_job_by_key
-- The tenant's job registered with this key (jobs_tenant_key_idx: unique per tenant).
SELECT * FROM jobs WHERE tenant_id = $1 AND key = $2;

-- name: cancel_job
-- A cancelled job fires no more; executions already dispatched are not touched here, except one dispatched ahead
-- of its due instant and not yet due (withdrawn below). Its dependency triggers
-- still waiting are dropped (a cancelled child is never scanned again: left, they would stay in the pending
-- index every shard leader probes) and its running backfills end CANCELLED, in the same statement.
WITH previous AS (
    SELECT id, state FROM jobs WHERE id = $1 AND tenant_id = $2 AND state IN ('ACTIVE', 'PAUSED') FOR UPDATE
), job AS (
    UPDATE jobs j SET state = 'CANCELLED', next_fire_at = NULL, version = j.version + 1, updated_at = now()
    FROM previous WHERE j.id = previous.id
    RETURNING j.*
), triggers AS (
    DELETE FROM job_triggers t USING job WHERE t.child_job_id = job.id AND t.consumed_at IS NULL
), backfills AS (
    UPDATE backfills b SET state = 'CANCELLED', finished_at = now() FROM job
    WHERE b.job_id = job.id AND b.state = 'RUNNING'
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT job.tenant_id, 'job', job.id, 'cancel', previous.state, 'CANCELLED', $3 FROM job JOIN previous USING (id)
), withdrawn AS (
    -- An execution dispatched ahead of its due instant (SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS) and not yet due is
    -- withdrawn with the job: CANCELLED, so its worker's start CAS loses. It would not exist yet without the lead.
    UPDATE executions e
    SET state = 'CANCELLED', cancel_requested_at = now(), finished_at = now(), error = 'job cancelled before the execution was due'
    FROM job WHERE e.job_id = job.id AND e.phase = 'OPEN' AND e.state = 'PENDING' AND e.fire_at > now()
    RETURNING e.id, e.tenant_id
), withdrawn_audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'cancel', 'PENDING', 'CANCELLED', $3 FROM withdrawn
)
SELECT * FROM job;

-- name: pause_job
-- ACTIVE -> PAUSED. The job keeps its next occurrence; resuming hands it to the catch-up policy. An execution
-- dispatched ahead of its due instant and not yet due is withdrawn (CANCELLED): a resume does not bring it back.
WITH previous AS (
    SELECT id FROM jobs WHERE id = $1 AND tenant_id = $2 AND state = 'ACTIVE' FOR UPDATE
), job AS (
    UPDATE jobs j SET state = 'PAUSED', version = j.version + 1, updated_at = now()
    FROM previous WHERE j.id = previous.id
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'job', id, 'pause', 'ACTIVE', 'PAUSED', $3 FROM job
), withdrawn AS (
    -- An execution dispatched ahead of its due instant (SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS) and not yet due is
    -- withdrawn with the job: CANCELLED, so its worker's start CAS loses. It would not exist yet without the lead.
    UPDATE executions e
    SET state = 'CANCELLED', cancel_requested_at = now(), finished_at = now(), error = 'job paused before the execution was due'
    FROM job WHERE e.job_id = job.id AND e.phase = 'OPEN' AND e.state = 'PENDING' AND e.fire_at > now()
    RETURNING e.id, e.tenant_id
), withdrawn_audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor)
    SELECT tenant_id, 'execution', id, 'cancel', 'PENDING', 'CANCELLED', $3 FROM withdrawn
)
SELECT * FROM job;

-- name: resume_job
-- PAUSED -> ACTIVE with the occurrence it had when paused: if that is past, the dispatcher fires it at once
-- and applies the catch-up policy to the occurrences missed meanwhile.
WITH previous AS (
    SELECT id FROM jobs WHERE id = $1 AND tenant_id = $2 AND state = 'PAUSED' FOR UPDATE
), job AS (
    UPDATE jobs j
    -- A DEPENDENT job has no occurrence of its own (it fires after its parents): it goes back to ACTIVE.
    SET state = CASE WHEN j.next_fire_at IS NULL AND j.type <> 'DEPENDENT' THEN 'COMPLETED' ELSE 'ACTIVE' END,
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
-- A trigger already pending is kept: a double click runs once. $6: the request's traceparent, which the
-- triggered execution's trace continues.
WITH job AS (
    UPDATE jobs SET trigger_at = $3, trigger_execution_id = $4, trigger_traceparent = $6, updated_at = now()
    WHERE id = $1 AND tenant_id = $2 AND state <> 'CANCELLED' AND trigger_at IS NULL
    RETURNING *
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor, detail)
    SELECT tenant_id, 'job', id, 'trigger', $5, jsonb_build_object('executionId', $4::uuid) FROM job
)
SELECT * FROM job;

-- name: pending_trigger
-- The job holding a manual run whose execution ($1, trigger_job's id) the shard leader has not created yet: the
-- API answers that execution as PENDING meanwhile. The leader creates it and clears the trigger in one
-- transaction, so a run is always found here or in executions (jobs_trigger_execution_idx).
SELECT * FROM jobs WHERE trigger_execution_id = $1 AND tenant_id = $2;

-- name: update_job
-- PATCH: compare-and-set on the version the client saw ($3) and on the occurrence the new values were
-- computed from ($4, the next fire read with it), so a dispatch committed in between is never overwritten.
WITH job AS (
    UPDATE jobs j
    SET name = $6, type = $7, schedule = $8, timezone = $9, run_at = $10, delay_seconds = $11, pool = $12,
        handler = $13, payload = $14, retry_policy = $15, timeout_sec = $16, priority = $17, interval_sec = $18,
        run_list = $19, start_at = $20, end_at = $21, max_runs = $22, jitter_sec = $23, overlap_policy = $24,
        catchup_policy = $25, catchup_window_sec = $26, next_fire_at = $27, next_nominal_at = $28, state = $29,
        labels = $32, breaker = $33, version = j.version + 1, updated_at = now()
    WHERE j.id = $1 AND j.tenant_id = $2 AND j.version = $3 AND j.next_fire_at IS NOT DISTINCT FROM $4
      AND j.state = $5
    RETURNING j.*
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'job', id, 'update', $5, state, $30, $31 FROM job
)
SELECT * FROM job;

-- name: hydration_ranges
-- The hydrator's promotion, a page of every shard of $1 in one statement: per shard, active jobs due before $4
-- after its keyset position ($2, $3) so that many jobs at one instant page correctly, up to $5 of them. One index
-- range scan on jobs_due_idx per shard under the LATERAL, never a table scan; it was one statement per shard (each
-- shard's slice every 10 s idle: 8 statements).
SELECT s.shard, j.id, j.next_fire_at
FROM unnest($1::int[], $2::timestamptz[], $3::uuid[]) AS s (shard, after_due, after_id)
CROSS JOIN LATERAL (
    SELECT id, next_fire_at FROM jobs
    WHERE shard = s.shard AND state = 'ACTIVE' AND next_fire_at IS NOT NULL
      AND (next_fire_at, id) > (s.after_due, s.after_id) AND next_fire_at < $4
    ORDER BY next_fire_at, id
    LIMIT $5
) AS j
ORDER BY s.shard, j.next_fire_at, j.id;

-- name: overdue_occurrences
-- The hydrator's overdue scan, every shard of $1 in one statement: per shard, active jobs that should have
-- fired before $2 and did not, and manual triggers still pending since before $2 — their hot-window member was
-- lost (Redis flushed, a dispatcher died between claim and commit, an API replica missed it). Up to $3 of each
-- kind per shard, oldest first, so one shard's backlog never crowds another's out. One index range scan per
-- shard and kind (jobs_due_idx, jobs_trigger_idx) under the LATERAL; it was two statements per shard every
-- overdue interval (16 every 10 s with 8 shards: a third of an idle stack's statements).
SELECT s.shard, o.id, o.at
FROM unnest($1::int[]) AS s (shard)
CROSS JOIN LATERAL (
    (SELECT id, next_fire_at AS at FROM jobs
     WHERE shard = s.shard AND state = 'ACTIVE' AND next_fire_at IS NOT NULL AND next_fire_at < $2
     ORDER BY next_fire_at
     LIMIT $3)
    UNION ALL
    (SELECT id, trigger_at FROM jobs
     WHERE shard = s.shard AND trigger_at IS NOT NULL AND trigger_at < $2 AND state <> 'CANCELLED'
     ORDER BY trigger_at
     LIMIT $3)
) AS o;

-- name: count_jobs
-- The sweeper's sample of sundial_jobs{tenant,state}: one scan of jobs every SUNDIAL_SWEEPER_GAUGES_INTERVAL_SEC.
SELECT tenant_id, state, count(*) AS jobs FROM jobs GROUP BY tenant_id, state;

-- name: count_tenant_jobs
-- The web console's counts by state: one pass over one tenant's jobs (jobs_tenant_idx finds them). The console
-- keeps the answer for a few seconds per tenant, so open tabs do not repeat it on every refresh.
SELECT state, count(*) AS jobs FROM jobs WHERE tenant_id = $1 GROUP BY state;

-- name: list_jobs
-- GET /v1/jobs: one tenant's jobs, newest first, keyset on the id (UUIDv7, so newest first is creation
-- order and a job created while a client pages lands before its cursor, never shifting a later page).
-- Every filter is optional (NULL: no filter); the name filter is a prefix, labels must all match ($9 @>;
-- "labels <> '{}'" lets the planner use the partial GIN index jobs_labels_idx, a filter names at least one),
-- created ranges are [from, to), next-fire ranges too. With the state of each job's latest execution (one probe of
-- executions_job_idx per job of the page), shown beside the job's own state.
SELECT j.*, (SELECT e.state FROM executions e WHERE e.job_id = j.id ORDER BY e.scheduled_for DESC, e.id DESC LIMIT 1)
       AS latest_execution_state
FROM jobs j
WHERE tenant_id = $1
  AND ($2::text IS NULL OR state = $2)
  AND ($3::text IS NULL OR type = $3)
  AND ($4::text IS NULL OR pool = $4)
  AND ($5::text IS NULL OR handler = $5)
  AND ($6::text IS NULL OR starts_with(name, $6))
  AND ($7::uuid IS NULL OR id < $7)
  AND ($9::jsonb IS NULL OR (labels @> $9 AND labels <> '{}'::jsonb))
  AND ($10::timestamptz IS NULL OR created_at >= $10)
  AND ($11::timestamptz IS NULL OR created_at < $11)
  AND ($12::timestamptz IS NULL OR next_fire_at >= $12)
  AND ($13::timestamptz IS NULL OR next_fire_at < $13)
  AND ($14::text IS NULL OR key = $14)
ORDER BY id DESC
LIMIT $8;

-- name: list_jobs_by_next_fire
-- The console's jobs list sorted by next fire: list_jobs' filters, soonest first, jobs with no next fire last;
-- keyset on (next fire, id) after the page's last job ($12, $13; $12 NULL with $13 set: a job with no next fire).
-- Two ranges of jobs_tenant_next_fire_idx, each read in index order from the cursor (a row comparison OR'ed
-- with "no next fire" could not bound the scan): the jobs with a next fire, then those without.
SELECT j.*, (SELECT e.state FROM executions e WHERE e.job_id = j.id ORDER BY e.scheduled_for DESC, e.id DESC LIMIT 1)
       AS latest_execution_state
FROM (
  (SELECT * FROM jobs
   WHERE tenant_id = $1 AND next_fire_at IS NOT NULL
     AND ($13::uuid IS NULL OR ($12::timestamptz IS NOT NULL AND (next_fire_at, id) > ($12, $13)))
     AND ($2::text IS NULL OR state = $2)
     AND ($3::text IS NULL OR type = $3)
     AND ($4::text IS NULL OR pool = $4)
     AND ($5::text IS NULL OR handler = $5)
     AND ($6::text IS NULL OR starts_with(name, $6))
     AND ($7::jsonb IS NULL OR (labels @> $7 AND labels <> '{}'::jsonb))
     AND ($8::timestamptz IS NULL OR created_at >= $8)
     AND ($9::timestamptz IS NULL OR created_at < $9)
     AND ($10::timestamptz IS NULL OR next_fire_at >= $10)
     AND ($11::timestamptz IS NULL OR next_fire_at < $11)
   ORDER BY next_fire_at, id
   LIMIT $14)
  UNION ALL
  (SELECT * FROM jobs
   WHERE tenant_id = $1 AND next_fire_at IS NULL
     AND ($13::uuid IS NULL OR $12::timestamptz IS NOT NULL OR id > $13)
     AND ($2::text IS NULL OR state = $2)
     AND ($3::text IS NULL OR type = $3)
     AND ($4::text IS NULL OR pool = $4)
     AND ($5::text IS NULL OR handler = $5)
     AND ($6::text IS NULL OR starts_with(name, $6))
     AND ($7::jsonb IS NULL OR (labels @> $7 AND labels <> '{}'::jsonb))
     AND ($8::timestamptz IS NULL OR created_at >= $8)
     AND ($9::timestamptz IS NULL OR created_at < $9)
     AND ($10::timestamptz IS NULL OR next_fire_at >= $10)
     AND ($11::timestamptz IS NULL OR next_fire_at < $11)
   ORDER BY id
   LIMIT $14)
) j
ORDER BY j.next_fire_at ASC NULLS LAST, j.id ASC
LIMIT $14;

-- name: prune_ended_jobs
-- The sweeper's job retention: at most $2 jobs of any type that ended (COMPLETED, CANCELLED) and last changed
-- before $1, oldest first, deleted with what hangs off them; how many. $1 is before every execution that is left,
-- and every execution of such a job was created by then: a dispatch (a scheduled or manual run) moves the job
-- (updated_at) in its statement, a cancel moves it after the last trigger a DEPENDENT job fired (it drops those
-- still waiting) and ends its running backfills, and nothing creates one for a job that ended but a manual run
-- (kept while pending) or a backfill (kept while running or if it finished since $1). So none of its executions
-- remains (the worker's start joins its job).
-- Kept too: a job a dependency names as a parent (the edge refers to it; it goes once its children have).
-- Deleted with the job: its own edges as a DEPENDENT child, its triggers (consumed, or left by a finish that raced
-- its cancel), its backfills. The foreign keys (NO ACTION) are checked at the end of the statement, after all.
-- Each delete names its rows as an array (= ANY(ARRAY(…))), probed through an index: joined to the CTE instead,
-- the planner hashed the batch against a scan of the whole table (jobs: 18 of a batch's 40 ms at 100,000 jobs,
-- and growing with the table).
-- SKIP LOCKED: a job some request holds (a trigger, a read for update, a new edge or backfill naming it) waits
-- for the next pass.
WITH ended AS (
    SELECT j.id FROM jobs j
    WHERE j.state IN ('COMPLETED', 'CANCELLED') AND j.updated_at < $1
      AND j.trigger_at IS NULL  -- a manual run still waiting (a suspended tenant's) will make an execution
      AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.parent_job_id = j.id)
      AND NOT EXISTS (SELECT 1 FROM backfills b
                      WHERE b.job_id = j.id AND (b.finished_at IS NULL OR b.finished_at >= $1))
    ORDER BY j.updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), edges AS (
    DELETE FROM job_dependencies d WHERE d.child_job_id = ANY(ARRAY(SELECT id FROM ended))
), triggers AS (
    DELETE FROM job_triggers t WHERE t.child_job_id = ANY(ARRAY(SELECT id FROM ended))
), backfills AS (
    DELETE FROM backfills b WHERE b.job_id = ANY(ARRAY(SELECT id FROM ended))
), gone AS (
    DELETE FROM jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM ended)) RETURNING 1
)
SELECT count(*) FROM gone;
