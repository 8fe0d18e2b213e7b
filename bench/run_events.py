"""Run event streams' figures (issue 28, "Measured"), against a scheduler process on a scratch
database:

- Progress event emitted → received by a watcher, p50 and p99: one WatchRun stream open on a
  claimed run; `run_events_samples` EmitEvent calls one after another, each timed from before the
  call to the watcher's receipt of that event (one clock: the bench process's). The EmitEvent
  call's own round trip (p50) is the baseline: what is left is the NOTIFY → LISTEN → read → send.
- Store cost per event: rows written to awooop_run_event and its size growth (heap and indexes) per
  emitted event, over the same samples.

What the log cost runs nobody watches was measured here while it was a second copy of the audit
rows (a trigger's; docs/benchmarks.md). Since migration 0350 a run's state rows are its audit
history, written once: the store-cost group (bench/store_cost.py) measures what a run writes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import grpc

from bench import env, procs
from bench.config import Config
from bench.report import Figure
from bench.waits import SEED_PENDING_SQL

PROJECT = "bench"


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "run_event_latency_p50",
            "progress event emitted → received by a watcher, p50",
            "ms",
            "report",
            None,
            "reported",
            baseline_label="the EmitEvent call alone, p50",
        ),
        Figure(
            "run_event_latency_p99",
            "progress event emitted → received by a watcher, p99",
            "ms",
            "report",
            None,
            "reported",
            baseline_label="the EmitEvent call alone, p99",
        ),
        Figure(
            "run_event_store_bytes",
            "store cost per progress event (awooop_run_event heap + indexes)",
            "bytes",
            "report",
            None,
            "reported (rows per event in details)",
        ),
    ]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    p50_fig, p99_fig, bytes_fig = figures
    await _latency(stores, cfg, p50_fig, p99_fig, bytes_fig)


async def _latency(stores: env.Stores, cfg: Config, p50_fig: Figure, p99_fig: Figure, bytes_fig: Figure) -> None:
    from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
    from awooop.worker import from_struct, to_struct

    dsn = await stores.create_database("run_events")
    seed = await asyncpg.connect(dsn)
    await seed.execute(SEED_PENDING_SQL, PROJECT, 1)
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    svc = await procs.spawn("scheduler", procs.service_env(dsn, stores.redis_url, stores.redis_prefix))
    channel = grpc.aio.insecure_channel(svc.address)
    try:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        claimed = await stub.ClaimRuns(
            scheduler_pb2.ClaimRunsRequest(worker_id="bench", project_ids=[PROJECT], max_runs=1), metadata=md
        )
        lease = claimed.runs[0].lease
        received: dict[int, float] = {}
        arrived: dict[int, asyncio.Event] = {}
        watch = stub.WatchRun(scheduler_pb2.WatchRunRequest(run_id=lease.run_id), metadata=md)

        async def read() -> None:
            async for msg in watch:
                if msg.event.source == scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS:
                    i = int(from_struct(msg.event.data)["i"])
                    received[i] = time.perf_counter()
                    arrived.setdefault(i, asyncio.Event()).set()

        reader = asyncio.create_task(read())
        warm, n = 10, cfg.run_events_samples
        count_sql = "SELECT count(*), pg_total_relation_size('awooop_run_event') FROM awooop_run_event"
        latencies: list[float] = []
        rtts: list[float] = []
        before: Any = None
        for i in range(warm + n):
            if i == warm:
                before = await seed.fetchrow(count_sql)
            arrived.setdefault(i, asyncio.Event())
            t0 = time.perf_counter()
            await stub.EmitEvent(
                scheduler_pb2.EmitEventRequest(lease=lease, kind="tick", data=to_struct({"i": i, "text": "x" * 64})),
                metadata=md,
            )
            t1 = time.perf_counter()
            await asyncio.wait_for(arrived[i].wait(), 30)
            if i >= warm:
                latencies.append((received[i] - t0) * 1000)
                rtts.append((t1 - t0) * 1000)
        after = await seed.fetchrow(count_sql)
        reader.cancel()
        watch.cancel()
        rows = (after[0] - before[0]) / n
        size = (after[1] - before[1]) / n
        p50_fig.measured(_pct(latencies, 0.5), _pct(rtts, 0.5), samples=n)
        p99_fig.measured(_pct(latencies, 0.99), _pct(rtts, 0.99), samples=n)
        bytes_fig.measured(size, None, rows_per_event=rows, samples=n, data_bytes=len('{"i": 0, "text": ""}') + 64)
    finally:
        await channel.close()
        svc.stop()
        await seed.close()
        await stores.drop_database(dsn)
