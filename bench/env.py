"""Where the benchmark's stores come from, and the scratch databases it makes on them.

Postgres: --database-url, else AWOOOP_DATABASE_URL, else the machine's 127.0.0.1:5432 if it
answers, else an embedded one (services/common/embedded.py). Redis the same way (6379).
Every database the run uses is created under a name starting with `awooop_bench_<run id>_`
and dropped at the end; no other database is touched. Redis keys live under a prefix of the
run's own and are deleted at the end.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis

from services.common import embedded, migrate, principals

LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def with_database(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


async def _pg_answers(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


async def _redis_answers(url: str) -> bool:
    client = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


@dataclass
class Stores:
    """The Postgres server and Redis the run uses, and how each was found."""

    pg_dsn: str  # a DSN on the server's maintenance database (we create/drop databases through it)
    redis_url: str
    pg_source: str
    redis_source: str
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    _stoppers: list = field(default_factory=list)  # type: ignore[type-arg]
    _databases: list[str] = field(default_factory=list)

    @property
    def redis_prefix(self) -> str:
        return f"awooop:bench:{self.run_id}:"

    async def create_database(self, purpose: str, *, migrated: bool = True) -> str:
        """A fresh database (awooop schema applied unless migrated=False); returns its DSN."""
        name = f"awooop_bench_{self.run_id}_{purpose}"
        conn = await asyncpg.connect(self.pg_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        self._databases.append(name)
        dsn = with_database(self.pg_dsn, name)
        if migrated:
            await migrate.migrate(dsn)
        return dsn

    async def drop_database(self, dsn: str) -> None:
        name = urlsplit(dsn).path.lstrip("/")
        if name not in self._databases:  # never drop what this run did not create
            return
        conn = await asyncpg.connect(self.pg_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
        self._databases.remove(name)

    async def cleanup(self) -> None:
        for name in list(self._databases):
            with contextlib.suppress(Exception):
                await self.drop_database(with_database(self.pg_dsn, name))
        with contextlib.suppress(Exception):
            client = aioredis.from_url(self.redis_url)
            try:
                keys = [k async for k in client.scan_iter(match=self.redis_prefix + "*", count=1000)]
                for i in range(0, len(keys), 1000):
                    await client.delete(*keys[i : i + 1000])
            finally:
                await client.aclose()
        for stop in reversed(self._stoppers):
            with contextlib.suppress(Exception):
                stop()


async def resolve(database_url: str | None, redis_url: str | None, *, embedded_only: bool = False) -> Stores:
    """The stores, in the order of the module doc; embedded_only skips straight to embedded ones."""
    stoppers = []
    pg_source = "argument"
    dsn = database_url
    local = not embedded_only
    if not dsn and local and os.environ.get("AWOOOP_DATABASE_URL"):
        dsn, pg_source = os.environ["AWOOOP_DATABASE_URL"], "AWOOOP_DATABASE_URL"
    if not dsn and local and await _pg_answers(LOCAL_PG):
        dsn, pg_source = LOCAL_PG, "local 127.0.0.1:5432"
    if not dsn:
        pg = embedded.start_postgres(Path(tempfile.mkdtemp(prefix="awooop-bench-pg-")))
        stoppers.append(pg.stop)
        dsn, pg_source = pg.dsn, "embedded (pgserver)"
    rsource = "argument"
    rurl = redis_url
    if not rurl and local and os.environ.get("AWOOOP_REDIS_URL"):
        rurl, rsource = os.environ["AWOOOP_REDIS_URL"], "AWOOOP_REDIS_URL"
    if not rurl and local and await _redis_answers(LOCAL_REDIS):
        rurl, rsource = LOCAL_REDIS, "local 127.0.0.1:6379"
    if not rurl:
        rd = embedded.start_redis(Path(tempfile.mkdtemp(prefix="awooop-bench-redis-")))
        stoppers.append(rd.stop)
        rurl, rsource = rd.url, "embedded (redis-server)"
    # create/drop databases through the maintenance database of the same server
    stores = Stores(with_database(dsn, "postgres"), rurl, pg_source, rsource)
    stores._stoppers.extend(stoppers)
    return stores


async def bench_key(dsn: str, project_id: str, roles: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Call metadata with a fresh API key holding roles in project_id."""
    conn = await asyncpg.connect(dsn)
    try:
        pid = f"bench-{secrets.token_hex(3)}"
        await principals.create_principal(conn, pid, "service", "benchmark client")
        for role in roles:
            await principals.grant_role(conn, pid, project_id, role)
        issued = await principals.issue_key(conn, pid, "bench")
    finally:
        await conn.close()
    return (("authorization", f"Bearer {issued.key}"),)
