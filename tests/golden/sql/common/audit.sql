-- name: InsertAuditRow
-- params: project_id, run_id, actor, action, from_status, to_status, reason, details
INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
