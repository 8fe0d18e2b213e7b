"""The saga's writes of a run's saga_status (sagastate.SAGA_TRANSITIONS: in_progress ->
compensating -> compensated | compensation_failed, or not_needed), shared by the driver and the
operator actions, and the run row lock they take first. The statements are in saga_status.sql."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from services.common.db import Conn
from services.common.runstate import RunStatus
from services.common.sagastate import SagaStatus
from services.saga import saga_status_sql


@dataclass(frozen=True)
class LockedRun:
    """The run row as compensation reads it, locked for the rest of the transaction."""

    project_id: str
    status: RunStatus
    saga_status: SagaStatus


async def lock_run(conn: Conn, run_id: UUID | str) -> LockedRun | None:
    """Locks the run row (None: no such run). Lock order, shared by the driver and the operator
    actions so they never deadlock: the run row, then the request row, then step rows."""
    row = await saga_status_sql.lock_run(conn, run_id=run_id)
    if row is None:
        return None
    return LockedRun(row["project_id"], RunStatus(row["status"]), SagaStatus(row["saga_status"]))


async def start(conn: Conn, run_id: UUID | str) -> None:
    """The compensation starts, or starts again after RetryCompensation."""
    await saga_status_sql.start_compensation(conn, run_id=run_id)


async def end(conn: Conn, run_id: UUID | str) -> SagaStatus:
    """No step is left to undo: compensated, or compensation_failed when an undo failed."""
    written = await saga_status_sql.end_compensation(conn, run_id=run_id)
    if written is None:  # no row: the caller holds the run's row lock (lock_run), so it is a bug
        raise LookupError(f"run {run_id} is gone under its row lock")
    return SagaStatus(written)


async def skip(conn: Conn, run_id: UUID | str) -> None:
    """Nothing to undo (seed ADR-119 D6): not_needed."""
    await saga_status_sql.skip_compensation(conn, run_id=run_id)


async def resolved(conn: Conn, run_id: UUID | str) -> None:
    """An operator resolved the last failed step, nothing is left: compensated."""
    await saga_status_sql.resolved_compensation(conn, run_id=run_id)
