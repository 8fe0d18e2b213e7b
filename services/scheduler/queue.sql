-- name: SampleQueue
-- The queue gauges: unfinished runs by project and status, how many of them are claimable now,
-- and the age of the oldest claimable run (by the time it became claimable: its last state
-- change, or the end of its retry backoff or delay; GREATEST ignores a NULL not_before).
-- Claimable is the claim's own test (services/scheduler/claims: a claimable status, not before
-- its time, attempts left, its project not paused), written out here.
-- It reads only unfinished runs, one branch per partial index of them: awooop_run_claim_idx
-- (PENDING, RESUMED), awooop_run_leased_idx (RUNNING, WAITING_TOOL), awooop_run_approval_idx
-- (WAITING_APPROVAL). One `status IN (...)` over all five is not matched to the partial indexes
-- and read the whole table, finished runs included; this way its cost follows the backlog, not
-- the history (bench/depth.py).
SELECT project_id, status, count(*) AS n,
       count(*) FILTER (WHERE claimable) AS claimable,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(ready_since) FILTER (WHERE claimable)), 0)::float8
           AS oldest
  FROM (SELECT project_id, status,
               ((not_before IS NULL OR not_before <= now())
                AND attempt_count - released_count < max_attempts
                AND NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = r.project_id AND f.paused))
                   AS claimable,
               GREATEST(updated_at, not_before) AS ready_since
          FROM awooop_run_state r
         WHERE status IN ('PENDING', 'RESUMED')
        UNION ALL
        SELECT project_id, status, false, NULL FROM awooop_run_state
         WHERE status IN ('RUNNING', 'WAITING_TOOL')
        UNION ALL
        SELECT project_id, status, false, NULL FROM awooop_run_state
         WHERE status = 'WAITING_APPROVAL') unfinished
 GROUP BY project_id, status
