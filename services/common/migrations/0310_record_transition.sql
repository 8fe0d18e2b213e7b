-- What a single-run state change writes besides the run row, written once (issue 42: the same
-- `comp` / `aud` / `notified` tail was copied into every fenced write of fenced_writes.sql and
-- approvals.sql; the history a transition leaves is now one function to change).
--
-- awooop_record_transition, called by the RETURNING of each single-run transition with the
-- changed row's values (only for a row that changed; a NULL run id writes nothing):
-- * the compensation request, when p_comp_trigger names one and the run ended FAILED or
--   CANCELLED with steps to undo (awooop_request_compensation, migration 0210);
-- * the audit row of the transition and, after it, the COMPENSATION_REQUESTED row, in one INSERT
--   (its statement trigger turns both into run-log rows, in that order);
-- * one NOTIFY awooop_run_ready when the run became claimable (runstate's CLAIMABLE), so a
--   waiting claimer wakes.
-- It returns the compensation trigger it recorded (NULL: none), which the caller reports.
-- Batch statements (claims, the reaper, the approval sweep) keep their own set-based INSERT: one
-- audit INSERT per batch, not one per run.
CREATE FUNCTION awooop_record_transition(
    p_run_id UUID, p_project_id TEXT, p_status TEXT, p_actor TEXT, p_action TEXT, p_from_status TEXT,
    p_reason TEXT, p_details JSONB, p_comp_trigger TEXT DEFAULT NULL, p_failure_reason TEXT DEFAULT NULL
) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    -- the request's audit row, as awooop_request_compensation returns it (c_run NULL: no request)
    c_project TEXT; c_run UUID; c_actor TEXT; c_action TEXT; c_from TEXT; c_to TEXT; c_reason TEXT; c_details JSONB;
BEGIN
    IF p_run_id IS NULL THEN  -- nothing changed, nothing to record
        RETURN NULL;
    END IF;
    -- plain statements, not one INSERT over a CTE of the request: that form cost a fenced write
    -- about 0.08 ms more (docs/benchmarks.md, "One function records a transition")
    IF p_comp_trigger IS NOT NULL THEN
        SELECT c.* INTO c_project, c_run, c_actor, c_action, c_from, c_to, c_reason, c_details
          FROM awooop_request_compensation(p_run_id, p_project_id, p_status, p_comp_trigger, p_failure_reason,
                                           p_actor) c;
    END IF;
    IF c_run IS NULL THEN
        INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
        VALUES (p_project_id, p_run_id, p_actor, p_action, p_from_status, p_status, p_reason, p_details);
    ELSE  -- both rows in one INSERT, the request's after the transition's: one trigger run, in order
        INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
        VALUES (p_project_id, p_run_id, p_actor, p_action, p_from_status, p_status, p_reason, p_details),
               (c_project, c_run, c_actor, c_action, c_from, c_to, c_reason, c_details);
    END IF;
    IF p_status IN ('PENDING', 'RESUMED') THEN
        PERFORM pg_notify('awooop_run_ready', p_project_id);
    END IF;
    RETURN c_reason;
END
$$;
