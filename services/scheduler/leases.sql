-- Renewing leases (seed 000 D2; docs/architecture.md, "Leases and fencing"), as it runs:
-- services/scheduler/leases.py. The claim that grants a lease is in claims.sql.

-- name: Heartbeat :many
-- ONE statement for a whole batch of leases: :run_ids and :attempts (same order), :worker_id,
-- :lease_secs, :worker_projects (the projects where the caller is a worker; NULL: all). Returns the
-- positions (1-based) of the renewed leases; the others are lost. A lease is renewed while the run
-- is RUNNING/WAITING_TOOL with the caller as worker and the same fencing token, also after
-- lease_until passed as long as the reaper has not taken it yet (the reaper re-checks expiry under
-- the row lock, so a renewal and a reap never both win).
--
-- Rows are locked in run_id order (`locked`), as CompleteRuns locks them, so a worker's heartbeat
-- and its batched completions on the same runs can never deadlock each other. The status test is
-- wrapped in `IS TRUE` (status is NOT NULL: same meaning) so that it does not match the predicate
-- of awooop_run_leased_idx: the planner, which believes that partial index nearly empty, otherwise
-- scans all of it and compares every leased run with every lease of the call (leases held x batch)
-- instead of one primary-key probe per lease (300 leases held: 2x the heartbeat's cost). Both
-- reads of awooop_run_state also name the runs as `run_id = ANY(:run_ids)`: an index condition of
-- their own, so a plan made while the table was empty or small (a prepared statement's generic
-- plan; services/common/planner.py) still probes the primary key per lease instead of reading the
-- whole index and joining. The update sets no indexed column (migration 0040), so it is a HOT
-- update.
-- not null: ord
WITH t AS (
    SELECT * FROM unnest(:run_ids::uuid[], :attempts::int[]) WITH ORDINALITY AS t(run_id, attempt, ord)
),
locked AS (
    SELECT r.run_id
      FROM awooop_run_state r JOIN t ON r.run_id = t.run_id AND r.attempt_count = t.attempt
     WHERE r.run_id = ANY(:run_ids::uuid[])
       AND r.worker_id = :worker_id
       AND (r.status IN ('RUNNING', 'WAITING_TOOL')) IS TRUE
       AND (:worker_projects::text[] IS NULL OR r.project_id = ANY(:worker_projects::text[])) IS TRUE
     ORDER BY r.run_id
       FOR UPDATE OF r
)
UPDATE awooop_run_state r
   SET lease_until = now() + make_interval(secs => :lease_secs), heartbeat_at = now()
  FROM locked, t
 WHERE r.run_id = ANY(:run_ids::uuid[])
   AND r.run_id = locked.run_id AND t.run_id = r.run_id AND r.attempt_count = t.attempt
RETURNING t.ord, r.lease_until, r.cancel_requested
