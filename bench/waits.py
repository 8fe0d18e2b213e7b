"""Durable waits' figures (issue 27): what parked runs cost the statements that run all the
time, what they write while they wait, and how fast a completion resumes a handler.

- Claim statement cost with `waits_parked` parked runs (WAITING_TOOL without a lease, each with
  its open wait) in the table, against a database alike but without them, the two measured
  alternately: a claim of `claim_batch` runs out of `waits_claimable` PENDING ones, the claimed
  runs put back before each execution (untimed); medians of `waits_repeats` executions each.
- Reaper statement cost (no lease expired, the usual pass), the same way, on three databases
  measured in turn: none parked, parked with the leased runs' index as it is (migration 0161:
  it needs a worker, so parked runs are not in it), and parked with that index as migration 0040
  made it (RUNNING/WAITING_TOOL, parked runs in it): the before and after of the same run.
- Store writes per parked run per minute: the parked database alone (no leased run), served by
  a real scheduler process whose loops (reaper, wait sweep, queue sample) run every second, for
  `waits_window` seconds; rows inserted, updated and deleted in awooop_run_state and awooop_wait
  (pg_stat_user_tables, read after the process has exited and so flushed its counts), less the
  two of a control wait that times out mid-window (the check that the count sees the writes).
- Completion -> resume: a waiting SDK Worker (concurrency 1) whose handler creates a wait token
  and parks on it; a sample is CompleteWait posted (the call's start) to the handler running
  again past its wait, on one clock; `waits_resume_samples` samples, p50 and p99.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import asyncpg
import grpc

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.worker import RunContext, Worker, to_struct
from bench import env, procs
from bench.config import Config
from bench.ingest import ingest_event
from bench.report import Figure

PROJECT = "bench"

SEED_PENDING_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input, created_at)
SELECT $1, 'api', 'pending-' || g, 'PENDING', '{"n": 1}'::jsonb,
       now() - interval '1 hour' + make_interval(secs => g / 1000.0)
  FROM generate_series(1, $2) AS g
"""

# parked as AwaitWait leaves a run: WAITING_TOOL, no lease, token spent; its wait open
SEED_PARKED_SQL = """
WITH runs AS (
    INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input, attempt_count,
                                  released_count, created_at)
    SELECT $1, 'api', 'parked-' || g, 'WAITING_TOOL', '{"n": 1}'::jsonb, 2, 2, now() - interval '2 hours'
      FROM generate_series(1, $2) AS g
    RETURNING run_id, project_id
),
waits AS (
    INSERT INTO awooop_wait (project_id, run_id, step_id, kind, expires_at, parked_attempt)
    SELECT project_id, run_id, 'wait-1', 'token', now() + interval '1 day', 2 FROM runs
    RETURNING wait_id, run_id
)
INSERT INTO awooop_wait_token (token_hash, wait_id) SELECT sha256(run_id::text::bytea), wait_id FROM waits
"""

# the leased runs' index before migration 0161 (migration 0040): parked runs are in it
INDEX_0040_SQL = """
DROP INDEX awooop_run_leased_idx;
CREATE INDEX awooop_run_leased_idx ON awooop_run_state (run_id) WHERE status IN ('RUNNING', 'WAITING_TOOL');
"""

PUT_BACK_SQL = """
UPDATE awooop_run_state SET status = 'PENDING', lease_until = NULL, worker_id = NULL, attempt_count = 0
 WHERE project_id = $1 AND status = 'RUNNING'
"""

CONTROL_WRITES = 2  # a wait ended by the sweep: its row and its run's
WRITES_SQL = """
SELECT COALESCE(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint
  FROM pg_stat_user_tables WHERE relname IN ('awooop_run_state', 'awooop_wait')
"""


def _reported(key: str, title: str) -> list[Figure]:
    return [Figure(f"{key}_{p}", f"{title}, {p}", "ms", "report", None, "reported") for p in ("p50", "p99")]


def declare(cfg: Config) -> list[Figure]:
    n = cfg.waits_parked
    return [
        Figure(
            "waits_claim_cost",
            f"claim statement cost with {n:,} parked runs (durable waits)",
            "ms",
            "ratio_le",
            1.1,
            "≤ 1.1 ×",
            baseline_label="the same with none",
        ),
        Figure(
            "waits_reaper_cost",
            f"reaper statement cost with {n:,} parked runs (no lease expired)",
            "ms",
            "report",
            None,
            "reported (ratio to none; the 0040 index's in details)",
            baseline_label="the same with none",
        ),
        Figure(
            "waits_store_writes",
            f"store writes per parked run per minute ({n:,} parked, scheduler loops every second)",
            "rows",
            "le",
            0.0,
            "0",
        ),
        *_reported("waits_resume_latency", "CompleteWait posted -> parked handler resumed on a waiting SDK worker"),
    ]


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    by_key = {f.key: f for f in figures}
    dsns = await _costs(stores, cfg, by_key)
    try:
        await _store_writes(stores, cfg, dsns[1], by_key["waits_store_writes"])
    finally:
        for d in dsns:
            await stores.drop_database(d)
    await _resume_latency(stores, cfg, by_key)


async def _costs(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> list[str]:
    """Claim and reaper costs; returns the databases (none, parked, parked with the 0040 index)."""
    from services.common import retry_policy
    from services.common.db import create_pool
    from services.common.runs import RUN_READY_CHANNEL
    from services.common.settings import Settings
    from services.scheduler import claiming, reaper, reaper_sql

    settings = Settings()
    policy = json.dumps(retry_policy.defaults(settings))
    # alike but for the parked runs (and the index), measured in turn so that the load of the
    # shared machine falls on all alike
    dsns = [
        await stores.create_database("waits_none"),
        await stores.create_database("waits_parked"),
        await stores.create_database("waits_parked_0040"),
    ]
    pools = [await create_pool(settings.with_(database_url=d, db_pool_max=4)) for d in dsns]
    seeds = [await asyncpg.connect(d) for d in dsns]
    try:
        for seed in seeds:
            await seed.execute(SEED_PENDING_SQL, PROJECT, cfg.waits_claimable)
        for seed in seeds[1:]:
            await seed.execute(SEED_PARKED_SQL, PROJECT, cfg.waits_parked)
        await seeds[2].execute(INDEX_0040_SQL)
        for seed in seeds:
            await seed.execute("VACUUM ANALYZE awooop_run_state")

        async def claim(i: int) -> float:
            await seeds[i].execute(PUT_BACK_SQL, PROJECT)
            t0 = time.perf_counter()
            got = await claiming.claim_once(pools[i], [PROJECT], cfg.claim_batch, 300.0, "bench-w", "bench", None)
            ms = (time.perf_counter() - t0) * 1000
            if len(got.rows) != cfg.claim_batch:
                raise RuntimeError(f"claimed {len(got.rows)} runs, expected {cfg.claim_batch}")
            return ms

        async def reap(i: int) -> float:
            args = reaper_sql.REAP_EXPIRED_LEASES.args(
                batch=reaper.REAP_BATCH,
                actor=reaper.REAPER_ACTOR,
                channel=RUN_READY_CHANNEL,
                policy=policy,
                only_run=None,
            )
            t0 = time.perf_counter()
            reaped = await pools[i].fetch(reaper_sql.REAP_EXPIRED_LEASES.sql, *args)
            ms = (time.perf_counter() - t0) * 1000
            if reaped:
                raise RuntimeError(f"the reaper took {len(reaped)} runs; none has an expired lease")
            return ms

        for i in (0, 1, 2):  # warm the plan caches and the pages
            await claim(i)
            await reap(i)
        claims: list[list[float]] = [[], [], []]
        reaps: list[list[float]] = [[], [], []]
        for _ in range(cfg.waits_repeats):
            for i in (0, 1):
                claims[i].append(await claim(i))
            for i in (0, 1, 2):
                reaps[i].append(await reap(i))
        claim_none, claim_parked = (statistics.median(c) for c in claims[:2])
        reap_none, reap_parked, reap_0040 = (statistics.median(r) for r in reaps)
        figures["waits_claim_cost"].measured(
            claim_parked, claim_none, parked=cfg.waits_parked, claimable=cfg.waits_claimable, batch=cfg.claim_batch
        )
        figures["waits_reaper_cost"].measured(
            reap_parked,
            reap_none,
            parked=cfg.waits_parked,
            index_0040_ms=round(reap_0040, 3),
            index_0040_ratio=round(reap_0040 / reap_none, 2) if reap_none else None,
        )
        return dsns
    finally:
        for seed in seeds:
            await seed.close()
        for pool in pools:
            await pool.close()


async def _store_writes(stores: env.Stores, cfg: Config, dsn: str, figure: Figure) -> None:
    """Rows written to the run and wait tables while only parked runs exist and a scheduler
    serves them, per parked run per minute."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM awooop_run_state WHERE status <> 'WAITING_TOOL'")
        parked = await conn.fetchval("SELECT count(*) FROM awooop_run_state WHERE worker_id IS NULL") - 1
        # the control: one wait times out mid-window, and the sweep's two row writes (the wait,
        # its run back to PENDING) must be counted, or the count missed the scheduler's writes
        await conn.execute(
            "UPDATE awooop_wait SET expires_at = now() + make_interval(secs => $1)"
            " WHERE wait_id = (SELECT wait_id FROM awooop_wait LIMIT 1)",
            2.0 + cfg.waits_window / 2,
        )
        base = procs.service_env(
            dsn,
            stores.redis_url,
            stores.redis_prefix,
            reaper_interval=1,
            wait_sweep_interval=1,
            queue_metrics_interval=1,
        )
        svc = await procs.spawn("scheduler", base, "waits")
        try:
            await asyncio.sleep(2.0)  # its start-up writes (if any) are flushed before the window
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            before = await conn.fetchval(WRITES_SQL)
            t0 = time.monotonic()
            await asyncio.sleep(cfg.waits_window)
        finally:
            svc.stop()  # an exiting backend flushes its counts
        seconds = time.monotonic() - t0
        await asyncio.sleep(1.0)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        written = await conn.fetchval(WRITES_SQL) - before - CONTROL_WRITES
        resumed = await conn.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'PENDING'")
    finally:
        await conn.close()
    if resumed != 1 or written < 0:
        raise RuntimeError(f"the control wait: {resumed} runs resumed, {written + CONTROL_WRITES} rows counted")
    figure.measured(written / parked / (seconds / 60), parked=parked, window_s=round(seconds, 1), rows_written=written)


class _Resume:
    """A waiting SDK worker (concurrency 1) on PROJECT whose handler parks on a wait token."""

    def __init__(self, key: str, scheduler: str, saga: str) -> None:
        self.parked: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.resumed: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
        self.started: dict[str, float] = {}

        async def handle(ctx: RunContext) -> dict[str, Any]:
            self.started[ctx.run_id] = time.perf_counter()  # the last start: the resumed attempt's
            token = await ctx.create_wait(600)
            if token.token:  # the first attempt: a later one finds the wait ended
                self.parked.put_nowait((ctx.run_id, token.wait_id))
            await ctx.wait(token)
            self.resumed.put_nowait((ctx.run_id, time.perf_counter()))
            return {}

        self.worker = Worker(
            handle, projects=[PROJECT], key=key, scheduler=scheduler, saga=saga, concurrency=1, claim_wait=20
        )

    async def __aenter__(self) -> _Resume:
        self.task = asyncio.create_task(self.worker.run(install_signal_handlers=False))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker.stop()
        await self.task


async def _resume_latency(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> None:
    dsn = await stores.create_database("waits_resume")
    md = await env.bench_key(dsn, PROJECT, ("worker", "ingest"))
    key = dict(md)["authorization"].removeprefix("Bearer ")
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
    # the saga is SERVING only with an internal key; no gateway here (the journal needs none)
    saga_env = procs.service_env(
        dsn, stores.redis_url, stores.redis_prefix, internal_api_key=key, gateway_addr="127.0.0.1:1"
    )
    started: list[procs.Service] = []
    conn = await asyncpg.connect(dsn)
    parked_sql = "SELECT status = 'WAITING_TOOL' AND worker_id IS NULL FROM awooop_run_state WHERE run_id = $1"
    try:
        for name, environ in (("scheduler", base), ("ingest", base), ("saga", saga_env)):
            started.append(await procs.spawn(name, environ, "waits"))
        svc, ing, saga = started
        async with grpc.aio.insecure_channel(svc.address) as sch, grpc.aio.insecure_channel(ing.address) as ich:
            sched = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            ingest = ingest_pb2_grpc.IngestServiceStub(ich)
            template = ingest_event(ingest_pb2, PROJECT, "x")
            async with _Resume(key, svc.address, saga.address) as worker:

                async def sample() -> float:
                    req = ingest_pb2.IngestEventRequest()
                    req.CopyFrom(template)
                    req.provider_event_id = uuid.uuid4().hex
                    await ingest.IngestEvent(req, metadata=md, timeout=30)
                    run_id, wait_id = await asyncio.wait_for(worker.parked.get(), 30)
                    for _ in range(6000):  # the handler unwinds once AwaitWait has parked the run
                        if await conn.fetchval(parked_sql, uuid.UUID(run_id)):
                            break
                        await asyncio.sleep(0.005)
                    else:
                        raise RuntimeError(f"run {run_id} did not park")
                    await asyncio.sleep(0.05)  # the worker's long-poll is waiting again
                    t0 = time.perf_counter()
                    done = scheduler_pb2.CompleteWaitRequest(wait_id=wait_id, result=to_struct({"ok": True}))
                    answer = await sched.CompleteWait(done, metadata=md, timeout=30)
                    resumed, at = await asyncio.wait_for(worker.resumed.get(), 30)
                    if resumed != run_id or not answer.resumed:
                        raise RuntimeError(f"run {resumed} resumed, expected {run_id} (resumed={answer.resumed})")
                    claimed.append((worker.started[run_id] - t0) * 1000)
                    return (at - t0) * 1000

                claimed: list[float] = []
                for _ in range(5):  # warm: channels, the services' key caches and statements
                    await sample()
                claimed.clear()
                values = [await sample() for _ in range(cfg.waits_resume_samples)]
    finally:
        await conn.close()
        for proc in started:
            proc.stop()
    await stores.drop_database(dsn)
    s = sorted(values)
    # where the time goes: to the resumed attempt's start (the wake-up and claim), the rest the
    # handler's run from the top to past its wait (its journal read, CreateWait finding the wait)
    extra = {"samples": len(values), "to_handler_start_p50_ms": round(statistics.median(claimed), 2)}
    figures["waits_resume_latency_p50"].measured(statistics.median(values), **extra)
    figures["waits_resume_latency_p99"].measured(s[min(len(s) - 1, int(0.99 * len(s)))], **extra)
