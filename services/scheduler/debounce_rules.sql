-- Debounce rules per (project, channel) (awooop_debounce_rule, migration 0410), as the flow RPCs
-- set, list and delete them (services/scheduler/debounce_rules.py). Ingest reads them
-- (services/ingest/debounce.py) and batches the channel's events by the rule's key. Each change
-- writes a DEBOUNCE_RULE_SET or DEBOUNCE_RULE_DELETED audit row (runstate.Audit).

-- name: SetDebounceRule :one
-- Creates or replaces the rule of (:project_id, :channel_type). Batches open at the time keep the
-- window they were opened with until their next event, which times them by the new rule.
WITH rule AS (
    INSERT INTO awooop_debounce_rule (project_id, channel_type, key_expression, window_secs, max_wait_secs, mode,
                                      updated_by)
    VALUES (:project_id::text, :channel_type::text, :key_expression::text, :window_secs::float8,
            :max_wait_secs::float8, :mode::text, :actor::text)
    ON CONFLICT (project_id, channel_type) DO UPDATE
       SET key_expression = EXCLUDED.key_expression, window_secs = EXCLUDED.window_secs,
           max_wait_secs = EXCLUDED.max_wait_secs, mode = EXCLUDED.mode, updated_by = EXCLUDED.updated_by,
           updated_at = now()
    RETURNING *
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'DEBOUNCE_RULE_SET', NULL, NULL, NULL,
           jsonb_build_object('channel_type', channel_type, 'key_expression', key_expression,
                              'window_secs', window_secs, 'max_wait_secs', max_wait_secs, 'mode', mode)
      FROM rule
)
SELECT project_id, channel_type, key_expression, window_secs, max_wait_secs, mode, updated_by, updated_at FROM rule

-- name: ListDebounceRules :many
-- A project's rules, by channel.
SELECT project_id, channel_type, key_expression, window_secs, max_wait_secs, mode, updated_by, updated_at
  FROM awooop_debounce_rule
 WHERE project_id = :project_id
 ORDER BY channel_type

-- name: DeleteDebounceRule :one
-- not null: deleted
-- Removes the rule of (:project_id, :channel_type), audited when there was one. Batches already
-- open start when their window ends; the channel's later events are runs of their own.
WITH gone AS (
    DELETE FROM awooop_debounce_rule WHERE project_id = :project_id AND channel_type = :channel_type
    RETURNING project_id, channel_type, key_expression
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'DEBOUNCE_RULE_DELETED', NULL, NULL, NULL,
           jsonb_build_object('channel_type', channel_type, 'key_expression', key_expression)
      FROM gone
)
SELECT EXISTS (SELECT 1 FROM gone) AS deleted
