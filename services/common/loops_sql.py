"""Generated from loops.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "loops.sql")
RECORD_LOOP_ERROR = Q["RecordLoopError"]


async def record_loop_error(
    db: sql.Queryable,
    /,
    *,
    actor: str | None,
    error: str | None,
    loop: str | None,
    run_id: UUID | str | None,
    query_timeout: float | None = None,
) -> str:
    """RecordLoopError (loops.sql).

    A loop's error on the run's history (a LOOP_ERROR audit row with the run's status), once: not
    again while the run's newest audit row is this same error. :error is what an operator reads,
    :loop the loop's name, :actor the loop's.
    """
    return await db.execute(RECORD_LOOP_ERROR.sql, actor, error, loop, run_id, timeout=query_timeout)
