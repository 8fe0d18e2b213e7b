"""RedriveRuns: an operator requeues a project's FAILED runs matching a filter (error code, time
of failure), each with fresh attempts, as one statement (RedriveRuns, redrive.sql, says how)."""

from __future__ import annotations

import datetime as dt

import asyncpg

from services.scheduler import redrive_sql

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000


async def redrive(
    pool: asyncpg.Pool,
    project_id: str,
    *,
    error_code: str | None,
    failed_after: dt.datetime | None,
    failed_before: dt.datetime | None,
    limit: int,
    actor: str,
    reason: str,
) -> list[str]:
    rows = await redrive_sql.redrive_runs(
        pool,
        project_id=project_id,
        error_code=error_code,
        failed_after=failed_after,
        failed_before=failed_before,
        max_runs=limit,
        actor=actor,
        reason=reason,
    )
    return [str(r["run_id"]) for r in rows if r["run_id"] is not None]  # NULL: none requeued
