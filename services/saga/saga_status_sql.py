"""Generated from saga_status.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "saga_status.sql")
LOCK_RUN = Q["LockRun"]
START_COMPENSATION = Q["StartCompensation"]
END_COMPENSATION = Q["EndCompensation"]
SKIP_COMPENSATION = Q["SkipCompensation"]
RESOLVED_COMPENSATION = Q["ResolvedCompensation"]


class LockRunRow(Protocol):
    """A row of LockRun."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def lock_run(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> LockRunRow | None:
    """LockRun (saga_status.sql).

    The run row as compensation reads it, locked for the rest of the transaction. Lock order,
    shared by the driver and the operator actions so they never deadlock: the run row, then the
    request row, then step rows.
    """
    return cast("LockRunRow | None", await db.fetchrow(LOCK_RUN.sql, run_id, timeout=query_timeout))


async def start_compensation(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str:
    """StartCompensation (saga_status.sql).

    The compensation of the run starts (or starts again, after RetryCompensation): the start time
    is kept from the first time, the end is cleared.
    """
    return await db.execute(START_COMPENSATION.sql, run_id, timeout=query_timeout)


async def end_compensation(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str | None:
    """EndCompensation (saga_status.sql).

    The driver found no step left to undo: compensation_failed when a step's undo failed (and was
    neither retried nor resolved), else compensated. Returns the status written.
    """
    return cast("str | None", await db.fetchval(END_COMPENSATION.sql, run_id, timeout=query_timeout))


async def skip_compensation(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str:
    """SkipCompensation (saga_status.sql).

    A request for a run with nothing to undo ends (seed ADR-119 D6): the saga was not needed.
    """
    return await db.execute(SKIP_COMPENSATION.sql, run_id, timeout=query_timeout)


async def resolved_compensation(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str:
    """ResolvedCompensation (saga_status.sql).

    An operator resolved the last failed step and nothing is left to undo: the compensation ended.
    """
    return await db.execute(RESOLVED_COMPENSATION.sql, run_id, timeout=query_timeout)
