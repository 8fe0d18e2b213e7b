-- name: ClaimCompensationRequests
-- params: worker_id, lease_ttl, batch
-- Open requests, oldest first, of runs that ended without success: pending, or running with an
-- expired lease (a crashed replica's), skipping those another replica holds locked.
UPDATE awooop_compensation_request c
   SET status = 'running', worker_id = $1, lease_until = now() + make_interval(secs => $2),
       attempt_count = c.attempt_count + 1, updated_at = now()
 WHERE c.run_id IN (
        SELECT q.run_id FROM awooop_compensation_request q
          JOIN awooop_run_state r ON r.run_id = q.run_id
         WHERE (q.status = 'pending' OR (q.status = 'running' AND q.lease_until < now()))
           AND r.status IN ('FAILED', 'CANCELLED')
         ORDER BY q.created_at LIMIT $3
           FOR UPDATE OF q SKIP LOCKED)
RETURNING c.run_id, c.project_id, c.trigger, c.reason, c.attempt_count

-- name: FenceCompensationRequest
-- params: run_id, worker_id, attempt
-- The lease is still ours: locks the request row for the rest of the transaction (after the run
-- row, LockRun), or returns nothing when another replica took it over.
SELECT 1 FROM awooop_compensation_request
 WHERE run_id = $1 AND worker_id = $2 AND attempt_count = $3 AND status = 'running'
   FOR UPDATE

-- name: RenewCompensationLease
-- params: lease_ttl, run_id, worker_id, attempt
-- Extends our lease (per step and per gateway try); nothing returned: the lease was lost.
UPDATE awooop_compensation_request SET lease_until = now() + make_interval(secs => $1), updated_at = now()
 WHERE run_id = $2 AND worker_id = $3 AND attempt_count = $4 AND status = 'running'
RETURNING 1

-- name: ReleaseCompensationRequest
-- params: run_id, worker_id, attempt
-- The gateway refused our key: the request waits unclaimed until the key works (GatewayAuth), and
-- its step left 'compensating' is called again then, with the same idempotency key.
UPDATE awooop_compensation_request SET status = 'pending', worker_id = NULL, lease_until = NULL, updated_at = now()
 WHERE run_id = $1 AND worker_id = $2 AND attempt_count = $3 AND status = 'running'

-- name: FinishCompensationRequest
-- params: run_id
-- No step is left to undo; run in the transaction that fenced the request (FenceCompensationRequest).
UPDATE awooop_compensation_request SET status = 'done', lease_until = NULL, updated_at = now()
 WHERE run_id = $1

-- name: CompensatableSteps
-- params: run_id
-- The steps the driver still has to undo, newest first (the order it undoes them in).
SELECT step_id, tool_id, seq FROM awooop_saga_step
 WHERE run_id = $1 AND awooop_step_compensatable(step_type, compensation_cmd, status)
 ORDER BY seq DESC

-- name: StepsNotCompensated
-- params: run_id
-- The completed or pending steps the compensation leaves in place, and why (for the audit row's
-- details; at most 100 listed).
SELECT step_id, step_type, tool_id, status,
       CASE WHEN status = 'pending' THEN 'outcome unknown (never completed)'
            WHEN step_type <> 'tool_call' THEN step_type || ' steps are not compensated'
            ELSE 'no compensation command' END AS why
  FROM awooop_saga_step
 WHERE run_id = $1 AND status IN ('completed', 'pending')
   AND NOT awooop_step_compensatable(step_type, compensation_cmd, status)
 ORDER BY seq DESC LIMIT 100

-- name: MarkStepCompensating
-- params: run_id, step_id
-- The durable intent, committed before the gateway call: a crash leaves the step 'compensating'
-- and the next owner calls again with the same idempotency key (the gateway replays).
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = $1 AND step_id = $2 AND awooop_step_compensatable(step_type, compensation_cmd, status)
RETURNING step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason

-- name: StepCompensated
-- params: run_id, step_id
UPDATE awooop_saga_step SET status = 'compensated', compensated_at = now(), error = NULL
 WHERE run_id = $1 AND step_id = $2 AND status = 'compensating'
RETURNING step_id

-- name: StepCompensationFailed
-- params: error, run_id, step_id
-- Written with its audit row and its alert (InsertAlert) in one transaction.
UPDATE awooop_saga_step SET status = 'compensation_failed', error = $1
 WHERE run_id = $2 AND step_id = $3 AND status = 'compensating'
RETURNING step_id

-- name: InsertAlert
-- params: project_id, run_id, step_id, tool_id, error
-- The escalation outbox row of a failed compensation (services/saga/notifier.py delivers it).
INSERT INTO awooop_saga_alert (project_id, run_id, step_id, tool_id, error)
VALUES ($1, $2, $3, $4, $5)

-- name: RunTraceparent
-- params: run_id
-- The run's trace context, so the compensation is a span of the run's trace.
SELECT traceparent FROM awooop_run_state WHERE run_id = $1
