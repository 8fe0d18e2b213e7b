"""Generated from journal.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "journal.sql")
BEGIN_STEP = Q["BeginStep"]
RECORD_STEP = Q["RecordStep"]
FINISH_STEP = Q["FinishStep"]
WHY_NOT_WRITTEN = Q["WhyNotWritten"]
JOURNAL_RUN = Q["JournalRun"]
JOURNAL_STEPS = Q["JournalSteps"]
SEED_STEPS = Q["SeedSteps"]


class BeginStepRow(Protocol):
    """A row of BeginStep."""

    @overload
    def __getitem__(self, key: Literal["inserted"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_params"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_cmd"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["started_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["resolved_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resolution_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RecordStepRow(Protocol):
    """A row of RecordStep."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_params"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_cmd"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["started_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["resolved_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resolution_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class FinishStepRow(Protocol):
    """A row of FinishStep."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_params"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_cmd"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["started_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["resolved_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resolution_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class WhyNotWrittenRow(Protocol):
    """A row of WhyNotWritten."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["has_step"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_params"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_cmd"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["resolved_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resolution_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class JournalRunRow(Protocol):
    """A row of JournalRun."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["compensation_started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class JournalStepsRow(Protocol):
    """A row of JournalSteps."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["tool_params"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_cmd"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["started_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["resolved_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resolution_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def begin_step(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    leased: Sequence[str | None] | None,
    projects: Sequence[str | None] | None,
    step_id: str | None,
    step_type: str | None,
    tool_id: str | None,
    tool_params: object,
    query_timeout: float | None = None,
) -> BeginStepRow | None:
    """BeginStep (journal.sql).

    A new step journaled pending at the next seq, or one an earlier attempt left pending or failed,
    of the same kind, begun again by this attempt (`inserted` tells the two apart).
    """
    return cast(
        "BeginStepRow | None",
        await db.fetchrow(
            BEGIN_STEP.sql,
            run_id,
            attempt,
            leased,
            projects,
            step_id,
            step_type,
            tool_id,
            tool_params,
            timeout=query_timeout,
        ),
    )


async def record_step(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    leased: Sequence[str | None] | None,
    projects: Sequence[str | None] | None,
    step_id: str | None,
    step_type: str | None,
    params: object,
    status: str | None,
    result: object,
    error: str | None,
    query_timeout: float | None = None,
) -> RecordStepRow | None:
    """RecordStep (journal.sql).

    A step that already ran, journaled completed (or failed) in one statement, the way BeginStep
    journals it pending (same lease lock, same seq allocation). A pending or failed row of the same
    kind (an earlier attempt's) is overwritten; a completed one is left alone.
    It commits without waiting for the WAL flush (synchronous_commit off for this transaction only):
    a record lost in a Postgres crash means the step runs again, which is all a crash mid-step means
    for these steps anyway. The next synchronous commit of the run (a tool call's BeginStep, the run's
    completion) flushes it, so no later journal entry or run state can outlive it.
    """
    return cast(
        "RecordStepRow | None",
        await db.fetchrow(
            RECORD_STEP.sql,
            run_id,
            attempt,
            leased,
            projects,
            step_id,
            step_type,
            params,
            status,
            result,
            error,
            timeout=query_timeout,
        ),
    )


async def finish_step(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    leased: Sequence[str | None] | None,
    projects: Sequence[str | None] | None,
    status: str | None,
    result: object,
    compensation_cmd: object,
    error: str | None,
    step_id: str | None,
    irreversible: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> FinishStepRow | None:
    """FinishStep (journal.sql).

    A pending step begun by this attempt ends as :status: completed with its :result and (tool
    calls that are not irreversible only) its :compensation_cmd, or failed with its :error (the
    result and the compensation command kept as they were).
    """
    return cast(
        "FinishStepRow | None",
        await db.fetchrow(
            FINISH_STEP.sql,
            run_id,
            attempt,
            leased,
            projects,
            status,
            result,
            compensation_cmd,
            error,
            step_id,
            irreversible,
            timeout=query_timeout,
        ),
    )


async def why_not_written(
    db: sql.Queryable, /, *, step_id: str | None, run_id: UUID | str | None, query_timeout: float | None = None
) -> WhyNotWrittenRow | None:
    """WhyNotWritten (journal.sql).

    The follow-up read after a write changed nothing: the run, the caller's lease and the step, in
    one snapshot (not found, LEASE_LOST, invalid step transition, bad argument).
    """
    return cast(
        "WhyNotWrittenRow | None", await db.fetchrow(WHY_NOT_WRITTEN.sql, step_id, run_id, timeout=query_timeout)
    )


async def journal_run(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> JournalRunRow | None:
    """JournalRun (journal.sql)."""
    return cast("JournalRunRow | None", await db.fetchrow(JOURNAL_RUN.sql, run_id, timeout=query_timeout))


async def journal_steps(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[JournalStepsRow]:
    """JournalSteps (journal.sql)."""
    return cast("list[JournalStepsRow]", await db.fetch(JOURNAL_STEPS.sql, run_id, timeout=query_timeout))


async def seed_steps(db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None) -> Any:
    """SeedSteps (journal.sql).

    The seed's saga_steps JSONB array (ADR-119 D1), assembled on read by the view.
    """
    return await db.fetchval(SEED_STEPS.sql, run_id, timeout=query_timeout)
