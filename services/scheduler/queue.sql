-- name: SampleQueue :many
-- The queue gauges: unfinished runs by project and status, how many of them are claimable now,
-- and the age of the oldest claimable run (by the time it became claimable: its last state
-- change, or the end of its retry backoff or delay; GREATEST ignores a NULL not_before).
-- Claimable is the claim's own test (services/scheduler/claims: a claimable status, not before
-- its time, attempts left, its project not paused), written out here.
-- It reads only unfinished runs: the filter is the union of the predicates of the partial
-- indexes awooop_run_claim_idx (PENDING, RESUMED), awooop_run_approval_idx (WAITING_APPROVAL),
-- awooop_run_leased_idx (RUNNING, WAITING_TOOL with a worker) and awooop_run_waiting_idx
-- (WAITING_TOOL parked on a durable wait: no worker; migration 0161), one arm each, so the
-- planner reads the four indexes (a BitmapOr) and its cost follows the backlog, not the history
-- of finished runs. The paused projects are read once, as an array (an InitPlan), not probed per
-- run: with sequential scans priced out (services/common/planner.py) a correlated NOT EXISTS was
-- an index probe of awooop_project_flow for every unfinished run.
-- held: queued runs a worker held because its code did not replay their journal (HoldRun),
-- waiting for an operator. debouncing: batches of debounced channel events whose quiet window is
-- still open (wait_reason 'debounce', not_before ahead; services/ingest/debounce.py).
-- waiting_for_labels: queued runs the label sweep parked because no live worker has the labels they
-- require (wait_reason 'labels'; services/scheduler/workers.sql).
-- not null: project_id, status, n, claimable, held, debouncing, waiting_for_labels, oldest
SELECT project_id, status, count(*) AS n,
       count(*) FILTER (WHERE claimable) AS claimable,
       count(*) FILTER (WHERE wait_reason = 'held') AS held,
       count(*) FILTER (WHERE wait_reason = 'debounce' AND not_before > now()) AS debouncing,
       count(*) FILTER (WHERE wait_reason = 'labels') AS waiting_for_labels,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(ready_since) FILTER (WHERE claimable)), 0)::float8
           AS oldest
  FROM (SELECT project_id, status,
               (status IN ('PENDING', 'RESUMED')
                AND (not_before IS NULL OR not_before <= now())
                AND attempt_count - released_count < max_attempts
                AND r.project_id <> ALL (ARRAY(SELECT f.project_id FROM awooop_project_flow f WHERE f.paused)))
                   AS claimable,
               wait_reason, not_before, GREATEST(updated_at, not_before) AS ready_since
          FROM awooop_run_state r
         WHERE status IN ('PENDING', 'RESUMED') OR status = 'WAITING_APPROVAL'
               OR (status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL)
               OR (status = 'WAITING_TOOL' AND worker_id IS NULL)) unfinished
 GROUP BY project_id, status

-- name: SampleWaits :many
-- The durable waits' gauges: open waits by project and kind, the age of the oldest of each, and
-- how long past its expiry the most overdue one is (the timeout sweep ends a wait within its
-- interval of the expiry: minutes overdue means no sweep runs). Reads only open waits
-- (awooop_wait_due_idx is partial on status = 'open').
-- not null: project_id, kind, n, oldest, overdue
SELECT project_id, kind, count(*) AS n,
       EXTRACT(EPOCH FROM clock_timestamp() - min(created_at))::float8 AS oldest,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(expires_at) FILTER (WHERE expires_at <= now())), 0)::float8
           AS overdue
  FROM awooop_wait
 WHERE status = 'open'
 GROUP BY project_id, kind
