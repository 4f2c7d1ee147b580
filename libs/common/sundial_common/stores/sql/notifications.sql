-- The notifications store (sundial_common.stores.notifications): subscriptions, incidents, their deliveries.

-- name: insert_subscription
INSERT INTO notification_subscriptions (id, tenant_id, created_by, events, pool, job_id, url, secrets, description,
                                        email_token_digest, allowed_origin, allowed_addresses)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
RETURNING *;

-- name: allow_destination
-- An administrator lets tenant $1's subscriptions reach origin $2 at addresses $3 (a second allowance of the same
-- origin replaces the addresses).
INSERT INTO notification_allowed_destinations (tenant_id, origin, addresses, allowed_by) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, origin) DO UPDATE SET addresses = excluded.addresses, allowed_by = excluded.allowed_by,
                                               created_at = now()
RETURNING *;

-- name: allowed_destination
SELECT * FROM notification_allowed_destinations WHERE tenant_id = $1 AND origin = $2;

-- name: allowed_destinations
SELECT * FROM notification_allowed_destinations WHERE ($1::text IS NULL OR tenant_id = $1) ORDER BY tenant_id, origin;

-- name: revoke_destination
-- The allowance goes, and with it every subscription's copy of it: their next send is checked as any other's.
WITH gone AS (
    DELETE FROM notification_allowed_destinations WHERE tenant_id = $1 AND origin = $2 RETURNING tenant_id, origin
), cleared AS (
    UPDATE notification_subscriptions s SET allowed_origin = NULL, allowed_addresses = NULL
    FROM gone WHERE s.tenant_id = gone.tenant_id AND s.allowed_origin = gone.origin
)
SELECT count(*) FROM gone;

-- name: confirm_email
-- The confirmation link of an e-mail subscription was followed: its address is confirmed (once; a second visit
-- finds it confirmed already and changes nothing).
UPDATE notification_subscriptions
SET email_confirmed_at = coalesce(email_confirmed_at, now())
WHERE email_token_digest = $1 AND deleted_at IS NULL
RETURNING *;

-- name: list_subscriptions
SELECT * FROM notification_subscriptions WHERE tenant_id = $1 AND deleted_at IS NULL ORDER BY created_at, id;

-- name: get_subscription
SELECT * FROM notification_subscriptions WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL;

-- name: delete_subscription
-- Its deliveries still pending are abandoned with it: nobody asked for them any more.
WITH gone AS (
    UPDATE notification_subscriptions SET deleted_at = now()
    WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL
    RETURNING id
), abandoned AS (
    UPDATE notification_deliveries d SET state = 'CANCELLED', finished_at = now(), claimed_until = NULL
    FROM gone WHERE d.subscription_id = gone.id AND d.state = 'PENDING'
)
SELECT count(*) FROM gone;

-- name: rotate_secret
-- A compare-and-swap on the sealed secrets read ($3): of two rotations at once, one wins and the other finds none.
UPDATE notification_subscriptions
SET secrets = $4, previous_secret_until = now() + make_interval(secs => $5::float8)
WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL AND secrets = $3
RETURNING *;

-- name: record_incidents
-- $1: a JSON array of incidents. An incident nobody subscribed to is not recorded at all; one whose key is
-- already there (recorded by an earlier pass, or a sweeper that crashed before it moved on) is nothing new.
-- Each new incident gets one delivery per matching subscription in this same statement.
WITH candidate AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(
        tenant_id text, event text, incident_key text, pool text, job_id uuid, execution_id uuid, detail jsonb)
), new AS (
    INSERT INTO notification_incidents (id, tenant_id, event, incident_key, pool, job_id, execution_id, detail)
    SELECT gen_random_uuid(), c.tenant_id, c.event, c.incident_key, c.pool, c.job_id, c.execution_id,
           coalesce(c.detail, '{}'::jsonb)
    FROM candidate c
    WHERE EXISTS (
        SELECT 1 FROM notification_subscriptions s
        WHERE s.tenant_id = c.tenant_id AND s.deleted_at IS NULL AND c.event = ANY (s.events)
          AND (s.pool IS NULL OR s.pool = c.pool) AND (s.job_id IS NULL OR s.job_id = c.job_id))
    ON CONFLICT (incident_key) DO NOTHING
    RETURNING *
), fanned AS (
    INSERT INTO notification_deliveries (id, incident_id, subscription_id)
    SELECT gen_random_uuid(), n.id, s.id
    FROM new n JOIN notification_subscriptions s
      ON s.tenant_id = n.tenant_id AND s.deleted_at IS NULL AND n.event = ANY (s.events)
     AND (s.pool IS NULL OR s.pool = n.pool) AND (s.job_id IS NULL OR s.job_id = n.job_id)
    RETURNING 1
)
SELECT (SELECT count(*) FROM new) AS incidents, (SELECT count(*) FROM fanned) AS deliveries;

-- name: late_starts
-- Occurrences still not started $1 seconds after they were due, of the tenants that subscribed to
-- `execution.late` (none: nothing is scanned): a job whose fire time passed without an execution (no dispatcher
-- made it), and a first attempt still PENDING (no worker started it). `due_for` names the occurrence (its
-- nominal time), the same in both, so an occurrence late first as a job and then as an execution is one incident.
WITH wanted AS (
    SELECT DISTINCT tenant_id FROM notification_subscriptions
    WHERE deleted_at IS NULL AND 'execution.late' = ANY (events)
)
(SELECT j.tenant_id, j.pool, j.id AS job_id, NULL::uuid AS execution_id, j.name AS job_name, j.handler,
        coalesce(j.next_nominal_at, j.next_fire_at) AS due_for, j.next_fire_at AS due_at
 FROM jobs j
 WHERE j.tenant_id IN (SELECT tenant_id FROM wanted) AND j.state = 'ACTIVE'
   AND j.next_fire_at < now() - make_interval(secs => $1::float8)
 ORDER BY j.next_fire_at LIMIT $2)
UNION ALL
(SELECT e.tenant_id, e.pool, e.job_id, e.id, NULL, e.handler, e.scheduled_for, coalesce(e.fire_at, e.scheduled_for)
 FROM executions e
 WHERE e.tenant_id IN (SELECT tenant_id FROM wanted) AND e.phase = 'OPEN' AND e.state = 'PENDING'
   AND e.attempt = 1 AND coalesce(e.fire_at, e.scheduled_for) < now() - make_interval(secs => $1::float8)
 ORDER BY e.created_at LIMIT $2);

-- name: last_outcomes
-- A batch of jobs (ids after $1, $2 of them) of the tenants subscribed to `execution.failing` or
-- `execution.recovered` (none: nothing is scanned), each with its latest finished occurrence (SUCCEEDED or DEAD,
-- by nominal time) and the one before it: two probes of the occurrence key (job_id, scheduled_for) per job
-- in each partition. `since` is the tenant's first such subscription: an outcome older than it was nobody's
-- to be told.
WITH wanted AS (
    SELECT tenant_id, min(created_at) AS since FROM notification_subscriptions
    WHERE deleted_at IS NULL AND events && ARRAY['execution.failing', 'execution.recovered']::text[]
    GROUP BY tenant_id
), batch AS (
    SELECT j.id, j.tenant_id, j.pool, j.name, j.handler, w.since
    FROM jobs j JOIN wanted w ON w.tenant_id = j.tenant_id
    WHERE j.id > $1
    ORDER BY j.id LIMIT $2
)
SELECT b.tenant_id, b.pool, b.id AS job_id, b.name AS job_name, b.handler, b.since,
       l.id AS execution_id, l.phase AS outcome, l.scheduled_for, l.finished_at, l.error,
       p.id AS previous_id, p.phase AS previous_outcome, p.scheduled_for AS previous_scheduled_for
FROM batch b
LEFT JOIN LATERAL (
    SELECT e.id, e.phase, e.scheduled_for, e.finished_at, e.error FROM executions e
    WHERE e.job_id = b.id AND e.phase IN ('SUCCEEDED', 'DEAD')
    ORDER BY e.scheduled_for DESC, e.id DESC LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT e.id, e.phase, e.scheduled_for FROM executions e
    WHERE e.job_id = b.id AND e.phase IN ('SUCCEEDED', 'DEAD') AND (e.scheduled_for, e.id) < (l.scheduled_for, l.id)
    ORDER BY e.scheduled_for DESC, e.id DESC LIMIT 1
) p ON true
ORDER BY b.id;

-- name: insert_test_delivery
-- A test send: an incident of its own (event `test`) and its one delivery, claimed by the caller at once.
WITH s AS (
    SELECT * FROM notification_subscriptions WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL
), i AS (
    INSERT INTO notification_incidents (id, tenant_id, event, incident_key, detail)
    SELECT $3::uuid, s.tenant_id, 'test', 'test:' || $3::uuid::text, '{}'::jsonb FROM s
    RETURNING *
)
INSERT INTO notification_deliveries (id, incident_id, subscription_id, attempts, claimed_until)
SELECT $4::uuid, i.id, $1, 1, now() + make_interval(secs => $5::float8) FROM i
RETURNING id, attempts;

-- name: claim_lock
-- The claims of all API replicas, one at a time (until the claim's transaction ends): two claims at once would
-- both see room under the same cap.
SELECT pg_advisory_xact_lock(hashtext('sundial.notification_claims'));

-- name: forget_old_sends
DELETE FROM notification_sends WHERE sent_at < now() - interval '2 minutes';

-- name: claim_due_deliveries
-- Due deliveries, each claimed for $2 seconds by one sender (API replicas share the work; a claim that ran
-- out, its sender gone, is taken again). `attempts` counts this attempt, and is the compare-and-swap token
-- of finish_delivery. Under caps per tenant and per destination (the subscription's URL): requests in flight
-- (a live claim) at most $3 and $4, requests sent in the last minute (notification_sends) at most $5 and $6; a
-- delivery over a cap stays due for a later pass. $7: the due deliveries looked at (oldest first). Each claim
-- is written to notification_sends. Run after claim_lock, in its transaction.
WITH due AS (
    SELECT d.id, d.next_attempt_at, i.tenant_id, s.url
    FROM notification_deliveries d
    JOIN notification_incidents i ON i.id = d.incident_id
    JOIN notification_subscriptions s ON s.id = d.subscription_id
    WHERE d.state = 'PENDING' AND d.next_attempt_at <= now() AND (d.claimed_until IS NULL OR d.claimed_until < now())
    ORDER BY d.next_attempt_at LIMIT $7
), in_flight AS (
    SELECT i.tenant_id, s.url, count(*) AS n
    FROM notification_deliveries d
    JOIN notification_incidents i ON i.id = d.incident_id
    JOIN notification_subscriptions s ON s.id = d.subscription_id
    WHERE d.state = 'PENDING' AND d.claimed_until >= now()
    GROUP BY i.tenant_id, s.url
), recent AS (
    SELECT tenant_id, url, count(*) AS n FROM notification_sends
    WHERE sent_at > now() - interval '1 minute'
    GROUP BY tenant_id, url
), url_ok AS (
    -- First the destinations' caps, then each tenant's among what they let through: a tenant's rank counts only
    -- deliveries its destinations may send, so a full destination does not hold back its tenant's others.
    SELECT due.id, due.next_attempt_at, due.tenant_id
    FROM (
        SELECT due.*, row_number() OVER (PARTITION BY due.url ORDER BY due.next_attempt_at, due.id) AS nth_of_url
        FROM due
    ) due
    WHERE coalesce((SELECT sum(f.n) FROM in_flight f WHERE f.url = due.url), 0) + due.nth_of_url <= $4
      AND coalesce((SELECT sum(r.n) FROM recent r WHERE r.url = due.url), 0) + due.nth_of_url <= $6
), allowed AS (
    SELECT id FROM (
        SELECT ok.id, ok.next_attempt_at, ok.tenant_id,
               row_number() OVER (PARTITION BY ok.tenant_id ORDER BY ok.next_attempt_at, ok.id) AS nth_of_tenant
        FROM url_ok ok
    ) ok
    WHERE coalesce((SELECT sum(f.n) FROM in_flight f WHERE f.tenant_id = ok.tenant_id), 0) + ok.nth_of_tenant <= $3
      AND coalesce((SELECT sum(r.n) FROM recent r WHERE r.tenant_id = ok.tenant_id), 0) + ok.nth_of_tenant <= $5
    ORDER BY ok.next_attempt_at, ok.id LIMIT $1
), claimed AS (
    UPDATE notification_deliveries d
    SET claimed_until = now() + make_interval(secs => $2::float8), attempts = d.attempts + 1
    FROM notification_incidents i, notification_subscriptions s
    WHERE d.id IN (SELECT id FROM allowed)
      AND i.id = d.incident_id AND s.id = d.subscription_id
    RETURNING d.id, d.attempts, d.subscription_id, i.id AS incident_id, i.tenant_id, i.event, i.pool, i.job_id,
              i.execution_id, i.detail, i.occurred_at, s.url, s.secrets, s.email_confirmed_at, s.allowed_addresses,
              coalesce(s.previous_secret_until > now(), false) AS previous_secret_valid
), sent AS (
    INSERT INTO notification_sends (tenant_id, url) SELECT tenant_id, url FROM claimed
)
SELECT * FROM claimed;

-- name: delivery_for_send
SELECT d.id, d.attempts, d.subscription_id, i.id AS incident_id, i.tenant_id, i.event, i.pool, i.job_id,
       i.execution_id, i.detail, i.occurred_at, s.url, s.secrets, s.email_confirmed_at, s.allowed_addresses,
       coalesce(s.previous_secret_until > now(), false) AS previous_secret_valid
FROM notification_deliveries d
JOIN notification_incidents i ON i.id = d.incident_id
JOIN notification_subscriptions s ON s.id = d.subscription_id
WHERE d.id = $1;

-- name: finish_delivery
-- $3: DELIVERED, FAILED (for good) or PENDING (again after $6 seconds). Only the attempt that claimed it ($2).
UPDATE notification_deliveries
SET state = $3, last_status = $4, last_error = $5, claimed_until = NULL,
    next_attempt_at = CASE WHEN $3 = 'PENDING' THEN now() + make_interval(secs => $6::float8) ELSE next_attempt_at END,
    finished_at = CASE WHEN $3 = 'PENDING' THEN NULL ELSE now() END
WHERE id = $1 AND attempts = $2 AND state = 'PENDING'
RETURNING id;

-- name: delivery_log
-- A subscription's deliveries, newest first, before the cursor's creation time.
SELECT d.id, d.state, d.attempts, d.last_status, d.last_error, d.created_at, d.finished_at, d.next_attempt_at,
       i.id AS incident_id, i.event, i.job_id, i.execution_id, i.occurred_at
FROM notification_deliveries d
JOIN notification_incidents i ON i.id = d.incident_id
JOIN notification_subscriptions s ON s.id = d.subscription_id
WHERE d.subscription_id = $1 AND s.tenant_id = $2
ORDER BY d.created_at DESC, d.id DESC LIMIT $3;

-- name: prune_incidents
-- Incidents older than $1 days whose deliveries are all over (none PENDING), $2 at most; their deliveries go with
-- them (ON DELETE CASCADE), and so leave the delivery logs.
DELETE FROM notification_incidents
WHERE id IN (
    SELECT i.id FROM notification_incidents i
    WHERE i.occurred_at < now() - make_interval(days => $1::int)
      AND NOT EXISTS (SELECT 1 FROM notification_deliveries d WHERE d.incident_id = i.id AND d.state = 'PENDING')
    ORDER BY i.occurred_at LIMIT $2);

-- name: finished_operations
-- Backfills, replays and bulk operations that finished in the last $1 seconds (and after their tenant's first
-- subscription to their event), with no incident yet: at most $2 of each kind. A backfill is finished once its
-- range is walked (or it was cancelled) and every execution it made has ended; its counts are those executions'
-- outcomes. Only operations of subscribed tenants are read (none: nothing is scanned).
WITH wanted AS (
    SELECT s.tenant_id, e.event, min(s.created_at) AS since
    FROM notification_subscriptions s, unnest(s.events) AS e (event)
    WHERE s.deleted_at IS NULL AND e.event IN ('backfill.finished', 'replay.finished', 'bulk.finished')
    GROUP BY s.tenant_id, e.event
)
(SELECT 'backfill.finished' AS event, b.id, b.tenant_id, j.pool, b.job_id, b.state, b.finished_at, NULL AS error,
        jsonb_build_object('total', b.total, 'created', b.created, 'succeeded', c.succeeded, 'dead', c.dead,
                           'cancelled', c.cancelled, 'from', b.range_from, 'to', b.range_to,
                           'jobName', j.name) AS counts
 FROM backfills b
 JOIN wanted w ON w.tenant_id = b.tenant_id AND w.event = 'backfill.finished'
 LEFT JOIN jobs j ON j.id = b.job_id
 CROSS JOIN LATERAL (
     SELECT count(*) FILTER (WHERE e.phase = 'SUCCEEDED') AS succeeded,
            count(*) FILTER (WHERE e.phase = 'DEAD') AS dead,
            count(*) FILTER (WHERE e.phase = 'CANCELLED') AS cancelled,
            count(*) FILTER (WHERE e.phase = 'OPEN') AS open
     FROM executions e WHERE e.backfill_id = b.id
 ) c
 WHERE b.state IN ('DONE', 'CANCELLED') AND b.finished_at > now() - make_interval(secs => $1::float8)
   AND b.finished_at >= w.since AND c.open = 0
   AND NOT EXISTS (SELECT 1 FROM notification_incidents i WHERE i.incident_key = 'backfill.finished:' || b.id)
 ORDER BY b.finished_at LIMIT $2)
UNION ALL
(SELECT 'replay.finished', r.id, r.tenant_id, r.target_pool, NULL::uuid, r.state, r.finished_at, r.error,
        jsonb_build_object('scanned', r.scanned, 'matched', r.matched, 'published', r.published,
                           'sourcePool', r.source_pool, 'targetPool', r.target_pool, 'dryRun', r.dry_run,
                           'outcomes', (SELECT coalesce(jsonb_object_agg(o.outcome, o.n), '{}'::jsonb)
                                        FROM (SELECT outcome, count(*) AS n FROM replay_runs
                                              WHERE replay_id = r.id GROUP BY outcome) o))
 FROM replays r
 JOIN wanted w ON w.tenant_id = r.tenant_id AND w.event = 'replay.finished'
 WHERE r.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND r.finished_at > now() - make_interval(secs => $1::float8)
   AND r.finished_at >= w.since
   AND NOT EXISTS (SELECT 1 FROM notification_incidents i WHERE i.incident_key = 'replay.finished:' || r.id)
 ORDER BY r.finished_at LIMIT $2)
UNION ALL
(SELECT 'bulk.finished', o.id, o.tenant_id, NULL, NULL, o.state, o.finished_at, o.error,
        jsonb_build_object('target', o.target, 'action', o.action, 'total', o.total, 'done', o.done,
                           'skipped', o.skipped, 'failed', o.failed)
 FROM bulk_operations o
 JOIN wanted w ON w.tenant_id = o.tenant_id AND w.event = 'bulk.finished'
 WHERE o.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND o.finished_at > now() - make_interval(secs => $1::float8)
   AND o.finished_at >= w.since
   AND NOT EXISTS (SELECT 1 FROM notification_incidents i WHERE i.incident_key = 'bulk.finished:' || o.id)
 ORDER BY o.finished_at LIMIT $2);

-- name: pool_backlogs
-- Per (tenant, pool): the executions waiting for a worker (PENDING) of the tenants subscribed to `pool.unserved`
-- or `pool.served` (none: nothing is scanned), and every pool whose episode is open for them (its `pending` may
-- be 0). Open rows only (executions_tenant_phase_idx).
WITH wanted AS (
    SELECT DISTINCT tenant_id FROM notification_subscriptions
    WHERE deleted_at IS NULL AND events && ARRAY['pool.unserved', 'pool.served']::text[]
), waiting AS (
    SELECT e.tenant_id, e.pool, count(*) AS pending
    FROM executions e
    WHERE e.tenant_id IN (SELECT tenant_id FROM wanted) AND e.phase = 'OPEN' AND e.state = 'PENDING'
    GROUP BY e.tenant_id, e.pool
)
SELECT coalesce(w.tenant_id, p.tenant_id) AS tenant_id, coalesce(w.pool, p.pool) AS pool,
       coalesce(w.pending, 0) AS pending, p.unserved_since IS NOT NULL AS open
FROM waiting w
FULL JOIN (SELECT * FROM pool_episodes WHERE unserved_since IS NOT NULL) p
  ON p.tenant_id = w.tenant_id AND p.pool = w.pool;

-- name: open_pool_episode
-- A compare-and-set: (tenant $1, pool $2) has been unserved since now, unless an episode is already open.
-- Returns the new episode's number; no row: it was open already (another sweeper's pass opened it).
INSERT INTO pool_episodes AS p (tenant_id, pool, episode, unserved_since) VALUES ($1, $2, 1, now())
ON CONFLICT (tenant_id, pool) DO UPDATE SET episode = p.episode + 1, unserved_since = now()
WHERE p.unserved_since IS NULL
RETURNING episode, unserved_since;

-- name: close_pool_episode
-- A compare-and-set: the open episode of (tenant $1, pool $2) is over. No row: none was open.
UPDATE pool_episodes p SET unserved_since = NULL, served_at = now()
FROM pool_episodes old
WHERE p.tenant_id = $1 AND p.pool = $2 AND p.unserved_since IS NOT NULL
  AND old.tenant_id = p.tenant_id AND old.pool = p.pool
RETURNING p.episode, old.unserved_since;
