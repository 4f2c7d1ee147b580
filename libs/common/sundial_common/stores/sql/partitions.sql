-- The partition store (sundial_common.stores.partitions): the daily partitions of executions and
-- execution_attempts (migration 0018: ranged on the execution id, a UUIDv7), made ahead and dropped past
-- retention. The DDL itself is in the migration's functions, so the schema and the names it makes are
-- versioned together; these statements call them.

-- name: executions_partitions
-- Every partition of executions with its upper bound (the first id of the next range).
SELECT c.relname AS name,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9a-f-]+)''\)')::uuid AS upper_id
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'executions'::regclass
ORDER BY upper_id;

-- name: add_partitions
-- The partitions of $2 UTC days from $1 that do not exist yet; how many were made.
SELECT sundial_add_execution_partitions($1::date, $2::int);

-- name: drop_partition
-- One expired day, unless it still holds an open execution, an unpublished dead letter or unreplicated
-- events (see the function); true if it went.
SELECT sundial_drop_execution_partition($1::text);

-- name: lock_timeout
-- A partition's creation and drop take its parent exclusively: waiting long would queue every execution
-- write behind them. Set for the transaction only; a pass that times out tries again next time.
SELECT set_config('lock_timeout', $1::text, true);

-- name: audit_partitions
-- Every partition of audit_log with where its range ends (migration 0020: by day of `at`).
SELECT c.relname AS name,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz AS ends_at
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'audit_log'::regclass
ORDER BY ends_at;

-- name: add_audit_partitions
-- The partitions of audit_log of $2 UTC days from $1 that do not exist yet; how many were made.
SELECT sundial_add_audit_partitions($1::date, $2::int);

-- name: drop_audit_partition
-- One expired day of audit_log; true if it went.
SELECT sundial_drop_audit_partition($1::text);

-- name: executions_begin
-- Where the oldest partition of executions that is left begins: every execution there is was created at or after
-- it. NULL if one begins at MINVALUE (an upgraded database's legacy partition: anything may be in it).
SELECT substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([0-9a-f-]+)''\)')::uuid AS lower_id
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'executions'::regclass
ORDER BY lower_id NULLS FIRST
LIMIT 1;
