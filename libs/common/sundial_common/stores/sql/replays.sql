-- The replays store (sundial_common.stores.replays): replays, their per-partition progress, staging runs.

-- name: insert_replay
-- No row back: the tenant already created a replay under this Idempotency-Key ($13): see replay_by_key.
INSERT INTO replays (id, tenant_id, created_by, source_pool, target_pool, window_from, window_to, filter_handler,
                     filter_job_id, filter_tenant_id, rate_per_sec, dry_run, idempotency_key, request_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: replay_by_key
SELECT * FROM replays WHERE tenant_id = $1 AND idempotency_key = $2;

-- name: get_replay
-- $2 NULL: any tenant's (an admin token).
SELECT r.*, (SELECT coalesce(sum(deliveries - 1), 0) FROM replay_runs WHERE replay_id = r.id) AS duplicates,
       (SELECT count(*) FROM replay_runs WHERE replay_id = r.id) AS runs
FROM replays r WHERE r.id = $1 AND ($2::text IS NULL OR r.tenant_id = $2);

-- name: list_replays
-- Newest first, after the cursor's id; $1 NULL: every tenant's (an admin token).
SELECT * FROM replays
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::uuid IS NULL OR id < $2)
ORDER BY id DESC LIMIT $3;

-- name: replay_partitions
SELECT * FROM replay_partitions WHERE replay_id = ANY($1::uuid[]) ORDER BY replay_id, partition;

-- name: cancel_replay
-- PENDING: CANCELLED at once. RUNNING: the replayer is asked to stop (it sees it at its next progress commit).
UPDATE replays
SET state = CASE WHEN state = 'PENDING' THEN 'CANCELLED' ELSE state END,
    finished_at = CASE WHEN state = 'PENDING' THEN now() ELSE finished_at END,
    cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2) AND state IN ('PENDING', 'RUNNING')
RETURNING *;

-- name: active_replays
SELECT * FROM replays WHERE state IN ('PENDING', 'RUNNING') ORDER BY id LIMIT $1;

-- name: start_replay
-- PENDING → RUNNING with the offsets its window resolved to, one partition per array element.
WITH started AS (
    UPDATE replays SET state = 'RUNNING', started_at = now(), updated_at = now()
    WHERE id = $1 AND state = 'PENDING'
    RETURNING id
), parts AS (
    INSERT INTO replay_partitions (replay_id, partition, start_offset, end_offset, next_offset)
    SELECT s.id, p.partition, p.start_offset, p.end_offset, p.start_offset
    FROM started s, unnest($2::int[], $3::bigint[], $4::bigint[]) AS p (partition, start_offset, end_offset)
    RETURNING 1
)
SELECT (SELECT count(*) FROM parts) AS partitions, EXISTS (SELECT 1 FROM started) AS started;

-- name: resumed_replay
-- A replayer took over a RUNNING replay whose previous holder stopped mid-way.
UPDATE replays SET resumes = resumes + 1, updated_at = now() WHERE id = $1 AND state = 'RUNNING';

-- name: commit_progress
-- After a published batch: each partition's next offset and counts, and the replay's totals, in one statement.
-- Returns whether a cancel was asked for meanwhile (the replayer stops at once).
WITH parts AS (
    UPDATE replay_partitions rp
    SET next_offset = greatest(rp.next_offset, p.next_offset), end_offset = coalesce(rp.end_offset, p.end_offset),
        scanned = rp.scanned + p.scanned,
        matched = rp.matched + p.matched, published = rp.published + p.published
    FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
         AS p (partition, next_offset, scanned, matched, published, end_offset)
    WHERE rp.replay_id = $1 AND rp.partition = p.partition
    RETURNING 1
)
-- (A data-modifying WITH runs whether or not the main statement reads it.)
UPDATE replays
SET scanned = scanned + (SELECT coalesce(sum(s), 0) FROM unnest($4::bigint[]) s),
    matched = matched + (SELECT coalesce(sum(m), 0) FROM unnest($5::bigint[]) m),
    published = published + (SELECT coalesce(sum(p), 0) FROM unnest($6::bigint[]) p),
    updated_at = now()
WHERE id = $1 AND state = 'RUNNING'
RETURNING cancel_requested_at IS NOT NULL AS cancel_requested;

-- name: finish_replay
-- RUNNING (or PENDING, for a window that could not be resolved) → SUCCEEDED, FAILED or CANCELLED.
UPDATE replays SET state = $2, error = $3, finished_at = now(), updated_at = now()
WHERE id = $1 AND state IN ('PENDING', 'RUNNING')
RETURNING *;

-- name: record_runs
-- What staging workers did, one row per replayed message; a message delivered again (a resumed replay, a
-- staging worker restarted before its offset commit) counts one more delivery and keeps the latest outcome.
INSERT INTO replay_runs AS r (replay_id, source_partition, source_offset, original_execution_id, handler, outcome,
                              error, duration_ms, worker_id)
SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::uuid[], $5::text[], $6::text[], $7::text[],
                     $8::float8[], $9::text[])
ON CONFLICT (replay_id, source_partition, source_offset) DO UPDATE
SET deliveries = r.deliveries + 1, outcome = excluded.outcome, error = excluded.error,
    duration_ms = excluded.duration_ms, worker_id = excluded.worker_id, recorded_at = now();

-- name: list_runs
-- A replay's runs in source order, after the cursor's (partition, offset).
SELECT * FROM replay_runs
WHERE replay_id = $1 AND (source_partition, source_offset) > ($2::int, $3::bigint)
ORDER BY source_partition, source_offset LIMIT $4;
