-- The keys store (sundial_common.stores.keys): tenants' wrapped data keys and the master key's check value.

-- name: master_check_values
SELECT key_check, rotating_to FROM encryption_master;

-- name: record_master_check_value
-- The first process to start records its master key; later ones are compared with it.
INSERT INTO encryption_master (key_check) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: wrapped_data_keys
SELECT tenant_id, wrapped_key, key_check FROM tenant_data_keys WHERE tenant_id = ANY($1::text[]);

-- name: add_data_key
-- Only under the database's current master key (or the one a rotation is moving to): a process still
-- holding a key rotated away cannot add a data key nobody else could unwrap.
INSERT INTO tenant_data_keys (tenant_id, wrapped_key, key_check)
SELECT $1, $2, $3
WHERE EXISTS (SELECT 1 FROM encryption_master WHERE key_check = $3 OR rotating_to = $3)
ON CONFLICT (tenant_id) DO NOTHING
RETURNING tenant_id;

-- name: begin_rotation
-- From $1 to $2; resuming a rotation already going to $2 is fine, another target is not (no row).
UPDATE encryption_master SET rotating_to = $2, updated_at = now()
WHERE key_check = $1 AND (rotating_to IS NULL OR rotating_to = $2)
RETURNING key_check;

-- name: count_data_keys
SELECT count(*) FILTER (WHERE key_check = $1) AS left, count(*) AS total FROM tenant_data_keys;

-- name: data_keys_to_rewrap
SELECT tenant_id, wrapped_key FROM tenant_data_keys WHERE key_check = $1 ORDER BY tenant_id LIMIT $2;

-- name: rewrap_data_keys
-- Compare-and-set on the old check value: a row re-wrapped meanwhile is left alone.
UPDATE tenant_data_keys d SET wrapped_key = n.wrapped_key, key_check = $3, rotated_at = now()
FROM unnest($1::text[], $2::bytea[]) AS n (tenant_id, wrapped_key)
WHERE d.tenant_id = n.tenant_id AND d.key_check = $4;

-- name: finish_rotation
-- Only once no data key is left under the old key (checked under the row lock, in one statement).
UPDATE encryption_master SET key_check = $2, rotating_to = NULL, updated_at = now()
WHERE key_check = $1 AND rotating_to = $2
  AND NOT EXISTS (SELECT 1 FROM tenant_data_keys WHERE key_check = $1)
RETURNING key_check;
