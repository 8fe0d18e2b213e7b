"""Concurrency and rate limits per (project, key) (awooop_concurrency_limit; docs/flow-control.md).

The statements are in concurrency.sql (setting, removing and listing limits); the claim grants a
limited key's free slots and parks what it cannot grant (claims.sql), and the trigger of migration
0120 gives a slot back when a run with the key leaves its lease.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from services.scheduler import concurrency_sql

# a limit's largest value (SetConcurrencyLimit wakes at most this many parked runs of an unlimited key)
MAX_LIMIT = 100_000


@dataclass(frozen=True)
class Limit:
    project_id: str
    key: str
    max_running: int  # 0: none
    running: int
    waiting: int = 0
    max_starts: int = 0  # 0: none
    per: float = 0.0


def _limit(
    r: concurrency_sql.SetConcurrencyLimitRow | concurrency_sql.ListConcurrencyLimitsRow, waiting: int = 0
) -> Limit:
    return Limit(
        r["project_id"], r["key"], r["max_running"] or 0, r["running"], waiting, r["max_starts"] or 0, r["per"] or 0.0
    )


async def set_limit(
    pool: asyncpg.Pool,
    project_id: str,
    key: str,
    max_running: int,
    actor: str,
    *,
    max_starts: int = 0,
    per: float = 0.0,
) -> Limit:
    """max_running / max_starts 0: no such limit; both 0 removes the key's limits."""
    if max_running == 0 and max_starts == 0:
        await concurrency_sql.remove_concurrency_limit(pool, project_id=project_id, key=key, actor=actor)
        return Limit(project_id, key, 0, 0)
    row = await concurrency_sql.set_concurrency_limit(
        pool,
        project_id=project_id,
        key=key,
        max_running=max_running or None,
        actor=actor,
        max_starts=max_starts or None,
        per_secs=per if max_starts else None,
    )
    assert row is not None  # an upsert returns its row
    return _limit(row)


async def list_limits(pool: asyncpg.Pool, project_id: str) -> list[Limit]:
    rows = await concurrency_sql.list_concurrency_limits(pool, project_id=project_id)
    return [_limit(r, r["waiting"]) for r in rows]
