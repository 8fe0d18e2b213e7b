-- Flow control (docs/flow-control.md): retry policy, delayed runs, priorities, fairness weights.

-- priority: higher is claimed first within a project. retry_policy: the run's own overrides of
-- its project's policy (NULL: none). wait_reason: why a queued run is not claimable before
-- not_before ('backoff' after a retryable failure or a reaped lease, 'delayed' for a requested
-- not_before); NULL when nothing holds it back.
ALTER TABLE awooop_run_state
    ADD COLUMN priority     INT         NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    ADD COLUMN retry_policy JSONB,
    ADD COLUMN wait_reason  VARCHAR(32);

-- Per-project flow settings. retry_policy holds only the fields the project sets; the rest
-- come from the service settings (AWOOOP_RETRY_*). weight: the project's share of a claim
-- made for several projects.
CREATE TABLE awooop_project_flow (
    project_id    VARCHAR(64)  PRIMARY KEY,
    retry_policy  JSONB        NOT NULL DEFAULT '{}',
    weight        INT          NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    updated_by    VARCHAR(160),
    updated_at    TIMESTAMPTZ  NOT NULL DEFAULT now()
);

-- The claim's order: per project, highest priority first, then the earliest time the run became
-- claimable (its not_before, else its creation). A delayed or backed-off run sorts by when it is
-- due, so the ready runs of a priority come before it and the claim's scan stops at them.
-- Same name as before so the plans and tests that name it keep their meaning.
DROP INDEX awooop_run_claim_idx;
CREATE INDEX awooop_run_claim_idx ON awooop_run_state (project_id, priority DESC, (COALESCE(not_before, created_at)))
    WHERE status IN ('PENDING', 'RESUMED');
