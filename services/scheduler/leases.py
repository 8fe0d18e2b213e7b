"""Renewing leases (seed 000 D2; docs/architecture.md, "Leases and fencing"). The claim that
grants a lease is in claiming.py.

Heartbeat is ONE statement for a whole batch of leases. A lease is renewed while the run is
RUNNING/WAITING_TOOL with the caller as worker and the same fencing token, also after
lease_until passed as long as the reaper has not taken it yet (seed 000 D2 renews on
`status = 'RUNNING' AND worker_id = me`; the reaper re-checks expiry under the row lock, so
a renewal and a reap never both win).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from services.common.runstate import LEASED, sql_list
from services.common.server_plans import keep_plan

# $1 run ids, $2 attempts (same order), $3 worker id, $4 lease seconds, $5 projects where the
# caller is a worker (NULL: all). Returns the positions (1-based) of the renewed leases; the
# others are lost. Rows are locked in run_id order (the `locked` CTE), as CompleteRuns locks
# them, so a worker's heartbeat and its batched completions on the same runs can never
# deadlock each other. The status test is wrapped in `IS TRUE` (status is NOT NULL: same
# meaning) so that it does not match the predicate of awooop_run_leased_idx: the planner, which
# believes that partial index nearly empty, otherwise scans all of it and compares every leased
# run with every lease of the call (leases held x batch) instead of one primary-key probe per
# lease (300 leases held: 2x the heartbeat's cost). The update sets no indexed column
# (migration 0040), so it is a HOT update.
HEARTBEAT_SQL = keep_plan(f"""
WITH t AS (
    SELECT * FROM unnest($1::uuid[], $2::int[]) WITH ORDINALITY AS t(run_id, attempt, ord)
),
locked AS (
    SELECT r.run_id
      FROM awooop_run_state r JOIN t ON r.run_id = t.run_id AND r.attempt_count = t.attempt
     WHERE r.worker_id = $3
       AND (r.status IN ({sql_list(LEASED)})) IS TRUE
       AND ($5::text[] IS NULL OR r.project_id = ANY($5::text[]))
     ORDER BY r.run_id
       FOR UPDATE OF r
)
UPDATE awooop_run_state r
   SET lease_until = now() + make_interval(secs => $4), heartbeat_at = now()
  FROM locked, t
 WHERE r.run_id = locked.run_id AND t.run_id = r.run_id AND r.attempt_count = t.attempt
RETURNING t.ord, r.lease_until, r.cancel_requested
""")


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
    rows = await pool.fetch(
        HEARTBEAT_SQL, [r for r, _ in leases], [a for _, a in leases], worker_id, lease_ttl, projects
    )
    # a run listed twice is updated once: answer every position that names it
    renewed = {(str(leases[r["ord"] - 1][0]), leases[r["ord"] - 1][1]): r for r in rows}
    out = []
    for lease in leases:
        row = renewed.get((str(lease[0]), lease[1]))
        out.append(Renewal(None, False) if row is None else Renewal(row["lease_until"], bool(row["cancel_requested"])))
    return out
