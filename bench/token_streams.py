"""Token streams' figures (issue 46), against a scheduler process on a scratch database and the
bench's Redis:

- `token_streams_runs` runs (claimed by hand), each publishing `token_streams_rate` tokens per
  second as the SDK does (a PublishTokens batch every 20 ms, a checkpoint batch every
  AWOOOP_STREAM_CHECKPOINT_TOKENS tokens), each followed by one WatchRun with tokens, for
  `token_streams_seconds` after a 1 s warm-up;
- delivered: tokens the watchers received per second, all runs together (the target: runs × rate);
- latency: a batch's first token produced (the publisher's wall clock, sent as produced_at) →
  received by its watcher (the same clock: one process), p50 and p99 over the batches; it
  includes the up to 20 ms a token waits for its batch;
- store growth: bytes awooop_run_event grew by (heap and indexes; only checkpoint rows are
  written) per run and per 1,000 tokens, and the rows per run.

Publishers and watchers share one asyncio process: on a small machine its CPU is part of what is
measured (docs/benchmarks.md says so beside the figures).
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
TICK = 0.02  # the SDK's batch interval
CHECKPOINT_TOKENS = 500
WARMUP = 1.0


def declare(cfg: Config) -> list[Figure]:
    target = f"{cfg.token_streams_runs} runs × {cfg.token_streams_rate} tokens/s"
    return [
        Figure("token_stream_delivered", "tokens delivered to watchers, all runs", "tokens/s", "report", None, target),
        Figure(
            "token_stream_latency_p50",
            "token produced → received by its watcher, p50",
            "ms",
            "report",
            None,
            "reported",
        ),
        Figure(
            "token_stream_latency_p99",
            "token produced → received by its watcher, p99",
            "ms",
            "report",
            None,
            "reported",
        ),
        Figure(
            "token_stream_store_bytes",
            "store growth per 1,000 tokens (awooop_run_event: checkpoint rows only)",
            "bytes",
            "report",
            None,
            "reported (rows and bytes per run in details)",
        ),
    ]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Tally:
    def __init__(self) -> None:
        self.measuring = False
        self.tokens = 0
        self.latencies: list[float] = []
        self.published = 0


async def _publish(stub: Any, md: Any, lease: Any, rate: int, stop: asyncio.Event, tally: Tally) -> None:
    """One run's publisher: every TICK the tokens produced since the last, as the SDK batches them."""
    from awooop.scheduler.v1 import scheduler_pb2

    per_tick = max(1, int(rate * TICK))
    seq, since = 0, []  # the last seq, the tokens since the last checkpoint
    next_tick = time.monotonic()
    while not stop.is_set():
        produced = time.time()
        batch = [f"tok{seq + k + 1} " for k in range(per_tick)]
        since.extend(batch)
        checkpoint = len(since) >= CHECKPOINT_TOKENS
        first = seq - (len(since) - per_tick) + 1 if checkpoint else seq + 1
        request = scheduler_pb2.PublishTokensRequest(
            lease=lease, first_seq=first, tokens=since if checkpoint else batch, checkpoint=checkpoint
        )
        request.produced_at.FromNanoseconds(int(produced * 1e9))
        await stub.PublishTokens(request, metadata=md)
        seq += per_tick
        tally.published += per_tick
        if checkpoint:
            since = []
        next_tick += TICK
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))


async def _watch(stub: Any, md: Any, run_id: str, tally: Tally) -> None:
    from awooop.scheduler.v1 import scheduler_pb2

    call = stub.WatchRun(scheduler_pb2.WatchRunRequest(run_id=run_id, tokens=True), metadata=md)
    async for msg in call:
        if msg.HasField("token_batch") and tally.measuring:
            b = msg.token_batch
            tally.tokens += len(b.tokens)
            tally.latencies.append((time.time() - b.produced_at.ToNanoseconds() / 1e9) * 1000)


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    """Long because it sets up, runs and tears down one measured window, reporting four figures."""
    from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    delivered_fig, p50_fig, p99_fig, bytes_fig = figures
    n = cfg.token_streams_runs
    dsn = await stores.create_database("token_streams")
    seed = await asyncpg.connect(dsn)
    await seed.execute(SEED_PENDING_SQL, PROJECT, n)
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    settings = {"stream_checkpoint_tokens": CHECKPOINT_TOKENS, "max_watchers": n + 10}
    svc = await procs.spawn("scheduler", procs.service_env(dsn, stores.redis_url, stores.redis_prefix, **settings))
    channel = grpc.aio.insecure_channel(svc.address)
    tasks: list[asyncio.Task[None]] = []
    try:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        claim = scheduler_pb2.ClaimRunsRequest(worker_id="bench", project_ids=[PROJECT], max_runs=n)
        claim.lease_ttl.FromSeconds(3600)
        leases = [r.lease for r in (await stub.ClaimRuns(claim, metadata=md)).runs]
        assert len(leases) == n, f"claimed {len(leases)} of {n} runs"
        tally, stop = Tally(), asyncio.Event()
        tasks += [asyncio.create_task(_watch(stub, md, lease.run_id, tally)) for lease in leases]
        await asyncio.sleep(0.5)  # the watches are open
        tasks += [
            asyncio.create_task(_publish(stub, md, lease, cfg.token_streams_rate, stop, tally)) for lease in leases
        ]
        await asyncio.sleep(WARMUP)
        size_sql = "SELECT count(*), pg_total_relation_size('awooop_run_event') FROM awooop_run_event"
        before = await seed.fetchrow(size_sql)
        published0, t0 = tally.published, time.monotonic()
        tally.measuring = True
        await asyncio.sleep(cfg.token_streams_seconds)
        tally.measuring = False
        elapsed = time.monotonic() - t0
        published = tally.published - published0
        after = await seed.fetchrow(size_sql)
        stop.set()
        rate = tally.tokens / elapsed
        target = n * cfg.token_streams_rate
        delivered_fig.measured(rate, float(target), published_per_s=published / elapsed, runs=n, seconds=elapsed)
        p50_fig.measured(_pct(tally.latencies, 0.5), None, batches=len(tally.latencies))
        p99_fig.measured(_pct(tally.latencies, 0.99), None, batches=len(tally.latencies))
        grown, rows = after[1] - before[1], after[0] - before[0]
        bytes_fig.measured(
            grown / max(1, published) * 1000,
            None,
            bytes_per_run=grown / n,
            rows_per_run=rows / n,
            tokens_per_run=published / n,
            checkpoint_tokens=CHECKPOINT_TOKENS,
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close()
        svc.stop()
        await seed.close()
        await stores.drop_database(dsn)
