"""Databases on the test Postgres server: a DSN naming another database, and a connection
to the maintenance database (to create and drop test databases)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg


def with_database(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


async def admin_connection(pg_server_dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(with_database(pg_server_dsn, "postgres"))
