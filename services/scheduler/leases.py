"""Claiming runs and renewing leases (seed 000 D2, ARCHITECTURE.md section 5).

Claim is ONE statement: pick the oldest claimable runs of the caller's projects with
FOR UPDATE SKIP LOCKED (concurrent claimers take disjoint rows and never wait on each
other), make them RUNNING with a lease and the next fencing token (attempt_count + 1), and
write the CLAIMED audit rows in the same statement. The pick uses awooop_run_claim_idx
(partial: PENDING/RESUMED only, by project and age).

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

from services.scheduler.fragments import RUN_COLUMNS_R

# $1 projects, $2 max runs, $3 lease seconds, $4 worker id, $5 actor.
CLAIM_SQL = f"""
WITH picked AS (
    SELECT run_id, status AS from_status
      FROM awooop_run_state
     WHERE status IN ('PENDING', 'RESUMED')
       AND project_id = ANY($1::text[])
       AND (not_before IS NULL OR not_before <= now())
       AND attempt_count - released_count < max_attempts
     ORDER BY created_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE awooop_run_state r
       SET status = 'RUNNING',
           lease_until = now() + make_interval(secs => $3),
           heartbeat_at = now(),
           attempt_count = r.attempt_count + 1,
           worker_id = $4,
           not_before = NULL,
           updated_at = now()
      FROM picked p
     WHERE r.run_id = p.run_id
 RETURNING {RUN_COLUMNS_R}, p.from_status
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, details)
    SELECT project_id, run_id, $5, 'CLAIMED', from_status, 'RUNNING',
           jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id, 'lease_until', lease_until)
      FROM claimed
)
SELECT * FROM claimed ORDER BY created_at
"""

# When nothing is claimable: seconds until the earliest retry backoff of these projects ends
# (a long-polling claim re-checks then). Only run on the empty path.
NEXT_READY_SQL = """
SELECT EXTRACT(EPOCH FROM min(not_before) - now())::float8
  FROM awooop_run_state
 WHERE status IN ('PENDING', 'RESUMED') AND project_id = ANY($1::text[]) AND not_before > now()
"""

# $1 run ids, $2 attempts (same order), $3 worker id, $4 lease seconds, $5 projects where the
# caller is a worker (NULL: all). One row per requested lease, in request order.
HEARTBEAT_SQL = """
WITH req AS (
    SELECT t.run_id, t.attempt, t.ord
      FROM unnest($1::uuid[], $2::int[]) WITH ORDINALITY AS t(run_id, attempt, ord)
),
renewed AS (
    UPDATE awooop_run_state r
       SET lease_until = now() + make_interval(secs => $4), heartbeat_at = now()
      FROM req
     WHERE r.run_id = req.run_id
       AND r.attempt_count = req.attempt
       AND r.worker_id = $3
       AND r.status IN ('RUNNING', 'WAITING_TOOL')
       AND ($5::text[] IS NULL OR r.project_id = ANY($5::text[]))
 RETURNING r.run_id, r.attempt_count, r.lease_until, r.cancel_requested
)
SELECT req.ord, n.lease_until, n.cancel_requested
  FROM req LEFT JOIN renewed n ON n.run_id = req.run_id AND n.attempt_count = req.attempt
 ORDER BY req.ord
"""


async def claim(
    pool: asyncpg.Pool, projects: list[str], max_runs: int, lease_ttl: float, worker_id: str, actor: str
) -> list[asyncpg.Record]:
    return await pool.fetch(CLAIM_SQL, projects, max_runs, lease_ttl, worker_id, actor)


async def seconds_until_ready(pool: asyncpg.Pool, projects: list[str]) -> float | None:
    """Seconds until the earliest backoff of these projects ends; None when none is pending."""
    value = await pool.fetchval(NEXT_READY_SQL, projects)
    return None if value is None else max(0.0, float(value))


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
    return [Renewal(r["lease_until"], bool(r["cancel_requested"])) for r in rows]
