-- A run parked on a durable wait gives its concurrency key slots back (docs/flow-control.md: a run
-- holds a slot of each of its keys until it leaves its lease; parking leaves the lease). The
-- trigger of migrations 0111/0120 gave a slot back only when the run's status left RUNNING and
-- WAITING_TOOL, and a parked run is WAITING_TOOL without a worker, so it kept its slots for as
-- long as it waited: another run with the key waited behind a run that held no lease, and a parent
-- whose children carry its key (a limit of 1) waited for children that could never start.
--
-- Leased means what awooop_run_leased_idx (migration 0161) means: RUNNING or WAITING_TOOL with a
-- worker. The trigger now fires when a run goes from leased to not leased: an end, a hand-back, a
-- reap, an approval's wait, and a park (status WAITING_TOOL, worker_id NULL, one statement). A
-- parked run whose wait ends goes back to PENDING without a slot to give back, and takes its slots
-- again through the claim, as any queued run. Same trigger name: triggers on a table fire in name
-- order, and this one's place among them does not change.
DROP TRIGGER awooop_run_release_concurrency_slot ON awooop_run_state;
CREATE TRIGGER awooop_run_release_concurrency_slot
    AFTER UPDATE OF status, worker_id ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.concurrency_keys IS NOT NULL
          AND OLD.status IN ('RUNNING', 'WAITING_TOOL') AND OLD.worker_id IS NOT NULL
          AND (NEW.status NOT IN ('RUNNING', 'WAITING_TOOL') OR NEW.worker_id IS NULL))
    EXECUTE FUNCTION awooop_release_concurrency_slot();

-- The slots the runs parked before this migration still hold: every key's count is its leased
-- runs again (the key rows locked in (project, key) order, as a claim locks them), and the runs
-- parked on a key with room are queued again (a claim parks again what another key still blocks).
SELECT 1 FROM awooop_concurrency_limit ORDER BY project_id, key FOR UPDATE;
UPDATE awooop_concurrency_limit l
   SET running = (SELECT count(*) FROM awooop_run_state r
                   WHERE r.project_id = l.project_id AND l.key = ANY(r.concurrency_keys)
                     AND r.status IN ('RUNNING', 'WAITING_TOOL') AND r.worker_id IS NOT NULL);
WITH woken AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE r.status IN ('PENDING', 'RESUMED') AND r.not_before = 'infinity' AND r.wait_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM awooop_concurrency_limit l
                    WHERE l.project_id = r.project_id AND l.key = r.wait_key
                      AND (l.max_running IS NULL OR l.running < l.max_running))
    RETURNING r.project_id
)
SELECT pg_notify('awooop_run_ready', project_id) FROM (SELECT DISTINCT project_id FROM woken) p;
