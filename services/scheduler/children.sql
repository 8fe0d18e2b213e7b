-- Child runs' statements (services/scheduler/children.py; docs/architecture.md "Child runs";
-- migration 0190).

-- name: ParentOfChildren :one
-- The caller's parent run under its lease, for the limits StartChildRuns checks before it writes:
-- its depth and how many children it has besides those named :step_ids (the fan-out limit counts
-- every child it ever started; a parent run again names children it has already).
-- not null: children
SELECT r.run_id, r.project_id, r.child_depth,
       (SELECT count(*) FROM awooop_run_state c
         WHERE c.parent_run_id = r.run_id AND NOT c.parent_step_id = ANY(:step_ids::text[])) AS children
  FROM awooop_run_state r
 WHERE r.run_id = :run_id AND r.attempt_count = :attempt AND r.status = 'RUNNING'
   AND (:projects::text[] IS NULL OR r.project_id = ANY(:projects::text[])) IS TRUE

-- name: StartChildRuns :many
-- Starts the caller's children (:children, a JSON array in the handler's order: step_id, input,
-- priority, not_before, concurrency_keys, max_attempts, required_labels, preferred_labels) in the parent's project, each PENDING with
-- its RUN_CREATED audit row, the parent's trace context (:traceparent: this RPC's span, else the
-- parent's) and depth + 1; a child the parent started before (same step id: a parent run again
-- from the top) is found, not started again. With :wait_step_id, the 'children' wait over all of
-- them is created in the same statement (or found again): children that exist only from this
-- statement on cannot end before their wait exists, and children started earlier are locked
-- (FOR SHARE) so that one ending meanwhile either sees the wait or is seen as ended here. The wait
-- is created ended when its children have already ended (or, :fail_fast, one of them failed).
-- Fenced by the parent's lease (RUNNING at :attempt). Returns one row per child, in order, with
-- the wait's columns on each row (NULL without :wait_step_id).
WITH parent AS (
    SELECT run_id, project_id, child_depth, traceparent
      FROM awooop_run_state
     WHERE run_id = :run_id AND attempt_count = :attempt AND status = 'RUNNING'
       AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE
),
spec AS (
    SELECT e.c ->> 'step_id' AS step_id, e.c -> 'input' AS input, (e.c ->> 'priority')::int AS priority,
           (e.c ->> 'not_before')::timestamptz AS not_before,
           CASE WHEN jsonb_typeof(e.c -> 'concurrency_keys') = 'array'
                THEN ARRAY(SELECT jsonb_array_elements_text(e.c -> 'concurrency_keys')) END AS concurrency_keys,
           (e.c ->> 'max_attempts')::int AS max_attempts, e.ord,
           NULLIF(e.c -> 'required_labels', 'null') AS required_labels,
           NULLIF(e.c -> 'preferred_labels', 'null') AS preferred_labels
      FROM jsonb_array_elements(:children::text::jsonb) WITH ORDINALITY AS e(c, ord)
),
known AS (
    SELECT c.run_id, c.parent_step_id, c.status, c.output, c.failure_reason, c.error_code
      FROM awooop_run_state c, parent p
     WHERE c.project_id = p.project_id AND c.parent_run_id = p.run_id
       AND c.parent_step_id IN (SELECT step_id FROM spec)
     ORDER BY c.run_id
       FOR SHARE OF c
),
ins AS (
    INSERT INTO awooop_run_state (project_id, channel_type, input, max_attempts, created_by, not_before, wait_reason,
                                  priority, concurrency_keys, traceparent, parent_run_id, parent_step_id, child_depth,
                                  child_seq, required_labels, preferred_labels)
    SELECT p.project_id, 'api', s.input,
           COALESCE(NULLIF(s.max_attempts, 0), ((:policy_defaults::text::jsonb
               || COALESCE((SELECT f.retry_policy FROM awooop_project_flow f WHERE f.project_id = p.project_id), '{}'))
               ->> 'max_attempts')::int),
           :principal_id, s.not_before, CASE WHEN s.not_before IS NOT NULL THEN 'delayed' END, COALESCE(s.priority, 0),
           s.concurrency_keys, COALESCE(:traceparent, p.traceparent), p.run_id, s.step_id, p.child_depth + 1,
           nextval('awooop_child_seq'), s.required_labels, s.preferred_labels
      FROM (SELECT * FROM spec WHERE step_id NOT IN (SELECT parent_step_id FROM known) ORDER BY ord) s, parent p
    ON CONFLICT (project_id, parent_run_id, parent_step_id) WHERE parent_run_id IS NOT NULL DO NOTHING
    RETURNING run_id, project_id, parent_step_id, status, output, failure_reason, error_code, child_seq
),
-- the children's history rows, as one array: one call of the log's writer however many children
-- (a row at a time through the audit view was one subtransaction each, migration 0420)
audited AS (
    SELECT awooop_record_history(array_agg(ROW(i.project_id, i.run_id, :actor, 'RUN_CREATED', NULL, 'PENDING', NULL,
               jsonb_build_object('channel_type', 'api', 'parent_run_id', :run_id::uuid, 'step_id', i.parent_step_id)
           )::awooop_history_row ORDER BY i.child_seq)) AS recorded
      FROM ins i
),
kids AS (
    SELECT s.ord, s.step_id, COALESCE(i.run_id, k.run_id) AS run_id, COALESCE(i.status, k.status) AS status,
           COALESCE(i.output, k.output) AS output, COALESCE(i.failure_reason, k.failure_reason) AS failure_reason,
           COALESCE(i.error_code, k.error_code) AS error_code, i.run_id IS NOT NULL AS started
      FROM spec s
      LEFT JOIN ins i ON i.parent_step_id = s.step_id
      LEFT JOIN known k ON k.parent_step_id = s.step_id
),
wait AS (
    INSERT INTO awooop_wait AS w (project_id, run_id, step_id, kind, expires_at, child_ids, fail_fast, status, result,
                                  completed_by, completed_at)
    SELECT p.project_id, p.run_id, :wait_step_id::text, 'children', now() + make_interval(secs => :timeout),
           (SELECT array_agg(run_id ORDER BY ord) FROM kids), :fail_fast::boolean,
           CASE WHEN ended.yes THEN 'completed' ELSE 'open' END,
           CASE WHEN ended.yes THEN jsonb_build_object('ended_by', NULL, 'status', NULL, 'fail_fast', false) END,
           CASE WHEN ended.yes THEN 'system:children' END,
           CASE WHEN ended.yes THEN now() END
      FROM parent p,
           LATERAL (SELECT NOT EXISTS (SELECT 1 FROM kids WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
                           OR (:fail_fast::boolean AND EXISTS (SELECT 1 FROM kids WHERE status IN ('FAILED', 'CANCELLED')))
                           AS yes) ended
     WHERE :wait_step_id::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM kids WHERE run_id IS NULL)
    ON CONFLICT (run_id, step_id) DO UPDATE SET fail_fast = w.fail_fast
    RETURNING w.wait_id, w.step_id AS wait_step_id, w.status AS wait_status, w.kind, w.expires_at, w.result,
              w.completed_by, w.completed_at, (w.xmax = 0) AS wait_created
),
-- the claimers' wake-up (the run-ready channel), when children were started
notified AS (
    SELECT pg_notify('awooop_run_ready', p.project_id) FROM parent p WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT k.ord, k.step_id, k.run_id, k.status, k.output, k.failure_reason, k.error_code, k.started,
       (SELECT count(*) FROM parent) > 0 AS leased, (SELECT count(*) FROM notified) AS notified, w.*
  FROM kids k LEFT JOIN wait w ON true
 CROSS JOIN audited  -- its one row: the join is what runs it
 ORDER BY k.ord

-- name: ChildrenOf :many
-- A run's children in the order they were started (GetRun's run tree; at most :limit).
SELECT run_id, parent_step_id, status
  FROM awooop_run_state
 WHERE parent_run_id = :run_id
 ORDER BY child_seq
 LIMIT :limit
