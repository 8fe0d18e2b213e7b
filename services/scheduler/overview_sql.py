"""Generated from overview.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "overview.sql")
COUNT_LIVE_RUNS = Q["CountLiveRuns"]
COUNT_FINISHED_RUNS = Q["CountFinishedRuns"]
LIST_PROJECTS = Q["ListProjects"]


class CountLiveRunsRow(Protocol):
    """A row of CountLiveRuns."""

    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["n"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["claimable"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["oldest"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["db_now"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class CountFinishedRunsRow(Protocol):
    """A row of CountFinishedRuns."""

    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["n"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListProjectsRow(Protocol):
    """A row of ListProjects."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def count_live_runs(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[CountLiveRunsRow]:
    """CountLiveRuns (overview.sql).

    A project's unfinished runs per status, how many of them are claimable now, and the oldest
    claimable one's creation time. One branch per partial index of unfinished runs (a single
    `status IN (...)` list is not matched to partial indexes, and the list of a project's runs,
    awooop_run_created_list_idx, holds its finished runs too), so its cost follows the backlog, not
    the history: PENDING/RESUMED through awooop_run_claim_idx (project_id first), RUNNING/WAITING_TOOL
    with a worker through awooop_run_leased_idx, WAITING_TOOL parked on a durable wait (no worker)
    through awooop_run_waiting_idx, WAITING_APPROVAL through awooop_run_approval_idx. Claimable is
    the claim's own test (a claimable status, not before its time, attempts left, the project not
    paused), written out here.
    """
    return cast("list[CountLiveRunsRow]", await db.fetch(COUNT_LIVE_RUNS.sql, project_id, timeout=query_timeout))


async def count_finished_runs(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[CountFinishedRunsRow]:
    """CountFinishedRuns (overview.sql).

    A project's finished runs per status: every finished run of the project kept by retention
    (AWOOOP_RUN_RETENTION), from awooop_run_project_finished_idx alone (migration 0370), so CountRuns
    runs it only when asked (include_finished).
    """
    return cast(
        "list[CountFinishedRunsRow]", await db.fetch(COUNT_FINISHED_RUNS.sql, project_id, timeout=query_timeout)
    )


async def list_projects(
    db: sql.Queryable, /, *, max_projects: int | None, query_timeout: float | None = None
) -> list[ListProjectsRow]:
    """ListProjects (overview.sql).

    Distinct projects that have runs, by a loose index scan over awooop_run_created_list_idx (one
    index probe per project instead of reading every run; migration 0370), at most :max_projects.
    """
    return cast("list[ListProjectsRow]", await db.fetch(LIST_PROJECTS.sql, max_projects, timeout=query_timeout))
