-- The ClickHouse replica (sundial_analytics.replica). `{db}` (a checked identifier), `{ttl_days}` (an
-- integer setting) and, in the stats queries, `{bucket}`/`{group}` (picked from fixed tables in Python)
-- are formatted in, because ClickHouse takes no parameters for identifiers; every value is a
-- {name:Type} server-side parameter.
--
-- Both tables are ReplacingMergeTree ordered by columns that never change for a row, so the versions of
-- one row (re-sent after a crash, or a later state of the same execution) have identical ORDER BY values
-- and FINAL collapses them: that is what makes the replica idempotent under at-least-once delivery.

-- name: create_database
CREATE DATABASE IF NOT EXISTS {db}

-- name: create_events
-- Every lifecycle event, one row each (event_id is the Postgres outbox id).
CREATE TABLE IF NOT EXISTS {db}.execution_events (
    event_id        UInt64,
    at              DateTime64(3, 'UTC'),
    kind            LowCardinality(String),
    tenant_id       LowCardinality(String),
    job_id          UUID,
    execution_id    UUID,
    attempt         UInt16,
    state           LowCardinality(String),
    pool            LowCardinality(String),
    handler         LowCardinality(String),
    scheduled_for   DateTime64(3, 'UTC'),
    fire_at         DateTime64(3, 'UTC'),
    created_at      DateTime64(3, 'UTC'),
    started_at      Nullable(DateTime64(3, 'UTC')),
    finished_at     Nullable(DateTime64(3, 'UTC')),
    lateness_ms     Nullable(Int64),
    duration_ms     Nullable(Int64),
    worker_id       String,
    error_class     LowCardinality(String)
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (tenant_id, at, event_id)
TTL toDateTime(at) + INTERVAL {ttl_days} DAY

-- name: create_executions
-- One row per execution, its latest state winning (version = the event id, which grows per execution:
-- its changes are serialized by the row lock, each taking its id after the previous one committed).
CREATE TABLE IF NOT EXISTS {db}.executions (
    tenant_id       LowCardinality(String),
    scheduled_for   DateTime64(3, 'UTC'),
    execution_id    UUID,
    version         UInt64,
    updated_at      DateTime64(3, 'UTC'),
    -- The latest event's kind: `retried` marks a failed attempt whose next one is scheduled (still open).
    kind            LowCardinality(String),
    job_id          UUID,
    attempt         UInt16,
    state           LowCardinality(String),
    pool            LowCardinality(String),
    handler         LowCardinality(String),
    fire_at         DateTime64(3, 'UTC'),
    created_at      DateTime64(3, 'UTC'),
    started_at      Nullable(DateTime64(3, 'UTC')),
    finished_at     Nullable(DateTime64(3, 'UTC')),
    lateness_ms     Nullable(Int64),
    duration_ms     Nullable(Int64),
    worker_id       String,
    error_class     LowCardinality(String),
    -- GET /v1/executions/{id} of an execution gone from Postgres finds it without its nominal time.
    INDEX execution_idx execution_id TYPE bloom_filter GRANULARITY 4
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(scheduled_for)
ORDER BY (tenant_id, scheduled_for, execution_id)
TTL toDateTime(scheduled_for) + INTERVAL {ttl_days} DAY

-- name: create_executions_view
-- Every inserted event also lands in `executions` (ClickHouse does it per inserted block): the ingester
-- serializes each batch once.
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.executions_from_events TO {db}.executions AS
SELECT tenant_id, scheduled_for, execution_id, event_id AS version, at AS updated_at, kind, job_id, attempt, state,
       pool, handler, fire_at, created_at, started_at, finished_at, lateness_ms, duration_ms, worker_id, error_class
FROM {db}.execution_events

-- name: table_ttl
SELECT name, create_table_query FROM system.tables WHERE database = {db_name:String}

-- name: modify_ttl
ALTER TABLE {db}.{table} MODIFY TTL toDateTime({column}) + INTERVAL {ttl_days} DAY

-- name: execution_stats
-- Counts, failure rate and percentiles per time bucket (and group), for one tenant's executions whose
-- nominal time is in [from, to). Failed = ended in a failure state (DEAD included); a retried execution
-- counts once, in its latest state, and is open while its next attempt is scheduled.
SELECT
    {bucket}(scheduled_for) AS bucket,
    {group} AS grp,
    count() AS executions,
    countIf(state = 'SUCCEEDED') AS succeeded,
    countIf(state IN ('FAILED', 'TIMED_OUT', 'FAILED_WORKER_LOST', 'DEAD') AND kind != 'retried') AS failed,
    countIf(state IN ('PENDING', 'RUNNING') OR kind = 'retried') AS open,
    quantiles(0.5, 0.95, 0.99)(lateness_ms) AS lateness,
    quantiles(0.5, 0.95, 0.99)(duration_ms) AS duration
FROM {db}.executions FINAL
WHERE tenant_id = {tenant:String} AND scheduled_for >= {start:DateTime64(3, 'UTC')}
  AND scheduled_for < {end:DateTime64(3, 'UTC')}
GROUP BY bucket, grp
ORDER BY bucket, grp

-- name: handler_stats
SELECT
    pool,
    handler,
    count() AS executions,
    countIf(state = 'SUCCEEDED') AS succeeded,
    countIf(state IN ('FAILED', 'TIMED_OUT', 'FAILED_WORKER_LOST', 'DEAD') AND kind != 'retried') AS failed,
    quantiles(0.5, 0.95, 0.99)(duration_ms) AS duration,
    topKIf(1)(error_class, error_class != '') AS top_error
FROM {db}.executions FINAL
WHERE tenant_id = {tenant:String} AND scheduled_for >= {start:DateTime64(3, 'UTC')}
  AND scheduled_for < {end:DateTime64(3, 'UTC')}
GROUP BY pool, handler

-- name: state_counts
-- The convergence check: executions per tenant × state × day (UTC, of the nominal time).
SELECT tenant_id, state, toDate(scheduled_for) AS day, count() AS executions
FROM {db}.executions FINAL
GROUP BY tenant_id, state, day

-- name: find_execution
SELECT tenant_id, execution_id, state, attempt, pool, handler, scheduled_for, finished_at
FROM {db}.executions FINAL
WHERE tenant_id = {tenant:String} AND execution_id = {execution_id:UUID}
