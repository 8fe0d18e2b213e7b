-- name: CompleteWaitByToken
-- params: result, actor, token_hash
-- The wait whose token hashes to :token_hash, completed with the body as its result: the same
-- rule as the scheduler's CompleteWait (awooop_end_wait, migration 0160), so the first outcome
-- wins whichever path posts it. No row: no wait has this token.
SELECT e.*
  FROM awooop_wait w,
       LATERAL awooop_end_wait(w.wait_id, 'completed', $1::jsonb, $2, NULL) e
 WHERE w.token_hash = $3::bytea
