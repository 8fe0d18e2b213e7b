-- name: CreatePrincipal
-- params: principal_id, principal_type, display_name
-- A principal; an existing one keeps its type and gets the new display name.
INSERT INTO awooop_principal (principal_id, principal_type, display_name)
VALUES ($1, $2, $3)
ON CONFLICT (principal_id) DO UPDATE SET display_name = EXCLUDED.display_name

-- name: IssueKey
-- params: key_id, secret_sha256, label, principal_id
-- A key for an existing principal (no row inserted: there is no such principal). Only
-- sha256(secret) is stored.
INSERT INTO awooop_api_key (key_id, principal_id, secret_sha256, label)
SELECT $1, principal_id, $2, $3 FROM awooop_principal WHERE principal_id = $4

-- name: RevokeKey
-- params: key_id
UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL

-- name: GrantRole
-- params: project_id, principal_id, role
-- The role in the project ('*': every project); a foreign key violation when the principal does
-- not exist.
INSERT INTO awooop_project_member (project_id, principal_id, role) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING

-- name: RevokeRole
-- params: principal_id, project_id, role
-- One role in the project, or every role there when :role is NULL.
DELETE FROM awooop_project_member
 WHERE principal_id = $1 AND project_id = $2 AND ($3::text IS NULL OR role = $3)

-- name: ListPrincipals
-- params: (none)
-- Every principal with its roles ("project:role") and the number of its live keys.
SELECT p.principal_id, p.principal_type, p.display_name,
       COALESCE(array_agg(m.project_id || ':' || m.role ORDER BY m.project_id, m.role)
                FILTER (WHERE m.role IS NOT NULL), '{}') AS roles,
       (SELECT count(*) FROM awooop_api_key k
         WHERE k.principal_id = p.principal_id AND k.revoked_at IS NULL) AS active_keys
  FROM awooop_principal p
  LEFT JOIN awooop_project_member m USING (principal_id)
 GROUP BY p.principal_id ORDER BY p.principal_id

-- name: ListKeys
-- params: principal_id
-- Key ids with label and dates (never a secret), newest first; one principal's, or every key
-- when :principal_id is NULL.
SELECT key_id, principal_id, label, created_at, revoked_at FROM awooop_api_key
 WHERE $1::text IS NULL OR principal_id = $1
 ORDER BY created_at DESC, key_id

-- name: ServiceKeyValid
-- params: key_id, secret_sha256, principal_id, role
-- The key (:key_id, :secret_sha256) is live, belongs to :principal_id, and that principal still
-- holds :role in every project ('*').
SELECT EXISTS (
    SELECT 1 FROM awooop_api_key k
      JOIN awooop_project_member m ON m.principal_id = k.principal_id
     WHERE k.key_id = $1 AND k.secret_sha256 = $2 AND k.revoked_at IS NULL
       AND k.principal_id = $3 AND m.project_id = '*' AND m.role = $4)
