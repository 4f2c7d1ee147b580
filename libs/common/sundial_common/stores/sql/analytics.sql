-- The analytics store (sundial_common.stores.analytics): the execution_events outbox that the analytics
-- service drains into ClickHouse (Postgres' retention drops whole days: partitions.sql).

-- name: take_events
-- The oldest queued events (by id: roughly commit order; a row committed late is simply taken by a later
-- pass), deleted and returned as the replica's rows, in sundial_analytics.replica.EVENT_COLUMNS order, as
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
WITH taken AS (
    DELETE FROM execution_events
    WHERE id IN (SELECT id FROM execution_events ORDER BY id LIMIT {limit} FOR UPDATE SKIP LOCKED)
    RETURNING *
), timed AS (
    SELECT t.*, coalesce(t.fire_at, t.scheduled_for) AS fire,
           CASE WHEN t.attempt = 1 THEN t.started_at
                ELSE (SELECT a.started_at FROM execution_attempts a
                      WHERE a.execution_id = t.execution_id AND a.attempt = 1) END AS first_start
    FROM taken t
)
SELECT id, at AT TIME ZONE 'UTC', kind, tenant_id, job_id, execution_id, attempt, state, pool, handler,
       scheduled_for AT TIME ZONE 'UTC', fire AT TIME ZONE 'UTC', created_at AT TIME ZONE 'UTC',
       started_at AT TIME ZONE 'UTC', finished_at AT TIME ZONE 'UTC',
       CASE WHEN first_start IS NOT NULL
            THEN greatest(0, trunc(extract(epoch FROM first_start - fire)::float8 * 1000))::bigint END,
       CASE WHEN finished_at IS NOT NULL AND started_at IS NOT NULL
            THEN greatest(0, trunc(extract(epoch FROM finished_at - started_at)::float8 * 1000))::bigint END,
       coalesce(worker_id, ''),
       CASE WHEN coalesce(error, '') = '' THEN ''
            -- Python's re: `$` also matches before a final newline.
            ELSE coalesce(substring(error FROM '^([A-Za-z_][\w.]{0,99})(?::|\n?$)'), 'Error') END
FROM timed

-- name: iso_dates
SET LOCAL DateStyle = 'ISO';

-- name: pending_events
SELECT count(*) FROM execution_events;
