-- The migration runner's own statements (services/common/migrate.py). The runner holds a session
-- advisory lock (:lock_key: the first 8 bytes of sha256("awooop-migrate")) while it applies, so
-- concurrent runs wait for each other instead of racing.

-- name: LockMigrations :exec
SELECT pg_advisory_lock(:lock_key)

-- name: UnlockMigrations :exec
SELECT pg_advisory_unlock(:lock_key)

-- name: CreateMigrationsTable :exec
-- The list of applied migrations; the first migration cannot create the table it is recorded in.
CREATE TABLE IF NOT EXISTS awooop_schema_migrations (
    version    INT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())

-- name: AppliedMigrations :many
SELECT version FROM awooop_schema_migrations

-- name: RecordMigration :exec
-- Written in the transaction of the migration it records.
INSERT INTO awooop_schema_migrations (version, name) VALUES (:version, :name)
