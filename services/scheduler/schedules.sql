-- name: DueSchedules :many
-- The schedules due now, locked for this pass (another replica's pass skips them), at most 100
-- (the rest wait for the next pass). One whose last tick failed waits :error_retry before it is
-- tried again. now() is the pass's clock: the tick fired and the next one are computed from it.
-- not null: now, input
SELECT project_id, name, cron, time_zone, input::text AS input, next_tick, now() AS now
  FROM awooop_schedule
 WHERE next_tick <= now() AND (last_error_at IS NULL OR last_error_at <= now() - :error_retry::interval)
 ORDER BY next_tick
 LIMIT 100
   FOR UPDATE SKIP LOCKED

-- name: NotifyRunReady :exec
-- The wake-up of the claims waiting on the project (sent at the commit of the pass).
SELECT pg_notify(:channel, :project_id)

-- name: AdvanceSchedule :exec
-- After a fired tick: :next_tick is the next one ('infinity' when there is none; :error then
-- says why, else NULL clears the schedule's last error).
UPDATE awooop_schedule
   SET next_tick = :next_tick, last_error = :error,
       last_error_at = CASE WHEN :error::text IS NOT NULL THEN now() END, updated_at = now()
 WHERE project_id = :project_id AND name = :name

-- name: ScheduleFailed :exec
-- A tick that failed (rolled back alone): the error goes on the schedule, next_tick stays.
UPDATE awooop_schedule SET last_error = :error, last_error_at = now(), updated_at = now()
 WHERE project_id = :project_id AND name = :name

-- name: DatabaseNow :val
-- The store's clock, which every timestamp of a schedule comes from: SetSchedule's first tick
-- is computed (in Python: cron is croniter's) from this now(), read in SetSchedule's transaction.
-- not null: now
SELECT now()

-- name: SetSchedule :one
-- Creates or replaces a schedule (clearing its last error) with its SCHEDULE_SET audit row.
WITH s AS (
    INSERT INTO awooop_schedule (project_id, name, cron, time_zone, input, next_tick, created_by)
    VALUES (:project_id::text, :name::text, :cron, :time_zone, :input::text::jsonb, :next_tick, :actor)
    ON CONFLICT (project_id, name) DO UPDATE
       SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, input = EXCLUDED.input,
           next_tick = EXCLUDED.next_tick, last_error = NULL, last_error_at = NULL, updated_at = now()
    RETURNING project_id, name, cron, time_zone, input, next_tick, last_error, last_error_at
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'SCHEDULE_SET', NULL, NULL, NULL,
           jsonb_build_object('name', name, 'cron', cron, 'time_zone', time_zone)
      FROM s
)
SELECT * FROM s

-- name: DeleteSchedule :val
-- Deletes a schedule with its SCHEDULE_DELETED audit row; n is 0 when there was none.
WITH d AS (
    DELETE FROM awooop_schedule WHERE project_id = :project_id::text AND name = :name::text RETURNING project_id, name
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, NULL, :actor, 'SCHEDULE_DELETED', NULL, NULL, NULL, jsonb_build_object('name', name) FROM d
)
SELECT count(*) AS n FROM d

-- name: ListSchedules :many
SELECT project_id, name, cron, time_zone, input, next_tick, last_error, last_error_at
  FROM awooop_schedule
 WHERE project_id = :project_id
 ORDER BY name
