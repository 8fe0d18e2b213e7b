"""The asyncpg pool every service shares, and the mapping of store failures to
UNAVAILABLE / STORE_UNAVAILABLE (the only status clients retry automatically)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from services.common import errors
from services.common.settings import Settings


class Row(Protocol):
    """A row read by column name: an asyncpg Record, or any Mapping (the row mappers take either)."""

    def __getitem__(self, key: str, /) -> Any: ...


# A connection of its own or one lent by the pool (`async with pool.acquire() as conn`).
Conn: TypeAlias = asyncpg.Connection | PoolConnectionProxy


async def _init_connection(conn: asyncpg.Connection) -> None:
    # JSONB in and out as Python objects; compact encoding keeps rows small.
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: json.dumps(v, separators=(",", ":")),
        decoder=json.loads,
        schema="pg_catalog",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release hook. asyncpg's default resets session state with one extra round trip
    per release; awooop never sets session state through the pool (advisory locks and
    settings are transaction-scoped), and asyncpg still rolls back an open transaction."""


async def create_pool(settings: Settings, dsn: str | None = None) -> asyncpg.Pool:
    """A pool that starts even when the store is down (min_size connections are
    opened lazily on failure) so the service can answer UNAVAILABLE instead of crashing."""
    timeout_ms = int(settings.db_statement_timeout * 1000)
    kwargs: dict[str, Any] = dict(
        dsn=dsn or settings.database_url,
        min_size=0,
        max_size=settings.db_pool_max,
        init=_init_connection,
        reset=_keep_session,
        timeout=settings.db_connect_timeout,
        command_timeout=settings.db_statement_timeout + 1,
        server_settings={
            "statement_timeout": str(timeout_ms),
            "application_name": "awooop",
            "idle_in_transaction_session_timeout": str(max(timeout_ms * 3, 30000)),
        },
    )
    pool = await asyncpg.create_pool(**kwargs)
    assert pool is not None
    # warm up to min size when we can; a store that is down now is not fatal
    conns = []
    try:
        for _ in range(min(settings.db_pool_min, settings.db_pool_max)):
            conns.append(await pool.acquire(timeout=settings.db_connect_timeout))
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        pass
    finally:
        for c in conns:
            await pool.release(c)
    return pool


STORE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable (ConnectionError is a subclass)
    asyncio.TimeoutError,  # pool acquire / connect timeout
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.QueryCanceledError,  # statement_timeout
    asyncpg.exceptions.InterfaceError,  # connection closed under us
    asyncpg.exceptions.ConnectionDoesNotExistError,
)


def store_error(exc: BaseException) -> errors.ServiceError | None:
    """The ServiceError a store failure maps to, or None when it is not one."""
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        return errors.store_unavailable("statement timed out")
    if isinstance(exc, asyncpg.exceptions.SerializationError | asyncpg.exceptions.DeadlockDetectedError):
        return errors.store_unavailable("transaction conflict, retry")
    if isinstance(exc, STORE_EXCEPTIONS):
        return errors.store_unavailable(type(exc).__name__)
    return None
