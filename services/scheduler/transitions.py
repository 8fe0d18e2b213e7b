"""Fenced worker writes (CompleteRun, FailRun, ReleaseRun, HoldRun, WaitTool, ResumeTool,
AcknowledgeCancel; RequestApproval lives in approvals.py), CancelRun and UnholdRun.

Each is ONE statement of fenced_writes.sql (read it: the fence, the audit row, the compensation
request and the wake-up are all there). The statement always returns the locked row's current
state too, so when nothing changed the error is chosen without a second round trip
(refusals.fenced_refusal), after checking whether this lease's earlier write committed
(replays.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import asyncpg

from services.common import errors, sql
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row
from services.common.runstate import TRANSITIONS, Action, Transition
from services.common.server_plans import keep_plan
from services.scheduler import fenced_writes_sql, metrics, replays
from services.scheduler.refusals import fenced_refusal
from services.scheduler.saga_client import SagaNudger

WORKER_ROLE = "worker"
# CancelRun: people deciding about runs (approver), the service that created them from a
# channel (ingest: a user's "cancel" arrives through it), and admin. Workers end their own
# runs with FailRun instead.
CANCEL_ROLES = ("admin", "approver", "ingest")
# UnholdRun: the people who decide what happens to a held run (or CancelRun it instead)
UNHOLD_ROLES = ("admin", "approver")
# the parameters every fenced write takes (the fence and the audit row's actor); the others are the action's own
FENCE_PARAMS = ("run_id", "attempt", "allowed", "worker_projects", "actor")


# a fenced write's generated function (fenced_writes_sql, approvals_sql): the fence's parameters,
# then the action's own, by name
Write = Callable[..., Awaitable[Row | None]]


@dataclass(frozen=True)
class FencedOp:
    method: str  # RPC name (metrics label)
    transition: Transition  # runstate: the statuses it may start from, its outcomes and audit actions
    statement: sql.Statement
    write: Write
    # what the refused action was, for INVALID_TRANSITION ("cannot <action> run X in status S");
    # None: the transition's own wording
    describe_cur: Callable[[Row], str] | None = None

    @property
    def allowed(self) -> tuple[str, ...]:
        return self.transition.allowed_from

    @property
    def sql(self) -> str:
        return self.statement.sql

    def describe(self, cur: Row) -> str:
        return self.describe_cur(cur) if self.describe_cur else self.transition.describe


def fenced_op(
    method: str,
    action: Action,
    statement: sql.Statement,
    write: Write,
    describe: Callable[[Row], str] | None = None,
) -> FencedOp:
    """A fenced write of the runstate transition `action` (its statuses and the wording of its
    refusal come from the table), run by `statement` through its generated function `write`: the
    fence's parameters (FENCE_PARAMS), then the action's own by name."""
    t = TRANSITIONS[action]
    assert t.fenced, action
    missing = set(FENCE_PARAMS) - set(statement.params)
    assert not missing, f"{statement.name} lacks the fence's parameters {missing}"
    keep_plan(statement.sql)
    return FencedOp(method, t, statement, write, describe)


Q = fenced_writes_sql
COMPLETE = fenced_op("CompleteRun", Action.COMPLETE, Q.COMPLETE_RUN, Q.complete_run)
FAIL = fenced_op("FailRun", Action.FAIL, Q.FAIL_RUN, Q.fail_run)
RELEASE = fenced_op("ReleaseRun", Action.RELEASE, Q.RELEASE_RUN, Q.release_run)
HOLD = fenced_op("HoldRun", Action.HOLD, Q.HOLD_RUN, Q.hold_run)


def tool_wait(action: Action) -> Write:
    """ToolWait (WaitTool, ResumeTool) set to the transition's one outcome: its new status and
    its audit action."""
    (outcome,) = TRANSITIONS[action].outcomes
    assert outcome.to is not None, action
    return partial(Q.tool_wait, status=outcome.to.value, action=outcome.audit.value)


WAIT_TOOL = fenced_op("WaitTool", Action.WAIT_TOOL, Q.TOOL_WAIT, tool_wait(Action.WAIT_TOOL))
RESUME_TOOL = fenced_op(
    "ResumeTool", Action.RESUME_TOOL, Q.TOOL_WAIT, partial(tool_wait(Action.RESUME_TOOL), tool_id=None)
)
ACKNOWLEDGE_CANCEL = fenced_op(
    "AcknowledgeCancel",
    Action.ACKNOWLEDGE_CANCEL,
    Q.ACKNOWLEDGE_CANCEL,
    Q.acknowledge_cancel,
    lambda cur: "acknowledge a cancel" if cur["cur_cancel"] else "acknowledge an unrequested cancel of",
)

# repeats recognised by the run's state and this attempt's audit row (replays.wrote); a
# RequestApproval repeat needs a new token instead (approvals.py)
REPLAYED_FROM_AUDIT = (WAIT_TOOL, RESUME_TOOL, ACKNOWLEDGE_CANCEL, HOLD)


@dataclass(frozen=True)
class Changed:
    row: Row
    compensation_trigger: str | None

    @property
    def compensation_requested(self) -> bool:
        return self.compensation_trigger is not None


async def fenced_write(
    pool: asyncpg.Pool,
    op: FencedOp,
    principal: Principal,
    run_id: str,
    attempt: int,
    *,
    saga: SagaNudger,
    **params: Any,
) -> Changed:
    """Runs a fenced write with the op's own parameters by name; raises NOT_FOUND /
    PERMISSION_DENIED / LEASE_LOST / INVALID_TRANSITION when it changed nothing."""
    row = await op.write(
        pool,
        run_id=run_id,
        attempt=attempt,
        allowed=list(op.allowed),
        worker_projects=projects_with(principal, WORKER_ROLE),
        actor=principal.actor,
        **params,
    )
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is None:
        check_run_access(principal, row["cur_project"], WORKER_ROLE, run_id)
        replay = await _replayed(pool, op, row, run_id, attempt)
        if replay is not None:
            return replay
        err = fenced_refusal(row, run_id, attempt, op.describe(row))
        if err.reason == errors.LEASE_LOST:
            metrics.LEASE_LOST.labels(op.method).inc()
        raise err
    return settled(row, saga)


async def _replayed(pool: asyncpg.Pool, op: FencedOp, cur: Row, run_id: str, attempt: int) -> Changed | None:
    """The same success again when this lease's earlier write of op committed (replays.py)."""
    if op is COMPLETE:
        done = replays.completed_by(cur, attempt)
    elif op is FAIL:
        done = await replays.failed_by(pool, cur, run_id, attempt)
    elif op is RELEASE:
        done = await replays.released_by(pool, cur, run_id, attempt)
    elif op in REPLAYED_FROM_AUDIT:
        done = await replays.wrote(pool, cur, run_id, attempt, op.transition.action)
    else:
        return None
    if not done:
        return None
    row = (await replays.current_rows(pool, [run_id])).get(run_id)
    return None if row is None else Changed(row, row["comp_trigger"])


def settled(row: Row, saga: SagaNudger) -> Changed:
    """Counts a change and nudges the saga service when a compensation was recorded."""
    metrics.TRANSITIONS.labels(row["status"]).inc()
    trigger = row["comp_trigger"]
    if trigger:
        metrics.COMPENSATIONS.labels(trigger).inc()
        saga.nudge(str(row["run_id"]), trigger, row["failure_reason"] or "")
    return Changed(row, trigger)


# --- CancelRun -----------------------------------------------------------------------------


async def cancel(pool: asyncpg.Pool, principal: Principal, run_id: str, reason: str, *, saga: SagaNudger) -> Changed:
    reason = reason or f"cancelled by {principal.actor}"
    row = await fenced_writes_sql.cancel_run(
        pool,
        run_id=run_id,
        cancel_projects=projects_with(principal, CANCEL_ROLES),
        actor=principal.actor,
        reason=reason,
    )
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is None:
        check_run_access(principal, row["cur_project"], CANCEL_ROLES, run_id)
        if await replays.cancelled_by(pool, row, run_id, principal.actor):  # a repeat: the same success
            current = (await replays.current_rows(pool, [run_id]))[run_id]
            return Changed(current, current["comp_trigger"])
        raise errors.invalid_transition(run_id, row["cur_status"], TRANSITIONS[Action.CANCEL].describe)
    return settled(row, saga)


# --- UnholdRun -----------------------------------------------------------------------------


async def unhold(
    pool: asyncpg.Pool, principal: Principal, run_id: str, reason: str, build_id: str | None = None
) -> Changed:
    """A held run (HoldRun) claimable again, on build_id when given. A repeat after the first one
    committed finds the run no longer held and is refused like any other run that is not held."""
    row = await fenced_writes_sql.unhold_run(
        pool,
        run_id=run_id,
        build_id=build_id,
        unhold_projects=projects_with(principal, UNHOLD_ROLES),
        actor=principal.actor,
        reason=reason,
    )
    # PENDING but not held is refused too: "cannot unhold run X in status PENDING"
    return operator_change(row, principal, UNHOLD_ROLES, run_id, Action.UNHOLD)


def operator_change(
    row: Row | None, principal: Principal, roles: tuple[str, ...], run_id: str, action: Action
) -> Changed:
    """The answer of an operator's change of a run that leaves its status (UnholdRun, SetRunBuild):
    its row when it changed, else NOT_FOUND, PERMISSION_DENIED or INVALID_TRANSITION from the
    locked row (cur_*). Such a change has no repeat to recognise: once made, the run no longer
    qualifies, and a repeat is refused like any other run that does not."""
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is None:
        check_run_access(principal, row["cur_project"], roles, run_id)
        raise errors.invalid_transition(run_id, row["cur_status"], TRANSITIONS[action].describe)
    metrics.TRANSITIONS.labels(row["status"]).inc()
    return Changed(row, None)
