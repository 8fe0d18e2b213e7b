"""The queue gauges: unfinished runs by project and status, claimable runs, and the age of the
oldest claimable run per project, counted by one statement (SampleQueue, queue.sql) every
AWOOOP_QUEUE_METRICS_INTERVAL seconds (a periodic count, not work on the claim path). It reads
only unfinished runs (metrics.UNFINISHED). Every replica samples; alert on max by (project)."""

from __future__ import annotations

import time
from collections import defaultdict

import asyncpg

from services.common import sql
from services.scheduler import metrics

SAMPLE = sql.load(__file__, "queue.sql")["SampleQueue"]


class QueueSampler:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.seen: set[str] = set()  # project labels exported so far: kept, at 0 when emptied

    async def sample(self) -> None:
        rows = await self.pool.fetch(SAMPLE.sql)
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
