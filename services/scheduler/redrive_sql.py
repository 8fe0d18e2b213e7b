"""Generated from redrive.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "redrive.sql")
REDRIVE_RUNS = Q["RedriveRuns"]


class RedriveRunsRow(Protocol):
    """A row of RedriveRuns."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["notified"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def redrive_runs(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    error_code: str | None,
    failed_after: datetime | None,
    failed_before: datetime | None,
    max_runs: int | None,
    actor: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> list[RedriveRunsRow]:
    """RedriveRuns (redrive.sql).

    RedriveRuns: requeues a project's FAILED runs (runstate Action.REDRIVE: from FAILED to PENDING)
    that match the filter (:error_code; failed at or after :failed_after and before :failed_before;
    each NULL for any), oldest failure first, at most :max_runs, each with fresh attempts, in one
    statement: the runs, a REDRIVEN audit row per run, one RUNS_REDRIVEN row (run_id NULL) for
    the operator's action with its filter, and one wake-up NOTIFY when any run was requeued.
    Fresh attempts keep the fencing token growing: released_count is raised to attempt_count, so
    the attempts used (attempt_count - released_count) start again from 0. A run with a recorded
    compensation request (its steps were or are being undone) is never requeued.
    """
    return cast(
        "list[RedriveRunsRow]",
        await db.fetch(
            REDRIVE_RUNS.sql,
            project_id,
            error_code,
            failed_after,
            failed_before,
            max_runs,
            actor,
            reason,
            timeout=query_timeout,
        ),
    )
