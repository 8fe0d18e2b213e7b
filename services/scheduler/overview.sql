-- name: CountLiveRuns :many
-- A project's unfinished runs per status, how many of them are claimable now, and the oldest
-- claimable one's creation time. One branch per partial index of unfinished runs (a single
-- `status IN (...)` list is not matched to partial indexes, and the list of a project's runs,
-- awooop_run_created_list_idx, holds its finished runs too), so its cost follows the backlog, not
-- the history: PENDING/RESUMED through awooop_run_claim_idx (project_id first), RUNNING/WAITING_TOOL
-- with a worker through awooop_run_leased_idx, WAITING_TOOL parked on a durable wait (no worker)
-- through awooop_run_waiting_idx, WAITING_APPROVAL through awooop_run_approval_idx. Claimable is
-- the claim's own test (a claimable status, not before its time, attempts left, the project not
-- paused), written out here.
-- not null: status, n, claimable, db_now
SELECT status, count(*) AS n, count(*) FILTER (WHERE claimable) AS claimable,
       min(created_at) FILTER (WHERE claimable) AS oldest, now() AS db_now
  FROM (SELECT status, created_at,
               (not_before IS NULL OR not_before <= now())
               AND attempt_count - released_count < max_attempts
               AND NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = :project_id AND f.paused)
                   AS claimable
          FROM awooop_run_state
         WHERE project_id = :project_id AND status IN ('PENDING', 'RESUMED')
        UNION ALL
        SELECT status, created_at, false FROM awooop_run_state
         WHERE project_id = :project_id AND status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL
        UNION ALL
        SELECT status, created_at, false FROM awooop_run_state
         WHERE project_id = :project_id AND status = 'WAITING_TOOL' AND worker_id IS NULL
        UNION ALL
        SELECT status, created_at, false FROM awooop_run_state
         WHERE project_id = :project_id AND status = 'WAITING_APPROVAL') live
 GROUP BY status

-- name: CountFinishedRuns :many
-- A project's finished runs per status: every finished run of the project kept by retention
-- (AWOOOP_RUN_RETENTION), from awooop_run_project_finished_idx alone (migration 0370), so CountRuns
-- runs it only when asked (include_finished).
-- not null: n
SELECT status, count(*) AS n
  FROM awooop_run_state
 WHERE project_id = :project_id AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
 GROUP BY status

-- name: ListProjects :many
-- Distinct projects that have runs, by a loose index scan over awooop_run_created_list_idx (one
-- index probe per project instead of reading every run; migration 0370), at most :max_projects.
-- not null: project_id
WITH RECURSIVE p AS (
    (SELECT project_id FROM awooop_run_created ORDER BY project_id LIMIT 1)
    UNION ALL
    SELECT (SELECT c.project_id FROM awooop_run_created c WHERE c.project_id > p.project_id
             ORDER BY c.project_id LIMIT 1)
      FROM p WHERE p.project_id IS NOT NULL
)
SELECT project_id FROM p WHERE project_id IS NOT NULL LIMIT :max_projects
