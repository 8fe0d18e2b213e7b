"""Generated from server_plans.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "server_plans.sql")
PLAN_FUNCTIONS = Q["PlanFunctions"]
TYPE_NAMES = Q["TypeNames"]


class PlanFunctionsRow(Protocol):
    """A row of PlanFunctions."""

    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["oid"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["callable"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["comment"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class TypeNamesRow(Protocol):
    """A row of TypeNames."""

    @overload
    def __getitem__(self, key: Literal["oid"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def plan_functions(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[PlanFunctionsRow]:
    """PlanFunctions (server_plans.sql).

    The plan functions visible on this connection's search_path (callable by name), whether its
    role may EXECUTE them, and each one's comment (a digest of its definition). A service reads
    them once per pool and again after a call failed as stale; the migration step reads them to
    create only what is missing. The prefix is server_plans.PREFIX (`_` escaped for LIKE).
    """
    return cast("list[PlanFunctionsRow]", await db.fetch(PLAN_FUNCTIONS.sql, timeout=query_timeout))


async def type_names(
    db: sql.Queryable, /, *, oids: Sequence[int | None] | None, query_timeout: float | None = None
) -> list[TypeNamesRow]:
    """TypeNames (server_plans.sql).

    The SQL names of types by oid: the parameter and result types of statements, written into
    the signatures of their functions.
    """
    return cast("list[TypeNamesRow]", await db.fetch(TYPE_NAMES.sql, oids, timeout=query_timeout))
