"""Fixtures: a real PostgreSQL, a real Redis and real gRPC servers over real channels.

Postgres: AWOOOP_TEST_DATABASE_URL (or AWOOOP_DATABASE_URL) names a server we may create
databases on; without one an embedded Postgres (pgserver) is started for the session.
The schema is migrated once into a template database and each test gets a fresh clone.

Redis: AWOOOP_TEST_REDIS_URL (or AWOOOP_REDIS_URL), else an embedded redis-server. Tests
share it but each test's keys live under its own prefix.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import grpc
import pytest
import pytest_asyncio

from services.common import embedded, loops, migrate, principals
from services.common.db import MAX_CACHED_STATEMENT
from services.common.runtime import Runtime
from services.common.settings import Settings
from tests.harness.databases import admin_connection, with_database
from tests.harness.helpers import WithKey, internal_key
from tests.harness.pgcluster import PgCluster


def _loop_failures() -> dict[tuple[str, str], float]:
    """awooop_loop_errors_total by (loop, reason), except store outages (tests cause those)."""
    return {
        (m.labels["loop"], m.labels["reason"]): m.value
        for metric in loops.LOOP_ERRORS.collect()
        for m in metric.samples
        if m.name.endswith("_total") and m.labels["reason"] != loops.STORE_UNAVAILABLE
    }


@pytest.fixture(autouse=True)
def no_background_loop_failed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test during which a background loop of its services raised (a pass or a row),
    unless the test expects it: @pytest.mark.loop_errors("row_failed", ...)."""
    marker = request.node.get_closest_marker("loop_errors")
    allowed = set(marker.args) if marker else set()
    before = _loop_failures()
    yield
    grown = {k: v - before.get(k, 0) for k, v in _loop_failures().items() if v > before.get(k, 0)}
    unexpected = {f"{loop}/{reason}": n for (loop, reason), n in grown.items() if reason not in allowed}
    assert not unexpected, f"background loops failed during the test (see the log): {unexpected}"


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    dsn = os.environ.get("AWOOOP_TEST_DATABASE_URL") or os.environ.get("AWOOOP_DATABASE_URL")
    if dsn:
        yield dsn
        return
    tmp = Path(tempfile.mkdtemp(prefix="awooop-test-pg-"))
    pg = embedded.start_postgres(tmp / "pg")
    try:
        yield pg.dsn
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("AWOOOP_TEST_REDIS_URL") or os.environ.get("AWOOOP_REDIS_URL")
    if url:
        yield url
        return
    rd = embedded.start_redis(Path(tempfile.mkdtemp(prefix="awooop-test-redis-")))
    try:
        yield rd.url
    finally:
        rd.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def template_db(pg_server_dsn: str) -> AsyncIterator[str]:
    name = f"awooop_tmpl_{uuid.uuid4().hex[:10]}"
    conn = await admin_connection(pg_server_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    await migrate.migrate(with_database(pg_server_dsn, name))
    yield name
    conn = await admin_connection(pg_server_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


# CREATE DATABASE ... TEMPLATE needs the template to have no other sessions; serialize clones.
_clone_lock = asyncio.Lock()


@pytest_asyncio.fixture(loop_scope="session")
async def db_dsn(pg_server_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test."""
    name = f"awooop_t_{uuid.uuid4().hex[:12]}"
    async with _clone_lock:
        conn = await admin_connection(pg_server_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        finally:
            await conn.close()
    yield with_database(pg_server_dsn, name)
    conn = await admin_connection(pg_server_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest_asyncio.fixture(loop_scope="session")
async def db(db_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to this test's database, for arranging and asserting."""
    # as the services' pool: the claim statement is too long for asyncpg's default cache limit
    conn = await asyncpg.connect(db_dsn, max_cacheable_statement_size=MAX_CACHED_STATEMENT)
    yield conn
    await conn.close()


@pytest.fixture
def settings(db_dsn: str, redis_url: str) -> Settings:
    prefix = f"awooop:{urlsplit(db_dsn).path.lstrip('/')}:"
    return Settings.from_env().with_(
        database_url=db_dsn,
        redis_url=redis_url,
        redis_prefix=prefix,
        metrics_port=0,
        access_log=False,
        shutdown_grace=0.5,
        db_pool_min=1,
        internal_api_key="",
        saga_addr="",
        # nobody's gateway (not the default 50054, where another `awooop up` on this machine may
        # listen and refuse the saga's key); tests that compensate start their own and name it
        gateway_addr="127.0.0.1:1",
    )


StartServices = Callable[..., Awaitable[Runtime]]


@pytest_asyncio.fixture(loop_scope="session")
async def start_services(settings: Settings) -> AsyncIterator[StartServices]:
    """start_services("ingest", "scheduler", **settings_overrides) -> Runtime on ephemeral ports."""
    started: list[Runtime] = []

    async def start(*names: str, **overrides: Any) -> Runtime:
        if "saga" in names and "internal_api_key" not in overrides:
            # the saga presents a service key to the tool gateway, as deployed
            overrides["internal_api_key"] = await internal_key(settings.database_url)
        rt = Runtime(settings.with_(**overrides), list(names), port_zero=True)
        await rt.start()
        started.append(rt)
        return rt

    yield start
    for rt in reversed(started):
        await rt.stop(0.2)


@pytest_asyncio.fixture(loop_scope="session")
async def channels() -> AsyncIterator[Callable[..., grpc.aio.Channel]]:
    """channels(port) -> an insecure grpc.aio channel, closed after the test; channels(port, md):
    its calls carry metadata md (an API key) unless they name their own."""
    opened: list[grpc.aio.Channel] = []

    def open_channel(port: int, metadata: tuple[tuple[str, str], ...] | None = None) -> grpc.aio.Channel:
        interceptors = [WithKey(metadata)] if metadata else None
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=interceptors)
        opened.append(ch)
        return ch

    yield open_channel
    for ch in opened:
        await ch.close()


MakeKey = Callable[..., Awaitable[tuple[tuple[str, str], ...]]]


@pytest_asyncio.fixture(loop_scope="session")
async def make_key(db: asyncpg.Connection) -> MakeKey:
    """make_key("alice", {"proj": ["ingest"]}) -> call metadata with a fresh API key."""

    async def make(
        principal_id: str, roles: dict[str, list[str]] | None = None, principal_type: str = "user"
    ) -> tuple[tuple[str, str], ...]:
        await principals.create_principal(db, principal_id, principal_type)
        for project, names in (roles or {}).items():
            for role in names:
                await principals.grant_role(db, principal_id, project, role)
        issued = await principals.issue_key(db, principal_id)
        return (("authorization", f"Bearer {issued.key}"),)

    return make


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway Postgres server of this test's own (tests/harness/pgcluster.py), for tests
    that restart, stop, demote or fail it over; destroyed afterwards."""
    c = PgCluster.create()
    try:
        yield c
    finally:
        c.destroy()
