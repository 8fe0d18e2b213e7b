-- name: LockScope
-- params: lock_name, lock_timeout
-- Serializes every request of one scope for the rest of the transaction; lock_timeout is the
-- caller's remaining deadline ("0": no limit beyond statement_timeout).
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))
  FROM (SELECT set_config('lock_timeout', $2, true)) AS t

-- name: LookupKey
-- params: project_id, principal_type, principal_id, operation, key, ttl
-- One row always: the key's columns (NULL when absent or expired) and the window a new key gets.
-- An expired row is deleted here, so the insert after the mutation does not meet it.
WITH expired AS (
    DELETE FROM awooop_idempotency_key
     WHERE project_id = $1 AND principal_type = $2 AND principal_id = $3
       AND operation = $4 AND key = $5
       AND expires_at <= now()
)
SELECT k.request_fingerprint, k.policy_version, k.response_snapshot, k.resource_id, k.created_at, k.expires_at,
       now() AS window_start, now() + make_interval(secs => $6) AS window_end
  FROM (SELECT 1) AS one
  LEFT JOIN awooop_idempotency_key k
    ON k.project_id = $1 AND k.principal_type = $2 AND k.principal_id = $3
   AND k.operation = $4 AND k.key = $5
   AND k.expires_at > now()

-- name: InsertKey
-- params: project_id, principal_type, principal_id, operation, key, fingerprint, policy_version, snapshot, resource_id, created_at, expires_at
-- The key row of a mutation that just ran, in the same transaction.
INSERT INTO awooop_idempotency_key
    (project_id, principal_type, principal_id, operation, key, request_fingerprint, policy_version,
     response_snapshot, resource_id, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7,
            $8, $9, $10, $11)
