-- name: CreatePrincipal :exec
-- A principal; an existing one keeps its type and gets the new display name.
INSERT INTO awooop_principal (principal_id, principal_type, display_name)
VALUES (:principal_id, :principal_type, :display_name)
ON CONFLICT (principal_id) DO UPDATE SET display_name = EXCLUDED.display_name

-- name: IssueKey :exec
-- A key for an existing principal (no row inserted: there is no such principal). Only
-- sha256(secret) is stored.
INSERT INTO awooop_api_key (key_id, principal_id, secret_sha256, label)
SELECT :key_id, principal_id, :secret_sha256, :label FROM awooop_principal WHERE principal_id = :principal_id

-- name: RevokeKey :exec
UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = :key_id AND revoked_at IS NULL

-- name: GrantRole :exec
-- The role in the project ('*': every project); a foreign key violation when the principal does
-- not exist.
INSERT INTO awooop_project_member (project_id, principal_id, role) VALUES (:project_id, :principal_id, :role)
ON CONFLICT DO NOTHING

-- name: RevokeRole :exec
-- One role in the project, or every role there when :role is NULL.
DELETE FROM awooop_project_member
 WHERE principal_id = :principal_id AND project_id = :project_id AND (:role::text IS NULL OR role = :role)

-- name: ListPrincipals :many
-- not null: principal_id, principal_type, display_name, roles, active_keys
-- Every principal with its roles ("project:role") and the number of its live keys.
SELECT p.principal_id, p.principal_type, p.display_name,
       COALESCE(array_agg(m.project_id || ':' || m.role ORDER BY m.project_id, m.role)
                FILTER (WHERE m.role IS NOT NULL), '{}') AS roles,
       (SELECT count(*) FROM awooop_api_key k
         WHERE k.principal_id = p.principal_id AND k.revoked_at IS NULL) AS active_keys
  FROM awooop_principal p
  LEFT JOIN awooop_project_member m USING (principal_id)
 GROUP BY p.principal_id ORDER BY p.principal_id

-- name: ListKeys :many
-- Key ids with label and dates (never a secret), newest first; one principal's, or every key
-- when :principal_id is NULL.
SELECT key_id, principal_id, label, created_at, revoked_at FROM awooop_api_key
 WHERE :principal_id::text IS NULL OR principal_id = :principal_id
 ORDER BY created_at DESC, key_id

-- name: ServiceKeyValid :val
-- not null: exists
-- The key (:key_id, :secret_sha256) is live, belongs to :principal_id, and that principal still
-- holds :role in every project ('*').
SELECT EXISTS (
    SELECT 1 FROM awooop_api_key k
      JOIN awooop_project_member m ON m.principal_id = k.principal_id
     WHERE k.key_id = :key_id AND k.secret_sha256 = :secret_sha256 AND k.revoked_at IS NULL
       AND k.principal_id = :principal_id AND m.project_id = '*' AND m.role = :role)
