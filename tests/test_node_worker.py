"""examples/node-worker (a worker in Node with @grpc/grpc-js and @grpc/proto-loader on protos/) as a
real process against the real services: a long-poll claim woken by a new run, a heartbeat, a tool
step with compensation, an LLM step, completion, and LEASE_LOST read from google.rpc.ErrorInfo."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.worker import to_struct
from tests.harness.helpers import ROOT

EXAMPLE = ROOT / "examples" / "node-worker"


def _need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        if os.environ.get("CI") == "true":  # CI installs Node (.ci/install-debian); missing is a failure there
            pytest.fail(f"{program} is not installed")
        pytest.skip(f"{program} is not installed")
    return found


@pytest.fixture(scope="module")
def node_modules() -> str:
    """`npm ci` in the example's own directory, from its committed package-lock.json."""
    node, npm = _need("node"), _need("npm")
    out = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return node


async def _next_event(stdout: asyncio.StreamReader, timeout: float = 30) -> dict[str, Any]:
    line = await asyncio.wait_for(stdout.readline(), timeout)
    assert line, "the node worker exited early"
    return json.loads(line)  # type: ignore[no-any-return]


@pytest.mark.parametrize("addressed_by", ["ADDR", "PORT"])
async def test_node_worker_runs_a_run_and_reads_lease_lost(
    addressed_by: str, node_modules: str, start_services: Any, make_key: Any, db: Any, channels: Any
) -> None:
    rt = await start_services("ingest", "scheduler", "saga")
    md = await make_key("node-team", {"node": ["ingest", "worker"]})
    # the settings the Python SDK and the CLI read: an address, or the port the service listens on
    where = {
        f"AWOOOP_{s.upper()}_{addressed_by}": f"127.0.0.1:{rt.ports[s]}" if addressed_by == "ADDR" else str(rt.ports[s])
        for s in ("scheduler", "saga")
    }
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
        | where
        | {
            "AWOOOP_API_KEY": md[0][1].removeprefix("Bearer "),
            "AWOOOP_PROJECT": "node",
            "AWOOOP_RUNS": "1",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        node_modules, "worker.js", cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert (await _next_event(proc.stdout))["event"] == "started"
        # the worker is (or is about to be) in its long-poll; the new run wakes it
        ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
        created = await ingest.IngestEvent(
            ingest_pb2.IngestEventRequest(
                project_id="node", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=to_struct({"update_id": 41})
            ),
            metadata=md,
        )
        run_id = created.outcomes[0].run_id

        events: dict[str, dict[str, Any]] = {}
        while "lease_lost" not in events:
            event = await _next_event(proc.stdout)
            assert event["event"] not in ("error", "unexpected_success"), event
            events[event["event"]] = event
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    assert events["claimed"]["run_id"] == run_id and events["claimed"]["input"] == {"update_id": 41}
    assert events["heartbeat"]["outcome"] == "LEASE_OUTCOME_RENEWED"  # enums as strings (proto-loader enums: String)
    assert events["begin_step"]["action"] == "STEP_ACTION_EXECUTE"
    assert events["begin_step"]["idempotency_key"] == f"{run_id}:scale"
    assert events["record_step"] == {
        "event": "record_step",
        "step_id": "diagnose",
        "recorded": True,
        "status": "STEP_STATUS_COMPLETED",
    }
    assert events["completed"]["status"] == "RUN_STATUS_COMPLETED"
    # a lost lease: an outcome in Heartbeat's body, an error with ErrorInfo from other calls
    assert events["heartbeat_after_complete"]["outcome"] == "LEASE_OUTCOME_LEASE_LOST"
    lost = events["lease_lost"]
    assert lost["code_name"] == "FAILED_PRECONDITION" and lost["reason"] == "LEASE_LOST", lost
    assert lost["domain"] == "awooop" and lost["metadata"]["run_id"] == run_id, lost

    # what the store holds: the run completed, the tool step with its undo command, the LLM step
    row = await db.fetchrow("SELECT status, output FROM awooop_run_state WHERE run_id = $1", run_id)
    assert row["status"] == "COMPLETED" and json.loads(row["output"]) == {"scaled_to": 3}
    steps = {
        r["step_id"]: r
        for r in await db.fetch(
            "SELECT step_id, step_type, status, compensation_cmd FROM awooop_saga_step WHERE run_id = $1", run_id
        )
    }
    assert set(steps) == {"scale", "diagnose"}
    assert steps["scale"]["step_type"] == "tool_call" and steps["scale"]["status"] == "completed"
    assert json.loads(steps["scale"]["compensation_cmd"])["tool_id"] == "k8s_scale_deployment"
    assert steps["diagnose"]["step_type"] == "llm_call" and steps["diagnose"]["status"] == "completed"
