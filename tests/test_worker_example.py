"""examples/worker.py (the README's worker) as a real process against real services: it scales
through the gateway, asks for approval, the printed `awooop runs approve ...` line is run as
printed, and the worker finishes the run on its second claim without scaling again."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker import Client, to_struct
from tests.harness.helpers import ROOT, eventually


async def test_readme_worker_runs_a_run_through_approval(start_services: Any, make_key: Any, db: Any) -> None:
    gw = await start_services("gateway")
    gateway = f"127.0.0.1:{gw.ports['gateway']}"
    rt = await start_services("ingest", "scheduler", "saga", gateway_addr=gateway)
    addr = {s: f"127.0.0.1:{p}" for s, p in rt.ports.items()} | {"gateway": gateway}
    key = (await make_key("platform-team", {"demo": ["admin"]}))[0][1].removeprefix("Bearer ")
    client = Client(key=key, **addr)
    await client.call(
        client.gateway.ExecuteTool,
        tools_pb2.ExecuteToolRequest(
            tool_id="k8s_create_resource",
            params=to_struct({"kind": "Deployment", "name": "api", "spec": {"replicas": 1}}),
            idempotency_key="setup",
            project_id="demo",
        ),
    )
    resp = await client.call(
        client.ingest.IngestEvent,
        ingest_pb2.IngestEventRequest(
            project_id="demo", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=to_struct({"update_id": 7})
        ),
    )
    run_id = resp.outcomes[0].run_id
    await client.close()

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_API_KEY": key,
        "AWOOOP_SCHEDULER_ADDR": addr["scheduler"],
        "AWOOOP_SAGA_ADDR": addr["saga"],
        "AWOOOP_GATEWAY_ADDR": gateway,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "worker.py"), env=env, cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith(f"awooop runs approve {run_id} --token "), line
        assert await db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "WAITING_APPROVAL"

        # the printed command, as an operator would paste it
        approve = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "awooop.cli", *shlex.split(line)[1:], "--scheduler", addr["scheduler"]],
            env=env,
            cwd=Path(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert approve.returncode == 0, approve.stderr
        assert approve.stdout.strip() == f"run {run_id} approved: now RESUMED"

        async def completed() -> bool:
            return await db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "COMPLETED"

        await eventually(completed, timeout=30, what="the run to complete after approval")
        proc.send_signal(signal.SIGTERM)
        # an idle worker stops when its long-poll in flight ends (claim_wait, 20 s by default)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = json.loads(await db.fetchval("SELECT output FROM awooop_run_state WHERE run_id = $1", run_id))
    assert output == {"kept": {"deployment": "api", "replicas": 3}}
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = 'demo'") == 3
    executed = await db.fetchval(
        "SELECT count(*) FROM awooop_refgw_request WHERE tool_id = 'k8s_scale_deployment' AND outcome = 'executed'"
    )
    assert executed == 1  # the second claim skipped the journaled scale
