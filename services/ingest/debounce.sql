-- Debounce and batch at ingest (services/ingest/debounce.py; docs/flow-control.md#debounce-and-batch).
-- The statements of one transaction that stores a flush's debounced events: lock the keys'
-- windows, lock their open batches, record each event's dedupe row with its batch's run, then
-- open the new batches and grow the open ones. A batch is a run: PENDING, wait_reason 'debounce',
-- not_before the end of its quiet window, which the claim passes over until then.

-- name: LockDebounceWindows :many
-- not null: ord
-- The window rows of the flush's keys (distinct), created when new and locked in key order either
-- way (ON CONFLICT DO UPDATE locks the row it meets): an event of the same key in another
-- transaction waits here until this one commits, so one key never opens two batches at once and
-- two flushes sharing keys lock them in the same order. Returns the run each key's last batch was
-- (NULL: never one) and when it opened; whether it is still open is read by the next statement,
-- whose snapshot sees a batch a concurrent transaction committed while this one waited.
WITH k AS (
    SELECT * FROM unnest(:ords::int[], :project_ids::varchar[], :channels::varchar[], :keys::varchar[])
        AS t(ord, project_id, channel_type, debounce_key)
),
w AS (
    INSERT INTO awooop_debounce_window AS w (project_id, channel_type, debounce_key)
    SELECT project_id, channel_type, debounce_key FROM k
     ORDER BY project_id, channel_type, debounce_key
    ON CONFLICT (project_id, channel_type, debounce_key) DO UPDATE SET debounce_key = EXCLUDED.debounce_key
    RETURNING w.project_id, w.channel_type, w.debounce_key, w.run_id, w.opened_at
)
SELECT k.ord, w.run_id, w.opened_at
  FROM k JOIN w USING (project_id, channel_type, debounce_key)

-- name: LockOpenBatches :many
-- not null: input
-- Of the runs the windows named, those still open as batches, locked: PENDING, waiting for
-- debounce, never claimed, their quiet window not over. A claim that took the run first made it
-- RUNNING (or parked it on a key, wait_reason key_busy): the row lock waits for it and the
-- re-checked conditions then leave it out, so the event opens a new batch. A claim that comes
-- while the row is locked here passes over it (SKIP LOCKED). Their input, which the events grow.
SELECT r.run_id, r.input::text AS input
  FROM awooop_run_state r
 WHERE r.run_id = ANY(:run_ids::uuid[])
   AND r.status = 'PENDING' AND r.wait_reason = 'debounce' AND r.attempt_count = 0 AND r.not_before > now()
 ORDER BY r.run_id
   FOR UPDATE

-- name: RecordDebouncedEvents :many
-- Each event's dedupe row, naming the batch it joins (:run_ids), in key order. An event whose row
-- exists is a duplicate and changes nothing: ON CONFLICT waits for a concurrent inserter of the
-- same event and then leaves its row; the caller reads those rows afterwards (FindStoredEvents).
-- Returns the events recorded.
INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
SELECT t.project_id, t.channel_type, t.provider_event_id, t.run_id
  FROM unnest(:project_ids::varchar[], :channels::varchar[], :provider_event_ids::varchar[], :run_ids::uuid[])
       AS t(project_id, channel_type, provider_event_id, run_id)
 ORDER BY t.project_id, t.channel_type, t.provider_event_id
ON CONFLICT (project_id, channel_type, provider_event_id) DO NOTHING
RETURNING project_id, channel_type, provider_event_id

-- name: WriteBatches :many
-- not null: run_id, not_before
-- The batches the flush's new events went to, each with its whole new input (debounce.py builds
-- it; :ords its order, a key's later batches last), and the open batches it closed (full): a new batch (:opened_ats NULL) is a PENDING run created as StoreEvents creates one (max
-- attempts, priority, retry policy, keys, labels and traceparent of its first event), with its RUN_CREATED
-- audit row, and its window row names it from now; an open batch takes the input. Either way the
-- batch is due when its key has been quiet for the window, and no later than the max wait after
-- its first event: not_before = least(opened + max wait, now + window); a batch that is full
-- (:fulls, debounce.py's MAX_BATCH_EVENTS) is due now, which closes it.
WITH b AS (
    SELECT * FROM unnest(:ords::int[], :run_ids::uuid[], :opened_ats::timestamptz[], :project_ids::varchar[], :channels::varchar[],
                         :keys::varchar[], :provider_event_ids::varchar[], :inputs::text[], :window_secs::float8[],
                         :max_wait_secs::float8[], :fulls::bool[], :max_attempts::int[], :priorities::int[],
                         :retry_policies::text[],
                         :concurrency_keys::text[], :traceparents::varchar[], :auto_upgrades::bool[],
                         :required_labels::text[], :preferred_labels::text[])
        AS t(ord, run_id, opened_at, project_id, channel_type, debounce_key, provider_event_id, input, window_secs,
             max_wait_secs, is_full, max_attempts, priority, retry_policy, concurrency_keys, traceparent, auto_upgrade,
             required_labels, preferred_labels)
),
new_runs AS (
    INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, input, max_attempts, created_by,
                                  not_before, wait_reason, priority, retry_policy, concurrency_keys, traceparent,
                                  auto_upgrade, required_labels, preferred_labels)
    SELECT b.run_id, b.project_id, b.channel_type, b.provider_event_id, b.input::jsonb,
           COALESCE(NULLIF(b.max_attempts, 0), ((:policy_defaults::text::jsonb
        || COALESCE((SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = b.project_id), '{}')
        || COALESCE(b.retry_policy::jsonb, '{}'))->>'max_attempts')::int), :principal_id,
           CASE WHEN b.is_full THEN now() ELSE now() + make_interval(secs => least(b.window_secs, b.max_wait_secs)) END,
           'debounce', b.priority,
           b.retry_policy::jsonb, string_to_array(b.concurrency_keys, ' '), b.traceparent, b.auto_upgrade,
           b.required_labels::jsonb, b.preferred_labels::jsonb
      FROM b WHERE b.opened_at IS NULL
    RETURNING run_id, project_id, channel_type, provider_event_id, not_before
),
grown AS (
    UPDATE awooop_run_state r
       SET input = b.input::jsonb, wait_reason = 'debounce', updated_at = now(),
           not_before = CASE WHEN b.is_full THEN now()
                             ELSE least(b.opened_at + make_interval(secs => b.max_wait_secs),
                                        now() + make_interval(secs => b.window_secs)) END
      FROM b
     WHERE r.run_id = ANY(:run_ids::uuid[]) AND r.run_id = b.run_id AND b.opened_at IS NOT NULL
    RETURNING r.run_id, r.not_before
),
opened AS (
    UPDATE awooop_debounce_window w
       SET run_id = b.run_id, opened_at = now()
      FROM (SELECT DISTINCT ON (project_id, channel_type, debounce_key) * FROM b WHERE opened_at IS NULL
             ORDER BY project_id, channel_type, debounce_key, ord DESC) b  -- a key's last new batch
     WHERE w.project_id = b.project_id AND w.channel_type = b.channel_type AND w.debounce_key = b.debounce_key
),
audited AS (
    SELECT awooop_record_history(array_agg(ROW(n.project_id, n.run_id, :actor, 'RUN_CREATED', NULL, 'PENDING', NULL,
               jsonb_build_object('channel_type', n.channel_type, 'provider_event_id', n.provider_event_id,
                                  'debounce_key', b.debounce_key)
           )::awooop_history_row)) AS recorded
      FROM new_runs n JOIN b USING (run_id)
)
SELECT run_id, not_before FROM new_runs CROSS JOIN audited
UNION ALL
SELECT run_id, not_before FROM grown

-- name: ReadDebounceRules :many
-- The debounce rules of the (project, channel) pairs a flush holds (ingest caches them for
-- AWOOOP_DEBOUNCE_RULE_CACHE_SECONDS; a pair without a row has no rule).
SELECT r.project_id, r.channel_type, r.key_expression, r.window_secs, r.max_wait_secs, r.mode
  FROM unnest(:project_ids::varchar[], :channels::varchar[]) AS t(project_id, channel_type)
  JOIN awooop_debounce_rule r USING (project_id, channel_type)
