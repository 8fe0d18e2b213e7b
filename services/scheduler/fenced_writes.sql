-- Fenced worker writes (CompleteRun, FailRun, ReleaseRun, HoldRun, ToolWait for WaitTool and ResumeTool,
-- AcknowledgeCancel; RequestApproval is in approvals.sql), CancelRun and UnholdRun, as they run:
-- services/scheduler/transitions.py.
--
-- Each is ONE statement: lock the row (`cur`: the view awooop_run_cur, migration 0300), change it
-- only if the fence holds (`upd`), and in its RETURNING record what the change leaves behind:
-- awooop_record_transition (migration 0310), called once per changed row, writes the audit row
-- (the action, reason and details each statement names), the compensation request when the run
-- ended FAILED or CANCELLED with steps to undo, and the NOTIFY that wakes waiting claimers when the
-- run became claimable. The statement always returns the locked row's current state too (cur_*),
-- so when nothing changed (run_id NULL) the error is chosen without a second round trip
-- (refusals.py).
--
-- The fence is one SQL function, awooop_fence_holds (migration 0300; the planner inlines it): the
-- token (:run_id, :attempt) names the current attempt, the status is one :allowed (the
-- transition's allowed_from in services/common/runstate.py), and the caller is a worker of the
-- run's project (:worker_projects; NULL: every project). A lease is held until the reaper takes
-- it, not until lease_until passes: a write that arrives after lease_until but before the reaper's
-- statement still counts (the reaper and the write serialize on the row lock, and the token keeps
-- any later attempt safe).
--
-- Compensation: a run that ended FAILED or CANCELLED with steps to undo (a completed tool call with
-- an undo command, or one whose undo was started: awooop_step_compensatable, migration 0141) gets
-- its compensation request in the same statement as the state change (docs/architecture.md,
-- "Saga"): the trigger a statement passes (its last arguments: the trigger, the failure reason) is
-- recorded by awooop_request_compensation (migration 0210), and comp_trigger reports it. The audit
-- details of a fenced write start with the attempt and the worker that held it.

-- name: CompleteRun :one
-- RUNNING -> COMPLETED with :output (JSON), the lease dropped. A completed run is never compensated
-- (Compensate takes FAILED and CANCELLED runs only), so its saga ends here: not_needed. (Failed and
-- cancelled runs with nothing to undo get not_needed from the trigger of migration 0080.)
-- CompleteRuns (claims.sql ClaimRuns) writes the same SET list, fence and audit row per item.
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'COMPLETED', output = :output::jsonb, lease_until = NULL, worker_id = NULL,
           failure_reason = NULL, error_code = NULL, not_before = NULL, saga_status = 'not_needed', updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           awooop_record_transition(r.run_id, r.project_id, r.status, :actor, 'COMPLETED', cur.cur_status, NULL,
                                    jsonb_build_object('attempt', r.attempt_count,
                                                       'worker_id', cur.cur_worker)) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

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
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
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
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor,
               CASE r.status WHEN 'PENDING' THEN 'RETRY_SCHEDULED' WHEN 'CANCELLED' THEN 'CANCELLED'
                             WHEN 'FAILED' THEN 'FAILED' END,
               cur.cur_status, :reason,
               jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker,
                                  'retryable', :retryable::boolean, 'error_code', r.error_code,
                                  'not_before', r.not_before, 'max_attempts', r.max_attempts),
               CASE r.status WHEN 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END, r.failure_reason) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: ReleaseRun :one
-- The worker hands the run back: PENDING again, the attempt not spent (released_count + 1). A
-- hand-back while a cancel is pending ends the run CANCELLED: re-queuing would ignore the cancel.
-- The audit details carry `released`, the mark a repeat of this ReleaseRun finds (replays.sql
-- ReleasedBy); a claim's hand-back of undelivered runs (claims.sql HandBackUndelivered) does not.
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
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
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor,
               CASE r.status WHEN 'PENDING' THEN 'RELEASED' WHEN 'CANCELLED' THEN 'CANCELLED' END, cur.cur_status,
               NULLIF(:reason, ''),
               jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker, 'released', true),
               'cancelled', r.failure_reason) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: HoldRun :one
-- The worker's code does not replay the run's journal (a deploy changed its steps; the SDK found
-- it, docs/worker-sdk.md "Replay"): the run is held. PENDING, the attempt not spent (released_count
-- + 1), parked with not_before 'infinity' and wait_reason held (past the claim scans' due bound:
-- no claim reads it), the worker's :reason and :error_code kept as the run's failure_reason and
-- error_code, until an operator's UnholdRun makes it claimable again or CancelRun ends it (and
-- compensates it). A hold while a cancel is pending ends the run CANCELLED, as a release would.
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           released_count = r.released_count + 1, lease_until = NULL, worker_id = NULL,
           not_before = CASE WHEN r.cancel_requested THEN NULL ELSE 'infinity'::timestamptz END,
           wait_reason = CASE WHEN r.cancel_requested THEN r.wait_reason ELSE 'held' END,
           wait_key = CASE WHEN r.cancel_requested THEN r.wait_key END,
           error_code = CASE WHEN r.cancel_requested THEN r.error_code ELSE :error_code::text END,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 ELSE :reason::text END, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor,
               CASE r.status WHEN 'PENDING' THEN 'HELD' WHEN 'CANCELLED' THEN 'CANCELLED' END, cur.cur_status,
               :reason::text,
               jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker, 'error_code', :error_code::text),
               'cancelled', r.failure_reason) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: ToolWait :one
-- WaitTool (RUNNING -> WAITING_TOOL while a tool, :tool_id, answers) and ResumeTool (WAITING_TOOL ->
-- RUNNING: the tool answered): the new :status and its audit :action are the one outcome of the
-- call's runstate transition (transitions.py), :allowed its one starting status. The lease is kept
-- either way (heartbeats go on).
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
upd AS (
    UPDATE awooop_run_state r
       SET status = :status, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
 RETURNING r.*,
           awooop_record_transition(r.run_id, r.project_id, r.status, :actor, :action, cur.cur_status,
                                    NULLIF(:tool_id, ''),
                                    jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker)
                                    || CASE WHEN :tool_id::text IS NOT NULL
                                            THEN jsonb_build_object('tool_id', :tool_id::text)
                                            ELSE '{}'::jsonb END) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: AcknowledgeCancel :one
-- The worker ends its leased run as the requested cancel asks: CANCELLED, the lease dropped. Only
-- when a cancel was requested (cur_cancel tells the caller which refusal it was).
WITH cur AS (SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id FOR UPDATE),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'CANCELLED', lease_until = NULL, worker_id = NULL, not_before = NULL,
           failure_reason = COALESCE(r.failure_reason, 'cancelled'), error_code = NULL, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, :attempt, :allowed, :worker_projects)
       AND r.cancel_requested
 RETURNING r.*,
           awooop_record_transition(r.run_id, r.project_id, r.status, :actor,
                                    CASE r.status WHEN 'CANCELLED' THEN 'CANCELLED' END, cur.cur_status,
                                    'cancel acknowledged by the worker',
                                    jsonb_build_object('attempt', r.attempt_count, 'worker_id', cur.cur_worker),
                                    'cancelled', r.failure_reason) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: CancelRun :one
-- CancelRun (no lease; :cancel_projects: the projects where the caller may cancel, NULL: all).
-- Queued and waiting runs (parked ones too) end CANCELLED at once; a leased run gets cancel_requested (delivered in
-- the Heartbeat reply) and ends when its worker acknowledges or its lease is reaped. The statuses
-- are runstate's LEASED and CANCELLABLE. Same cur / upd / awooop_record_transition shape as the fenced writes.
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
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor,
               CASE r.status WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'CANCEL_REQUESTED' END, cur.cur_status, :reason,
               jsonb_build_object('attempt', r.attempt_count, 'worker_id', r.worker_id),
               'cancelled', r.failure_reason) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true

-- name: UnholdRun :one
-- UnholdRun (no lease; :unhold_projects: the projects where the caller may, NULL: all): a run held
-- by HoldRun (PENDING, wait_reason held) is claimable at once, on :build_id when one is given (NULL:
-- its own). Its failure_reason and error_code stay: they say why its last attempt ended. Anything
-- else is refused (cur tells why).
-- not null: cur_run_id, cur_project, cur_status
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, wait_reason AS cur_wait_reason,
           attempt_count AS cur_attempt
      FROM awooop_run_state
     WHERE run_id = :run_id
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL, build_id = COALESCE(:build_id::text, r.build_id), updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND cur.cur_status = 'PENDING' AND cur.cur_wait_reason = 'held'
       AND (:unhold_projects::text[] IS NULL OR r.project_id = ANY(:unhold_projects::text[])) IS TRUE
 RETURNING r.*,
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor, 'UNHELD', cur.cur_status, NULLIF(:reason::text, ''),
               jsonb_build_object('attempt', r.attempt_count, 'build_id', r.build_id)) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true
