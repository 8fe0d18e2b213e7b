-- A child that finishes after its parent's cancel reached it is compensated, and the parent's own
-- steps are undone only after every child has ended (issue 41, item 1; docs/architecture.md
-- "Child runs").
--
-- A leased child of a parent that ends FAILED or CANCELLED is only asked to cancel
-- (cancel_requested, delivered by its next heartbeat). Until then its worker may still complete
-- it: CompleteRun ended it COMPLETED, and since awooop_parent_ended had run already (the
-- parent_ended requests are written when the parent ends, for children COMPLETED by then), its
-- steps were never undone while the rest of the tree was rolled back. And the parent's own
-- request was claimed as soon as no child's request was open, so a child ending later was undone
-- after its parent's steps, against the tree's order.
--
-- Now:
-- 1. The parent_ended rule is one function, awooop_request_parent_ended: given a parent that ended
--    without success, each COMPLETED child of it (all, or those named) and every COMPLETED
--    descendant reached through COMPLETED children, with steps to undo, gets a request
--    (trigger parent_ended), audited.
-- 2. awooop_child_ended (the trigger of a child reaching a terminal status) calls it for a child
--    that ends COMPLETED under a parent that has ended FAILED or CANCELLED.
-- 3. awooop_parent_ended locks every unfinished child first, those already asked to cancel too
--    (awooop_cancel_children skips them), children in run_id order after the parent as before.
--    So a child ending at the same moment is ordered against the parent's end by its row lock:
--    either the child's end commits first and the parent's rule, a later statement with a fresh
--    snapshot, sees it COMPLETED; or the child's end waits for the parent's to commit and its
--    trigger, a fresh snapshot too, sees the parent ended. Neither misses the other. (CancelRun
--    takes these locks earlier, in awooop_lock_run_tree, children before the parent.)
-- 4. The saga claims a run's request only when every child of it has ended (services/saga/
--    driver.sql ClaimCompensationRequests), not only when no child's request is open.

CREATE FUNCTION awooop_request_parent_ended(p_parent UUID, p_parent_status TEXT, p_only UUID[])
RETURNS VOID LANGUAGE sql AS $$
    WITH RECURSIVE done AS (
        SELECT c.run_id, c.project_id FROM awooop_run_state c
         WHERE c.parent_run_id = p_parent AND c.status = 'COMPLETED' AND (p_only IS NULL OR c.run_id = ANY(p_only))
        UNION ALL
        SELECT c.run_id, c.project_id FROM awooop_run_state c JOIN done d ON c.parent_run_id = d.run_id
         WHERE c.status = 'COMPLETED'
    ),
    req AS (
        INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
        SELECT d.run_id, d.project_id, 'parent_ended', 'parent ' || p_parent || ' ended ' || p_parent_status
          FROM done d
         WHERE EXISTS (SELECT 1 FROM awooop_saga_step s
                        WHERE s.run_id = d.run_id AND awooop_step_compensatable(s.step_type, s.compensation_cmd, s.status))
        ON CONFLICT (run_id) DO NOTHING
        RETURNING run_id, project_id
    )
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, reason, details)
    SELECT project_id, run_id, 'system:parent-ended', 'COMPENSATION_REQUESTED', 'parent_ended',
           jsonb_build_object('trigger', 'parent_ended', 'parent_run_id', p_parent)
      FROM req;
$$;

CREATE OR REPLACE FUNCTION awooop_parent_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM awooop_run_state c
      WHERE c.parent_run_id = NEW.run_id AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
      ORDER BY c.run_id
        FOR UPDATE;
    PERFORM awooop_cancel_children(NEW.run_id, NULL, 'system:parent-ended',
                                   'parent ' || NEW.run_id || ' ended ' || NEW.status);
    PERFORM awooop_request_parent_ended(NEW.run_id, NEW.status, NULL);
    RETURN NULL;
END
$$;

-- 0190's body, and at its end the late child's request. Last, after the parent's children wait
-- and (in awooop_end_wait) the parent were locked: the tree's lock order is unchanged, and the
-- parent's status is read without a lock of its own (point 3 above orders the two ends).
CREATE OR REPLACE FUNCTION awooop_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w RECORD;
    failed BOOLEAN := NEW.status <> 'COMPLETED';
    parent_status TEXT;
BEGIN
    FOR w IN SELECT aw.wait_id, aw.child_ids, aw.fail_fast FROM awooop_wait aw
              WHERE aw.run_id = NEW.parent_run_id AND aw.kind = 'children' AND aw.status = 'open'
                AND NEW.run_id = ANY(aw.child_ids)
              ORDER BY aw.wait_id
                FOR UPDATE
    LOOP
        IF (w.fail_fast AND failed)
           OR NOT EXISTS (SELECT 1 FROM awooop_run_state c
                           WHERE c.run_id = ANY(w.child_ids) AND c.run_id <> NEW.run_id
                             AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')) THEN
            PERFORM awooop_end_wait(w.wait_id, 'completed',
                                    jsonb_build_object('ended_by', NEW.run_id, 'status', NEW.status,
                                                       'fail_fast', w.fail_fast AND failed),
                                    'system:children', NULL);
            IF w.fail_fast AND failed THEN
                PERFORM awooop_cancel_children(NEW.parent_run_id, w.child_ids, 'system:fail-fast',
                                               'fail-fast: sibling ' || NEW.run_id || ' ended ' || NEW.status);
            END IF;
        END IF;
    END LOOP;
    IF NOT failed THEN
        SELECT p.status INTO parent_status FROM awooop_run_state p WHERE p.run_id = NEW.parent_run_id;
        IF parent_status IN ('FAILED', 'CANCELLED') THEN
            PERFORM awooop_request_parent_ended(NEW.parent_run_id, parent_status, ARRAY[NEW.run_id]);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
