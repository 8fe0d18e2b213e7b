-- name: CountRuns
-- params: project_id
-- A project's runs counted per status, and its oldest claimable run: the claim's own test (a
-- claimable status, not before its time, attempts left, the project not paused), written out
-- here; awooop_run_claim_idx answers it.
SELECT (SELECT COALESCE(jsonb_object_agg(status, n), '{}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM awooop_run_state WHERE project_id = $1 GROUP BY status) c
       ) AS counts,
       (SELECT min(created_at) FROM awooop_run_state
         WHERE project_id = $1 AND status IN ('PENDING', 'RESUMED')
           AND (not_before IS NULL OR not_before <= now())
           AND attempt_count - released_count < max_attempts
           AND NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = $1 AND f.paused)
       ) AS oldest,
       now() AS db_now

-- name: ListProjects
-- params: max_projects
-- Distinct projects that have runs, by a loose index scan over awooop_run_list_idx (one index
-- probe per project instead of reading every run), at most :max_projects.
WITH RECURSIVE p AS (
    (SELECT project_id FROM awooop_run_state ORDER BY project_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.project_id FROM awooop_run_state r WHERE r.project_id > p.project_id
             ORDER BY r.project_id LIMIT 1)
      FROM p WHERE p.project_id IS NOT NULL
)
SELECT project_id FROM p WHERE project_id IS NOT NULL LIMIT $1
