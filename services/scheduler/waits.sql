-- Durable waits' statements (services/scheduler/waits.py; docs/architecture.md "Durable waits").
-- Locks are taken wait first, then run, in every statement that takes both (and in
-- awooop_end_wait, migration 0160), so parks, completions and the sweep never deadlock.

-- name: CreateWait :one
-- The wait named :step_id of the caller's run, created open with its expiry (an event wait with
-- its match: channel, correlation key and the look-back its events may arrive in), or the one an
-- earlier attempt (or an earlier call of this attempt) created: the handler runs again from the
-- top after a resume and must find the same wait. An open token wait gets the caller's token
-- (:token_hash) as one more that completes it (awooop_wait_token, migration 0290): the answer that
-- carried an earlier one may have been lost (its attempt crashed before it parked), or it was
-- handed out already and must keep working; `issued` says whether the caller's token was added.
-- The conflict's no-op update locks the wait, so a completion ending it meanwhile is seen as
-- ended here and no token is issued for it. The lease is checked, not locked: a wait written for a
-- run whose lease was lost meanwhile is found by the run's next attempt, which is what it is for.
WITH lease AS (
    SELECT run_id, project_id FROM awooop_run_state
     WHERE run_id = :run_id AND attempt_count = :attempt AND status = 'RUNNING'
       AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE
),
w AS (
    INSERT INTO awooop_wait AS w (project_id, run_id, step_id, kind, expires_at, match_channel, match_key, match_since)
    SELECT l.project_id, l.run_id, :step_id::text, :kind::text, now() + make_interval(secs => :timeout),
           CASE WHEN :kind::text = 'event' THEN :match_channel::text END,
           CASE WHEN :kind::text = 'event' THEN :match_key::text END,
           CASE WHEN :kind::text = 'event' THEN now() - make_interval(secs => :lookback) END
      FROM lease l
    ON CONFLICT (run_id, step_id) DO UPDATE SET status = w.status
    RETURNING w.wait_id, w.run_id, w.project_id, w.step_id, w.kind, w.status, w.expires_at, w.result, w.completed_by,
              w.completed_at, w.created_at, (w.xmax = 0) AS created,
              (w.status = 'open' AND w.kind = 'token') AS issued
),
token AS (
    INSERT INTO awooop_wait_token (token_hash, wait_id)
    SELECT :token_hash::bytea, w.wait_id FROM w WHERE w.issued
)
SELECT * FROM w

-- name: ParkOnWait :one
-- The caller's run parks on its wait: RUNNING -> WAITING_TOOL with no lease (runstate PARK). The
-- attempt's token is spent (attempt_count + 1) so nothing the parked attempt still sends (a
-- heartbeat, a journal write, a FailRun) can touch the run; released_count + 2 keeps the attempts
-- used (attempt_count - released_count) where the claim left them minus this one, as an approval
-- hand-back does. Parks only while the wait is open; an ended wait answers its outcome instead
-- (the run goes on). `w` is locked before the run (`cur` reads it first).
WITH w AS (
    SELECT wait_id, run_id, status, kind, expires_at, result, completed_by, completed_at, step_id
      FROM awooop_wait
     WHERE wait_id = :wait_id AND run_id = :run_id
       FOR UPDATE
),
cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = :run_id AND (SELECT count(*) FROM w) >= 0 FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'WAITING_TOOL', lease_until = NULL, worker_id = NULL,
           attempt_count = r.attempt_count + 1, released_count = r.released_count + 2, updated_at = now(),
           -- in a project with sticky resume, its resume prefers this worker for a while
           -- (claims.sql, "Labels"; migration 0400)
           sticky_worker = CASE WHEN EXISTS (SELECT 1 FROM awooop_project_flow f
                                              WHERE f.project_id = r.project_id AND f.sticky_seconds > 0)
                                THEN r.worker_id END,
           -- what it waits for and until when, for GetRun's readers (`awooop runs show`, the console);
           -- awooop_end_wait clears both when the wait ends (run_options.WaitReason)
           wait_reason = CASE w.kind WHEN 'token' THEN 'wait_token' WHEN 'sleep' THEN 'wait_sleep'
                                     WHEN 'children' THEN 'wait_children' ELSE 'wait_event' END,
           not_before = w.expires_at
      FROM cur, w
     WHERE r.run_id = cur.cur_run_id AND r.attempt_count = :attempt AND r.status = 'RUNNING'
       AND (:projects::text[] IS NULL OR r.project_id = ANY(:projects::text[])) IS TRUE
       AND NOT r.cancel_requested AND w.status = 'open'
 RETURNING r.run_id, r.project_id, r.attempt_count, cur.cur_worker AS prev_worker
),
parked AS (
    UPDATE awooop_wait aw SET parked_attempt = upd.attempt_count
      FROM upd
     WHERE aw.wait_id = :wait_id
 RETURNING aw.wait_id
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT upd.project_id, upd.run_id, :actor, 'WAIT_PARKED', 'RUNNING', 'WAITING_TOOL', w.step_id,
           jsonb_build_object('attempt', :attempt::int, 'worker_id', prev_worker, 'wait_id', w.wait_id,
                              'kind', w.kind, 'expires_at', w.expires_at)
      FROM upd, w
)
SELECT cur.*, (SELECT count(*) FROM parked) > 0 AS parked, w.wait_id, w.status AS wait_status, w.kind, w.expires_at,
       w.result, w.completed_by, w.completed_at, w.step_id
  FROM cur LEFT JOIN w ON true

-- name: CompleteWait :one
-- A wait ended by the RPC CompleteWait: the first outcome wins (awooop_end_wait). A children wait
-- (migration 0190) of the caller's projects ends only by its children: no row, nothing ended.
SELECT * FROM awooop_end_wait(:wait_id, 'completed', :result, :actor, :projects::text[])
 WHERE NOT EXISTS (SELECT 1 FROM awooop_wait
                    WHERE wait_id = :wait_id AND kind = 'children'
                      AND (:projects::text[] IS NULL OR project_id = ANY(:projects::text[])) IS TRUE)

-- name: ExpireWaits :many
-- The timeout sweep: open waits past their expiry end timed_out, and runs parked on them are
-- re-queued (the handler sees the timeout). SKIP LOCKED batches, so several scheduler replicas
-- sweep without waiting on each other; :only restricts it to one run's waits (the pass's fallback
-- when a batch failed for one run's data).
SELECT e.*
  FROM (SELECT wait_id
          FROM awooop_wait
         WHERE status = 'open' AND expires_at <= now() AND (:only::uuid IS NULL OR run_id = :only)
         ORDER BY expires_at
         LIMIT :batch
           FOR UPDATE SKIP LOCKED) due,
       LATERAL awooop_end_wait(due.wait_id, 'timed_out', NULL, :actor, NULL) e

-- name: MatchEventWaits :many
-- The event matcher: each open event wait takes the earliest event of its project and channel
-- whose match key (awooop_event_key, migration 0171: an API event's correlation key, a Telegram
-- message's chat, an Alertmanager resolve's group) is the wait's and that arrived since the
-- wait's look-back began, and ends completed with it (awooop_end_wait: the first outcome wins,
-- a parked run resumes).
-- Every event is a run of its own (the channel's run), so the event is found by the key its run
-- was created with (awooop_run_created, migration 0370) and read from the run: its payload is
-- the run's input. SKIP LOCKED batches, as ExpireWaits.
SELECT e.*
  FROM (SELECT w.wait_id, m.run_id AS event_run_id, m.provider_event_id, m.input, m.created_at AS arrived_at
          FROM awooop_wait w
          JOIN LATERAL (SELECT r.run_id, r.provider_event_id, r.input, r.created_at
                          FROM awooop_run_created c JOIN awooop_run_state r ON r.run_id = c.run_id
                         WHERE c.project_id = w.project_id AND c.channel_type = w.match_channel
                           AND c.match_key = w.match_key
                           AND c.created_at >= w.match_since AND c.run_id <> w.run_id
                         ORDER BY c.created_at
                         LIMIT 1) m ON true
         WHERE w.status = 'open' AND w.kind = 'event' AND (:only::uuid IS NULL OR w.run_id = :only)
         ORDER BY w.created_at
         LIMIT :batch
           FOR UPDATE OF w SKIP LOCKED) hit,
       LATERAL awooop_end_wait(hit.wait_id, 'completed',
                               jsonb_build_object('run_id', hit.event_run_id, 'provider_event_id', hit.provider_event_id,
                                                  'payload', hit.input, 'arrived_at', hit.arrived_at),
                               :actor, NULL) e

-- name: MatchedEventWaitRuns :many
-- The runs whose event waits a matcher batch would end, for ending them one run at a time.
SELECT w.run_id
  FROM awooop_wait w
 WHERE w.status = 'open' AND w.kind = 'event'
   AND EXISTS (SELECT 1 FROM awooop_run_created c
                WHERE c.project_id = w.project_id AND c.channel_type = w.match_channel
                  AND c.match_key = w.match_key
                  AND c.created_at >= w.match_since AND c.run_id <> w.run_id)
 ORDER BY w.created_at
 LIMIT :batch

-- name: DueWaitRuns :many
-- The runs whose waits a sweep batch would end, for ending them one run at a time.
SELECT run_id
  FROM awooop_wait
 WHERE status = 'open' AND expires_at <= now()
 ORDER BY expires_at
 LIMIT :batch

-- name: RunState :one
-- The run's state when CreateWait found no lease, to choose its error as a fenced write does.
SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, attempt_count AS cur_attempt,
       reaped_at AS cur_reaped_at, heartbeat_at AS cur_heartbeat_at
  FROM awooop_run_state
 WHERE run_id = :run_id::uuid

-- name: ExpireWait :one
-- A wait ended by hand (the RPC ExpireWait, an operator with the approver role): timed out now,
-- whatever its expiry; the first outcome wins (awooop_end_wait), and its audit row names the
-- operator as actor. A sleep ended so is woken early. An open wait of a run that is over is
-- refused ('run_ended', migration 0240) and left to the sweep, as a completion of it is.
SELECT * FROM awooop_expire_wait_by_hand(:wait_id, :actor, :projects::text[])

-- name: ListWaits :many
-- A run's waits for ListWaits (`awooop runs waits list`, the console's run page): one row with
-- the run's project and NULL wait columns when it has none; no row when the run does not exist.
SELECT r.project_id AS run_project, w.wait_id, w.run_id, w.project_id, w.step_id, w.kind, w.status, w.expires_at,
       w.result, w.completed_by, w.completed_at
  FROM awooop_run_state r
  LEFT JOIN awooop_wait w ON w.run_id = r.run_id
 WHERE r.run_id = :run_id::uuid
 ORDER BY w.status = 'open' DESC, w.created_at DESC
 LIMIT 1000

-- name: WaitProject :one
-- The project of a wait ExpireWait found outside the caller's projects, to choose its error.
SELECT project_id, run_id FROM awooop_wait WHERE wait_id = :wait_id::uuid
