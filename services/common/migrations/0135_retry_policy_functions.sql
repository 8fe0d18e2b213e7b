-- The retry policy's rules, written once as SQL functions for the named statements that apply
-- them (issue 26: no statement text is assembled across modules):
-- services/scheduler/fenced_writes.sql (FailRun) and reaper.sql.

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
