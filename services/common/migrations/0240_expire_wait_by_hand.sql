-- An operator's expiry by hand (ExpireWait) of a wait whose run is over is refused, as a
-- completion of it is (issue 27; docs/architecture.md "Durable waits"). awooop_end_wait lets a
-- timeout end such a wait on purpose (the sweep must close the waits of cancelled and failed runs
-- and move on), and ExpireWait called it with that timeout, so it answered success and changed
-- nothing an operator could see. This wrapper is ExpireWait's: under the same locks, wait before
-- run (the order of every statement that takes both), an open wait of a run that is COMPLETED,
-- FAILED or CANCELLED answers 'run_ended' (the run's status in run_status) and stays open for the
-- sweep; everything else is awooop_end_wait's answer, the one rule for ending a wait.
CREATE FUNCTION awooop_expire_wait_by_hand(p_wait_id UUID, p_actor TEXT, p_projects TEXT[])
RETURNS TABLE (outcome TEXT, wait_id UUID, run_id UUID, project_id VARCHAR, wait_status VARCHAR, run_status VARCHAR,
               resumed BOOLEAN, result JSONB, completed_by VARCHAR, completed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
               kind VARCHAR, step_id VARCHAR)
LANGUAGE plpgsql AS $$
DECLARE
    w awooop_wait%ROWTYPE;
    ended_as VARCHAR;  -- the run's status
BEGIN
    SELECT * INTO w FROM awooop_wait aw WHERE aw.wait_id = p_wait_id FOR UPDATE;
    IF FOUND AND w.status = 'open' AND (p_projects IS NULL OR w.project_id = ANY(p_projects)) THEN
        SELECT rs.status INTO ended_as FROM awooop_run_state rs WHERE rs.run_id = w.run_id FOR UPDATE;
        IF ended_as IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
            RETURN QUERY SELECT 'run_ended'::text, w.wait_id, w.run_id, w.project_id, w.status, ended_as, false,
                                w.result, w.completed_by, w.completed_at, w.expires_at, w.kind, w.step_id;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM awooop_end_wait(p_wait_id, 'timed_out', NULL, p_actor, p_projects);
END
$$;
