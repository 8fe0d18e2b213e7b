"""Generated from workers.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "workers.sql")
WORKER_SEEN = Q["WorkerSeen"]
WORKER_BEAT = Q["WorkerBeat"]
SWEEP_LABELS = Q["SweepLabels"]
LABELED_PROJECTS = Q["LabeledProjects"]
PROJECT_WORKERS = Q["ProjectWorkers"]


class SweepLabelsRow(Protocol):
    """A row of SweepLabels."""

    @overload
    def __getitem__(self, key: Literal["parked"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["woken"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["notified"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class LabeledProjectsRow(Protocol):
    """A row of LabeledProjects."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ProjectWorkersRow(Protocol):
    """A row of ProjectWorkers."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["labels"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["build_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["first_seen_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["last_seen_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["live"], /) -> bool: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def worker_seen(
    db: sql.Queryable,
    /,
    *,
    worker_id: str | None,
    labels: str | None,
    build_id: str | None,
    projects: Sequence[str | None] | None,
    max_workers: int | None,
    wake: bool | None,
    query_timeout: float | None = None,
) -> int | None:
    """WorkerSeen (workers.sql).

    A claim of :worker_id with :labels (a JSON object) and :build_id ('': none) arrived for
    :projects: each (project, worker) is registered, or marked seen again with these. A project keeps at most
    :max_workers workers: past that a new one is not registered (its claims still work; it does
    not count as live). With :wake (this scheduler has not seen the worker with these labels
    before), the project's runs parked for labels this worker has are woken at once (not_before
    NULL) and their projects notified, so the claim that follows takes them.
    """
    return cast(
        "int | None",
        await db.fetchval(
            WORKER_SEEN.sql, worker_id, labels, build_id, projects, max_workers, wake, timeout=query_timeout
        ),
    )


async def worker_beat(db: sql.Queryable, /, *, worker_id: str | None, query_timeout: float | None = None) -> str:
    """WorkerBeat (workers.sql).

    A heartbeat of :worker_id renewed a lease: the worker is marked seen in every project it is
    registered in (a worker busy with long runs claims nothing, and is live all the same).
    """
    return await db.execute(WORKER_BEAT.sql, worker_id, timeout=query_timeout)


async def sweep_labels(
    db: sql.Queryable,
    /,
    *,
    live_secs: float | None,
    project_id: str | None,
    forget_secs: float | None,
    query_timeout: float | None = None,
) -> SweepLabelsRow | None:
    """SweepLabels (workers.sql).

    The label sweep of :project_id (NULL: every project): a queued run that requires labels no live
    worker of its project has (a claim or a heartbeat seen within :live_secs: a worker busy with
    long runs does not claim, it heartbeats) is parked (not_before 'infinity',
    wait_reason 'labels': past the due bound of the claim's scans, so claims do not read it); a
    parked one that a live worker can take again is woken and its project notified. Only runs that
    are due (or parked by this sweep) are looked at: a run delayed, backing off, held or parked
    behind a key keeps its reason. The runs are read by awooop_run_labeled_idx (only runs that
    require labels are in it). A row a claim holds is waited for and then re-checked (it is RUNNING
    by then, and left alone). Registrations unseen for :forget_secs are dropped.
    """
    return cast(
        "SweepLabelsRow | None",
        await db.fetchrow(SWEEP_LABELS.sql, live_secs, project_id, forget_secs, timeout=query_timeout),
    )


async def labeled_projects(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[LabeledProjectsRow]:
    """LabeledProjects (workers.sql).

    The projects with queued runs that require labels: the label sweep goes through them one by
    one when a sweep of all failed for one project's data.
    """
    return cast("list[LabeledProjectsRow]", await db.fetch(LABELED_PROJECTS.sql, timeout=query_timeout))


async def project_workers(
    db: sql.Queryable, /, *, live_secs: float | None, project_id: str | None, query_timeout: float | None = None
) -> list[ProjectWorkersRow]:
    """ProjectWorkers (workers.sql).

    The workers of :project_id (NULL: every project) with their labels; live: a claim seen within
    :live_secs.
    """
    return cast(
        "list[ProjectWorkersRow]", await db.fetch(PROJECT_WORKERS.sql, live_secs, project_id, timeout=query_timeout)
    )
