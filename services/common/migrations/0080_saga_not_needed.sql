-- Truthful saga statuses: a run that ended with nothing to undo says `not_needed` instead of
-- staying `in_progress` forever.
--
-- COMPLETED runs get it in the completing statement itself (services/scheduler/fragments.py
-- complete_set). FAILED and CANCELLED runs reach their end through many statements (FailRun, the
-- reaper, cancel, approval reject and expiry); this trigger decides for all of them, in the same
-- statement, with the same test the statements use to record a compensation request
-- (fragments.HAS_COMPENSATABLE_STEPS): no completed step with a compensation command means no
-- request and nothing to undo. The WHEN clause keeps the trigger off every other update
-- (heartbeats, claims, completions).

ALTER TABLE awooop_run_state DROP CONSTRAINT awooop_run_state_saga_status_check;
ALTER TABLE awooop_run_state ADD CONSTRAINT awooop_run_state_saga_status_check
    CHECK (saga_status IN ('in_progress', 'not_needed', 'compensating', 'compensated', 'compensation_failed'));

CREATE FUNCTION awooop_saga_not_needed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM awooop_saga_step s
                    WHERE s.run_id = NEW.run_id AND s.status = 'completed'
                      AND s.compensation_cmd IS NOT NULL AND s.compensation_cmd <> 'null'::jsonb) THEN
        NEW.saga_status := 'not_needed';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER awooop_run_saga_not_needed
    BEFORE UPDATE OF status ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.status IN ('FAILED', 'CANCELLED')
          AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND NEW.saga_status = 'in_progress')
    EXECUTE FUNCTION awooop_saga_not_needed();

-- runs that ended before this migration
UPDATE awooop_run_state r
   SET saga_status = 'not_needed'
 WHERE r.saga_status = 'in_progress'
   AND (r.status = 'COMPLETED'
        OR (r.status IN ('FAILED', 'CANCELLED')
            AND NOT EXISTS (SELECT 1 FROM awooop_saga_step s
                             WHERE s.run_id = r.run_id AND s.status = 'completed'
                               AND s.compensation_cmd IS NOT NULL AND s.compensation_cmd <> 'null'::jsonb)
            AND NOT EXISTS (SELECT 1 FROM awooop_compensation_request q
                             WHERE q.run_id = r.run_id AND q.status <> 'done')));
