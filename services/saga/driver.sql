-- The compensation driver's statements (services/saga/driver.py). A request is held under a lease
-- named as the run lease is: worker_id (the replica), attempt_count (incremented by every claim)
-- and lease_until. (worker_id, attempt_count) is the fencing token: every write re-checks it, so
-- a replica that lost its lease writes nothing.

-- name: ClaimCompensationRequests :many
-- not null: run_id, project_id, trigger, attempt_count
-- Open requests, oldest first, of runs that ended without success (or of finished child runs
-- whose parent did: trigger parent_ended, migration 0190): pending, or running with an expired
-- lease (a crashed replica's), skipping those another replica holds locked. The run tree's order
-- (docs/architecture.md "Child runs"): a run's request waits while one of its children has not
-- ended (a leased child asked to cancel may still complete, and is then undone too: migration
-- 0280) or has a request open (children are undone before the parent's own steps), and the
-- request of a child whose tree is being undone (trigger parent_ended, or a parent that ended
-- FAILED or CANCELLED) waits while a newer sibling (child_seq) has not ended or has a request
-- open (newest child first, also when the newer one was still running, asked to cancel, when
-- the older one's request was written).
UPDATE awooop_compensation_request c
   SET status = 'running', worker_id = :worker_id, lease_until = now() + make_interval(secs => :lease_ttl),
       attempt_count = c.attempt_count + 1, updated_at = now()
 WHERE c.run_id IN (
        SELECT q.run_id FROM awooop_compensation_request q
          JOIN awooop_run_state r ON r.run_id = q.run_id
         WHERE (q.status = 'pending' OR (q.status = 'running' AND q.lease_until < now()))
           AND (r.status IN ('FAILED', 'CANCELLED') OR q.trigger = 'parent_ended')
           AND NOT EXISTS (SELECT 1 FROM awooop_run_state k
                             LEFT JOIN awooop_compensation_request kq ON kq.run_id = k.run_id
                            WHERE k.parent_run_id = q.run_id
                              AND (k.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') OR kq.status <> 'done'))
           AND NOT (r.parent_run_id IS NOT NULL
                    AND (q.trigger = 'parent_ended'
                         OR EXISTS (SELECT 1 FROM awooop_run_state p
                                     WHERE p.run_id = r.parent_run_id AND p.status IN ('FAILED', 'CANCELLED')))
                    AND EXISTS (SELECT 1 FROM awooop_run_state s
                                  LEFT JOIN awooop_compensation_request sq ON sq.run_id = s.run_id
                                 WHERE s.parent_run_id = r.parent_run_id AND s.child_seq > r.child_seq
                                   AND (s.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') OR sq.status <> 'done')))
         ORDER BY q.created_at LIMIT :batch
           FOR UPDATE OF q SKIP LOCKED)
RETURNING c.run_id, c.project_id, c.trigger, c.reason, c.attempt_count

-- name: FenceCompensationRequest :val
-- The lease is still ours: locks the request row for the rest of the transaction (after the run
-- row, LockRun), or returns nothing when another replica took it over.
SELECT 1 FROM awooop_compensation_request
 WHERE run_id = :run_id AND worker_id = :worker_id AND attempt_count = :attempt AND status = 'running'
   FOR UPDATE

-- name: RenewCompensationLease :val
-- Extends our lease (per step and per gateway try); nothing returned: the lease was lost.
UPDATE awooop_compensation_request SET lease_until = now() + make_interval(secs => :lease_ttl), updated_at = now()
 WHERE run_id = :run_id AND worker_id = :worker_id AND attempt_count = :attempt AND status = 'running'
RETURNING 1

-- name: ReleaseCompensationRequest :exec
-- The gateway refused our key: the request waits unclaimed until the key works (GatewayAuth), and
-- its step left 'compensating' is called again then, with the same idempotency key.
UPDATE awooop_compensation_request SET status = 'pending', worker_id = NULL, lease_until = NULL, updated_at = now()
 WHERE run_id = :run_id AND worker_id = :worker_id AND attempt_count = :attempt AND status = 'running'

-- name: FinishCompensationRequest :exec
-- No step is left to undo; run in the transaction that fenced the request (FenceCompensationRequest).
UPDATE awooop_compensation_request SET status = 'done', lease_until = NULL, updated_at = now()
 WHERE run_id = :run_id

-- name: CompensatableSteps :many
-- The steps the driver still has to undo, newest first (the order it undoes them in).
SELECT step_id, tool_id, seq FROM awooop_saga_step
 WHERE run_id = :run_id AND awooop_step_compensatable(step_type, compensation_cmd, status)
 ORDER BY seq DESC

-- name: StepsNotCompensated :many
-- not null: why
-- The completed or pending steps the compensation leaves in place, and why (for the audit row's
-- details; at most 100 listed).
SELECT step_id, step_type, tool_id, status,
       CASE WHEN status = 'pending' THEN 'outcome unknown (never completed)'
            WHEN step_type <> 'tool_call' THEN step_type || ' steps are not compensated'
            ELSE 'no compensation command' END AS why
  FROM awooop_saga_step
 WHERE run_id = :run_id AND status IN ('completed', 'pending')
   AND NOT awooop_step_compensatable(step_type, compensation_cmd, status)
 ORDER BY seq DESC LIMIT 100

-- name: MarkStepCompensating :one
-- The durable intent, committed before the gateway call: a crash leaves the step 'compensating'
-- and the next owner calls again with the same idempotency key (the gateway replays).
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = :run_id AND step_id = :step_id AND awooop_step_compensatable(step_type, compensation_cmd, status)
RETURNING step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason

-- name: StepCompensated :val
UPDATE awooop_saga_step SET status = 'compensated', compensated_at = now(), error = NULL
 WHERE run_id = :run_id AND step_id = :step_id AND status = 'compensating'
RETURNING step_id

-- name: StepCompensationFailed :val
-- Written with its audit row and its alert (InsertAlert) in one transaction.
UPDATE awooop_saga_step SET status = 'compensation_failed', error = :error
 WHERE run_id = :run_id AND step_id = :step_id AND status = 'compensating'
RETURNING step_id

-- name: InsertAlert :exec
-- The escalation outbox row of a failed compensation (services/saga/notifier.py delivers it).
INSERT INTO awooop_saga_alert (project_id, run_id, step_id, tool_id, error)
VALUES (:project_id, :run_id, :step_id, :tool_id, :error)

-- name: RunTraceparent :val
-- The run's trace context, so the compensation is a span of the run's trace.
SELECT traceparent FROM awooop_run_state WHERE run_id = :run_id
