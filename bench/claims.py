"""Claim cycles against PgQueuer on the same Postgres.

awooop cycle, per worker: ClaimRuns(max_runs = batch) -> one Heartbeat carrying the whole
batch's leases -> the whole batch completed, as the worker SDK does for a busy worker: carried
by the next ClaimRuns (`complete`; completed and claimed in one statement, one commit). The
last batch rides on a claim that finds the queue empty. 16 workers (coroutines) spread over
the load processes, talking gRPC to a real scheduler process.

PgQueuer: 16 QueueManagers (one asyncpg connection each, PgQueuer's own model of a
consumer) spread over the same number of processes, draining no-op jobs with its default
batch size (10) and its default (durable, logged) tables.

Both drain a queue filled beforehand with N items. Throughput = N / (t_last - t_first), where
t_first is the first item handed to a consumer and t_last is when a poller sees the last
item finished in the database (COMPLETED run / job row gone), polled every 10 ms.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench import cpu, env, procs, rss
from bench.config import Config
from bench.loadgen import run_processes, split
from bench.report import Figure
from services.common.settings import Settings
from services.scheduler.workers import NO_ROUTING

PROJECT = "bench"


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "claim_cycles",
            f"claim → heartbeat → complete cycles/s, {cfg.claim_workers} workers, batch claim ({cfg.claim_batch})",
            "runs/s",
            "ratio_ge",
            1.0,
            "≥ 1 ×",
            baseline_label=f"PgQueuer {cfg.claim_workers} consumers draining no-op jobs, batch size {cfg.claim_batch}",
            baseline_unit="jobs/s",
        ),
        Figure(
            "claim_cycles_ceiling",
            "claim cycles/s against the store ceiling: the same drain through the scheduler over gRPC",
            "runs/s",
            "ratio_ge",
            0.7,
            "≥ 0.7 ×",
            baseline_label=(
                f"the scheduler's claim and heartbeat statements run raw on its own pool, {cfg.claim_workers} "
                f"workers, batch {cfg.claim_batch}, no gRPC"
            ),
            baseline_unit="runs/s",
        ),
    ]


# ---------------------------------------------------------------- load processes


async def awooop_workers(
    sync: Callable[[Any], Awaitable[Any]],
    address: str,
    metadata: list[list[str]],
    proc_idx: int,
    workers: int,
    batch: int,
    project: str = PROJECT,
    wait_s: float = 0.02,
    seconds: float | None = None,
    saga_address: str | None = None,
) -> dict[str, Any]:
    """A drain (each worker stops after three empty claims in a row), or with `seconds` a steady
    load: the workers go on, long-polling `wait_s`, until that long after the start. With
    `saga_address`, each run journals one step (RecordStep, as the SDK's ctx.step) before it is
    completed."""
    import grpc
    from google.protobuf import duration_pb2, struct_pb2

    from awooop.common.v1 import common_pb2
    from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
    from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    md = tuple(tuple(m) for m in metadata)
    channel = grpc.aio.insecure_channel(address)
    await channel.channel_ready()
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    saga_channel = grpc.aio.insecure_channel(saga_address) if saga_address else None
    saga = saga_pb2_grpc.SagaServiceStub(saga_channel) if saga_channel else None
    output = struct_pb2.Struct()
    output.update({"ok": True})
    first: list[float] = []
    done = 0
    errors: dict[str, int] = {}
    details: list[str] = []
    cpu0 = time.process_time()
    start = await sync(None)
    until = None if seconds is None else start + seconds
    wait = duration_pb2.Duration()
    wait.FromNanoseconds(int(wait_s * 1e9))

    def failed(call: str, exc: grpc.aio.AioRpcError) -> None:
        # keyed by call and code, with the first few messages: a failed drain names its cause
        key = f"{call} {exc.code().name}"
        errors[key] = errors.get(key, 0) + 1
        if len(details) < 5:
            details.append(f"{key}: {exc.details()}")

    async def worker(w: int) -> None:
        nonlocal done
        worker_id = f"bench-{proc_idx}-{w}"
        empty = 0
        finished: list[Any] = []  # the batch done last cycle: completed by the next ClaimRuns
        while (empty < 3 if until is None else time.monotonic() < until) and sum(errors.values()) <= 100:
            try:
                r = await stub.ClaimRuns(
                    scheduler_pb2.ClaimRunsRequest(
                        worker_id=worker_id,
                        project_ids=[project],
                        max_runs=batch,
                        wait=wait,
                        complete=finished,
                    ),
                    metadata=md,
                    timeout=30,
                )
            except grpc.aio.AioRpcError as exc:  # retried with the same completions (they are idempotent)
                failed("ClaimRuns", exc)
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return
                continue
            if len(r.completed) != len(finished):
                errors["NO_COMPLETIONS_IN_CLAIM"] = errors.get("NO_COMPLETIONS_IN_CLAIM", 0) + 1
                return
            for result in r.completed:  # per-item refusals (none expected) count as errors
                if result.error_reason:
                    errors[result.error_reason] = errors.get(result.error_reason, 0) + 1
                else:
                    done += 1
            finished = []
            if not r.runs:
                empty += 1
                continue
            empty = 0
            if not first:
                first.append(time.monotonic())
            leases = [c.lease for c in r.runs]
            try:
                await stub.Heartbeat(
                    scheduler_pb2.HeartbeatRequest(worker_id=worker_id, leases=leases), metadata=md, timeout=30
                )
            except grpc.aio.AioRpcError as exc:
                # as the worker SDK: a failed heartbeat does not abandon the work (the lease still
                # holds; the completion is fenced by it). Dropping the batch here left its runs
                # RUNNING until their lease expired, past the drain's end.
                failed("Heartbeat", exc)
            if saga is not None:
                steps = [
                    saga.RecordStep(
                        saga_pb2.RecordStepRequest(
                            lease=lease, step_id="step-1", step_type=common_pb2.STEP_TYPE_LLM_CALL, result=output
                        ),
                        metadata=md,
                        timeout=30,
                    )
                    for lease in leases
                ]
                for outcome in await asyncio.gather(*steps, return_exceptions=True):
                    if isinstance(outcome, grpc.aio.AioRpcError):
                        failed("RecordStep", outcome)
            finished = [scheduler_pb2.CompleteRunRequest(lease=lease, output=output) for lease in leases]

    await asyncio.gather(*(worker(w) for w in range(workers)))
    await channel.close()
    if saga_channel is not None:
        await saga_channel.close()
    return {
        "first": first[0] if first else None,
        "done": done,
        "errors": errors,
        "details": details,
        "cpu_s": time.process_time() - cpu0,
    }


async def raw_workers(
    sync: Callable[[Any], Awaitable[Any]],
    dsn: str,
    proc_idx: int,
    workers: int,
    batch: int,
    pool_size: int,
    project: str = PROJECT,
) -> dict[str, Any]:
    """The claim cycle's store ceiling: awooop_workers' cycle (a claim carrying the last batch's
    completions, one Heartbeat for the batch's leases) as the scheduler's own statements (the
    generated claims_sql.claim_runs and leases_sql.heartbeat) on the scheduler's own pool (db.py
    create_pool, `pool_size` connections), with no gRPC and no service in between."""
    from services.common import db
    from services.common.settings import Settings
    from services.scheduler import claims_sql, leases_sql
    from services.scheduler.transitions import COMPLETE

    settings = Settings.from_env({"AWOOOP_DATABASE_URL": dsn, "AWOOOP_DB_POOL_MAX": str(pool_size)})
    pool = await db.create_pool(settings)
    first: list[float] = []
    done = 0
    errors: dict[str, int] = {}
    cpu0 = time.process_time()
    await sync(None)

    async def worker(w: int) -> None:
        nonlocal done
        worker_id = f"raw-{proc_idx}-{w}"
        empty = 0
        finished: list[tuple[Any, int]] = []
        while empty < 3:
            rows = await claims_sql.claim_runs(
                pool,
                run_ids=[r for r, _ in finished],
                attempts=[a for _, a in finished],
                outputs=['{"ok": true}'] * len(finished),
                allowed=list(COMPLETE.allowed),
                worker_projects=None,
                actor="service:bench-raw",
                principal=None,
                worker_id=worker_id,
                **NO_ROUTING.params(),
                claim_id=None,
                projects=[project],
                lease_secs=30.0,
                sorted_projects=None,
                count=1,
                max_runs=batch,
            )
            done += sum(1 for r in rows[: len(finished)] if r["run_id"] is not None)
            if sum(1 for r in rows[: len(finished)] if r["run_id"] is None):
                errors["NOT_COMPLETED"] = errors.get("NOT_COMPLETED", 0) + 1
            claimed = [(r["run_id"], r["attempt_count"]) for r in rows[len(finished) :] if r["run_id"] is not None]
            finished = []
            if not claimed:
                empty += 1
                continue
            empty = 0
            if not first:
                first.append(time.monotonic())
            await leases_sql.heartbeat(
                pool,
                run_ids=[r for r, _ in claimed],
                attempts=[a for _, a in claimed],
                worker_id=worker_id,
                worker_projects=None,
                lease_secs=30.0,
            )
            finished = claimed

    await asyncio.gather(*(worker(w) for w in range(workers)))
    await pool.close()
    return {"first": first[0] if first else None, "done": done, "errors": errors, "cpu_s": time.process_time() - cpu0}


async def pgqueuer_consumers(
    sync: Callable[[Any], Awaitable[Any]], dsn: str, consumers: int, batch: int
) -> dict[str, Any]:
    from datetime import timedelta

    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conns = [await asyncpg.connect(dsn) for _ in range(consumers)]
    first: list[float] = []
    done = 0
    qms = []
    for conn in conns:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            if not first:
                first.append(time.monotonic())
            done += 1

        qms.append(qm)
    cpu0 = time.process_time()
    await sync(None)
    # drain mode: each consumer stops once the queue is empty. dequeue_timeout only bounds how
    # long an idle consumer sleeps before re-checking (default 30 s), so the run ends promptly.
    await asyncio.gather(
        *(qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=0.5)) for qm in qms)
    )
    for conn in conns:
        await conn.close()
    return {"first": first[0] if first else None, "done": done, "errors": {}, "cpu_s": time.process_time() - cpu0}


# ---------------------------------------------------------------- the drain measurement


def _poll_until_done(
    dsn: str,
    remaining_sql: str,
    stop_at: float,
    out: dict[str, Any],
    server_pid: int | None,
    settings: dict[str, str] | None,
) -> None:
    """In a thread: polls `remaining_sql` every 10 ms; records when it first reads 0."""

    async def poll() -> None:
        conn = await asyncpg.connect(dsn, server_settings=settings)
        try:
            snap0 = cpu.snapshot(server_pid)
            t_snap0 = time.monotonic()
            while time.monotonic() < stop_at:
                left = await conn.fetchval(remaining_sql)
                if left == 0:
                    out["done_at"] = time.monotonic()
                    out["cpu"] = cpu.cores(snap0, cpu.snapshot(server_pid), out["done_at"] - t_snap0)
                    return
                await asyncio.sleep(0.01)
        finally:
            await conn.close()

    asyncio.run(poll())


def drain(
    fn_path: str,
    kwargs: list[dict[str, Any]],
    dsn: str,
    remaining_sql: str,
    items: int,
    server_pid: int | None = None,
    timeout: float = 240,
    poll_settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    watch: dict[str, Any] = {}
    poller: threading.Thread | None = None

    def go(_: list[Any]) -> float:
        nonlocal poller
        at = time.monotonic() + 0.05
        poller = threading.Thread(
            target=_poll_until_done,
            args=(dsn, remaining_sql, at + timeout, watch, server_pid, poll_settings),
            daemon=True,
        )
        poller.start()
        return at

    results = run_processes(fn_path, kwargs, go, timeout=timeout + 30)
    if poller is not None:
        poller.join()
    firsts = [r["first"] for r in results if r["first"] is not None]
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    if any(k.endswith("UNIMPLEMENTED") for k in errors):
        raise NotImplementedError("the scheduler answers UNIMPLEMENTED")
    if not firsts or "done_at" not in watch:
        raise RuntimeError(f"the queue did not drain: {results} {errors}")
    elapsed = watch["done_at"] - min(firsts)
    return {
        "items": items,
        "processed": sum(r["done"] for r in results),
        "seconds": round(elapsed, 3),
        "per_s": items / elapsed,
        "errors": errors,
        "client_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
        "cpu_cores": watch.get("cpu", {}),
    }


# ---------------------------------------------------------------- setup of each side


SEED_RUNS_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, input, created_at)
SELECT $1, 'api', 'claim-' || g, '{"n": 1}'::jsonb, now() - make_interval(secs => $2 - g)
  FROM generate_series(1, $2) AS g
"""


# what the drain polls for (every 10 ms): the unfinished runs, counted over the three partial
# indexes of live runs (claimable, leased, parked) as PgQueuer's poll counts its queue table, on a
# connection where sequential scans are priced out (the seed's statistics say every run is
# claimable, so the planner would read the table). A count of every run that is not COMPLETED read
# the finished ones too, 100 times a second: Postgres time charged to the awooop side of the
# comparison that grew as the drain went on.
LIVE_RUNS_SQL = """
SELECT (SELECT count(*) FROM awooop_run_state WHERE status IN ('PENDING', 'RESUMED'))
     + (SELECT count(*) FROM awooop_run_state WHERE status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL)
     + (SELECT count(*) FROM awooop_run_state WHERE status = 'WAITING_TOOL' AND worker_id IS NULL)
"""
LIVE_RUNS_POLL_SETTINGS = {"enable_seqscan": "off"}


async def seed_claimable(dsn: str, jobs: int, *first: tuple[Any, ...]) -> None:
    """Seed a fresh bench database with `jobs` claimable runs of PROJECT, after the statements
    in `first` (SQL, then its arguments), and VACUUM ANALYZE so the drain starts on fresh statistics."""
    conn = await asyncpg.connect(dsn)
    try:
        for sql, *args in first:
            await conn.execute(sql, *args)
        await conn.execute(SEED_RUNS_SQL, PROJECT, jobs)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def drain_awooop(
    cfg: Config,
    svc: procs.Service,
    metadata: tuple[tuple[str, str], ...],
    dsn: str,
    items: int,
    remaining_sql: str = LIVE_RUNS_SQL,
) -> dict[str, Any]:
    """`drain` with awooop workers (cfg.claim_workers spread over cfg.processes) against `svc`."""
    return await asyncio.to_thread(
        drain,
        "bench.claims:awooop_workers",
        [
            {
                "address": svc.address,
                "metadata": [list(m) for m in metadata],
                "proc_idx": i,
                "workers": w,
                "batch": cfg.claim_batch,
            }
            for i, w in enumerate(split(cfg.claim_workers, cfg.processes))
        ],
        dsn,
        remaining_sql,
        items,
        svc.pid,
        poll_settings=LIVE_RUNS_POLL_SETTINGS,
    )


async def _pgqueuer_db(stores: env.Stores, jobs: int) -> str:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    dsn = await stores.create_database("pgqueuer", migrated=False)
    conn = await asyncpg.connect(dsn)
    try:
        q = Queries(AsyncpgDriver(conn))
        await q.install()
        for i in range(0, jobs, 5000):
            n = min(5000, jobs - i)
            await q.enqueue(["noop"] * n, [None] * n, [0] * n)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return dsn


async def raw_drain(cfg: Config, dsn: str, items: int) -> dict[str, Any]:
    """`drain` with raw_workers: the store ceiling of drain_awooop, same workers and batch, the
    scheduler's pool size split over the load processes."""
    shares = split(cfg.claim_workers, cfg.processes)
    pool_size = max(1, -(-Settings().db_pool_max // len(shares)))
    return await asyncio.to_thread(
        drain,
        "bench.claims:raw_workers",
        [
            {"dsn": dsn, "proc_idx": i, "workers": w, "batch": cfg.claim_batch, "pool_size": pool_size}
            for i, w in enumerate(shares)
        ],
        dsn,
        LIVE_RUNS_SQL,
        items,
        poll_settings=LIVE_RUNS_POLL_SETTINGS,
    )


async def wal_lsn(dsn: str) -> int:
    """The server's WAL position in bytes (every database: the machine must be quiet)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    finally:
        await conn.close()


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    fig, ceiling_fig = figures
    shares = split(cfg.claim_workers, cfg.processes)
    n = cfg.claim_jobs

    # PgQueuer first: it needs nothing of ours
    pdsn = await _pgqueuer_db(stores, n)
    wal0 = await wal_lsn(pdsn)
    pgq = await asyncio.to_thread(
        drain,
        "bench.claims:pgqueuer_consumers",
        [{"dsn": pdsn, "consumers": c, "batch": cfg.claim_batch} for c in shares],
        pdsn,
        "SELECT count(*) FROM pgqueuer",
        n,
    )
    pgq["wal_bytes_per_item"] = round((await wal_lsn(pdsn) - wal0) / n)
    await stores.drop_database(pdsn)

    dsn = await stores.create_database("claims")
    await seed_claimable(dsn, n)
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    svc = await procs.spawn("scheduler", procs.service_env(dsn, stores.redis_url, stores.redis_prefix))
    try:
        wal0 = await wal_lsn(dsn)
        ours = await drain_awooop(cfg, svc, md, dsn, n)
        ours["wal_bytes_per_item"] = round((await wal_lsn(dsn) - wal0) / n)
        rss.record("scheduler", svc, f"after {n} claim cycles")
    finally:
        svc.stop()
    await stores.drop_database(dsn)
    fig.measured(ours["per_s"], pgq["per_s"], awooop=ours, pgqueuer=pgq, workers_per_process=shares)
    fig.details["bound"] = cpu.bound(ours["cpu_cores"], os.cpu_count() or 1)
    if ours["errors"]:
        fig.note = f"errors during the awooop drain: {ours['errors']}"

    # the store ceiling: the same drain as raw statements, on a database seeded the same way
    rdsn = await stores.create_database("claims-raw")
    await seed_claimable(rdsn, n)
    try:
        wal0 = await wal_lsn(rdsn)
        raw = await raw_drain(cfg, rdsn, n)
        raw["wal_bytes_per_item"] = round((await wal_lsn(rdsn) - wal0) / n)
    finally:
        await stores.drop_database(rdsn)
    ceiling_fig.measured(ours["per_s"], raw["per_s"], awooop=ours["cpu_cores"], store_ceiling=raw)
    if raw["errors"]:
        ceiling_fig.note = f"errors during the raw drain: {raw['errors']}"
