-- Parked runs cost the lease statements nothing (issue 27). A run parked on a durable wait is
-- WAITING_TOOL with no worker and no lease, so it was in awooop_run_leased_idx (migration 0040)
-- and the reaper read every parked run to find none expired (10,000 parked: 6.8x its cost).
-- The leased index now also requires a worker: worker_id is set by the claim and cleared by
-- every statement that drops a lease, and a heartbeat never changes it, so heartbeats stay HOT
-- updates (no index mentions lease_until or heartbeat_at). Parked runs get an index of their
-- own, for the queue gauges (SampleQueue) that count every unfinished run.
DROP INDEX awooop_run_leased_idx;
CREATE INDEX awooop_run_leased_idx ON awooop_run_state (run_id)
    WHERE status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL;
CREATE INDEX awooop_run_waiting_idx ON awooop_run_state (run_id)
    WHERE status = 'WAITING_TOOL' AND worker_id IS NULL;
