-- name: PlannedSteps
-- params: run_id
-- Steps that have been or will be compensated, in the order the driver runs them
-- (sagastate.PLANNED).
SELECT step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason FROM awooop_saga_step
 WHERE run_id = $1 AND step_type = 'tool_call' AND compensation_cmd IS NOT NULL
   AND status IN ('completed', 'compensating', 'compensated', 'compensation_failed', 'resolved')
 ORDER BY seq DESC

-- name: InsertRequest
-- params: run_id, project_id, trigger, reason
-- One request per run: a second changes nothing (and returns nothing).
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES ($1, $2, $3, $4)
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id

-- name: ReopenRequest
-- params: run_id, project_id, reason
-- Re-open: a finished request goes back to pending, its lease cleared; a pending or running one
-- is left to its driver, which re-reads the eligible steps before it ends.
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES ($1, $2, 'manual', $3)
ON CONFLICT (run_id) DO UPDATE
   SET status = CASE WHEN awooop_compensation_request.status = 'done' THEN 'pending'
                     ELSE awooop_compensation_request.status END,
       worker_id = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                        ELSE awooop_compensation_request.worker_id END,
       lease_until = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                          ELSE awooop_compensation_request.lease_until END,
       updated_at = now()
RETURNING status

-- name: LockRequest
-- params: run_id
-- The request's status, its row locked (after the run row): no driver finishes it meanwhile.
SELECT status FROM awooop_compensation_request WHERE run_id = $1 FOR UPDATE

-- name: RetryFailedSteps
-- params: run_id, step_id
-- One step (:step_id) or, with an empty :step_id, every step whose undo failed, back to
-- compensating: the driver calls the gateway again with the same key.
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = $1 AND status = 'compensation_failed' AND ($2 = '' OR step_id = $2)
RETURNING step_id

-- name: ResolveStep
-- params: resolved_by, reason, run_id, step_id
UPDATE awooop_saga_step SET status = 'resolved', resolved_by = $1, resolution_reason = $2
 WHERE run_id = $3 AND step_id = $4 AND status = 'compensation_failed'
RETURNING step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason

-- name: StepStatus
-- params: run_id, step_id
SELECT status FROM awooop_saga_step WHERE run_id = $1 AND step_id = $2

-- name: OpenStepsLeft
-- params: run_id
-- A step of the run still failed, or still to undo.
SELECT EXISTS (SELECT 1 FROM awooop_saga_step
                WHERE run_id = $1
                  AND (status = 'compensation_failed' OR awooop_step_compensatable(step_type, compensation_cmd, status)))
