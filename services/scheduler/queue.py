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
from services.scheduler import builds, metrics, queue_sql

BUILD_STATES = ("queued", "held", "leased", "parked")  # the state label of awooop_scheduler_build_runs


class QueueSampler:
    def __init__(self, pool: asyncpg.Pool, build_live_seconds: float = 120.0) -> None:
        self.pool = pool
        self.build_live_seconds = build_live_seconds
        self.seen: set[str] = set()  # project labels exported so far: kept, at 0 when emptied
        self.builds_exported: set[tuple[str, str]] = set()  # (project, build) labels of the build gauges
        self.seen_waits: set[tuple[str, str]] = set()  # (project, kind) labels of the wait gauges

    async def sample(self) -> None:
        rows = await queue_sql.sample_queue(self.pool)
        runs: dict[tuple[str, str], int] = defaultdict(int)
        claimable: dict[str, int] = defaultdict(int)
        held: dict[str, int] = defaultdict(int)
        debouncing: dict[str, int] = defaultdict(int)
        labels: dict[str, int] = defaultdict(int)
        oldest: dict[str, float] = defaultdict(float)
        for r in rows:
            label = metrics.PROJECTS(r["project_id"])
            self.seen.add(label)
            runs[label, r["status"]] += r["n"]
            claimable[label] += r["claimable"]
            held[label] += r["held"]
            debouncing[label] += r["debouncing"]
            labels[label] += r["waiting_for_labels"]
            oldest[label] = max(oldest[label], max(0.0, r["oldest"]))
        for label in self.seen:
            for status in metrics.UNFINISHED:
                metrics.RUNS.labels(label, status).set(runs.get((label, status), 0))
            metrics.CLAIMABLE.labels(label).set(claimable.get(label, 0))
            metrics.HELD.labels(label).set(held.get(label, 0))
            metrics.DEBOUNCING.labels(label).set(debouncing.get(label, 0))
            metrics.RUNS_WAITING_FOR_LABELS.labels(label).set(labels.get(label, 0))
            metrics.OLDEST_CLAIMABLE.labels(label).set(oldest.get(label, 0.0))
        await self.sample_waits()
        await self.sample_builds()
        metrics.SAMPLE_AGE.set(time.time())

    async def sample_builds(self) -> None:
        """Per build: its unfinished runs by state and whether it is live, for the builds that are
        live or have runs (the others' series are removed: a project may keep many old builds);
        per project: the queued runs waiting for a build that is not live."""
        rows = await builds.project_builds(self.pool, None, self.build_live_seconds)
        waiting: dict[str, int] = defaultdict(int)
        exported: set[tuple[str, str]] = set()
        for r in rows:
            label = metrics.PROJECTS(r["project_id"])
            self.seen.add(label)
            waiting[label] += r["waiting_for_build"]
            counts = {"queued": r["queued"], "held": r["held"], "leased": r["leased"], "parked": r["parked"]}
            if not r["live"] and not any(counts.values()):
                continue
            exported.add((label, r["build_id"]))
            metrics.BUILD_LIVE.labels(label, r["build_id"]).set(1 if r["live"] else 0)
            for state, n in counts.items():
                metrics.BUILD_RUNS.labels(label, r["build_id"], state).set(n)
        for label, build in self.builds_exported - exported:
            metrics.BUILD_LIVE.remove(label, build)
            for state in BUILD_STATES:
                metrics.BUILD_RUNS.remove(label, build, state)
        self.builds_exported = exported
        for label in self.seen:
            metrics.RUNS_WAITING_FOR_BUILD.labels(label).set(waiting.get(label, 0))

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
