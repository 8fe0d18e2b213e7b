-- name: SetConcurrencyLimit
-- params: project_id, key, max_running, actor, max_starts, per_secs
-- :max_running (NULL: none), :max_starts (NULL: none) per :per_secs seconds for (:project_id,
-- :key). Setting a limit counts the key's leased runs in the same statement, so a limit set while
-- runs hold leases starts from the truth. The key row's lock serializes this with claims of the
-- key; a raised limit wakes as many parked runs as it frees (at most 100000, concurrency.py's
-- MAX_LIMIT, when the key has no running limit).
WITH lim AS (
    INSERT INTO awooop_concurrency_limit (project_id, key, max_running, running, updated_by, max_starts, rate_period)
    VALUES ($1::text, $2::text, $3::int, (SELECT count(*) FROM awooop_run_state
                          WHERE project_id = $1 AND $2 = ANY(concurrency_keys)
                            AND status IN ('RUNNING', 'WAITING_TOOL')), $4,
            $5::int, CASE WHEN $5::int IS NOT NULL THEN make_interval(secs => $6::float8) END)
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
                         WHERE project_id = $1 AND wait_key = $2
                           AND status IN ('PENDING', 'RESUMED') AND not_before = 'infinity'
                         ORDER BY priority DESC, created_at
                         LIMIT greatest(0, (SELECT COALESCE(max_running - running, 100000) FROM lim))
                           FOR UPDATE SKIP LOCKED)
    RETURNING r.run_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, $4, 'CONCURRENCY_LIMIT_SET', NULL, NULL, NULL,
           jsonb_build_object('key', key, 'max_running', max_running, 'max_starts', max_starts, 'per', per)
      FROM lim
)
SELECT lim.*, (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('awooop_run_ready', $1::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet
  FROM lim

-- name: RemoveConcurrencyLimit
-- params: project_id, key, actor
-- (:project_id, :key) becomes unlimited and its parked runs claimable.
WITH gone AS (
    DELETE FROM awooop_concurrency_limit WHERE project_id = $1 AND key = $2 RETURNING project_id, key
),
woken AS (
    UPDATE awooop_run_state
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE project_id = $1 AND wait_key = $2
       AND status IN ('PENDING', 'RESUMED') AND not_before = 'infinity'
    RETURNING run_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    VALUES ($1::text, NULL, $3::text, 'CONCURRENCY_LIMIT_SET', NULL, NULL, NULL,
            jsonb_build_object('key', $2::text, 'max_running', 0))
)
SELECT (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('awooop_run_ready', $1::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet

-- name: ListConcurrencyLimits
-- params: project_id
-- A project's limits, each with the runs waiting on it (parked behind it or its rate window).
SELECT k.project_id, k.key, k.max_running, k.running, k.max_starts,
       extract(epoch FROM k.rate_period)::float8 AS per,
       (SELECT count(*) FROM awooop_run_state r
         WHERE r.project_id = k.project_id AND r.wait_key = k.key
           AND r.status IN ('PENDING', 'RESUMED') AND r.wait_reason IN ('key_busy', 'rate_limited')
           AND r.not_before > now()) AS waiting
  FROM awooop_concurrency_limit k
 WHERE k.project_id = $1
 ORDER BY k.key
