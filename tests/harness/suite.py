"""The services the worker-level tests run against (tests/test_worker_sdk.py, test_ts_worker.py,
test_durable_waits.py, test_child_runs.py): the reference gateway, then ingest, scheduler and saga
with loops quick enough for a test to watch them act, a worker key and an admin client of the
test's project, and what those tests ask of them. Each test file subclasses `Suite` with its own
helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

import asyncpg

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Client, Worker, to_struct
from services.common.runtime import Runtime
from tests.harness.helpers import key_of, start_with_gateway
from tests.harness.rpc_proxy import RpcProxy

# the reaper, the retry backoff and the compensation driver act within a fraction of a second;
# keys are checked on every call (a test that changes a key sees it at once)
QUICK = {"reaper_interval": 0.1, "retry_backoff": 0.05, "compensation_interval": 0.2, "auth_cache_seconds": 0}


class Addresses(TypedDict):
    ingest: str
    scheduler: str
    saga: str
    gateway: str


def addresses(rt: Runtime) -> Addresses:
    """Client addresses of rt's services (rt from start_suite: its ports name the gateway's too)."""
    ports = rt.ports
    return Addresses(
        ingest=f"127.0.0.1:{ports['ingest']}",
        scheduler=f"127.0.0.1:{ports['scheduler']}",
        saga=f"127.0.0.1:{ports['saga']}",
        gateway=f"127.0.0.1:{ports['gateway']}",
    )


async def start_suite(
    start_services: Any, make_key: Any, project: str, *, worker: str, admin: str, **settings: Any
) -> tuple[Runtime, str, Client, Runtime]:
    """The services (QUICK, then settings), the key of a worker service principal of project and an
    admin client of project: (runtime, worker key, admin client (the caller closes it), the
    reference gateway's runtime)."""
    gw, rt = await start_with_gateway(start_services, **(QUICK | settings))
    worker_key = key_of(await make_key(worker, {project: ["worker"]}, "service"))
    admin_client = Client(key=key_of(await make_key(admin, {project: ["admin"]})), **addresses(rt))
    return rt, worker_key, admin_client, gw


@dataclass
class Suite:
    rt: Runtime
    project: str
    worker_key: str
    admin: Client

    # how long a Worker's claims long-poll unless a test says otherwise
    claim_wait: ClassVar[float] = 1

    @property
    def scheduler(self) -> str:
        return f"127.0.0.1:{self.rt.ports['scheduler']}"

    @property
    def saga(self) -> str:
        return f"127.0.0.1:{self.rt.ports['saga']}"

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.rt.ports['gateway']}"

    def worker(self, handler: Any, **kw: Any) -> Worker:
        """An SDK Worker of the project with the worker key: heartbeats every 0.2 s, 30 s leases."""
        kw.setdefault("heartbeat_interval", 0.2)
        kw.setdefault("lease_ttl", 30)
        kw.setdefault("claim_wait", self.claim_wait)
        return Worker(
            handler, projects=[self.project], key=self.worker_key, scheduler=self.scheduler, saga=self.saga, **kw
        )

    async def ingest_each(self, inputs: Sequence[dict[str, Any] | None], **kw: Any) -> list[str]:
        """One API-channel run per input (None: no input), an IngestEvent call each, in order (so
        they are created, and claimed, in that order); kw: the run options of each."""
        out: list[str] = []
        for given in inputs:
            resp = await self.admin.call(
                self.admin.ingest.IngestEvent,
                ingest_pb2.IngestEventRequest(
                    project_id=self.project,
                    channel_type=common_pb2.CHANNEL_TYPE_API,
                    provider_event_id=f"evt-{os.urandom(6).hex()}",
                    payload=to_struct({"n": len(out)}),
                    input=None if given is None else to_struct(given),
                    **kw,
                ),
            )
            out.append(resp.outcomes[0].run_id)
        return out

    async def run(self, run_id: str) -> common_pb2.Run:
        return (await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run

    async def history(self, run_id: str) -> list[scheduler_pb2.RunEvent]:
        resp = await self.admin.call(
            self.admin.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=run_id)
        )
        return list(resp.events)

    @contextlib.asynccontextmanager
    async def scheduler_proxy(self) -> AsyncIterator[RpcProxy]:
        """A proxy in front of the scheduler, for a worker a test points at it (to hold or fail its calls)."""
        proxy = await RpcProxy(self.scheduler).start()
        try:
            yield proxy
        finally:
            await proxy.stop()

    async def run_rows(self, db: asyncpg.Connection) -> dict[str, Any]:
        """run id -> the project's run rows as the SIGTERM tests read them."""
        rows = await db.fetch(
            "SELECT run_id, status, attempt_count, released_count, lease_until, worker_id, output "
            "FROM awooop_run_state WHERE project_id = $1",
            self.project,
        )
        return {str(r["run_id"]): r for r in rows}

    async def assert_handed_back(self, row: Any) -> None:
        """PENDING again right after the worker exited, with a 60 s lease: only a hand-back explains it."""
        assert row["status"] == "PENDING" and row["lease_until"] is None and row["worker_id"] is None
        assert row["attempt_count"] == 1 and row["released_count"] == 1  # the attempt is not counted as used
        last = (await self.history(str(row["run_id"])))[-1]
        assert last.action == "RELEASED" and "shutting down" in last.reason


async def stop_worker(worker: Worker, task: asyncio.Task[None]) -> None:
    """Stops an SDK Worker running as task and waits for it to finish."""
    worker.stop()
    await asyncio.wait_for(task, 30)
