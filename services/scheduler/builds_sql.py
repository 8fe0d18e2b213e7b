"""Generated from builds.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "builds.sql")
BUILD_SEEN = Q["BuildSeen"]
PROJECT_BUILDS = Q["ProjectBuilds"]
PROJECT_PATCHES = Q["ProjectPatches"]
WAITING_FOR_BUILD = Q["WaitingForBuild"]
DRAIN_BUILD = Q["DrainBuild"]
SET_RUN_BUILD = Q["SetRunBuild"]


class ProjectBuildsRow(Protocol):
    """A row of ProjectBuilds."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["build_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["first_seen_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["last_seen_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["drained_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["drained_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["live"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["draining"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["newest"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["queued"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["held"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["leased"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["parked"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["waiting_for_build"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ProjectPatchesRow(Protocol):
    """A row of ProjectPatches."""

    @overload
    def __getitem__(self, key: Literal["change_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["patched"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["unpatched"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class DrainBuildRow(Protocol):
    """A row of DrainBuild."""

    @overload
    def __getitem__(self, key: Literal["quiet"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class SetRunBuildRow(Protocol):
    """A row of SetRunBuild."""

    @overload
    def __getitem__(self, key: Literal["cur_run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["cur_project"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cur_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cur_build"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int | None: ...
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
    def __getitem__(self, key: Literal["released_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime | None: ...
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


async def build_seen(
    db: sql.Queryable,
    /,
    *,
    build_id: str | None,
    projects: Sequence[str | None] | None,
    max_builds: int | None,
    query_timeout: float | None = None,
) -> str:
    """BuildSeen (builds.sql).

    A claim of :build_id arrived for :projects: each (project, build) is registered (first seen
    now) or marked seen again. A project keeps at most :max_builds builds: past that a new one is
    not registered (its claims still work; it is never a project's newest build).
    """
    return await db.execute(BUILD_SEEN.sql, build_id, projects, max_builds, timeout=query_timeout)


async def project_builds(
    db: sql.Queryable, /, *, project_id: str | None, live_secs: float | None, query_timeout: float | None = None
) -> list[ProjectBuildsRow]:
    """ProjectBuilds (builds.sql).

    The builds of :project_id (NULL: every project), registered or only named by unfinished runs
    (moved there by hand), with the unfinished runs on each: queued (not held), held (HoldRun),
    leased, parked (an approval, a durable wait). live: a claim of it within :live_secs, or a lease
    it holds. newest: the project's latest first seen that is not draining (the claim's `newest`,
    claims.sql). waiting_for_build: while it is not live, its queued runs that only it may take
    (pinned by their own auto_upgrade or their project's versioning, past their not_before, with
    steps journaled). The runs are read as SampleQueue reads them (queue.sql): the arms of the
    partial indexes of unfinished runs, so the cost follows the backlog.
    """
    return cast(
        "list[ProjectBuildsRow]", await db.fetch(PROJECT_BUILDS.sql, project_id, live_secs, timeout=query_timeout)
    )


async def project_patches(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[ProjectPatchesRow]:
    """ProjectPatches (builds.sql).

    The patches (the SDKs' ctx.patched: a callback step `patch:<change id>` whose result is
    {"patched": true|false}) that :project_id's unfinished runs met, with how many took each path.
    An old path may be deleted once no unfinished run took it (docs/versioning.md, "Patches").
    The runs are read by the arms of the partial indexes of unfinished runs (SampleQueue's).
    """
    return cast("list[ProjectPatchesRow]", await db.fetch(PROJECT_PATCHES.sql, project_id, timeout=query_timeout))


async def waiting_for_build(
    db: sql.Queryable, /, *, live_secs: float | None, run_id: UUID | str | None, query_timeout: float | None = None
) -> bool | None:
    """WaitingForBuild (builds.sql).

    not null
    Whether the queued run :run_id waits for its build: pinned (its own auto_upgrade, else its
    project's versioning), steps journaled, and its build not live (no claim of it within
    :live_secs, no lease held by it). ProjectBuilds' waiting_for_build, for one run (GetRun).
    """
    return cast("bool | None", await db.fetchval(WAITING_FOR_BUILD.sql, live_secs, run_id, timeout=query_timeout))


async def drain_build(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    build_id: str | None,
    undrain: bool | None,
    actor: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> DrainBuildRow | None:
    """DrainBuild (builds.sql).

    Drains :build_id of :project_id (:undrain false) or undrains it, with its BUILD_DRAINED or
    BUILD_UNDRAINED audit row. A build never seen is registered by it (an operator may drain a
    build before its workers start). Undraining wakes the project's waiting claims (at commit).
    """
    return cast(
        "DrainBuildRow | None",
        await db.fetchrow(DRAIN_BUILD.sql, project_id, build_id, undrain, actor, reason, timeout=query_timeout),
    )


async def set_run_build(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    build_id: str | None,
    build_projects: Sequence[str | None] | None,
    actor: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> SetRunBuildRow | None:
    """SetRunBuild (builds.sql).

    SetRunBuild (no lease; :build_projects: the projects where the caller may, NULL: all): a run no
    worker holds, queued or waiting for approval (runstate Action.SET_BUILD), is put on :build_id,
    with its BUILD_SET audit row (from and to). A queued run is then claimable by that build; the
    wake-up NOTIFY is sent at commit.
    """
    return cast(
        "SetRunBuildRow | None",
        await db.fetchrow(SET_RUN_BUILD.sql, run_id, build_id, build_projects, actor, reason, timeout=query_timeout),
    )
