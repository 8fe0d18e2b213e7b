-- Concurrency and rate limits per (project, key) (awooop_concurrency_limit; docs/flow-control.md),
-- as they run: services/scheduler/concurrency.py. The claim grants a limited key's free slots and
-- parks what it cannot grant (claims.sql); the trigger of migration 0120 gives a slot back when a
-- run with the key leaves its lease and wakes the runs parked on it (wait_key). A parked run is
-- queued (PENDING/RESUMED) with not_before 'infinity'. Each change writes a CONCURRENCY_LIMIT_SET
-- audit row (runstate.Audit).

-- name: SetConcurrencyLimit :one
-- :max_running (NULL: none), :max_starts (NULL: none) per :per_secs seconds for (:project_id,
-- :key). Setting a limit counts the key's leased runs (a worker holds them: not a run parked on a
-- durable wait, migration 0241) in the same statement, so a limit set while runs hold leases
-- starts from the truth. The key row's lock serializes this with claims of the
-- key; a raised limit wakes as many parked runs as it frees (at most 100000, concurrency.py's
-- MAX_LIMIT, when the key has no running limit).
WITH lim AS (
    INSERT INTO awooop_concurrency_limit (project_id, key, max_running, running, updated_by, max_starts, rate_period)
    VALUES (:project_id::text, :key::text, :max_running::int, (SELECT count(*) FROM awooop_run_state
                          WHERE project_id = :project_id AND :key = ANY(concurrency_keys)
                            AND status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL), :actor,
            :max_starts::int, CASE WHEN :max_starts::int IS NOT NULL THEN make_interval(secs => :per_secs::float8) END)
    ON CONFLICT (project_id, key) DO UPDATE
       SET max_running = EXCLUDED.max_running, max_starts = EXCLUDED.max_starts,
           rate_period = EXCLUDED.rate_period, updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, key, max_running, running, max_starts,
              extract(epoch FROM rate_period)::float8 AS per
),
woken AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE r.run_id IN (SELECT run_id FROM awooop_run_state
                         WHERE project_id = :project_id AND wait_key = :key
                           AND status IN ('PENDING', 'RESUMED') AND not_before = 'infinity'
                         ORDER BY priority DESC, created_at
                         LIMIT greatest(0, (SELECT COALESCE(max_running - running, 100000) FROM lim))
                           FOR UPDATE SKIP LOCKED)
    RETURNING r.run_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'CONCURRENCY_LIMIT_SET', NULL, NULL, NULL,
           jsonb_build_object('key', key, 'max_running', max_running, 'max_starts', max_starts, 'per', per)
      FROM lim
)
SELECT lim.*, (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('awooop_run_ready', :project_id::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet
  FROM lim

-- name: RemoveConcurrencyLimit :one
-- (:project_id, :key) becomes unlimited and its parked runs claimable.
WITH gone AS (
    DELETE FROM awooop_concurrency_limit WHERE project_id = :project_id AND key = :key RETURNING project_id, key
),
woken AS (
    UPDATE awooop_run_state
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE project_id = :project_id AND wait_key = :key
       AND status IN ('PENDING', 'RESUMED') AND not_before = 'infinity'
    RETURNING run_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    VALUES (:project_id::text, NULL, :actor::text, 'CONCURRENCY_LIMIT_SET', NULL, NULL, NULL,
            jsonb_build_object('key', :key::text, 'max_running', 0))
)
SELECT (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('awooop_run_ready', :project_id::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet

-- name: ListConcurrencyLimits :many
-- A project's limits, each with the runs waiting on it (parked behind it or its rate window).
-- not null: waiting
SELECT k.project_id, k.key, k.max_running, k.running, k.max_starts,
       extract(epoch FROM k.rate_period)::float8 AS per,
       (SELECT count(*) FROM awooop_run_state r
         WHERE r.project_id = k.project_id AND r.wait_key = k.key
           AND r.status IN ('PENDING', 'RESUMED') AND r.wait_reason IN ('key_busy', 'rate_limited')
           AND r.not_before > now()) AS waiting
  FROM awooop_concurrency_limit k
 WHERE k.project_id = :project_id
 ORDER BY k.key
