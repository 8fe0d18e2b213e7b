-- name: RedriveRuns :many
-- RedriveRuns: requeues a project's FAILED runs (runstate Action.REDRIVE: from FAILED to PENDING)
-- that match the filter (:error_code; failed at or after :failed_after and before :failed_before;
-- each NULL for any), oldest failure first, at most :max_runs, each with fresh attempts, in one
-- statement: the runs, a REDRIVEN audit row per run, one RUNS_REDRIVEN row (run_id NULL) for
-- the operator's action with its filter, and one wake-up NOTIFY when any run was requeued.
-- Fresh attempts keep the fencing token growing: released_count is raised to attempt_count, so
-- the attempts used (attempt_count - released_count) start again from 0. A run with a recorded
-- compensation request (its steps were or are being undone) is never requeued.
WITH picked AS (
    SELECT run_id, status
      FROM awooop_run_state r
     WHERE project_id = :project_id::text AND status IN ('FAILED')
       AND (:error_code::text IS NULL OR error_code = :error_code::text)
       AND (:failed_after::timestamptz IS NULL OR updated_at >= :failed_after::timestamptz)
       AND (:failed_before::timestamptz IS NULL OR updated_at < :failed_before::timestamptz)
       AND NOT EXISTS (SELECT 1 FROM awooop_compensation_request c WHERE c.run_id = r.run_id)
     ORDER BY updated_at
     LIMIT :max_runs
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'PENDING', released_count = r.attempt_count, failure_reason = NULL,
           error_code = NULL, not_before = NULL, wait_reason = NULL, cancel_requested = false,
           lease_until = NULL, worker_id = NULL, updated_at = now()
      FROM picked p
     WHERE r.run_id = p.run_id
 RETURNING r.run_id, r.project_id, r.attempt_count, p.status AS from_status
),
-- the runs' history rows and the operator's entry, as one array: one call of the log's writer
-- however many runs (not a subtransaction per run through the audit view: migration 0420)
aud AS (
    SELECT awooop_record_history(ARRAY(
               SELECT ROW(project_id, run_id, :actor, 'REDRIVEN', from_status, 'PENDING', NULLIF(:reason, ''),
                          jsonb_build_object('attempt', attempt_count))::awooop_history_row
                 FROM upd
               UNION ALL
               SELECT ROW(:project_id::text, NULL, :actor, 'RUNS_REDRIVEN', NULL, NULL, NULLIF(:reason, ''),
                          jsonb_build_object('count', (SELECT count(*) FROM upd), 'error_code', :error_code::text,
                                             'failed_after', :failed_after::timestamptz,
                                             'failed_before', :failed_before::timestamptz,
                                             'limit', :max_runs::int))::awooop_history_row)) AS recorded
),
notified AS (
    SELECT count(pg_notify('awooop_run_ready', :project_id::text)) AS n FROM (SELECT 1 FROM upd LIMIT 1) x
)
-- aud's one row first: the join is what runs it, so the operator's entry is written when no run
-- was requeued too (then the one row's run_id is NULL)
SELECT upd.run_id, (SELECT n FROM notified) AS notified
  FROM aud LEFT JOIN upd ON true
