-- Fenced worker writes (CompleteRun, FailRun, ReleaseRun, WaitTool, ResumeTool, AcknowledgeCancel;
-- RequestApproval is in approvals.sql) and CancelRun, as they run: services/scheduler/transitions.py.
--
-- Each is ONE statement: lock the row (`cur`: the view awooop_run_cur, migration 0300), change it
-- only if the fence holds (`upd`), and in the same statement write the audit row (`aud`), record a
-- compensation request (`comp`) and NOTIFY waiting claimers (`notified`). The statement always
-- returns the locked row's current state too (cur_*), so when nothing changed (run_id NULL) the
-- error is chosen without a second round trip (refusals.py).
--
-- The fence is one SQL function, awooop_fence_holds (migration 0300; the planner inlines it): the
-- token (:run_id, :attempt) names the current attempt, the status is one :allowed (the
-- transition's allowed_from in services/common/runstate.py), and the caller is a worker of the
-- run's project (:worker_projects; NULL: every project). A lease is held until the reaper takes
-- it, not until lease_until passes: a write that arrives after lease_until but before the reaper's
-- statement still counts (the reaper and the write serialize on the row lock, and the token keeps
-- any later attempt safe).
--
-- comp: a run that ended FAILED or CANCELLED with steps to undo (a completed tool call with an undo
-- command, or one whose undo was started: awooop_step_compensatable, migration 0141) gets its compensation
-- request in the same statement as the state change (docs/architecture.md, "Saga"). The rule is
-- one SQL function, awooop_request_compensation (migration 0210), which every statement that ends a
-- run calls with the trigger it names: it records the request and returns its COMPENSATION_REQUESTED
-- audit row (reason: the trigger), which `aud` writes after the change's, in one INSERT.
-- notified: one NOTIFY per project that got a claimable run (Postgres folds identical
-- notifications of one transaction); the final SELECT reads it, since a read-only CTE nobody
-- reads is not executed. The audit details of a fenced write start with the attempt and the
-- worker that held it.

-- name: CompleteRun :one
-- RUNNING -> COMPLETED with :output (JSON), the lease dropped. A completed run is never compensated
-- (Compensate takes FAILED and CANCELLED runs only), so its saga ends here: not_needed. (Failed and
-- cancelled runs with nothing to undo get not_needed from the trigger of migration 0080.)
-- CompleteRuns (claims.sql ClaimRuns) writes the same SET list, fence and audit row per item.
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'COMPLETED', output = :output::jsonb, lease_until = NULL, worker_id = NULL,
           failure_reason = NULL, error_code = NULL, not_before = NULL, saga_status = 'not_needed', updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor, 'COMPLETED', from_status, status, NULL,
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker) || '{}'::jsonb
      FROM upd
)
SELECT cur.*, upd.*,
       NULL::text AS comp_trigger,
       0::bigint AS notified
  FROM cur LEFT JOIN upd ON true

-- name: FailRun :one
-- The failure is retried (PENDING after a backoff, wait_reason backoff) only when :retryable, the
-- run's retry policy does not name its :error_code as non-retryable, no cancel is pending, and
-- attempts are left (ReleaseRun hand-backs do not count: attempts used = attempt_count -
-- released_count); retryable while a cancel is pending ends it CANCELLED; else FAILED. The delay
-- is the caller's (:retry_after > 0), else the policy's for this many attempts used
-- (awooop_retry_delay). The policy (awooop_effective_retry_policy: the service's :policy JSON, its
-- project's, the run's own) is merged once per statement (`pol`; `no_retry`: the policy never
-- retries this error code). The rest of the retry test reads the row being updated (r), not
-- `pol`: a cancel committed while this statement waited for the row lock is seen there.
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
pol AS (
    SELECT awooop_effective_retry_policy(
               :policy, (SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = cur.cur_project),
               r.retry_policy) AS p
      FROM cur JOIN awooop_run_state r ON r.run_id = cur.cur_run_id
),
no_retry AS (
    SELECT COALESCE(p->'non_retryable_error_codes', '[]'::jsonb) ? COALESCE(NULLIF(:error_code, ''), '') AS never
      FROM pol
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN :retryable AND NOT (SELECT never FROM no_retry) AND NOT r.cancel_requested
                               AND r.attempt_count - r.released_count < r.max_attempts THEN 'PENDING'
                         WHEN :retryable AND r.cancel_requested THEN 'CANCELLED'
                         ELSE 'FAILED' END,
           not_before = CASE WHEN :retryable AND NOT (SELECT never FROM no_retry) AND NOT r.cancel_requested
                                  AND r.attempt_count - r.released_count < r.max_attempts
                             THEN now() + make_interval(secs => CASE WHEN :retry_after::float8 > 0
                                                                     THEN :retry_after::float8
                                                                     ELSE awooop_retry_delay((SELECT p FROM pol),
                                                                              r.attempt_count - r.released_count) END)
                        END,
           wait_reason = CASE WHEN :retryable AND NOT (SELECT never FROM no_retry) AND NOT r.cancel_requested
                                   AND r.attempt_count - r.released_count < r.max_attempts THEN 'backoff' END,
           lease_until = NULL, worker_id = NULL, failure_reason = :reason, error_code = NULLIF(:error_code, ''),
           updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(
        u.run_id, u.project_id, u.status, CASE WHEN u.status = 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END,
        u.failure_reason, :actor) c
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor,
           CASE status WHEN 'PENDING' THEN 'RETRY_SCHEDULED' WHEN 'CANCELLED' THEN 'CANCELLED' WHEN 'FAILED' THEN 'FAILED' END,
           from_status, status, :reason,
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker)
           || jsonb_build_object('retryable', :retryable::boolean, 'error_code', error_code, 'not_before', not_before,
                                 'max_attempts', max_attempts)
      FROM upd
    UNION ALL
    SELECT * FROM comp
),
notified AS (
    SELECT count(pg_notify('awooop_run_ready', project_id)) AS n
      FROM (SELECT DISTINCT project_id FROM upd WHERE status = 'PENDING') p
)
SELECT cur.*, upd.*,
       (SELECT reason FROM comp) AS comp_trigger,
       (SELECT n FROM notified) AS notified
  FROM cur LEFT JOIN upd ON true

-- name: ReleaseRun :one
-- The worker hands the run back: PENDING again, the attempt not spent (released_count + 1). A
-- hand-back while a cancel is pending ends the run CANCELLED: re-queuing would ignore the cancel.
-- The audit details carry `released`, the mark a repeat of this ReleaseRun finds (replays.sql
-- ReleasedBy); a claim's hand-back of undelivered runs (claims.sql HandBackUndelivered) does not.
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           released_count = r.released_count + 1, lease_until = NULL, worker_id = NULL, not_before = NULL,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 ELSE r.failure_reason END, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(u.run_id, u.project_id, u.status, 'cancelled', u.failure_reason, :actor) c
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor,
           CASE status WHEN 'PENDING' THEN 'RELEASED' WHEN 'CANCELLED' THEN 'CANCELLED' END, from_status, status, NULLIF(:reason, ''),
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker)
           || jsonb_build_object('released', true)
      FROM upd
    UNION ALL
    SELECT * FROM comp
),
notified AS (
    SELECT count(pg_notify('awooop_run_ready', project_id)) AS n
      FROM (SELECT DISTINCT project_id FROM upd WHERE status = 'PENDING') p
)
SELECT cur.*, upd.*,
       (SELECT reason FROM comp) AS comp_trigger,
       (SELECT n FROM notified) AS notified
  FROM cur LEFT JOIN upd ON true

-- name: WaitTool :one
-- RUNNING -> WAITING_TOOL: the lease is kept (heartbeats go on) while a tool (:tool_id) answers.
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'WAITING_TOOL', updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor,
           CASE status WHEN 'WAITING_TOOL' THEN 'WAITING_TOOL' END, from_status, status, NULLIF(:tool_id, ''),
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker)
           || jsonb_build_object('tool_id', :tool_id::text)
      FROM upd
)
SELECT cur.*, upd.*,
       NULL::text AS comp_trigger,
       0::bigint AS notified
  FROM cur LEFT JOIN upd ON true

-- name: ResumeTool :one
-- WAITING_TOOL -> RUNNING: the tool answered; same lease.
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'RUNNING', updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor, CASE status WHEN 'RUNNING' THEN 'TOOL_RETURNED' END, from_status, status, NULL,
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker) || '{}'::jsonb
      FROM upd
)
SELECT cur.*, upd.*,
       NULL::text AS comp_trigger,
       0::bigint AS notified
  FROM cur LEFT JOIN upd ON true

-- name: AcknowledgeCancel :one
-- The worker ends its leased run as the requested cancel asks: CANCELLED, the lease dropped. Only
-- when a cancel was requested (cur_cancel tells the caller which refusal it was).
WITH cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'CANCELLED', lease_until = NULL, worker_id = NULL, not_before = NULL,
           failure_reason = COALESCE(r.failure_reason, 'cancelled'), error_code = NULL, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
       AND r.cancel_requested
 RETURNING r.*,
           cur.cur_status AS from_status, cur.cur_worker AS prev_worker
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(u.run_id, u.project_id, u.status, 'cancelled', u.failure_reason, :actor) c
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor,
           CASE status WHEN 'CANCELLED' THEN 'CANCELLED' END, from_status, status, 'cancel acknowledged by the worker',
           jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker) || '{}'::jsonb
      FROM upd
    UNION ALL
    SELECT * FROM comp
)
SELECT cur.*, upd.*,
       (SELECT reason FROM comp) AS comp_trigger,
       0::bigint AS notified
  FROM cur LEFT JOIN upd ON true

-- name: CancelRun :one
-- CancelRun (no lease; :cancel_projects: the projects where the caller may cancel, NULL: all).
-- Queued and waiting runs (parked ones too) end CANCELLED at once; a leased run gets cancel_requested (delivered in
-- the Heartbeat reply) and ends when its worker acknowledges or its lease is reaped. The statuses
-- are runstate's LEASED and CANCELLABLE. Same cur / upd / comp / aud shape as the fenced writes.
-- Before `cur` locks the run, awooop_lock_run_tree (migration 0200) locks the tree its cascade
-- will write, in the order a child's end locks it (children, then the run's children wait, then
-- the run), so a child ending meanwhile cannot deadlock with the cancel.
-- not null: cur_run_id, cur_project, cur_status
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status,
           -- a run parked on a durable wait is WAITING_TOOL without a worker: no heartbeat would
           -- deliver a cancel request, so it ends at once like a queued run
           status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL AS leased
      FROM awooop_run_state
     WHERE run_id = :run_id AND awooop_lock_run_tree(:run_id)
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN cur.leased THEN r.status ELSE 'CANCELLED' END,
           cancel_requested = cur.leased OR r.cancel_requested,
           lease_until = CASE WHEN cur.leased THEN r.lease_until END,
           worker_id = CASE WHEN cur.leased THEN r.worker_id END,
           error_code = CASE WHEN cur.leased THEN r.error_code END,
           failure_reason = :reason,
           approval_token_hash = NULL,
           not_before = NULL,
           updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND cur.cur_status IN ('PENDING', 'RUNNING', 'WAITING_TOOL', 'WAITING_APPROVAL', 'RESUMED')
       AND (:cancel_projects::text[] IS NULL OR r.project_id = ANY(:cancel_projects::text[])) IS TRUE
 RETURNING r.*,
           cur.cur_status AS from_status
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(u.run_id, u.project_id, u.status, 'cancelled', u.failure_reason, :actor) c
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, :actor,
           CASE status WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'CANCEL_REQUESTED' END,
           from_status, status, :reason, jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id)
      FROM upd
    UNION ALL
    SELECT * FROM comp
)
SELECT cur.*, upd.*, (SELECT reason FROM comp) AS comp_trigger
  FROM cur LEFT JOIN upd ON true
