"""Databases on the test Postgres server: a DSN naming another database, and a connection
to the maintenance database (to create and drop test databases)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def with_database(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


async def admin_connection(pg_server_dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(with_database(pg_server_dsn, "postgres"))


@contextlib.asynccontextmanager
async def scratch_store(pg_server_dsn: str, below: int) -> AsyncIterator[asyncpg.Connection]:
    """A new database migrated up to, not including, migration `below`: a store as an older
    release left it, for a test of the upgrade. Dropped afterwards."""
    from services.common import migrate, migrate_sql

    name = f"awooop_upgrade_{uuid.uuid4().hex[:8]}"
    admin = await admin_connection(pg_server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(with_database(pg_server_dsn, name))
    try:
        await migrate_sql.create_migrations_table(conn)
        for m in migrate.load():
            if m.version < below:
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await migrate_sql.record_migration(conn, version=m.version, name=m.name)
        yield conn
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()
