-- The analytics store (sundial_common.stores.analytics): the execution_events outbox that the analytics
-- service drains into ClickHouse (Postgres' retention drops whole days: partitions.sql).

-- name: take_events
-- The oldest queued events (by id: roughly commit order; a row committed late is simply taken by a later
-- pass), deleted and returned as the replica's rows (RETURNING: no CTE to materialize; the ids as an array:
-- an index scan whatever the backlog), in sundial_analytics.replica.EVENT_COLUMNS order, as
-- COPY text: ClickHouse reads it as TabSeparated (same escapes, \N for NULL), so no value becomes a Python
-- object on the way. Run in a transaction that commits only once ClickHouse has the rows: the deletion is
-- exactly the ids that reached ClickHouse, never a range (a lower id may still be uncommitted). SKIP LOCKED:
-- a stalled former leader's batch is left to it, not waited for. COPY takes no parameters: {limit} is
-- formatted in (an int); asyncpg wraps the query in COPY (...) TO STDOUT. Times are UTC `timestamp` text
-- (DateStyle ISO, microseconds: ClickHouse keeps the milliseconds, truncating, as clickhouse-connect did
-- when it was given datetimes).
--
-- Lateness: the first attempt's start after the (jittered) fire time, as the workers' lateness metric
-- measures it (a retried execution's own row only shows its latest attempt's start). Duration: the latest
-- attempt's, once it has finished. Both in whole milliseconds, truncated from the float seconds as Python's
-- int(timedelta.total_seconds() * 1000) did, never negative. Error class: `ValueError: boom` -> `ValueError`,
-- free text -> `Error`, no error -> empty.
DELETE FROM execution_events e
WHERE id = ANY(ARRAY(SELECT id FROM execution_events ORDER BY id LIMIT {limit} FOR UPDATE SKIP LOCKED))
RETURNING
    id, at AT TIME ZONE 'UTC', kind, tenant_id, job_id, execution_id, attempt, state, pool, handler,
    scheduled_for AT TIME ZONE 'UTC', coalesce(fire_at, scheduled_for) AT TIME ZONE 'UTC',
    created_at AT TIME ZONE 'UTC', started_at AT TIME ZONE 'UTC', finished_at AT TIME ZONE 'UTC',
    CASE WHEN attempt = 1 THEN
        CASE WHEN started_at IS NOT NULL THEN
            greatest(0, trunc(extract(epoch FROM started_at - coalesce(fire_at, scheduled_for))::float8 * 1000))::bigint
        END
    ELSE (SELECT greatest(0, trunc(extract(epoch FROM a.started_at - coalesce(e.fire_at, e.scheduled_for))::float8 * 1000))::bigint
          FROM execution_attempts a WHERE a.execution_id = e.execution_id AND a.attempt = 1)
    END,
    CASE WHEN finished_at IS NOT NULL AND started_at IS NOT NULL THEN
        greatest(0, trunc(extract(epoch FROM finished_at - started_at)::float8 * 1000))::bigint
    END,
    coalesce(worker_id, ''),
    CASE WHEN coalesce(error, '') = '' THEN ''
         -- Python's re: `$` also matches before a final newline.
         ELSE coalesce(substring(error FROM '^([A-Za-z_][\w.]{0,99})(?::|\n?$)'), 'Error')
    END

-- name: iso_dates
SET LOCAL DateStyle = 'ISO';

-- name: pending_events
SELECT count(*) FROM execution_events;
