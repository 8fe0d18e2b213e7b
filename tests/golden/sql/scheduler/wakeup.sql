-- name: ProbeNotify
-- params: channel, token
-- Sent from a second connection after each connect of the LISTEN connection: when it does not
-- arrive there (through a transaction-mode pooler the session that listens is not the client's),
-- claims poll instead.
SELECT pg_notify($1, $2)

-- name: Ping
-- params: (none)
-- Keeps the idle LISTEN connection checked: a dead one fails this and is replaced.
SELECT 1
