"""Plans that survive a transaction-mode pooler: hot statements as server-side functions.

With the statement cache off (AWOOOP_DB_STATEMENT_CACHE=false, PgBouncer before 1.21) every
statement is parsed and planned again on each call; for the claim and completion statements
that costs about as much as running them. A PL/pgSQL function caches the plans of its static
SQL per server connection, and a pooler keeps its server connections long (PgBouncer's
server_lifetime: an hour by default), so a statement marked with keep_plan() is run as
`SELECT * FROM awooop_plan_<hash>($1, ...)`: a function whose body is exactly that statement
(RETURN QUERY <sql>), same parameters, same result columns. Postgres then plans the statement as
it does a prepared one (custom plans first, the generic plan once it is no worse), and the call
statement around it is cheap to plan.

Who does what:
- The migration step creates the functions (`awooop migrate`, services/common/migrate.py, with
  the statements the services list: services/scheduler/hot_statements.py), never a service:
  create_functions() below. Nothing is hand-copied: each function is generated from the text the
  services run.
- A function is named by a hash of its statement's text (function_name), so when a release
  changes a statement, old and new releases call different functions side by side during a
  rolling deploy; a release that keeps a text keeps its function.
- A service only learns which functions exist (ServerPlans.learn: one query when the pool opens
  its first connection, and again after a call of one failed as stale) and calls those. A marked
  statement without its function (migrations not run with this release, no EXECUTE privilege, a
  variant the migration does not create) runs plain, logged once.

The functions are SECURITY INVOKER (they run with the caller's rights), change nothing but what
their statement changes, and are safe to drop at any time (a call of a dropped one runs the
plain statement; the next `awooop migrate` creates it again)."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg

from services.common import planner, server_plans_sql

log = logging.getLogger("awooop.db")

PREFIX = "awooop_plan_"
# Part of every function's name: a change to how the functions are generated (definition())
# renames them all, so releases on either side of it never call each other's.
GENERATION = "3"
_TAG = "$awooop_plan$"
# A call of a function failed where its statement, which worked plain, would not: the function
# was dropped or is not visible on this search_path, a migration changed a result column's type,
# EXECUTE was revoked, or PL/pgSQL reads the body otherwise than plain SQL (its first call
# compiles it; an older server may refuse RETURN QUERY of a data-modifying WITH as not
# supported). Class 42 of SQLSTATE and 0A000; the statement then runs plain (and fails plain if
# it must).
STALE = (asyncpg.exceptions.SyntaxOrAccessError, asyncpg.exceptions.FeatureNotSupportedError)
_marked: set[str] = set()


def keep_plan(sql: str) -> str:
    """Marks sql, a statement that returns rows and is run on its own (not inside a
    transaction of several statements), to be run through its function when the statement
    cache is off; returns sql unchanged."""
    _marked.add(sql)
    return sql


def is_marked(sql: str) -> bool:
    return sql in _marked


def marked() -> list[str]:
    """Every statement marked so far in this process, in a stable order."""
    return sorted(_marked)


@functools.lru_cache(maxsize=4096)
def function_name(sql: str) -> str:
    """The name of sql's function: a hash of its text (and of GENERATION)."""
    return PREFIX + hashlib.sha256(f"{GENERATION}\n{sql.strip()}".encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=4096)
def call_text(name: str, nargs: int) -> str:
    return f"SELECT * FROM {name}({', '.join(f'${i}' for i in range(1, nargs + 1))})"


class Unsuitable(Exception):
    """The statement cannot be the body of a RETURNS TABLE function."""


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def describe(conn: asyncpg.Connection, statements: list[str]) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """Each statement's parameter types and (name, type) of its result columns, as SQL type
    names. Prepared inside one transaction, so it also works through a transaction-mode pooler
    (the server connection is the same until the commit); the type names in one query."""
    shapes: list[tuple[list[int], list[tuple[str, int]]]] = []
    async with conn.transaction():
        for sql in statements:
            stmt = await conn.prepare(sql)
            shapes.append(
                ([t.oid for t in stmt.get_parameters()], [(a.name, a.type.oid) for a in stmt.get_attributes()])
            )
            if stmt.get_name():  # a named statement (the connection's statement cache is on)
                await conn.execute(f"DEALLOCATE {_ident(stmt.get_name())}")
        oids = sorted({o for params, columns in shapes for o in [*params, *(t for _, t in columns)]})
        rows = await server_plans_sql.type_names(conn, oids=oids)
    name_of = {r["oid"]: r["name"] for r in rows}
    return [([name_of[o] for o in params], [(n, name_of[o]) for n, o in columns]) for params, columns in shapes]


def definition(sql: str, params: list[str], columns: list[tuple[str, str]]) -> str:
    """The CREATE FUNCTION statement of sql's function (named function_name(sql))."""
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
    # the planner's settings as the function's own (planner.py): its plans are kept per server
    # connection like a prepared statement's
    settings = " ".join(f"SET {name} = {value}" for name, value in planner.SETTINGS.items())
    return f"""CREATE FUNCTION {function_name(sql)}({signature}) RETURNS TABLE({result})
LANGUAGE plpgsql VOLATILE {settings} AS {_TAG}
#variable_conflict use_column
BEGIN
RETURN QUERY {sql.strip()};
END
{_TAG}"""


def _comment(create: str) -> str:
    """The function's comment: what it is, and a digest of its whole definition (parameter and
    result types included), which tells create_functions whether a function is still current."""
    digest = hashlib.sha256(create.encode()).hexdigest()[:24]
    return (
        "awooop: a hot statement with its plan kept per server connection (services/common/server_plans.py); "
        f"created by awooop migrate, safe to drop; definition {digest}"
    )


@dataclass
class Created:
    """What create_functions did, by function name."""

    created: list[str]
    replaced: list[str]
    unchanged: int
    # statements no function can be made of: (the statement's function name, why)
    skipped: list[tuple[str, str]]


async def create_functions(conn: asyncpg.Connection, statements: Iterable[str], *, verify: bool) -> Created:
    """Creates the function of each statement that has none. With verify (the schema may have
    changed: migrations were applied) each existing one is also checked against its statement's
    current parameter and result types and replaced when they differ. In one round trip when
    all goes well; should that fail, each statement on its own, so one that cannot be a function
    is skipped (and reported) and the rest go on. The caller serializes concurrent callers
    (migrate's advisory lock)."""
    existing = {r["name"]: r["comment"] for r in await server_plans_sql.plan_functions(conn)}
    out = Created([], [], 0, [])
    todo = []
    for sql in dict.fromkeys(statements):
        if verify or function_name(sql) not in existing:
            todo.append(sql)
        else:
            out.unchanged += 1
    shapes: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    try:
        shapes.update(zip(todo, await describe(conn, todo) if todo else [], strict=True))
    except asyncpg.PostgresError:  # some statement cannot be described: each on its own, to know which
        for sql in todo:
            try:
                shapes[sql] = (await describe(conn, [sql]))[0]
            except asyncpg.PostgresError as exc:
                out.skipped.append((function_name(sql), f"{type(exc).__name__}: {exc}"))
    ddl: dict[str, str] = {}  # function name -> the statements that (re)create it
    for sql, (params, columns) in shapes.items():
        name = function_name(sql)
        try:
            create = definition(sql, params, columns)
        except Unsuitable as exc:
            out.skipped.append((name, str(exc)))
            continue
        comment = _comment(create)
        if existing.get(name) == comment:
            out.unchanged += 1
            continue
        # a migration changed a parameter or result type, which CREATE OR REPLACE cannot change
        drop = f"DROP FUNCTION {name};\n" if name in existing else ""
        ddl[name] = f"{drop}{create};\nCOMMENT ON FUNCTION {name} IS '{comment}';"
    if ddl:
        try:  # a batch of statements in one simple query runs as one transaction
            await conn.execute("\n".join(ddl.values()))
        except asyncpg.PostgresError:
            for name, text in list(ddl.items()):
                try:
                    await conn.execute(text)
                except asyncpg.PostgresError as exc:
                    out.skipped.append((name, f"{type(exc).__name__}: {exc}"))
                    del ddl[name]
    for name in ddl:
        (out.replaced if name in existing else out.created).append(name)
    return out


class ServerPlans:
    """One pool's view of the functions: call_for() answers at once with the statement that
    calls sql's function, or None (run sql plain). Learned with learn(), on a connection."""

    def __init__(self) -> None:
        # function name -> oid of the functions this process may call; None until learned
        self._functions: dict[str, int] | None = None
        # functions whose call failed as stale, by the oid that failed: not called again unless
        # the store has another one by that name (a migration replaced it)
        self._failed: dict[str, int] = {}
        self._learning = False
        self._relearn = False
        self._warned_missing = False

    @property
    def needs_learning(self) -> bool:
        return (self._functions is None or self._relearn) and not self._learning

    async def learn(self, conn: asyncpg.Connection) -> None:
        """Reads which functions exist, are visible and may be executed: one query. A store
        that cannot answer it (not a connection failure) leaves every statement plain."""
        self._learning = True
        try:
            rows = await server_plans_sql.plan_functions(conn)
        except asyncpg.PostgresError as exc:
            if isinstance(exc, asyncpg.PostgresConnectionError):
                raise
            log.warning("cannot read the server-side plan functions (%s); hot statements run plain", exc)
            rows = []
        finally:
            self._learning = False
        self._functions = {
            r["name"]: r["oid"] for r in rows if r["callable"] and self._failed.get(r["name"]) != r["oid"]
        }
        self._relearn = False

    def call_for(self, sql: str, nargs: int) -> str | None:
        """The call of sql's function with nargs arguments, or None: sql runs plain."""
        if self._functions is None or not is_marked(sql):
            return None
        name = function_name(sql)
        if name in self._functions:
            return call_text(name, nargs)
        if not self._warned_missing:
            self._warned_missing = True
            log.warning(
                "no server-side plan function %s for a hot statement: it is planned on every call. "
                "`awooop migrate` with this release creates them (claims over several projects have none), "
                "and a service reads them when it starts; the role of AWOOOP_DATABASE_URL needs EXECUTE on them",
                name,
            )
        return None

    def stale(self, sql: str, exc: BaseException) -> None:
        """A call of sql's function failed as stale: sql runs plain, and the functions are
        learned again (on the next call outside a transaction)."""
        name = function_name(sql)
        if self._functions is not None and name in self._functions:
            self._failed[name] = self._functions.pop(name)
            log.warning("the server-side plan function %s failed (%s); running its statement plain", name, exc)
        self._relearn = True

    @property
    def ready(self) -> int:
        """How many functions this process may call (tests)."""
        return len(self._functions or ())
