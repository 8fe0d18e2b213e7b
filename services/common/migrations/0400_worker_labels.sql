-- Worker labels and affinity (issue 46; docs/flow-control.md, "Worker labels"): the labels a run
-- requires and prefers of the worker that claims it, the worker it prefers after a wait, and the
-- workers each project has seen with their labels.
--
-- required_labels: a worker takes the run only when its labels contain these (jsonb @>).
-- preferred_labels: while it is younger than AWOOOP_PREFER_WAIT_SECONDS (since it became ready),
-- only a worker with these takes it, when such a worker is live; then any eligible worker.
-- sticky_worker: in a project with sticky resume (awooop_project_flow.sticky_seconds > 0), the
-- worker that held the run when it parked on a durable wait or an approval (waits.sql,
-- approvals.sql); after its resume only that worker takes it, for sticky_seconds, while it is
-- live; the claim clears it. All three are NULL for a run
-- without them (no bytes), and added last: the claim, heartbeat and completion never change them
-- (docs/architecture.md, "A run column").
ALTER TABLE awooop_run_state
    ADD COLUMN required_labels JSONB,
    ADD COLUMN preferred_labels JSONB,
    ADD COLUMN sticky_worker VARCHAR(128);

-- Sticky resume is a project's choice (SetProjectFlow), off by default: a resumed run held back for
-- a worker that may have died costs its latency, which only a project whose workers keep warm
-- state worth that should pay. 0: off; at most an hour.
ALTER TABLE awooop_project_flow
    ADD COLUMN sticky_seconds INTEGER NOT NULL DEFAULT 0
        CONSTRAINT awooop_project_flow_sticky_seconds_check CHECK (sticky_seconds BETWEEN 0 AND 3600);

-- The workers seen per project, with the labels they declared (ClaimRunsRequest.labels): written
-- when a claim arrives (at most every few seconds per scheduler, project and worker, and at once
-- when its labels or build change) and kept fresh by its heartbeats; read by the claim (is the
-- preferred or sticky worker live? is the sticky one of the claimer's build?) and by the label
-- sweep (is any live worker able to take a run that requires labels?).
CREATE TABLE awooop_worker (
    project_id    VARCHAR(64)  NOT NULL,
    worker_id     VARCHAR(128) NOT NULL,
    labels        JSONB        NOT NULL DEFAULT '{}',
    build_id      VARCHAR(128),  -- the build its last claim declared (NULL: none)
    first_seen_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CONSTRAINT awooop_worker_pkey PRIMARY KEY (project_id, worker_id)
);
-- a heartbeat marks its worker seen in all its projects (workers.sql WorkerBeat)
CREATE INDEX awooop_worker_id_idx ON awooop_worker (worker_id);

-- The queued runs that require labels, per project: what the label sweep reads (to park those no
-- live worker can take, and wake them when one can). Only such runs are in it.
CREATE INDEX awooop_run_labeled_idx ON awooop_run_state (project_id)
    WHERE required_labels IS NOT NULL AND status IN ('PENDING', 'RESUMED');
