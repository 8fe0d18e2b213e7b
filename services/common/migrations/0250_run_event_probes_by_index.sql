-- The run log's functions (migration 0180) find a run's last seq with max(seq) over the primary
-- key (run_id, seq). PL/pgSQL plans each statement once per connection and keeps the plan; a
-- connection that first ran them while awooop_run_event was empty or small (a new install, or any
-- database right after VACUUM ANALYZE) kept a sequential scan for its life. Every claim and
-- completion then read the whole log: on a fresh bench database, 20,000 claim cycles read 148
-- million log rows in 10,000 scans, and the cycle slowed as the log grew. With sequential scans
-- priced out inside these functions the probes are index lookups whatever the statistics said
-- when the plan was made (a scan of the trigger's transition table is not a sequential scan and is
-- unaffected). A later CREATE OR REPLACE of one of these functions drops this setting: repeat it.
ALTER FUNCTION awooop_append_run_event(UUID, TEXT, TEXT, TEXT, JSONB, INT, TEXT, INT, BIGINT)
    SET enable_seqscan = off;
ALTER FUNCTION awooop_run_events_from_audit() SET enable_seqscan = off;
ALTER FUNCTION awooop_emit_run_event(UUID, INT, TEXT[], TEXT, JSONB, TEXT, INT, BIGINT) SET enable_seqscan = off;
