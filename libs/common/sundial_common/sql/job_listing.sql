-- name: list_jobs
-- GET /v1/jobs: one tenant's jobs, newest first, keyset on the id (UUIDv7, so newest first is creation
-- order and a job created while a client pages lands before its cursor, never shifting a later page).
-- Every filter is optional (NULL: no filter); the name filter is a prefix.
SELECT * FROM jobs
WHERE tenant_id = $1
  AND ($2::text IS NULL OR state = $2)
  AND ($3::text IS NULL OR type = $3)
  AND ($4::text IS NULL OR pool = $4)
  AND ($5::text IS NULL OR handler = $5)
  AND ($6::text IS NULL OR starts_with(name, $6))
  AND ($7::uuid IS NULL OR id < $7)
ORDER BY id DESC
LIMIT $8;
