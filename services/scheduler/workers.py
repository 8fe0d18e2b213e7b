"""Workers and their labels (docs/flow-control.md, "Worker labels"): the registry of the workers
each project's claims came from (written as their claims arrive), the routing parameters a claim
carries (Routing: the worker's build and labels, and the bounds of its preferences), the label
sweep that parks the runs no live worker can take, and ListWorkers. The routing itself is the
claim's (claims.sql ClaimRuns, "Labels"); the statements here are workers.sql's."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import labels as labels_rule
from services.common import loops
from services.common.runtime import AppContext
from services.common.settings import Settings
from services.scheduler import metrics, workers_sql

log = logging.getLogger("awooop.scheduler.workers")

SWEEP_LOOP = "scheduler.label_sweep"
# a project keeps at most this many workers (WorkerSeen): past it a new one is not registered
MAX_WORKERS = 10_000
# how often one scheduler marks a (project, worker) seen again, at most (and at most a quarter of
# AWOOOP_WORKER_LIVE_SECONDS, the window liveness is judged by)
SEEN_EVERY = 10.0
# a registration unseen this long is dropped by the sweep (it names a worker long gone)
FORGET_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Routing:
    """What a claim routes by besides its projects (claims.sql "Versions" and "Labels"): the
    claiming worker's build ('' none) and labels (a JSON object, '{}' none: never NULL, which a
    custom plan would fold into the conditions), and the bounds of a run's preferences."""

    build_id: str = ""
    labels_json: str = "{}"
    prefer_secs: float = 10.0
    live_secs: float = 60.0

    def params(self) -> dict[str, Any]:
        """The claim statement's routing parameters."""
        return {
            "build_id": self.build_id,
            "labels": self.labels_json,
            "prefer_secs": self.prefer_secs,
            "live_secs": self.live_secs,
        }


NO_ROUTING = Routing()


def routing(settings: Settings, build_id: str | None, worker_labels: Mapping[str, str]) -> Routing:
    """A claim's routing: the worker's build and labels, the bounds from the settings."""
    return Routing(
        build_id or "",
        labels_rule.to_json(worker_labels) or "{}",
        settings.prefer_wait_seconds,
        settings.worker_live_seconds,
    )


class WorkerRegistry:
    """Marks the workers of arriving claims seen, at most every `every` seconds per project and
    worker in this process, and at once when a worker's labels or build change (then the runs
    parked for labels it has are woken in the same statement, which notifies their projects: a
    waiting claim wakes and takes them). The writes run beside the claims and heartbeats that
    cause them, never before them: a store slow to commit (a synchronous standby lagging) must
    not hold a claim back for a registry that only informs preferences and the label sweep. A
    write that fails is logged; the next sighting writes again."""

    def __init__(self, pool: asyncpg.Pool, live_seconds: float, max_kept: int = 10_000) -> None:
        self.pool = pool
        self.every = min(SEEN_EVERY, live_seconds / 4)
        self.max_kept = max_kept
        self._seen: dict[tuple[str, str], tuple[float, tuple[str, str] | None]] = {}
        self._beats: dict[str, float] = {}
        self._writes: set[asyncio.Task[Any]] = set()  # in flight (kept referenced until done)

    def _write(self, statement: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(statement)
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[Any]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("worker registry: a write failed (the next sighting writes again)", exc_info=task.exception())

    def seen(self, projects: Sequence[str], worker_id: str, routing: Routing) -> None:
        now = time.monotonic()
        declared = (routing.labels_json, routing.build_id)
        due, changed = [], False
        for p in projects:
            at, known = self._seen.get((p, worker_id), (-self.every, None))
            if known != declared:
                changed = True
            if known != declared or now - at >= self.every:
                due.append(p)
        if not due:
            return
        self._write(
            workers_sql.worker_seen(
                self.pool,
                projects=due,
                worker_id=worker_id,
                labels=routing.labels_json,
                build_id=routing.build_id,
                wake=changed,
                max_workers=MAX_WORKERS,
            )
        )
        if len(self._seen) > self.max_kept:  # bounded: forgetting only costs one more write
            self._seen.clear()
        for p in due:
            self._seen[p, worker_id] = (now, declared)

    def beat(self, worker_id: str) -> None:
        """A heartbeat of worker_id renewed a lease: it is marked seen (in every project it is
        registered in), at most every `every` seconds in this process."""
        now = time.monotonic()
        if now - self._beats.get(worker_id, -self.every) < self.every:
            return
        if len(self._beats) > self.max_kept:
            self._beats.clear()
        self._beats[worker_id] = now
        self._write(workers_sql.worker_beat(self.pool, worker_id=worker_id))


async def sweep(pool: asyncpg.Pool, live_secs: float) -> None:
    """Parks the queued runs that require labels no live worker has, wakes those one can take
    again. One statement for every project; when it fails for one project's data, each project
    on its own (that one is logged and counted, the others are swept)."""
    try:
        _count(await workers_sql.sweep_labels(pool, project_id=None, live_secs=live_secs, forget_secs=FORGET_SECONDS))
        return
    except Exception as exc:
        if not loops.poisoned(exc):
            raise
    for row in await workers_sql.labeled_projects(pool):
        try:
            _count(
                await workers_sql.sweep_labels(
                    pool, project_id=row["project_id"], live_secs=live_secs, forget_secs=FORGET_SECONDS
                )
            )
        except Exception as exc:
            loops.row_failed(SWEEP_LOOP, f"project {row['project_id']}", exc)


def sweep_loop(ctx: AppContext) -> Callable[[], Coroutine[Any, Any, None]]:
    """The service's background loop of the label sweep: every AWOOOP_LABEL_SWEEP_INTERVAL (0:
    off) until shutdown."""
    s = ctx.settings

    async def label_sweep_loop() -> None:
        if s.label_sweep_interval > 0:
            await loops.periodic(
                SWEEP_LOOP, s.label_sweep_interval, lambda: sweep(ctx.pool, s.worker_live_seconds), ctx.stopping
            )

    return label_sweep_loop


def _count(row: workers_sql.SweepLabelsRow | None) -> None:
    assert row is not None  # (one row always)
    if row["parked"]:
        metrics.LABEL_SWEEP.labels("parked").inc(row["parked"])
        log.info("label sweep: %d runs parked, no live worker has their labels", row["parked"])
    if row["woken"]:
        metrics.LABEL_SWEEP.labels("woken").inc(row["woken"])


async def project_workers(
    pool: asyncpg.Pool, project_id: str | None, live_secs: float
) -> list[workers_sql.ProjectWorkersRow]:
    """The workers of a project (None: of every project) with their labels and liveness."""
    return await workers_sql.project_workers(pool, project_id=project_id, live_secs=live_secs)
