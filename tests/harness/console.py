"""The operator console against the real services (in-process gRPC servers on real ports, real
Postgres and Redis), plus helpers that put runs into the states the console shows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker import Client, to_struct
from services.common.runtime import Runtime
from services.console.app import ConsoleServer
from tests.harness import rpc_runs
from tests.harness.helpers import ROOT, eventually, key_of, start_with_gateway

PROJECT = "ops"


@dataclass
class ConsoleEnv:
    rt: Runtime
    console: ConsoleServer
    db: asyncpg.Connection
    admin_key: str  # admin in every project, like the `awooop up` dev key
    approver_key: str  # approver in PROJECT only
    viewer_key: str  # ingest role in PROJECT: may read, may not decide or repair
    worker: Client
    admin: Client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.console.port}"

    def addr(self, service: str) -> str:
        return f"127.0.0.1:{self.rt.ports[service]}"

    async def create(self, payload: dict[str, Any] | None = None, project: str = PROJECT) -> str:
        return await rpc_runs.ingest_run(self.admin, project, payload or {"ask": "scale"})

    async def claim(self, run_id: str, project: str = PROJECT) -> common_pb2.LeaseToken:
        return await rpc_runs.claim_one(self.worker, "console-test-worker", project, run_id)

    async def scale_step(self, lease: common_pb2.LeaseToken, step_id: str = "scale", params: Any = None) -> None:
        """A journaled tool call whose undo scales api back to 1 replica (through the gateway)."""
        await rpc_runs.scale_step(
            self.worker,
            lease,
            step_id,
            params or {"deployment": "api", "replicas": 3},
            {"previous_replicas": 1, "replicas": 3},
            undo={"deployment": "api", "replicas": 1},
            reason="scale back",
        )

    async def waiting_for_approval(
        self, summary: str = "Keep api at 3 replicas?", payload: Any = None
    ) -> tuple[str, str]:
        """A run with a compensatable step, now WAITING_APPROVAL; returns (run_id, token)."""
        run_id = await self.create(payload)
        lease = await self.claim(run_id)
        await self.scale_step(lease)
        return run_id, await rpc_runs.request_approval(self.worker, lease, summary)

    async def parked_on_wait(self, kind: int = scheduler_pb2.WAIT_KIND_TOKEN, timeout_s: int = 3600) -> tuple[str, str]:
        """A run parked on an open durable wait (WAITING_TOOL, no lease); returns (run_id, wait_id)."""
        run_id = await self.create()
        lease = await self.claim(run_id)
        timeout = Duration(seconds=timeout_s)
        created = await self.worker.call(
            self.worker.scheduler.CreateWait,
            scheduler_pb2.CreateWaitRequest(lease=lease, step_id="deploy-done", kind=kind, timeout=timeout),  # type: ignore[arg-type]
        )
        parked = await self.worker.call(
            self.worker.scheduler.AwaitWait,
            scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=created.wait.wait_id),
        )
        assert parked.parked
        return run_id, created.wait.wait_id

    async def failed_compensation(self) -> str:
        """A run whose compensation failed at the gateway (a fault injected for the tool)."""
        await self.db.execute(
            "INSERT INTO awooop_refgw_fault (project_id, tool_id, message) VALUES ($1, 'k8s_scale_deployment', $2)",
            PROJECT,
            "api down: 503 from the cluster",
        )
        run_id = await self.create()
        lease = await self.claim(run_id)
        await self.scale_step(lease)
        await self.worker.call(
            self.worker.scheduler.FailRun,
            scheduler_pb2.FailRunRequest(lease=lease, reason="downstream refused", retryable=False),
        )

        async def failed() -> bool:
            status = await self.db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id)
            return bool(status == "compensation_failed")

        await eventually(failed, timeout=30, what="compensation_failed")
        return run_id

    async def saga_status(self, run_id: str) -> str:
        return str(await self.db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id))

    async def run_demo(self, project: str, tmp_path: Path) -> dict[str, Any]:
        """`awooop demo` (a real CLI process driving real worker processes, one SIGKILLed) against
        these services; returns its JSON summary."""
        import json

        cmd = [sys.executable, "-m", "awooop.cli", "demo", "--json", "--project", project, "--lease-ttl", "1"]
        for service in ("ingest", "scheduler", "saga", "gateway"):
            cmd += [f"--{service}", self.addr(service)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
        env["AWOOOP_API_KEY"] = self.admin_key
        out = await asyncio.to_thread(
            subprocess.run, cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 0, out.stdout + out.stderr
        summary: dict[str, Any] = json.loads(out.stdout)
        assert summary["ok"], summary
        return summary


async def start_console_env(start_services: Any, make_key: Any, db: asyncpg.Connection, **console: Any) -> ConsoleEnv:
    _, rt = await start_with_gateway(start_services, reaper_interval=0.3, auth_cache_seconds=0)
    admin_key = key_of(await make_key("oncall-lead", {"*": ["admin"]}))
    approver_key = key_of(await make_key("approver-amy", {PROJECT: ["approver"]}))
    viewer_key = key_of(await make_key("viewer-vic", {PROJECT: ["ingest"]}))
    worker_key = key_of(await make_key("ops-worker", {PROJECT: ["worker"]}, "service"))
    addrs = {s: f"127.0.0.1:{p}" for s, p in rt.ports.items()}
    worker = Client(key=worker_key, **addrs)
    admin = Client(key=admin_key, **addrs)
    # the deployment the compensations scale back
    await admin.call(
        admin.gateway.ExecuteTool,
        tools_pb2.ExecuteToolRequest(
            tool_id="k8s_create_resource",
            params=to_struct({"kind": "Deployment", "name": "api", "spec": {"replicas": 1}}),
            idempotency_key="console-setup",
            project_id=PROJECT,
        ),
    )
    assert rt.ctx is not None
    settings = rt.ctx.settings.with_(**console)
    server = ConsoleServer(settings, addrs["scheduler"], addrs["saga"], pool=rt.ctx.pool)
    await server.start(port=0)
    return ConsoleEnv(rt, server, db, admin_key, approver_key, viewer_key, worker, admin)


async def stop_console_env(env: ConsoleEnv) -> None:
    await env.console.stop()
    await env.worker.close()
    await env.admin.close()


__all__ = ["PROJECT", "ROOT", "ConsoleEnv", "start_console_env", "stop_console_env"]
