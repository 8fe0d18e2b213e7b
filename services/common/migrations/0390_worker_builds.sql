-- Versioned workers (issue 45): the build a run runs on, how a resumed run is routed, and the
-- builds each project's workers declared.
--
-- A worker declares its build (ClaimRunsRequest.build_id). A claim records it on the run
-- (build_id: the build the run runs on). A run whose journal holds steps resumes only on its own
-- build while it is pinned (the default), or on the project's newest build when it auto-upgrades
-- (awooop_project_flow.versioning, or the run's own auto_upgrade). Both columns are added last:
-- the claim writes build_id once, and nothing updates auto_upgrade (docs/architecture.md, "A run
-- column"). A boolean, not a text with a CHECK: adding a constraint would read the whole table
-- under the migration's exclusive lock.
ALTER TABLE awooop_run_state
    ADD COLUMN build_id VARCHAR(128),
    ADD COLUMN auto_upgrade BOOLEAN;

ALTER TABLE awooop_project_flow
    ADD COLUMN versioning VARCHAR(16) NOT NULL DEFAULT 'pinned'
        CONSTRAINT awooop_project_flow_versioning_check CHECK (versioning IN ('pinned', 'auto_upgrade'));

-- The builds seen per project: written by the scheduler when a claim of a build arrives (at most
-- every few seconds per scheduler, project and build), read by the claim (the project's newest
-- build that is not draining, and whether the claiming build drains) and by ListBuilds and the
-- queue sampler (live: a claim seen lately, or a lease held). An operator drains a build
-- (DrainBuild): it then takes no new runs, only those already on it.
CREATE TABLE awooop_worker_build (
    project_id    VARCHAR(64)  NOT NULL,
    build_id      VARCHAR(128) NOT NULL,
    first_seen_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    drained_at    TIMESTAMPTZ,
    drained_by    VARCHAR(160),
    CONSTRAINT awooop_worker_build_pkey PRIMARY KEY (project_id, build_id)
);
