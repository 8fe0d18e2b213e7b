-- The durable waits' callback URL (services/ingest/wait_callbacks.py).

-- name: CompleteWaitByToken :one
-- The wait one of whose tokens (any attempt's: awooop_wait_token, migration 0290) hashes to
-- :token_hash, completed with the body as its result: the same rule as the scheduler's
-- CompleteWait (awooop_end_wait, migration 0160), so the first outcome wins whichever path or
-- token posts it. No row: no wait has this token.
SELECT e.*
  FROM awooop_wait_token t,
       LATERAL awooop_end_wait(t.wait_id, 'completed', :result::jsonb, :actor, NULL) e
 WHERE t.token_hash = :token_hash::bytea
