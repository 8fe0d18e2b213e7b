-- The run log's rows are written by plain INSERTs, not INSERT ... ON CONFLICT (issue 43).
--
-- A speculative insertion (ON CONFLICT) logs a confirmation record after its row: 48 bytes of
-- WAL, four times a run (three state rows and a step row). The log's key (run_id, seq) is taken
-- twice only when two writers of one run pick the same next seq at once, which the run's row
-- lock rules out for most of them (a step written beside another step of the same run, under two
-- FOR SHARE locks, is the usual case). So the INSERT is tried plainly, in a block that catches a
-- unique violation of that key alone (the block is a subtransaction: it logs nothing of its own),
-- and a caught one takes the next seq, as the ON CONFLICT loop did.

-- 0360's one append
CREATE OR REPLACE FUNCTION awooop_append_run_event(
    p_run_id UUID, p_project_id TEXT, p_source TEXT, p_kind TEXT, p_data JSONB, p_attempt INT,
    p_emit_key TEXT DEFAULT NULL, p_progress_no INT DEFAULT NULL, p_progress_bytes BIGINT DEFAULT NULL,
    p_audit_id BIGINT DEFAULT NULL, p_actor TEXT DEFAULT NULL, p_from_status TEXT DEFAULT NULL,
    p_to_status TEXT DEFAULT NULL, p_reason TEXT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    next_seq BIGINT;
    taken TEXT;
BEGIN
    LOOP
        next_seq := COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = p_run_id
                               ORDER BY e.seq DESC LIMIT 1), 0) + 1;
        BEGIN
            INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, emit_key,
                                          progress_no, progress_bytes, audit_id, actor, from_status, to_status,
                                          reason)
            VALUES (p_run_id, next_seq, p_project_id, p_source, COALESCE(p_kind, ''), COALESCE(p_data, '{}'),
                    COALESCE(p_attempt, 0), p_emit_key, p_progress_no, p_progress_bytes, p_audit_id, p_actor,
                    p_from_status, p_to_status, p_reason);
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            GET STACKED DIAGNOSTICS taken = CONSTRAINT_NAME;
            IF taken IS DISTINCT FROM 'awooop_run_event_pkey' THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    IF EXISTS (SELECT 1 FROM awooop_run_watch WHERE run_id = p_run_id AND watched_until > now()) THEN
        PERFORM pg_notify('awooop_run_event', p_run_id::text);
    END IF;
    RETURN next_seq;
END $$;

-- 0360's writer of history rows
CREATE OR REPLACE FUNCTION awooop_record_history(p_rows awooop_history_row[]) RETURNS INT
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    missed RECORD;
    taken TEXT;
BEGIN
    IF COALESCE(cardinality(p_rows), 0) = 0 THEN  -- a claim that found nothing: no statement at all
        RETURN 0;
    END IF;
    -- the rows of no run are entries; each run's rows take the next seqs of its log in one INSERT
    BEGIN
        WITH entries AS (
            INSERT INTO awooop_audit_entry (project_id, actor, action, from_status, to_status, reason, details)
            SELECT h.project_id, h.actor, h.action, h.from_status, h.to_status, h.reason, COALESCE(h.details, '{}')
              FROM unnest(p_rows) WITH ORDINALITY AS h
             WHERE h.run_id IS NULL
             ORDER BY h.ordinality
        ), rows AS MATERIALIZED (
            SELECT nextval('awooop_audit_log_audit_id_seq') AS audit_id, h.ordinality AS ord, h.run_id,
                   h.project_id, h.actor, h.action, h.from_status, h.to_status, h.reason,
                   COALESCE(h.details, '{}') AS details, awooop_history_attempt(h.details) AS attempt
              FROM unnest(p_rows) WITH ORDINALITY AS h
             WHERE h.run_id IS NOT NULL
             ORDER BY h.ordinality
        ), numbered AS (
            SELECT r.*, COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = r.run_id
                                   ORDER BY e.seq DESC LIMIT 1), 0)
                        + row_number() OVER (PARTITION BY r.run_id ORDER BY r.ord) AS seq
              FROM rows r
        )
        INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, audit_id,
                                      actor, from_status, to_status, reason)
        SELECT run_id, seq, project_id, 'state', action, details, attempt, audit_id,
               actor, from_status, to_status, reason
          FROM numbered;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS taken = CONSTRAINT_NAME;
        IF taken IS DISTINCT FROM 'awooop_run_event_pkey' THEN
            RAISE;
        END IF;
        -- a concurrent writer of one of these runs (a step's row) took a seq first: the block's
        -- rows are undone, and written again one at a time, each run's through the one append
        INSERT INTO awooop_audit_entry (project_id, actor, action, from_status, to_status, reason, details)
        SELECT h.project_id, h.actor, h.action, h.from_status, h.to_status, h.reason, COALESCE(h.details, '{}')
          FROM unnest(p_rows) WITH ORDINALITY AS h
         WHERE h.run_id IS NULL
         ORDER BY h.ordinality;
        FOR missed IN SELECT * FROM unnest(p_rows) WITH ORDINALITY AS u WHERE u.run_id IS NOT NULL
                       ORDER BY u.ordinality
        LOOP
            PERFORM awooop_append_run_event(missed.run_id, missed.project_id, 'state', missed.action,
                                            COALESCE(missed.details, '{}'), awooop_history_attempt(missed.details),
                                            p_audit_id => nextval('awooop_audit_log_audit_id_seq'),
                                            p_actor => missed.actor, p_from_status => missed.from_status,
                                            p_to_status => missed.to_status, p_reason => missed.reason);
        END LOOP;
    END;
    PERFORM pg_notify('awooop_run_event', w.run_id::text)
       FROM awooop_run_watch w
      WHERE w.run_id IN (SELECT u.run_id FROM unnest(p_rows) u) AND w.watched_until > now();
    RETURN cardinality(p_rows);
END $$;
