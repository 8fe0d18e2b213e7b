-- The queued runs that wait for a time: a retry backoff, a requested delay, a rate limit's window
-- (not_before in the future; parked runs, 'infinity', wait for a key or a wait, not a time). A
-- long-polling claim that found nothing asks for the earliest of its projects (claims.sql
-- SecondsUntilReady); through awooop_run_claim_idx that read every queued run of the project, the
-- heap row of each for not_before: a paused project's backlog, or 10,000 runs parked behind a busy
-- key, on every empty claim of its workers. Here it is the first entry past now(). Columns it adds
-- to no HOT rule: not_before and status are in awooop_run_claim_idx already.
CREATE INDEX awooop_run_delayed_idx ON awooop_run_state (project_id, not_before)
    WHERE status IN ('PENDING', 'RESUMED') AND not_before < 'infinity';
