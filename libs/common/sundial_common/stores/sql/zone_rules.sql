-- name: recorded
-- Each zone's rules fingerprint as last recorded.
SELECT zone, fingerprint FROM zone_rules;

-- name: record
INSERT INTO zone_rules (zone, fingerprint) VALUES ($1, $2)
ON CONFLICT (zone) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, recorded_at = now();

-- name: zones_in_use
-- The zones whose rules place a stored next fire: CRON jobs that still fire.
SELECT DISTINCT timezone FROM jobs WHERE type = 'CRON' AND next_fire_at IS NOT NULL;

-- name: scheduled_in_zone
-- The CRON jobs of one zone that still fire, with the last occurrence each has run (or its creation).
SELECT j.id, j.tenant_id, j.shard, j.type, j.timezone, j.schedule, j.interval_sec, j.run_at, j.run_list,
       j.start_at, j.end_at, j.max_runs, j.jitter_sec, j.fire_count, j.next_nominal_at, j.next_fire_at,
       coalesce((SELECT max(e.scheduled_for) FROM executions e WHERE e.job_id = j.id), j.created_at) AS last_nominal
FROM jobs j
WHERE j.type = 'CRON' AND j.timezone = $1 AND j.next_fire_at IS NOT NULL;

-- name: reschedule
-- Move one job's next fire (if it is still where it was read) and audit why.
WITH moved AS (
    UPDATE jobs SET next_nominal_at = $3, next_fire_at = $4, version = version + 1, updated_at = now()
    WHERE id = $1 AND next_fire_at IS NOT DISTINCT FROM $2
    RETURNING id, tenant_id, shard, state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'job', id, 'reschedule', state, state, 'sundial-hydrator',
           jsonb_build_object('from', $2::timestamptz, 'to', $4::timestamptz, 'reason', $5::text)
    FROM moved
)
SELECT id, shard, state FROM moved;
