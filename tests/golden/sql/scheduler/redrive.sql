-- name: RedriveRuns
-- params: project_id, error_code, failed_after, failed_before, max_runs, actor, reason
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
     WHERE project_id = $1::text AND status IN ('FAILED')
       AND ($2::text IS NULL OR error_code = $2::text)
       AND ($3::timestamptz IS NULL OR updated_at >= $3::timestamptz)
       AND ($4::timestamptz IS NULL OR updated_at < $4::timestamptz)
       AND NOT EXISTS (SELECT 1 FROM awooop_compensation_request c WHERE c.run_id = r.run_id)
     ORDER BY updated_at
     LIMIT $5
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
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, $6, 'REDRIVEN', from_status, 'PENDING', NULLIF($7, ''),
           jsonb_build_object('attempt', attempt_count)
      FROM upd
    UNION ALL
    SELECT $1::text, NULL, $6, 'RUNS_REDRIVEN', NULL, NULL, NULLIF($7, ''),
           jsonb_build_object('count', (SELECT count(*) FROM upd), 'error_code', $2::text,
                              'failed_after', $3::timestamptz, 'failed_before', $4::timestamptz,
                              'limit', $5::int)
),
notified AS (
    SELECT count(pg_notify('awooop_run_ready', $1::text)) AS n FROM (SELECT 1 FROM upd LIMIT 1) x
)
SELECT upd.run_id, (SELECT n FROM notified) AS notified FROM upd
