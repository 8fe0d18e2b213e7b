-- Compact state rows (issue 43). Since 0350 a run's history is its log's state rows, and each
-- kept its change as one JSON object: {"action", "from_status", "to_status", "actor", "reason",
-- "details"}. Every row spelled out those keys, and the action twice (it is the row's kind): about
-- 70 of a state row's 270 bytes, three rows per run.
--
-- The statuses, actor and reason are columns now, and a state row's data is its details alone.
-- What a reader sees is unchanged: WatchRun's stream builds the JSON it served before from the
-- columns (services/scheduler/run_events.py, LogRow), and the audit view reads them. A state row
-- written before this migration has no actor column and keeps its JSON; the actor (NOT NULL in
-- the audit log since 0001) tells the two forms apart.

ALTER TABLE awooop_run_event
    ADD COLUMN actor VARCHAR(160),
    ADD COLUMN from_status VARCHAR(32),
    ADD COLUMN to_status VARCHAR(32),
    ADD COLUMN reason TEXT;

-- a state row written from now on is the compact form (NOT VALID: the older rows are the JSON form)
ALTER TABLE awooop_run_event ADD CONSTRAINT awooop_run_event_history_actor
    CHECK (audit_id IS NULL OR actor IS NOT NULL) NOT VALID;

-- the attempt a history row's details name (0 when they name none), the log row's attempt column
CREATE FUNCTION awooop_history_attempt(p_details JSONB) RETURNS INT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_details -> 'attempt') = 'number'
                THEN LEAST(GREATEST((p_details ->> 'attempt')::numeric, 0), 2147483647)::int ELSE 0 END
$$;

-- the one append (0350) writes a state row's columns too
DROP FUNCTION awooop_append_run_event(UUID, TEXT, TEXT, TEXT, JSONB, INT, TEXT, INT, BIGINT, BIGINT);
CREATE FUNCTION awooop_append_run_event(
    p_run_id UUID, p_project_id TEXT, p_source TEXT, p_kind TEXT, p_data JSONB, p_attempt INT,
    p_emit_key TEXT DEFAULT NULL, p_progress_no INT DEFAULT NULL, p_progress_bytes BIGINT DEFAULT NULL,
    p_audit_id BIGINT DEFAULT NULL, p_actor TEXT DEFAULT NULL, p_from_status TEXT DEFAULT NULL,
    p_to_status TEXT DEFAULT NULL, p_reason TEXT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    next_seq BIGINT;
    written BIGINT;
BEGIN
    LOOP
        next_seq := COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = p_run_id
                               ORDER BY e.seq DESC LIMIT 1), 0) + 1;
        INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, emit_key,
                                      progress_no, progress_bytes, audit_id, actor, from_status, to_status, reason)
        VALUES (p_run_id, next_seq, p_project_id, p_source, COALESCE(p_kind, ''), COALESCE(p_data, '{}'),
                COALESCE(p_attempt, 0), p_emit_key, p_progress_no, p_progress_bytes, p_audit_id, p_actor,
                p_from_status, p_to_status, p_reason)
        ON CONFLICT (run_id, seq) DO NOTHING
        RETURNING seq INTO written;
        EXIT WHEN written IS NOT NULL;
    END LOOP;
    IF EXISTS (SELECT 1 FROM awooop_run_watch WHERE run_id = p_run_id AND watched_until > now()) THEN
        PERFORM pg_notify('awooop_run_event', p_run_id::text);
    END IF;
    RETURN written;
END $$;

-- 0350's writer, its state rows in the compact form
CREATE OR REPLACE FUNCTION awooop_record_history(p_rows awooop_history_row[]) RETURNS INT
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    missed RECORD;
BEGIN
    IF COALESCE(cardinality(p_rows), 0) = 0 THEN  -- a claim that found nothing: no statement at all
        RETURN 0;
    END IF;
    -- the rows of no run are entries; each run's rows take the next seqs of its log in one INSERT.
    -- A seq taken meanwhile by a concurrent writer of the same run (a step's row) sends that row
    -- to the one append, which tries the next seq until one is free.
    FOR missed IN
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
        ), ins AS (
            INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, audit_id,
                                          actor, from_status, to_status, reason)
            SELECT run_id, seq, project_id, 'state', action, details, attempt, audit_id,
                   actor, from_status, to_status, reason
              FROM numbered
            ON CONFLICT (run_id, seq) DO NOTHING
            RETURNING run_id, seq
        )
        SELECT nb.* FROM numbered nb
         WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.run_id = nb.run_id AND ins.seq = nb.seq)
         ORDER BY nb.ord
    LOOP
        PERFORM awooop_append_run_event(missed.run_id, missed.project_id, 'state', missed.action, missed.details,
                                        missed.attempt, p_audit_id => missed.audit_id, p_actor => missed.actor,
                                        p_from_status => missed.from_status, p_to_status => missed.to_status,
                                        p_reason => missed.reason);
    END LOOP;
    PERFORM pg_notify('awooop_run_event', w.run_id::text)
       FROM awooop_run_watch w
      WHERE w.run_id IN (SELECT h.run_id FROM unnest(p_rows) h) AND w.watched_until > now();
    RETURN cardinality(p_rows);
END $$;

-- 0350's view, reading a compact state row's columns and an older one's JSON
CREATE OR REPLACE VIEW awooop_audit_log AS
SELECT a.audit_id, a.project_id, a.run_id, a.actor, a.action, a.from_status, a.to_status, a.reason, a.details,
       a.created_at
  FROM awooop_audit_entry a
UNION ALL
SELECT e.audit_id, e.project_id, e.run_id, COALESCE(e.actor, e.data ->> 'actor')::varchar(160), e.kind::varchar(64),
       (CASE WHEN e.actor IS NULL THEN e.data ->> 'from_status' ELSE e.from_status END)::varchar(32),
       (CASE WHEN e.actor IS NULL THEN e.data ->> 'to_status' ELSE e.to_status END)::varchar(32),
       CASE WHEN e.actor IS NULL THEN e.data ->> 'reason' ELSE e.reason END,
       CASE WHEN e.actor IS NULL THEN e.data -> 'details' ELSE e.data END, e.created_at
  FROM awooop_run_event e
 WHERE e.audit_id IS NOT NULL;
