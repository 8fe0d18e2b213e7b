-- awooop store, version 1. Table and column names follow the seeds (ADR-114, ADR-119,
-- QA Brain T3); every unique key includes the tenant (project_id) so the schema can be
-- distributed by project later. Timestamps always come from now(), the database clock.

-- ---------------------------------------------------------------- principals and keys
CREATE TABLE awooop_principal (
    principal_id    VARCHAR(128) PRIMARY KEY,
    principal_type  VARCHAR(32)  NOT NULL CHECK (principal_type IN ('user', 'service')),
    display_name    VARCHAR(256) NOT NULL DEFAULT '',
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now()
);

-- An API key is "awk_<key_id>_<secret>"; only sha256(secret) is stored.
CREATE TABLE awooop_api_key (
    key_id          VARCHAR(32)  PRIMARY KEY,
    principal_id    VARCHAR(128) NOT NULL REFERENCES awooop_principal ON DELETE CASCADE,
    secret_sha256   BYTEA        NOT NULL,
    label           VARCHAR(256) NOT NULL DEFAULT '',
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    revoked_at      TIMESTAMPTZ
);
CREATE INDEX awooop_api_key_principal_idx ON awooop_api_key (principal_id);

-- project_id '*' grants the role in every project (the dev admin).
CREATE TABLE awooop_project_member (
    project_id      VARCHAR(64)  NOT NULL,
    principal_id    VARCHAR(128) NOT NULL REFERENCES awooop_principal ON DELETE CASCADE,
    role            VARCHAR(32)  NOT NULL CHECK (role IN ('ingest', 'worker', 'approver', 'admin')),
    granted_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, principal_id, role)
);
CREATE INDEX awooop_project_member_principal_idx ON awooop_project_member (principal_id);

-- ---------------------------------------------------------------- runs (ADR-114 D2-D5)
CREATE TABLE awooop_run_state (
    run_id                    UUID         PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id                VARCHAR(64)  NOT NULL,
    channel_type              VARCHAR(32)  NOT NULL
        CHECK (channel_type IN ('telegram', 'alertmanager', 'gitea', 'line', 'api')),
    provider_event_id         VARCHAR(256),
    status                    VARCHAR(32)  NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'RUNNING', 'WAITING_TOOL', 'WAITING_APPROVAL', 'RESUMED',
                          'COMPLETED', 'FAILED', 'CANCELLED')),
    input                     JSONB        NOT NULL DEFAULT '{}',
    output                    JSONB,
    max_attempts              INT          NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    -- attempt_count is also the lease's fencing token: it only ever grows.
    attempt_count             INT          NOT NULL DEFAULT 0,
    -- leases handed back with ReleaseRun; they do not count against max_attempts.
    released_count            INT          NOT NULL DEFAULT 0,
    not_before                TIMESTAMPTZ,
    lease_until               TIMESTAMPTZ,
    heartbeat_at              TIMESTAMPTZ,
    worker_id                 VARCHAR(128),
    reaped_at                 TIMESTAMPTZ,
    failure_reason            TEXT,
    error_code                VARCHAR(64),
    cancel_requested          BOOLEAN      NOT NULL DEFAULT false,
    approval_token_hash       BYTEA,
    approval_expires_at       TIMESTAMPTZ,
    approval_summary          TEXT,
    approval_decided_by       VARCHAR(128),
    approval_decided_at       TIMESTAMPTZ,
    -- ADR-119 D5. The saga_steps of ADR-119 D1 is assembled from awooop_saga_step on
    -- read (view awooop_run_saga_steps): one row per step keeps each write O(1).
    saga_status               VARCHAR(32)  NOT NULL DEFAULT 'in_progress'
        CHECK (saga_status IN ('in_progress', 'compensating', 'compensated', 'compensation_failed')),
    compensation_started_at   TIMESTAMPTZ,
    compensation_completed_at TIMESTAMPTZ,
    created_by                VARCHAR(128),
    created_at                TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at                TIMESTAMPTZ  NOT NULL DEFAULT now()
);
-- claim: oldest claimable first
CREATE INDEX awooop_run_claim_idx ON awooop_run_state (project_id, created_at)
    WHERE status IN ('PENDING', 'RESUMED');
-- reaper: expired leases
CREATE INDEX awooop_run_lease_idx ON awooop_run_state (lease_until)
    WHERE status IN ('RUNNING', 'WAITING_TOOL');
-- approval expiry sweep
CREATE INDEX awooop_run_approval_idx ON awooop_run_state (approval_expires_at)
    WHERE status = 'WAITING_APPROVAL';
-- ListRuns: newest first per project
CREATE INDEX awooop_run_list_idx ON awooop_run_state (project_id, created_at DESC, run_id);

-- ---------------------------------------------------------------- event dedupe (ADR-114 D1)
CREATE TABLE awooop_channel_event_dedupe (
    dedupe_id         UUID         PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id        VARCHAR(64)  NOT NULL,
    channel_type      VARCHAR(32)  NOT NULL,
    provider_event_id VARCHAR(256) NOT NULL,
    run_id            UUID         NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    UNIQUE (project_id, channel_type, provider_event_id)
);
-- retention pruning (7 days)
CREATE INDEX awooop_channel_event_dedupe_created_idx ON awooop_channel_event_dedupe (created_at);

-- ---------------------------------------------------------------- idempotent mutations (QA Brain T3)
CREATE TABLE awooop_idempotency_key (
    idempotency_id      UUID         PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id          VARCHAR(64)  NOT NULL,
    principal_type      VARCHAR(32)  NOT NULL,
    principal_id        VARCHAR(128) NOT NULL,
    operation           VARCHAR(64)  NOT NULL,
    key                 VARCHAR(256) NOT NULL,
    request_fingerprint CHAR(64)     NOT NULL,   -- hex SHA-256 of the canonical payload
    policy_version      VARCHAR(32)  NOT NULL,
    response_snapshot   BYTEA        NOT NULL,   -- the serialized response, replayed as is
    resource_id         VARCHAR(128),
    created_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at          TIMESTAMPTZ  NOT NULL,
    UNIQUE (project_id, principal_type, principal_id, operation, key)
);
CREATE INDEX awooop_idempotency_key_expires_idx ON awooop_idempotency_key (expires_at);

-- ---------------------------------------------------------------- saga journal (ADR-119 D1)
CREATE TABLE awooop_saga_step (
    run_id              UUID         NOT NULL REFERENCES awooop_run_state ON DELETE CASCADE,
    step_id             VARCHAR(128) NOT NULL,
    project_id          VARCHAR(64)  NOT NULL,
    seq                 INT          NOT NULL,
    step_type           VARCHAR(32)  NOT NULL
        CHECK (step_type IN ('llm_call', 'tool_call', 'approval_request', 'callback')),
    tool_id             VARCHAR(128),
    tool_params         JSONB,
    status              VARCHAR(32)  NOT NULL
        CHECK (status IN ('pending', 'completed', 'failed', 'compensating', 'compensated',
                          'compensation_failed', 'resolved')),
    result              JSONB,
    error               TEXT,
    compensation_cmd    JSONB,
    attempt             INT          NOT NULL,
    started_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    completed_at        TIMESTAMPTZ,
    compensated_at      TIMESTAMPTZ,
    resolved_by         VARCHAR(128),
    resolution_reason   TEXT,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, seq)
);

-- The seed's saga_steps JSONB array, assembled on read.
CREATE VIEW awooop_run_saga_steps AS
SELECT r.run_id,
       r.project_id,
       COALESCE(
         (SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                    'step_id', s.step_id,
                    'step_type', s.step_type,
                    'tool_id', s.tool_id,
                    'tool_params', s.tool_params,
                    'status', s.status,
                    'result', s.result,
                    'compensation_cmd', s.compensation_cmd,
                    'error', s.error,
                    'started_at', s.started_at,
                    'completed_at', s.completed_at)) ORDER BY s.seq)
            FROM awooop_saga_step s WHERE s.run_id = r.run_id),
         '[]'::jsonb) AS saga_steps
  FROM awooop_run_state r;

-- A recorded compensation request (ADR-119 D4). Written in the same transaction as the
-- state change that causes it; the saga service drives each to an end.
CREATE TABLE awooop_compensation_request (
    run_id          UUID         PRIMARY KEY REFERENCES awooop_run_state ON DELETE CASCADE,
    project_id      VARCHAR(64)  NOT NULL,
    trigger         VARCHAR(32)  NOT NULL
        CHECK (trigger IN ('approval_rejected', 'approval_expired', 'step_failed', 'cancelled', 'manual')),
    status          VARCHAR(16)  NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done')),
    claimed_by      VARCHAR(128),
    lease_until     TIMESTAMPTZ,
    attempts        INT          NOT NULL DEFAULT 0,
    reason          TEXT,
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ  NOT NULL DEFAULT now()
);
CREATE INDEX awooop_compensation_request_open_idx ON awooop_compensation_request (created_at)
    WHERE status <> 'done';

-- ---------------------------------------------------------------- audit log
CREATE TABLE awooop_audit_log (
    audit_id        BIGSERIAL    PRIMARY KEY,
    project_id      VARCHAR(64)  NOT NULL,
    run_id          UUID,
    actor           VARCHAR(160) NOT NULL,
    action          VARCHAR(64)  NOT NULL,
    from_status     VARCHAR(32),
    to_status       VARCHAR(32),
    reason          TEXT,
    details         JSONB        NOT NULL DEFAULT '{}',
    created_at      TIMESTAMPTZ  NOT NULL DEFAULT now()
);
CREATE INDEX awooop_audit_log_run_idx ON awooop_audit_log (run_id, audit_id) WHERE run_id IS NOT NULL;
CREATE INDEX awooop_audit_log_project_idx ON awooop_audit_log (project_id, audit_id);
