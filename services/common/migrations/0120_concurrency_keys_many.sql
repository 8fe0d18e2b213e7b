-- Several concurrency keys per run (docs/flow-control.md): a run is claimed only when every one
-- of its limited keys has a free slot and starts left in its rate window.
--
-- The keys are an array on the run (sorted, distinct, at most 8: checked by the services,
-- services/common/run_options.py), not a child table: the claim reads them with the picked row it
-- already holds, and nothing else looks runs up by one of their keys except the wake-up of parked
-- runs. For that a parked run names the one key it waits on (wait_key: a key that was full, or out
-- of starts, when the claim parked it), and a btree index finds the parked runs of a key in claim
-- order, so a release wakes the oldest of them with a LIMIT (a GIN index on the array could find
-- them too, but not in order: every release would sort all of the key's parked runs). A woken run
-- that another of its keys still blocks is parked again, on that key, by the claim that finds it
-- so; that claim then passes the wake-up on (claiming.KEY_SLOTS), so no free slot is left behind a
-- parked run.
ALTER TABLE awooop_run_state
    ADD COLUMN concurrency_keys VARCHAR(128)[] CHECK (cardinality(concurrency_keys) BETWEEN 1 AND 8),
    ADD COLUMN wait_key VARCHAR(128);

UPDATE awooop_run_state
   SET concurrency_keys = ARRAY[concurrency_key],
       wait_key = CASE WHEN wait_reason IN ('key_busy', 'rate_limited') THEN concurrency_key END
 WHERE concurrency_key IS NOT NULL;

DROP TRIGGER awooop_run_release_concurrency_slot ON awooop_run_state;
DROP INDEX awooop_run_parked_idx;
ALTER TABLE awooop_run_state DROP COLUMN concurrency_key;
-- the claim computes its grants before it writes them (claiming.KEY_SLOTS)
ALTER TABLE awooop_concurrency_limit DROP COLUMN granted;

CREATE INDEX awooop_run_parked_idx ON awooop_run_state (project_id, wait_key, priority DESC, created_at)
    WHERE status IN ('PENDING', 'RESUMED') AND not_before = 'infinity';

-- When a run with keys leaves its lease: each of its keys gets its slot back and wakes as many of
-- the runs parked on it as it has free slots, with a wake-up NOTIFY, in the same transaction as the
-- change. The key rows are locked in key order, as the claim locks them, so a release and a claim
-- sharing keys never wait for each other in a cycle.
CREATE OR REPLACE FUNCTION awooop_release_concurrency_slot() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k RECORD;
    woken INT := 0;
    n INT;
BEGIN
    IF cardinality(NEW.concurrency_keys) > 1 THEN
        PERFORM 1 FROM awooop_concurrency_limit
          WHERE project_id = NEW.project_id AND key = ANY(NEW.concurrency_keys)
          ORDER BY key
            FOR UPDATE;
    END IF;
    FOR k IN
        UPDATE awooop_concurrency_limit
           SET running = greatest(running - 1, 0)
         WHERE project_id = NEW.project_id AND key = ANY(NEW.concurrency_keys)
        RETURNING key, max_running - running AS free
    LOOP
        IF k.free > 0 THEN
            WITH w AS (
                UPDATE awooop_run_state r
                   SET not_before = NULL, wait_reason = NULL, wait_key = NULL
                 WHERE r.run_id IN (SELECT p.run_id FROM awooop_run_state p
                                     WHERE p.project_id = NEW.project_id AND p.wait_key = k.key
                                       AND p.status IN ('PENDING', 'RESUMED') AND p.not_before = 'infinity'
                                     ORDER BY p.priority DESC, p.created_at
                                     LIMIT k.free
                                       FOR UPDATE SKIP LOCKED)
                RETURNING r.run_id
            )
            SELECT count(*) INTO n FROM w;
            woken := woken + n;
        END IF;
    END LOOP;
    IF woken > 0 THEN
        PERFORM pg_notify('awooop_run_ready', NEW.project_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_run_release_concurrency_slot
    AFTER UPDATE OF status ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.concurrency_keys IS NOT NULL
          AND OLD.status IN ('RUNNING', 'WAITING_TOOL')
          AND NEW.status NOT IN ('RUNNING', 'WAITING_TOOL'))
    EXECUTE FUNCTION awooop_release_concurrency_slot();
