-- The fence of a fenced write and the locked row a refusal is chosen from, each written once
-- (issue 42: the same lines were copied into every fenced write of fenced_writes.sql, claims.sql,
-- approvals.sql and waits.sql).
--
-- awooop_run_cur: a run's state as a fenced write locks it (`cur AS (SELECT * FROM awooop_run_cur
-- WHERE cur_run_id = :run_id FOR UPDATE)`), under the names refusals.py reads. A simple view: the
-- planner expands it in place, and FOR UPDATE locks the awooop_run_state row.
CREATE VIEW awooop_run_cur AS
SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, attempt_count AS cur_attempt,
       cancel_requested AS cur_cancel, reaped_at AS cur_reaped_at, heartbeat_at AS cur_heartbeat_at,
       worker_id AS cur_worker, concurrency_keys AS cur_keys
  FROM awooop_run_state;

-- awooop_fence_holds: the fence itself. The token (p_attempt) names the run's current attempt,
-- its status is one the transition may start from (p_allowed: runstate.py's allowed_from), and
-- the caller is a worker of the run's project (p_projects; NULL: every project). A SQL function
-- of one expression, not STRICT: the planner inlines it, so a statement plans as if the test were
-- written out. The status test stays wrapped in `IS TRUE` (status is NOT NULL: same meaning) so
-- the planner cannot match it to the predicate of awooop_run_leased_idx and scan that index
-- instead of one primary-key probe.
CREATE FUNCTION awooop_fence_holds(
    attempt_count INT, status TEXT, project_id TEXT, p_attempt INT, p_allowed TEXT[], p_projects TEXT[]
) RETURNS BOOLEAN
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT attempt_count = p_attempt
       AND (status = ANY(p_allowed)) IS TRUE
       AND (p_projects IS NULL OR project_id = ANY(p_projects)) IS TRUE
$$;
