-- API-channel events on seed 003's rules (services/ingest/api_channel.py), a batch at a time.

-- name: IngestApiEvents :many
-- not null: ord, created, allowed, window_start, window_end
-- A batch of API events (distinct (project, key) pairs, one principal) in ONE statement: each
-- event's live key row is read, or a key row is claimed and its run and RUN_CREATED audit row are
-- written, or the event's key is found in the channel dedupe table of the previous release.
--
-- A key row is claimed by INSERT ... ON CONFLICT (seed 003's alternative to the advisory lock):
-- the unique index serializes requests of one scope. A request meeting a row another one is
-- still inserting waits for its commit; a live row committed by then is left as it is (and stays
-- unanswered here: this statement's snapshot predates it; the caller runs the statement again
-- for those events, and the new snapshot replays it); an expired row is replaced, so the key
-- starts afresh. Rows are inserted in key order, so two batches sharing keys lock them in the
-- same order.
--
-- A run is created for a claimed key only (claimed JOIN ev), a microsecond apart in the order of
-- the batch so the claim hands them out in the order sent. The snapshot the key row keeps is
-- made by the caller with the run id it generated. `allowed` is the caller's membership read by
-- this statement (a replay re-checks it; a role in :all_projects counts too). Keys of the old
-- rule: a dedupe row (project, 'api', key) within retention whose run this principal created,
-- for an event without a live key row; such an event claims nothing.
-- A debounced event (:debounced, docs/flow-control.md#debounce-and-batch) claims its key with
-- :run_id its batch's run, which this statement does not write: the caller's transaction locked
-- the batch before and opens or grows it after (services/ingest/debounce.py).
WITH ev AS (
    -- :traceparent is NULL while tracing is off: unnest pads it with NULLs
    SELECT * FROM unnest(:ord::int[], :project_id::varchar[], :key::varchar[], :run_id::uuid[], :input::text[],
                         :max_attempts::int[], :not_before::timestamptz[], :priority::int[], :retry_policy::text[],
                         :concurrency_keys::text[], :traceparent::varchar[], :fingerprint::text[], :snapshot::bytea[],
                         :auto_upgrade::bool[], :required_labels::text[], :preferred_labels::text[],
                         :debounced::bool[])
        AS t(ord, project_id, key, run_id, input, max_attempts, not_before, priority, retry_policy, concurrency_keys,
             traceparent, fingerprint, snapshot, auto_upgrade, required_labels, preferred_labels, debounced)
),
-- Each lookup is a LATERAL subquery with LIMIT 1: a probe of one index per event. As a plain join
-- the planner may turn it around when the table looks empty (a fresh store, where the first
-- plans are made and kept as the generic plan), and then scan every key of the principal once
-- per event: measured 4 ms -> 100 ms per batch as the key table grew to 4,000 rows.
live AS (
    SELECT ev.ord, k.*
      FROM ev
     CROSS JOIN LATERAL (
        SELECT k.request_fingerprint, k.policy_version, k.response_snapshot, k.resource_id, k.created_at, k.expires_at
          FROM awooop_idempotency_key k
         WHERE k.project_id = ev.project_id AND k.principal_type = :principal_type AND k.principal_id = :principal_id
           AND k.operation = :operation AND k.key = ev.key AND k.expires_at > now()
         LIMIT 1
     ) k
),
legacy AS (
    SELECT ev.ord, r.run_id, r.input, r.max_attempts
      FROM ev
     CROSS JOIN LATERAL (
        SELECT d.run_id
          FROM awooop_channel_event_dedupe d
         WHERE d.project_id = ev.project_id AND d.channel_type = 'api' AND d.provider_event_id = ev.key
           AND d.created_at > now() - make_interval(secs => :retention)
         LIMIT 1
     ) d
     CROSS JOIN LATERAL (
        SELECT r.run_id, r.input::text AS input, r.max_attempts
          FROM awooop_run_state r
         WHERE r.run_id = d.run_id AND r.created_by = :principal_id
         LIMIT 1
     ) r
     WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.ord = ev.ord)
),
claimed AS (
    INSERT INTO awooop_idempotency_key AS k
        (project_id, principal_type, principal_id, operation, key, request_fingerprint, policy_version,
         response_snapshot, resource_id, created_at, expires_at)
    SELECT ev.project_id, :principal_type, :principal_id, :operation, ev.key, ev.fingerprint, :policy_version,
           ev.snapshot, ev.run_id::text, now(), now() + make_interval(secs => :ttl)
      FROM ev
     WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.ord = ev.ord)
       AND NOT EXISTS (SELECT 1 FROM legacy WHERE legacy.ord = ev.ord)
     ORDER BY ev.project_id, ev.key
    ON CONFLICT (project_id, principal_type, principal_id, operation, key) DO UPDATE
       SET request_fingerprint = EXCLUDED.request_fingerprint, policy_version = EXCLUDED.policy_version,
           response_snapshot = EXCLUDED.response_snapshot, resource_id = EXCLUDED.resource_id,
           created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
     WHERE k.expires_at <= now()
    RETURNING k.project_id, k.key
),
new_runs AS (
    INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, input, max_attempts, created_by,
                                  created_at, updated_at, traceparent, not_before, wait_reason, priority, retry_policy,
                                  concurrency_keys, auto_upgrade, required_labels, preferred_labels)
    SELECT ev.run_id, ev.project_id, 'api', ev.key, ev.input::jsonb,
           COALESCE(NULLIF(ev.max_attempts, 0), ((:defaults::text::jsonb
        || COALESCE((SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = ev.project_id), '{}')
        || COALESCE(ev.retry_policy::jsonb, '{}'))->>'max_attempts')::int), :principal_id,
           now() + ev.ord * interval '1 microsecond', now() + ev.ord * interval '1 microsecond', ev.traceparent,
           ev.not_before, CASE WHEN ev.not_before IS NOT NULL THEN 'delayed' END, ev.priority,
           ev.retry_policy::jsonb, string_to_array(ev.concurrency_keys, ' '), ev.auto_upgrade,
           ev.required_labels::jsonb, ev.preferred_labels::jsonb
      FROM ev JOIN claimed c ON c.project_id = ev.project_id AND c.key = ev.key
     WHERE NOT ev.debounced
    RETURNING run_id, project_id, provider_event_id
),
audited AS (
    SELECT awooop_record_history(array_agg(ROW(project_id, run_id, :actor, 'RUN_CREATED', NULL, 'PENDING', NULL,
               jsonb_build_object('channel_type', 'api', 'provider_event_id', provider_event_id)
           )::awooop_history_row)) AS recorded
      FROM new_runs
)
SELECT ev.ord,
       c.key IS NOT NULL AS created,
       live.request_fingerprint, live.policy_version, live.response_snapshot, live.resource_id, live.created_at,
       live.expires_at,
       legacy.run_id AS legacy_run_id, legacy.input AS legacy_input, legacy.max_attempts AS legacy_max_attempts,
       EXISTS (SELECT 1 FROM awooop_project_member m
                WHERE m.principal_id = :principal_id AND m.project_id IN (ev.project_id, :all_projects)
                  AND m.role = ANY(:roles::text[])) AS allowed,
       now() AS window_start, now() + make_interval(secs => :ttl) AS window_end
  FROM ev
  CROSS JOIN audited  -- its one row: the join is what runs it
  LEFT JOIN claimed c ON c.project_id = ev.project_id AND c.key = ev.key
  LEFT JOIN live USING (ord)
  LEFT JOIN legacy USING (ord)

-- name: RecordLegacyApiKeys :exec
-- The key rows of old-rule keys that were just replayed (their checks passed), so later replays
-- take the ordinary path. A row recorded meanwhile by a concurrent replay is the same one; an
-- expired row is replaced.
INSERT INTO awooop_idempotency_key AS k
    (project_id, principal_type, principal_id, operation, key, request_fingerprint, policy_version,
     response_snapshot, resource_id, created_at, expires_at)
SELECT t.project_id, :principal_type, :principal_id, :operation, t.key, t.fingerprint, :policy_version, t.snapshot,
       t.resource_id, now(), now() + make_interval(secs => :ttl)
  FROM unnest(:project_id::varchar[], :key::varchar[], :fingerprint::text[], :snapshot::bytea[], :resource_id::text[])
       AS t(project_id, key, fingerprint, snapshot, resource_id)
 ORDER BY t.project_id, t.key
ON CONFLICT (project_id, principal_type, principal_id, operation, key) DO UPDATE
   SET request_fingerprint = EXCLUDED.request_fingerprint, policy_version = EXCLUDED.policy_version,
       response_snapshot = EXCLUDED.response_snapshot, resource_id = EXCLUDED.resource_id,
       created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
 WHERE k.expires_at <= now()
