-- The compensation driver's lease takes the run lease's names (issue 26): a request held by a saga
-- replica has `worker_id` (who holds it), `attempt_count` (incremented by every claim; with
-- worker_id the fencing token every write of the driver re-checks) and `lease_until`, as a run
-- held by a worker has. The values are kept: a request a replica held when this ran is taken over
-- when its lease expires, as after a crash, and its step left `compensating` is called again with
-- the same idempotency key. Saga processes of an earlier version fail their statements against
-- the new names (docs/operations.md, "Migrations").
ALTER TABLE awooop_compensation_request RENAME COLUMN claimed_by TO worker_id;
ALTER TABLE awooop_compensation_request RENAME COLUMN attempts TO attempt_count;
