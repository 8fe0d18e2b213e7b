-- name: LockMigrations
-- params: lock_key
SELECT pg_advisory_lock($1)

-- name: UnlockMigrations
-- params: lock_key
SELECT pg_advisory_unlock($1)

-- name: CreateMigrationsTable
-- params: (none)
-- The list of applied migrations; the first migration cannot create the table it is recorded in.
CREATE TABLE IF NOT EXISTS awooop_schema_migrations (
    version    INT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())

-- name: AppliedMigrations
-- params: (none)
SELECT version FROM awooop_schema_migrations

-- name: RecordMigration
-- params: version, name
-- Written in the transaction of the migration it records.
INSERT INTO awooop_schema_migrations (version, name) VALUES ($1, $2)
