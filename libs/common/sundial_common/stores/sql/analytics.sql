-- The analytics store (sundial_common.stores.analytics): the execution_events outbox that the analytics
-- service drains into ClickHouse, and Postgres' retention of finished executions.

-- name: oldest_events
-- The oldest queued events (by id: roughly commit order; a row committed late is simply read by a later pass).
SELECT * FROM execution_events ORDER BY id LIMIT $1;

-- name: delete_events
-- Exactly the ids that reached ClickHouse, never a range: a lower id may still be uncommitted.
DELETE FROM execution_events WHERE id = ANY($1::bigint[]);

-- name: pending_events
SELECT count(*) FROM execution_events;

-- name: expire_executions
-- Retention: delete up to $3 finished executions created before $1 (a UUIDv7 floor: a primary-key range
-- scan, no extra index) and finished before $2, with their attempts — but only those finished before the
-- oldest event still queued, so no execution leaves Postgres before its last event reached ClickHouse.
WITH horizon AS (
    SELECT least($2::timestamptz, coalesce(min(at), 'infinity')) AS before FROM execution_events
), doomed AS (
    SELECT e.id FROM executions e, horizon h
    WHERE e.id < $1::uuid AND e.finished_at < h.before AND e.next_attempt_at IS NULL
      AND e.state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'FAILED_WORKER_LOST', 'DEAD', 'SKIPPED')
      -- A dead letter stays until the sweeper has published it to sundial.dlq.
      AND (e.state <> 'DEAD' OR e.dlq_published_at IS NOT NULL)
    ORDER BY e.id
    LIMIT $3
    FOR UPDATE OF e SKIP LOCKED
), attempts AS (
    DELETE FROM execution_attempts a USING doomed d WHERE a.execution_id = d.id
)
DELETE FROM executions e USING doomed d WHERE e.id = d.id;

-- name: first_starts
-- When attempt 1 of these executions started: lateness is measured on the first attempt, and a retried
-- execution's own row only shows its latest attempt's start.
SELECT execution_id, started_at FROM execution_attempts WHERE execution_id = ANY($1::uuid[]) AND attempt = 1;
