-- Idempotent claims (ClaimRunsRequest.claim_id, services/scheduler/claim_answers.py): the answer
-- of a claim that carried a claim id and claimed runs, written by the claim's own statement, so a
-- retry of a claim whose answer was lost answers the same leases instead of claiming more (and
-- leaving the first runs to wait for their lease to expire).
--
-- One row per claim, keyed by the caller's scope (principal "type:id", worker id) and its id;
-- the runs as (run_id, attempt) pairs: a replay answers those whose run still holds that lease.
-- The claim's parameters are kept so that reusing an id for another claim is refused. A row is
-- useful until the lease it granted would expire unrenewed (expires_at): the scheduler prunes it
-- after that. Pruning reads the BRIN index (nearly free to keep up on insert, and rows arrive
-- roughly in expires_at order), so the claim pays for one primary-key entry only.
CREATE TABLE awooop_claim_answer (
    principal   TEXT         NOT NULL,
    worker_id   VARCHAR(128) NOT NULL,
    claim_id    VARCHAR(128) NOT NULL,
    project_ids TEXT[]       NOT NULL,  -- sorted, distinct
    max_runs    INT          NOT NULL,
    lease_ttl   FLOAT8       NOT NULL,  -- seconds
    run_ids     UUID[]       NOT NULL,
    attempts    INT[]        NOT NULL,  -- attempts[i] is the attempt run_ids[i] was claimed for
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (principal, worker_id, claim_id)
);

CREATE INDEX awooop_claim_answer_expiry_idx ON awooop_claim_answer USING brin (expires_at);
