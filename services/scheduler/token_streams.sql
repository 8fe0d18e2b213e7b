-- A run's token streams (services/scheduler/token_streams.py; docs/architecture.md "Token
-- streams"): the lease check of PublishTokens. The checkpoints themselves are progress events
-- (run_events.sql's EmitRunEvent, kind stream_checkpoint).

-- name: TokenLeaseHolds :val
-- True when (:run_id, :attempt) is the live lease of a run in the caller's :projects (NULL: any):
-- the check awooop_emit_run_event makes, without locking the run (a live token is not durable; a
-- checkpoint goes through the locking emit). A read of the run's primary key.
SELECT EXISTS (
    SELECT 1 FROM awooop_run_state r
     WHERE r.run_id = :run_id AND r.attempt_count = :attempt AND r.status IN ('RUNNING', 'WAITING_TOOL')
       AND r.worker_id IS NOT NULL AND (:projects::text[] IS NULL OR r.project_id = ANY(:projects::text[])) IS TRUE)
