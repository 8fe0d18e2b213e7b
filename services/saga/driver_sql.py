"""Generated from driver.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "driver.sql")
CLAIM_COMPENSATION_REQUESTS = Q["ClaimCompensationRequests"]
FENCE_COMPENSATION_REQUEST = Q["FenceCompensationRequest"]
RENEW_COMPENSATION_LEASE = Q["RenewCompensationLease"]
RELEASE_COMPENSATION_REQUEST = Q["ReleaseCompensationRequest"]
FINISH_COMPENSATION_REQUEST = Q["FinishCompensationRequest"]
COMPENSATABLE_STEPS = Q["CompensatableSteps"]
STEPS_NOT_COMPENSATED = Q["StepsNotCompensated"]
MARK_STEP_COMPENSATING = Q["MarkStepCompensating"]
STEP_COMPENSATED = Q["StepCompensated"]
STEP_COMPENSATION_FAILED = Q["StepCompensationFailed"]
INSERT_ALERT = Q["InsertAlert"]
RUN_TRACEPARENT = Q["RunTraceparent"]


class ClaimCompensationRequestsRow(Protocol):
    """A row of ClaimCompensationRequests."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["trigger"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class CompensatableStepsRow(Protocol):
    """A row of CompensatableSteps."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class StepsNotCompensatedRow(Protocol):
    """A row of StepsNotCompensated."""

    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["why"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class MarkStepCompensatingRow(Protocol):
    """A row of MarkStepCompensating."""

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


async def claim_compensation_requests(
    db: sql.Queryable,
    /,
    *,
    worker_id: str | None,
    lease_ttl: float | None,
    batch: int | None,
    query_timeout: float | None = None,
) -> list[ClaimCompensationRequestsRow]:
    """ClaimCompensationRequests (driver.sql).

    Open requests, oldest first, of runs that ended without success (or of finished child runs
    whose parent did: trigger parent_ended, migration 0190): pending, or running with an expired
    lease (a crashed replica's), skipping those another replica holds locked. The run tree's order
    (docs/architecture.md "Child runs"): a run's request waits while one of its children has not
    ended (a leased child asked to cancel may still complete, and is then undone too: migration
    0280) or has a request open (children are undone before the parent's own steps), and the
    request of a child whose tree is being undone (trigger parent_ended, or a parent that ended
    FAILED or CANCELLED) waits while a newer sibling (child_seq) has not ended or has a request
    open (newest child first, also when the newer one was still running, asked to cancel, when
    the older one's request was written).
    """
    return cast(
        "list[ClaimCompensationRequestsRow]",
        await db.fetch(CLAIM_COMPENSATION_REQUESTS.sql, worker_id, lease_ttl, batch, timeout=query_timeout),
    )


async def fence_compensation_request(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    worker_id: str | None,
    attempt: int | None,
    query_timeout: float | None = None,
) -> int | None:
    """FenceCompensationRequest (driver.sql).

    The lease is still ours: locks the request row for the rest of the transaction (after the run
    row, LockRun), or returns nothing when another replica took it over.
    """
    return cast(
        "int | None",
        await db.fetchval(FENCE_COMPENSATION_REQUEST.sql, run_id, worker_id, attempt, timeout=query_timeout),
    )


async def renew_compensation_lease(
    db: sql.Queryable,
    /,
    *,
    lease_ttl: float | None,
    run_id: UUID | str | None,
    worker_id: str | None,
    attempt: int | None,
    query_timeout: float | None = None,
) -> int | None:
    """RenewCompensationLease (driver.sql).

    Extends our lease (per step and per gateway try); nothing returned: the lease was lost.
    """
    return cast(
        "int | None",
        await db.fetchval(RENEW_COMPENSATION_LEASE.sql, lease_ttl, run_id, worker_id, attempt, timeout=query_timeout),
    )


async def release_compensation_request(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    worker_id: str | None,
    attempt: int | None,
    query_timeout: float | None = None,
) -> str:
    """ReleaseCompensationRequest (driver.sql).

    The gateway refused our key: the request waits unclaimed until the key works (GatewayAuth), and
    its step left 'compensating' is called again then, with the same idempotency key.
    """
    return await db.execute(RELEASE_COMPENSATION_REQUEST.sql, run_id, worker_id, attempt, timeout=query_timeout)


async def finish_compensation_request(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str:
    """FinishCompensationRequest (driver.sql).

    No step is left to undo; run in the transaction that fenced the request (FenceCompensationRequest).
    """
    return await db.execute(FINISH_COMPENSATION_REQUEST.sql, run_id, timeout=query_timeout)


async def compensatable_steps(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[CompensatableStepsRow]:
    """CompensatableSteps (driver.sql).

    The steps the driver still has to undo, newest first (the order it undoes them in).
    """
    return cast("list[CompensatableStepsRow]", await db.fetch(COMPENSATABLE_STEPS.sql, run_id, timeout=query_timeout))


async def steps_not_compensated(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[StepsNotCompensatedRow]:
    """StepsNotCompensated (driver.sql).

    The completed or pending steps the compensation leaves in place, and why (for the audit row's
    details; at most 100 listed).
    """
    return cast(
        "list[StepsNotCompensatedRow]", await db.fetch(STEPS_NOT_COMPENSATED.sql, run_id, timeout=query_timeout)
    )


async def mark_step_compensating(
    db: sql.Queryable, /, *, run_id: UUID | str | None, step_id: str | None, query_timeout: float | None = None
) -> MarkStepCompensatingRow | None:
    """MarkStepCompensating (driver.sql).

    The durable intent, committed before the gateway call: a crash leaves the step 'compensating'
    and the next owner calls again with the same idempotency key (the gateway replays).
    """
    return cast(
        "MarkStepCompensatingRow | None",
        await db.fetchrow(MARK_STEP_COMPENSATING.sql, run_id, step_id, timeout=query_timeout),
    )


async def step_compensated(
    db: sql.Queryable, /, *, run_id: UUID | str | None, step_id: str | None, query_timeout: float | None = None
) -> str | None:
    """StepCompensated (driver.sql)."""
    return cast("str | None", await db.fetchval(STEP_COMPENSATED.sql, run_id, step_id, timeout=query_timeout))


async def step_compensation_failed(
    db: sql.Queryable,
    /,
    *,
    error: str | None,
    run_id: UUID | str | None,
    step_id: str | None,
    query_timeout: float | None = None,
) -> str | None:
    """StepCompensationFailed (driver.sql).

    Written with its audit row and its alert (InsertAlert) in one transaction.
    """
    return cast(
        "str | None", await db.fetchval(STEP_COMPENSATION_FAILED.sql, error, run_id, step_id, timeout=query_timeout)
    )


async def insert_alert(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    run_id: UUID | str | None,
    step_id: str | None,
    tool_id: str | None,
    error: str | None,
    query_timeout: float | None = None,
) -> str:
    """InsertAlert (driver.sql).

    The escalation outbox row of a failed compensation (services/saga/notifier.py delivers it).
    """
    return await db.execute(INSERT_ALERT.sql, project_id, run_id, step_id, tool_id, error, timeout=query_timeout)


async def run_traceparent(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> str | None:
    """RunTraceparent (driver.sql).

    The run's trace context, so the compensation is a span of the run's trace.
    """
    return cast("str | None", await db.fetchval(RUN_TRACEPARENT.sql, run_id, timeout=query_timeout))
