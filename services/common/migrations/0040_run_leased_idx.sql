-- Heartbeats as HOT updates. A heartbeat changes only lease_until and heartbeat_at; while
-- lease_until was an index key (awooop_run_lease_idx), every heartbeat wrote a new entry into
-- every index of awooop_run_state. Leased runs are now indexed by run_id (a key no update
-- changes): heartbeat, CompleteRuns and the fenced writes find a leased run by run_id through
-- it, and the reaper reads every leased run (as many as leases are held, not growing with
-- finished runs) and checks lease_until on the row.
CREATE INDEX awooop_run_leased_idx ON awooop_run_state (run_id)
    WHERE status IN ('RUNNING', 'WAITING_TOOL');
DROP INDEX awooop_run_lease_idx;
