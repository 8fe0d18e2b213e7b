-- A run's last seq is read as the newest row of the primary key (run_id, seq), ORDER BY seq DESC
-- LIMIT 1, in functions that price sequential scans out. PL/pgSQL plans each statement once per
-- connection and keeps the plan, and migration 0180's max(seq) left the plan's shape to the
-- statistics of that moment. A connection that first ran these functions while awooop_run_event
-- was empty or small (a new install; any database right after VACUUM ANALYZE) kept one of two
-- plans that read more than the newest row, until the table's statistics next changed (an
-- autovacuum analyze; a short busy start never reached one):
-- - a sequential scan of the whole log: every claim and completion read it (a fresh bench
--   database: 20,000 claim cycles read 148 million log rows in 10,000 scans, 697 runs/s against
--   1,363 with the probe by index);
-- - an aggregate over every row of the run in the index: each append read the run's whole log,
--   so a long journal's steps grew dearer with its length (0.39 ms an append at the start of a
--   run, 1.0 ms at 1,600 rows).
-- ORDER BY ... LIMIT 1 over the key's order is the backward index probe in every plan; with
-- sequential scans priced out, the index is taken whatever the statistics said (a scan of the
-- trigger's transition table is not a sequential scan and is unaffected). A later CREATE OR
-- REPLACE of these functions must keep both.

CREATE OR REPLACE FUNCTION awooop_append_run_event(
    p_run_id UUID, p_project_id TEXT, p_source TEXT, p_kind TEXT, p_data JSONB, p_attempt INT,
    p_emit_key TEXT DEFAULT NULL, p_progress_no INT DEFAULT NULL, p_progress_bytes BIGINT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    next_seq BIGINT;
    written BIGINT;
BEGIN
    LOOP
        next_seq := COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = p_run_id
                               ORDER BY e.seq DESC LIMIT 1), 0) + 1;
        INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, emit_key,
                                      progress_no, progress_bytes)
        VALUES (p_run_id, next_seq, p_project_id, p_source, COALESCE(p_kind, ''), COALESCE(p_data, '{}'),
                COALESCE(p_attempt, 0), p_emit_key, p_progress_no, p_progress_bytes)
        ON CONFLICT (run_id, seq) DO NOTHING
        RETURNING seq INTO written;
        EXIT WHEN written IS NOT NULL;
    END LOOP;
    IF EXISTS (SELECT 1 FROM awooop_run_watch WHERE run_id = p_run_id AND watched_until > now()) THEN
        PERFORM pg_notify('awooop_run_event', p_run_id::text);
    END IF;
    RETURN written;
END $$;

CREATE OR REPLACE FUNCTION awooop_run_events_from_audit() RETURNS trigger LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    missed RECORD;
BEGIN
    FOR missed IN
        WITH rows AS (
            SELECT n.audit_id, n.run_id, n.project_id, n.action,
                   jsonb_strip_nulls(jsonb_build_object(
                       'action', n.action, 'from_status', n.from_status, 'to_status', n.to_status,
                       'actor', n.actor, 'reason', n.reason, 'details', n.details)) AS data,
                   CASE WHEN jsonb_typeof(n.details -> 'attempt') = 'number'
                        THEN LEAST(GREATEST((n.details ->> 'attempt')::numeric, 0), 2147483647)::int ELSE 0 END
                       AS attempt,
                   row_number() OVER (PARTITION BY n.run_id ORDER BY n.audit_id) AS k
              FROM new_rows n
             WHERE n.run_id IS NOT NULL
        ), numbered AS (
            SELECT r.*, COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = r.run_id
                                   ORDER BY e.seq DESC LIMIT 1), 0) + r.k AS seq
              FROM rows r
        ), ins AS (
            INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt)
            SELECT run_id, seq, project_id, 'state', action, data, attempt FROM numbered
            ON CONFLICT (run_id, seq) DO NOTHING
            RETURNING run_id, seq
        )
        SELECT nb.run_id, nb.project_id, nb.action, nb.data, nb.attempt
          FROM numbered nb
         WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.run_id = nb.run_id AND ins.seq = nb.seq)
         ORDER BY nb.audit_id
    LOOP
        PERFORM awooop_append_run_event(missed.run_id, missed.project_id, 'state', missed.action, missed.data,
                                        missed.attempt);
    END LOOP;
    PERFORM pg_notify('awooop_run_event', w.run_id::text)
       FROM awooop_run_watch w
      WHERE w.run_id IN (SELECT n.run_id FROM new_rows n) AND w.watched_until > now();
    RETURN NULL;
END $$;

-- EmitEvent's function reads the run's last progress row ORDER BY seq DESC LIMIT 1 already; its
-- lookups get the same protection from a plan made on an empty log.
ALTER FUNCTION awooop_emit_run_event(UUID, INT, TEXT[], TEXT, JSONB, TEXT, INT, BIGINT) SET enable_seqscan = off;
