-- Delivery of the escalation outbox awooop_saga_alert (services/saga/notifier.py).

-- name: ClaimAlerts :many
-- Undelivered alerts, oldest first, that no replica holds: held for 60 seconds (an alert claimed
-- by a replica that died is retried after that), attempts counts the delivery passes.
UPDATE awooop_saga_alert a
   SET claimed_until = now() + interval '60 seconds', attempts = a.attempts + 1
 WHERE a.alert_id IN (
        SELECT alert_id FROM awooop_saga_alert
         WHERE done_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
         ORDER BY alert_id LIMIT :batch
         FOR UPDATE SKIP LOCKED)
RETURNING a.alert_id, a.project_id, a.run_id, a.step_id, a.tool_id, a.error, a.created_at,
          a.redis_sent_at, a.telegram_sent_at, a.attempts

-- name: FinishAlert :exec
-- The pass's outcome: a channel's sent time is written once; done ends delivery.
UPDATE awooop_saga_alert
   SET redis_sent_at = COALESCE(redis_sent_at, CASE WHEN :redis_sent THEN now() END),
       telegram_sent_at = COALESCE(telegram_sent_at, CASE WHEN :telegram_sent THEN now() END),
       last_error = :last_error,
       claimed_until = NULL,
       done_at = CASE WHEN :done THEN now() END
 WHERE alert_id = :alert_id
