"""The flow-control tests' services and calls: ingest and a scheduler in one runtime, the keys
of each role, and a watcher of how many leased runs each concurrency key holds."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import asyncpg

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common.runtime import Runtime

Metadata = tuple[tuple[str, str], ...]


@dataclass
class Flow:
    rt: Runtime
    ingest: ingest_pb2_grpc.IngestServiceStub
    sched: scheduler_pb2_grpc.SchedulerServiceStub
    db: asyncpg.Connection
    creator: Metadata  # ingest in p, q
    worker: Metadata  # worker in p, q
    admin: Metadata  # admin in p
    outsider: Metadata  # worker in p, not admin

    async def create(self, key: str, project: str = "p", **kw: Any) -> common_pb2.Run:
        resp = await self.ingest.CreateRun(
            ingest_pb2.CreateRunRequest(project_id=project, idempotency_key=key, **kw), metadata=self.creator
        )
        return resp.run

    async def claim(self, projects: list[str] | None = None, **kw: Any) -> list[pb.ClaimedRun]:
        req = pb.ClaimRunsRequest(worker_id="w", project_ids=projects or ["p"], **kw)
        return list((await self.sched.ClaimRuns(req, metadata=self.worker)).runs)

    async def fail(self, c: pb.ClaimedRun, **kw: Any) -> common_pb2.Run:
        kw.setdefault("retryable", True)
        resp = await self.sched.FailRun(pb.FailRunRequest(lease=c.lease, reason="boom", **kw), metadata=self.worker)
        return resp.run

    async def delay_of(self, run_id: str) -> float:
        """Seconds between the failure (updated_at, the statement's now()) and not_before."""
        value = await self.db.fetchval(
            "SELECT extract(epoch FROM not_before - updated_at)::float8 FROM awooop_run_state WHERE run_id = $1",
            uuid.UUID(run_id),
        )
        return float(value)

    async def make_ready(self, run_id: str) -> None:
        """Ends a backoff now (the test does not wait out long delays)."""
        await self.db.execute("UPDATE awooop_run_state SET not_before = now() WHERE run_id = $1", uuid.UUID(run_id))


async def serve(start_services: Any, channels: Any, db: asyncpg.Connection, make_key: Any, **overrides: Any) -> Flow:
    overrides.setdefault("reaper_interval", 3600)
    overrides.setdefault("retry_jitter", 0.0)
    rt = await start_services("ingest", "scheduler", **overrides)
    return Flow(
        rt=rt,
        ingest=ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"])),
        sched=scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"])),
        db=db,
        creator=await make_key("creator", {"p": ["ingest"], "q": ["ingest"]}, "service"),
        worker=await make_key("worker", {"p": ["worker"], "q": ["worker"]}, "service"),
        admin=await make_key("root", {"p": ["admin"]}),
        outsider=await make_key("eve", {"p": ["worker"]}),
    )


class LeasedPerKey:
    """The most leased runs each concurrency key held in any snapshot of the store, read as often
    as a second connection can while run() goes (until done is set)."""

    SQL = """SELECT k, count(*) AS n
               FROM awooop_run_state CROSS JOIN LATERAL unnest(concurrency_keys) AS k
              WHERE status IN ('RUNNING', 'WAITING_TOOL') AND worker_id IS NOT NULL GROUP BY k"""

    def __init__(self, dsn: str, done: asyncio.Event) -> None:
        self.dsn, self.done = dsn, done
        self.worst: Counter[str] = Counter()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not self.done.is_set():
                for r in await conn.fetch(self.SQL):
                    self.worst[r["k"]] = max(self.worst[r["k"]], r["n"])
                await asyncio.sleep(0)
        finally:
            await conn.close()
