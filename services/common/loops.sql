-- name: RecordLoopError :exec
-- A loop's error on the run's history (a LOOP_ERROR audit row with the run's status), once: not
-- again while the run's newest audit row is this same error. :error is what an operator reads,
-- :loop the loop's name, :actor the loop's.
INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
SELECT r.project_id, r.run_id, :actor, 'LOOP_ERROR', r.status, NULL, :error, jsonb_build_object('loop', :loop::text)
  FROM awooop_run_state r
 WHERE r.run_id = :run_id
   AND NOT EXISTS (SELECT 1
                     FROM (SELECT action, reason FROM awooop_audit_log
                            WHERE run_id = :run_id ORDER BY audit_id DESC LIMIT 1) newest
                    WHERE newest.action = 'LOOP_ERROR' AND newest.reason = :error)
