"""Generated from replays.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "replays.sql")
CURRENT_RUNS = Q["CurrentRuns"]
FAILED_BY = Q["FailedBy"]
RELEASED_BY = Q["ReleasedBy"]
WROTE = Q["Wrote"]
CANCELLED_BY = Q["CancelledBy"]


class CurrentRunsRow(Protocol):
    """A row of CurrentRuns."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["created_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["child_seq"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["concurrency_keys"], /) -> list[str] | None: ...
    @overload
    def __getitem__(self, key: Literal["retry_policy"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["approval_token_hash"], /) -> bytes | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_summary"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["released_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["build_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["auto_upgrade"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["required_labels"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["preferred_labels"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["sticky_worker"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["comp_trigger"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def current_runs(
    db: sql.Queryable, /, *, run_ids: Sequence[UUID | str | None] | None, query_timeout: float | None = None
) -> list[CurrentRunsRow]:
    """CurrentRuns (replays.sql).

    The runs as they are now (the run columns and the compensation request's trigger).
    """
    return cast("list[CurrentRunsRow]", await db.fetch(CURRENT_RUNS.sql, run_ids, timeout=query_timeout))


async def failed_by(
    db: sql.Queryable, /, *, run_id: UUID | str | None, attempt: int | None, query_timeout: float | None = None
) -> bool | None:
    """FailedBy (replays.sql).

    The holder of :attempt failed :run_id (only FailRun writes `retryable` into its details).
    """
    return cast("bool | None", await db.fetchval(FAILED_BY.sql, run_id, attempt, timeout=query_timeout))


async def released_by(
    db: sql.Queryable, /, *, run_id: UUID | str | None, attempt: int | None, query_timeout: float | None = None
) -> bool | None:
    """ReleasedBy (replays.sql).

    The holder of :attempt released :run_id (only ReleaseRun writes `released`; a claim's hand-back
    of undelivered runs does not).
    """
    return cast("bool | None", await db.fetchval(RELEASED_BY.sql, run_id, attempt, timeout=query_timeout))


async def wrote(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    audit_actions: Sequence[str | None] | None,
    attempt: int | None,
    query_timeout: float | None = None,
) -> bool | None:
    """Wrote (replays.sql).

    The holder of :attempt wrote one of :audit_actions (WaitTool, ResumeTool, AcknowledgeCancel)
    from a leased status.
    """
    return cast("bool | None", await db.fetchval(WROTE.sql, run_id, audit_actions, attempt, timeout=query_timeout))


async def cancelled_by(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    actor: str | None,
    audit_actions: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> bool | None:
    """CancelledBy (replays.sql).

    CancelRun is no lease's write: its repeat is recognised by its actor. :actor cancelled the run,
    or asked its worker to (which then did): :audit_actions, the audit actions of CancelRun's outcomes.
    """
    return cast("bool | None", await db.fetchval(CANCELLED_BY.sql, run_id, actor, audit_actions, timeout=query_timeout))
