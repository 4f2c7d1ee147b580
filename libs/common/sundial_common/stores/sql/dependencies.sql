-- The dependency store (sundial_common.stores.dependencies): the graph of DEPENDENT jobs and their parents,
-- and the triggers their parents' final states record (migration 0015's statement-level trigger on
-- executions), which the leader of the child's shard turns into executions under its fence.
-- Batches travel as parallel arrays through unnest(), so a batch is one round trip.

-- name: lock_graph
-- Graph changes of one tenant are serialized (a cycle check must see every edge committed before it).
SELECT pg_advisory_xact_lock(hashtextextended('sundial.dependencies:' || $1, 0));

-- name: jobs_by_id
-- The named parents as they are now: a missing id, another tenant's job or a cancelled job is refused.
SELECT id, tenant_id, name, state, type FROM jobs WHERE id = ANY($1::uuid[]) FOR SHARE;

-- name: cycle_path
-- Walks up from the proposed parents ($2) through their own parents: if the child ($1) is among their
-- ancestors, adding the edges closes a cycle; the path found (child … parent) names it. Also the depth of the
-- deepest chain above the proposed parents (for the chain-depth limit).
WITH RECURSIVE up (job_id, path, depth) AS (
    SELECT p, ARRAY[p], 1 FROM unnest($2::uuid[]) AS p
    UNION ALL
    SELECT d.parent_job_id, up.path || d.parent_job_id, up.depth + 1
    FROM up JOIN job_dependencies d ON d.child_job_id = up.job_id
    WHERE NOT d.parent_job_id = ANY(up.path) AND up.job_id <> $1 AND up.depth <= $3
)
SELECT (SELECT path FROM up WHERE job_id = $1 ORDER BY depth LIMIT 1) AS cycle,
       (SELECT max(depth) FROM up) AS depth;

-- name: descendant_depth
-- The deepest chain below a job (0: it has no children), bounded by $2.
WITH RECURSIVE down (job_id, depth) AS (
    SELECT $1::uuid, 0
    UNION ALL
    SELECT d.child_job_id, down.depth + 1 FROM down JOIN job_dependencies d ON d.parent_job_id = down.job_id
    WHERE down.depth <= $2
)
SELECT max(depth) FROM down;

-- name: replace_parents
-- A child's parents become exactly ($2, $3); audited with the new list.
WITH gone AS (
    DELETE FROM job_dependencies WHERE child_job_id = $1
), dropped AS (
    -- Triggers still waiting from a parent that is no longer one will never make a fire: drop them.
    DELETE FROM job_triggers WHERE child_job_id = $1 AND consumed_at IS NULL AND NOT parent_job_id = ANY($2::uuid[])
), added AS (
    INSERT INTO job_dependencies (child_job_id, parent_job_id, tenant_id, on_state)
    SELECT $1, p.parent, $4, p.on_state FROM unnest($2::uuid[], $3::text[]) AS p (parent, on_state)
    RETURNING parent_job_id
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, actor, detail)
    VALUES ($4, 'job', $1, 'depends_on', $5,
            jsonb_build_object('parents', (SELECT jsonb_agg(jsonb_build_object('jobId', parent, 'on', on_state))
                                           FROM unnest($2::uuid[], $3::text[]) AS p (parent, on_state))))
)
SELECT count(*) FROM added;

-- name: parents_of
SELECT d.parent_job_id AS job_id, d.on_state, j.name, j.state
FROM job_dependencies d JOIN jobs j ON j.id = d.parent_job_id
WHERE d.child_job_id = $1
ORDER BY d.created_at, d.parent_job_id;

-- name: children_of
SELECT d.child_job_id AS job_id, d.on_state, j.name, j.state
FROM job_dependencies d JOIN jobs j ON j.id = d.child_job_id
WHERE d.parent_job_id = $1
ORDER BY d.created_at, d.child_job_id
LIMIT $2;

-- name: live_descendants
-- Every job below $1 that can still fire (ACTIVE or PAUSED), nearest first: what a delete would orphan.
WITH RECURSIVE down (job_id, depth) AS (
    SELECT d.child_job_id, 1 FROM job_dependencies d WHERE d.parent_job_id = $1
    UNION
    SELECT d.child_job_id, down.depth + 1 FROM down JOIN job_dependencies d ON d.parent_job_id = down.job_id
    WHERE down.depth < $2
)
SELECT j.id, j.name, j.state, j.shard, min(down.depth) AS depth
FROM down JOIN jobs j ON j.id = down.job_id
WHERE j.state IN ('ACTIVE', 'PAUSED')
GROUP BY j.id
ORDER BY depth, j.id;

-- name: cancel_jobs
-- Cascade of a delete: the live descendants are cancelled too, in the same transaction; their triggers still
-- waiting are dropped and their running backfills end, as jobs.sql's cancel_job does for one job.
WITH job AS (
    UPDATE jobs j SET state = 'CANCELLED', next_fire_at = NULL, version = j.version + 1, updated_at = now()
    WHERE j.id = ANY($1::uuid[]) AND j.tenant_id = $2 AND j.state IN ('ACTIVE', 'PAUSED')
    RETURNING j.id, j.tenant_id
), triggers AS (
    DELETE FROM job_triggers t USING job WHERE t.child_job_id = job.id AND t.consumed_at IS NULL
), backfills AS (
    UPDATE backfills b SET state = 'CANCELLED', finished_at = now() FROM job
    WHERE b.job_id = job.id AND b.state = 'RUNNING'
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor, detail)
    SELECT tenant_id, 'job', id, 'cancel', 'CANCELLED', $3, jsonb_build_object('cascadeFrom', $4::uuid) FROM job
)
SELECT id FROM job;

-- name: pending_children
-- The leader's scan: children of this shard with triggers waiting, oldest trigger first, locked for this
-- transaction (a concurrent dispatch of the same job, a PATCH or a pause waits). Only ACTIVE children of
-- tenants that are not SUSPENDED: a paused child, or a suspended tenant's, keeps its triggers until it is
-- resumed. Nor the children of the tenants ($3) or pools ($4) the fair-dispatch limits hold back this pass
-- (sundial_dispatcher.limits): left out here, they do not fill the batch ahead of others that have room.
-- SKIP LOCKED: a row another transaction holds is looked at on the next pass.
SELECT j.id, j.tenant_id, j.name, j.pool, j.handler, j.payload, j.retry_policy, j.timeout_sec, j.catchup_policy,
       j.catchup_window_sec, j.overlap_policy, now() AS db_now,
       (SELECT array_agg(parent_job_id ORDER BY parent_job_id) FROM job_dependencies WHERE child_job_id = j.id)
           AS parents,
       (SELECT max(e.scheduled_for) FROM executions e WHERE e.job_id = j.id) AS last_scheduled_for
FROM jobs j
WHERE j.id IN (
    SELECT t.child_job_id FROM job_triggers t JOIN jobs c ON c.id = t.child_job_id AND c.state = 'ACTIVE'
    WHERE t.shard = $1 AND t.consumed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = t.tenant_id AND s.state = 'SUSPENDED')
      AND NOT t.tenant_id = ANY($3::text[]) AND NOT c.pool = ANY($4::text[])
    GROUP BY t.child_job_id ORDER BY min(t.created_at) LIMIT $2
) AND j.shard = $1 AND j.state = 'ACTIVE'
FOR UPDATE OF j SKIP LOCKED;

-- name: any_pending
-- Before the fenced transaction (a write): is any trigger of an ACTIVE child of this shard waiting, its tenant
-- not SUSPENDED? An index probe of job_triggers_pending_idx, nearly always empty, so an idle leader writes
-- nothing (nor one whose only triggers wait for their tenant's resume).
SELECT EXISTS (
    SELECT 1 FROM job_triggers t JOIN jobs c ON c.id = t.child_job_id AND c.state = 'ACTIVE'
    WHERE t.shard = $1 AND t.consumed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = t.tenant_id AND s.state = 'SUSPENDED')
);

-- name: shards_with_side_work
-- The dispatcher process's census (sundial_dispatcher.side_work), both kinds of side work in one statement: which
-- of these shards have a trigger of an ACTIVE child waiting ('trigger'), and which a running backfill ('backfill';
-- backfills_running_idx), of a tenant not SUSPENDED. One look for every shard a process leads, every second; it
-- was one statement per kind (two a second per dispatcher process, a third of an idle stack's statements).
SELECT DISTINCT t.shard, 'trigger' AS kind
FROM job_triggers t JOIN jobs c ON c.id = t.child_job_id AND c.state = 'ACTIVE'
WHERE t.shard = ANY($1::int[]) AND t.consumed_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = t.tenant_id AND s.state = 'SUSPENDED')
UNION ALL
SELECT DISTINCT b.shard, 'backfill' AS kind
FROM backfills b
WHERE b.shard = ANY($1::int[]) AND b.state = 'RUNNING'
  AND NOT EXISTS (SELECT 1 FROM tenants s WHERE s.id = b.tenant_id AND s.state = 'SUSPENDED');

-- name: pending_triggers
-- The waiting triggers of the locked children, oldest first (at most $2 per pass).
SELECT id, child_job_id, parent_job_id, parent_execution_id, parent_state, parent_traceparent, created_at
FROM job_triggers
WHERE child_job_id = ANY($1::uuid[]) AND consumed_at IS NULL
ORDER BY created_at, id
LIMIT $2
FOR UPDATE;

-- name: insert_triggered_executions
-- One execution per fire, unique per (child, trigger): a second attempt at the same trigger inserts
-- nothing. caused_by travels as comma-separated ids (asyncpg reads a list of lists as a
-- two-dimensional array, which must be rectangular). scheduled_for is the instant of the fire, after the child's latest (no two share one).
WITH inserted AS (
    INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,
                            max_attempts, timeout_sec, trace_id, traceparent, fire_at, trigger_id, caused_by,
                            priority)
    SELECT e.id, e.tenant_id, e.job_id, e.scheduled_for, $9, $10, e.pool, e.handler, 'PENDING',
           e.max_attempts, e.timeout_sec, e.trace_id, e.traceparent, e.scheduled_for, e.trigger_id,
           string_to_array(e.caused_by, ',')::uuid[], (SELECT j.priority FROM jobs j WHERE j.id = e.job_id)
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[], $6::text[], $7::int[],
                $8::int[], $11::text[], $12::text[], $13::uuid[], $14::text[])
         AS e (id, tenant_id, job_id, scheduled_for, pool, handler, max_attempts, timeout_sec, trace_id, traceparent,
               trigger_id, caused_by)
    -- No target: the trigger key is a unique index of each partition (migration 0018).
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id, state, caused_by
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'dispatch', state, $15, jsonb_build_object('causedBy', caused_by)
    FROM inserted
)
SELECT id FROM inserted;

-- name: consume_triggers
-- The triggers a pass used: FIRED into an execution, or SKIPPED (catch-up policy SKIP). Compare-and-swap on
-- still being pending.
UPDATE job_triggers t SET consumed_at = now(), outcome = c.outcome, execution_id = c.execution_id
FROM unnest($1::uuid[], $2::text[], $3::uuid[]) AS c (id, outcome, execution_id)
WHERE t.id = c.id AND t.consumed_at IS NULL;

-- name: waiting_triggers
-- GET /v1/jobs/{id}: how many triggers of a child wait for the rest of its parents (fan-in) or its resume.
SELECT parent_job_id, count(*) AS waiting FROM job_triggers
WHERE child_job_id = $1 AND consumed_at IS NULL
GROUP BY parent_job_id;

-- name: prune_consumed_triggers
-- The sweeper's job retention: at most $2 triggers consumed before $1, oldest first, deleted; how many. $1 is
-- before every execution left: the parent execution that made a trigger and the one it fired are gone, so
-- nothing can fire it again (job_triggers_once would have refused) or read it.
WITH consumed AS (
    SELECT id FROM job_triggers WHERE consumed_at < $1 ORDER BY consumed_at LIMIT $2
), gone AS (
    DELETE FROM job_triggers t USING consumed WHERE t.id = consumed.id RETURNING 1
)
SELECT count(*) FROM gone;
