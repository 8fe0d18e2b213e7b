-- Run event streams (issue 28, docs/architecture.md "Watching a run"): one ordered log per run of
-- its state changes (copied from its audit rows), its journal steps' status changes (from
-- awooop_saga_step) and the progress events its handler emits (ctx.emit, EmitEvent). WatchRun and
-- the SSE stream read it from an offset, `seq`, which counts 1, 2, 3, ... per run.
--
-- The sequence is assigned where the row is written, by awooop_append_run_event: max(seq) + 1 read
-- with a fresh snapshot, inserted ON CONFLICT DO NOTHING, and tried again on a conflict. An insert
-- that conflicts with an uncommitted one waits for it, so seq k + 1 is written only once seq k is
-- committed: a reader that has seen offset k never later finds a row below it (commit order is seq
-- order per run), and two writers at once get distinct consecutive numbers without a lock of their
-- own. State changes and steps are copied by triggers in the transaction of the change, so the log
-- and the tables it mirrors agree; a progress event needs the run's live lease (EmitEvent).
--
-- source: 'state' (kind: the audit action), 'step' (kind: the step's status) or 'progress' (kind:
-- the handler's). progress_no / progress_bytes: for progress rows, how many progress events (and
-- bytes of data) the run has emitted up to this one, so the per-run bound is one index probe.
-- emit_key: a progress event's optional key; an emit repeated with the same key (a retried
-- handler) answers the first one's offset instead of adding a row.
CREATE TABLE awooop_run_event (
    run_id          UUID         NOT NULL,  -- no foreign key: its check would lock the run row per log row
    seq             BIGINT       NOT NULL,
    project_id      VARCHAR(64)  NOT NULL,
    source          VARCHAR(16)  NOT NULL CHECK (source IN ('state', 'step', 'progress')),
    kind            VARCHAR(128) NOT NULL DEFAULT '',
    data            JSONB        NOT NULL DEFAULT '{}',
    attempt         INT          NOT NULL DEFAULT 0,
    emit_key        VARCHAR(128),
    progress_no     INT,
    progress_bytes  BIGINT,
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
CREATE UNIQUE INDEX awooop_run_event_emit_key_idx ON awooop_run_event (run_id, emit_key) WHERE emit_key IS NOT NULL;
CREATE INDEX awooop_run_event_progress_idx ON awooop_run_event (run_id, seq) WHERE source = 'progress';

-- Runs somebody watches, until when (a watcher renews it): only their new events send a NOTIFY
-- (inside the writing transaction), so runs nobody watches pay nothing for wake-ups.
CREATE TABLE awooop_run_watch (
    run_id          UUID         PRIMARY KEY REFERENCES awooop_run_state (run_id) ON DELETE CASCADE,
    watched_until   TIMESTAMPTZ  NOT NULL
);

-- Appends one row to a run's log and returns its seq (the caller's transaction holds what it
-- needs: a state change its run row, an emit its lease check). No EXCEPTION block (a
-- subtransaction per row of every claim and completion) and no foreign key (its check locks the
-- run row once more per log row): the rows go with their run in ingest's PruneRuns.
CREATE FUNCTION awooop_append_run_event(
    p_run_id UUID, p_project_id TEXT, p_source TEXT, p_kind TEXT, p_data JSONB, p_attempt INT,
    p_emit_key TEXT DEFAULT NULL, p_progress_no INT DEFAULT NULL, p_progress_bytes BIGINT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    next_seq BIGINT;
    written BIGINT;
BEGIN
    LOOP
        SELECT COALESCE(max(seq), 0) + 1 INTO next_seq FROM awooop_run_event WHERE run_id = p_run_id;
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

-- State changes: every audit row of a run (written in the transaction of the change), copied once
-- per statement: a claim of 100 runs writes its 100 log rows in one INSERT (a row trigger doubled
-- the claim statement's cost, bench/run_events.py). Each run's rows are numbered after its last
-- seq, read with this statement's snapshot, which is taken after the writing statement locked its
-- runs. A row that meets a concurrent writer's seq (only a writer that does not hold the run's row
-- lock can race: one that audits without changing the run) waits for it, is skipped, and is then
-- appended one at a time by awooop_append_run_event. The attempt comes from the row's details when
-- it names one (claims, reaps, completions do).
CREATE FUNCTION awooop_run_events_from_audit() RETURNS trigger LANGUAGE plpgsql AS $$
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
            SELECT r.*, COALESCE((SELECT max(e.seq) FROM awooop_run_event e WHERE e.run_id = r.run_id), 0) + r.k AS seq
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

CREATE TRIGGER awooop_audit_run_events
    AFTER INSERT ON awooop_audit_log
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awooop_run_events_from_audit();

-- A journal step: its first record and each change of its status.
CREATE FUNCTION awooop_run_event_from_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status THEN
        RETURN NULL;
    END IF;
    PERFORM awooop_append_run_event(
        NEW.run_id, NEW.project_id, 'step', NEW.status,
        jsonb_strip_nulls(jsonb_build_object(
            'step_id', NEW.step_id, 'step_type', NEW.step_type, 'status', NEW.status,
            'tool_id', NEW.tool_id, 'attempt', NEW.attempt, 'error', NEW.error)),
        NEW.attempt);
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_saga_step_run_event
    AFTER INSERT OR UPDATE OF status ON awooop_saga_step
    FOR EACH ROW EXECUTE FUNCTION awooop_run_event_from_step();

-- A progress event of the caller's run (EmitEvent), under its lease: one call, one transaction.
-- The run row is locked first (FOR UPDATE: the fence holds until commit, so a reaped or finished
-- attempt cannot add an event after its successor began), then each later statement reads with a
-- fresh snapshot: a repeated emit_key answers the first event's seq ('duplicate'); past the run's
-- bounds (p_max_count events, p_max_bytes of data) nothing is written ('exhausted'). outcome
-- 'lease_lost': no live lease with that token in the caller's projects (p_projects NULL: any).
CREATE FUNCTION awooop_emit_run_event(
    p_run_id UUID, p_attempt INT, p_projects TEXT[], p_kind TEXT, p_data JSONB, p_emit_key TEXT,
    p_max_count INT, p_max_bytes BIGINT
) RETURNS TABLE (outcome TEXT, seq BIGINT, progress_no INT, progress_bytes BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    v_project TEXT;
    v_no INT;
    v_bytes BIGINT;
    v_size BIGINT := octet_length(p_data::text);
    v_seq BIGINT;
BEGIN
    SELECT r.project_id INTO v_project FROM awooop_run_state r
     WHERE r.run_id = p_run_id AND r.attempt_count = p_attempt AND r.status IN ('RUNNING', 'WAITING_TOOL')
       AND r.worker_id IS NOT NULL AND (p_projects IS NULL OR r.project_id = ANY(p_projects))
       FOR UPDATE;
    IF v_project IS NULL THEN
        RETURN QUERY SELECT 'lease_lost'::text, NULL::bigint, NULL::int, NULL::bigint;
        RETURN;
    END IF;
    IF p_emit_key IS NOT NULL THEN
        SELECT e.seq, e.progress_no, e.progress_bytes INTO v_seq, v_no, v_bytes FROM awooop_run_event e
         WHERE e.run_id = p_run_id AND e.emit_key = p_emit_key;
        IF v_seq IS NOT NULL THEN
            RETURN QUERY SELECT 'duplicate'::text, v_seq, v_no, v_bytes;
            RETURN;
        END IF;
    END IF;
    SELECT e.progress_no, e.progress_bytes INTO v_no, v_bytes FROM awooop_run_event e
     WHERE e.run_id = p_run_id AND e.source = 'progress' ORDER BY e.seq DESC LIMIT 1;
    v_no := COALESCE(v_no, 0);
    v_bytes := COALESCE(v_bytes, 0);
    IF v_no + 1 > p_max_count OR v_bytes + v_size > p_max_bytes THEN
        RETURN QUERY SELECT 'exhausted'::text, NULL::bigint, v_no, v_bytes;
        RETURN;
    END IF;
    v_seq := awooop_append_run_event(p_run_id, v_project, 'progress', p_kind, p_data, p_attempt, p_emit_key,
                                     v_no + 1, v_bytes + v_size);
    RETURN QUERY SELECT 'emitted'::text, v_seq, v_no + 1, v_bytes + v_size;
END $$;
