"""Child runs (docs/worker-sdk.md "Child runs"): a fan-out of 100 children over the SDK, on a
scheduler, an ingest and a saga process of their own (a resumed parent reads its journal from the
saga), one SDK Worker (concurrency 50) in this process.

- children_fan_out: parent handler start -> all 100 children's handlers started (one process,
  one clock), against the baseline measured in the same run: IngestEvents of 100 runs returned ->
  all 100 handlers started (the same worker). Both: runs created at once and claimed by the same
  worker; the figure is what starting them from a handler (StartChildRuns, one statement with the
  wait, then the parent's park) costs over creating them through ingest.
- children_resume: the last child's COMPLETED audit row -> the parent's second CLAIMED audit row
  (the database clock: the trigger's end of the children wait, the wake-up, the claim), against
  the single-run dispatch of the same worker (IngestEvent returned -> handler start) measured in
  the same run. Medians of `rounds` fan-outs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import asyncpg
import grpc

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.worker import RunContext, Worker
from bench import env, procs
from bench.config import Config
from bench.ingest import ingest_event
from bench.report import Figure

PROJECT = "bench"
FAN_OUT = 100


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "children_fan_out",
            f"fan-out of {FAN_OUT} children: parent start -> all children claimed",
            "ms",
            "report",
            None,
            "reported (ratio in details)",
            baseline_label=f"{FAN_OUT} runs from one IngestEvents -> all claimed",
            baseline_unit="ms",
        ),
        Figure(
            "children_resume",
            "last child done -> parent resumed (claimed again)",
            "ms",
            "report",
            None,
            "reported (ratio in details)",
            baseline_label="one run ingested -> its handler started",
            baseline_unit="ms",
        ),
    ]


class _Bench:
    def __init__(self, key: str, scheduler: str, saga: str) -> None:
        self.started: dict[str, float] = {}  # run_id -> its first handler start (perf_counter)
        self.parents: dict[str, asyncio.Event] = {}
        self.all_started = asyncio.Event()
        self.expect = 0

        async def handle(ctx: RunContext) -> dict[str, Any]:
            self.started.setdefault(ctx.run_id, time.perf_counter())
            if len(self.started) >= self.expect:
                self.all_started.set()
            if ctx.input.get("role") != "parent":
                return {"n": ctx.input.get("n", 0)}
            outcomes = await ctx.run_children([{"n": i} for i in range(FAN_OUT)])
            self.parents[ctx.run_id].set()
            return {"children": len(outcomes)}

        # the saga service: a resumed parent reads its journal (the children's wait step) there
        self.worker = Worker(
            handle, projects=[PROJECT], key=key, scheduler=scheduler, saga=saga, concurrency=50, claim_wait=20
        )


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    fan_fig, resume_fig = figures
    rounds = 3 if cfg.quick else 10
    dsn = await stores.create_database("children")
    md = await env.bench_key(dsn, PROJECT, ("worker", "ingest"))
    key = dict(md)["authorization"].removeprefix("Bearer ")
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix, max_children_per_run=FAN_OUT)
    svc = await procs.spawn("scheduler", base, "children")
    ing = await procs.spawn("ingest", base, "children")
    saga = await procs.spawn_journal_saga(dsn, stores.redis_url, stores.redis_prefix, key, "children")
    conn = await asyncpg.connect(dsn)
    b = _Bench(key, svc.address, saga.address)
    task = asyncio.create_task(b.worker.run(install_signal_handlers=False))
    fan: list[float] = []
    fan_base: list[float] = []
    resume: list[float] = []
    dispatch: list[float] = []
    try:
        async with grpc.aio.insecure_channel(ing.address) as ich:
            ingest = ingest_pb2_grpc.IngestServiceStub(ich)
            template = ingest_event(ingest_pb2, PROJECT, "x")

            def event(payload: dict[str, Any]) -> Any:
                req = ingest_pb2.IngestEventRequest()
                req.CopyFrom(template)
                req.provider_event_id = uuid.uuid4().hex
                req.payload.Clear()
                req.payload.update(payload)
                return req

            for r in range(rounds + 1):  # the first round warms channels, caches and plans
                # baseline: 100 runs through ingest at once
                b.started.clear()
                b.all_started.clear()
                b.expect = FAN_OUT
                await asyncio.sleep(0.1)
                await ingest.IngestEvents(
                    ingest_pb2.IngestEventsRequest(events=[event({"n": i}) for i in range(FAN_OUT)]), metadata=md
                )
                returned = time.perf_counter()
                await asyncio.wait_for(b.all_started.wait(), 60)
                base_ms = (max(b.started.values()) - returned) * 1000
                # one run: dispatch latency of the same worker
                b.started.clear()
                b.all_started.clear()
                b.expect = 1
                await asyncio.sleep(0.1)
                one = await ingest.IngestEvent(event({"n": -1}), metadata=md)
                returned = time.perf_counter()
                await asyncio.wait_for(b.all_started.wait(), 60)
                one_ms = (b.started[one.outcomes[0].run_id] - returned) * 1000
                # the fan-out
                b.started.clear()
                b.all_started.clear()
                b.expect = FAN_OUT + 1
                await asyncio.sleep(0.1)
                parent_resp = await ingest.IngestEvent(event({"role": "parent"}), metadata=md)
                parent = parent_resp.outcomes[0].run_id
                done = b.parents[parent] = asyncio.Event()
                await asyncio.wait_for(b.all_started.wait(), 60)
                await asyncio.wait_for(done.wait(), 60)
                fan_ms = (max(b.started.values()) - b.started[parent]) * 1000
                times = await conn.fetchrow(
                    """SELECT (SELECT max(a.created_at) FROM awooop_audit_log a JOIN awooop_run_state c
                                  ON c.run_id = a.run_id
                                WHERE c.parent_run_id = $1 AND a.action = 'COMPLETED') AS last_done,
                              (SELECT max(created_at) FROM awooop_audit_log
                                WHERE run_id = $1 AND action = 'CLAIMED') AS resumed""",
                    uuid.UUID(parent),
                )
                resume_ms = (times["resumed"] - times["last_done"]).total_seconds() * 1000
                if r > 0:
                    fan_base.append(base_ms)
                    dispatch.append(one_ms)
                    fan.append(fan_ms)
                    resume.append(resume_ms)
    finally:
        b.worker.stop()
        await asyncio.wait_for(task, 30)
        await conn.close()
        svc.stop()
        ing.stop()
        saga.stop()
        await stores.drop_database(dsn)
    f, fb = statistics.median(fan), statistics.median(fan_base)
    rs, d = statistics.median(resume), statistics.median(dispatch)
    fan_fig.measured(
        f, fb, rounds=rounds, ratio=round(f / fb, 2) if fb else None, samples_ms=[round(x, 1) for x in fan]
    )
    resume_fig.measured(
        rs, d, rounds=rounds, ratio=round(rs / d, 2) if d else None, samples_ms=[round(x, 1) for x in resume]
    )
