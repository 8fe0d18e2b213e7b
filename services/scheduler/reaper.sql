-- The stale-lease reaper (seed 000 D3), as it runs: services/scheduler/reaper.py.

-- name: ReapExpiredLeases :many
-- RUNNING / WAITING_TOOL runs whose lease expired go back to PENDING while attempts are left, else
-- FAILED "Max retry attempts exceeded" (seed 000 D3; error code E-RUN-MAX-ATTEMPTS); a run with a
-- pending cancel becomes CANCELLED instead. WAITING_APPROVAL holds no lease and is never touched,
-- nor is a run parked on a durable wait (WAITING_TOOL without a worker: not in the leased index).
-- Up to :batch runs; :only_run one run only (NULL: any; the pass's fallback when a batch failed
-- for one run's data); :policy the service's retry policy (JSON text); :channel the wake-up
-- channel.
--
-- `expired` picks expired leases with FOR UPDATE SKIP LOCKED (replicas take disjoint rows and never
-- wait on a worker's write). Locking re-checks expiry in this same statement: a row whose
-- heartbeat committed after our snapshot is re-read at its newest version and dropped when
-- `lease_until < now()` no longer holds (READ COMMITTED re-evaluation), and once locked nobody can
-- renew it before the UPDATE. The scan reads awooop_run_leased_idx (partial: leased runs only,
-- keyed by run_id so that heartbeats are HOT updates; expiry is checked on the row) and the UPDATE
-- joins by primary key, so its cost grows with the leases held, not with finished runs. (Repeating
-- the status/expiry filter in the UPDATE made the planner join through the partial index instead,
-- a nested loop of batch x batch rows: 6x slower at 1M finished runs.)
--
-- A reaped lease counts as a failure of its attempt: while attempts are left the run waits the
-- backoff its retry policy gives that many attempts used (awooop_retry_delay over
-- awooop_effective_retry_policy, migration 0135), as after a retryable FailRun, so a handler that
-- crashes its worker every time backs off too. The audit rows, compensation requests
-- (awooop_request_compensation, migration 0210) and wake-up NOTIFY are written by the same
-- statement (as in fenced_writes.sql).
-- not null: run_id, status
WITH expired AS (
    SELECT s.run_id, s.status, s.worker_id, s.lease_until,
           awooop_effective_retry_policy(
               :policy, (SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = s.project_id),
               s.retry_policy) AS policy
      FROM awooop_run_state s
     WHERE s.status IN ('RUNNING', 'WAITING_TOOL') AND s.worker_id IS NOT NULL -- awooop_run_leased_idx: no parked run
       AND s.lease_until < now() AND (:only_run::uuid IS NULL OR s.run_id = :only_run)
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN r.cancel_requested THEN 'CANCELLED'
                         WHEN r.attempt_count - r.released_count < r.max_attempts THEN 'PENDING'
                         ELSE 'FAILED' END,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 WHEN r.attempt_count - r.released_count < r.max_attempts THEN r.failure_reason
                                 ELSE 'Max retry attempts exceeded' END,
           error_code = CASE WHEN r.cancel_requested THEN NULL
                             WHEN r.attempt_count - r.released_count < r.max_attempts THEN r.error_code
                             ELSE 'E-RUN-MAX-ATTEMPTS' END,
           not_before = CASE WHEN NOT r.cancel_requested AND r.attempt_count - r.released_count < r.max_attempts
                             THEN now() + make_interval(secs => awooop_retry_delay(e.policy, r.attempt_count - r.released_count)) END,
           wait_reason = CASE WHEN NOT r.cancel_requested AND r.attempt_count - r.released_count < r.max_attempts
                              THEN 'backoff' END,
           lease_until = NULL, worker_id = NULL, reaped_at = now(), updated_at = now()
      FROM expired e
     WHERE r.run_id = e.run_id
 RETURNING r.run_id, r.project_id, r.status, r.failure_reason, r.attempt_count, r.max_attempts,
           e.status AS from_status, e.worker_id AS prev_worker, e.lease_until AS prev_lease_until
),
comp AS (
    SELECT c.* FROM upd u, awooop_request_compensation(
        u.run_id, u.project_id, u.status, CASE WHEN u.status = 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END,
        u.failure_reason, :actor) c
),
-- the transitions' history rows, then the requests' (the final SELECT's join runs it)
audited AS (
    SELECT awooop_record_history(ARRAY(
               SELECT ROW(project_id, run_id, :actor,
                          CASE status WHEN 'PENDING' THEN 'REAPED' WHEN 'CANCELLED' THEN 'REAPED_CANCELLED'
                                      WHEN 'FAILED' THEN 'REAPED_FAILED' END,
                          from_status, status,
                          CASE status WHEN 'PENDING' THEN 'lease expired'
                                      WHEN 'CANCELLED' THEN 'lease expired after a cancel request'
                                      ELSE 'Max retry attempts exceeded' END,
                          jsonb_build_object('attempt', attempt_count, 'max_attempts', max_attempts,
                                             'worker_id', prev_worker, 'lease_until', prev_lease_until)
                      )::awooop_history_row
                 FROM upd
               UNION ALL
               SELECT ROW(project_id, run_id, actor, action, from_status, to_status, reason, details)::awooop_history_row
                 FROM comp)) AS recorded
),
notified AS (
    SELECT count(pg_notify(:channel, project_id)) AS n
      FROM (SELECT DISTINCT project_id FROM upd WHERE status = 'PENDING') p
)
SELECT upd.run_id, upd.status, upd.failure_reason, comp.reason AS trigger, (SELECT n FROM notified) AS notified
  FROM upd
 CROSS JOIN audited  -- its one row: the join is what runs it
  LEFT JOIN comp USING (run_id)

-- name: ExpiredLeases :many
-- The runs a reaper batch would take, for reaping them one at a time.
SELECT run_id FROM awooop_run_state
 WHERE status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL AND lease_until < now()
 ORDER BY lease_until
 LIMIT :batch
