-- Child runs (issue 28; docs/architecture.md "Child runs"): a run's handler starts runs of its
-- own project (StartChildRuns), parks until they end (a wait of kind 'children'), and the tree
-- cascades: a parent that ends FAILED or CANCELLED cancels its unfinished children and has its
-- finished ones compensated before its own steps.
--
-- parent_run_id, parent_step_id: a child's identity is (parent run, step id), unique per project,
-- so a parent run again from the top after a crash finds its children instead of starting them
-- twice. child_depth: 0 for a root run, the parent's + 1 for a child (the depth limit reads it).
-- child_seq: the order children were started in (a sequence, so a batch keeps its order): the
-- newest child is compensated first.
ALTER TABLE awooop_run_state
    ADD COLUMN parent_run_id  UUID REFERENCES awooop_run_state (run_id) ON DELETE SET NULL,
    ADD COLUMN parent_step_id VARCHAR(128),
    ADD COLUMN child_depth    SMALLINT NOT NULL DEFAULT 0,
    ADD COLUMN child_seq      BIGINT,
    ADD CONSTRAINT awooop_run_state_child_check
        CHECK ((parent_step_id IS NULL) = (child_seq IS NULL) AND (parent_run_id IS NULL OR parent_step_id IS NOT NULL));

CREATE SEQUENCE awooop_child_seq;

-- the identity of a child, and the parent's list of its children (StartChildRuns, GetRun, cascades)
CREATE UNIQUE INDEX awooop_run_child_idx ON awooop_run_state (project_id, parent_run_id, parent_step_id)
    WHERE parent_run_id IS NOT NULL;
-- the cascades' and the compensation claim's lookup of a run's children (every run that ends
-- FAILED or CANCELLED asks; a partial index, so runs without a parent cost nothing)
CREATE INDEX awooop_run_parent_idx ON awooop_run_state (parent_run_id, child_seq) WHERE parent_run_id IS NOT NULL;

-- A wait of kind 'children' ends when its children have all ended (or, fail_fast, when one ended
-- without success): child_ids lists them in the order the handler asked for them.
ALTER TABLE awooop_wait DROP CONSTRAINT awooop_wait_kind_check;
ALTER TABLE awooop_wait ADD CONSTRAINT awooop_wait_kind_check CHECK (kind IN ('token', 'sleep', 'event', 'children'));
ALTER TABLE awooop_wait
    ADD COLUMN child_ids UUID[],
    ADD COLUMN fail_fast BOOLEAN NOT NULL DEFAULT false,
    ADD CONSTRAINT awooop_wait_children_check CHECK ((kind = 'children') = (child_ids IS NOT NULL));

-- a finished child's compensation requested because its parent ended without success
ALTER TABLE awooop_compensation_request DROP CONSTRAINT awooop_compensation_request_trigger_check;
ALTER TABLE awooop_compensation_request ADD CONSTRAINT awooop_compensation_request_trigger_check
    CHECK (trigger IN ('approval_rejected', 'approval_expired', 'step_failed', 'cancelled', 'manual', 'parent_ended'));

-- A child reached a terminal status: each open 'children' wait of its parent that lists it ends
-- when no other child it lists is unfinished (or at once, fail_fast, when this child did not
-- complete; its unfinished siblings are then cancelled). Runs in the transaction of the statement
-- that ended the child (any of them: CompleteRun(s), FailRun, the reaper, CancelRun, ...), so a
-- child never leaves its parent waiting. The wait row is locked first: two last children ending
-- at once are ordered by it, and the second sees the first's end (each statement of a PL/pgSQL
-- function reads a fresh snapshot under READ COMMITTED). awooop_end_wait then locks the parent
-- (wait before run, its usual order) and re-queues it when it is parked on the wait.
CREATE FUNCTION awooop_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w RECORD;
    failed BOOLEAN := NEW.status <> 'COMPLETED';
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
    RETURN NULL;
END
$$;

CREATE TRIGGER awooop_run_child_ended
    AFTER UPDATE OF status ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION awooop_child_ended();

-- Cancels a parent's unfinished children (all of them, or those in p_only), by CancelRun's rule
-- (services/scheduler/fenced_writes.sql CancelRun, runstate CANCEL): a leased child gets
-- cancel_requested (its worker hears it in the heartbeat reply, or the reaper ends it), any other
-- ends CANCELLED at once, audited, with a compensation request when it has steps to undo. A
-- child that ends here cascades to its own children through the trigger below. Children are
-- locked in run_id order. Returns how many were cancelled or asked to cancel.
CREATE FUNCTION awooop_cancel_children(p_parent UUID, p_only UUID[], p_actor TEXT, p_reason TEXT)
RETURNS INT LANGUAGE plpgsql AS $$
DECLARE
    c RECORD;
    n INT := 0;
    leased BOOLEAN;
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
         WHERE r.run_id = c.run_id;
        INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
        VALUES (c.project_id, c.run_id, p_actor, CASE WHEN leased THEN 'CANCEL_REQUESTED' ELSE 'CANCELLED' END,
                c.status, CASE WHEN leased THEN c.status ELSE 'CANCELLED' END, p_reason,
                jsonb_build_object('attempt', c.attempt_count, 'worker_id', c.worker_id, 'parent_run_id', p_parent));
        IF NOT leased AND EXISTS (SELECT 1 FROM awooop_saga_step s
                                   WHERE s.run_id = c.run_id
                                     AND awooop_step_compensatable(s.step_type, s.compensation_cmd, s.status)) THEN
            INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
            VALUES (c.run_id, c.project_id, 'cancelled', p_reason)
            ON CONFLICT (run_id) DO NOTHING;
            INSERT INTO awooop_audit_log (project_id, run_id, actor, action, reason, details)
            VALUES (c.project_id, c.run_id, p_actor, 'COMPENSATION_REQUESTED', 'cancelled',
                    jsonb_build_object('trigger', 'cancelled'));
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- A parent ended without success (FAILED or CANCELLED, by any statement): its unfinished
-- children are cancelled, and each finished (COMPLETED) descendant reached through finished
-- children that has steps to undo gets a compensation request (trigger parent_ended). The saga
-- driver claims a request only when no request of the run's children is open, and a
-- parent_ended request only when no newer sibling's parent_ended request is open
-- (services/saga/driver.sql ClaimCompensationRequests): children newest first, each child's
-- steps in reverse, then the parent's own steps.
CREATE FUNCTION awooop_parent_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awooop_cancel_children(NEW.run_id, NULL, 'system:parent-ended',
                                   'parent ' || NEW.run_id || ' ended ' || NEW.status);
    WITH RECURSIVE done AS (
        SELECT c.run_id, c.project_id FROM awooop_run_state c
         WHERE c.parent_run_id = NEW.run_id AND c.status = 'COMPLETED'
        UNION ALL
        SELECT c.run_id, c.project_id FROM awooop_run_state c JOIN done d ON c.parent_run_id = d.run_id
         WHERE c.status = 'COMPLETED'
    ),
    req AS (
        INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
        SELECT d.run_id, d.project_id, 'parent_ended', 'parent ' || NEW.run_id || ' ended ' || NEW.status
          FROM done d
         WHERE EXISTS (SELECT 1 FROM awooop_saga_step s
                        WHERE s.run_id = d.run_id AND awooop_step_compensatable(s.step_type, s.compensation_cmd, s.status))
        ON CONFLICT (run_id) DO NOTHING
        RETURNING run_id, project_id
    )
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, reason, details)
    SELECT project_id, run_id, 'system:parent-ended', 'COMPENSATION_REQUESTED', 'parent_ended',
           jsonb_build_object('trigger', 'parent_ended', 'parent_run_id', NEW.run_id)
      FROM req;
    RETURN NULL;
END
$$;

CREATE TRIGGER awooop_run_parent_ended
    AFTER UPDATE OF status ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.status IN ('FAILED', 'CANCELLED') AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION awooop_parent_ended();
