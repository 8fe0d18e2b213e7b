"""The operator actions on compensation (seed ADR-119 D4, D5 and its risks section):
Compensate records a request, RetryCompensation re-opens failed compensations,
ResolveCompensation closes one by hand. The driver (driver.py) does the work.

Lock order, shared with the driver so they never deadlock: the run row, then the request row,
then step rows. The statements are in operator_actions.sql, the writes of saga_status in
saga_status.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import asyncpg

from services.common import errors
from services.common.access import check_run_access
from services.common.audit import audit
from services.common.auth import Principal
from services.common.db import Conn
from services.common.runstate import COMPENSATABLE
from services.common.sagastate import RequestStatus, SagaAudit, SagaStatus, Trigger
from services.saga import operator_actions_sql, saga_status
from services.saga.journal import step_transition
from services.saga.saga_status import LockedRun


@dataclass(frozen=True)
class Requested:
    saga_status: SagaStatus
    steps: list[operator_actions_sql.PlannedStepsRow]
    created: bool


@dataclass(frozen=True)
class Resolved:
    step: operator_actions_sql.ResolveStepRow
    saga_status: SagaStatus


async def _lock_run(conn: Conn, principal: Principal, run_id: str) -> LockedRun:
    run = await saga_status.lock_run(conn, run_id)
    check_run_access(principal, run.project_id if run else None, "admin", run_id)
    assert run is not None
    return run


async def _refuse_step(conn: Conn, run_id: str, step_id: str, verb: str) -> NoReturn:
    """Why the step could not be acted on: there is no such step, or it is in another status."""
    status = await operator_actions_sql.step_status(conn, run_id=run_id, step_id=step_id)
    if status is None:
        raise errors.not_found("step", step_id, run_id=run_id)
    raise step_transition(run_id, step_id, str(status), verb)


async def request(pool: asyncpg.Pool, principal: Principal, run_id: str, trigger: Trigger, reason: str) -> Requested:
    """Records a compensation request for an ended run (idempotent: a second request for the same
    run changes nothing and answers the current state)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        if run.status not in COMPENSATABLE:
            raise errors.invalid_transition(run_id, run.status, "compensate")
        created = await operator_actions_sql.insert_request(
            conn, run_id=run_id, project_id=run.project_id, trigger=trigger, reason=reason or None
        )
        if created is not None:
            await audit(
                conn,
                project_id=run.project_id,
                run_id=run_id,
                actor=principal.actor,
                action=SagaAudit.REQUESTED,
                from_status=run.saga_status,
                reason=reason or None,
                details={"trigger": trigger},
            )
        steps = await operator_actions_sql.planned_steps(conn, run_id=run_id)
    return Requested(run.saga_status, steps, created is not None)


async def retry(pool: asyncpg.Pool, principal: Principal, run_id: str, step_id: str) -> SagaStatus:
    """Re-opens compensation_failed steps (one, or all when step_id is empty); the driver calls the
    gateway again with the same idempotency key (the gateway replays only successes)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        await operator_actions_sql.reopen_request(
            conn, run_id=run_id, project_id=run.project_id, reason="retry requested by an operator"
        )
        reopened = [
            r["step_id"] for r in await operator_actions_sql.retry_failed_steps(conn, run_id=run_id, step_id=step_id)
        ]
        if not reopened:
            if step_id:
                await _refuse_step(conn, run_id, step_id, "retry the compensation of")
            raise errors.invalid_transition(run_id, run.saga_status, "retry compensation (no failed step)")
        await saga_status.start(conn, run_id)
        await audit(
            conn,
            project_id=run.project_id,
            run_id=run_id,
            actor=principal.actor,
            action=SagaAudit.RETRY,
            from_status=run.saga_status,
            to_status=SagaStatus.COMPENSATING,
            details={"steps": reopened},
        )
    return SagaStatus.COMPENSATING


async def resolve(pool: asyncpg.Pool, principal: Principal, run_id: str, step_id: str, reason: str) -> Resolved:
    """Marks a compensation_failed step resolved by hand. When nothing is left failed or to do and no
    driver holds the request, the run's saga_status becomes 'compensated' (resolved steps count as
    handled)."""
    async with pool.acquire() as conn, conn.transaction():
        run = await _lock_run(conn, principal, run_id)
        req_status = await operator_actions_sql.lock_request(conn, run_id=run_id)
        step = await operator_actions_sql.resolve_step(
            conn, run_id=run_id, step_id=step_id, resolved_by=principal.principal_id, reason=reason
        )
        if step is None:
            await _refuse_step(conn, run_id, step_id, "resolve the compensation of")
        after = run.saga_status
        # no driver holds the request (none, or done) and nothing is left failed or to undo
        unheld = req_status is None or req_status == RequestStatus.DONE
        if unheld and not await operator_actions_sql.open_steps_left(conn, run_id=run_id):
            await saga_status.resolved(conn, run_id)
            after = SagaStatus.COMPENSATED
        await audit(
            conn,
            project_id=run.project_id,
            run_id=run_id,
            actor=principal.actor,
            action=SagaAudit.RESOLVED,
            from_status=run.saga_status,
            to_status=after,
            reason=reason,
            details={"step_id": step_id, "tool_id": step["tool_id"]},
        )
    return Resolved(step, after)
