-- The connection's own statements (sundial_common.stores.database): the readiness probe, and how a statement that
-- reads every partition of executions is planned.

-- name: ping
SELECT 1;

-- name: every_partition_plan
-- Before a statement that reads the open (or dead-lettered) rows of every partition of executions, in its
-- transaction (Database.fetch_every_partition): the dispatchers' fair census (tenants.sql, open_executions) and the
-- sweeper's scans (running_executions, dead_letters, stale_pending, published_pending_pools, passed_pending). An
-- open execution may be a retry in an old day, so nothing in these statements prunes a partition: a plan made for
-- each call's values, as the pool's plan_cache_mode would, plans every partition's indexes at every call and prunes
-- nothing. A generic plan is made once per connection and kept until a partition's statistics change: the census
-- planned 5-17 ms a call with 38 partitions (the bench lines' plan_ms at a steady load); the sweeper's four scans of a pass cost its
-- backend ~16 ms of CPU with 40 partitions and 1,000 RUNNING rows, ~5.5 ms with generic plans.
-- Index scans only: the partial indexes of the open phase keep an
-- entry for every version a row had while open that no heap-only update made (each finish leaves one behind)
-- until vacuum; a bitmap scan, which the planner picked for the census (on executions_job_open_idx), visits every
-- one of them and their heap pages, call after call: 175,000 entries and 3,500 heap pages for 3,000 open rows after
-- 100,000 executions, 106-183 ms a call. A plain index scan marks the entries of dead versions as it passes
-- (LP_DEAD), so each is visited about once, by the next scan after its version died: 209 pages and 3 ms for the
-- same rows (bench/workloads/census.py). A sequential scan would read a whole day's partition, and a generic plan made
-- while the partitions are nearly empty would keep it.
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true);
