"""The stale-lease reaper (seed 000 D3): RUNNING / WAITING_TOOL runs whose lease expired go
back to PENDING (after their retry policy's backoff) while attempts are left, else FAILED "Max
retry attempts exceeded"; a run with a pending cancel becomes CANCELLED instead. One statement per
batch, reaper.sql ReapExpiredLeases (read it: the locking, the plan's choices, the audit rows,
compensation requests and wake-up NOTIFY are there). This module runs it in batches and counts
and nudges what it reaped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from services.common import loops
from services.common.db import again_on_deadlock
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import RunStatus
from services.scheduler import metrics, reaper_sql
from services.scheduler.saga_client import SagaNudger

LOOP = "scheduler.reaper"
REAPER_ACTOR = "system:reaper"
REAP_BATCH = 1000

_OUTCOME = {RunStatus.PENDING: "requeued", RunStatus.FAILED: "failed", RunStatus.CANCELLED: "cancelled"}


@dataclass(frozen=True)
class ReapResult:
    requeued: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.requeued + self.failed + self.cancelled


async def reap(
    pool: asyncpg.Pool, saga: SagaNudger, batch: int = REAP_BATCH, *, policy_defaults: str = "{}"
) -> ReapResult:
    """One reaper pass: takes back every expired lease, a batch per statement. policy_defaults:
    the service's retry policy as JSON (retry_policy.defaults). A batch that fails for one run's
    data is reaped again one run at a time, so that run is skipped (and noted on its history)
    and every other project's leases are still taken back."""
    counts = {"requeued": 0, "failed": 0, "cancelled": 0}

    async def statement(only: uuid.UUID | None, size: int) -> list[reaper_sql.ReapExpiredLeasesRow]:
        # the batch's runs give their keys' slots back in row order: a deadlock aborts it whole
        return await again_on_deadlock(
            lambda: reaper_sql.reap_expired_leases(
                pool, batch=size, actor=REAPER_ACTOR, channel=RUN_READY_CHANNEL, policy=policy_defaults, only_run=only
            )
        )

    async def due(size: int) -> list[uuid.UUID]:
        return [r["run_id"] for r in await reaper_sql.expired_leases(pool, batch=size)]

    await loops.in_batches(LOOP, REAPER_ACTOR, pool, batch, statement, due, lambda rows: _settle(rows, counts, saga))
    return ReapResult(**counts)


def _settle(rows: list[reaper_sql.ReapExpiredLeasesRow], counts: dict[str, int], saga: SagaNudger) -> None:
    """Counts the reaped runs and nudges the saga service for those to compensate."""
    for r in rows:
        outcome = _OUTCOME[RunStatus(r["status"])]
        counts[outcome] += 1
        metrics.REAPED.labels(outcome).inc()
        if r["trigger"]:
            metrics.COMPENSATIONS.labels(r["trigger"]).inc()
            saga.nudge(str(r["run_id"]), r["trigger"], r["failure_reason"] or "")
