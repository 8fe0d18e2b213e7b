"""CountRuns and ListProjects: the reads behind an operator's overview (the console's runs
page). One statement each; the role check is done by the caller (servicer) before the read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg

from services.common.auth import Principal
from services.common.principals import ALL_PROJECTS
from services.scheduler.claiming import CLAIMABLE_NOW, not_paused

MAX_PROJECTS = 1000

# Counts per status, and the oldest claimable run (the claim's own definition, CLAIMABLE_NOW;
# awooop_run_claim_idx answers it). $1 project.
COUNT_SQL = f"""
SELECT (SELECT COALESCE(jsonb_object_agg(status, n), '{{}}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM awooop_run_state WHERE project_id = $1 GROUP BY status) c
       ) AS counts,
       (SELECT min(created_at) FROM awooop_run_state
         WHERE project_id = $1 AND {CLAIMABLE_NOW} AND {not_paused("$1")}) AS oldest,
       now() AS db_now"""

# Distinct projects that have runs, by a loose index scan over awooop_run_list_idx (one index
# probe per project instead of reading every run). $1 limit.
PROJECTS_SQL = """
WITH RECURSIVE p AS (
    (SELECT project_id FROM awooop_run_state ORDER BY project_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.project_id FROM awooop_run_state r WHERE r.project_id > p.project_id
             ORDER BY r.project_id LIMIT 1)
      FROM p WHERE p.project_id IS NOT NULL
)
SELECT project_id FROM p WHERE project_id IS NOT NULL LIMIT $1"""


@dataclass(frozen=True)
class Counts:
    by_status: dict[str, int]
    oldest_claimable: dt.datetime | None
    db_now: dt.datetime


async def count_runs(pool: asyncpg.Pool, project_id: str) -> Counts:
    row = await pool.fetchrow(COUNT_SQL, project_id)
    assert row is not None  # an aggregate without GROUP BY always answers one row
    counts = row["counts"]  # the pool decodes jsonb (services/common/db.py)
    return Counts({str(k): int(v) for k, v in counts.items()}, row["oldest"], row["db_now"])


async def list_projects(pool: asyncpg.Pool, principal: Principal) -> tuple[list[str], bool]:
    """(project ids, all_projects): the projects where the caller holds a role; with a '*'
    grant, every project that has runs (plus the ones granted by name)."""
    named = {p for p in principal.roles if p != ALL_PROJECTS and principal.roles_in(p)}
    if not principal.roles_in(ALL_PROJECTS):
        return sorted(named)[:MAX_PROJECTS], False
    rows = await pool.fetch(PROJECTS_SQL, MAX_PROJECTS)
    return sorted(named | {r["project_id"] for r in rows})[:MAX_PROJECTS], True
