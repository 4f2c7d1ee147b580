-- The analytics store (sundial_common.stores.analytics): the execution_events outbox that the analytics
-- service drains into ClickHouse (Postgres' retention drops whole days: partitions.sql).

-- name: oldest_events
-- The oldest queued events (by id: roughly commit order; a row committed late is simply read by a later pass).
SELECT * FROM execution_events ORDER BY id LIMIT $1;

-- name: delete_events
-- Exactly the ids that reached ClickHouse, never a range: a lower id may still be uncommitted.
DELETE FROM execution_events WHERE id = ANY($1::bigint[]);

-- name: pending_events
SELECT count(*) FROM execution_events;

-- name: first_starts
-- When attempt 1 of these executions started: lateness is measured on the first attempt, and a retried
-- execution's own row only shows its latest attempt's start.
SELECT execution_id, started_at FROM execution_attempts WHERE execution_id = ANY($1::uuid[]) AND attempt = 1;
