"""Journal figures: awooop's per-step cost (BeginStep + CompleteStep over gRPC to a real saga
process, sequential, one run) against DBOS Transact's per-step cost (one workflow of no-op
steps, bench/dbos_steps.py), and awooop's per-step cost at journal length 1,000 against the
same at length 10.

- vs DBOS: one run journals N steps one after another (N = the DBOS workflow's steps);
  per step = total / N on both sides.
- length: after that run holds N (1,000) steps, K more steps are timed on it; the baseline is
  K steps timed on fresh runs that already hold 10 steps (10 timed steps per run, so the
  journal stays between 10 and 20 long). Per step = total / K on both.

The run under the journal is RUNNING with a lease (attempt 1), inserted directly: the
journal's fence only needs the run row, not a scheduler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench import env, procs, rss
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
            "per-step journal cost (begin + complete), one run, sequential",
            "ms",
            "ratio_le",
            0.5,
            "≤ 0.5 ×",
            baseline_label=f"DBOS Transact, one workflow of {cfg.dbos_steps} no-op steps, per step",
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
    long_run: str,
    long_steps: int,
    short_runs: list[str],
    short_len: int,
    timed_long: int,
) -> dict[str, Any]:
    """Load process: the sequential journal writes, timed."""
    import grpc
    from google.protobuf import struct_pb2

    from awooop.common.v1 import common_pb2
    from awooop.saga.v1 import saga_pb2, saga_pb2_grpc

    md = tuple(tuple(m) for m in metadata)
    channel = grpc.aio.insecure_channel(address)
    await channel.channel_ready()
    stub = saga_pb2_grpc.SagaServiceStub(channel)
    result = struct_pb2.Struct()
    result.update({"ok": True})

    async def step(run_id: str, step_id: str) -> None:
        lease = common_pb2.LeaseToken(run_id=run_id, attempt=1)
        r = await stub.BeginStep(
            saga_pb2.BeginStepRequest(lease=lease, step_id=step_id, step_type=common_pb2.STEP_TYPE_LLM_CALL),
            metadata=md,
            timeout=30,
        )
        if r.action != saga_pb2.STEP_ACTION_EXECUTE:
            raise RuntimeError(f"BeginStep {step_id}: expected EXECUTE, got {r.action}")
        await stub.CompleteStep(
            saga_pb2.CompleteStepRequest(lease=lease, step_id=step_id, result=result), metadata=md, timeout=30
        )

    async def steps(run_id: str, first: int, count: int) -> list[float]:
        times = []
        for i in range(first, first + count):
            t0 = time.perf_counter()
            await step(run_id, f"step-{i}")
            times.append(time.perf_counter() - t0)
        return times

    # warm the channel, the server's auth cache and its prepared statements on a throwaway run
    await steps(short_runs[-1], 0, 5)
    await sync(None)
    try:
        t0 = time.perf_counter()
        await steps(long_run, 0, long_steps)
        long_total = time.perf_counter() - t0
        short_times: list[float] = []
        per_run = max(1, timed_long // max(1, len(short_runs) - 1))
        for run_id in short_runs[:-1]:
            await steps(run_id, 0, short_len)  # untimed: bring the journal to its length
            short_times += await steps(run_id, short_len, per_run)
        long_times = await steps(long_run, long_steps, timed_long)
    finally:
        await channel.close()
    return {
        "long_total_s": long_total,
        "long_steps": long_steps,
        "short_step_s": short_times,
        "long_step_s": long_times,
    }


def _ms(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "mean_ms": round(sum(s) / len(s) * 1000, 3),
        "median_ms": round(s[len(s) // 2] * 1000, 3),
        "p99_ms": round(s[min(len(s) - 1, int(0.99 * len(s)))] * 1000, 3),
        "steps": len(s),
    }


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    vs_dbos, by_length = figures
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
    conn = await asyncpg.connect(dsn)
    try:
        short_count = max(1, cfg.journal_window // cfg.journal_short)
        run_ids = [r[0] for r in await conn.fetch(LEASED_RUNS_SQL, PROJECT, 2 + short_count)]
    finally:
        await conn.close()
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    svc_env = procs.service_env(dsn, stores.redis_url, stores.redis_prefix, uvloop=cfg.service_uvloop)
    svc = await procs.spawn("saga", svc_env)
    try:
        (ours,) = await asyncio.to_thread(
            run_processes,
            "bench.journal:journal_client",
            [
                {
                    "address": svc.address,
                    "metadata": [list(m) for m in md],
                    "long_run": run_ids[0],
                    "long_steps": n,
                    "short_runs": run_ids[1:],
                    "short_len": cfg.journal_short,
                    "timed_long": cfg.journal_window,
                }
            ],
            timeout=600,
        )
        rss.record("saga", svc, f"after {n + 2 * cfg.journal_window} journaled steps")
    finally:
        svc.stop()
    per_step = ours["long_total_s"] / n * 1000
    vs_dbos.measured(
        per_step,
        dbos["per_step_ms"],
        awooop={"steps": n, "total_s": round(ours["long_total_s"], 3), "per_step_ms": round(per_step, 3)},
        dbos=dbos,
    )
    short, long = _ms(ours["short_step_s"]), _ms(ours["long_step_s"])
    by_length.measured(long["mean_ms"], short["mean_ms"], at_length_long=long, at_length_short=short)
