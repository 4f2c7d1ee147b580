-- The idempotency store (sundial_common.stores.idempotency): Idempotency-Key claims and their responses.

-- name: claim_idempotency_key
-- Take the key for this request: a new key, one past its expiry, or (same body only) an in-flight claim
-- whose request died. No row: someone else holds it; read it with get_idempotency_key.
INSERT INTO idempotency_keys AS k (tenant_id, key, request_hash, token, state, locked_until, expires_at)
VALUES ($1, $2, $3, $4, 'IN_FLIGHT', now() + $5 * interval '1 second', now() + $6 * interval '1 second')
ON CONFLICT (tenant_id, key) DO UPDATE
SET request_hash = excluded.request_hash, token = excluded.token, state = 'IN_FLIGHT',
    locked_until = excluded.locked_until, expires_at = excluded.expires_at, status_code = NULL, headers = NULL,
    body = NULL, resource_id = NULL, created_at = now()
WHERE k.expires_at < now()
   OR (k.state = 'IN_FLIGHT' AND k.locked_until < now() AND k.request_hash = excluded.request_hash)
RETURNING token;

-- name: get_idempotency_key
SELECT *, locked_until < now() AS lock_expired FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND expires_at >= now();

-- name: complete_idempotency_key
-- In the transaction that created the resource: the key now answers with this response. No row: the claim
-- was taken over (this request outlived its lock), and the caller rolls its work back.
UPDATE idempotency_keys
SET state = 'DONE', status_code = $4, headers = $5, body = $6, resource_id = $7, locked_until = NULL
WHERE tenant_id = $1 AND key = $2 AND token = $3 AND state = 'IN_FLIGHT'
RETURNING key;

-- name: release_idempotency_key
-- The request failed without creating anything: let a retry with the key run at once.
DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 AND token = $3 AND state = 'IN_FLIGHT';

-- name: purge_idempotency_keys
-- Keys past their 24 hours, a batch at a time (the sweeper), on idempotency_keys_expiry_idx.
DELETE FROM idempotency_keys k
USING (SELECT tenant_id, key FROM idempotency_keys WHERE expires_at < now() ORDER BY expires_at LIMIT $1) old
WHERE k.tenant_id = old.tenant_id AND k.key = old.key;
