-- The idempotent-mutation engine's statements (services/common/idempotency.py).

-- name: LockScope :exec
-- Serializes every request of one scope for the rest of the transaction; lock_timeout is the
-- caller's remaining deadline ("0": no limit beyond statement_timeout).
SELECT pg_advisory_xact_lock(hashtextextended(:lock_name, 0))
  FROM (SELECT set_config('lock_timeout', :lock_timeout, true)) AS t

-- name: LookupKey :one
-- not null: window_start, window_end
-- One row always: the key's columns (NULL when absent or expired) and the window a new key gets.
-- An expired row is deleted here, so the insert after the mutation does not meet it.
WITH expired AS (
    DELETE FROM awooop_idempotency_key
     WHERE project_id = :project_id AND principal_type = :principal_type AND principal_id = :principal_id
       AND operation = :operation AND key = :key
       AND expires_at <= now()
)
SELECT k.request_fingerprint, k.policy_version, k.response_snapshot, k.resource_id, k.created_at, k.expires_at,
       now() AS window_start, now() + make_interval(secs => :ttl) AS window_end
  FROM (SELECT 1) AS one
  LEFT JOIN awooop_idempotency_key k
    ON k.project_id = :project_id AND k.principal_type = :principal_type AND k.principal_id = :principal_id
   AND k.operation = :operation AND k.key = :key
   AND k.expires_at > now()

-- name: InsertKey :exec
-- The key row of a mutation that just ran, in the same transaction.
INSERT INTO awooop_idempotency_key
    (project_id, principal_type, principal_id, operation, key, request_fingerprint, policy_version,
     response_snapshot, resource_id, created_at, expires_at)
    VALUES (:project_id, :principal_type, :principal_id, :operation, :key, :fingerprint, :policy_version,
            :snapshot, :resource_id, :created_at, :expires_at)
