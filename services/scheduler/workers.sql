-- Workers and their labels (migration 0400; docs/flow-control.md, "Worker labels"): the registry
-- of the workers each project's claims came from, with the labels they declared, and the label
-- sweep, which parks the queued runs no live worker can take and wakes them when one can
-- (services/scheduler/workers.py). The routing itself is the claim's (claims.sql, "Labels").

-- name: WorkerSeen :val
-- A claim of :worker_id with :labels (a JSON object) and :build_id ('': none) arrived for
-- :projects: each (project, worker) is registered, or marked seen again with these. A project keeps at most
-- :max_workers workers: past that a new one is not registered (its claims still work; it does
-- not count as live). With :wake (this scheduler has not seen the worker with these labels
-- before), the project's runs parked for labels this worker has are woken at once (not_before
-- NULL) and their projects notified, so the claim that follows takes them.
WITH seen AS (
    INSERT INTO awooop_worker AS w (project_id, worker_id, labels, build_id)
    SELECT p.project_id, :worker_id::text, :labels::text::jsonb, NULLIF(:build_id::text, '')
      FROM unnest(:projects::text[]) AS p(project_id)
     WHERE CASE WHEN EXISTS (SELECT 1 FROM awooop_worker k
                              WHERE k.project_id = p.project_id AND k.worker_id = :worker_id::text)
                THEN true
                ELSE (SELECT count(*) FROM awooop_worker k WHERE k.project_id = p.project_id) < :max_workers END
     ORDER BY p.project_id
    ON CONFLICT (project_id, worker_id) DO UPDATE
       SET last_seen_at = now(), labels = EXCLUDED.labels, build_id = EXCLUDED.build_id
    RETURNING w.project_id
),
woken AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL
     WHERE :wake::bool
       AND r.project_id IN (SELECT project_id FROM seen)
       AND r.required_labels IS NOT NULL AND r.status IN ('PENDING', 'RESUMED')
       AND r.wait_reason = 'labels' AND :labels::text::jsonb @> r.required_labels
 RETURNING r.project_id
)
SELECT count(pg_notify('awooop_run_ready', project_id)) FROM (SELECT DISTINCT project_id FROM woken) w

-- name: WorkerBeat :exec
-- A heartbeat of :worker_id renewed a lease: the worker is marked seen in every project it is
-- registered in (a worker busy with long runs claims nothing, and is live all the same).
UPDATE awooop_worker SET last_seen_at = now() WHERE worker_id = :worker_id::text

-- name: SweepLabels :one
-- not null: parked, woken
-- The label sweep of :project_id (NULL: every project): a queued run that requires labels no live
-- worker of its project has (a claim or a heartbeat seen within :live_secs: a worker busy with
-- long runs does not claim, it heartbeats) is parked (not_before 'infinity',
-- wait_reason 'labels': past the due bound of the claim's scans, so claims do not read it); a
-- parked one that a live worker can take again is woken and its project notified. Only runs that
-- are due (or parked by this sweep) are looked at: a run delayed, backing off, held or parked
-- behind a key keeps its reason. The runs are read by awooop_run_labeled_idx (only runs that
-- require labels are in it). A row a claim holds is waited for and then re-checked (it is RUNNING
-- by then, and left alone). Registrations unseen for :forget_secs are dropped.
WITH live AS MATERIALIZED (
    SELECT project_id, labels FROM awooop_worker
     WHERE last_seen_at > now() - make_interval(secs => :live_secs)
       AND (:project_id::text IS NULL OR project_id = :project_id::text)
),
queued AS (
    SELECT r.run_id, r.wait_reason IS NOT DISTINCT FROM 'labels' AS parked,
           EXISTS (SELECT 1 FROM live w WHERE w.project_id = r.project_id AND w.labels @> r.required_labels) AS routable
      FROM awooop_run_state r
     WHERE r.required_labels IS NOT NULL AND r.status IN ('PENDING', 'RESUMED')
       AND (:project_id::text IS NULL OR r.project_id = :project_id::text)
       AND (r.wait_reason = 'labels' OR r.not_before IS NULL OR r.not_before <= now())
),
parked AS (
    UPDATE awooop_run_state r
       SET not_before = 'infinity', wait_reason = 'labels'
      FROM queued q
     WHERE r.run_id = q.run_id AND NOT q.parked AND NOT q.routable
       AND r.status IN ('PENDING', 'RESUMED') AND (r.not_before IS NULL OR r.not_before <= now())
 RETURNING r.run_id
),
woken AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL
      FROM queued q
     WHERE r.run_id = q.run_id AND q.parked AND q.routable
       AND r.status IN ('PENDING', 'RESUMED') AND r.wait_reason = 'labels'
 RETURNING r.project_id
),
forgotten AS (
    DELETE FROM awooop_worker
     WHERE last_seen_at < now() - make_interval(secs => :forget_secs)
       AND (:project_id::text IS NULL OR project_id = :project_id::text)
)
SELECT (SELECT count(*) FROM parked)::int AS parked,
       (SELECT count(*) FROM woken)::int AS woken,
       (SELECT count(pg_notify('awooop_run_ready', project_id)) FROM (SELECT DISTINCT project_id FROM woken) x) AS notified

-- name: LabeledProjects :many
-- The projects with queued runs that require labels: the label sweep goes through them one by
-- one when a sweep of all failed for one project's data.
SELECT DISTINCT project_id FROM awooop_run_state
 WHERE required_labels IS NOT NULL AND status IN ('PENDING', 'RESUMED')
 ORDER BY project_id

-- name: ProjectWorkers :many
-- not null: project_id, worker_id, labels, first_seen_at, last_seen_at, live
-- The workers of :project_id (NULL: every project) with their labels; live: a claim seen within
-- :live_secs.
SELECT project_id, worker_id, labels::text AS labels, build_id, first_seen_at, last_seen_at,
       last_seen_at > now() - make_interval(secs => :live_secs) AS live
  FROM awooop_worker
 WHERE :project_id::text IS NULL OR project_id = :project_id::text
 ORDER BY project_id, worker_id
