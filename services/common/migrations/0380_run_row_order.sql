-- The run row's columns in the order they change: what a run is created with first, what every
-- claim, heartbeat and completion changes last (issue 43).
--
-- When an UPDATE keeps the new version of a row on its page (fillfactor 70, migration 0320: most
-- of them do), Postgres logs only the bytes between the first and the last that changed. The
-- columns had been added as features came: `status` was the fifth and `updated_at` the 29th, so
-- every status change logged the bytes between them, the run's whole `input` among them, again
-- at the claim and again at the completion. Here the columns a run keeps from its creation come
-- first (its `input` last of them), then those a rarer transition changes (approval,
-- compensation, cancel, failure), then those of the run's every transition, the heartbeat's
-- three last of all; the bytes logged per update are those of the changed columns, whatever the
-- size of the input.
--
-- Postgres cannot reorder columns: the table is rebuilt and its rows copied, under an exclusive
-- lock for the copy (docs/operations.md, "Migrations"). Everything on the table is made again
-- under its own name: the primary key, the checks, the indexes, the triggers, the foreign keys
-- that point at it and the two views over it. The statements name columns, not positions; the
-- plan functions of the hot statements (`RETURNING r.*`) are replaced by `awooop migrate`, which
-- checks their result columns after every migration.

-- grants an operator made on the table or its views (the project makes none) are carried over
CREATE TEMP TABLE awooop_run_state_grants ON COMMIT DROP AS
SELECT c.relname, a.grantee, a.privilege_type, a.is_grantable
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.oid IN ('awooop_run_state'::regclass, 'awooop_run_cur'::regclass, 'awooop_run_saga_steps'::regclass)
   AND a.grantee <> c.relowner;

DROP VIEW awooop_run_cur;
DROP VIEW awooop_run_saga_steps;
ALTER TABLE awooop_compensation_request DROP CONSTRAINT awooop_compensation_request_run_id_fkey;
ALTER TABLE awooop_run_watch DROP CONSTRAINT awooop_run_watch_run_id_fkey;
ALTER TABLE awooop_saga_alert DROP CONSTRAINT awooop_saga_alert_run_id_fkey;
ALTER TABLE awooop_saga_step DROP CONSTRAINT awooop_saga_step_run_id_fkey;
ALTER TABLE awooop_wait DROP CONSTRAINT awooop_wait_run_id_fkey;

CREATE TABLE awooop_run_state_reordered (
    -- what a run is created with
    run_id                    UUID          NOT NULL DEFAULT gen_random_uuid(),
    project_id                VARCHAR(64)   NOT NULL,
    channel_type              VARCHAR(32)   NOT NULL,
    provider_event_id         VARCHAR(256),
    created_at                TIMESTAMPTZ   NOT NULL DEFAULT now(),
    created_by                VARCHAR(128),
    traceparent               VARCHAR(55),
    max_attempts              INTEGER       NOT NULL DEFAULT 3,
    priority                  INTEGER       NOT NULL DEFAULT 0,
    child_depth               SMALLINT      NOT NULL DEFAULT 0,
    child_seq                 BIGINT,
    parent_run_id             UUID,
    parent_step_id            VARCHAR(128),
    concurrency_keys          VARCHAR(128)[],
    retry_policy              JSONB,
    input                     JSONB         NOT NULL DEFAULT '{}',
    -- what a rarer transition changes
    approval_token_hash       BYTEA,
    approval_expires_at       TIMESTAMPTZ,
    approval_summary          TEXT,
    approval_decided_by       VARCHAR(128),
    approval_decided_at       TIMESTAMPTZ,
    compensation_started_at   TIMESTAMPTZ,
    compensation_completed_at TIMESTAMPTZ,
    reaped_at                 TIMESTAMPTZ,
    released_count            INTEGER       NOT NULL DEFAULT 0,
    cancel_requested          BOOLEAN       NOT NULL DEFAULT false,
    failure_reason            TEXT,
    error_code                VARCHAR(64),
    -- what the completion changes
    saga_status               VARCHAR(32)   NOT NULL DEFAULT 'in_progress',
    output                    JSONB,
    -- what a claim changes
    wait_key                  VARCHAR(128),
    wait_reason               VARCHAR(32),
    not_before                TIMESTAMPTZ,
    status                    VARCHAR(32)   NOT NULL DEFAULT 'PENDING',
    attempt_count             INTEGER       NOT NULL DEFAULT 0,
    worker_id                 VARCHAR(128),
    -- what a heartbeat changes
    lease_until               TIMESTAMPTZ,
    heartbeat_at              TIMESTAMPTZ,
    updated_at                TIMESTAMPTZ   NOT NULL DEFAULT now(),
    CONSTRAINT awooop_run_state_channel_type_check
        CHECK (channel_type IN ('telegram', 'alertmanager', 'gitea', 'line', 'api')),
    CONSTRAINT awooop_run_state_child_check
        CHECK ((parent_step_id IS NULL) = (child_seq IS NULL) AND (parent_run_id IS NULL OR parent_step_id IS NOT NULL)),
    CONSTRAINT awooop_run_state_concurrency_keys_check
        CHECK (cardinality(concurrency_keys) >= 1 AND cardinality(concurrency_keys) <= 8),
    CONSTRAINT awooop_run_state_max_attempts_check CHECK (max_attempts >= 1 AND max_attempts <= 100),
    CONSTRAINT awooop_run_state_priority_check CHECK (priority >= -1000 AND priority <= 1000),
    CONSTRAINT awooop_run_state_saga_status_check
        CHECK (saga_status IN ('in_progress', 'not_needed', 'compensating', 'compensated', 'compensation_failed')),
    CONSTRAINT awooop_run_state_status_check
        CHECK (status IN ('PENDING', 'RUNNING', 'WAITING_TOOL', 'WAITING_APPROVAL', 'RESUMED',
                          'COMPLETED', 'FAILED', 'CANCELLED'))
) WITH (fillfactor = 70);

-- no trigger on the new table yet: the copy writes no facts (awooop_run_created has them)
INSERT INTO awooop_run_state_reordered (
    run_id, project_id, channel_type, provider_event_id, created_at, created_by, traceparent,
    max_attempts, priority, child_depth, child_seq, parent_run_id, parent_step_id, concurrency_keys,
    retry_policy, input, approval_token_hash, approval_expires_at, approval_summary,
    approval_decided_by, approval_decided_at, compensation_started_at, compensation_completed_at,
    reaped_at, released_count, cancel_requested, failure_reason, error_code, saga_status, output,
    wait_key, wait_reason, not_before, status, attempt_count, worker_id, lease_until, heartbeat_at,
    updated_at)
SELECT run_id, project_id, channel_type, provider_event_id, created_at, created_by, traceparent,
       max_attempts, priority, child_depth, child_seq, parent_run_id, parent_step_id, concurrency_keys,
       retry_policy, input, approval_token_hash, approval_expires_at, approval_summary,
       approval_decided_by, approval_decided_at, compensation_started_at, compensation_completed_at,
       reaped_at, released_count, cancel_requested, failure_reason, error_code, saga_status, output,
       wait_key, wait_reason, not_before, status, attempt_count, worker_id, lease_until, heartbeat_at,
       updated_at
  FROM awooop_run_state;

DROP TABLE awooop_run_state;  -- its indexes, triggers and self-reference go with it
ALTER TABLE awooop_run_state_reordered RENAME TO awooop_run_state;
ALTER TABLE awooop_run_state ADD CONSTRAINT awooop_run_state_pkey PRIMARY KEY (run_id);

CREATE INDEX awooop_run_approval_idx ON awooop_run_state (approval_expires_at)
    WHERE status = 'WAITING_APPROVAL';
CREATE UNIQUE INDEX awooop_run_child_idx ON awooop_run_state (project_id, parent_run_id, parent_step_id)
    WHERE parent_run_id IS NOT NULL;
CREATE INDEX awooop_run_children_list_idx ON awooop_run_state (parent_run_id, created_at DESC, run_id)
    WHERE parent_run_id IS NOT NULL;
CREATE INDEX awooop_run_claim_idx ON awooop_run_state (project_id, priority DESC, COALESCE(not_before, created_at))
    WHERE status IN ('PENDING', 'RESUMED');
CREATE INDEX awooop_run_comp_failed_idx ON awooop_run_state (project_id, created_at DESC, run_id)
    WHERE saga_status = 'compensation_failed';
CREATE INDEX awooop_run_delayed_idx ON awooop_run_state (project_id, not_before)
    WHERE status IN ('PENDING', 'RESUMED') AND not_before < 'infinity';
CREATE INDEX awooop_run_finished_idx ON awooop_run_state (updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
CREATE INDEX awooop_run_leased_idx ON awooop_run_state (run_id)
    WHERE status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL;
CREATE INDEX awooop_run_parent_idx ON awooop_run_state (parent_run_id, child_seq)
    WHERE parent_run_id IS NOT NULL;
CREATE INDEX awooop_run_parked_idx ON awooop_run_state (project_id, wait_key, priority DESC, created_at)
    WHERE status IN ('PENDING', 'RESUMED') AND not_before = 'infinity';
CREATE INDEX awooop_run_project_finished_idx ON awooop_run_state (project_id, status, updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
CREATE INDEX awooop_run_waiting_idx ON awooop_run_state (run_id)
    WHERE status = 'WAITING_TOOL' AND worker_id IS NULL;

ALTER TABLE awooop_run_state ADD CONSTRAINT awooop_run_state_parent_run_id_fkey
    FOREIGN KEY (parent_run_id) REFERENCES awooop_run_state (run_id) ON DELETE SET NULL;
ALTER TABLE awooop_compensation_request ADD CONSTRAINT awooop_compensation_request_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES awooop_run_state (run_id) ON DELETE CASCADE;
ALTER TABLE awooop_run_watch ADD CONSTRAINT awooop_run_watch_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES awooop_run_state (run_id) ON DELETE CASCADE;
ALTER TABLE awooop_saga_alert ADD CONSTRAINT awooop_saga_alert_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES awooop_run_state (run_id) ON DELETE CASCADE;
ALTER TABLE awooop_saga_step ADD CONSTRAINT awooop_saga_step_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES awooop_run_state (run_id) ON DELETE CASCADE;
ALTER TABLE awooop_wait ADD CONSTRAINT awooop_wait_run_id_fkey
    FOREIGN KEY (run_id) REFERENCES awooop_run_state (run_id) ON DELETE CASCADE;

CREATE TRIGGER awooop_run_child_ended AFTER UPDATE OF status ON awooop_run_state FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION awooop_child_ended();
CREATE TRIGGER awooop_run_created AFTER INSERT ON awooop_run_state
    REFERENCING NEW TABLE AS created_runs FOR EACH STATEMENT EXECUTE FUNCTION awooop_run_created();
CREATE TRIGGER awooop_run_deleted AFTER DELETE ON awooop_run_state
    REFERENCING OLD TABLE AS deleted_runs FOR EACH STATEMENT EXECUTE FUNCTION awooop_run_deleted();
CREATE TRIGGER awooop_run_facts_changed AFTER UPDATE OF project_id, created_at, channel_type, input
    ON awooop_run_state FOR EACH ROW
    WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id OR OLD.created_at IS DISTINCT FROM NEW.created_at
          OR OLD.channel_type IS DISTINCT FROM NEW.channel_type OR OLD.input IS DISTINCT FROM NEW.input)
    EXECUTE FUNCTION awooop_run_facts_changed();
CREATE TRIGGER awooop_run_parent_ended AFTER UPDATE OF status ON awooop_run_state FOR EACH ROW
    WHEN (NEW.status IN ('FAILED', 'CANCELLED') AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION awooop_parent_ended();
CREATE TRIGGER awooop_run_release_concurrency_slot AFTER UPDATE OF status, worker_id ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.concurrency_keys IS NOT NULL AND OLD.status IN ('RUNNING', 'WAITING_TOOL')
          AND OLD.worker_id IS NOT NULL
          AND (NEW.status NOT IN ('RUNNING', 'WAITING_TOOL') OR NEW.worker_id IS NULL))
    EXECUTE FUNCTION awooop_release_concurrency_slot();
CREATE TRIGGER awooop_run_saga_not_needed BEFORE UPDATE OF status ON awooop_run_state FOR EACH ROW
    WHEN (NEW.status IN ('FAILED', 'CANCELLED') AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND NEW.saga_status = 'in_progress')
    EXECUTE FUNCTION awooop_saga_not_needed();

CREATE VIEW awooop_run_cur AS
SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, attempt_count AS cur_attempt,
       cancel_requested AS cur_cancel, reaped_at AS cur_reaped_at, heartbeat_at AS cur_heartbeat_at,
       worker_id AS cur_worker, concurrency_keys AS cur_keys
  FROM awooop_run_state;

CREATE VIEW awooop_run_saga_steps AS
SELECT r.run_id, r.project_id,
       COALESCE((SELECT jsonb_agg((SELECT jsonb_object_agg(e.key, e.value)
                                     FROM jsonb_each(jsonb_build_object(
                                              'step_id', s.step_id, 'step_type', s.step_type, 'tool_id', s.tool_id,
                                              'tool_params', s.tool_params, 'status', s.status, 'result', s.result,
                                              'compensation_cmd', s.compensation_cmd, 'error', s.error,
                                              'started_at', s.started_at, 'completed_at', s.completed_at)) AS e(key, value)
                                    WHERE e.value <> 'null'::jsonb) ORDER BY s.seq)
                   FROM awooop_saga_step s
                  WHERE s.run_id = r.run_id), '[]'::jsonb) AS saga_steps
  FROM awooop_run_state r;

DO $$
DECLARE
    g RECORD;
BEGIN
    FOR g IN SELECT * FROM awooop_run_state_grants LOOP
        EXECUTE format('GRANT %s ON %I TO %s%s', g.privilege_type, g.relname,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
