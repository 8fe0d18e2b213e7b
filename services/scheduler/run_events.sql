-- A run's event log (services/scheduler/run_events.py; migration 0180, docs/architecture.md
-- "Watching a run"): progress events emitted under the run's lease, and the reads of WatchRun.

-- name: EmitRunEvent :one
-- A progress event of the caller's run under its fencing token (:run_id, :attempt) in the caller's
-- :projects (NULL: any), with its :kind, :data and optional :emit_key, within the run's bounds
-- (:max_count events, :max_bytes of data). One call of awooop_emit_run_event (migration 0180),
-- which locks the run row and then assigns the next seq: outcome emitted, duplicate (the key's
-- first event), exhausted or lease_lost. :data is the event's JSON text, parsed here (a text
-- parameter: the pool's jsonb codec would encode the text once more, as a JSON string).
-- not null: outcome, seq, progress_no, progress_bytes
SELECT outcome, seq, progress_no, progress_bytes
  FROM awooop_emit_run_event(:run_id::uuid, :attempt::int, :projects::text[], :kind::text, :data::text::jsonb,
                             :emit_key::text, :max_count::int, :max_bytes::bigint)

-- name: LastRunEventSeq :val
-- The seq of a run's last log row (0: none yet): the highest offset WatchRun accepts. The newest
-- row of the primary key, not max(seq): a generic plan made while the run had few rows may
-- aggregate over all of them (migration 0250).
SELECT COALESCE((SELECT seq FROM awooop_run_event WHERE run_id = :run_id ORDER BY seq DESC LIMIT 1), 0)

-- name: RunEventsAfter :many
-- A run's log after offset :after, in order, at most :max_rows rows (the primary key's order).
-- A state row written since migration 0360 has its change in columns (actor set) and its
-- details as data; LogRow (run_events.py) serves it as the one JSON object of the older rows.
SELECT seq, source, kind, data, attempt, created_at, actor, from_status, to_status, reason
  FROM awooop_run_event
 WHERE run_id = :run_id AND seq > :after
 ORDER BY seq
 LIMIT :max_rows

-- name: MarkWatched :exec
-- Somebody watches the run until :ttl seconds from now: its new log rows send a NOTIFY on
-- awooop_run_event (migration 0180's awooop_append_run_event) until then.
INSERT INTO awooop_run_watch AS w (run_id, watched_until)
VALUES (:run_id, now() + make_interval(secs => :ttl))
ON CONFLICT (run_id) DO UPDATE SET watched_until = GREATEST(w.watched_until, EXCLUDED.watched_until)
