-- The step journal's statements (services/saga/journal.py).
--
-- Every write is ONE statement fenced by the lease. Its CTE `lease` is the run row, locked, only
-- while it is leased (status in :leased, RUNNING / WAITING_TOOL: runstate.LEASED) with the
-- caller's fencing token (:attempt) in a project the caller may write (:projects; NULL: every
-- project): FOR SHARE, or FOR NO KEY UPDATE when the write allocates a seq, so a reap or a fail
-- committed first makes the write find nothing. Each write touches one step row and reads the
-- run's last seq as the newest row of the unique (run_id, seq) index (ORDER BY seq DESC LIMIT 1:
-- a max(seq) left the plan free to aggregate over the whole journal, migration 0250), so its
-- cost does not grow with the journal.

-- name: BeginStep :one
-- not null: inserted
-- A new step journaled pending at the next seq, or one an earlier attempt left pending or failed,
-- of the same kind, begun again by this attempt (`inserted` tells the two apart).
WITH lease AS (
    SELECT run_id, project_id FROM awooop_run_state
     WHERE run_id = :run_id AND attempt_count = :attempt AND status = ANY(:leased::text[])
       AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE
       FOR NO KEY UPDATE
)
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_id, tool_params, status, attempt)
SELECT l.run_id, :step_id, l.project_id,
       COALESCE((SELECT seq FROM awooop_saga_step WHERE run_id = l.run_id ORDER BY seq DESC LIMIT 1), 0) + 1,
       :step_type, :tool_id, :tool_params, 'pending', :attempt
  FROM lease l
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = 'pending', attempt = EXCLUDED.attempt, tool_params = EXCLUDED.tool_params,
       error = NULL, completed_at = NULL
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type
   AND s.tool_id IS NOT DISTINCT FROM EXCLUDED.tool_id
RETURNING (s.xmax = 0) AS inserted, s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: RecordStep :one
-- A step that already ran, journaled completed (or failed) in one statement, the way BeginStep
-- journals it pending (same lease lock, same seq allocation). A pending or failed row of the same
-- kind (an earlier attempt's) is overwritten; a completed one is left alone.
-- It commits without waiting for the WAL flush (synchronous_commit off for this transaction only):
-- a record lost in a Postgres crash means the step runs again, which is all a crash mid-step means
-- for these steps anyway. The next synchronous commit of the run (a tool call's BeginStep, the run's
-- completion) flushes it, so no later journal entry or run state can outlive it.
WITH lease AS (
    SELECT run_id, project_id FROM awooop_run_state
     WHERE run_id = :run_id AND attempt_count = :attempt AND status = ANY(:leased::text[])
       AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE
       FOR NO KEY UPDATE
),
async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_params, status, result, error,
                                   attempt, completed_at)
SELECT l.run_id, :step_id, l.project_id,
       COALESCE((SELECT seq FROM awooop_saga_step WHERE run_id = l.run_id ORDER BY seq DESC LIMIT 1), 0) + 1,
       :step_type, :params, :status, :result, :error, :attempt, now()
  FROM lease l, async_commit
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error, attempt = EXCLUDED.attempt,
       tool_params = EXCLUDED.tool_params, completed_at = now()
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type AND s.tool_id IS NULL
RETURNING s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: FinishStep :one
-- A pending step begun by this attempt ends as :status: completed with its :result and (tool
-- calls that are not irreversible only) its :compensation_cmd, or failed with its :error (the
-- result and the compensation command kept as they were).
WITH lease AS (
    SELECT run_id FROM awooop_run_state
     WHERE run_id = :run_id AND attempt_count = :attempt AND status = ANY(:leased::text[])
       AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE
       FOR SHARE
)
UPDATE awooop_saga_step s
   SET status = :status::text,
       result = CASE WHEN :status = 'completed' THEN :result::jsonb ELSE s.result END,
       compensation_cmd = CASE WHEN :status = 'completed' THEN :compensation_cmd::jsonb ELSE s.compensation_cmd END,
       error = :error::text, completed_at = now()
 WHERE s.run_id = (SELECT run_id FROM lease) AND s.step_id = :step_id
   AND s.status = 'pending' AND s.attempt = :attempt
   AND (:compensation_cmd::jsonb IS NULL OR (s.step_type = 'tool_call' AND COALESCE(s.tool_id, '') <> ALL(:irreversible::text[])))
RETURNING s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason

-- name: WhyNotWritten :one
-- not null: project_id, run_status, attempt_count, has_step
-- The follow-up read after a write changed nothing: the run, the caller's lease and the step, in
-- one snapshot (not found, LEASE_LOST, invalid step transition, bad argument).
SELECT r.project_id, r.status AS run_status, r.attempt_count, s.step_id IS NOT NULL AS has_step, s.step_id, s.step_type, s.tool_id, s.tool_params, s.status, s.result, s.error, s.compensation_cmd, s.attempt, s.seq, s.started_at, s.completed_at, s.compensated_at, s.resolved_by, s.resolution_reason
  FROM awooop_run_state r
  LEFT JOIN awooop_saga_step s ON s.run_id = r.run_id AND s.step_id = :step_id
 WHERE r.run_id = :run_id

-- name: JournalRun :one
SELECT project_id, saga_status, compensation_started_at, compensation_completed_at
  FROM awooop_run_state WHERE run_id = :run_id

-- name: JournalSteps :many
SELECT step_id, step_type, tool_id, tool_params, status, result, error, compensation_cmd, attempt, seq,
    started_at, completed_at, compensated_at, resolved_by, resolution_reason FROM awooop_saga_step WHERE run_id = :run_id ORDER BY seq

-- name: SeedSteps :val
-- The seed's saga_steps JSONB array (ADR-119 D1), assembled on read by the view.
SELECT saga_steps FROM awooop_run_saga_steps WHERE run_id = :run_id
