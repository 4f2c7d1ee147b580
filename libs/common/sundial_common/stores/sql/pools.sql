-- The pool store (sundial_common.stores.pools): the pool registry — who may use each pool, its kind, its
-- topic's settings and the defaults its jobs inherit. Changes are compare-and-set on ``version`` when the
-- caller names one.

-- name: create_pool
-- A new pool; no row when the name is taken.
INSERT INTO pools (name, owner, shared_with, kind, partitions, retention_ms, default_timeout_sec,
                   default_retry_policy, delivery)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: get_pool
SELECT * FROM pools WHERE name = $1;

-- name: list_pools
-- Keyset pages in name order, strictly after $1 (NULL: from the start); $3 (not NULL) keeps only the pools
-- that tenant may use.
SELECT * FROM pools
WHERE ($1::text IS NULL OR name > $1) AND ($3::text IS NULL OR owner = $3 OR shared_with @> ARRAY[$3::text])
ORDER BY name LIMIT $2;

-- name: update_pool
-- Every changeable field at once (the API merges a PATCH into the current row); $7 NULL: any version; $8 the
-- delivery.
-- A production pool does not turn staging while jobs that can still fire (ACTIVE or PAUSED) target it: a staging
-- pool's workers run replayed messages only, so their executions would never run. Then nothing is written and
-- `active_jobs` says how many (the other columns are NULL, as when the pool is unknown or at another version: the
-- version is checked first).
WITH active AS (
    SELECT count(*) AS n FROM jobs
    WHERE $4 = 'staging' AND pool = $1 AND state IN ('ACTIVE', 'PAUSED')
      AND EXISTS (SELECT 1 FROM pools p
                  WHERE p.name = $1 AND p.kind <> 'staging' AND ($7::integer IS NULL OR p.version = $7))
), updated AS (
    UPDATE pools
    SET owner = $2, shared_with = $3, kind = $4, default_timeout_sec = $5, default_retry_policy = $6,
        delivery = $8, version = version + 1, updated_at = now()
    WHERE name = $1 AND ($7::integer IS NULL OR version = $7) AND (SELECT n FROM active) = 0
    RETURNING *
)
SELECT u.*, (SELECT n FROM active) AS active_jobs FROM (SELECT) AS one LEFT JOIN updated u ON true;

-- name: delete_pool
-- Deleted only while no job that can still fire (ACTIVE or PAUSED) targets it; the count is taken under a
-- lock on the pool's row, so a create that checked the registry just before cannot slip in unnoticed for
-- long (it is refused by the next registry read). Returns (deleted, active jobs).
WITH locked AS (
    SELECT name FROM pools WHERE name = $1 FOR UPDATE
), active AS (
    SELECT count(*) AS n FROM jobs WHERE pool = $1 AND state IN ('ACTIVE', 'PAUSED')
), gone AS (
    DELETE FROM pools WHERE name IN (SELECT name FROM locked) AND (SELECT n FROM active) = 0 RETURNING name
)
SELECT (SELECT count(*) FROM locked) > 0 AS found, (SELECT count(*) FROM gone) > 0 AS deleted,
       (SELECT n FROM active) AS active_jobs;
