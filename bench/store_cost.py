"""What the store writes and burns per run, against PgQueuer per job, in the same run.

awooop: N events ingested through the ingest service (IngestEvents, batches of BATCH), then
drained by bench.claims.awooop_workers through a real scheduler and saga service: each run is
claimed, heartbeated, journals one step (RecordStep, as the SDK's ctx.step) and is completed by
the worker's next claim. PgQueuer: N no-op jobs enqueued in batches of BATCH
(Queries.enqueue), then drained by bench.claims.pgqueuer_consumers (its default, logged tables).

Per completed item, over both phases (enqueue and drain):
- WAL bytes: pg_current_wal_lsn() after minus before (the server's, every database: a quiet
  machine is required, and cpu.py's `outside` share says whether it was);
- Postgres CPU: the user + system time of every postgres process in the window (bench/cpu.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from bench import claims, cpu, env, procs
from bench.config import Config
from bench.ingest import ingest_event
from bench.loadgen import split
from bench.report import Figure

PROJECT = claims.PROJECT
BATCH = 100  # events per IngestEvents call, jobs per PgQueuer enqueue


def declare(cfg: Config) -> list[Figure]:
    cycle = "ingest → claim → heartbeat → one journaled step → complete"
    pgq = "PgQueuer: enqueue → dequeue → complete a no-op job"
    return [
        Figure(
            "store_wal_per_run",
            f"WAL bytes per completed run ({cycle})",
            "B",
            "ratio_le",
            1.5,
            "≤ 1.5 × (and ≤ 2,500 B)",
            baseline_label=f"{pgq}, WAL bytes per job",
            baseline_unit="B",
        ),
        Figure(
            "store_pg_cpu_per_run",
            f"Postgres CPU per completed run ({cycle})",
            "ms",
            "report",
            None,
            "reported",
            baseline_label=f"{pgq}, Postgres CPU per job",
            baseline_unit="ms",
        ),
    ]


class _Window:
    """WAL position and Postgres CPU at the start of a measured stretch."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.drained: dict[str, Any] = {}  # what the drain in the window reported

    async def __aenter__(self) -> _Window:
        self.lsn0 = await claims.wal_lsn(self.dsn)
        self.snap0, self.t0 = cpu.snapshot(), time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.wal_bytes = await claims.wal_lsn(self.dsn) - self.lsn0
        self.seconds = time.monotonic() - self.t0
        self.cores = cpu.cores(self.snap0, cpu.snapshot(), self.seconds)

    def per_item(self, items: int) -> dict[str, Any]:
        pg_cpu_ms = self.cores.get("postgres", 0.0) * self.seconds * 1000
        return {
            "lsn": [self.lsn0, self.lsn0 + self.wal_bytes],
            "wal_bytes": round(self.wal_bytes / items),
            "pg_cpu_ms": round(pg_cpu_ms / items, 4),
            "seconds": round(self.seconds, 2),
            "cpu_cores": self.cores,
        }


async def _pgqueuer(stores: env.Stores, cfg: Config, n: int) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    dsn = await stores.create_database("pgqueuer-cost", migrated=False)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
            await conn.execute("VACUUM ANALYZE")
            async with _Window(dsn) as w:
                q = Queries(AsyncpgDriver(conn))
                for i in range(0, n, BATCH):
                    k = min(BATCH, n - i)
                    await q.enqueue(["noop"] * k, [None] * k, [0] * k)
                w.drained = await asyncio.to_thread(
                    claims.drain,
                    "bench.claims:pgqueuer_consumers",
                    [
                        {"dsn": dsn, "consumers": c, "batch": cfg.claim_batch}
                        for c in split(cfg.claim_workers, cfg.processes)
                    ],
                    dsn,
                    "SELECT count(*) FROM pgqueuer",
                    n,
                )
        finally:
            await conn.close()
        return {**w.per_item(n), "drain": w.drained, "relations": await relations(dsn)}
    finally:
        await stores.drop_database(dsn)


async def _awooop(stores: env.Stores, cfg: Config, n: int) -> dict[str, Any]:
    dsn = await stores.create_database("store-cost")
    md = await env.bench_key(dsn, PROJECT, ("worker", "ingest"))
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
    try:
        services = [await procs.spawn(name, base, "store-cost") for name in ("scheduler", "ingest", "saga")]
        try:
            w = await _cycle(dsn, md, services, cfg, n)
        finally:
            for svc in services:
                svc.stop()
        # read once the services are gone: a backend reports its counters when its connection ends
        return {
            **w.per_item(n),
            "drain": w.drained,
            "writes_per_run": await _table_writes(dsn, n),
            "relations": await relations(dsn),
        }
    finally:
        await stores.drop_database(dsn)


# each table's and index's file in the bench database, for WAL records that name it (wal_composition)
RELATIONS_SQL = """
SELECT pg_relation_filenode(oid) AS node, relname::text AS name FROM pg_class WHERE relkind IN ('r', 'i')
"""


async def relations(dsn: str) -> dict[int, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["node"]: r["name"] for r in await conn.fetch(RELATIONS_SQL) if r["node"]}
    finally:
        await conn.close()


async def _cycle(
    dsn: str, md: tuple[tuple[str, str], ...], services: list[procs.Service], cfg: Config, n: int
) -> _Window:
    """The measured window: n events ingested, then drained with one journaled step per run."""
    import grpc

    from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    scheduler, ingest, saga = services
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    async with grpc.aio.insecure_channel(ingest.address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        async with _Window(dsn) as w:
            for i in range(0, n, BATCH):
                events = [ingest_event(ingest_pb2, PROJECT, uuid.uuid4().hex) for _ in range(min(BATCH, n - i))]
                await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=events), metadata=md, timeout=60)
            w.drained = await asyncio.to_thread(
                claims.drain,
                "bench.claims:awooop_workers",
                [
                    {
                        "address": scheduler.address,
                        "metadata": [list(m) for m in md],
                        "proc_idx": i,
                        "workers": k,
                        "batch": cfg.claim_batch,
                        "saga_address": saga.address,
                    }
                    for i, k in enumerate(split(cfg.claim_workers, cfg.processes))
                ],
                dsn,
                claims.LIVE_RUNS_SQL,
                n,
                scheduler.pid,
                poll_settings=claims.LIVE_RUNS_POLL_SETTINGS,
            )
    return w


# rows written per table of the bench database, and the indexes each heap row goes through
TABLE_WRITES_SQL = """
SELECT t.relname::text AS name, t.n_tup_ins AS ins, t.n_tup_upd AS upd, t.n_tup_hot_upd AS hot,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) AS indexes
  FROM pg_stat_user_tables t
 WHERE t.n_tup_ins + t.n_tup_upd > 0
 ORDER BY t.n_tup_ins + t.n_tup_upd DESC
"""


OTHER_BACKENDS_SQL = """
SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


async def _table_writes(dsn: str, items: int) -> dict[str, dict[str, float]]:
    conn = await asyncpg.connect(dsn)
    try:
        # a backend reports its counters as it exits: wait until the services' backends are gone
        for _ in range(500):
            if not await conn.fetchval(OTHER_BACKENDS_SQL):
                break
            await asyncio.sleep(0.01)
        rows = await conn.fetch(TABLE_WRITES_SQL)
    finally:
        await conn.close()
    return {
        r["name"]: {
            "inserts": round(r["ins"] / items, 2),
            "updates": round(r["upd"] / items, 2),
            "hot_updates": round(r["hot"] / items, 2),
            "indexes": r["indexes"],
        }
        for r in rows
    }


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    wal_fig, cpu_fig = figures
    n = cfg.store_cost_runs
    pgq = await _pgqueuer(stores, cfg, n)
    ours = await _awooop(stores, cfg, n)
    wal_fig.measured(ours["wal_bytes"], pgq["wal_bytes"], awooop=ours, pgqueuer=pgq, items=n)
    if ours["wal_bytes"] > 2500:
        wal_fig.note = f"{ours['wal_bytes']} B per run: above the 2,500 B target"
    cpu_fig.measured(ours["pg_cpu_ms"], pgq["pg_cpu_ms"], items=n)
    errors = ours["drain"]["errors"]
    if errors:
        wal_fig.note = f"errors during the awooop drain: {errors}"
