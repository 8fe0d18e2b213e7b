-- One owner for the rule "a run that ended FAILED or CANCELLED with steps to undo gets its
-- compensation request, and the request its audit row" (issue 26). Every statement that ends a
-- run calls it: services/scheduler/fenced_writes.sql (FailRun, ReleaseRun, AcknowledgeCancel,
-- CancelRun), approvals.sql (DecideApproval, ExpireApprovals), reaper.sql (ReapExpiredLeases) and
-- awooop_cancel_children below. (The parent_ended requests of awooop_parent_ended, migration 0190,
-- are another rule: COMPLETED descendants of a run that did not succeed, with the parent named.)
--
-- It records the request and returns the audit row instead of inserting it: the caller inserts
-- it in the same INSERT as the audit row of its transition, after it, so the log reads the
-- transition, then the request, and migration 0180's statement trigger copies both into the run's
-- log in one pass, in that order. (An INSERT of its own here would fire that trigger on its own,
-- at once, and number the request's log row before the transition's.) The row's reason is the
-- trigger, which the caller also returns (comp_trigger). It is called for every row the caller
-- changed and returns nothing for one that did not end FAILED or CANCELLED.
--
-- Visibility: VOLATILE, so under READ COMMITTED its statements take a fresh snapshot when they
-- start, not the calling statement's. The journal it reads is therefore the one as of after the
-- caller locked and changed the run: a step completed by a journal write that held the run row
-- (FinishStep's FOR SHARE) while the ending statement waited for that row is seen. The same test
-- inside the calling statement read the statement's snapshot, taken before the wait, and missed
-- such a step, while migration 0080's trigger (a fresh snapshot) saw it and left saga_status
-- in_progress: a run that ended with a step to undo and no request. It reads no row the caller
-- changes (only the journal's tool steps and the request), so seeing the caller's own changes so
-- far alters nothing. One request per run (ON CONFLICT DO NOTHING, as before: a run ends once,
-- and RedriveRuns never requeues a run with a request); no audit row when none was recorded.
CREATE FUNCTION awooop_request_compensation(
    p_run_id UUID, p_project_id TEXT, p_status TEXT, p_trigger TEXT, p_reason TEXT, p_actor TEXT
) RETURNS TABLE (project_id TEXT, run_id UUID, actor TEXT, action TEXT, from_status TEXT, to_status TEXT,
                 reason TEXT, details JSONB)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_status IN ('FAILED', 'CANCELLED') THEN
        INSERT INTO awooop_compensation_request AS q (run_id, project_id, trigger, reason)
        SELECT p_run_id, p_project_id, p_trigger, p_reason
         WHERE EXISTS (SELECT 1 FROM awooop_saga_step s
                        WHERE s.run_id = p_run_id AND awooop_step_compensatable(s.step_type, s.compensation_cmd, s.status))
        ON CONFLICT (run_id) DO NOTHING
        RETURNING q.trigger INTO reason;
        IF reason IS NOT NULL THEN  -- recorded: its audit row, with the trigger as its reason
            project_id := p_project_id;
            run_id := p_run_id;
            actor := p_actor;
            action := 'COMPENSATION_REQUESTED';
            details := jsonb_build_object('trigger', reason);
            RETURN NEXT;
        END IF;
    END IF;
END
$$;

-- awooop_cancel_children (migration 0190) with the request written by the function above; the
-- rest as 0190 has it, the lock order too (children locked in run_id order, each after its parent).
-- The transition's audit row and the request's go in one INSERT, in that order.
CREATE OR REPLACE FUNCTION awooop_cancel_children(p_parent UUID, p_only UUID[], p_actor TEXT, p_reason TEXT)
RETURNS INT LANGUAGE plpgsql AS $$
DECLARE
    c RECORD;
    n INT := 0;
    leased BOOLEAN;
    ended TEXT;
BEGIN
    FOR c IN SELECT r.run_id, r.project_id, r.status, r.worker_id, r.attempt_count
               FROM awooop_run_state r
              WHERE r.parent_run_id = p_parent AND (p_only IS NULL OR r.run_id = ANY(p_only))
                AND r.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') AND NOT r.cancel_requested
              ORDER BY r.run_id
                FOR UPDATE
    LOOP
        leased := c.status IN ('RUNNING', 'WAITING_TOOL') AND c.worker_id IS NOT NULL;
        UPDATE awooop_run_state r
           SET status = CASE WHEN leased THEN r.status ELSE 'CANCELLED' END,
               cancel_requested = leased OR r.cancel_requested,
               lease_until = CASE WHEN leased THEN r.lease_until END,
               worker_id = CASE WHEN leased THEN r.worker_id END,
               error_code = CASE WHEN leased THEN r.error_code END,
               failure_reason = p_reason, approval_token_hash = NULL, not_before = NULL, updated_at = now()
         WHERE r.run_id = c.run_id
        RETURNING r.status INTO ended;
        INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
        SELECT c.project_id, c.run_id, p_actor, CASE WHEN leased THEN 'CANCEL_REQUESTED' ELSE 'CANCELLED' END,
               c.status, ended, p_reason,
               jsonb_build_object('attempt', c.attempt_count, 'worker_id', c.worker_id, 'parent_run_id', p_parent)
        UNION ALL
        SELECT * FROM awooop_request_compensation(c.run_id, c.project_id, ended, 'cancelled', p_reason, p_actor);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- A FAILED or CANCELLED run with nothing to undo says saga_status not_needed (migration 0080): now
-- by the same test the request is recorded by (awooop_step_compensatable, migration 0141), so the
-- two cannot drift apart. 0080 wrote the test out (a `completed` step with a command); it differs
-- only for states no path reaches today (an undo started on a run that has not ended, a command on
-- a step that is not a tool call).
CREATE OR REPLACE FUNCTION awooop_saga_not_needed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM awooop_saga_step s
                    WHERE s.run_id = NEW.run_id AND awooop_step_compensatable(s.step_type, s.compensation_cmd, s.status)) THEN
        NEW.saga_status := 'not_needed';
    END IF;
    RETURN NEW;
END
$$;
