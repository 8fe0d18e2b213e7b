-- The operator console (services/console): server-side sessions, and the index behind its
-- "compensation failures" page.

-- A signed-in operator. The cookie holds a random token; the store keeps only its sha256, and
-- the operator's API key encrypted under a key derived from that token (AES-GCM), so neither
-- a session nor an API key can be taken from a copy of this table.
CREATE TABLE awooop_console_session (
    session_hash   BYTEA        PRIMARY KEY,
    key_ciphertext BYTEA        NOT NULL,
    key_nonce      BYTEA        NOT NULL,
    key_label      VARCHAR(160) NOT NULL,  -- the key's public id (awk_<id>_…), shown as who is signed in
    created_at     TIMESTAMPTZ  NOT NULL DEFAULT now(),
    last_seen_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at     TIMESTAMPTZ  NOT NULL,
    revoked_at     TIMESTAMPTZ
);
-- pruning expired sessions
CREATE INDEX awooop_console_session_expires_idx ON awooop_console_session (expires_at);

-- ListRuns filtered on saga_status = compensation_failed (few rows; saga_status changes rarely,
-- so the partial index costs the hot status updates nothing).
CREATE INDEX awooop_run_comp_failed_idx ON awooop_run_state (project_id, created_at DESC, run_id)
    WHERE saga_status = 'compensation_failed';
