-- name: LoadKey :many
-- not null: secret_sha256, principal_id, principal_type
-- A live key's secret hash, its principal and the principal's roles: one row per (project,
-- role), or one with NULL project and role when it holds none; no row when the key does not
-- exist or is revoked.
SELECT k.secret_sha256, p.principal_id, p.principal_type, m.project_id, m.role
  FROM awooop_api_key k
  JOIN awooop_principal p USING (principal_id)
  LEFT JOIN awooop_project_member m ON m.principal_id = p.principal_id
 WHERE k.key_id = :key_id AND k.revoked_at IS NULL

-- name: HasRoleNow :val
-- not null: exists
-- The principal holds one of :roles (the role and those that imply it) in one of :projects (the
-- project and '*'), read now (no cache).
SELECT EXISTS (SELECT 1 FROM awooop_project_member
                WHERE principal_id = :principal_id AND project_id = ANY(:projects::text[])
                  AND role = ANY(:roles::text[]))
