-- name: GetProjectFlow :one
-- A project's flow settings (no row: the defaults).
SELECT retry_policy, weight, paused, versioning, sticky_seconds FROM awooop_project_flow WHERE project_id = :project_id

-- name: SetProjectFlow :one
-- Sets a project's retry policy (:retry_policy, JSON text), claim weight, versioning and sticky
-- resume seconds (NULL: keep them; a new project's are pinned and 0), with its PROJECT_FLOW_SET
-- audit row.
WITH upd AS (
    INSERT INTO awooop_project_flow AS f (project_id, retry_policy, weight, updated_by, versioning, sticky_seconds)
    VALUES (:project_id, :retry_policy::text::jsonb, :weight, :actor, COALESCE(:versioning::text, 'pinned'),
            COALESCE(:sticky_seconds::int, 0))
    ON CONFLICT (project_id) DO UPDATE
       SET retry_policy = EXCLUDED.retry_policy, weight = EXCLUDED.weight,
           versioning = COALESCE(:versioning::text, f.versioning),
           sticky_seconds = COALESCE(:sticky_seconds::int, f.sticky_seconds),
           updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, retry_policy, weight, paused, versioning, sticky_seconds
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'PROJECT_FLOW_SET', NULL, NULL, NULL,
           jsonb_build_object('retry_policy', retry_policy, 'weight', weight, 'versioning', versioning,
                              'sticky_seconds', sticky_seconds)
      FROM upd
)
SELECT retry_policy, weight, paused, versioning, sticky_seconds FROM upd

-- name: PauseProject :one
-- Pauses (:paused true) or resumes a project, with its PROJECT_PAUSED or PROJECT_RESUMED audit
-- row. Resuming wakes the project's waiting claims (the NOTIFY is sent at commit).
WITH upd AS (
    INSERT INTO awooop_project_flow (project_id, paused, paused_at, updated_by)
    VALUES (:project_id::text, :paused, CASE WHEN :paused THEN now() END, :actor)
    ON CONFLICT (project_id) DO UPDATE
       SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at,
           updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, retry_policy, weight, paused, versioning, sticky_seconds
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, CASE WHEN :paused THEN 'PROJECT_PAUSED' ELSE 'PROJECT_RESUMED' END,
           NULL, NULL, NULLIF(:reason, ''), '{}'::jsonb
      FROM upd
)
SELECT retry_policy, weight, paused, versioning, sticky_seconds,
       (SELECT pg_notify('awooop_run_ready', :project_id::text) WHERE NOT :paused) IS NULL AS quiet
  FROM upd
