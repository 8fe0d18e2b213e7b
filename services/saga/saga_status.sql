-- The saga's writes of a run's saga_status (services/common/sagastate.py, SAGA_TRANSITIONS), run
-- by the driver and the operator actions, each in the transaction that holds the run row lock
-- (LockRun); and that lock.

-- name: LockRun :one
-- The run row as compensation reads it, locked for the rest of the transaction. Lock order,
-- shared by the driver and the operator actions so they never deadlock: the run row, then the
-- request row, then step rows.
SELECT project_id, status, saga_status FROM awooop_run_state WHERE run_id = :run_id FOR NO KEY UPDATE

-- name: StartCompensation :exec
-- The compensation of the run starts (or starts again, after RetryCompensation): the start time
-- is kept from the first time, the end is cleared.
UPDATE awooop_run_state
   SET saga_status = 'compensating', compensation_started_at = COALESCE(compensation_started_at, now()),
       compensation_completed_at = NULL, updated_at = now()
 WHERE run_id = :run_id

-- name: EndCompensation :val
-- The driver found no step left to undo: compensation_failed when a step's undo failed (and was
-- neither retried nor resolved), else compensated. Returns the status written.
UPDATE awooop_run_state
   SET saga_status = CASE WHEN EXISTS (SELECT 1 FROM awooop_saga_step
                                        WHERE run_id = :run_id AND status = 'compensation_failed')
                          THEN 'compensation_failed' ELSE 'compensated' END,
       compensation_completed_at = now(), updated_at = now()
 WHERE run_id = :run_id
RETURNING saga_status

-- name: SkipCompensation :exec
-- A request for a run with nothing to undo ends (seed ADR-119 D6): the saga was not needed.
UPDATE awooop_run_state SET saga_status = 'not_needed', updated_at = now() WHERE run_id = :run_id

-- name: ResolvedCompensation :exec
-- An operator resolved the last failed step and nothing is left to undo: the compensation ended.
UPDATE awooop_run_state
   SET saga_status = 'compensated', compensation_completed_at = now(), updated_at = now()
 WHERE run_id = :run_id
