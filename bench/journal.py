"""Journal figures: awooop's per-step cost against DBOS Transact's (one workflow of no-op steps,
bench/dbos_steps.py), and awooop's per-step cost at journal length 1,000 against the same at
length 10.

Per step, awooop is timed two ways over gRPC to a real saga process, sequential, one run:
- through the worker SDK, `await ctx.step(step_id, noop)`, as a handler journals a step without
  side effects (one RecordStep call: the like of a DBOS step, recorded after it ran): the figure;
- BeginStep + CompleteStep, the two calls a tool call is journaled with (a pending record
  before it runs, so a crash mid-call is retried with the same idempotency key): reported.

The journal write pair and the pre-fill statement are the saga helper's
(bench/bench_journal.py: `_pair`, `PREFILL_SQL`); this module runs them from a separate load
process against a real saga process, as every figure here does.

- vs DBOS: one fresh run journals N steps one after another (N = the DBOS workflow's steps);
  per step = total / N on both sides.
- length: runs pre-filled (one INSERT ... SELECT) to 10 and 1,000 completed steps get pairs in
  interleaved rounds, so drift hits both lengths alike; the figure is the median pair at each
  length (bench_journal's method).

The runs are RUNNING with a lease (attempt 1), inserted directly: the journal's fence only
needs the run row, not a scheduler.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench import env, procs, rss
from bench.bench_journal import PREFILL_SQL
from bench.config import Config
from bench.loadgen import run_processes
from bench.report import Figure

PROJECT = "bench"

LEASED_RUNS_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, status, input, attempt_count, lease_until,
                              heartbeat_at, worker_id)
SELECT $1, 'api', 'RUNNING', '{}'::jsonb, 1, now() + interval '1 hour', now(), 'bench-journal'
  FROM generate_series(1, $2)
RETURNING run_id::text
"""


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "journal_step",
            "per-step journal cost, no-op steps through the worker SDK (RecordStep), one run, sequential",
            "ms",
            "ratio_le",
            0.5,
            "≤ 0.5 ×",
            baseline_label=f"DBOS Transact, one workflow of {cfg.dbos_steps} no-op steps, per step",
            baseline_unit="ms",
        ),
        Figure(
            "journal_step_tool",
            "per-step journal cost of a tool call (BeginStep + CompleteStep), one run, sequential",
            "ms",
            "report",
            None,
            "reported",
            baseline_label="DBOS Transact per step, as above",
            baseline_unit="ms",
        ),
        Figure(
            "journal_length",
            f"per-step cost at journal length {cfg.journal_steps:,}",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label=f"the same at length {cfg.journal_short}",
            baseline_unit="ms",
        ),
    ]


async def journal_client(
    sync: Callable[[Any], Awaitable[Any]],
    address: str,
    metadata: list[list[str]],
    seq_run: str,
    sdk_run: str,
    steps: int,
    length_runs: dict[str, str],
    pairs: int,
    warm_run: str,
) -> dict[str, Any]:
    """Load process: the sequential journal writes, timed."""
    import grpc
    from google.protobuf import struct_pb2

    from awooop.common.v1 import common_pb2
    from awooop.saga.v1 import saga_pb2_grpc
    from bench.bench_journal import _pair

    md = tuple(tuple(m) for m in metadata)
    channel = grpc.aio.insecure_channel(address)
    await channel.channel_ready()
    saga = saga_pb2_grpc.SagaServiceStub(channel)
    result = struct_pb2.Struct()
    result.update({"inserted_id": "7c1c", "rows": 1})

    def lease(run_id: str) -> Any:
        return common_pb2.LeaseToken(run_id=run_id, attempt=1)

    from awooop.scheduler.v1 import scheduler_pb2
    from awooop.worker.client import Client
    from awooop.worker.context import RunContext

    key = dict(md)["authorization"].removeprefix("Bearer ")
    client = Client(key=key, saga=address)

    def context(run_id: str) -> RunContext:
        claimed = scheduler_pb2.ClaimedRun(run=common_pb2.Run(run_id=run_id, project_id=PROJECT), lease=lease(run_id))
        return RunContext(client, claimed, "bench-journal")

    def noop(call: Any) -> dict[str, Any]:
        return {"inserted_id": "7c1c", "rows": 1}

    # warm the channels, the server's auth cache and its prepared statements (untimed)
    warm = context(warm_run)
    for i in range(20):
        await _pair(saga, md, lease(warm_run), f"warm-{i}", result)
        await warm.step(f"warm-sdk-{i}", noop)
    await sync(None)
    try:
        sdk_times = []
        ctx = context(sdk_run)
        t0 = time.perf_counter()
        for i in range(steps):
            t1 = time.perf_counter()
            await ctx.step(f"step-{i}", noop)
            sdk_times.append(time.perf_counter() - t1)
        sdk_total = time.perf_counter() - t0
        seq_times = []
        t0 = time.perf_counter()
        for i in range(steps):
            seq_times.append(await _pair(saga, md, lease(seq_run), f"step-{i}", result))
        seq_total = time.perf_counter() - t0
        times: dict[str, list[float]] = {n: [] for n in length_runs}
        rounds = 10
        per_round = max(1, pairs // rounds)
        for r in range(rounds):
            for n, run_id in length_runs.items():
                for i in range(per_round):
                    times[n].append(await _pair(saga, md, lease(run_id), f"b-{r}-{i}", result))
    finally:
        await channel.close()
        await client.close()
    return {
        "sdk_total_s": sdk_total,
        "sdk_step_s": sdk_times,
        "seq_total_s": seq_total,
        "seq_pair_s": seq_times,
        "steps": steps,
        "pair_s": times,
    }


def _ms(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "mean_ms": round(sum(s) / len(s) * 1000, 3),
        "median_ms": round(statistics.median(s) * 1000, 3),
        "p99_ms": round(s[min(len(s) - 1, int(0.99 * len(s)))] * 1000, 3),
        "steps": len(s),
    }


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    vs_dbos, tool_steps, by_length = figures
    n = cfg.journal_steps

    # DBOS first, on its own scratch database
    ddsn = await stores.create_database("dbos", migrated=False)
    try:
        (dbos,) = await asyncio.to_thread(
            run_processes,
            "bench.dbos_steps:measure",
            [{"dsn": ddsn, "steps": cfg.dbos_steps, "repeats": 1}],
            use_uvloop=False,
            timeout=600,
        )
    finally:
        await stores.drop_database(ddsn)

    dsn = await stores.create_database("journal")
    short, long = cfg.journal_short, cfg.journal_steps
    conn = await asyncpg.connect(dsn)
    try:
        seq_run, sdk_run, warm_run, short_run, long_run = (r[0] for r in await conn.fetch(LEASED_RUNS_SQL, PROJECT, 5))
        await conn.execute(PREFILL_SQL, short_run, PROJECT, short)
        await conn.execute(PREFILL_SQL, long_run, PROJECT, long)
        await conn.execute("ANALYZE awooop_saga_step")
    finally:
        await conn.close()
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    key = md[0][1].removeprefix("Bearer ")
    svc = await procs.spawn_journal_saga(dsn, stores.redis_url, stores.redis_prefix, key)
    try:
        (ours,) = await asyncio.to_thread(
            run_processes,
            "bench.journal:journal_client",
            [
                {
                    "address": svc.address,
                    "metadata": [list(m) for m in md],
                    "seq_run": seq_run,
                    "sdk_run": sdk_run,
                    "steps": n,
                    "length_runs": {str(short): short_run, str(long): long_run},
                    "pairs": cfg.journal_window,
                    "warm_run": warm_run,
                }
            ],
            timeout=600,
        )
        rss.record("saga", svc, f"after {n + 2 * cfg.journal_window} journaled steps")
    finally:
        svc.stop()

    def sequential(figure: Figure, total_s: float, each_s: list[float], calls: str, **extra: Any) -> None:
        per_step = total_s / n * 1000
        figure.measured(
            per_step,
            dbos["per_step_ms"],
            awooop={
                "steps": n,
                "total_s": round(total_s, 3),
                "per_step_ms": round(per_step, 3),
                "each": _ms(each_s),
                "calls_per_step": calls,
            },
            **extra,
        )

    sequential(vs_dbos, ours["sdk_total_s"], ours["sdk_step_s"], "RecordStep", dbos=dbos)
    sequential(tool_steps, ours["seq_total_s"], ours["seq_pair_s"], "BeginStep + CompleteStep")
    at_short, at_long = _ms(ours["pair_s"][str(short)]), _ms(ours["pair_s"][str(long)])
    by_length.measured(
        at_long["median_ms"],
        at_short["median_ms"],
        statistic="median pair (BeginStep + CompleteStep), interleaved rounds",
        at_length_long=at_long,
        at_length_short=at_short,
    )
