"""Flow control (docs/flow-control.md): the claim statement's cost with runs it must not read,
the lateness of delayed runs, and dispatch latency.

- claim_cost_busy_key: the single-project claim statement (claiming.claim_sql, 10 runs, rolled
  back so every execution sees the same rows) with 10,000 runs parked on a busy concurrency key
  in the project, against the same statement on the same database without them.
- claim_cost_other_backlog: the multi-project claim for two projects where the other holds a
  10,000-run backlog, against the same claim where the other holds 10 runs (so both sides take
  runs from both projects and only the backlog's size differs).
- delayed_lateness_p50/p99: a long-polling worker waits; runs are created with not_before a
  moment ahead; lateness = the CLAIMED audit row's time minus not_before (the database clock).
- dispatch_latency_p50/p99: a long-polling worker waits; one CreateRun; latency = the worker's
  receipt of the claim minus the CreateRun call's return (both on this process's clock).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import asyncpg
import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from bench import env, procs
from bench.config import Config
from bench.report import Figure
from services.scheduler import claiming

PROJECT = "bench"
OTHER = "other"
KEY = "llm:provider-x"
PARKED = 10_000

READY_SQL = """INSERT INTO awooop_run_state (project_id, channel_type, input, created_at)
               SELECT $1, 'api', '{}', now() - interval '1 hour' + g * interval '1 millisecond'
                 FROM generate_series(1, $2) g"""
PARKED_SQL = f"""INSERT INTO awooop_run_state (project_id, channel_type, input, concurrency_keys, not_before,
                                               wait_reason, wait_key)
                 SELECT $1, 'api', '{{}}', ARRAY['{KEY}'], 'infinity', 'key_busy', '{KEY}'
                   FROM generate_series(1, $2)"""


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "claim_cost_busy_key",
            f"claim statement with {PARKED:,} runs waiting on a busy key",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label="the same claim without them",
            baseline_unit="ms",
        ),
        Figure(
            "claim_cost_other_backlog",
            f"claim for two projects, the other holding a {PARKED:,}-run backlog",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label="the same claim with 10 runs there",
            baseline_unit="ms",
        ),
        Figure("delayed_lateness_p50", "delayed run: claimed minus not_before, p50", "ms", "report", None, "reported"),
        Figure("delayed_lateness_p99", "delayed run: claimed minus not_before, p99", "ms", "report", None, "reported"),
        Figure(
            "dispatch_latency_p50",
            "waiting worker: claim received minus CreateRun returned, p50",
            "ms",
            "report",
            None,
            "reported",
        ),
        Figure(
            "dispatch_latency_p99",
            "waiting worker: claim received minus CreateRun returned, p99",
            "ms",
            "report",
            None,
            "reported",
        ),
    ]


async def _statement_ms(conn: asyncpg.Connection, sql: str, arg: Any, repeats: int) -> float:
    """Median milliseconds of one claim statement, each in a rolled-back transaction."""
    times = []
    for _ in range(repeats):
        tr = conn.transaction()
        await tr.start()
        t0 = time.perf_counter()
        await conn.fetch(sql, arg, 60.0, "bench-w", "bench")
        times.append((time.perf_counter() - t0) * 1000)
        await tr.rollback()
    return statistics.median(times)


async def _claim_costs(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> None:
    repeats = 50 if cfg.quick else 300
    dsn = await stores.create_database("flow_claim")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(READY_SQL, PROJECT, 1000)
        await conn.execute(READY_SQL, OTHER, 10)  # both projects have work: each claim takes from both
        await conn.execute("VACUUM ANALYZE awooop_run_state")
        single = claiming.claim_sql(True, 10)
        multi = claiming.claim_sql(False, 10)
        await _statement_ms(conn, single, PROJECT, 10)  # warm
        base_single = await _statement_ms(conn, single, PROJECT, repeats)
        base_multi = await _statement_ms(conn, multi, [PROJECT, OTHER], repeats)
        await conn.execute(PARKED_SQL, PROJECT, PARKED)
        await conn.execute(READY_SQL, OTHER, PARKED - 10)
        await conn.execute("VACUUM ANALYZE awooop_run_state")
        busy = await _statement_ms(conn, single, PROJECT, repeats)
        other = await _statement_ms(conn, multi, [PROJECT, OTHER], repeats)
    finally:
        await conn.close()
    await stores.drop_database(dsn)
    figures["claim_cost_busy_key"].measured(busy, base_single, repeats=repeats)
    figures["claim_cost_other_backlog"].measured(other, base_multi, repeats=repeats)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _latencies(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> None:
    samples = 20 if cfg.quick else 200
    dsn = await stores.create_database("flow_latency")
    md = await env.bench_key(dsn, PROJECT, ("worker", "ingest"))
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
    svc = await procs.spawn("scheduler", base, "flow")
    ing = await procs.spawn("ingest", base, "flow")
    conn = await asyncpg.connect(dsn)
    try:
        async with grpc.aio.insecure_channel(svc.address) as sch, grpc.aio.insecure_channel(ing.address) as ich:
            sched = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            ingest = ingest_pb2_grpc.IngestServiceStub(ich)
            claim = scheduler_pb2.ClaimRunsRequest(
                worker_id="bench", project_ids=[PROJECT], max_runs=1, wait=Duration(seconds=10)
            )

            async def one(delay: float) -> tuple[float, str, float]:
                """(dispatch ms, run id, not_before as epoch seconds or 0)."""
                waiting = asyncio.ensure_future(sched.ClaimRuns(claim, metadata=md))
                await asyncio.sleep(0.05)  # the claim is waiting before the run exists
                req = ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key=uuid.uuid4().hex)
                due = 0.0
                if delay:
                    nb = Timestamp()
                    nb.FromNanoseconds(time.time_ns() + int(delay * 1e9))
                    req.not_before.CopyFrom(nb)
                    due = nb.seconds + nb.nanos / 1e9
                await ingest.CreateRun(req, metadata=md)
                returned = time.perf_counter()
                resp = await waiting
                got = time.perf_counter()
                (c,) = resp.runs
                await sched.CompleteRun(scheduler_pb2.CompleteRunRequest(lease=c.lease), metadata=md)
                return (got - returned) * 1000, c.run.run_id, due

            dispatch = [(await one(0.0))[0] for _ in range(samples)]
            late = []
            for _ in range(samples):
                _, run_id, due = await one(0.3)
                # the claim's time (its transaction's now(), the database clock on this machine)
                claimed = await conn.fetchval(
                    "SELECT extract(epoch FROM created_at)::float8 FROM awooop_audit_log"
                    " WHERE run_id = $1 AND action = 'CLAIMED'",
                    uuid.UUID(run_id),
                )
                late.append((float(claimed) - due) * 1000)
    finally:
        await conn.close()
        svc.stop()
        ing.stop()
    await stores.drop_database(dsn)
    figures["dispatch_latency_p50"].measured(statistics.median(dispatch), samples=samples)
    figures["dispatch_latency_p99"].measured(_pct(dispatch, 0.99), samples=samples)
    figures["delayed_lateness_p50"].measured(statistics.median(late), samples=samples)
    figures["delayed_lateness_p99"].measured(_pct(late, 0.99), samples=samples)


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    by_key = {f.key: f for f in figures}
    await _claim_costs(stores, cfg, by_key)
    await _latencies(stores, cfg, by_key)
