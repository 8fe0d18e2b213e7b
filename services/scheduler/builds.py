"""Worker builds (docs/versioning.md): the registry of the builds each project's workers declared
(written as their claims arrive), what is on each build (ListBuilds, the queue sampler), draining a
build (DrainBuild) and moving a run to another (SetRunBuild). The routing itself is the claim's
(claims.sql ClaimRuns); the statements here are builds.sql's."""

from __future__ import annotations

import time
from collections.abc import Sequence

import asyncpg

from services.common.access import projects_with, require_role
from services.common.auth import Principal
from services.common.runstate import Action
from services.scheduler import builds_sql
from services.scheduler.transitions import Changed, operator_change

# a project keeps at most this many builds (BuildSeen): past it a new build is not registered
MAX_BUILDS = 1000
# how often one scheduler marks a (project, build) seen again, at most (and at most a quarter of
# AWOOOP_BUILD_LIVE_SECONDS, the window liveness is judged by)
SEEN_EVERY = 10.0
# SetRunBuild: the people who decide where a run goes (as UnholdRun)
SET_BUILD_ROLES = ("admin", "approver")


class BuildRegistry:
    """Marks the builds of arriving claims seen, at most every `every` seconds per project and
    build in this process (the claim path pays one statement per build and 10 s, not per claim)."""

    def __init__(self, pool: asyncpg.Pool, live_seconds: float, max_kept: int = 10_000) -> None:
        self.pool = pool
        self.every = min(SEEN_EVERY, live_seconds / 4)
        self.max_kept = max_kept
        self._seen: dict[tuple[str, str], float] = {}

    async def seen(self, projects: Sequence[str], build_id: str) -> None:
        now = time.monotonic()
        due = [p for p in projects if now - self._seen.get((p, build_id), -self.every) >= self.every]
        if not due:
            return
        await builds_sql.build_seen(self.pool, projects=due, build_id=build_id, max_builds=MAX_BUILDS)
        if len(self._seen) > self.max_kept:  # bounded: forgetting only costs one more write
            self._seen.clear()
        for p in due:
            self._seen[p, build_id] = now


async def project_builds(
    pool: asyncpg.Pool, project_id: str | None, live_secs: float
) -> list[builds_sql.ProjectBuildsRow]:
    """The builds of a project (None: of every project) with the unfinished runs on each."""
    return await builds_sql.project_builds(pool, project_id=project_id, live_secs=live_secs)


async def project_patches(pool: asyncpg.Pool, project_id: str) -> list[builds_sql.ProjectPatchesRow]:
    """The patches the project's unfinished runs met, with the runs on each path."""
    return await builds_sql.project_patches(pool, project_id=project_id)


async def waiting_for_build(pool: asyncpg.Pool, run_id: str, live_secs: float) -> bool:
    """Whether a queued run on a build waits for a live worker of it (GetRun)."""
    return bool(await builds_sql.waiting_for_build(pool, run_id=run_id, live_secs=live_secs))


async def drain(
    pool: asyncpg.Pool, principal: Principal, project_id: str, build_id: str, *, undrain: bool, reason: str
) -> None:
    """Drains (or undrains) a build of the project: admin only."""
    require_role(principal, project_id, "admin")
    await builds_sql.drain_build(
        pool, project_id=project_id, build_id=build_id, undrain=undrain, actor=principal.actor, reason=reason
    )


async def set_run_build(pool: asyncpg.Pool, principal: Principal, run_id: str, build_id: str, reason: str) -> Changed:
    """Puts a run no worker holds on another build (runstate Action.SET_BUILD)."""
    row = await builds_sql.set_run_build(
        pool,
        run_id=run_id,
        build_id=build_id,
        build_projects=projects_with(principal, SET_BUILD_ROLES),
        actor=principal.actor,
        reason=reason,
    )
    return operator_change(row, principal, SET_BUILD_ROLES, run_id, Action.SET_BUILD)
