-- Saga service (ADR-119) additions and the reference tool gateway's own state.

-- ---------------------------------------------------------------- saga_steps view, nulls kept inside values
-- 0001's view ran jsonb_strip_nulls over each element, which also strips null fields nested inside
-- tool_params / result / compensation_cmd (it changed callers' data). Only top-level null keys are
-- dropped now (tool_id of an llm_call, completed_at of a pending step), as before.
CREATE OR REPLACE VIEW awooop_run_saga_steps AS
SELECT r.run_id,
       r.project_id,
       COALESCE(
         (SELECT jsonb_agg(
                   (SELECT jsonb_object_agg(e.key, e.value)
                      FROM jsonb_each(jsonb_build_object(
                             'step_id', s.step_id,
                             'step_type', s.step_type,
                             'tool_id', s.tool_id,
                             'tool_params', s.tool_params,
                             'status', s.status,
                             'result', s.result,
                             'compensation_cmd', s.compensation_cmd,
                             'error', s.error,
                             'started_at', s.started_at,
                             'completed_at', s.completed_at)) AS e
                     WHERE e.value <> 'null'::jsonb)
                   ORDER BY s.seq)
            FROM awooop_saga_step s WHERE s.run_id = r.run_id),
         '[]'::jsonb) AS saga_steps
  FROM awooop_run_state r;

-- ---------------------------------------------------------------- escalation outbox (ADR-119 risks)
-- One row per compensation_failed step, inserted in the transaction that marks the step failed
-- (with its SAGA_COMPENSATION_FAILED audit row), so an alert survives a crash before delivery.
-- Delivery to the Redis stream and Telegram is at least once; alert_id lets readers dedupe.
CREATE TABLE awooop_saga_alert (
    alert_id          BIGSERIAL    PRIMARY KEY,
    project_id        VARCHAR(64)  NOT NULL,
    run_id            UUID         NOT NULL REFERENCES awooop_run_state ON DELETE CASCADE,
    step_id           VARCHAR(128) NOT NULL,
    tool_id           VARCHAR(128),
    error             TEXT         NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    redis_sent_at     TIMESTAMPTZ,
    telegram_sent_at  TIMESTAMPTZ,
    attempts          INT          NOT NULL DEFAULT 0,
    claimed_until     TIMESTAMPTZ,
    last_error        TEXT,
    done_at           TIMESTAMPTZ
);
CREATE INDEX awooop_saga_alert_open_idx ON awooop_saga_alert (alert_id) WHERE done_at IS NULL;
CREATE INDEX awooop_saga_alert_run_idx ON awooop_saga_alert (run_id);

-- ---------------------------------------------------------------- reference tool gateway (tests, demo)
-- A stand-in for the MCP gateway: the tools of ADR-119 D3 acting on these tables.
CREATE TABLE awooop_refgw_deployment (
    project_id  VARCHAR(64)  NOT NULL,
    name        VARCHAR(253) NOT NULL,
    replicas    INT          NOT NULL CHECK (replicas >= 0),
    updated_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, name)
);

CREATE TABLE awooop_refgw_resource (
    project_id  VARCHAR(64)  NOT NULL,
    kind        VARCHAR(253) NOT NULL,
    name        VARCHAR(253) NOT NULL,
    spec        JSONB        NOT NULL DEFAULT '{}',
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, kind, name)
);

-- pg_mutate's target: rows of named tables
CREATE TABLE awooop_refgw_row (
    project_id  VARCHAR(64)  NOT NULL,
    table_name  VARCHAR(63)  NOT NULL,
    row_id      UUID         NOT NULL DEFAULT gen_random_uuid(),
    data        JSONB        NOT NULL,
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, table_name, row_id)
);

CREATE TABLE awooop_refgw_knowledge (
    project_id  VARCHAR(64)  NOT NULL,
    entry_id    VARCHAR(128) NOT NULL,
    content     JSONB        NOT NULL,
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, entry_id)
);

-- One row per idempotency key that executed successfully: the replay source. Failures are not
-- recorded, so a retry with the same key runs the tool.
CREATE TABLE awooop_refgw_call (
    project_id       VARCHAR(64)  NOT NULL,
    idempotency_key  VARCHAR(256) NOT NULL,
    tool_id          VARCHAR(128) NOT NULL,
    params           JSONB        NOT NULL,
    result           JSONB        NOT NULL,
    run_id           UUID,
    reason           TEXT,
    replays          INT          NOT NULL DEFAULT 0,
    executed_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, idempotency_key)
);

-- Every request received, with its outcome: lets tests (and operators) count executions per key.
CREATE TABLE awooop_refgw_request (
    request_id       BIGSERIAL    PRIMARY KEY,
    project_id       VARCHAR(64)  NOT NULL,
    idempotency_key  VARCHAR(256) NOT NULL,
    tool_id          VARCHAR(128) NOT NULL,
    outcome          VARCHAR(16)  NOT NULL DEFAULT 'received'
        CHECK (outcome IN ('received', 'executed', 'replayed', 'failed')),
    error            TEXT,
    received_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ
);
CREATE INDEX awooop_refgw_request_key_idx ON awooop_refgw_request (project_id, idempotency_key);

-- "Told to fail": while a row matches (project_id or '*', tool_id), calls of that tool fail with
-- the given code; remaining counts down (NULL: until the row is deleted).
CREATE TABLE awooop_refgw_fault (
    project_id  VARCHAR(64)  NOT NULL DEFAULT '*',
    tool_id     VARCHAR(128) NOT NULL,
    code        VARCHAR(32)  NOT NULL DEFAULT 'FAILED_PRECONDITION'
        CHECK (code IN ('FAILED_PRECONDITION', 'UNAVAILABLE', 'INVALID_ARGUMENT')),
    message     TEXT         NOT NULL DEFAULT 'injected fault',
    remaining   INT,
    created_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, tool_id)
);
