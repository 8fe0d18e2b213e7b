-- The wake-up connection's own statements (services/scheduler/wakeup.py). The NOTIFYs that wake
-- claims are sent by the statements that make runs claimable (claims.sql, fenced_writes.sql, ...).

-- name: ProbeNotify :exec
-- Sent from a second connection after each connect of the LISTEN connection: when it does not
-- arrive there (through a transaction-mode pooler the session that listens is not the client's),
-- claims poll instead.
SELECT pg_notify(:channel, :token)

-- name: Ping :val
-- Keeps the idle LISTEN connection checked: a dead one fails this and is replaced.
SELECT 1
