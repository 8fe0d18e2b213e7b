-- name: PruneDedupe :many
-- One batch of dedupe rows older than :retention seconds, oldest first; the victims are chosen
-- with FOR UPDATE SKIP LOCKED, so replicas pruning at once never wait on each other or delete a
-- row twice. Returns the keys, whose Redis copies go next.
DELETE FROM awooop_channel_event_dedupe
 WHERE (project_id, channel_type, provider_event_id) IN
       (SELECT project_id, channel_type, provider_event_id FROM awooop_channel_event_dedupe
         WHERE created_at < now() - make_interval(secs => :retention)
         ORDER BY created_at
         LIMIT :batch
           FOR UPDATE SKIP LOCKED)
RETURNING project_id, channel_type, provider_event_id

-- name: PruneIdempotencyKeys :exec
-- One batch of idempotency keys past expires_at, chosen as PruneDedupe's.
DELETE FROM awooop_idempotency_key
 WHERE idempotency_id IN (SELECT idempotency_id FROM awooop_idempotency_key
                           WHERE expires_at <= now()
                           ORDER BY expires_at
                           LIMIT :batch
                             FOR UPDATE SKIP LOCKED)

-- name: PruneRuns :exec
-- One batch of finished runs (COMPLETED, FAILED, CANCELLED) last changed more than :retention
-- seconds ago, with their audit rows and their event log (journal, compensation request, alerts
-- and watch marks go by ON DELETE CASCADE). A run is kept while anything may still answer with it: its event's dedupe row (a
-- provider retry replays the run), an unexpired idempotency key naming it (a CreateRun retry),
-- a compensation that is not done, an alert not yet delivered, or a saga that is compensating or
-- failed to compensate (an operator still has to act on it). A run that ended with nothing to
-- undo has saga_status not_needed (a completed run always; migration 0080): it goes too.
WITH victims AS (
    SELECT r.run_id
      FROM awooop_run_state r
     WHERE r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
       AND r.updated_at < now() - make_interval(secs => :retention)
       AND r.saga_status IN ('in_progress', 'not_needed', 'compensated')
       AND NOT EXISTS (SELECT 1 FROM awooop_channel_event_dedupe d
                        WHERE d.project_id = r.project_id AND d.channel_type = r.channel_type
                          AND d.provider_event_id = r.provider_event_id)
       AND NOT EXISTS (SELECT 1 FROM awooop_idempotency_key k
                        WHERE k.resource_id = r.run_id::text AND k.expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM awooop_compensation_request c
                        WHERE c.run_id = r.run_id AND c.status <> 'done')
       AND NOT EXISTS (SELECT 1 FROM awooop_saga_alert a WHERE a.run_id = r.run_id AND a.done_at IS NULL)
     ORDER BY r.updated_at
     LIMIT :batch
       FOR UPDATE OF r SKIP LOCKED
), audit AS (
    -- a run's entries from before migration 0350; its history since is its log's state rows
    DELETE FROM awooop_audit_entry l USING victims v WHERE l.run_id = v.run_id
), events AS (
    DELETE FROM awooop_run_event e USING victims v WHERE e.run_id = v.run_id
)
DELETE FROM awooop_run_state r USING victims v WHERE r.run_id = v.run_id

-- name: PruneDebounceWindows :exec
-- One batch of window rows whose batch opened more than :retention seconds ago (chosen as
-- PruneDedupe chooses): a key that comes back gets a row again
-- (debounce.sql's window rows; a batch is long due by then).
DELETE FROM awooop_debounce_window
 WHERE (project_id, channel_type, debounce_key) IN
       (SELECT project_id, channel_type, debounce_key FROM awooop_debounce_window
         WHERE opened_at < now() - make_interval(secs => :retention)
         ORDER BY opened_at
         LIMIT :batch
           FOR UPDATE SKIP LOCKED)
