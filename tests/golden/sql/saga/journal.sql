-- name: BeginStep
-- params: run_id, attempt, leased, projects, step_id, step_type, tool_id, tool_params
-- A new step journaled pending at the next seq, or one an earlier attempt left pending or failed,
-- of the same kind, begun again by this attempt (`inserted` tells the two apart).
WITH lease AS (
    SELECT run_id, project_id FROM awooop_run_state
     WHERE run_id = $1 AND attempt_count = $2 AND status = ANY($3::text[])
       AND ($4::text[] IS NULL OR project_id = ANY($4::text[]))
       FOR NO KEY UPDATE
)
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_id, tool_params, status, attempt)
SELECT l.run_id, $5, l.project_id,
       COALESCE((SELECT max(seq) FROM awooop_saga_step WHERE run_id = l.run_id), 0) + 1,
       $6, $7, $8, 'pending', $2
  FROM lease l
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = 'pending', attempt = EXCLUDED.attempt, tool_params = EXCLUDED.tool_params,
       error = NULL, completed_at = NULL
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type
   AND s.tool_id IS NOT DISTINCT FROM EXCLUDED.tool_id
RETURNING (s.xmax = 0) AS inserted, s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: RecordStep
-- params: run_id, attempt, leased, projects, step_id, step_type, params, status, result, error
-- A step that already ran, journaled completed (or failed) in one statement, the way BeginStep
-- journals it pending (same lease lock, same seq allocation). A pending or failed row of the same
-- kind (an earlier attempt's) is overwritten; a completed one is left alone.
-- It commits without waiting for the WAL flush (synchronous_commit off for this transaction only):
-- a record lost in a Postgres crash means the step runs again, which is all a crash mid-step means
-- for these steps anyway. The next synchronous commit of the run (a tool call's BeginStep, the run's
-- completion) flushes it, so no later journal entry or run state can outlive it.
WITH lease AS (
    SELECT run_id, project_id FROM awooop_run_state
     WHERE run_id = $1 AND attempt_count = $2 AND status = ANY($3::text[])
       AND ($4::text[] IS NULL OR project_id = ANY($4::text[]))
       FOR NO KEY UPDATE
),
async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_params, status, result, error,
                                   attempt, completed_at)
SELECT l.run_id, $5, l.project_id,
       COALESCE((SELECT max(seq) FROM awooop_saga_step WHERE run_id = l.run_id), 0) + 1,
       $6, $7, $8, $9, $10, $2, now()
  FROM lease l, async_commit
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error, attempt = EXCLUDED.attempt,
       tool_params = EXCLUDED.tool_params, completed_at = now()
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type AND s.tool_id IS NULL
RETURNING s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: CompleteStep
-- params: run_id, attempt, leased, projects, result, compensation_cmd, step_id, irreversible
-- A pending step begun by this attempt, completed with its result and (tool calls that are not
-- irreversible only) its compensation command.
WITH lease AS (
    SELECT run_id FROM awooop_run_state
     WHERE run_id = $1 AND attempt_count = $2 AND status = ANY($3::text[])
       AND ($4::text[] IS NULL OR project_id = ANY($4::text[]))
       FOR SHARE
)
UPDATE awooop_saga_step s
   SET status = 'completed', result = $5, compensation_cmd = $6, error = NULL, completed_at = now()
 WHERE s.run_id = (SELECT run_id FROM lease) AND s.step_id = $7
   AND s.status = 'pending' AND s.attempt = $2
   AND ($6::jsonb IS NULL OR (s.step_type = 'tool_call' AND COALESCE(s.tool_id, '') <> ALL($8::text[])))
RETURNING s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: FailStep
-- params: run_id, attempt, leased, projects, error, step_id
-- A pending step begun by this attempt, failed with its error.
WITH lease AS (
    SELECT run_id FROM awooop_run_state
     WHERE run_id = $1 AND attempt_count = $2 AND status = ANY($3::text[])
       AND ($4::text[] IS NULL OR project_id = ANY($4::text[]))
       FOR SHARE
)
UPDATE awooop_saga_step s
   SET status = 'failed', error = $5, completed_at = now()
 WHERE s.run_id = (SELECT run_id FROM lease) AND s.step_id = $6
   AND s.status = 'pending' AND s.attempt = $2
RETURNING s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: WhyNotWritten
-- params: step_id, run_id
-- The follow-up read after a write changed nothing: the run, the caller's lease and the step, in
-- one snapshot (not found, LEASE_LOST, invalid step transition, bad argument).
SELECT r.project_id, r.status AS run_status, r.attempt_count, s.step_id IS NOT NULL AS has_step, s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason
  FROM awooop_run_state r
  LEFT JOIN awooop_saga_step s ON s.run_id = r.run_id AND s.step_id = $1
 WHERE r.run_id = $2

-- name: JournalRun
-- params: run_id
SELECT project_id, saga_status, compensation_started_at, compensation_completed_at
  FROM awooop_run_state WHERE run_id = $1

-- name: JournalSteps
-- params: run_id
SELECT step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq

-- name: SeedSteps
-- params: run_id
-- The seed's saga_steps JSONB array (ADR-119 D1), assembled on read by the view.
SELECT saga_steps FROM awooop_run_saga_steps WHERE run_id = $1
