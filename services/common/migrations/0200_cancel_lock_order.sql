-- A parent's cancel takes its tree's locks in the order a child's end takes them (issue 28;
-- docs/architecture.md "Child runs", lock order).
--
-- A statement that ends a child holds the child's row first (it is the row it updates); the
-- child's trigger (awooop_child_ended, migration 0190) then locks the parent's open children wait
-- and, in awooop_end_wait, the parent. CancelRun of a parent held the parent first and then, in
-- its cascade (awooop_parent_ended -> awooop_cancel_children), each child: when the last child
-- ended at that moment, each transaction waited for the other's lock and Postgres aborted one
-- after deadlock_timeout (UNAVAILABLE, retried). The child cannot be locked later by its own end,
-- so the cancel takes the tree's locks first, in the child's order, before it locks the parent:
-- the deepest level first; at each level the open children waits of its runs (wait_id order),
-- then its runs (run_id order, as awooop_cancel_children, the heartbeat and CompleteRuns lock
-- runs). So a run's children come before its wait, and its wait before the run, everywhere: a
-- child ending meanwhile either holds its row before the cancel asks for it (the cancel waits,
-- holding nothing the child's end needs: only other children and deeper levels) or waits for the
-- cancel to commit before it starts. The wait sweep and the parks (wait, then run) keep that
-- order too.
--
-- The tree taken is the one the cascade will write: the run, its unfinished children, and, below
-- each child the cascade ends at once (not leased: queued, parked), that child's unfinished
-- children, and so on; a leased child is only asked to cancel, so its own children are not
-- touched. Read in a fresh snapshot (a VOLATILE function's statement); a row that ended since is
-- skipped when its lock is granted. The run itself is locked by the caller (CancelRun's `cur`,
-- services/scheduler/fenced_writes.sql), right after this returns (true, for its WHERE).
CREATE FUNCTION awooop_lock_run_tree(p_run_id UUID) RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    lvl RECORD;
BEGIN
    FOR lvl IN
        WITH RECURSIVE tree AS (
            SELECT p_run_id AS run_id, 0 AS depth, true AS cascades
            UNION ALL
            SELECT c.run_id, t.depth + 1, NOT (c.status IN ('RUNNING', 'WAITING_TOOL') AND c.worker_id IS NOT NULL)
              FROM tree t JOIN awooop_run_state c ON c.parent_run_id = t.run_id
             WHERE t.cascades AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
        )
        SELECT depth, array_agg(run_id) AS runs, array_agg(run_id) FILTER (WHERE cascades) AS owners
          FROM tree
         GROUP BY depth
         ORDER BY depth DESC
    LOOP
        PERFORM 1 FROM awooop_wait w
          WHERE w.run_id = ANY(lvl.owners) AND w.kind = 'children' AND w.status = 'open'
          ORDER BY w.wait_id
            FOR UPDATE;
        IF lvl.depth > 0 THEN
            PERFORM 1 FROM awooop_run_state r
              WHERE r.run_id = ANY(lvl.runs) AND r.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
              ORDER BY r.run_id
                FOR UPDATE;
        END IF;
    END LOOP;
    RETURN true;
END
$$;
