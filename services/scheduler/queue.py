"""The queue gauges: unfinished runs by project and status, claimable runs, held runs, and the age
of the oldest claimable run per project, counted by one statement (SampleQueue, queue.sql) every
AWOOOP_QUEUE_METRICS_INTERVAL seconds (a periodic count, not work on the claim path). It reads
only unfinished runs (metrics.UNFINISHED). The durable waits' gauges (open waits by project and
kind, the age of the oldest) are sampled with them (SampleWaits: open waits only). Every replica
samples; alert on max by (project)."""

from __future__ import annotations

import time
from collections import defaultdict

import asyncpg

from services.common.runstate import WaitKind
from services.scheduler import metrics, queue_sql


class QueueSampler:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.seen: set[str] = set()  # project labels exported so far: kept, at 0 when emptied
        self.seen_waits: set[tuple[str, str]] = set()  # (project, kind) labels of the wait gauges

    async def sample(self) -> None:
        rows = await queue_sql.sample_queue(self.pool)
        runs: dict[tuple[str, str], int] = defaultdict(int)
        claimable: dict[str, int] = defaultdict(int)
        held: dict[str, int] = defaultdict(int)
        oldest: dict[str, float] = defaultdict(float)
        for r in rows:
            label = metrics.PROJECTS(r["project_id"])
            self.seen.add(label)
            runs[label, r["status"]] += r["n"]
            claimable[label] += r["claimable"]
            held[label] += r["held"]
            oldest[label] = max(oldest[label], max(0.0, r["oldest"]))
        for label in self.seen:
            for status in metrics.UNFINISHED:
                metrics.RUNS.labels(label, status).set(runs.get((label, status), 0))
            metrics.CLAIMABLE.labels(label).set(claimable.get(label, 0))
            metrics.HELD.labels(label).set(held.get(label, 0))
            metrics.OLDEST_CLAIMABLE.labels(label).set(oldest.get(label, 0.0))
        await self.sample_waits()
        metrics.SAMPLE_AGE.set(time.time())

    async def sample_waits(self) -> None:
        rows = await queue_sql.sample_waits(self.pool)
        open_: dict[tuple[str, str], int] = defaultdict(int)
        oldest: dict[str, float] = defaultdict(float)
        overdue: dict[str, float] = defaultdict(float)
        for r in rows:
            label = metrics.PROJECTS(r["project_id"])
            overdue[label] = max(overdue[label], max(0.0, r["overdue"]))
            for kind in {*WaitKind, r["kind"]}:  # every declared kind at 0, and any other the store has
                self.seen_waits.add((label, kind))
            open_[label, r["kind"]] += r["n"]
            oldest[label] = max(oldest[label], max(0.0, r["oldest"]))
        for label, kind in self.seen_waits:
            metrics.WAITS_OPEN.labels(label, kind).set(open_.get((label, kind), 0))
        for label in {label for label, _ in self.seen_waits}:
            metrics.OLDEST_WAIT.labels(label).set(oldest.get(label, 0.0))
            metrics.WAIT_OVERDUE.labels(label).set(overdue.get(label, 0.0))
