-- name: CreateSession :val
-- not null: expires_at
-- A session for :ttl seconds; the token's digest and the API key encrypted under it.
INSERT INTO awooop_console_session (session_hash, key_ciphertext, key_nonce, key_label, expires_at)
VALUES (:session_hash, :key_ciphertext, :key_nonce, :key_label, now() + make_interval(secs => :ttl))
RETURNING expires_at

-- name: TouchSession :one
-- A live session, touched in the same statement that reads it.
UPDATE awooop_console_session SET last_seen_at = now()
 WHERE session_hash = :session_hash AND revoked_at IS NULL AND expires_at > now()
RETURNING key_ciphertext, key_nonce, key_label, expires_at

-- name: RevokeSession :exec
UPDATE awooop_console_session SET revoked_at = now() WHERE session_hash = :session_hash AND revoked_at IS NULL

-- name: PruneSessions :exec
-- One batch of sessions that ended (expired or signed out) more than a day ago.
DELETE FROM awooop_console_session WHERE session_hash IN (
    SELECT session_hash FROM awooop_console_session
     WHERE expires_at < now() - interval '1 day' OR revoked_at < now() - interval '1 day'
     LIMIT :batch)
