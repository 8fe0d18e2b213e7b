"""CountRuns and ListProjects: the reads behind an operator's overview (the console's runs
page). One statement each; the role check is done by the caller (servicer) before the read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg

from services.common import sql
from services.common.auth import Principal
from services.common.principals import ALL_PROJECTS

MAX_PROJECTS = 1000

Q = sql.load(__file__, "overview.sql")
COUNT = Q["CountRuns"]
PROJECTS = Q["ListProjects"]


@dataclass(frozen=True)
class Counts:
    by_status: dict[str, int]
    oldest_claimable: dt.datetime | None
    db_now: dt.datetime


async def count_runs(pool: asyncpg.Pool, project_id: str) -> Counts:
    row = await pool.fetchrow(COUNT.sql, *COUNT.args(project_id=project_id))
    assert row is not None  # an aggregate without GROUP BY always answers one row
    counts = row["counts"]  # the pool decodes jsonb (services/common/db.py)
    return Counts({str(k): int(v) for k, v in counts.items()}, row["oldest"], row["db_now"])


async def list_projects(pool: asyncpg.Pool, principal: Principal) -> tuple[list[str], bool]:
    """(project ids, all_projects): the projects where the caller holds a role; with a '*'
    grant, every project that has runs (plus the ones granted by name)."""
    named = {p for p in principal.roles if p != ALL_PROJECTS and principal.member_of(p)}
    if not principal.member_of(ALL_PROJECTS):
        return sorted(named)[:MAX_PROJECTS], False
    rows = await pool.fetch(PROJECTS.sql, *PROJECTS.args(max_projects=MAX_PROJECTS))
    return sorted(named | {r["project_id"] for r in rows})[:MAX_PROJECTS], True
