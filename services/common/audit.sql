-- The audit log (services/common/audit.py): one row per state change, written in the transaction of
-- the change. The named statements that change a run write their audit rows themselves, in the same
-- statement; this one is for code that records a change of its own inside its transaction.

-- name: InsertAuditRow :exec
INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
VALUES (:project_id, :run_id, :actor, :action, :from_status, :to_status, :reason, :details)
