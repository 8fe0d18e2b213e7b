"""Generated from operator_actions.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "operator_actions.sql")
PLANNED_STEPS = Q["PlannedSteps"]
INSERT_REQUEST = Q["InsertRequest"]
REOPEN_REQUEST = Q["ReopenRequest"]
LOCK_REQUEST = Q["LockRequest"]
RETRY_FAILED_STEPS = Q["RetryFailedSteps"]
RESOLVE_STEP = Q["ResolveStep"]
STEP_STATUS = Q["StepStatus"]
OPEN_STEPS_LEFT = Q["OpenStepsLeft"]


class PlannedStepsRow(Protocol):
    """A row of PlannedSteps."""

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


class RetryFailedStepsRow(Protocol):
    """A row of RetryFailedSteps."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ResolveStepRow(Protocol):
    """A row of ResolveStep."""

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


async def planned_steps(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[PlannedStepsRow]:
    """PlannedSteps (operator_actions.sql).

    Steps that have been or will be compensated, in the order the driver runs them
    (sagastate.PLANNED).
    """
    return cast("list[PlannedStepsRow]", await db.fetch(PLANNED_STEPS.sql, run_id, timeout=query_timeout))


async def insert_request(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    project_id: str | None,
    trigger: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> UUID | None:
    """InsertRequest (operator_actions.sql).

    One request per run: a second changes nothing (and returns nothing).
    """
    return cast(
        "UUID | None", await db.fetchval(INSERT_REQUEST.sql, run_id, project_id, trigger, reason, timeout=query_timeout)
    )


async def reopen_request(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    project_id: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> str | None:
    """ReopenRequest (operator_actions.sql).

    Re-open: a finished request goes back to pending, its lease cleared; a pending or running one
    is left to its driver, which re-reads the eligible steps before it ends.
    """
    return cast("str | None", await db.fetchval(REOPEN_REQUEST.sql, run_id, project_id, reason, timeout=query_timeout))


async def lock_request(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str | None:
    """LockRequest (operator_actions.sql).

    The request's status, its row locked (after the run row): no driver finishes it meanwhile.
    """
    return cast("str | None", await db.fetchval(LOCK_REQUEST.sql, run_id, timeout=query_timeout))


async def retry_failed_steps(
    db: sql.Queryable, /, *, run_id: UUID | str | None, step_id: str | None, query_timeout: float | None = None
) -> list[RetryFailedStepsRow]:
    """RetryFailedSteps (operator_actions.sql).

    One step (:step_id) or, with an empty :step_id, every step whose undo failed, back to
    compensating: the driver calls the gateway again with the same key.
    """
    return cast(
        "list[RetryFailedStepsRow]", await db.fetch(RETRY_FAILED_STEPS.sql, run_id, step_id, timeout=query_timeout)
    )


async def resolve_step(
    db: sql.Queryable,
    /,
    *,
    resolved_by: str | None,
    reason: str | None,
    run_id: UUID | str | None,
    step_id: str | None,
    query_timeout: float | None = None,
) -> ResolveStepRow | None:
    """ResolveStep (operator_actions.sql)."""
    return cast(
        "ResolveStepRow | None",
        await db.fetchrow(RESOLVE_STEP.sql, resolved_by, reason, run_id, step_id, timeout=query_timeout),
    )


async def step_status(
    db: sql.Queryable, /, *, run_id: UUID | str | None, step_id: str | None, query_timeout: float | None = None
) -> str | None:
    """StepStatus (operator_actions.sql)."""
    return cast("str | None", await db.fetchval(STEP_STATUS.sql, run_id, step_id, timeout=query_timeout))


async def open_steps_left(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> bool | None:
    """OpenStepsLeft (operator_actions.sql).

    A step of the run still failed, or still to undo.
    """
    return cast("bool | None", await db.fetchval(OPEN_STEPS_LEFT.sql, run_id, timeout=query_timeout))
