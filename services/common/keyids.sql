-- name: LiveKeyIds :many
-- Every key id that is not revoked (the whole set, refreshed at most once per interval).
SELECT key_id FROM awooop_api_key WHERE revoked_at IS NULL
