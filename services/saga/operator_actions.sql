-- The operator actions' statements (services/saga/operator_actions.py): Compensate records a
-- request, RetryCompensation re-opens failed compensations, ResolveCompensation closes one by
-- hand. Each runs in the transaction that holds the run row lock (saga_status.sql LockRun).

-- name: PlannedSteps :many
-- Steps that have been or will be compensated, in the order the driver runs them
-- (sagastate.PLANNED).
SELECT step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason FROM awooop_saga_step
 WHERE run_id = :run_id AND step_type = 'tool_call' AND compensation_cmd IS NOT NULL
   AND status IN ('completed', 'compensating', 'compensated', 'compensation_failed', 'resolved')
 ORDER BY seq DESC

-- name: InsertRequest :val
-- One request per run: a second changes nothing (and returns nothing).
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES (:run_id, :project_id, :trigger, :reason)
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id

-- name: ReopenRequest :val
-- Re-open: a finished request goes back to pending, its lease cleared; a pending or running one
-- is left to its driver, which re-reads the eligible steps before it ends.
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES (:run_id, :project_id, 'manual', :reason)
ON CONFLICT (run_id) DO UPDATE
   SET status = CASE WHEN awooop_compensation_request.status = 'done' THEN 'pending'
                     ELSE awooop_compensation_request.status END,
       worker_id = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                        ELSE awooop_compensation_request.worker_id END,
       lease_until = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                          ELSE awooop_compensation_request.lease_until END,
       updated_at = now()
RETURNING status

-- name: LockRequest :val
-- The request's status, its row locked (after the run row): no driver finishes it meanwhile.
SELECT status FROM awooop_compensation_request WHERE run_id = :run_id FOR UPDATE

-- name: RetryFailedSteps :many
-- One step (:step_id) or, with an empty :step_id, every step whose undo failed, back to
-- compensating: the driver calls the gateway again with the same key.
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = :run_id AND status = 'compensation_failed' AND (:step_id = '' OR step_id = :step_id)
RETURNING step_id

-- name: ResolveStep :one
UPDATE awooop_saga_step SET status = 'resolved', resolved_by = :resolved_by, resolution_reason = :reason
 WHERE run_id = :run_id AND step_id = :step_id AND status = 'compensation_failed'
RETURNING step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason

-- name: StepStatus :val
SELECT status FROM awooop_saga_step WHERE run_id = :run_id AND step_id = :step_id

-- name: OpenStepsLeft :val
-- A step of the run still failed, or still to undo.
SELECT EXISTS (SELECT 1 FROM awooop_saga_step
                WHERE run_id = :run_id
                  AND (status = 'compensation_failed' OR awooop_step_compensatable(step_type, compensation_cmd, status)))
