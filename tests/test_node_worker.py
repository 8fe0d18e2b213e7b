"""examples/node-worker (a TypeScript worker on the @awooop/worker package, packages/worker-ts)
built and run as a real node process against the real services, addressed as the Python SDK and
the CLI are (AWOOOP_*_ADDR, or AWOOOP_*_PORT): the demo story of examples/worker.py. A run's
handler diagnoses, scales `api` through the reference gateway with a compensation, sleeps (a
durable wait: the run parks and is claimed again), and asks for approval, printing the `awooop
runs approve` line; the rejected run is compensated (api back to 1 replica), the approved one
COMPLETED on a later claim without scaling again, its /metrics and /healthz served over HTTP;
SIGTERM then stops the worker with exit code 0. The worker runs with the command its Kubernetes
Deployment gives (node itself); under `npm start` SIGTERM reaches node too, which drains before
npm exits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.worker import to_struct
from tests.harness.helpers import ROOT, eventually, start_with_gateway
from tests.harness.ts_package import NPM_QUIET, build_package, need, npm

EXAMPLE = ROOT / "examples" / "node-worker"
PROJECT = "node"


def deployment_command() -> list[str]:
    """The command examples/node-worker/kubernetes.yaml runs (node, never npm), with this node."""
    docs = [d for d in yaml.safe_load_all((EXAMPLE / "kubernetes.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command: list[str] = container["command"]
    assert command[0] == "node", command
    return [need("node"), *command[1:]]


async def http_address(err_log: Path) -> str:
    """Where the worker serves /metrics and /healthz, from its "worker started" log line."""

    async def started() -> str:
        for line in err_log.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line)["message"] == "worker started":
                return str(json.loads(line)["http"])
        return ""

    return await eventually(started, timeout=30, what="the worker's start")


def sample(metrics: str, name: str) -> float:
    (value,) = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + " ")]
    return value


@pytest.fixture(scope="module")
def example() -> Path:
    """The package built, then the example as its README says: `npm ci && npm run build`."""
    build_package()
    npm("ci", *NPM_QUIET, cwd=EXAMPLE)
    npm("run", "build", cwd=EXAMPLE)
    return EXAMPLE


@pytest.mark.parametrize("addressed_by", ["ADDR", "PORT"])
async def test_node_worker_runs_the_demo_story_to_compensated_and_to_completed(
    addressed_by: str, example: Path, start_services: Any, make_key: Any, db: Any, channels: Any, tmp_path: Path
) -> None:
    _, rt = await start_with_gateway(start_services, wait_sweep_interval=0.2)
    ports = rt.ports
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT)
    worker_md = await make_key("node-team", {PROJECT: ["ingest", "worker"]})
    admin_md = await make_key("boss", {PROJECT: ["admin"]})
    # the settings the Python SDK and the CLI read: an address, or the port the service listens on
    where = {
        f"AWOOOP_{s.upper()}_{addressed_by}": f"127.0.0.1:{ports[s]}" if addressed_by == "ADDR" else str(ports[s])
        for s in ("scheduler", "saga", "gateway")
    }
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
        | where
        | {"AWOOOP_API_KEY": worker_md[0][1].removeprefix("Bearer "), "AWOOOP_PROJECT": PROJECT}
        | {"SETTLE_SECONDS": "0.5", "AWOOOP_WORKER_HTTP_PORT": "0"}
    )
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))

    async def replicas() -> int:
        return await db.fetchval(  # type: ignore[no-any-return]
            "SELECT replicas FROM awooop_refgw_deployment WHERE project_id = $1 AND name = 'api'", PROJECT
        )

    async def run_row(run_id: str) -> Any:
        return await db.fetchrow("SELECT status, saga_status, output FROM awooop_run_state WHERE run_id = $1", run_id)

    err_log = tmp_path / "worker.err"
    with open(err_log, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *deployment_command(), cwd=example, env=env, stdout=subprocess.PIPE, stderr=err
        )
    try:
        assert proc.stdout is not None

        async def story(update_id: int, decision: scheduler_pb2.Decision.ValueType) -> str:
            """A new event's run: the worker prints the approve line; the run is decided as asked."""
            created = await ingest.IngestEvent(
                ingest_pb2.IngestEventRequest(
                    project_id=PROJECT,
                    channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM,
                    payload=to_struct({"update_id": update_id}),
                ),
                metadata=worker_md,
            )
            run_id: str = created.outcomes[0].run_id
            assert proc.stdout is not None
            try:
                line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
            except TimeoutError:
                raise AssertionError(err_log.read_text(errors="replace")) from None
            assert line.startswith(f"awooop runs approve {run_id} --token "), (line, err_log.read_text())
            assert (await run_row(run_id))["status"] == "WAITING_APPROVAL"
            assert await replicas() == 3  # scaled through the gateway before asking
            await scheduler.DecideApproval(
                scheduler_pb2.DecideApprovalRequest(
                    run_id=run_id, approval_token=line.rsplit(" ", 1)[1], decision=decision, reason="tested"
                ),
                metadata=admin_md,
            )
            return run_id

        # rejected: the saga runs the scale's compensation (the TS worker's command) through the gateway
        rejected = await story(41, scheduler_pb2.DECISION_REJECT)

        async def compensated() -> bool:
            return bool((await run_row(rejected))["saga_status"] == "compensated")

        await eventually(compensated, timeout=30, what="the rejected run compensated")
        assert (await run_row(rejected))["status"] == "FAILED" and await replicas() == 1

        # approved: claimed again, the done steps skipped, completed with the handler's output
        approved = await story(42, scheduler_pb2.DECISION_APPROVE)
        # the example's watcher follows it live to its end (watch.ts: @awooop/worker's watchRun)
        watch = await asyncio.create_subprocess_exec(
            need("node"),
            "dist/watch.js",
            approved,
            cwd=example,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        async def completed() -> bool:
            return bool((await run_row(approved))["status"] == "COMPLETED")

        await eventually(completed, timeout=30, what="the approved run completed")
        assert json.loads((await run_row(approved))["output"]) == {"kept": {"deployment": "api", "replicas": 3}}
        out, watch_err = await asyncio.wait_for(watch.communicate(), 60)
        assert watch.returncode == 0, watch_err.decode()
        lines = out.decode().splitlines()
        # its progress event once (keyed: the second attempt's emit added nothing), in order, then the output
        progress = [line.split(" ", 3) for line in lines if " progress " in line]
        assert [(p[1], p[2], json.loads(p[3])) for p in progress] == [
            ("progress", "diagnosed", {"cause": "cpu saturated", "next": "scale api to 3"})
        ]
        offsets = [int(line.split()[0]) for line in lines[:-1]]
        assert offsets == list(range(1, len(offsets) + 1))
        status, output = lines[-1].removeprefix("ended ").split(" ", 1)
        assert status == "RUN_STATUS_COMPLETED"
        assert json.loads(output) == {"kept": {"deployment": "api", "replicas": 3}}
        # the pod's endpoint: the Python SDK's metrics for what this worker did, and its liveness
        http = await http_address(err_log)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{http}/healthz") as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "serving"
            async with session.get(f"http://{http}/metrics") as resp:
                assert resp.status == 200
                metrics = await resp.text()
        assert sample(metrics, 'awooop_worker_runs_total{outcome="completed"}') == 1
        assert sample(metrics, 'awooop_worker_runs_total{outcome="waiting_approval"}') == 2
        assert sample(metrics, 'awooop_worker_runs_total{outcome="parked"}') == 2  # the sleeps
        assert sample(metrics, 'awooop_worker_steps_total{action="skip"}') >= 4  # done steps on later attempts
        assert sample(metrics, "awooop_worker_leases_lost_total") == 0
        assert sample(metrics, "awooop_worker_leases_held") == 0
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, err_log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # the approved run scaled once: the attempts after the sleep and after the approval skipped the
    # journaled steps (the park spent attempt 2's token, so the sleep resumed on attempt 3)
    steps = await db.fetch(
        "SELECT step_id, step_type, status, attempt FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq", approved
    )
    assert [(s["step_id"], s["step_type"], s["status"], s["attempt"]) for s in steps] == [
        ("diagnose", "llm_call", "completed", 1),
        ("scale", "tool_call", "completed", 1),
        ("settle", "callback", "completed", 1),
        ("settle:outcome", "callback", "completed", 3),
        ("approval", "approval_request", "completed", 4),
    ]
    calls = await db.fetchrow(
        "SELECT count(*) AS keys, sum(replays) AS replays FROM awooop_refgw_call WHERE project_id = $1", PROJECT
    )
    assert (calls["keys"], calls["replays"]) == (3, 0)  # two scales and one compensation, each run once


async def test_npm_start_hands_sigterm_to_node_which_drains_before_npm_exits(
    example: Path, start_services: Any, make_key: Any, tmp_path: Path
) -> None:
    """`npm start` runs the script through sh, which would keep SIGTERM from node (npm exits, node
    runs on, nothing drains): the script execs node, so npm's SIGTERM reaches the Worker, which
    stops and exits, and npm exits with it."""
    _, rt = await start_with_gateway(start_services)
    worker_md = await make_key("node-npm", {PROJECT: ["worker"]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_API_KEY": worker_md[0][1].removeprefix("Bearer "),
        "AWOOOP_PROJECT": PROJECT,
        "AWOOOP_SCHEDULER_ADDR": f"127.0.0.1:{rt.ports['scheduler']}",
        "AWOOOP_SAGA_ADDR": f"127.0.0.1:{rt.ports['saga']}",
        "AWOOOP_GATEWAY_ADDR": f"127.0.0.1:{rt.ports['gateway']}",
        "AWOOOP_WORKER_HTTP_PORT": "0",
    }
    err_log = tmp_path / "npm.err"
    with open(err_log, "wb") as err:
        npm_proc = subprocess.Popen(
            [need("npm"), "start", "--silent"], cwd=example, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        http = await http_address(err_log)
        async with aiohttp.ClientSession() as session, session.get(f"http://{http}/healthz") as resp:
            node_pid = int((await resp.json())["worker_id"].rsplit("-", 2)[1])  # <hostname>-<pid>-<random>
        assert node_pid != npm_proc.pid
        npm_proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(npm_proc.wait, 60) == 0, err_log.read_text()
        log = [json.loads(line)["message"] for line in err_log.read_text().splitlines() if line.startswith("{")]
        assert "worker stopping: no new claims; handlers finish or are handed back" in log
        assert log[-1] == "worker stopped", log
        # node exited before npm did: no worker left running without a word
        with pytest.raises(ProcessLookupError):
            os.kill(node_pid, 0)
    finally:
        if npm_proc.poll() is None:
            npm_proc.kill()
            npm_proc.wait()
