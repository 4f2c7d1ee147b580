-- The breaker store (sundial_common.stores.breakers): the retry circuit breaker per (tenant, pool, handler),
-- the window counts the executions trigger writes (migration 0016), the retries breakers hold.
-- Every transition is a compare-and-set on the breaker's version, and writes its audit row in the same
-- statement.

-- name: now
SELECT now();

-- name: quiet
-- Nothing for the breaker loop to judge: no attempt ended within the longest window a tenant may set (3600 s),
-- every breaker is CLOSED with empty counts, and no retry is held (executions_held_idx). One statement instead
-- of a pass's four, while nothing happens.
SELECT NOT EXISTS (SELECT 1 FROM breaker_counts WHERE bucket >= now() - interval '3600 seconds')
   AND NOT EXISTS (SELECT 1 FROM breakers WHERE state <> 'CLOSED' OR attempts <> 0 OR failures <> 0)
   AND NOT EXISTS (SELECT 1 FROM executions WHERE held_by IS NOT NULL);

-- name: window_counts
-- Finished attempts and failures per handler and second since $1 (the longest window any tenant has).
SELECT tenant_id, pool, handler, bucket, sum(attempts)::int AS attempts, sum(failures)::int AS failures
FROM breaker_counts
WHERE bucket >= $1
GROUP BY tenant_id, pool, handler, bucket;

-- name: prune_counts
DELETE FROM breaker_counts WHERE bucket < $1;

-- name: tenant_settings
-- Tenants that set breaker settings of their own (the others use the defaults).
SELECT id, breaker FROM tenants WHERE breaker IS NOT NULL;

-- name: all_breakers
-- Every breaker with the retries it holds and whether its next probe is due (the database's clock).
SELECT b.*, coalesce(h.held, 0)::int AS held, (b.next_probe_at <= now()) IS TRUE AS probe_due
FROM breakers b
LEFT JOIN LATERAL (
    SELECT count(*) AS held FROM executions e WHERE e.held_by = b.id AND e.next_attempt_at IS NOT NULL
) h ON true
ORDER BY b.tenant_id, b.pool, b.handler;

-- name: tenant_breakers
-- One tenant's breakers (GET /v1/breakers), with what each holds.
SELECT b.*, coalesce(h.held, 0)::int AS held, (b.next_probe_at <= now()) IS TRUE AS probe_due
FROM breakers b
LEFT JOIN LATERAL (
    SELECT count(*) AS held FROM executions e WHERE e.held_by = b.id AND e.next_attempt_at IS NOT NULL
) h ON true
WHERE b.tenant_id = $1 AND ($2::text IS NULL OR b.pool = $2) AND ($3::text IS NULL OR b.state = $3)
ORDER BY b.pool, b.handler;

-- name: get_breaker
SELECT b.*, coalesce(h.held, 0)::int AS held, (b.next_probe_at <= now()) IS TRUE AS probe_due
FROM breakers b
LEFT JOIN LATERAL (
    SELECT count(*) AS held FROM executions e WHERE e.held_by = b.id AND e.next_attempt_at IS NOT NULL
) h ON true
WHERE b.id = $1 AND b.tenant_id = $2;

-- name: ensure_breakers
-- A CLOSED breaker for each handler seen in the window that has none yet, counting from $4 (the start of the
-- window the pass read): the attempts that ended before its row existed are its too.
INSERT INTO breakers (tenant_id, pool, handler, since)
SELECT t, p, h, $4 FROM unnest($1::text[], $2::text[], $3::text[]) AS n (t, p, h)
WHERE EXISTS (SELECT 1 FROM tenants WHERE id = n.t)
ON CONFLICT ON CONSTRAINT breakers_handler_key DO NOTHING;

-- name: record_window
-- The window as last evaluated (what GET /v1/breakers shows as the failure ratio): one statement per pass.
UPDATE breakers b SET attempts = n.attempts, failures = n.failures
FROM unnest($1::uuid[], $2::int[], $3::int[]) AS n (id, attempts, failures)
WHERE b.id = n.id AND (b.attempts, b.failures) IS DISTINCT FROM (n.attempts, n.failures);

-- name: transition
-- Move breaker $1 from version $2 to state $3, compare-and-set. $4: seconds to the next probe (NULL: none);
-- $5: the cool-down; $6: how many probes half-open lets through; $7: held open by an operator; $8/$9: the
-- window's counts; $10: the action audited, $11: the actor, $12: audit detail; $13: when the new state's
-- counting starts (NULL: now) and $14/$15 what its second's bucket already held then; $16: its hold bound
-- from now (NULL: unchanged). No row: someone moved first.
WITH old AS (
    SELECT id, state FROM breakers WHERE id = $1 AND version = $2 FOR UPDATE
), moved AS (
    UPDATE breakers b
    SET state = $3,
        since = CASE WHEN $3 = 'OPEN' THEN b.since ELSE coalesce($13::timestamptz, now()) END,
        since_attempts = CASE WHEN $3 = 'OPEN' THEN b.since_attempts ELSE $14 END,
        since_failures = CASE WHEN $3 = 'OPEN' THEN b.since_failures ELSE $15 END,
        opened_at = CASE WHEN $3 = 'CLOSED' THEN NULL WHEN b.state = 'CLOSED' THEN now() ELSE b.opened_at END,
        next_probe_at = CASE WHEN $4::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $4::float8) END,
        cooldown_sec = $5, probe_limit = $6, probes_sent = 0, manual = $7, attempts = $8, failures = $9,
        max_hold_sec = coalesce($16::float8, b.max_hold_sec),
        opens = b.opens + CASE WHEN $3 = 'OPEN' THEN 1 ELSE 0 END,
        version = b.version + 1, updated_at = now()
    FROM old WHERE b.id = old.id
    RETURNING b.*, old.state AS from_state
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'breaker', id, $10, from_state, state, $11, $12::jsonb FROM moved
)
SELECT m.*, (SELECT count(*) FROM executions e WHERE e.held_by = m.id AND e.next_attempt_at IS NOT NULL)::int
       AS held, false AS probe_due
FROM moved m;

-- name: release_held
-- A closed breaker lets its held retries go, spread over $2 seconds at random (no thundering herd at close);
-- their hold is over, so its clock starts again should a breaker hold them later.
UPDATE executions
SET held_by = NULL, held_since = NULL,
    next_attempt_at = CASE WHEN next_attempt_at IS NULL THEN NULL
                           ELSE now() + random() * make_interval(secs => $2) END
WHERE held_by = $1
RETURNING id, shard, next_attempt_at;

-- name: gate
-- Inside the dispatcher's fenced retry transaction: the claimed retries whose breaker is not CLOSED (and whose
-- job has not opted out), with the breaker locked so two shards' leaders share one probe budget; and whether
-- each has been held longer than its bound (the job's breaker.maxHoldSec, else its breaker's).
SELECT e.id, b.id AS breaker_id, b.state, b.probe_limit, b.probes_sent, e.attempt, j.retry_policy,
       -- An operator's open has no probe time: its held retries look again every minute. A hold ends at its bound
       -- if that comes first, so the attempt is ended then, not at a probe time up to a cool-down later.
       least(greatest(coalesce(b.next_probe_at, now() + interval '60 seconds'), now()),
             coalesce(e.held_since, now()) + h.bound) AS hold_until,
       e.held_since IS NOT NULL AND e.held_since + h.bound <= now() AS hold_expired
FROM executions e
JOIN breakers b ON b.tenant_id = e.tenant_id AND b.pool = e.pool AND b.handler = e.handler
JOIN jobs j ON j.id = e.job_id
CROSS JOIN LATERAL (
    SELECT make_interval(secs => coalesce((j.breaker ->> 'maxHoldSec')::float8, b.max_hold_sec)) AS bound
) h
WHERE e.id = ANY($1::uuid[]) AND b.state <> 'CLOSED' AND coalesce((j.breaker ->> 'enabled')::boolean, true)
ORDER BY b.id, e.id
FOR UPDATE OF b;

-- name: hold
-- Hold retries: their failed state and attempt stay, the next attempt moves to the breaker's next probe plus
-- $3 seconds of jitter (held retries become due over a spread, not at one instant).
UPDATE executions e
SET held_by = h.breaker_id, held_since = coalesce(e.held_since, now()),
    next_attempt_at = h.until + make_interval(secs => 1) + random() * make_interval(secs => $3)
FROM unnest($1::uuid[], $2::uuid[], $4::timestamptz[]) AS h (id, breaker_id, until)
WHERE e.id = h.id AND e.next_attempt_at IS NOT NULL;

-- name: end_held
-- Inside the dispatcher's fenced retry transaction: held retries past their bound end their next attempt without
-- running it (the claimed attempt number $2 compared-and-set): error BreakerHeld, a failed attempt; DEAD after the
-- last, else the next one $3 ms from now (its policy's backoff), where the gate will judge it again. The attempt
-- ends at clock_timestamp(), not now(): the breaker_counts trigger counts what ends at now(), and an attempt
-- that never called the handler says nothing about it. $4: the actor.
WITH ended AS (
    UPDATE executions e
    SET attempt = e.attempt + 1,
        state = CASE WHEN e.attempt + 1 >= e.max_attempts THEN 'DEAD' ELSE 'FAILED' END,
        next_attempt_at = CASE WHEN e.attempt + 1 >= e.max_attempts THEN NULL
                               ELSE now() + f.delay_ms * interval '1 millisecond' END,
        held_by = CASE WHEN e.attempt + 1 >= e.max_attempts THEN NULL ELSE e.held_by END,
        error = 'BreakerHeld: held by an open circuit breaker longer than maxHoldSec; not attempted',
        worker_id = NULL, started_at = NULL, finished_at = clock_timestamp(), dlq_published_at = NULL
    FROM unnest($1::uuid[], $2::int[], $3::bigint[]) AS f (id, attempt, delay_ms)
    WHERE e.id = f.id AND e.attempt = f.attempt AND e.next_attempt_at IS NOT NULL
    RETURNING e.id, e.tenant_id, e.attempt, e.state, e.error, e.finished_at, e.next_attempt_at
), attempts AS (
    INSERT INTO execution_attempts (execution_id, attempt, tenant_id, worker_id, state, started_at, finished_at, error)
    SELECT id, attempt, tenant_id, $4, 'FAILED', finished_at, finished_at, error FROM ended
), audit AS (
    INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
    SELECT tenant_id, 'execution', id, 'breaker_held', 'FAILED', state, $4,
           jsonb_build_object('attempt', attempt, 'nextAttemptAt', next_attempt_at, 'errorClass', 'BreakerHeld')
    FROM ended
    UNION ALL
    SELECT tenant_id, 'execution', id, 'dead', 'FAILED', 'DEAD', $4, jsonb_build_object('attempt', attempt)
    FROM ended WHERE state = 'DEAD'
)
SELECT count(*) FROM ended;

-- name: count_probes
UPDATE breakers b SET probes_sent = b.probes_sent + n.sent
FROM unnest($1::uuid[], $2::int[]) AS n (id, sent)
WHERE b.id = n.id;

-- name: unhold
-- Probes let through are no longer held.
UPDATE executions SET held_by = NULL WHERE id = ANY($1::uuid[]) AND held_by IS NOT NULL;

-- name: hold_first_fires
-- Inside the dispatcher's fenced dispatch transaction (the jobs are locked): jobs that chose
-- `breaker.firstFires = HOLD` whose handler's breaker is not CLOSED keep their occurrence (next_nominal_at)
-- and fire later — next_fire_at moves to the breaker's next probe plus $2 seconds of jitter, as a job's jitter
-- moves a fire — so the execution, when it runs, has its nominal time and shows the delay in fireAt.
UPDATE jobs j
SET next_fire_at = greatest(coalesce(b.next_probe_at, now() + interval '60 seconds'), now())
                   + make_interval(secs => 1) + random() * make_interval(secs => $2)
FROM breakers b
WHERE j.id = ANY($1::uuid[]) AND b.tenant_id = j.tenant_id AND b.pool = j.pool AND b.handler = j.handler
  AND b.state <> 'CLOSED'
RETURNING j.id, j.next_fire_at;

-- name: release_first_fires
-- A closing breaker lets the first fires it held go, spread at random over $4 seconds: active jobs of its
-- handler that chose HOLD and whose occurrence is past but whose fire was pushed later.
UPDATE jobs
SET next_fire_at = now() + random() * make_interval(secs => $4)
WHERE tenant_id = $1 AND pool = $2 AND handler = $3 AND state = 'ACTIVE' AND breaker ->> 'firstFires' = 'HOLD'
  AND next_nominal_at <= now() AND next_fire_at > now()
RETURNING id, shard, next_fire_at;
