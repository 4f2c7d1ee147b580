-- The connection's own statements (sundial_common.stores.database): the readiness probe.

-- name: ping
SELECT 1;
