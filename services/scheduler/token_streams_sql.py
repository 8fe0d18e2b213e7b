"""Generated from token_streams.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "token_streams.sql")
TOKEN_LEASE_HOLDS = Q["TokenLeaseHolds"]


async def token_lease_holds(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> bool | None:
    """TokenLeaseHolds (token_streams.sql).

    True when (:run_id, :attempt) is the live lease of a run in the caller's :projects (NULL: any):
    the check awooop_emit_run_event makes, without locking the run (a live token is not durable; a
    checkpoint goes through the locking emit). A read of the run's primary key.
    """
    return cast(
        "bool | None", await db.fetchval(TOKEN_LEASE_HOLDS.sql, run_id, attempt, projects, timeout=query_timeout)
    )
