-- A step's row in the run log no longer repeats its status and attempt in its data (issue 43).
--
-- The row's kind is the step's status and its attempt column the step's attempt, and data held
-- both again: 48 of a step row's bytes. WatchRun's reader puts them back
-- (services/scheduler/run_events.py, step_data), so a watcher reads the object it read before, in
-- the same key order; a step row written before this migration has them already, and reads the
-- same.

-- 0180's trigger of the journal
CREATE OR REPLACE FUNCTION awooop_run_event_from_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status THEN
        RETURN NULL;
    END IF;
    PERFORM awooop_append_run_event(
        NEW.run_id, NEW.project_id, 'step', NEW.status,
        jsonb_strip_nulls(jsonb_build_object(
            'step_id', NEW.step_id, 'step_type', NEW.step_type, 'tool_id', NEW.tool_id, 'error', NEW.error)),
        NEW.attempt);
    RETURN NULL;
END $$;
