"""The operator actions on compensation (seed ADR-119 D4, D5 and its risks section):
Compensate records a request, RetryCompensation re-opens failed compensations,
ResolveCompensation closes one by hand. The driver (driver.py) does the work.

Lock order, shared with the driver so they never deadlock: the run row, then the request row,
then step rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import asyncpg

from services.common import errors
from services.common.access import check_run_access
from services.common.audit import audit
from services.common.auth import Principal
from services.common.compensatable import compensatable_step
from services.common.db import Conn
from services.common.runstate import COMPENSATABLE
from services.saga.journal import step_transition
from services.saga.saga_status import SET_COMPENSATING_SQL, LockedRun, lock_run
from services.saga.steps import STEP_COLUMNS

TRIGGERS = ("approval_rejected", "approval_expired", "step_failed", "cancelled", "manual")

# Steps that have been or will be compensated, in the order the driver runs them.
PLANNED_SQL = f"""
SELECT {STEP_COLUMNS} FROM awooop_saga_step
 WHERE run_id = $1 AND step_type = 'tool_call' AND compensation_cmd IS NOT NULL
   AND status IN ('completed', 'compensating', 'compensated', 'compensation_failed', 'resolved')
 ORDER BY seq DESC
"""
INSERT_REQUEST_SQL = """
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES ($1, $2, $3, $4)
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id
"""
# Re-open: a finished request goes back to pending; a pending or running one is left to its
# driver, which re-reads the eligible steps before it ends.
REOPEN_REQUEST_SQL = """
INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
VALUES ($1, $2, 'manual', $3)
ON CONFLICT (run_id) DO UPDATE
   SET status = CASE WHEN awooop_compensation_request.status = 'done' THEN 'pending'
                     ELSE awooop_compensation_request.status END,
       claimed_by = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                         ELSE awooop_compensation_request.claimed_by END,
       lease_until = CASE WHEN awooop_compensation_request.status = 'done' THEN NULL
                          ELSE awooop_compensation_request.lease_until END,
       updated_at = now()
RETURNING status
"""
RETRY_STEPS_SQL = """
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = $1 AND status = 'compensation_failed' AND ($2 = '' OR step_id = $2)
RETURNING step_id
"""
RESOLVE_SQL = f"""
UPDATE awooop_saga_step SET status = 'resolved', resolved_by = $3, resolution_reason = $4
 WHERE run_id = $1 AND step_id = $2 AND status = 'compensation_failed'
RETURNING {STEP_COLUMNS}
"""
STEP_STATUS_SQL = "SELECT status FROM awooop_saga_step WHERE run_id = $1 AND step_id = $2"
OPEN_LEFT_SQL = f"""
SELECT EXISTS (SELECT 1 FROM awooop_saga_step
                WHERE run_id = $1 AND (status = 'compensation_failed' OR ({compensatable_step()})))
"""
SET_COMPENSATED_SQL = """
UPDATE awooop_run_state
   SET saga_status = 'compensated', compensation_completed_at = now(), updated_at = now()
 WHERE run_id = $1
"""


@dataclass(frozen=True)
class Requested:
    saga_status: str
    steps: list[asyncpg.Record]
    created: bool


@dataclass(frozen=True)
class Resolved:
    step: asyncpg.Record
    saga_status: str


async def _lock_run(conn: Conn, principal: Principal, run_id: str) -> LockedRun:
    run = await lock_run(conn, run_id)
    check_run_access(principal, run.project_id if run else None, "admin", run_id)
    assert run is not None
    return run


async def _refuse_step(conn: Conn, run_id: str, step_id: str, verb: str) -> NoReturn:
    """Why the step could not be acted on: there is no such step, or it is in another status."""
    status = await conn.fetchval(STEP_STATUS_SQL, run_id, step_id)
    if status is None:
        raise errors.not_found("step", step_id, run_id=run_id)
    raise step_transition(run_id, step_id, str(status), verb)


async def request(pool: asyncpg.Pool, principal: Principal, run_id: str, trigger: str, reason: str) -> Requested:
    """Records a compensation request for an ended run (idempotent: a second request for the same
    run changes nothing and answers the current state)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        if run.status not in COMPENSATABLE:
            raise errors.invalid_transition(run_id, run.status, "compensate")
        created = await conn.fetchval(INSERT_REQUEST_SQL, run_id, run.project_id, trigger, reason or None)
        if created is not None:
            await audit(
                conn,
                project_id=run.project_id,
                run_id=run_id,
                actor=principal.actor,
                action="SAGA_COMPENSATION_REQUESTED",
                from_status=run.saga_status,
                reason=reason or None,
                details={"trigger": trigger},
            )
        steps = await conn.fetch(PLANNED_SQL, run_id)
    return Requested(run.saga_status, list(steps), created is not None)


async def retry(pool: asyncpg.Pool, principal: Principal, run_id: str, step_id: str) -> str:
    """Re-opens compensation_failed steps (one, or all when step_id is empty); the driver calls the
    gateway again with the same idempotency key (the gateway replays only successes)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        await conn.fetchval(REOPEN_REQUEST_SQL, run_id, run.project_id, "retry requested by an operator")
        reopened = [r["step_id"] for r in await conn.fetch(RETRY_STEPS_SQL, run_id, step_id)]
        if not reopened:
            if step_id:
                await _refuse_step(conn, run_id, step_id, "retry the compensation of")
            raise errors.invalid_transition(run_id, run.saga_status, "retry compensation (no failed step)")
        await conn.execute(SET_COMPENSATING_SQL, run_id)
        await audit(
            conn,
            project_id=run.project_id,
            run_id=run_id,
            actor=principal.actor,
            action="SAGA_COMPENSATION_RETRY",
            from_status=run.saga_status,
            to_status="compensating",
            details={"steps": reopened},
        )
    return "compensating"


async def resolve(pool: asyncpg.Pool, principal: Principal, run_id: str, step_id: str, reason: str) -> Resolved:
    """Marks a compensation_failed step resolved by hand. When nothing is left failed or to do and no
    driver holds the request, the run's saga_status becomes 'compensated' (resolved steps count as
    handled)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        req_status = await conn.fetchval(
            "SELECT status FROM awooop_compensation_request WHERE run_id = $1 FOR UPDATE", run_id
        )
        step = await conn.fetchrow(RESOLVE_SQL, run_id, step_id, principal.principal_id, reason)
        if step is None:
            await _refuse_step(conn, run_id, step_id, "resolve the compensation of")
        saga_status = run.saga_status
        if req_status in (None, "done") and not await conn.fetchval(OPEN_LEFT_SQL, run_id):
            await conn.execute(SET_COMPENSATED_SQL, run_id)
            saga_status = "compensated"
        await audit(
            conn,
            project_id=run.project_id,
            run_id=run_id,
            actor=principal.actor,
            action="SAGA_COMPENSATION_RESOLVED",
            from_status=run.saga_status,
            to_status=saga_status,
            reason=reason,
            details={"step_id": step_id, "tool_id": step["tool_id"]},
        )
    return Resolved(step, saga_status)
