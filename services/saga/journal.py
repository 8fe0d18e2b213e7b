"""The step journal (seed ADR-119 D1, D2): begin, complete, fail, read.

Every write is ONE statement fenced by the lease: it only writes while the run is RUNNING or
WAITING_TOOL with attempt_count equal to the caller's token, and it locks that run row (FOR
SHARE, or FOR NO KEY UPDATE when it allocates a seq) so a reap or a fail committed first makes the
write find nothing. Each write touches one step row and looks up max(seq) through the unique
(run_id, seq) index, so its cost does not grow with the journal. When nothing was written, one
follow-up read finds out why (not found, LEASE_LOST, invalid step transition, bad argument).
The statements are in journal.sql; the step statuses and their transitions in
services/common/sagastate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc

from services.common import errors, sql
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.principals import MEMBER_ROLES
from services.common.runstate import LEASED
from services.common.sagastate import RESTARTABLE, STEP_TRANSITIONS, StepAction, StepStatus, StepType
from services.saga import journal_sql
from services.saga.steps import IRREVERSIBLE_TOOLS

# How often a write is tried again when the follow-up read finds nothing wrong: the state changed
# between the write and the read (a concurrent write of the same step); the next try decides.
WRITE_TRIES = 3
SEQ_CONSTRAINT = "awooop_saga_step_run_id_seq_key"
SEQ_RACE_TRIES = 100  # each lost race means another begin of the run committed: progress

Q = sql.load(__file__, "journal.sql")
BEGIN = Q["BeginStep"]
RECORD = Q["RecordStep"]
FINISH = Q["FinishStep"]  # CompleteStep and FailStep
WHY = Q["WhyNotWritten"]
RUN = Q["JournalRun"]
STEPS = Q["JournalSteps"]
SEED_JSON = Q["SeedSteps"]

COMPLETE_T = STEP_TRANSITIONS[StepAction.COMPLETE]
FAIL_T = STEP_TRANSITIONS[StepAction.FAIL]


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt: int


@dataclass(frozen=True)
class Begun:
    action: str  # execute | skip | retry
    step: asyncpg.Record


@dataclass(frozen=True)
class Recorded:
    recorded: bool  # False: the step was already completed and its first result stands
    step: asyncpg.Record


@dataclass(frozen=True)
class Journal:
    run: asyncpg.Record
    steps: list[asyncpg.Record]
    seed_steps: list[dict[str, Any]]


def step_transition(run_id: str, step_id: str, status: str, action: str, hint: str = "") -> errors.ServiceError:
    return errors.ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.INVALID_TRANSITION,
        f"cannot {action} step {step_id} of run {run_id} in status {status}{hint}",
        metadata={"run_id": run_id, "step_id": step_id, "status": status, "action": action},
    )


def _retry_later() -> errors.ServiceError:
    return errors.store_unavailable("the step changed concurrently, retry")


async def _why(
    conn: asyncpg.Connection | asyncpg.Pool, principal: Principal, lease: Lease, step_id: str
) -> asyncpg.Record:
    """The follow-up read after a write changed nothing: raises NOT_FOUND / FORBIDDEN / LEASE_LOST,
    or returns the row for the operation to decide."""
    row = await journal_sql.why_not_written(conn, run_id=lease.run_id, step_id=step_id)
    check_run_access(principal, row["project_id"] if row else None, "worker", lease.run_id)
    assert row is not None
    if row["attempt_count"] != lease.attempt or row["run_status"] not in LEASED:
        raise errors.lease_lost(lease.run_id, lease.attempt)
    return row


def _same_kind(row: Any, step_type: str, tool_id: str | None) -> bool:
    return bool(row["step_type"] == step_type and row["tool_id"] == tool_id)


async def _new_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    tool_id: str | None,
    action: str,
    statement: sql.Statement,
    args: tuple[object, ...],
) -> tuple[bool, asyncpg.Record]:
    """Runs a step-inserting statement (BeginStep, RecordStep): (True, the written row), or
    (False, the step as journaled) when it was already completed. Raises NOT_FOUND / LEASE_LOST,
    INVALID_ARGUMENT for a step id journaled as another kind of step, INVALID_TRANSITION for a
    step past completion.

    A seq race is run again: two new steps of one run began at once, the run-row lock made
    this statement wait, but its max(seq) was read in the snapshot taken before the wait; the
    next try sees the winner's row. (A worker journals its steps one at a time; this only
    happens under races.)"""
    tries = races = 0
    while tries < WRITE_TRIES and races < SEQ_RACE_TRIES:
        try:
            row = await pool.fetchrow(statement.sql, *args)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != SEQ_CONSTRAINT:
                raise
            races += 1
            continue
        tries += 1
        if row is not None:
            return True, row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            continue  # lease held and no step: the insert raced with something; try again
        if not _same_kind(why, step_type, tool_id):
            raise _other_kind(step_id, why)
        if why["status"] == StepStatus.COMPLETED:
            return False, why
        if why["status"] not in RESTARTABLE:  # BeginStep's and RecordStep's allowed_from
            raise step_transition(lease.run_id, step_id, why["status"], action)
    raise _retry_later()


def _other_kind(step_id: str, why: Any) -> errors.ServiceError:
    return errors.invalid(
        [
            (
                "step_id",
                f"step {step_id} is already journaled as {why['step_type']}"
                f"{' ' + why['tool_id'] if why['tool_id'] else ''}; a step id names one step",
            )
        ]
    )


async def begin_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    tool_id: str | None,
    tool_params: dict[str, Any] | None,
) -> Begun:
    scope = projects_with(principal, "worker")
    wrote, row = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        tool_id,
        "begin",
        BEGIN,
        BEGIN.args(
            run_id=lease.run_id,
            attempt=lease.attempt,
            step_id=step_id,
            step_type=step_type,
            tool_id=tool_id,
            tool_params=tool_params,
            projects=scope,
            leased=list(LEASED),
        ),
    )
    return Begun(("execute" if row["inserted"] else "retry") if wrote else "skip", row)


async def record_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    result: dict[str, Any] | None,
    error: str | None,
    params: dict[str, Any] | None = None,
) -> Recorded:
    """Journals a step that already ran: completed with result, or failed with error."""
    scope = projects_with(principal, "worker")
    status = StepStatus.FAILED if error is not None else StepStatus.COMPLETED
    wrote, row = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        None,
        "record",
        RECORD,
        RECORD.args(
            run_id=lease.run_id,
            attempt=lease.attempt,
            step_id=step_id,
            step_type=step_type,
            status=status,
            result=result,
            error=error,
            projects=scope,
            leased=list(LEASED),
            params=params,
        ),
    )
    return Recorded(wrote, row)


async def _finish(
    pool: asyncpg.Pool,
    scope: list[str] | None,
    lease: Lease,
    step_id: str,
    status: StepStatus,
    result: dict[str, Any] | None,
    compensation_cmd: dict[str, Any] | None,
    error: str | None,
) -> asyncpg.Record | None:
    """FinishStep: the step's row when this lease's pending step ended as status, else None."""
    args = FINISH.args(
        run_id=lease.run_id,
        attempt=lease.attempt,
        step_id=step_id,
        status=status,
        result=result,
        compensation_cmd=compensation_cmd,
        error=error,
        projects=scope,
        leased=list(LEASED),
        irreversible=list(IRREVERSIBLE_TOOLS),
    )
    row: asyncpg.Record | None = await pool.fetchrow(FINISH.sql, *args)
    return row


async def complete_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    result: dict[str, Any],
    compensation_cmd: dict[str, Any] | None,
) -> asyncpg.Record:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await _finish(pool, scope, lease, step_id, StepStatus.COMPLETED, result, compensation_cmd, None)
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
        status = why["status"]
        if status == StepStatus.COMPLETED and why["attempt"] == lease.attempt:
            return why  # a repeated CompleteStep: the first recorded result stands
        if compensation_cmd is not None and why["step_type"] != StepType.TOOL_CALL:
            raise errors.invalid(
                [
                    (
                        "compensation_cmd",
                        f"only tool_call steps carry a compensation command; {step_id} is a "
                        f"{why['step_type']} step (seed ADR-119 D3)",
                    )
                ]
            )
        if compensation_cmd is not None and why["tool_id"] in IRREVERSIBLE_TOOLS:
            raise errors.invalid(
                [("compensation_cmd", f"{why['tool_id']} is irreversible and is never compensated (seed ADR-119 D6)")]
            )
        if status in COMPLETE_T.allowed_from and why["attempt"] != lease.attempt:
            raise step_transition(
                lease.run_id, step_id, status, "complete", f" (begun by attempt {why['attempt']}: BeginStep it first)"
            )
        if status not in COMPLETE_T.allowed_from:
            raise step_transition(lease.run_id, step_id, status, "complete")
    raise _retry_later()


async def fail_step(pool: asyncpg.Pool, principal: Principal, lease: Lease, step_id: str, error: str) -> asyncpg.Record:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await _finish(pool, scope, lease, step_id, StepStatus.FAILED, None, None, error)
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
        status = why["status"]
        if status == StepStatus.FAILED and why["attempt"] == lease.attempt:
            return why  # a repeated FailStep
        if status in FAIL_T.allowed_from and why["attempt"] != lease.attempt:
            raise step_transition(
                lease.run_id, step_id, status, "fail", f" (begun by attempt {why['attempt']}: BeginStep it first)"
            )
        if status not in FAIL_T.allowed_from:
            raise step_transition(lease.run_id, step_id, status, "fail")
    raise _retry_later()


async def get_journal(pool: asyncpg.Pool, principal: Principal, run_id: str) -> Journal:
    """The journal in order, read in one snapshot. Any member role in the run's project (not tool) may read it, as
    GetRun and GetRunHistory (`awooop runs show` reads all three)."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        run = await journal_sql.journal_run(conn, run_id=run_id)
        check_run_access(principal, run["project_id"] if run else None, MEMBER_ROLES, run_id)
        assert run is not None  # check_run_access raised NOT_FOUND for a missing run
        steps = await journal_sql.journal_steps(conn, run_id=run_id)
        seed = await journal_sql.seed_steps(conn, run_id=run_id)
    return Journal(run, list(steps), seed or [])
