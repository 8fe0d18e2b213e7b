-- Approvals (seed 000 D4), as they run: services/scheduler/approvals.py. RUNNING ->
-- WAITING_APPROVAL releases the lease and stores the sha256 of a token (returned once). Approve:
-- RESUMED (claimable again, new fencing token). Reject: FAILED with E-APPROVAL-REJECTED. Expiry:
-- FAILED with E-APPROVAL-002 (approval token expired), by the sweep or by the DecideApproval that
-- finds it expired. Rejection and expiry record a compensation request when the journal has
-- something to undo (awooop_record_transition, migration 0310, or the sweep's `comp`), and end the
-- journal's pending approval step `failed` (`approval_step`: the journal must not show an
-- approval still pending on a run that is over; an approval is completed by the worker that
-- resumes, the SDK does it). The error codes and the reason are approvals.py's
-- EXPIRED_CODE, REJECTED_CODE and EXPIRED_REASON (the refusals read them back).

-- name: RequestApproval :one
-- A fenced write (fenced_writes.sql's shape): RUNNING -> WAITING_APPROVAL, the lease dropped, the
-- token's hash (:token_hash) valid for :ttl seconds. The hand-back does not count as a used
-- attempt (released_count + 1), so a run may ask for approval without spending its max_attempts.
-- A run whose cancel is pending must not park itself where the cancel cannot reach it.
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'WAITING_APPROVAL', lease_until = NULL, worker_id = NULL,
           released_count = r.released_count + 1,
           -- in a project with sticky resume, its resume prefers this worker (claims.sql, "Labels")
           sticky_worker = CASE WHEN EXISTS (SELECT 1 FROM awooop_project_flow f
                                              WHERE f.project_id = r.project_id AND f.sticky_seconds > 0)
                                THEN r.worker_id END,
           approval_token_hash = :token_hash, approval_expires_at = now() + make_interval(secs => :ttl),
           approval_summary = :summary, approval_decided_by = NULL, approval_decided_at = NULL, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
       AND NOT r.cancel_requested
 RETURNING r.*,
           awooop_record_transition(r.run_id, r.project_id, r.status, :actor,
                                    CASE r.status WHEN 'WAITING_APPROVAL' THEN 'APPROVAL_REQUESTED' END, cur.cur_status,
                                    NULLIF(:summary, ''),
                                    jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker,
                                                       'expires_at', r.approval_expires_at)) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: ReissueApprovalToken :one
-- A RequestApproval repeated by the same lease after its first call committed: the answer, the
-- only copy of the token, was lost (a dropped connection, a timeout), and the run waits for an
-- approval nobody can give. WAITING_APPROVAL with this attempt can only be this lease's request (a
-- decision ends the wait, and the next claim is another attempt), so a new token (:token_hash)
-- replaces the one never seen; expiry and summary stay.
WITH upd AS (
    UPDATE awooop_run_state r
       SET approval_token_hash = :token_hash, updated_at = now()
     WHERE r.run_id = :run_id AND r.attempt_count = :attempt AND r.status IN ('WAITING_APPROVAL')
       AND (:worker_projects::text[] IS NULL OR r.project_id = ANY(:worker_projects::text[])) IS TRUE
 RETURNING r.*
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor, 'APPROVAL_TOKEN_REISSUED', status, status,
           'RequestApproval repeated by the same lease', jsonb_build_object('attempt', attempt_count)
      FROM upd
)
SELECT upd.*, NULL::text AS comp_trigger FROM upd

-- name: DecideApproval :one
-- One statement decides (:approve) or, when the token expired, fails the run with E-APPROVAL-002
-- (so the caller's answer and the stored state agree even before the sweep runs). The token is
-- single use: only a WAITING_APPROVAL run is decided, and the next request replaces its hash. The
-- hash of a decided token stays, so the same approver's repeat of the decision (its first answer
-- lost) is recognised: `cur` says whether the token and the approver (:decided_by, the principal
-- id) are the ones that decided. :approver_projects: the projects where the caller is an approver
-- (NULL: all).
-- not null: cur_run_id, cur_project, cur_status
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status,
           error_code AS cur_error_code,
           COALESCE(approval_expires_at <= now(), false) AS expired,
           approval_token_hash IS NOT DISTINCT FROM :token_hash AND approval_decided_by IS NOT DISTINCT FROM :decided_by
               AS decided_by_caller
      FROM awooop_run_state
     WHERE run_id = :run_id
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN cur.expired OR NOT :approve THEN 'FAILED' ELSE 'RESUMED' END,
           error_code = CASE WHEN cur.expired THEN 'E-APPROVAL-002'
                             WHEN NOT :approve THEN 'E-APPROVAL-REJECTED' ELSE r.error_code END,
           failure_reason = CASE WHEN cur.expired THEN 'approval token expired'
                                 WHEN NOT :approve THEN :reason ELSE r.failure_reason END,
           approval_token_hash = CASE WHEN cur.expired THEN NULL ELSE r.approval_token_hash END,
           approval_decided_by = CASE WHEN cur.expired THEN NULL ELSE :decided_by END,
           approval_decided_at = CASE WHEN cur.expired THEN NULL ELSE now() END,
           updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND r.status = 'WAITING_APPROVAL'
       AND (cur.expired OR r.approval_token_hash = :token_hash)
       AND (:approver_projects::text[] IS NULL OR r.project_id = ANY(:approver_projects::text[])) IS TRUE
 RETURNING r.*,
           cur.expired,
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor,
               CASE WHEN cur.expired THEN 'APPROVAL_EXPIRED' WHEN r.status = 'RESUMED' THEN 'APPROVED'
                    ELSE 'APPROVAL_REJECTED' END,
               'WAITING_APPROVAL', CASE WHEN cur.expired THEN 'approval token expired' ELSE NULLIF(:reason, '') END,
               jsonb_build_object('attempt', r.attempt_count, 'error_code', r.error_code),
               CASE WHEN cur.expired THEN 'approval_expired' ELSE 'approval_rejected' END,
               r.failure_reason) AS comp_trigger
),
approval_step AS (
    UPDATE awooop_saga_step s
       SET status = 'failed', completed_at = now(),
           error = CASE WHEN u.expired THEN 'approval expired (E-APPROVAL-002)'
                        ELSE 'rejected by ' || :decided_by::text || COALESCE(': ' || NULLIF(:reason::text, ''), '') END,
           result = jsonb_build_object(
               'approved', false,
               'decision', CASE WHEN u.expired THEN 'expired' ELSE 'rejected' END,
               'decided_by', CASE WHEN u.expired THEN NULL ELSE :decided_by::text END,
               'reason', CASE WHEN u.expired THEN 'approval token expired' ELSE NULLIF(:reason::text, '') END)
      FROM upd u
     WHERE s.run_id = u.run_id AND u.status = 'FAILED'
       AND s.step_type = 'approval_request' AND s.status = 'pending'
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: CheckApproval :one
-- DecideApproval with validate_only: the run and what a decision would find, nothing written.
-- not null: expired, token_matches
SELECT *,
       COALESCE(approval_expires_at <= now(), false) AS expired,
       COALESCE(approval_token_hash = :token_hash, false) AS token_matches
  FROM awooop_run_state
 WHERE run_id = :run_id

-- name: ExpireApprovals :many
-- The expiry sweep: up to :batch expired approvals fail with E-APPROVAL-002, a batch per
-- statement, picked with SKIP LOCKED so several scheduler replicas sweep without waiting on each
-- other. :only_run: one run only (NULL: any; the pass's fallback when a batch failed for one run's
-- data, services/common/loops.py).
WITH due AS (
    SELECT run_id
      FROM awooop_run_state
     WHERE status = 'WAITING_APPROVAL' AND approval_expires_at <= now() AND (:only_run::uuid IS NULL OR run_id = :only_run)
     ORDER BY approval_expires_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'FAILED', error_code = 'E-APPROVAL-002', failure_reason = 'approval token expired',
           approval_token_hash = NULL, updated_at = now()
      FROM due
     WHERE r.run_id = due.run_id AND r.status = 'WAITING_APPROVAL' AND r.approval_expires_at <= now()
 RETURNING r.run_id, r.project_id, r.status, r.failure_reason, r.attempt_count, r.approval_expires_at
),
approval_step AS (
    UPDATE awooop_saga_step s
       SET status = 'failed', completed_at = now(),
           error = 'approval expired (E-APPROVAL-002)',
           result = jsonb_build_object('approved', false, 'decision', 'expired', 'decided_by', NULL,
                                       'reason', 'approval token expired')
      FROM upd u
     WHERE s.run_id = u.run_id AND u.status = 'FAILED'
       AND s.step_type = 'approval_request' AND s.status = 'pending'
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(u.run_id, u.project_id, u.status, 'approval_expired', u.failure_reason, :actor) c
),
-- the transitions' history rows, then the requests' (the final SELECT's join runs it)
audited AS (
    SELECT awooop_record_history(ARRAY(
               SELECT ROW(project_id, run_id, :actor, 'APPROVAL_EXPIRED', 'WAITING_APPROVAL', 'FAILED',
                          'approval token expired',
                          jsonb_build_object('attempt', attempt_count, 'error_code', 'E-APPROVAL-002',
                                             'expired_at', approval_expires_at))::awooop_history_row
                 FROM upd
               UNION ALL
               SELECT ROW(project_id, run_id, actor, action, from_status, to_status, reason, details)::awooop_history_row
                 FROM comp)) AS recorded
)
SELECT upd.run_id, upd.failure_reason, comp.reason AS trigger
  FROM upd
 CROSS JOIN audited  -- its one row: the join is what runs it
  LEFT JOIN comp USING (run_id)

-- name: DueApprovals :many
-- The runs a sweep batch would take, for expiring them one at a time.
SELECT run_id FROM awooop_run_state
 WHERE status = 'WAITING_APPROVAL' AND approval_expires_at <= now()
 ORDER BY approval_expires_at
 LIMIT :batch
