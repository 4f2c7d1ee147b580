-- The audit store (sundial_common.stores.audit): reading a job's or an execution's audit trail, and recording
-- execution events that happen outside the statements that change executions.
-- The rows themselves are written by the statement that makes each change (an `audit AS (INSERT …)` step in
-- jobs.sql, executions.sql and dispatch.sql), so a change and its audit row commit together or not at all.

-- name: entries
-- One page of an entity's trail, oldest first, after the row id $4 (0 = from the start); $5: the actions to
-- keep (NULL = all). Tenant-scoped: another tenant's entity has no rows here. An index range on
-- audit_entity_idx (entity_id, id).
SELECT id, at, action, from_state, to_state, actor, detail
FROM audit_log
WHERE entity_id = $1 AND tenant_id = $2 AND entity = $3 AND id > $4
  AND ($5::text[] IS NULL OR action = ANY($5::text[]))
ORDER BY id
LIMIT $6;

-- name: record_execution_events
-- Events about executions that change no execution row (a worker refusing another tenant's message): one
-- statement for the batch. The execution's tenant is taken from the execution itself, so an event can never
-- land in another tenant's trail whatever the caller believed; events of unknown executions are dropped.
INSERT INTO audit_log (tenant_id, entity, entity_id, action, from_state, to_state, actor, detail)
SELECT e.tenant_id, 'execution', e.id, r.action, e.state, e.state, r.actor, r.detail
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[]) AS r (execution_id, action, actor, detail)
JOIN executions e ON e.id = r.execution_id
RETURNING entity_id;

-- name: newest_id
-- Where the web console's change feed starts: the highest row id (each partition's primary key answers).
SELECT coalesce(max(id), 0) FROM audit_log;

-- name: changes_since
-- The web console's change feed, once a second per API process: per tenant, the rows above id $1 (a range on
-- each partition's primary key), their count and id sum (any new row changes the pair) and the newest id.
SELECT tenant_id, count(*) AS changed, sum(id) AS ids, max(id) AS newest
FROM audit_log
WHERE id > $1
GROUP BY tenant_id;
