-- Retention of finished runs (AWOOOP_RUN_RETENTION): the pruner takes the oldest terminal runs
-- first, by the time of their last change. Partial, so live runs (the claim path) never touch it.
CREATE INDEX awooop_run_finished_idx ON awooop_run_state (updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
