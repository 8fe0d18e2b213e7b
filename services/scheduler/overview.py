"""CountRuns and ListProjects: the reads behind an operator's overview (the console's runs
page) and an autoscaler's "claimable now". The role check is done by the caller (read_rpcs.py)
before the read. CountRuns reads only unfinished runs (CountLiveRuns, its cost follows the
backlog); finished runs are counted only when asked (CountFinishedRuns reads the project's
retained history)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg

from services.common.auth import Principal
from services.common.principals import ALL_PROJECTS
from services.scheduler import overview_sql

MAX_PROJECTS = 1000


@dataclass(frozen=True)
class Counts:
    by_status: dict[str, int]  # unfinished statuses, and finished ones when asked
    claimable: int
    oldest_claimable: dt.datetime | None
    db_now: dt.datetime | None  # None when the project has no unfinished run


async def count_runs(pool: asyncpg.Pool, project_id: str, include_finished: bool = False) -> Counts:
    rows = await overview_sql.count_live_runs(pool, project_id=project_id)
    by_status = {str(r["status"]): int(r["n"]) for r in rows}
    oldest = min((r["oldest"] for r in rows if r["oldest"] is not None), default=None)
    db_now = rows[0]["db_now"] if rows else None
    if include_finished:
        done = await overview_sql.count_finished_runs(pool, project_id=project_id)
        by_status.update({str(r["status"]): int(r["n"]) for r in done})
    return Counts(by_status, sum(int(r["claimable"]) for r in rows), oldest, db_now)


async def list_projects(pool: asyncpg.Pool, principal: Principal) -> tuple[list[str], bool]:
    """(project ids, all_projects): the projects where the caller holds a role; with a '*'
    grant, every project that has runs (plus the ones granted by name)."""
    named = {p for p in principal.roles if p != ALL_PROJECTS and principal.member_of(p)}
    if not principal.member_of(ALL_PROJECTS):
        return sorted(named)[:MAX_PROJECTS], False
    rows = await overview_sql.list_projects(pool, max_projects=MAX_PROJECTS)
    return sorted(named | {r["project_id"] for r in rows})[:MAX_PROJECTS], True
