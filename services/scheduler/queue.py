"""The queue gauges: unfinished runs by project and status, claimable runs, and the age of the
oldest claimable run per project, counted by one statement every AWOOOP_QUEUE_METRICS_INTERVAL
seconds (a periodic count, not work on the claim path).

The statement reads only unfinished runs: its status filter is the union of the predicates of
the partial indexes awooop_run_claim_idx (PENDING, RESUMED), awooop_run_leased_idx (RUNNING,
WAITING_TOOL) and awooop_run_approval_idx (WAITING_APPROVAL), so its cost follows the backlog,
not the history of finished runs. Every replica samples; alert on max by (project)."""

from __future__ import annotations

import time
from collections import defaultdict

import asyncpg

from services.scheduler import metrics
from services.scheduler.claiming import CLAIMABLE_NOW, READY_SINCE, not_paused

SAMPLE_SQL = f"""
SELECT project_id, status, count(*) AS n,
       count(*) FILTER (WHERE claimable) AS claimable,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(ready_since) FILTER (WHERE claimable)), 0)::float8
           AS oldest
  FROM (SELECT project_id, status, ({CLAIMABLE_NOW} AND {not_paused("r.project_id")}) AS claimable,
               {READY_SINCE} AS ready_since
          FROM awooop_run_state r
         WHERE status IN ({", ".join(f"'{s}'" for s in metrics.UNFINISHED)})) unfinished
 GROUP BY project_id, status
"""


class QueueSampler:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.seen: set[str] = set()  # project labels exported so far: kept, at 0 when emptied

    async def sample(self) -> None:
        rows = await self.pool.fetch(SAMPLE_SQL)
        runs: dict[tuple[str, str], int] = defaultdict(int)
        claimable: dict[str, int] = defaultdict(int)
        oldest: dict[str, float] = defaultdict(float)
        for r in rows:
            label = metrics.PROJECTS(r["project_id"])
            self.seen.add(label)
            runs[label, r["status"]] += r["n"]
            claimable[label] += r["claimable"]
            oldest[label] = max(oldest[label], max(0.0, r["oldest"]))
        for label in self.seen:
            for status in metrics.UNFINISHED:
                metrics.RUNS.labels(label, status).set(runs.get((label, status), 0))
            metrics.CLAIMABLE.labels(label).set(claimable.get(label, 0))
            metrics.OLDEST_CLAIMABLE.labels(label).set(oldest.get(label, 0.0))
        metrics.SAMPLE_AGE.set(time.time())
