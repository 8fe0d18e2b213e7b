-- name: GetRun :one
-- One run (every column: RunRow, what run_to_pb reads), and its
-- attempts used as the retry decision counts them (FailRun, the reaper, the claim: hand-backs and
-- parks on a wait do not count).
-- not null: attempts_used
SELECT *, attempt_count - released_count AS attempts_used FROM awooop_run_state WHERE run_id = :run_id

-- name: ListRuns :many
-- A page of ListRuns: a project's runs newest first, keyset-paginated on (created_at DESC, run_id)
-- to follow awooop_run_created_list_idx, :page_rows rows, after the last row of the previous page
-- (:after_created_at, :after_run_id; both NULL for the first page). Each filter is NULL for
-- "all": :statuses, :channels, created at or after :created_after and before :created_before,
-- :provider_event_id, :saga_statuses, :parent_run_id (a run's children), :build_id (the runs on a
-- worker build). The cursor is written as
-- bounds (NULL: 'infinity', which every row is before) rather than `:after IS NULL OR ...`, so that
-- a generic plan still starts the index scan at the cursor instead of filtering every newer row of
-- the project.
-- The page is read by one of two arms, each a page of its own over an index in the page's order:
-- the project's runs (awooop_run_created_list_idx, migration 0370: the facts a run is created with,
-- then the run by its key; a one-time filter skips the arm when :parent_run_id is
-- given) or the parent's children (awooop_run_children_list_idx, migration 0201; it finds nothing
-- when :parent_run_id is NULL). So the generic plan reads the project's arm as the one-arm
-- statement did and a parent's children as an index range from the cursor, not a filter over its
-- project. The children arm checks the project on the parent's row (a one-time probe: children
-- run in their parent's project), not on each child: a project condition on the children lets the
-- planner AND the project's index into the scan (5,000 children: 4 ms a page instead of 0.3). The
-- arms' filters are the same lines, written twice because a filter cannot move below an arm's
-- LIMIT (tests/test_read_statements.py holds them equal). The project's arm walks its runs'
-- awooop_run_created rows (c) in the page's order, the cursor and the creation bounds on them (the
-- same values as the run's), and reads each run by its key with the other filters; OFFSET 0 keeps
-- that a probe per row, so the page's LIMIT stops the walk (a join the planner may flatten read the
-- project's whole part of the index and sorted it in the generic plan). attempts_used: as GetRun's.
-- not null: attempts_used, awooop_run_state.*
SELECT *, attempt_count - released_count AS attempts_used
  FROM ((SELECT r.* FROM awooop_run_created c
          CROSS JOIN LATERAL (
                SELECT * FROM awooop_run_state
                 WHERE run_id = c.run_id
                   AND (:statuses::text[] IS NULL OR status = ANY(:statuses::text[]))
                   AND (:channels::text[] IS NULL OR channel_type = ANY(:channels::text[]))
                   AND (:provider_event_id::text IS NULL OR provider_event_id = :provider_event_id)
                   AND (:saga_statuses::text[] IS NULL OR saga_status = ANY(:saga_statuses::text[]))
                   AND (:build_id::text IS NULL OR build_id = :build_id::text)
                OFFSET 0) r
          WHERE c.project_id = :project_id AND :parent_run_id::uuid IS NULL
            AND (:created_after::timestamptz IS NULL OR c.created_at >= :created_after)
            AND (:created_before::timestamptz IS NULL OR c.created_at < :created_before)
            AND c.created_at <= COALESCE(:after_created_at::timestamptz, 'infinity')
            AND (c.created_at < COALESCE(:after_created_at::timestamptz, 'infinity') OR c.run_id > :after_run_id::uuid)
          ORDER BY c.created_at DESC, c.run_id
          LIMIT :page_rows)
        UNION ALL
        (SELECT * FROM awooop_run_state
          WHERE parent_run_id = :parent_run_id::uuid
            AND EXISTS (SELECT 1 FROM awooop_run_state p WHERE p.run_id = :parent_run_id::uuid AND (p.project_id = :project_id) IS TRUE)
            AND (:statuses::text[] IS NULL OR status = ANY(:statuses::text[]))
            AND (:channels::text[] IS NULL OR channel_type = ANY(:channels::text[]))
            AND (:provider_event_id::text IS NULL OR provider_event_id = :provider_event_id)
            AND (:saga_statuses::text[] IS NULL OR saga_status = ANY(:saga_statuses::text[]))
            AND (:build_id::text IS NULL OR build_id = :build_id::text)
            AND (:created_after::timestamptz IS NULL OR created_at >= :created_after)
            AND (:created_before::timestamptz IS NULL OR created_at < :created_before)
            AND created_at <= COALESCE(:after_created_at::timestamptz, 'infinity')
            AND (created_at < COALESCE(:after_created_at::timestamptz, 'infinity') OR run_id > :after_run_id::uuid)
          ORDER BY created_at DESC, run_id
          LIMIT :page_rows)) r
 ORDER BY created_at DESC, run_id
 LIMIT :page_rows

-- name: RunHistory :many
-- A run's audit rows, oldest first, at most :max_events. The run's project comes with the events
-- (one row with NULL events when it has none), so one round trip answers and authorizes.
SELECT r.project_id AS run_project, a.created_at, a.action, a.from_status, a.to_status, a.actor, a.reason, a.details
  FROM awooop_run_state r
  LEFT JOIN LATERAL (
        SELECT * FROM awooop_audit_log a WHERE a.run_id = r.run_id ORDER BY a.audit_id LIMIT :max_events
  ) a ON true
 WHERE r.run_id = :run_id
 ORDER BY a.audit_id
