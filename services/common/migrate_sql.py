"""Generated from migrate.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "migrate.sql")
LOCK_MIGRATIONS = Q["LockMigrations"]
UNLOCK_MIGRATIONS = Q["UnlockMigrations"]
CREATE_MIGRATIONS_TABLE = Q["CreateMigrationsTable"]
APPLIED_MIGRATIONS = Q["AppliedMigrations"]
RECORD_MIGRATION = Q["RecordMigration"]


class AppliedMigrationsRow(Protocol):
    """A row of AppliedMigrations."""

    @overload
    def __getitem__(self, key: Literal["version"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def lock_migrations(db: sql.Queryable, /, *, lock_key: int | None, query_timeout: float | None = None) -> str:
    """LockMigrations (migrate.sql)."""
    return await db.execute(LOCK_MIGRATIONS.sql, lock_key, timeout=query_timeout)


async def unlock_migrations(db: sql.Queryable, /, *, lock_key: int | None, query_timeout: float | None = None) -> str:
    """UnlockMigrations (migrate.sql)."""
    return await db.execute(UNLOCK_MIGRATIONS.sql, lock_key, timeout=query_timeout)


async def create_migrations_table(db: sql.Queryable, /, *, query_timeout: float | None = None) -> str:
    """CreateMigrationsTable (migrate.sql).

    The list of applied migrations; the first migration cannot create the table it is recorded in.
    """
    return await db.execute(CREATE_MIGRATIONS_TABLE.sql, timeout=query_timeout)


async def applied_migrations(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[AppliedMigrationsRow]:
    """AppliedMigrations (migrate.sql)."""
    return cast("list[AppliedMigrationsRow]", await db.fetch(APPLIED_MIGRATIONS.sql, timeout=query_timeout))


async def record_migration(
    db: sql.Queryable, /, *, version: int | None, name: str | None, query_timeout: float | None = None
) -> str:
    """RecordMigration (migrate.sql).

    Written in the transaction of the migration it records.
    """
    return await db.execute(RECORD_MIGRATION.sql, version, name, timeout=query_timeout)
