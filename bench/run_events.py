"""Run event streams' figures (issue 28, "Measured"), against a scheduler process on a scratch
database:

- Progress event emitted → received by a watcher, p50 and p99: one WatchRun stream open on a
  claimed run; `run_events_samples` EmitEvent calls one after another, each timed from before the
  call to the watcher's receipt of that event (one clock: the bench process's). The EmitEvent
  call's own round trip (p50) is the baseline: what is left is the NOTIFY → LISTEN → read → send.
- Store cost per event: rows written to awooop_run_event and its size growth (heap and indexes) per
  emitted event, over the same samples.
- What the log costs runs nobody watches: the claim statement (`claiming.claim_once`, a batch of
  `claim_batch`, whose CLAIMED audit rows now also write log rows) against the same with the
  audit trigger disabled, two databases measured alternately as bench/waits.py does; medians of
  `waits_repeats` executions.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import asyncpg
import grpc

from bench import env, procs
from bench.config import Config
from bench.report import Figure
from bench.waits import PUT_BACK_SQL, SEED_PENDING_SQL

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
        Figure(
            "run_event_claim_cost",
            f"claim statement cost ({cfg.claim_batch} runs) with the run log's audit trigger",
            "ms",
            "report",
            None,
            "reported (ratio)",
            baseline_label="the same with the trigger disabled",
        ),
    ]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    p50_fig, p99_fig, bytes_fig, claim_fig = figures
    await _latency(stores, cfg, p50_fig, p99_fig, bytes_fig)
    await _claim_cost(stores, cfg, claim_fig)


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


async def _claim_cost(stores: env.Stores, cfg: Config, fig: Figure) -> None:
    from services.common.db import create_pool
    from services.common.settings import Settings
    from services.scheduler import claiming

    settings = Settings()
    dsns = [await stores.create_database("events_notrig"), await stores.create_database("events_trig")]
    pools = [await create_pool(settings.with_(database_url=d, db_pool_max=4)) for d in dsns]
    seeds = [await asyncpg.connect(d) for d in dsns]
    try:
        await seeds[0].execute("ALTER TABLE awooop_audit_log DISABLE TRIGGER awooop_audit_run_events")
        for seed in seeds:
            await seed.execute(SEED_PENDING_SQL, PROJECT, cfg.waits_claimable)
            await seed.execute("VACUUM ANALYZE awooop_run_state")

        async def claim(i: int) -> float:
            await seeds[i].execute(PUT_BACK_SQL, PROJECT)
            t0 = time.perf_counter()
            got = await claiming.claim_once(pools[i], [PROJECT], cfg.claim_batch, 300.0, "bench-e", "bench", None)
            ms = (time.perf_counter() - t0) * 1000
            if len(got.rows) != cfg.claim_batch:
                raise RuntimeError(f"claimed {len(got.rows)} runs, expected {cfg.claim_batch}")
            return ms

        for i in (0, 1):
            await claim(i)
        times: list[list[float]] = [[], []]
        for r in range(cfg.waits_repeats):
            for i in (0, 1) if r % 2 else (1, 0):  # neither database always goes first
                times[i].append(await claim(i))
        without, with_log = (statistics.median(t) for t in times)
        fig.measured(with_log, without, batch=cfg.claim_batch, claimable=cfg.waits_claimable)
    finally:
        for seed in seeds:
            await seed.close()
        for pool in pools:
            await pool.close()
        for d in dsns:
            await stores.drop_database(d)
