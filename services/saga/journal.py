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

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import grpc

from services.common import errors
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

COMPLETE_T = STEP_TRANSITIONS[StepAction.COMPLETE]
FAIL_T = STEP_TRANSITIONS[StepAction.FAIL]


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt: int


# A step as a write journaled it, or as the follow-up read found it (the step already completed)
Why = journal_sql.WhyNotWrittenRow
Written = TypeVar("Written", journal_sql.BeginStepRow, journal_sql.RecordStepRow)
Finished = journal_sql.FinishStepRow | Why


@dataclass(frozen=True)
class Begun:
    action: str  # execute | skip | retry
    step: journal_sql.BeginStepRow | Why


@dataclass(frozen=True)
class Recorded:
    recorded: bool  # False: the step was already completed and its first result stands
    step: journal_sql.RecordStepRow | Why


@dataclass(frozen=True)
class Journal:
    run: journal_sql.JournalRunRow
    steps: list[journal_sql.JournalStepsRow]
    seed_steps: list[dict[str, Any]]


@dataclass(frozen=True)
class _AlreadyCompleted:
    """A new step's write found the step completed before: its first result stands."""

    step: Why


def step_transition(run_id: str, step_id: str, status: str, action: str, hint: str = "") -> errors.ServiceError:
    return errors.ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.INVALID_TRANSITION,
        f"cannot {action} step {step_id} of run {run_id} in status {status}{hint}",
        metadata={"run_id": run_id, "step_id": step_id, "status": status, "action": action},
    )


def _retry_later() -> errors.ServiceError:
    return errors.store_unavailable("the step changed concurrently, retry")


async def _why(conn: asyncpg.Connection | asyncpg.Pool, principal: Principal, lease: Lease, step_id: str) -> Why:
    """The follow-up read after a write changed nothing: raises NOT_FOUND / FORBIDDEN / LEASE_LOST,
    or returns the row for the operation to decide."""
    row = await journal_sql.why_not_written(conn, run_id=lease.run_id, step_id=step_id)
    check_run_access(principal, row["project_id"] if row else None, "worker", lease.run_id)
    assert row is not None
    if row["attempt_count"] != lease.attempt or row["run_status"] not in LEASED:
        raise errors.lease_lost(lease.run_id, lease.attempt)
    return row


def _same_kind(row: Why, step_type: str, tool_id: str | None) -> bool:
    return bool(row["step_type"] == step_type and row["tool_id"] == tool_id)


async def _new_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    tool_id: str | None,
    action: str,
    write: Callable[[], Awaitable[Written | None]],
) -> Written | _AlreadyCompleted:
    """Runs a step-inserting statement (write: BeginStep or RecordStep): the written row, or the
    step as journaled when it was already completed. Raises NOT_FOUND / LEASE_LOST,
    INVALID_ARGUMENT for a step id journaled as another kind of step, INVALID_TRANSITION for a
    step past completion.

    A seq race is run again: two new steps of one run began at once, the run-row lock made
    this statement wait, but its max(seq) was read in the snapshot taken before the wait; the
    next try sees the winner's row. (A worker journals its steps one at a time; this only
    happens under races.)"""
    tries = races = 0
    while tries < WRITE_TRIES and races < SEQ_RACE_TRIES:
        try:
            row = await write()
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != SEQ_CONSTRAINT:
                raise
            races += 1
            continue
        tries += 1
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        status = why["status"]
        if not why["has_step"] or status is None:
            continue  # lease held and no step: the insert raced with something; try again
        if not _same_kind(why, step_type, tool_id):
            raise _other_kind(step_id, why)
        if status == StepStatus.COMPLETED:
            return _AlreadyCompleted(why)
        if status not in RESTARTABLE:  # BeginStep's and RecordStep's allowed_from
            raise step_transition(lease.run_id, step_id, status, action)
    raise _retry_later()


def _other_kind(step_id: str, why: Why) -> errors.ServiceError:
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
    got = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        tool_id,
        "begin",
        lambda: journal_sql.begin_step(
            pool,
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
    if isinstance(got, _AlreadyCompleted):
        return Begun("skip", got.step)
    return Begun("execute" if got["inserted"] else "retry", got)


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
    got = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        None,
        "record",
        lambda: journal_sql.record_step(
            pool,
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
    if isinstance(got, _AlreadyCompleted):
        return Recorded(False, got.step)
    return Recorded(True, got)


async def _finish(
    pool: asyncpg.Pool,
    scope: list[str] | None,
    lease: Lease,
    step_id: str,
    status: StepStatus,
    result: dict[str, Any] | None,
    compensation_cmd: dict[str, Any] | None,
    error: str | None,
) -> journal_sql.FinishStepRow | None:
    """FinishStep: the step's row when this lease's pending step ended as status, else None."""
    return await journal_sql.finish_step(
        pool,
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


async def complete_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    result: dict[str, Any],
    compensation_cmd: dict[str, Any] | None,
) -> Finished:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await _finish(pool, scope, lease, step_id, StepStatus.COMPLETED, result, compensation_cmd, None)
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        status = why["status"]
        if not why["has_step"] or status is None:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
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


async def fail_step(pool: asyncpg.Pool, principal: Principal, lease: Lease, step_id: str, error: str) -> Finished:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await _finish(pool, scope, lease, step_id, StepStatus.FAILED, None, None, error)
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        status = why["status"]
        if not why["has_step"] or status is None:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
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
