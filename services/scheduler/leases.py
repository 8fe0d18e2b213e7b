"""Renewing leases (seed 000 D2; docs/architecture.md, "Leases and fencing"): Heartbeat is ONE
statement for a whole batch of leases, leases.sql Heartbeat (read it for the rules). The claim
that grants a lease is in claims.sql."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from services.common.server_plans import keep_plan
from services.scheduler import leases_sql

keep_plan(leases_sql.HEARTBEAT.sql)


@dataclass(frozen=True)
class Renewal:
    lease_until: datetime | None  # None: LEASE_LOST
    cancel_requested: bool


async def heartbeat(
    pool: asyncpg.Pool,
    worker_id: str,
    leases: list[tuple[str, int]],
    lease_ttl: float,
    projects: list[str] | None,
) -> list[Renewal]:
    rows = await leases_sql.heartbeat(
        pool,
        run_ids=[r for r, _ in leases],
        attempts=[a for _, a in leases],
        worker_id=worker_id,
        lease_secs=lease_ttl,
        worker_projects=projects,
    )
    # a run listed twice is updated once: answer every position that names it
    renewed = {(str(leases[r["ord"] - 1][0]), leases[r["ord"] - 1][1]): r for r in rows}
    out = []
    for lease in leases:
        row = renewed.get((str(lease[0]), lease[1]))
        out.append(Renewal(None, False) if row is None else Renewal(row["lease_until"], bool(row["cancel_requested"])))
    return out
