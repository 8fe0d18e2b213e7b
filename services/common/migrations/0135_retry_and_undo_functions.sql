-- Rules several named statements share, written once as SQL functions (issue 26: no statement
-- text is assembled across modules). services/scheduler/fenced_writes.sql, reaper.sql and
-- approvals.sql call them.

-- The retry policy a run follows (services/common/retry_policy.py): the service's defaults
-- (JSON text, settings AWOOOP_RETRY_*), overridden by its project's (awooop_project_flow's
-- retry_policy, NULL: none), overridden by the run's own. Merged when the run fails or is reaped,
-- so a project's new policy applies to its queued runs too. The caller reads the project's
-- policy: a function with a subquery in it is not inlined, and this one is, so the statements
-- keep their plans (each argument is used once).
CREATE FUNCTION awooop_effective_retry_policy(defaults TEXT, project_policy JSONB, run_policy JSONB)
RETURNS JSONB LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT defaults::jsonb || COALESCE(project_policy, '{}') || COALESCE(run_policy, '{}')
$$;

-- Seconds the n-th failure (failures: attempts used, hand-backs not counted) waits under the
-- policy: min(max_backoff, initial_backoff * multiplier^(n-1)), less a random part of at most
-- jitter of it. VOLATILE (random()); a plain expression, so Postgres inlines it.
CREATE FUNCTION awooop_retry_delay(policy JSONB, failures INT)
RETURNS FLOAT8 LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT least((policy->>'max_backoff')::float8,
                 (policy->>'initial_backoff')::float8
                 * power((policy->>'multiplier')::float8, greatest(failures - 1, 0)))
           * (1 - (policy->>'jitter')::float8 * random())
$$;

-- A journal step a compensation undoes (services/common/compensatable.py): a completed tool call
-- with an undo command; 'compensating' counts too (a compensating call was started and its outcome
-- is not recorded yet, so the driver calls again with the same key). A run that ends FAILED or
-- CANCELLED with such a step gets a compensation request in the same statement
-- (services/scheduler/*.sql, `comp`). A plain expression: Postgres inlines it, so a scan of steps
-- plans as if the conditions were written out.
CREATE FUNCTION awooop_step_to_undo(step_type TEXT, compensation_cmd JSONB, status TEXT)
RETURNS BOOLEAN LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT step_type = 'tool_call' AND compensation_cmd IS NOT NULL AND compensation_cmd <> 'null'::jsonb
           AND status IN ('completed', 'compensating')
$$;
