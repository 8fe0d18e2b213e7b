"""The asyncpg pool every service shares, and the mapping of store failures to
UNAVAILABLE / STORE_UNAVAILABLE (the only status clients retry automatically)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from services.common import errors, planner
from services.common.server_plans import STALE, ServerPlans
from services.common.settings import Settings

log = logging.getLogger("awooop.db")
T = TypeVar("T")


class Row(Protocol):
    """A row read by column name: an asyncpg Record, or any Mapping (the row mappers take either)."""

    def __getitem__(self, key: str, /) -> Any: ...


# A connection of its own or one lent by the pool (`async with pool.acquire() as conn`).
Conn: TypeAlias = asyncpg.Connection | PoolConnectionProxy


# The array types the services bind or read. asyncpg learns an array type's codec by running its
# type introspection query once per connection, with JIT turned off around it by two session-level
# set_config statements. Through a transaction-mode pooler these three statements can land on
# different server connections, and the introspection query, JIT-compiled, costs Postgres ~3 s of
# CPU (jit on, the default) for each new pool connection (also with PgBouncer 1.21+ and the cache
# on). So they are read once at connect, in one transaction, which keeps the three on one server
# connection.
_ARRAY_TYPES = ("int4", "int8", "oid", "text", "varchar", "uuid", "timestamptz", "float8", "bool", "jsonb")
_LEARN_ARRAYS_SQL = "SELECT " + ", ".join(f"NULL::{t}[] AS {t}" for t in _ARRAY_TYPES)


async def _init_connection(conn: asyncpg.Connection, plans: ServerPlans | None = None) -> None:
    if isinstance(conn, StoreConnection):
        conn.plans = plans
    # JSONB in and out as Python objects; compact encoding keeps rows small.
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: json.dumps(v, separators=(",", ":")),
        decoder=json.loads,
        schema="pg_catalog",
    )
    async with conn.transaction():
        await conn.fetchrow(_LEARN_ARRAYS_SQL)
    if plans is not None and plans.needs_learning:  # the pool's first connection (or after a stale call)
        await plans.learn(conn)


# Errors after which a connection must not be handed out again: it points at a server that
# can no longer take writes (a demoted primary, a standby reached through a proxy), or its
# protocol state is broken (asyncpg's "cannot switch to state"), or a pooler moved it to a
# server connection that lacks its prepared statements.
_POISONING: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # SQLSTATE 25006
    asyncpg.exceptions.InvalidSQLStatementNameError,  # 26000: a pooler lost the prepared statement
    asyncpg.exceptions.DuplicatePreparedStatementError,  # 42P05: a pooler mixed two clients' statements
    asyncpg.exceptions.InternalClientError,  # protocol state, TargetServerAttributeNotMatched
    asyncpg.exceptions.InterfaceError,
)
_POOLER_ERRORS = (asyncpg.exceptions.InvalidSQLStatementNameError, asyncpg.exceptions.DuplicatePreparedStatementError)
_REFUSED_PARAMETER = "unsupported startup parameter"

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _note_failure(exc: BaseException) -> None:
    if isinstance(exc, _POOLER_ERRORS):
        _warn_once(
            "pooler",
            "prepared statement error from the store (%s): a transaction-mode pooler (PgBouncer) is in "
            "front of Postgres; set AWOOOP_DB_STATEMENT_CACHE=false, and AWOOOP_DATABASE_DIRECT_URL to a "
            "direct or session-mode URL for LISTEN and migrations",
            type(exc).__name__,
        )


class StoreConnection(asyncpg.Connection):
    """A pool connection that remembers when a statement failed in a way that makes the
    connection unusable; the pool's release hook (_keep_session) then closes it, so the
    next acquire opens a fresh one (to the new primary after a failover).

    With plans (the statement cache off), a statement marked with server_plans.keep_plan runs
    as a call of its function when the store has one (services/common/server_plans.py).

    Only public methods are overridden (asyncpg documents subclassing Connection through the
    pool's connection_class). Covered: fetch, fetchrow and fetchval (routed to the functions and
    marked), execute (marked; a transaction's BEGIN/COMMIT/ROLLBACK go through it too),
    executemany and fetchmany (marked). Not covered, and why that does not matter: prepare() and
    its PreparedStatement, cursor() and the copy_* methods, which no service runs on a pool
    connection (prepare only in server_plans.describe, on the migration's own connection). What
    asyncpg runs for itself (introspecting a type it meets) runs inside the public call that
    needed it, so its failures are marked with that call's; in the pool's init, a failure fails
    the connect, and the connection never enters the pool."""

    broken: bool = False
    plans: ServerPlans | None = None

    def _mark(self, exc: BaseException) -> None:
        if isinstance(exc, _POISONING):
            self.broken = True
            _note_failure(exc)

    async def _marking(self, run: Awaitable[T]) -> T:
        try:
            return await run
        except Exception as exc:
            self._mark(exc)
            raise

    async def _routed(self, query: str, nargs: int, run: Callable[[str], Awaitable[T]]) -> T:
        """run(query), or run(the call of query's function) when there is one; a call that fails
        as stale runs the plain statement (unless it aborted the caller's transaction)."""
        plans = self.plans
        if plans is None:
            return await self._marking(run(query))
        if plans.needs_learning and not self.is_in_transaction():
            await self._marking(plans.learn(self))
        call = plans.call_for(query, nargs)
        if call is not None:
            try:
                return await run(call)
            except STALE as exc:
                plans.stale(query, exc)
                if self.is_in_transaction():  # the caller's transaction is aborted: it fails as it is
                    raise
            except Exception as exc:
                self._mark(exc)
                raise
        return await self._marking(run(query))

    async def fetch(
        self, query: str, *args: object, timeout: float | None = None, record_class: Any = None
    ) -> list[Any]:
        def run(q: str) -> Awaitable[list[Any]]:
            return asyncpg.Connection.fetch(self, q, *args, timeout=timeout, record_class=record_class)

        return await self._routed(query, len(args), run)

    async def fetchrow(self, query: str, *args: object, timeout: float | None = None, record_class: Any = None) -> Any:
        def run(q: str) -> Awaitable[Any]:
            return asyncpg.Connection.fetchrow(self, q, *args, timeout=timeout, record_class=record_class)

        return await self._routed(query, len(args), run)

    async def fetchval(self, query: str, *args: object, column: int = 0, timeout: float | None = None) -> Any:
        def run(q: str) -> Awaitable[Any]:
            return asyncpg.Connection.fetchval(self, q, *args, column=column, timeout=timeout)

        return await self._routed(query, len(args), run)

    # execute answers the command tag, which a call of the function would change to SELECT's: plain
    async def execute(self, query: str, *args: object, timeout: float | None = None) -> str:
        return await self._marking(super().execute(query, *args, timeout=timeout))

    async def executemany(
        self, command: str, args: Iterable[Sequence[object]], *, timeout: float | None = None
    ) -> None:
        await self._marking(super().executemany(command, args, timeout=timeout))

    async def fetchmany(
        self, query: str, args: Iterable[Any], *, timeout: float | None = None, record_class: Any = None
    ) -> list[Any]:
        return await self._marking(super().fetchmany(query, args, timeout=timeout, record_class=record_class))


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release hook. asyncpg's default resets session state with one extra round trip
    per release; awooop never sets session state through the pool (advisory locks and
    settings are transaction-scoped), and asyncpg still rolls back an open transaction.
    A connection marked broken leaves the pool here."""
    if getattr(conn, "broken", False):
        conn.terminate()


def _connector(settings: Settings) -> Callable[..., Awaitable[asyncpg.Connection]]:
    """The pool's connect function. Statement timeouts and the planner's settings
    (services/common/planner.py) go to the server as startup parameters when it takes them; a
    pooler (PgBouncer) refuses unknown startup parameters, so after the first refusal this process
    connects without them: asyncpg's command_timeout still cancels a slow statement, and the
    server-side timeouts belong in role settings (docs/operations.md)."""
    timeout_ms = int(settings.db_statement_timeout * 1000)
    session = {
        "statement_timeout": str(timeout_ms),
        "idle_in_transaction_session_timeout": str(max(timeout_ms * 3, 30000)),
        **planner.SETTINGS,
    }
    # a transaction-mode pooler is what turning the statement cache off says: do not even try
    state = {"send_settings": settings.db_statement_cache}

    async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        base = {"application_name": "awooop"}
        if state["send_settings"]:
            try:
                return await asyncpg.connect(*args, server_settings={**base, **session}, **kwargs)
            except asyncpg.exceptions.PostgresError as exc:
                if _REFUSED_PARAMETER not in str(exc):
                    raise
                state["send_settings"] = False
                _warn_once(
                    "startup",
                    "the store refused a startup parameter (%s): a pooler is in front of Postgres; "
                    "connecting without them. Set them as role settings (ALTER ROLE ... SET "
                    "statement_timeout = '%dms'; ALTER ROLE ... SET enable_seqscan = off; ALTER ROLE ... "
                    "SET jit = off), and for a transaction-mode pooler set AWOOOP_DB_STATEMENT_CACHE=false",
                    exc,
                    timeout_ms,
                )
        return await asyncpg.connect(*args, server_settings=base, **kwargs)

    return connect


MAX_CACHED_STATEMENT = 64 * 1024  # bytes of SQL text a prepared statement may have and stay cached


async def create_pool(settings: Settings, dsn: str | None = None) -> asyncpg.Pool:
    """A pool that starts even when the store is down (min_size connections are
    opened lazily on failure) so the service can answer UNAVAILABLE instead of crashing."""
    # behind a transaction-mode pooler: the hot statements run as the functions the migration
    # step created, which keep their plans per server connection
    plans = ServerPlans() if settings.db_server_plans and not settings.db_statement_cache else None
    kwargs: dict[str, Any] = dict(
        dsn=dsn or settings.database_url,
        min_size=0,
        max_size=settings.db_pool_max,
        init=functools.partial(_init_connection, plans=plans),
        reset=_keep_session,
        connect=_connector(settings),
        connection_class=StoreConnection,
        timeout=settings.db_connect_timeout,
        command_timeout=settings.db_statement_timeout + 1,
        # a transaction-mode pooler hands each transaction to any server connection, where
        # named prepared statements of this client do not exist
        statement_cache_size=100 if settings.db_statement_cache else 0,
        # the claim statement (claims.sql ClaimRuns) is over asyncpg's default 15 KB: uncached, every
        # claim would be prepared (planned) again
        max_cacheable_statement_size=MAX_CACHED_STATEMENT,
    )
    pool = await asyncpg.create_pool(**kwargs)
    assert pool is not None
    # warm up to min size when we can; a store that is down now is not fatal
    conns = []
    try:
        for _ in range(min(settings.db_pool_min, settings.db_pool_max)):
            conns.append(await pool.acquire(timeout=settings.db_connect_timeout))
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError):
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
    # a failover or switchover: a connection still on the demoted primary, or a multi-host DSN
    # that found no writable host yet (TargetServerAttributeNotMatched), or a protocol state
    # asyncpg cannot continue from ("cannot switch to state")
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.InternalClientError,
    # behind a transaction-mode pooler with the statement cache on (logged once, see _note_failure)
    asyncpg.exceptions.InvalidSQLStatementNameError,
    asyncpg.exceptions.DuplicatePreparedStatementError,
)


async def again_on_deadlock(call: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """Runs call() (one statement, outside a transaction block); when Postgres aborts it as one
    side of a deadlock it changed nothing and runs again. For statements that lock rows whose order
    they cannot fully fix: batches whose runs' triggers lock concurrency keys, dedupe rows."""
    for attempt in range(attempts):
        try:
            return await call()
        except asyncpg.exceptions.DeadlockDetectedError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def store_error(exc: BaseException) -> errors.ServiceError | None:
    """The ServiceError a store failure maps to, or None when it is not one."""
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        return errors.store_unavailable("statement timed out")
    if isinstance(exc, asyncpg.exceptions.SerializationError | asyncpg.exceptions.DeadlockDetectedError):
        return errors.store_unavailable("transaction conflict, retry")
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        return errors.store_unavailable("the server is read-only (a standby, or a failover in progress)")
    if isinstance(exc, STORE_EXCEPTIONS):
        _note_failure(exc)
        return errors.store_unavailable(type(exc).__name__)
    return None
