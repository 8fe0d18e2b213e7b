-- Worker builds (migration 0390, docs/versioning.md): the builds each project's workers declared,
-- what is on each, draining one, and moving a run to another (services/scheduler/builds.py).

-- name: BuildSeen :exec
-- A claim of :build_id arrived for :projects: each (project, build) is registered (first seen
-- now) or marked seen again. A project keeps at most :max_builds builds: past that a new one is
-- not registered (its claims still work; it is never a project's newest build).
INSERT INTO awooop_worker_build AS b (project_id, build_id)
SELECT p.project_id, :build_id::text
  FROM unnest(:projects::text[]) AS p(project_id)
 WHERE EXISTS (SELECT 1 FROM awooop_worker_build k WHERE k.project_id = p.project_id AND k.build_id = :build_id::text)
    OR (SELECT count(*) FROM awooop_worker_build k WHERE k.project_id = p.project_id) < :max_builds
 ORDER BY p.project_id
ON CONFLICT (project_id, build_id) DO UPDATE SET last_seen_at = now()

-- name: ProjectBuilds :many
-- not null: project_id, build_id, live, draining, newest, queued, held, leased, parked, waiting_for_build
-- The builds of :project_id (NULL: every project), registered or only named by unfinished runs
-- (moved there by hand), with the unfinished runs on each: queued (not held), held (HoldRun),
-- leased, parked (an approval, a durable wait). live: a claim of it within :live_secs, or a lease
-- it holds. newest: the project's latest first seen that is not draining (the claim's `newest`,
-- claims.sql). waiting_for_build: while it is not live, its queued runs that only it may take
-- (pinned by their own auto_upgrade or their project's versioning, past their not_before, with
-- steps journaled). The runs are read as SampleQueue reads them (queue.sql): the arms of the
-- partial indexes of unfinished runs, so the cost follows the backlog.
WITH runs AS (
    SELECT r.project_id, r.build_id,
           count(*) FILTER (WHERE r.status IN ('PENDING', 'RESUMED') AND r.wait_reason IS DISTINCT FROM 'held') AS queued,
           count(*) FILTER (WHERE r.status IN ('PENDING', 'RESUMED') AND r.wait_reason = 'held') AS held,
           count(*) FILTER (WHERE r.status IN ('RUNNING', 'WAITING_TOOL') AND r.worker_id IS NOT NULL) AS leased,
           count(*) FILTER (WHERE r.status = 'WAITING_APPROVAL' OR (r.status = 'WAITING_TOOL' AND r.worker_id IS NULL))
               AS parked,
           count(*) FILTER (WHERE r.status IN ('PENDING', 'RESUMED') AND (r.not_before IS NULL OR r.not_before <= now())
                              AND NOT COALESCE(r.auto_upgrade, f.versioning = 'auto_upgrade', false)
                              AND EXISTS (SELECT 1 FROM awooop_saga_step s WHERE s.run_id = r.run_id)) AS pinned_ready
      FROM awooop_run_state r
      LEFT JOIN awooop_project_flow f ON f.project_id = r.project_id
     WHERE (r.status IN ('PENDING', 'RESUMED') OR r.status = 'WAITING_APPROVAL'
            OR (r.status IN ('RUNNING', 'WAITING_TOOL') AND r.worker_id IS NOT NULL)
            OR (r.status = 'WAITING_TOOL' AND r.worker_id IS NULL))
       AND r.build_id IS NOT NULL
       AND (:project_id::text IS NULL OR r.project_id = :project_id::text)
     GROUP BY r.project_id, r.build_id
),
builds AS (
    SELECT b.*,
           b.build_id = (SELECT n.build_id FROM awooop_worker_build n
                          WHERE n.project_id = b.project_id AND n.drained_at IS NULL
                          ORDER BY n.first_seen_at DESC, n.build_id LIMIT 1) AS newest
      FROM awooop_worker_build b
     WHERE :project_id::text IS NULL OR b.project_id = :project_id::text
),
joined AS (
    SELECT COALESCE(b.project_id, x.project_id) AS project_id, COALESCE(b.build_id, x.build_id) AS build_id,
           b.first_seen_at, b.last_seen_at, b.drained_at, b.drained_by,
           COALESCE(b.last_seen_at > now() - make_interval(secs => :live_secs), false)
               OR COALESCE(x.leased, 0) > 0 AS live,
           b.drained_at IS NOT NULL AS draining, COALESCE(b.newest, false) AS newest,
           COALESCE(x.queued, 0)::int AS queued, COALESCE(x.held, 0)::int AS held,
           COALESCE(x.leased, 0)::int AS leased, COALESCE(x.parked, 0)::int AS parked,
           COALESCE(x.pinned_ready, 0)::int AS pinned_ready
      FROM builds b
      FULL JOIN runs x ON x.project_id = b.project_id AND x.build_id = b.build_id
)
SELECT project_id, build_id, first_seen_at, last_seen_at, drained_at, drained_by, live, draining, newest,
       queued, held, leased, parked, CASE WHEN live THEN 0 ELSE pinned_ready END AS waiting_for_build
  FROM joined
 ORDER BY project_id, first_seen_at DESC NULLS LAST, build_id

-- name: ProjectPatches :many
-- not null: change_id, patched, unpatched
-- The patches (the SDKs' ctx.patched: a callback step `patch:<change id>` whose result is
-- {"patched": true|false}) that :project_id's unfinished runs met, with how many took each path.
-- An old path may be deleted once no unfinished run took it (docs/versioning.md, "Patches").
-- The runs are read by the arms of the partial indexes of unfinished runs (SampleQueue's).
SELECT substr(s.step_id, 7) AS change_id,
       count(*) FILTER (WHERE s.result->'patched' = 'true'::jsonb)::int AS patched,
       count(*) FILTER (WHERE s.result->'patched' IS DISTINCT FROM 'true'::jsonb)::int AS unpatched
  FROM awooop_run_state r
  JOIN awooop_saga_step s ON s.run_id = r.run_id AND s.step_id LIKE 'patch:%' AND s.status = 'completed'
 WHERE (r.status IN ('PENDING', 'RESUMED') OR r.status = 'WAITING_APPROVAL'
        OR (r.status IN ('RUNNING', 'WAITING_TOOL') AND r.worker_id IS NOT NULL)
        OR (r.status = 'WAITING_TOOL' AND r.worker_id IS NULL))
   AND r.project_id = :project_id::text
 GROUP BY 1
 ORDER BY 1

-- name: WaitingForBuild :val
-- not null
-- Whether the queued run :run_id waits for its build: pinned (its own auto_upgrade, else its
-- project's versioning), steps journaled, and its build not live (no claim of it within
-- :live_secs, no lease held by it). ProjectBuilds' waiting_for_build, for one run (GetRun).
SELECT NOT COALESCE(r.auto_upgrade, f.versioning = 'auto_upgrade', false)
       AND EXISTS (SELECT 1 FROM awooop_saga_step s WHERE s.run_id = r.run_id)
       AND NOT EXISTS (SELECT 1 FROM awooop_worker_build b
                        WHERE b.project_id = r.project_id AND b.build_id = r.build_id
                          AND b.last_seen_at > now() - make_interval(secs => :live_secs))
       AND NOT EXISTS (SELECT 1 FROM awooop_run_state l
                        WHERE (l.status IN ('RUNNING', 'WAITING_TOOL') AND l.worker_id IS NOT NULL)
                          AND l.project_id = r.project_id AND l.build_id = r.build_id)
  FROM awooop_run_state r
  LEFT JOIN awooop_project_flow f ON f.project_id = r.project_id
 WHERE r.run_id = :run_id

-- name: DrainBuild :one
-- Drains :build_id of :project_id (:undrain false) or undrains it, with its BUILD_DRAINED or
-- BUILD_UNDRAINED audit row. A build never seen is registered by it (an operator may drain a
-- build before its workers start). Undraining wakes the project's waiting claims (at commit).
WITH upd AS (
    INSERT INTO awooop_worker_build AS b (project_id, build_id, drained_at, drained_by)
    VALUES (:project_id::text, :build_id::text, CASE WHEN NOT :undrain THEN now() END,
            CASE WHEN NOT :undrain THEN :actor::text END)
    ON CONFLICT (project_id, build_id) DO UPDATE
       SET drained_at = EXCLUDED.drained_at, drained_by = EXCLUDED.drained_by
    RETURNING b.project_id, b.build_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, CASE WHEN :undrain THEN 'BUILD_UNDRAINED' ELSE 'BUILD_DRAINED' END,
           NULL, NULL, NULLIF(:reason::text, ''), jsonb_build_object('build_id', build_id)
      FROM upd
)
SELECT (SELECT pg_notify('awooop_run_ready', project_id) WHERE :undrain) IS NULL AS quiet FROM upd

-- name: SetRunBuild :one
-- SetRunBuild (no lease; :build_projects: the projects where the caller may, NULL: all): a run no
-- worker holds, queued or waiting for approval (runstate Action.SET_BUILD), is put on :build_id,
-- with its BUILD_SET audit row (from and to). A queued run is then claimable by that build; the
-- wake-up NOTIFY is sent at commit.
-- not null: cur_run_id, cur_project, cur_status
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, build_id AS cur_build
      FROM awooop_run_state
     WHERE run_id = :run_id
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET build_id = :build_id::text, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND cur.cur_status IN ('PENDING', 'RESUMED', 'WAITING_APPROVAL')
       AND (:build_projects::text[] IS NULL OR r.project_id = ANY(:build_projects::text[])) IS TRUE
 RETURNING r.*,
           awooop_record_transition(
               r.run_id, r.project_id, r.status, :actor, 'BUILD_SET', cur.cur_status, NULLIF(:reason::text, ''),
               jsonb_build_object('attempt', r.attempt_count, 'from', cur.cur_build, 'to', r.build_id)) AS comp_trigger
)
SELECT * FROM cur LEFT JOIN upd ON true
