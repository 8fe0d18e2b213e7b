"""Wires the scheduler service into the runtime: the servicer, the LISTEN connection for
claim wake-ups, and its background loops (the stale-lease reaper, the approval expiry sweep,
the durable waits' timeout sweep, the queue gauges' sampler, the schedules' ticks and the
pruning of recorded claim answers), each safe to run in several replicas at once."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import retry_policy
from services.common.loops import periodic
from services.common.runtime import AppContext, ServiceParts
from services.scheduler import approvals, claim_answers, metrics, reaper, schedules, waits, workers
from services.scheduler.queue import QueueSampler
from services.scheduler.saga_client import SagaNudger
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.wakeup import RunReadyListener

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    s = ctx.settings
    listener = RunReadyListener(s.direct_url, ctx.stopping, connect_timeout=s.db_connect_timeout)
    saga = SagaNudger(s)
    metrics.PROJECTS.limit = s.metrics_max_projects
    return ServiceParts(
        servicers=[(scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, SchedulerServicer(ctx, listener, saga))],
        service_names=[SERVICE_NAME],
        background=_background(ctx, listener, saga),
        on_stop=[listener.close, saga.close],
    )


def _background(
    ctx: AppContext, listener: RunReadyListener, saga: SagaNudger
) -> list[Callable[[], Coroutine[Any, Any, None]]]:
    """The LISTEN connection and the background loops, each run until shutdown."""
    s = ctx.settings
    sampler = QueueSampler(ctx.pool, ctx.settings.build_live_seconds)

    policy = json.dumps(retry_policy.defaults(s))

    async def reap_loop() -> None:
        await periodic(
            reaper.LOOP,
            s.reaper_interval,
            lambda: reaper.reap(ctx.pool, saga, policy_defaults=policy),
            ctx.stopping,
        )

    async def schedule_loop() -> None:
        await periodic(
            schedules.LOOP,
            s.schedule_interval,
            lambda: schedules.tick(ctx.pool, policy_defaults=policy),
            ctx.stopping,
        )

    async def approval_sweep_loop() -> None:
        await periodic(
            approvals.SWEEP_LOOP,
            s.approval_sweep_interval,
            lambda: approvals.expire_approvals(ctx.pool, saga),
            ctx.stopping,
        )

    async def wait_sweep_loop() -> None:
        await periodic(waits.SWEEP_LOOP, s.wait_sweep_interval, lambda: waits.sweep(ctx.pool), ctx.stopping)

    async def claim_answers_loop() -> None:
        await periodic(
            "scheduler.claim_answers",
            s.prune_interval,
            lambda: claim_answers.prune(ctx.pool, batch=s.prune_batch),
            ctx.stopping,
        )

    async def queue_metrics_loop() -> None:
        if s.queue_metrics_interval > 0:
            await periodic("scheduler.queue_metrics", s.queue_metrics_interval, sampler.sample, ctx.stopping)

    return [
        listener.run,
        reap_loop,
        approval_sweep_loop,
        queue_metrics_loop,
        schedule_loop,
        claim_answers_loop,
        wait_sweep_loop,
        workers.sweep_loop(ctx),
    ]
