-- The tenant store (sundial_common.stores.tenants): the registry of tenants, their weight, quotas and
-- state. Changes are compare-and-set on ``version`` when the caller names one.

-- name: create_tenant
-- A new tenant; no row when the id is taken.
INSERT INTO tenants (id, display_name, weight, max_active_jobs, max_creates_per_sec, max_concurrent_executions,
                     max_dispatch_per_sec, default_jitter_sec, state, breaker)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_tenant
SELECT * FROM tenants WHERE id = $1;

-- name: list_tenants
-- Keyset pages in id order, strictly after $1 (NULL: from the start).
SELECT * FROM tenants WHERE $1::text IS NULL OR id > $1 ORDER BY id LIMIT $2;

-- name: all_tenants
SELECT * FROM tenants ORDER BY id;

-- name: update_tenant
-- Every registry field at once (the API merges a PATCH into the current row); $11 NULL: any version.
UPDATE tenants
SET display_name = $2, weight = $3, max_active_jobs = $4, max_creates_per_sec = $5,
    max_concurrent_executions = $6, max_dispatch_per_sec = $7, default_jitter_sec = $8, state = $9,
    breaker = $10, version = version + 1, updated_at = now()
WHERE id = $1 AND ($11::integer IS NULL OR version = $11)
RETURNING *;

-- name: count_open_jobs
-- The jobs that count against maxActiveJobs: those that can still fire (index-only on jobs_tenant_open_idx).
SELECT count(*) FROM jobs WHERE tenant_id = $1 AND state IN ('ACTIVE', 'PAUSED');

-- name: lock_tenant_quota
-- Serialises the creates of one tenant that has a maxActiveJobs quota, so two creates cannot both take
-- the last slot (held to the end of the create's transaction).
SELECT pg_advisory_xact_lock(hashtextextended('sundial.tenant:' || $1, 0));

-- name: job_owners
-- The dispatcher's fair pass: whose each claimed job is, which pool it runs in and at which priority
-- (primary-key lookups).
SELECT id, tenant_id, pool, priority FROM jobs WHERE id = ANY($1::uuid[]);

-- name: registered_pools
-- The dispatcher's fair pass (read every second or so): every pool a job can run in. The API accepts a job only
-- for a registered production pool; a pool is deleted, or made staging, only while no job that can fire targets it.
SELECT name FROM pools WHERE kind = 'production';

-- name: retry_owners
-- The dispatcher's fair pass: whose each claimed scheduled retry is, its pool, and the priority it was dispatched
-- with (primary-key lookups, each in the one partition its id falls in).
SELECT id, tenant_id, pool, priority FROM executions WHERE id = ANY($1::uuid[]);

-- name: open_executions
-- The dispatcher's fair pass (read by each dispatcher process at most every few hundred milliseconds, shared by
-- the shards it leads): per tenant and pool, executions waiting in Kafka (PENDING, dispatched within the last $1
-- seconds: an older one's message is presumed lost, and the sweeper's to send again), all PENDING ones, RUNNING
-- ones (a pool with work waiting and none running has no worker starting it), those dispatched within the last
-- $2 seconds (the rate-following cap's count) and open ones (PENDING or
-- RUNNING), and how long the oldest PENDING one has waited. An index scan of a partial index over the open rows
-- only (phase OPEN, migration 0023: PENDING and RUNNING told apart on the heap; run as database.sql's
-- every_partition_plan says). An
-- execution published ahead of its due instant (fire_at still to come: SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS) waits
-- in its worker for that instant, not behind a backlog: it is open (it counts against the tenant's concurrency)
-- but not queued, fresh or pending, so a pool's queue cap and its stall look only at work that is due; it is
-- counted apart (ahead), so a pool's drain (PENDING then + published since - PENDING now) does not take one still
-- held for a start. `due`: PENDING and its instant has come. A retry is queued from when it became PENDING again
-- (pending_since), not from its execution's creation: uncounted, a re-drive's retries filled the pool's topic
-- past its cap and another tenant's work waited behind them.
SELECT tenant_id, pool,
       count(*) FILTER (WHERE due AND coalesce(pending_since, created_at) > now() - make_interval(secs => $1))
           AS queued,
       count(*) FILTER (WHERE due AND coalesce(pending_since, created_at) > now() - make_interval(secs => $2))
           AS fresh,
       count(*) FILTER (WHERE due) AS pending,
       count(*) FILTER (WHERE state = 'PENDING' AND fire_at > now()) AS ahead,
       count(*) FILTER (WHERE state = 'RUNNING') AS running,
       count(*) AS open,
       extract(epoch FROM now() - min(coalesce(pending_since, created_at)) FILTER (WHERE state = 'PENDING'))
           AS waited_sec
FROM executions,
     LATERAL (SELECT state = 'PENDING' AND coalesce(fire_at, created_at) <= now() AS due) AS d
WHERE phase = 'OPEN'
GROUP BY tenant_id, pool;
