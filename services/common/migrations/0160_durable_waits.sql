-- Durable waits (issue 27, docs/architecture.md "Durable waits"): a run parks on a wait and holds
-- no lease until the wait ends. One row per wait: a token any system may complete (by the RPC
-- CompleteWait or its callback URL) or a sleep, each ended by exactly one outcome.
--
-- step_id: the handler's name for the wait, unique per run, so a handler that runs again from
-- the top after a resume finds the same wait. token_hash: sha256 of the callback token (the token
-- itself is returned once, like an approval token; NULL for a sleep). parked_attempt: the attempt
-- that parked the run on this wait (NULL: nobody waits on it yet), so an outcome re-queues the
-- run only when it is parked here. A wait's outcome is written once: open -> completed |
-- timed_out (status), with who completed it and when.
CREATE TABLE awooop_wait (
    wait_id         UUID         PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id      VARCHAR(64)  NOT NULL,
    run_id          UUID         NOT NULL REFERENCES awooop_run_state (run_id) ON DELETE CASCADE,
    step_id         VARCHAR(128) NOT NULL,
    kind            VARCHAR(16)  NOT NULL CHECK (kind IN ('token', 'sleep', 'event')),
    status          VARCHAR(16)  NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'completed', 'timed_out')),
    token_hash      BYTEA,
    expires_at      TIMESTAMPTZ  NOT NULL,
    result          JSONB,
    completed_by    VARCHAR(160),
    parked_attempt  INT,
    -- an event wait: the channel and correlation key of the event it waits for, and the earliest
    -- arrival it takes (its look-back: an event that came just before the wait counts)
    match_channel   VARCHAR(32),
    match_key       VARCHAR(256),
    match_since     TIMESTAMPTZ,
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    completed_at    TIMESTAMPTZ,
    UNIQUE (run_id, step_id),
    CHECK ((kind = 'token') = (token_hash IS NOT NULL)),
    CHECK ((kind = 'event') = (match_key IS NOT NULL AND match_channel IS NOT NULL AND match_since IS NOT NULL))
);

-- the callback URL's lookup (a token names one wait)
CREATE UNIQUE INDEX awooop_wait_token_idx ON awooop_wait (token_hash) WHERE token_hash IS NOT NULL;
-- the timeout sweep's scan: only open waits, earliest due first
CREATE INDEX awooop_wait_due_idx ON awooop_wait (expires_at) WHERE status = 'open';
-- the event matcher's scan: open event waits
CREATE INDEX awooop_wait_event_idx ON awooop_wait (created_at) WHERE status = 'open' AND kind = 'event';

-- Events that carry a correlation key (an API event whose payload has "correlation_key"), found
-- by the event matcher. Partial: other events (nearly all) pay nothing for it.
CREATE INDEX awooop_run_correlation_idx ON awooop_run_state (project_id, channel_type, (input ->> 'correlation_key'), created_at)
    WHERE input ? 'correlation_key';

-- The one rule for ending a wait, shared by CompleteWait (scheduler), the callback URL (ingest)
-- and the timeout sweep: the first outcome wins, and a run parked on the wait is re-queued in the
-- same transaction. Locks are taken wait first, then run (the park statement takes them in the
-- same order), so no two of these can deadlock. p_projects: the projects where the caller may
-- complete waits (NULL: every project); a wait outside them is not_found, as an unknown one.
-- Answers one row: outcome 'ended' (this call decided the wait; resumed: its run was parked on it
-- and is PENDING again), 'expired' (a completion found the wait's time up and ended it timed_out
-- instead; resumed likewise), 'not_found', 'not_a_token' (a sleep ends only by its time), 'closed' (an
-- earlier outcome stands: wait_status says which) or 'run_ended' (the run is over: run_status; a
-- timeout still ends the wait, unaudited, so the sweep moves on).
CREATE FUNCTION awooop_end_wait(p_wait_id UUID, p_status TEXT, p_result JSONB, p_actor TEXT, p_projects TEXT[])
RETURNS TABLE (outcome TEXT, wait_id UUID, run_id UUID, project_id VARCHAR, wait_status VARCHAR, run_status VARCHAR,
               resumed BOOLEAN, result JSONB, completed_by VARCHAR, completed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
               kind VARCHAR, step_id VARCHAR)
LANGUAGE plpgsql AS $$
DECLARE
    w awooop_wait%ROWTYPE;
    r RECORD;
    parked BOOLEAN;
    late BOOLEAN;
    audit_action TEXT := CASE p_status WHEN 'timed_out' THEN 'WAIT_TIMED_OUT' ELSE 'WAIT_COMPLETED' END;
BEGIN
    SELECT * INTO w FROM awooop_wait aw WHERE aw.wait_id = p_wait_id FOR UPDATE;
    IF NOT FOUND OR (p_projects IS NOT NULL AND NOT w.project_id = ANY(p_projects)) THEN
        RETURN QUERY SELECT 'not_found'::text, p_wait_id, NULL::uuid, NULL::varchar, NULL::varchar, NULL::varchar,
                            false, NULL::jsonb, NULL::varchar, NULL::timestamptz, NULL::timestamptz, NULL::varchar,
                            NULL::varchar;
        RETURN;
    END IF;
    SELECT rs.status, rs.worker_id, rs.attempt_count INTO r
      FROM awooop_run_state rs WHERE rs.run_id = w.run_id FOR UPDATE;
    -- a run that is over takes no completion; its waits still time out (so the sweep moves on)
    IF w.status <> 'open' OR (p_status = 'completed' AND w.kind = 'sleep')
       OR (p_status = 'completed' AND r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')) THEN
        RETURN QUERY SELECT CASE WHEN w.status <> 'open' THEN 'closed'
                                 WHEN w.kind = 'sleep' AND p_status = 'completed' THEN 'not_a_token'
                                 ELSE 'run_ended' END,
                            w.wait_id, w.run_id, w.project_id, w.status, r.status, false, w.result, w.completed_by,
                            w.completed_at, w.expires_at, w.kind, w.step_id;
        RETURN;
    END IF;
    -- a completion that arrives after the wait's time is up commits the timeout instead (as a
    -- DecideApproval that finds its token expired does) and is refused, naming it
    late := p_status = 'completed' AND w.expires_at <= now();
    IF late THEN
        p_status := 'timed_out';
        p_result := NULL;
        audit_action := 'WAIT_TIMED_OUT';
    END IF;
    UPDATE awooop_wait aw SET status = p_status, result = p_result, completed_by = p_actor, completed_at = now()
     WHERE aw.wait_id = p_wait_id;
    parked := r.status = 'WAITING_TOOL' AND r.worker_id IS NULL AND w.parked_attempt = r.attempt_count;
    IF parked THEN
        UPDATE awooop_run_state rs SET status = 'PENDING', not_before = NULL, wait_reason = NULL, updated_at = now()
         WHERE rs.run_id = w.run_id;
        PERFORM pg_notify('awooop_run_ready', w.project_id);
    END IF;
    -- WAIT_COMPLETED / WAIT_TIMED_OUT re-queued the run parked on the wait; WAIT_ENDED: nobody
    -- was parked on it (the handler has not reached its wait yet), the run stays where it is
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT w.project_id, w.run_id, p_actor, CASE WHEN parked THEN audit_action ELSE 'WAIT_ENDED' END, r.status,
           CASE WHEN parked THEN 'PENDING' ELSE r.status END, w.step_id,
           jsonb_build_object('wait_id', w.wait_id, 'kind', w.kind, 'outcome', p_status, 'resumed', parked)
     WHERE r.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');
    RETURN QUERY SELECT CASE WHEN late THEN 'expired' ELSE 'ended' END, w.wait_id, w.run_id, w.project_id, p_status::varchar,
                        (CASE WHEN parked THEN 'PENDING' ELSE r.status END)::varchar, parked, p_result, p_actor::varchar,
                        now(), w.expires_at, w.kind, w.step_id;
END
$$;
