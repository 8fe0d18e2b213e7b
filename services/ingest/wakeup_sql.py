"""Generated from wakeup.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common import sql

Q = sql.load(__file__, "wakeup.sql")
NOTIFY_PROJECTS = Q["NotifyProjects"]


async def notify_projects(
    db: sql.Queryable,
    /,
    *,
    channel: str | None,
    projects: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> str:
    """NotifyProjects (wakeup.sql).

    Wake the scheduler's waiting claimers: one NOTIFY on the run-ready channel per project that got
    claimable runs (sent after the runs' commit; Postgres folds identical ones of a transaction).
    """
    return await db.execute(NOTIFY_PROJECTS.sql, channel, projects, timeout=query_timeout)
