"""Plans that survive a transaction-mode pooler: hot statements as server-side functions.

With the statement cache off (AWOOOP_DB_STATEMENT_CACHE=false, PgBouncer before 1.21) every
statement is parsed and planned again on each call; for the claim and completion statements
that costs about as much as running them. A PL/pgSQL function caches the plans of its static
SQL per server connection, and a pooler keeps its server connections long (PgBouncer's
server_lifetime: an hour by default), so a statement
marked with keep_plan() is run as `SELECT * FROM awooop_plan_<hash>($1, ...)`: a function whose
body is exactly that statement (RETURN QUERY <sql>), same parameters, same result columns.
Postgres then plans the statement as it does a prepared one (custom plans first, the generic
plan once it is no worse), and the call statement around it is cheap to plan.

Nothing is hand-copied: the function is generated from the statement's text on its first use
in a process (the call itself runs the plain statement meanwhile), named by a hash of its
definition, through AWOOOP_DATABASE_DIRECT_URL. Each text gets its own function, so when a
release changes a statement, old and new replicas call different functions side by side; a
creation races with other replicas under an advisory lock and creates only what is missing.
When a function cannot be created (no CREATE privilege on the schema, a statement a function
cannot return) or a call of it fails as stale (dropped, or a migration changed a column type),
that statement stays plain for the rest of the process, logged once. The functions are
SECURITY INVOKER (they run with the caller's rights) and are safe to drop at any time."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time

import asyncpg

log = logging.getLogger("awooop.db")

PREFIX = "awooop_plan_"
_TAG = "$awooop_plan$"
# A call of a function failed where its statement, which worked plain, would not: the function
# was dropped or is not visible on this search_path, a migration changed a result column's type,
# EXECUTE was revoked, or PL/pgSQL reads the body otherwise than plain SQL (its first call
# compiles it; an older server may refuse RETURN QUERY of a data-modifying WITH as not
# supported). Class 42 of SQLSTATE and 0A000; the statement then runs plain (and fails plain if
# it must).
STALE = (asyncpg.exceptions.SyntaxOrAccessError, asyncpg.exceptions.FeatureNotSupportedError)
# seconds before a creation that could not reach the store is tried again
RETRY_AFTER = 30.0
_marked: set[str] = set()


def keep_plan(sql: str) -> str:
    """Marks sql, a statement that returns rows and is run on its own (not inside a
    transaction of several statements), to be run through a function when the statement
    cache is off; returns sql unchanged."""
    _marked.add(sql)
    return sql


def is_marked(sql: str) -> bool:
    return sql in _marked


class Unsuitable(Exception):
    """The statement cannot be the body of a RETURNS TABLE function."""


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def describe(conn: asyncpg.Connection, sql: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The statement's parameter types and (name, type) of its result columns, as SQL type
    names. Prepared and deallocated inside one transaction, so it also works through a
    transaction-mode pooler (the server connection is the same until the commit)."""
    async with conn.transaction():
        stmt = await conn.prepare(sql)
        try:
            params = [t.oid for t in stmt.get_parameters()]
            attrs = stmt.get_attributes()
            names = await conn.fetch(
                "SELECT format_type(t, NULL) AS t FROM unnest($1::oid[]) WITH ORDINALITY AS u(t, i) ORDER BY i",
                params + [a.type.oid for a in attrs],
            )
        finally:
            if stmt.get_name():  # a named statement (the connection's statement cache is on)
                await conn.execute(f"DEALLOCATE {_ident(stmt.get_name())}")
    types = [r["t"] for r in names]
    return types[: len(params)], [(a.name, t) for a, t in zip(attrs, types[len(params) :], strict=True)]


def definition(sql: str, params: list[str], columns: list[tuple[str, str]]) -> tuple[str, str]:
    """(function name, CREATE FUNCTION statement) for sql; the name is a hash of the rest."""
    if not columns:
        raise Unsuitable("returns no rows")
    if len({n for n, _ in columns}) != len(columns):
        raise Unsuitable("two result columns share a name")
    if _TAG in sql:
        raise Unsuitable(f"contains {_TAG}")
    signature = ", ".join(params)
    result = ", ".join(f"{_ident(n)} {t}" for n, t in columns)
    # use_column: the result columns are also PL/pgSQL variables; a name in the statement that
    # is a column stays that column (no variable is ever meant)
    rest = f"""({signature}) RETURNS TABLE({result}) LANGUAGE plpgsql VOLATILE AS {_TAG}
#variable_conflict use_column
BEGIN
RETURN QUERY {sql.strip()};
END
{_TAG}"""
    name = PREFIX + hashlib.sha256(rest.encode()).hexdigest()[:24]
    return name, f"CREATE FUNCTION {name}{rest}"


def call_text(name: str, params: list[str]) -> str:
    return f"SELECT * FROM {name}({', '.join(f'${i}' for i in range(1, len(params) + 1))})"


async def ensure(conn: asyncpg.Connection, sql: str) -> str:
    """Creates the function for sql unless it exists; returns the statement that calls it.
    Concurrent creators (other replicas) wait for each other on an advisory lock."""
    params, columns = await describe(conn, sql)
    name, create = definition(sql, params, columns)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", name)
        if await conn.fetchval("SELECT to_regproc($1) IS NULL", name):
            await conn.execute(create)
            await conn.execute(
                f"COMMENT ON FUNCTION {name} IS 'awooop: a hot statement with its plan kept per server "
                "connection (services/common/server_plans.py); safe to drop, recreated on use'"
            )
    return call_text(name, params)


class ServerPlans:
    """One process' functions for the marked statements: call_for() answers at once (the call
    text, or None while the function is being created or when the statement stays plain)."""

    def __init__(self, dsn: str, connect_timeout: float) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._calls: dict[str, str] = {}
        # statements run plain until this time.monotonic(): being created, the store was not
        # reachable (retried later), or never to be (inf)
        self._plain: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned = False

    def call_for(self, sql: str) -> str | None:
        call = self._calls.get(sql)
        if call is None and self._plain.get(sql, 0.0) <= time.monotonic() and is_marked(sql):
            self._plain[sql] = math.inf
            task = asyncio.ensure_future(self._create(sql))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return call

    def stale(self, sql: str, exc: BaseException) -> None:
        """A call of sql's function failed as stale: sql runs plain from now on."""
        if self._calls.pop(sql, None) is not None:
            log.warning("a server-side plan function failed (%s); running its statement plain", exc)

    async def wait(self) -> None:
        """Until every creation started so far has ended (tests; a clean shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def ready(self) -> int:
        return len(self._calls)

    async def _create(self, sql: str) -> None:
        try:
            async with self._lock:  # one creation at a time: one direct connection, not a burst
                conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout, statement_cache_size=0)
                try:
                    call = await ensure(conn, sql)
                finally:
                    await conn.close()
        except (TimeoutError, OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
            self._plain[sql] = time.monotonic() + RETRY_AFTER  # the store is away: try again later
            return
        except (Unsuitable, asyncpg.PostgresError) as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot create a server-side plan function (%s: %s); that statement is planned on "
                    "every call. Grant CREATE on the schema to the role of AWOOOP_DATABASE_DIRECT_URL, "
                    "or set AWOOOP_DB_SERVER_PLANS=false to stop trying",
                    type(exc).__name__,
                    exc,
                )
            return
        self._calls[sql] = call
