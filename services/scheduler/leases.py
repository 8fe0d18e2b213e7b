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

import functools
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from services.scheduler.fragments import RUN_COLUMNS_R

# claimable: queued, past any retry backoff, attempts left (the claim and the queue gauges)
CLAIMABLE = """status IN ('PENDING', 'RESUMED')
       AND (not_before IS NULL OR not_before <= now())
       AND attempt_count - released_count < max_attempts"""
# when a claimable run became claimable: its last state change (queued, re-queued, resumed) or
# the end of its retry backoff (GREATEST ignores a NULL not_before)
READY_SINCE = "GREATEST(updated_at, not_before)"


def claim_ctes(
    projects: str, max_runs: int, lease_secs: str, worker_id: str, actor: str, *, single: bool, after: str = ""
) -> str:
    """CTEs `picked`, `claimed` (the claimed rows, RUN_COLUMNS and from_status) and
    `claim_aud` (their CLAIMED audit rows), with the given SQL for each parameter.

    An ordered scan of awooop_run_claim_idx per project that stops after max_runs unlocked
    rows (equality on project_id keeps the index order, so the cost does not grow with the
    backlog; `project_id = ANY(...)` would sort every pending run of the projects on each
    claim). single: projects is one project (text), the scan's rows are the claim; else
    projects is text[], one lateral scan per project, then the oldest max_runs of those (rows
    locked by the lateral scans but not kept are released when the statement's transaction
    ends).

    max_runs is written into the text, not passed as a parameter: with it and a single
    project, the plan Postgres builds without the parameters' values is the one it builds with
    them, so it keeps that generic plan and stops planning the statement on every call (with a
    `LIMIT $n` it cannot estimate the claim's size, prefers a plan per call, and the planning
    costs about as much as executing it).

    after: a condition without columns, evaluated once before the scans start (a one-time
    filter); a statement that locks other rows first names them here, so the claim never
    holds a picked row while it waits for a lock."""
    n = int(max_runs)
    gate = f"\n       AND {after}" if after else ""
    ready = f"{CLAIMABLE}{gate}"
    if single:
        picked = f"""picked AS (
    SELECT run_id, status AS from_status, {READY_SINCE} AS ready_since
      FROM awooop_run_state
     WHERE project_id = {projects}::text
       AND {ready}
     ORDER BY created_at
     LIMIT {n}
       FOR UPDATE SKIP LOCKED
)"""
    else:
        picked = f"""picked AS (
    SELECT c.run_id, c.from_status, c.ready_since
      FROM unnest({projects}::text[]) AS p(project_id)
     CROSS JOIN LATERAL (
            SELECT run_id, status AS from_status, created_at, {READY_SINCE} AS ready_since
              FROM awooop_run_state
             WHERE project_id = p.project_id
               AND {ready}
             ORDER BY created_at
             LIMIT {n}
               FOR UPDATE SKIP LOCKED
           ) c
     ORDER BY c.created_at
     LIMIT {n}
)"""
    return f"""{picked},
claimed AS (
    UPDATE awooop_run_state r
       SET status = 'RUNNING',
           lease_until = now() + make_interval(secs => {lease_secs}),
           heartbeat_at = now(),
           attempt_count = r.attempt_count + 1,
           worker_id = {worker_id},
           not_before = NULL,
           updated_at = now()
      FROM picked p
     WHERE r.run_id = p.run_id
 RETURNING {RUN_COLUMNS_R}, p.from_status,
           EXTRACT(EPOCH FROM clock_timestamp() - p.ready_since)::float8 AS claim_wait
),
claim_aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, details)
    SELECT project_id, run_id, {actor}, 'CLAIMED', from_status, 'RUNNING',
           jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id, 'lease_until', lease_until)
      FROM claimed
)"""


@functools.lru_cache(maxsize=512)
def claim_sql(single: bool, max_runs: int) -> str:
    """$1 project (single) or projects, $2 lease seconds, $3 worker id, $4 actor."""
    return f"""
WITH {claim_ctes("$1", max_runs, "$2", "$3", "$4", single=single)}
SELECT * FROM claimed ORDER BY created_at
"""


def projects_arg(projects: list[str]) -> tuple[bool, str | list[str]]:
    """(single, the value of the projects parameter) for claim_ctes."""
    return (True, projects[0]) if len(projects) == 1 else (False, projects)


# When nothing is claimable: seconds until the earliest retry backoff of these projects ends
# (a long-polling claim re-checks then). Only run on the empty path.
NEXT_READY_SQL = """
SELECT EXTRACT(EPOCH FROM min(not_before) - now())::float8
  FROM awooop_run_state
 WHERE status IN ('PENDING', 'RESUMED') AND project_id = ANY($1::text[]) AND not_before > now()
"""

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
HEARTBEAT_SQL = """
WITH t AS (
    SELECT * FROM unnest($1::uuid[], $2::int[]) WITH ORDINALITY AS t(run_id, attempt, ord)
),
locked AS (
    SELECT r.run_id
      FROM awooop_run_state r JOIN t ON r.run_id = t.run_id AND r.attempt_count = t.attempt
     WHERE r.worker_id = $3
       AND (r.status IN ('RUNNING', 'WAITING_TOOL')) IS TRUE
       AND ($5::text[] IS NULL OR r.project_id = ANY($5::text[]))
     ORDER BY r.run_id
       FOR UPDATE OF r
)
UPDATE awooop_run_state r
   SET lease_until = now() + make_interval(secs => $4), heartbeat_at = now()
  FROM locked, t
 WHERE r.run_id = locked.run_id AND t.run_id = r.run_id AND r.attempt_count = t.attempt
RETURNING t.ord, r.lease_until, r.cancel_requested
"""


async def claim(
    pool: asyncpg.Pool, projects: list[str], max_runs: int, lease_ttl: float, worker_id: str, actor: str
) -> list[asyncpg.Record]:
    single, arg = projects_arg(projects)
    return await pool.fetch(claim_sql(single, max_runs), arg, lease_ttl, worker_id, actor)


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
    # a run listed twice is updated once: answer every position that names it
    renewed = {(str(leases[r["ord"] - 1][0]), leases[r["ord"] - 1][1]): r for r in rows}
    out = []
    for lease in leases:
        row = renewed.get((str(lease[0]), lease[1]))
        out.append(Renewal(None, False) if row is None else Renewal(row["lease_until"], bool(row["cancel_requested"])))
    return out
