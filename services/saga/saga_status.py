"""Writes of a run's saga_status (in_progress -> compensating -> compensated |
compensation_failed), shared by the driver and the operator actions."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.db import Conn

# Lock order, shared by the driver and the operator actions so they never deadlock: the run
# row, then the request row, then step rows.
LOCK_RUN_SQL = """
SELECT project_id, status, saga_status FROM awooop_run_state WHERE run_id = $1 FOR NO KEY UPDATE
"""


@dataclass(frozen=True)
class LockedRun:
    """The run row as compensation reads it, locked for the rest of the transaction."""

    project_id: str
    status: str
    saga_status: str


async def lock_run(conn: Conn, run_id: object) -> LockedRun | None:
    """Locks the run row (None: no such run)."""
    row = await conn.fetchrow(LOCK_RUN_SQL, run_id)
    return None if row is None else LockedRun(row["project_id"], row["status"], row["saga_status"])


# The compensation of the run starts (or starts again, after RetryCompensation): $1 run_id.
SET_COMPENSATING_SQL = """
UPDATE awooop_run_state
   SET saga_status = 'compensating', compensation_started_at = COALESCE(compensation_started_at, now()),
       compensation_completed_at = NULL, updated_at = now()
 WHERE run_id = $1
"""
