-- One history for a run (issue 43). Every state change of a run was written twice: an audit row
-- (awooop_audit_log) and, by that table's statement trigger (migration 0180), the same change as a
-- state row of the run log (awooop_run_event) that WatchRun and SSE serve. The state row holds all
-- the audit row holds (action, statuses, actor, reason, details, time), so a run's audit rows are
-- now its state rows: about 1.2 KB of WAL per run less (a heap row and two index entries per
-- change, docs/benchmarks.md "One history").
--
-- - awooop_audit_entry (the table renamed) keeps the rows of no run (key and project changes)
--   and every row written before this migration; awooop_audit_log is a view of it and of the run
--   log's state rows that carry an audit_id, so a reader sees the log it saw before.
-- - awooop_record_history(rows) is the one writer: it numbers a statement's rows per run as the
--   trigger did, as a set, and numbers them in the audit order from the audit sequence. The hot
--   statements hand it their rows; the others insert into the view, whose trigger hands it each.
-- - A state row's data keeps the details whole (the trigger stripped their null members too).

ALTER TABLE awooop_audit_log RENAME TO awooop_audit_entry;
DROP TRIGGER awooop_audit_run_events ON awooop_audit_entry;
DROP FUNCTION awooop_run_events_from_audit();

-- the audit order of a state row (NULL: a step or progress row, or a state row from before 0350)
ALTER TABLE awooop_run_event ADD COLUMN audit_id BIGINT;

-- the one append of a log row (0180, 0250) takes a state row's audit_id too; the body is 0250's
DROP FUNCTION awooop_append_run_event(UUID, TEXT, TEXT, TEXT, JSONB, INT, TEXT, INT, BIGINT);
CREATE FUNCTION awooop_append_run_event(
    p_run_id UUID, p_project_id TEXT, p_source TEXT, p_kind TEXT, p_data JSONB, p_attempt INT,
    p_emit_key TEXT DEFAULT NULL, p_progress_no INT DEFAULT NULL, p_progress_bytes BIGINT DEFAULT NULL,
    p_audit_id BIGINT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    next_seq BIGINT;
    written BIGINT;
BEGIN
    LOOP
        next_seq := COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = p_run_id
                               ORDER BY e.seq DESC LIMIT 1), 0) + 1;
        INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, emit_key,
                                      progress_no, progress_bytes, audit_id)
        VALUES (p_run_id, next_seq, p_project_id, p_source, COALESCE(p_kind, ''), COALESCE(p_data, '{}'),
                COALESCE(p_attempt, 0), p_emit_key, p_progress_no, p_progress_bytes, p_audit_id)
        ON CONFLICT (run_id, seq) DO NOTHING
        RETURNING seq INTO written;
        EXIT WHEN written IS NOT NULL;
    END LOOP;
    IF EXISTS (SELECT 1 FROM awooop_run_watch WHERE run_id = p_run_id AND watched_until > now()) THEN
        PERFORM pg_notify('awooop_run_event', p_run_id::text);
    END IF;
    RETURN written;
END $$;

CREATE TYPE awooop_history_row AS (
    project_id TEXT,
    run_id UUID,  -- NULL: a change of no run (an audit entry)
    actor TEXT,
    action TEXT,
    from_status TEXT,
    to_status TEXT,
    reason TEXT,
    details JSONB
);

-- plan_cache_mode: its statements read the array parameter, so plpgsql would plan them anew for
-- each call while a custom plan looks cheaper than the generic one (the one plan there is to
-- have); planning was 0.19 of its 0.31 ms for one row (docs/benchmarks.md "One history")
CREATE FUNCTION awooop_record_history(p_rows awooop_history_row[]) RETURNS INT
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
                   h.project_id, h.action,
                   jsonb_strip_nulls(jsonb_build_object(
                       'action', h.action, 'from_status', h.from_status, 'to_status', h.to_status,
                       'actor', h.actor, 'reason', h.reason))
                       || jsonb_build_object('details', COALESCE(h.details, '{}')) AS data,
                   CASE WHEN jsonb_typeof(h.details -> 'attempt') = 'number'
                        THEN LEAST(GREATEST((h.details ->> 'attempt')::numeric, 0), 2147483647)::int ELSE 0 END
                       AS attempt
              FROM unnest(p_rows) WITH ORDINALITY AS h
             WHERE h.run_id IS NOT NULL
             ORDER BY h.ordinality
        ), numbered AS (
            SELECT r.*, COALESCE((SELECT e.seq FROM awooop_run_event e WHERE e.run_id = r.run_id
                                   ORDER BY e.seq DESC LIMIT 1), 0)
                        + row_number() OVER (PARTITION BY r.run_id ORDER BY r.ord) AS seq
              FROM rows r
        ), ins AS (
            INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt, audit_id)
            SELECT run_id, seq, project_id, 'state', action, data, attempt, audit_id FROM numbered
            ON CONFLICT (run_id, seq) DO NOTHING
            RETURNING run_id, seq
        )
        SELECT nb.* FROM numbered nb
         WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.run_id = nb.run_id AND ins.seq = nb.seq)
         ORDER BY nb.ord
    LOOP
        PERFORM awooop_append_run_event(missed.run_id, missed.project_id, 'state', missed.action, missed.data,
                                        missed.attempt, p_audit_id => missed.audit_id);
    END LOOP;
    PERFORM pg_notify('awooop_run_event', w.run_id::text)
       FROM awooop_run_watch w
      WHERE w.run_id IN (SELECT h.run_id FROM unnest(p_rows) h) AND w.watched_until > now();
    RETURN cardinality(p_rows);
END $$;

-- what every reader of the audit log reads: the entries, and the runs' changes from their logs
CREATE VIEW awooop_audit_log AS
SELECT a.audit_id, a.project_id, a.run_id, a.actor, a.action, a.from_status, a.to_status, a.reason, a.details,
       a.created_at
  FROM awooop_audit_entry a
UNION ALL
SELECT e.audit_id, e.project_id, e.run_id, (e.data ->> 'actor')::varchar(160), e.kind::varchar(64),
       (e.data ->> 'from_status')::varchar(32), (e.data ->> 'to_status')::varchar(32), e.data ->> 'reason',
       e.data -> 'details', e.created_at
  FROM awooop_run_event e
 WHERE e.audit_id IS NOT NULL;


-- the statements off the hot path (and an operator's INSERT) write through the view, a row at a time
CREATE FUNCTION awooop_audit_log_insert() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM awooop_record_history(ARRAY[ROW(NEW.project_id, NEW.run_id, NEW.actor, NEW.action, NEW.from_status,
                                             NEW.to_status, NEW.reason, NEW.details)::awooop_history_row]);
    RETURN NEW;
END $$;

CREATE TRIGGER awooop_audit_log_insert INSTEAD OF INSERT ON awooop_audit_log
    FOR EACH ROW EXECUTE FUNCTION awooop_audit_log_insert();

-- a fenced write's transition (migration 0310), its rows handed over as one set
CREATE OR REPLACE FUNCTION awooop_record_transition(p_run_id uuid, p_project_id text, p_status text,
                                                    p_actor text, p_action text, p_from_status text,
                                                    p_reason text, p_details jsonb,
                                                    p_comp_trigger text DEFAULT NULL::text,
                                                    p_failure_reason text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    -- the request's audit row, as awooop_request_compensation returns it (c_run NULL: no request)
    c_project TEXT; c_run UUID; c_actor TEXT; c_action TEXT; c_from TEXT; c_to TEXT; c_reason TEXT; c_details JSONB;
BEGIN
    IF p_run_id IS NULL THEN  -- nothing changed, nothing to record
        RETURN NULL;
    END IF;
    -- plain statements, not one INSERT over a CTE of the request: that form cost a fenced write
    -- about 0.08 ms more (docs/benchmarks.md, "One function records a transition")
    IF p_comp_trigger IS NOT NULL THEN
        SELECT c.* INTO c_project, c_run, c_actor, c_action, c_from, c_to, c_reason, c_details
          FROM awooop_request_compensation(p_run_id, p_project_id, p_status, p_comp_trigger, p_failure_reason,
                                           p_actor) c;
    END IF;
    IF c_run IS NULL THEN
        PERFORM awooop_record_history(ARRAY[
            ROW(p_project_id, p_run_id, p_actor, p_action, p_from_status, p_status, p_reason, p_details)
        ]::awooop_history_row[]);
    ELSE  -- the request's row after the transition's
        PERFORM awooop_record_history(ARRAY[
            ROW(p_project_id, p_run_id, p_actor, p_action, p_from_status, p_status, p_reason, p_details),
            ROW(c_project, c_run, c_actor, c_action, c_from, c_to, c_reason, c_details)
        ]::awooop_history_row[]);
    END IF;
    IF p_status IN ('PENDING', 'RESUMED') THEN
        PERFORM pg_notify('awooop_run_ready', p_project_id);
    END IF;
    RETURN c_reason;
END
$$;
