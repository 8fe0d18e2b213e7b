"""Generated from concurrency.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "concurrency.sql")
SET_CONCURRENCY_LIMIT = Q["SetConcurrencyLimit"]
REMOVE_CONCURRENCY_LIMIT = Q["RemoveConcurrencyLimit"]
LIST_CONCURRENCY_LIMITS = Q["ListConcurrencyLimits"]


class SetConcurrencyLimitRow(Protocol):
    """A row of SetConcurrencyLimit."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["key"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["max_running"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["running"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["max_starts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["per"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: Literal["woken"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["quiet"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RemoveConcurrencyLimitRow(Protocol):
    """A row of RemoveConcurrencyLimit."""

    @overload
    def __getitem__(self, key: Literal["woken"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["quiet"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListConcurrencyLimitsRow(Protocol):
    """A row of ListConcurrencyLimits."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["key"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["max_running"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["running"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["max_starts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["per"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: Literal["waiting"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def set_concurrency_limit(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    key: str | None,
    max_running: int | None,
    actor: str | None,
    max_starts: int | None,
    per_secs: float | None,
    query_timeout: float | None = None,
) -> SetConcurrencyLimitRow | None:
    """SetConcurrencyLimit (concurrency.sql).

    :max_running (NULL: none), :max_starts (NULL: none) per :per_secs seconds for (:project_id,
    :key). Setting a limit counts the key's leased runs (a worker holds them: not a run parked on a
    durable wait, migration 0241) in the same statement, so a limit set while runs hold leases
    starts from the truth. The key row's lock serializes this with claims of the
    key; a raised limit wakes as many parked runs as it frees (at most 100000, concurrency.py's
    MAX_LIMIT, when the key has no running limit).
    """
    return cast(
        "SetConcurrencyLimitRow | None",
        await db.fetchrow(
            SET_CONCURRENCY_LIMIT.sql, project_id, key, max_running, actor, max_starts, per_secs, timeout=query_timeout
        ),
    )


async def remove_concurrency_limit(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    key: str | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> RemoveConcurrencyLimitRow | None:
    """RemoveConcurrencyLimit (concurrency.sql).

    (:project_id, :key) becomes unlimited and its parked runs claimable.
    """
    return cast(
        "RemoveConcurrencyLimitRow | None",
        await db.fetchrow(REMOVE_CONCURRENCY_LIMIT.sql, project_id, key, actor, timeout=query_timeout),
    )


async def list_concurrency_limits(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[ListConcurrencyLimitsRow]:
    """ListConcurrencyLimits (concurrency.sql).

    A project's limits, each with the runs waiting on it (parked behind it or its rate window).
    """
    return cast(
        "list[ListConcurrencyLimitsRow]", await db.fetch(LIST_CONCURRENCY_LIMITS.sql, project_id, timeout=query_timeout)
    )
