-- name: StoreEvents :many
-- not null: ord, created
-- The whole first-arrival path for any number of events in ONE statement (so one round trip
-- and one transaction): dedupe rows ON CONFLICT DO NOTHING, a PENDING run and a RUN_CREATED
-- audit row for each dedupe row actually inserted, and the existing run_id for each event that
-- was already there. The dedupe row and its run are written by the same statement, so neither
-- ever exists without the other. Run ids come from the caller (:run_ids), so the statement joins
-- the inserted dedupe rows to their runs without a second key lookup.
-- A statement's runs are created a microsecond apart in the order of its events (:ords), so the
-- claim (oldest created_at first) hands out the events of one delivery (LINE sends several) and
-- of one batch in the order they were sent, not in whatever order equal timestamps come back.
-- Rows are inserted in key order so that two batches sharing keys lock them in the same order
-- and cannot deadlock. The final join sees dedupe rows committed before the statement began; a
-- row committed by a concurrent request while we waited on it shows up as run_id NULL and is
-- read by FindStoredEvents in a follow-up statement.
-- A new run's max_attempts: the request's (0: unset), else its effective retry policy's
-- (:policy_defaults, then its project's, then its own; services/common/retry_policy.py).
-- :concurrency_keys holds each run's keys joined by spaces (unnest takes no ragged arrays).
-- The wake-up NOTIFY is not part of this statement: it is sent after the commit
-- (services/ingest/wakeup.py explains why).
WITH ev AS (
    -- :traceparents is NULL while tracing is off: unnest pads it with NULLs
    SELECT * FROM unnest(:ords::int[], :project_ids::varchar[], :channels::varchar[], :provider_event_ids::varchar[],
                         :run_ids::uuid[], :inputs::text[], :max_attempts::int[], :not_befores::timestamptz[],
                         :priorities::int[], :retry_policies::text[], :concurrency_keys::text[],
                         :traceparents::varchar[], :auto_upgrades::bool[], :required_labels::text[],
                         :preferred_labels::text[])
        AS t(ord, project_id, channel_type, provider_event_id, run_id, input, max_attempts, not_before, priority,
             retry_policy, concurrency_keys, traceparent, auto_upgrade, required_labels, preferred_labels)
),
ins AS (
    INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
    SELECT project_id, channel_type, provider_event_id, run_id FROM ev
     ORDER BY project_id, channel_type, provider_event_id
    ON CONFLICT (project_id, channel_type, provider_event_id) DO NOTHING
    RETURNING run_id
),
new_runs AS (
    INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, input, max_attempts, created_by,
                                  created_at, updated_at, not_before, wait_reason, priority, retry_policy,
                                  concurrency_keys, traceparent, auto_upgrade, required_labels, preferred_labels)
    SELECT ev.run_id, ev.project_id, ev.channel_type, ev.provider_event_id, ev.input::jsonb,
           COALESCE(NULLIF(ev.max_attempts, 0), ((:policy_defaults::text::jsonb
        || COALESCE((SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = ev.project_id), '{}')
        || COALESCE(ev.retry_policy::jsonb, '{}'))->>'max_attempts')::int), :principal_id,
           now() + ev.ord * interval '1 microsecond', now() + ev.ord * interval '1 microsecond',
           ev.not_before, CASE WHEN ev.not_before IS NOT NULL THEN 'delayed' END, ev.priority,
           ev.retry_policy::jsonb, string_to_array(ev.concurrency_keys, ' '), ev.traceparent, ev.auto_upgrade,
           ev.required_labels::jsonb, ev.preferred_labels::jsonb
      FROM ev JOIN ins USING (run_id)
    RETURNING run_id, project_id, channel_type, provider_event_id
),
audited AS (
    SELECT awooop_record_history(array_agg(ROW(project_id, run_id, :actor, 'RUN_CREATED', NULL, 'PENDING', NULL,
               jsonb_build_object('channel_type', channel_type, 'provider_event_id', provider_event_id)
           )::awooop_history_row)) AS recorded
      FROM new_runs
)
SELECT ev.ord,
       COALESCE(ins.run_id, d.run_id) AS run_id,
       ins.run_id IS NOT NULL AS created,
       extract(epoch FROM d.created_at + make_interval(secs => :retention) - now())::float8 AS ttl_left
  FROM ev
  CROSS JOIN audited  -- its one row: the join is what runs it
  LEFT JOIN ins USING (run_id)
  -- only an event whose row was there already reads it: the lateral's filter on ins is checked
  -- before its index probe (a one-time filter), so a created event costs no probe; as a plain
  -- join the probe ran for every event and the filter after it
  LEFT JOIN LATERAL (
      SELECT d.run_id, d.created_at
        FROM awooop_channel_event_dedupe d
       WHERE ins.run_id IS NULL
         AND d.project_id = ev.project_id AND d.channel_type = ev.channel_type
         AND d.provider_event_id = ev.provider_event_id
       LIMIT 1  -- (the key is unique) keeps the subquery a subquery, so the filter stays first
  ) d ON true

-- name: FindStoredEvents :many
-- not null: ord
-- The run of each event whose dedupe row a concurrent request committed after StoreEvents took
-- its snapshot, with the seconds that row has left before retention (:retention) prunes it.
SELECT t.ord, d.run_id,
       extract(epoch FROM d.created_at + make_interval(secs => :retention) - now())::float8 AS ttl_left
  FROM unnest(:ords::int[], :project_ids::varchar[], :channels::varchar[], :provider_event_ids::varchar[])
       AS t(ord, project_id, channel_type, provider_event_id)
  JOIN awooop_channel_event_dedupe d USING (project_id, channel_type, provider_event_id)

-- name: CreateRun :one
-- A PENDING run of the API channel (CreateRun) with its RUN_CREATED audit row, in one statement;
-- the idempotency key is recorded in the audit row (the run has no provider_event_id: its dedupe
-- is the idempotency key table). max_attempts as StoreEvents'; a requested delay (:not_before)
-- is the run's wait_reason 'delayed'. Returns the run (every column: RunRow).
WITH run AS (
    INSERT INTO awooop_run_state (project_id, channel_type, input, max_attempts, created_by, not_before, wait_reason,
                                  priority, retry_policy, concurrency_keys, traceparent, auto_upgrade,
                                  required_labels, preferred_labels)
    VALUES (:project_id::text, 'api', :input::text::jsonb,
            COALESCE(NULLIF(:max_attempts::int, 0), ((:policy_defaults::text::jsonb
        || COALESCE((SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = :project_id::text), '{}')
        || COALESCE(:retry_policy::text::jsonb, '{}'))->>'max_attempts')::int), :principal_id,
            :not_before, CASE WHEN :not_before::timestamptz IS NOT NULL THEN 'delayed' END, :priority,
            :retry_policy::text::jsonb, :concurrency_keys::text[], :traceparent, :auto_upgrade::bool,
            :required_labels::text::jsonb, :preferred_labels::text::jsonb)
    RETURNING *
),
audited AS (
    SELECT awooop_record_history(array_agg(ROW(project_id, run_id, :actor, 'RUN_CREATED', NULL, 'PENDING', NULL,
               jsonb_build_object('channel_type', 'api', 'idempotency_key', :idempotency_key::text)
           )::awooop_history_row)) AS recorded
      FROM run
)
SELECT run.* FROM run CROSS JOIN audited  -- its one row: the join is what runs it
