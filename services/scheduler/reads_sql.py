"""Generated from reads.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "reads.sql")
GET_RUN = Q["GetRun"]
LIST_RUNS = Q["ListRuns"]
RUN_HISTORY = Q["RunHistory"]


class GetRunRow(Protocol):
    """A row of GetRun."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["approval_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_summary"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["compensation_started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["concurrency_keys"], /) -> list[str] | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int: ...
    def __getitem__(self, key: str, /) -> Any: ...


class ListRunsRow(Protocol):
    """A row of ListRuns."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_summary"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["concurrency_keys"], /) -> list[str] | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int | None: ...
    def __getitem__(self, key: str, /) -> Any: ...


class RunHistoryRow(Protocol):
    """A row of RunHistory."""

    @overload
    def __getitem__(self, key: Literal["run_project"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["action"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["from_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["to_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["actor"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["details"], /) -> Any: ...
    def __getitem__(self, key: str, /) -> Any: ...


async def get_run(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> GetRunRow | None:
    """GetRun (reads.sql).

    One run's columns (services/common/runs.py RUN_COLUMNS, the order run_to_pb reads).
    """
    return cast("GetRunRow | None", await db.fetchrow(GET_RUN.sql, run_id, timeout=query_timeout))


async def list_runs(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    parent_run_id: UUID | str | None,
    statuses: Sequence[str] | None,
    channels: Sequence[str] | None,
    created_after: datetime | None,
    created_before: datetime | None,
    provider_event_id: str | None,
    saga_statuses: Sequence[str] | None,
    after_created_at: datetime | None,
    after_run_id: UUID | str | None,
    page_rows: int | None,
    query_timeout: float | None = None,
) -> list[ListRunsRow]:
    """ListRuns (reads.sql).

    A page of ListRuns: a project's runs newest first, keyset-paginated on (created_at DESC, run_id)
    to follow awooop_run_list_idx, :page_rows rows, after the last row of the previous page
    (:after_created_at, :after_run_id; both NULL for the first page). Each filter is NULL for
    "all": :statuses, :channels, created at or after :created_after and before :created_before,
    :provider_event_id, :saga_statuses, :parent_run_id (a run's children). The cursor is written as
    bounds (NULL: 'infinity', which every row is before) rather than `:after IS NULL OR ...`, so that
    a generic plan still starts the index scan at the cursor instead of filtering every newer row of
    the project.
    The page is read by one of two arms, each a page of its own over an index in the page's order:
    the project's runs (awooop_run_list_idx; a one-time filter skips the arm when :parent_run_id is
    given) or the parent's children (awooop_run_children_list_idx, migration 0201; it finds nothing
    when :parent_run_id is NULL). So the generic plan reads the project's arm as the one-arm
    statement did and a parent's children as an index range from the cursor, not a filter over its
    project. The children arm checks the project on the parent's row (a one-time probe: children
    run in their parent's project), not on each child: a project condition on the children lets the
    planner AND the project's index into the scan (5,000 children: 4 ms a page instead of 0.3). The
    arms' filters are the same lines, written twice because a filter cannot move below an arm's
    LIMIT (tests/test_read_statements.py holds them equal).
    """
    return cast(
        "list[ListRunsRow]",
        await db.fetch(
            LIST_RUNS.sql,
            project_id,
            parent_run_id,
            statuses,
            channels,
            created_after,
            created_before,
            provider_event_id,
            saga_statuses,
            after_created_at,
            after_run_id,
            page_rows,
            timeout=query_timeout,
        ),
    )


async def run_history(
    db: sql.Queryable, /, *, max_events: int | None, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[RunHistoryRow]:
    """RunHistory (reads.sql).

    A run's audit rows, oldest first, at most :max_events. The run's project comes with the events
    (one row with NULL events when it has none), so one round trip answers and authorizes.
    """
    return cast("list[RunHistoryRow]", await db.fetch(RUN_HISTORY.sql, max_events, run_id, timeout=query_timeout))
