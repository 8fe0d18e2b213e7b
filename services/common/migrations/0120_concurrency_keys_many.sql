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
-- so; that claim then passes the wake-up on (awooop_grant_keys below), so no free slot is left
-- behind a parked run.
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

-- The keys' part of a claim statement (services/scheduler/claiming.py, KEY_SLOTS): the picked runs
-- that carry keys, in claim order (run ids, their projects, their sorted keys joined by spaces;
-- keys are tokens without spaces). Returns the runs it did not grant, each with the key it is to
-- wait on and, when that key is out of starts, the end of its window (the claim parks them).
--
-- The limited keys' rows are locked first, in (project, key) order: the release trigger locks a
-- run's keys in that order too, and CompleteRuns (with or without a claim) locks all its runs'
-- keys in one ordered pass first (batch_complete.complete_ctes); the reaper and a hand-back,
-- which release several runs one after the other, run again when aborted as a deadlock
-- (services/common/db.fetch_again_on_deadlock). A greedy pass
-- in claim order then grants a run only when each of its limited keys can still grant (a free
-- slot, and starts left in its rate window), taking one of each; runs of different projects never
-- share a key. The keys' new counts are written before it returns, all in the claim's statement.
-- A plpgsql function, not CTEs: a claim without keys never calls it (STRICT, NULL arrays), so it
-- costs that claim nothing, and the pass is a loop over at most max_runs runs. When the runs carry
-- one key between them (the common case: one key per run, and the picked runs share it) the pass
-- is one UPDATE that grants the key's room to the first runs, as the claim did before 0120.
--
-- Windows are fixed and timed by clock_timestamp() once the key row is locked, not by the
-- transaction's start: a claim that waited for the lock must not count itself into a window that
-- already ended.
CREATE FUNCTION awooop_grant_keys(runs uuid[], projects text[], keys text[])
RETURNS TABLE (b_run uuid, b_key text, b_until timestamptz)
-- ROWS: few are refused; with the default estimate (1000) the claim's generic plan would park
-- them by a hash join over every run instead of primary-key probes
LANGUAGE plpgsql STRICT ROWS 1 AS $$
DECLARE
    l RECORD;
    lk text[] := '{}';           -- limited keys as 'project key'
    lproj text[] := '{}';
    lkey text[] := '{}';
    cap int[] := '{}';           -- what each can still grant
    cap0 int[] := '{}';          -- ... before this claim
    used int[] := '{}';          -- starts in its window before this claim
    wstart timestamptz[] := '{}';
    oldstart timestamptz[] := '{}';
    maxr int[] := '{}';
    maxs int[] := '{}';
    per interval[] := '{}';
    fresh boolean;
    j int;
    i int;
    k text;
    idx int[];
    ok boolean;
    refused int[] := '{}';
    n int;
BEGIN
    IF strpos(keys[1], ' ') = 0 AND keys = array_fill(keys[1], ARRAY[cardinality(keys)])
       AND projects = array_fill(projects[1], ARRAY[cardinality(projects)]) THEN
        -- the sub-select reads the locked row (after any wait for its lock) once per claim
        UPDATE awooop_concurrency_limit c
           SET (granted, running, window_start, window_starts) = (
                SELECT g.n, c.running + g.n, w.start, w.used + g.n
                  FROM (SELECT c.rate_period IS NOT NULL
                               AND (c.window_start IS NULL OR clock_timestamp() >= c.window_start + c.rate_period)
                               AS fresh) f,
                       LATERAL (SELECT CASE WHEN f.fresh THEN clock_timestamp() ELSE c.window_start END AS start,
                                       CASE WHEN f.fresh THEN 0 ELSE c.window_starts END AS used) w,
                       LATERAL (SELECT greatest(0, least(cardinality(runs), c.max_running - c.running,
                                                         c.max_starts - w.used)) AS n) g)
         WHERE c.project_id = projects[1] AND c.key = keys[1]
        RETURNING c.granted, CASE WHEN c.window_starts >= c.max_starts THEN c.window_start + c.rate_period END
             INTO n, b_until;
        IF FOUND THEN
            b_key := keys[1];
            FOR j IN n + 1 .. cardinality(runs) LOOP
                b_run := runs[j];
                RETURN NEXT;
            END LOOP;
        END IF;
        RETURN;
    END IF;
    FOR l IN
        SELECT c.project_id, c.key, c.max_running, c.running, c.max_starts, c.rate_period, c.window_start,
               c.window_starts
          FROM awooop_concurrency_limit c
         WHERE (c.project_id, c.key) IN (SELECT projects[r], u.key
                                          FROM generate_subscripts(runs, 1) AS r,
                                               unnest(string_to_array(keys[r], ' ')) AS u(key))
         ORDER BY c.project_id, c.key
           FOR UPDATE
    LOOP
        fresh := l.rate_period IS NOT NULL
                 AND (l.window_start IS NULL OR clock_timestamp() >= l.window_start + l.rate_period);
        lk := lk || (l.project_id || ' ' || l.key);
        lproj := lproj || l.project_id::text;
        lkey := lkey || l.key::text;
        used := used || CASE WHEN fresh THEN 0 ELSE l.window_starts END;
        wstart := wstart || CASE WHEN fresh THEN clock_timestamp() ELSE l.window_start END;
        oldstart := oldstart || l.window_start;
        cap := cap || greatest(0, least(l.max_running - l.running, l.max_starts - used[cardinality(used)]));
        maxr := maxr || l.max_running;
        maxs := maxs || l.max_starts;
        per := per || l.rate_period;
    END LOOP;
    IF cardinality(lk) = 0 THEN
        RETURN;
    END IF;
    cap0 := cap;
    FOR j IN 1 .. cardinality(runs) LOOP
        idx := '{}';
        ok := true;
        FOREACH k IN ARRAY string_to_array(keys[j], ' ') LOOP
            i := array_position(lk, projects[j] || ' ' || k);
            IF i IS NOT NULL THEN
                idx := idx || i;
                ok := ok AND cap[i] > 0;
            END IF;
        END LOOP;
        IF ok THEN
            FOREACH i IN ARRAY idx LOOP
                cap[i] := cap[i] - 1;
            END LOOP;
        ELSE
            refused := refused || j;
        END IF;
    END LOOP;
    FOR i IN 1 .. cardinality(lk) LOOP
        IF cap0[i] > cap[i] OR wstart[i] IS DISTINCT FROM oldstart[i] THEN
            UPDATE awooop_concurrency_limit
               SET running = running + (cap0[i] - cap[i]), window_start = wstart[i],
                   window_starts = used[i] + (cap0[i] - cap[i])
             WHERE project_id = lproj[i] AND key = lkey[i];
        END IF;
    END LOOP;
    -- a run not granted waits on its first key that the claim leaves full (a release of it, or
    -- the end of its window, wakes the run)
    FOREACH j IN ARRAY refused LOOP
        FOREACH k IN ARRAY string_to_array(keys[j], ' ') LOOP
            i := array_position(lk, projects[j] || ' ' || k);
            IF i IS NOT NULL AND cap[i] = 0 THEN
                b_run := runs[j];
                b_key := k;
                b_until := CASE WHEN used[i] + (cap0[i] - cap[i]) >= maxs[i] THEN wstart[i] + per[i] END;
                RETURN NEXT;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    -- A run refused here for another key may have been woken for one of its keys that still
    -- has free slots: that key's wake-up passes on to as many of the runs parked on it.
    FOR i IN 1 .. cardinality(lk) LOOP
        CONTINUE WHEN cap[i] = 0 OR maxr[i] IS NULL OR cardinality(refused) = 0;
        SELECT count(*) INTO n FROM unnest(refused) AS r(pos)
         WHERE lkey[i] = ANY(string_to_array(keys[r.pos], ' ')) AND projects[r.pos] = lproj[i];
        CONTINUE WHEN n = 0;
        UPDATE awooop_run_state s
           SET not_before = NULL, wait_reason = NULL, wait_key = NULL
         WHERE s.run_id IN (SELECT p.run_id FROM awooop_run_state p
                             WHERE p.project_id = lproj[i] AND p.wait_key = lkey[i]
                               AND p.status IN ('PENDING', 'RESUMED') AND p.not_before = 'infinity'
                             ORDER BY p.priority DESC, p.created_at
                             LIMIT least(n, cap[i])
                               FOR UPDATE SKIP LOCKED);
        IF FOUND THEN
            PERFORM pg_notify('awooop_run_ready', lproj[i]);
        END IF;
    END LOOP;
END $$;
