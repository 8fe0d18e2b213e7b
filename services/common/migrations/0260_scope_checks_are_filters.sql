-- The caller's project scope is a filter, never an index condition (docs/architecture.md, "Store").
-- A project newer than awooop_run_state's statistics looks like a handful of runs to the planner,
-- which then found the emitting run through the project's whole part of awooop_run_list_idx
-- (project_id, created_at, run_id) instead of its primary key: cost growing with every run the
-- project keeps. The services' statements wrap their scope checks in `IS TRUE` for the same
-- reason; this function, from migration 0180, is the same but for that wrapping.

CREATE OR REPLACE FUNCTION awooop_emit_run_event(
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
       AND r.worker_id IS NOT NULL AND (p_projects IS NULL OR r.project_id = ANY(p_projects)) IS TRUE
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
