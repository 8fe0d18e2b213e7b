"""Generated from servicer.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "servicer.sql")
LOG_REQUEST = Q["LogRequest"]
RECORD_OUTCOME = Q["RecordOutcome"]
LOCK_KEY = Q["LockKey"]
RECORDED_CALL = Q["RecordedCall"]
COUNT_REPLAY = Q["CountReplay"]
RECORD_CALL = Q["RecordCall"]
TAKE_FAULT = Q["TakeFault"]


class RecordedCallRow(Protocol):
    """A row of RecordedCall."""

    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class TakeFaultRow(Protocol):
    """A row of TakeFault."""

    @overload
    def __getitem__(self, key: Literal["code"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["message"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def log_request(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    idempotency_key: str | None,
    tool_id: str | None,
    query_timeout: float | None = None,
) -> int:
    """LogRequest (servicer.sql).

    Every ExecuteTool call, before it runs (its outcome comes later).
    """
    return cast("int", await db.fetchval(LOG_REQUEST.sql, project_id, idempotency_key, tool_id, timeout=query_timeout))


async def record_outcome(
    db: sql.Queryable,
    /,
    *,
    outcome: str | None,
    error: str | None,
    request_id: int | None,
    query_timeout: float | None = None,
) -> str:
    """RecordOutcome (servicer.sql).

    A logged call's end: executed, replayed or failed (with its error).
    """
    return await db.execute(RECORD_OUTCOME.sql, outcome, error, request_id, timeout=query_timeout)


async def lock_key(db: sql.Queryable, /, *, lock_name: str | None, query_timeout: float | None = None) -> str:
    """LockKey (servicer.sql).

    Serializes the calls of one "<project>/<idempotency key>" until the transaction ends.
    """
    return await db.execute(LOCK_KEY.sql, lock_name, timeout=query_timeout)


async def recorded_call(
    db: sql.Queryable, /, *, project_id: str | None, idempotency_key: str | None, query_timeout: float | None = None
) -> RecordedCallRow | None:
    """RecordedCall (servicer.sql).

    The recorded success of a key, if any (its replay).
    """
    return cast(
        "RecordedCallRow | None",
        await db.fetchrow(RECORDED_CALL.sql, project_id, idempotency_key, timeout=query_timeout),
    )


async def count_replay(
    db: sql.Queryable, /, *, project_id: str | None, idempotency_key: str | None, query_timeout: float | None = None
) -> str:
    """CountReplay (servicer.sql)."""
    return await db.execute(COUNT_REPLAY.sql, project_id, idempotency_key, timeout=query_timeout)


async def record_call(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    idempotency_key: str | None,
    tool_id: str | None,
    params: object,
    result: object,
    run_id: UUID | str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> str:
    """RecordCall (servicer.sql).

    A success, recorded under its key in the transaction that ran the tool.
    """
    return await db.execute(
        RECORD_CALL.sql, project_id, idempotency_key, tool_id, params, result, run_id, reason, timeout=query_timeout
    )


async def take_fault(
    db: sql.Queryable, /, *, tool_id: str | None, project_id: str | None, query_timeout: float | None = None
) -> TakeFaultRow | None:
    """TakeFault (servicer.sql).

    Consumes one failure of an injected fault of the tool: the project's own before a '*' one; a
    NULL remaining never runs out.
    """
    return cast("TakeFaultRow | None", await db.fetchrow(TAKE_FAULT.sql, tool_id, project_id, timeout=query_timeout))
