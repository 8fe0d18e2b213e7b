"""`awooop runs ...` as real subprocesses against real servers (in-process services on real
ports, real Postgres/Redis): list, show, approve/reject, cancel, compensation retry/resolve,
--json, and errors rendered as `error: <CODE> <REASON>: message` with exit code 1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Client
from services.common.runtime import Runtime
from tests.harness import rpc_runs
from tests.harness.helpers import eventually, key_of, start_with_gateway

PROJECT = "ops"


@dataclass
class Env:
    rt: Runtime
    admin_key: str
    worker: Client  # worker-role client, to put runs into states
    admin: Client
    cwd: Path

    def addr(self, service: str) -> str:
        return f"127.0.0.1:{self.rt.ports[service]}"

    async def cli(self, *args: str, key: str | None = "admin") -> subprocess.CompletedProcess[str]:
        """Runs `python -m awooop.cli runs ...` with the addresses as flags and the key from the env."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
        if key == "admin":
            env["AWOOOP_API_KEY"] = self.admin_key
        elif key:
            env["AWOOOP_API_KEY"] = key
        cmd = [
            sys.executable,
            "-m",
            "awooop.cli",
            "runs",
            *args,
            "--scheduler",
            self.addr("scheduler"),
            "--saga",
            self.addr("saga"),
        ]
        return await asyncio.to_thread(
            subprocess.run, cmd, env=env, cwd=self.cwd, capture_output=True, text=True, timeout=60
        )

    async def create(self, n: int = 1) -> list[str]:
        return [await rpc_runs.ingest_run(self.admin, PROJECT, {"ask": "scale"}) for _ in range(n)]

    async def claim(self, run_id: str) -> common_pb2.LeaseToken:
        """Claims one run: the oldest claimable one, which the tests arrange to be run_id."""
        return await rpc_runs.claim_one(self.worker, "cli-test-worker", PROJECT, run_id)

    async def step(
        self, lease: common_pb2.LeaseToken, step_id: str, compensation: dict[str, Any] | None = None
    ) -> None:
        await rpc_runs.scale_step(
            self.worker,
            lease,
            step_id,
            {"deployment": "api", "replicas": 3},
            {"previous_replicas": 1},
            undo=compensation,
            reason="scale back",
        )

    async def request_approval(self, lease: common_pb2.LeaseToken) -> str:
        return await rpc_runs.request_approval(self.worker, lease, "Keep api at 3 replicas?")


@pytest.fixture
async def env(start_services: Any, make_key: Any, tmp_path: Path) -> Any:
    _, rt = await start_with_gateway(start_services, auth_cache_seconds=0)
    admin_key = key_of(await make_key("ops-admin", {PROJECT: ["admin"]}))
    worker_key = key_of(await make_key("ops-worker", {PROJECT: ["worker"]}, "service"))
    addrs = {s: f"127.0.0.1:{p}" for s, p in rt.ports.items()}
    worker = Client(key=worker_key, **addrs)
    admin = Client(key=admin_key, **addrs)
    yield Env(rt, admin_key, worker, admin, tmp_path)  # cwd without an .awooop/dev-admin.key
    await worker.close()
    await admin.close()


async def test_list_filters_by_status_as_table_and_json(env: Env) -> None:
    first, second, third = await env.create(3)
    await env.claim(first)
    out = await env.cli("list", "--project", PROJECT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN_ID", "STATUS", "ATTEMPTS"]
    by_id = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(by_id) == {first, second, third}
    assert by_id[first][1:3] == ["RUNNING", "1/3"] and by_id[second][1] == "PENDING"

    out = await env.cli("list", "--project", PROJECT, "--status", "running", "--json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [(first, "RUN_STATUS_RUNNING")]

    out = await env.cli("list", "--project", PROJECT, "--status", "PENDING,completed", "--limit", "1", "--json")
    data = json.loads(out.stdout)
    assert len(data["runs"]) == 1 and data["runs"][0]["status"] == "RUN_STATUS_PENDING" and data["next_page_token"]

    out = await env.cli("list", "--project", PROJECT, "--status", "sleeping")
    assert out.returncode == 2 and "unknown status 'sleeping'" in out.stderr


async def test_list_a_runs_children_by_parent(env: Env) -> None:
    """`runs list --parent RUN_ID`: the run's children, newest first, with their step ids; the
    project is the parent's unless given; a bad id or neither flag is a usage error (exit 2)."""
    [parent] = await env.create(1)
    lease = await env.claim(parent)
    kids = []
    for step_id in ("fetch", "build"):  # one call each: two creation times
        resp = await env.worker.call(
            env.worker.scheduler.StartChildRuns,
            scheduler_pb2.StartChildRunsRequest(lease=lease, children=[scheduler_pb2.ChildRunSpec(step_id=step_id)]),
        )
        kids.append(resp.children[0].run_id)
    out = await env.cli("list", "--parent", parent)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN_ID", "STEP", "STATUS"]
    assert [line.split()[:3] for line in lines[1:]] == [[kids[1], "build", "PENDING"], [kids[0], "fetch", "PENDING"]]
    out = await env.cli("list", "--parent", parent, "--project", PROJECT, "--json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert [(r["run_id"], r["parent_run_id"], r["parent_step_id"]) for r in runs] == [
        (kids[1], parent, "build"),
        (kids[0], parent, "fetch"),
    ]
    out = await env.cli("list", "--parent", kids[0])
    assert out.returncode == 0 and out.stdout.strip() == f"run {kids[0]} has no children", out
    out = await env.cli("list", "--parent", "nope")
    assert out.returncode == 2 and "not a run id (a UUID): 'nope'" in out.stderr
    out = await env.cli("list")
    assert out.returncode == 2 and "--project or --parent is required" in out.stderr


async def test_show_prints_the_run_its_history_and_journal_as_a_timeline(env: Env) -> None:
    [run_id] = await env.create(1)
    lease = await env.claim(run_id)
    await env.step(lease, "scale", compensation={"deployment": "api", "replicas": 1})
    token = await env.request_approval(lease)
    assert token

    out = await env.cli("show", run_id)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"run               {run_id}" in text or run_id in text.splitlines()[0]
    assert "WAITING_APPROVAL" in text and "Keep api at 3 replicas?" in text
    timeline = text[text.index("timeline (UTC") : text.index("journal (saga")]
    order = [
        next(i for i, line in enumerate(timeline.splitlines()) if marker in line)
        for marker in (
            "CREATED",
            "CLAIMED",
            "#1 scale (tool_call, k8s_scale_deployment) begun",
            "completed",
            "APPROVAL",
        )
    ]
    assert order == sorted(order), timeline
    journal = text[text.index("journal (saga") :]
    assert "scale" in journal and "completed" in journal and '{"deployment": "api", "replicas": 1}' in journal

    out = await env.cli("show", run_id, "--json")
    data = json.loads(out.stdout)
    assert data["run"]["status"] == "RUN_STATUS_WAITING_APPROVAL"
    assert [e["action"] for e in data["history"]][:2] == ["RUN_CREATED", "CLAIMED"]
    assert data["journal"]["saga_steps"][0]["step_id"] == "scale"
    assert data["journal"]["saga_steps"][0]["compensation_cmd"]["params"] == {"deployment": "api", "replicas": 1}


async def test_a_held_run_shows_why_and_unhold_makes_it_claimable(env: Env) -> None:
    """A worker held the run (its code did not replay the journal): `show` says so and how to go
    on, `unhold` makes it claimable, a second `unhold` is refused, and a worker key may not."""
    [run_id] = await env.create(1)
    lease = await env.claim(run_id)
    why = "run does not replay its journal at step 'plan'"
    await env.worker.call(
        env.worker.scheduler.HoldRun,
        scheduler_pb2.HoldRunRequest(lease=lease, reason=why, error_code="E-WORKER-NONDETERMINISM"),
    )
    out = await env.cli("show", run_id)
    assert out.returncode == 0, out.stderr
    assert "held: its worker's code did not replay its journal; `awooop runs unhold`" in out.stdout, out.stdout
    assert f"E-WORKER-NONDETERMINISM {why}" in out.stdout
    denied = await env.cli("unhold", run_id, key=env.worker.key)
    assert denied.returncode == 1 and denied.stderr.startswith("error: PERMISSION_DENIED"), denied.stderr
    out = await env.cli("unhold", run_id, "--reason", "v1 redeployed")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"run {run_id} unheld: PENDING, claimable now"
    again = await env.cli("unhold", run_id, "--json")
    assert again.returncode == 1 and again.stderr.startswith("error: FAILED_PRECONDITION INVALID_TRANSITION: ")
    assert f"cannot unhold run {run_id} in status PENDING" in again.stderr
    assert await env.claim(run_id)  # claimable again


async def test_approve_and_reject_through_the_cli(env: Env, db: Any) -> None:
    approve_id, reject_id = await env.create(2)
    # a deployment the rejected run's compensation can scale back
    await rpc_runs.create_deployment(env.admin, PROJECT, replicas=3)
    tokens = {}
    for run_id in (approve_id, reject_id):
        lease = await env.claim(run_id)
        if run_id == reject_id:
            await env.step(lease, "scale", compensation={"deployment": "api", "replicas": 1})
        tokens[run_id] = await env.request_approval(lease)

    wrong = await env.cli("approve", approve_id, "--token", "not-the-token")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.startswith("error: FAILED_PRECONDITION APPROVAL_INVALID: ")
    assert "Traceback" not in wrong.stderr

    out = await env.cli("approve", approve_id, "--token", tokens[approve_id], "--reason", "fine")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"run {approve_id} approved: now RESUMED"

    out = await env.cli("reject", reject_id, "--token", tokens[reject_id], "--reason", "too many", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["run"]["status"] == "RUN_STATUS_FAILED" and data["compensation_requested"] is True

    async def compensated() -> bool:
        return await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id=$1", reject_id) == "compensated"

    await eventually(compensated, what="compensation")
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 1
    # a decided run's token no longer expires: `runs show` says who decided, not when the link would have ended
    out = await env.cli("show", reject_id)
    assert out.returncode == 0, out.stderr
    assert "decided by" in out.stdout and "approval expires" not in out.stdout, out.stdout

    # a used token is single use
    again = await env.cli("reject", approve_id, "--token", tokens[approve_id])
    assert again.returncode == 1 and "INVALID_TRANSITION" in again.stderr


async def test_cancel_a_queued_and_a_running_run(env: Env) -> None:
    running, queued = await env.create(2)
    await env.claim(running)

    out = await env.cli("cancel", queued, "--reason", "duplicate request")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"run {queued} cancelled"

    out = await env.cli("cancel", running, "--json")
    data = json.loads(out.stdout)
    assert data["run"]["status"] == "RUN_STATUS_RUNNING" and data["run"]["cancel_requested"] is True


async def test_compensation_retry_and_resolve(env: Env, db: Any) -> None:
    # two runs whose compensation fails at the gateway (a fault injected for the tool)
    await rpc_runs.create_deployment(env.admin, PROJECT, replicas=3)
    await db.execute(
        "INSERT INTO awooop_refgw_fault (project_id, tool_id, message) VALUES ($1, 'k8s_scale_deployment', 'api down')",
        PROJECT,
    )
    retry_id, resolve_id = await env.create(2)
    for run_id in (retry_id, resolve_id):
        lease = await env.claim(run_id)
        await env.step(lease, "scale", compensation={"deployment": "api", "replicas": 1})
        await env.worker.call(
            env.worker.scheduler.FailRun,
            scheduler_pb2.FailRunRequest(lease=lease, reason="downstream refused", retryable=False),
        )

    async def failed_both() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE project_id=$1 AND saga_status='compensation_failed'", PROJECT
        )
        return bool(n == 2)

    await eventually(failed_both, timeout=20, what="compensation_failed")
    out = await env.cli("show", retry_id)
    assert "compensation_failed" in out.stdout and "api down" in out.stdout

    # a retry while the fault is still there: the command waits for the outcome and says it failed
    out = await env.cli("compensation", "retry", retry_id, "--step", "scale")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stderr.startswith(f"run {retry_id}: retried step scale; it failed again: saga compensation_failed")
    assert "api down" in out.stderr

    # the fault is fixed: retry runs the compensation again
    await db.execute("DELETE FROM awooop_refgw_fault")
    out = await env.cli("compensation", "retry", retry_id, "--step", "scale")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"run {retry_id}: retried step scale; saga compensated"

    async def compensated() -> bool:
        return await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id=$1", retry_id) == "compensated"

    await eventually(compensated, timeout=20, what="retried compensation")

    # resolve needs a reason
    out = await env.cli("compensation", "resolve", resolve_id, "--step", "scale")
    assert out.returncode == 2 and "--reason" in out.stderr
    out = await env.cli(
        "compensation", "resolve", resolve_id, "--step", "scale", "--reason", "scaled by hand", "--json"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["step"]["status"] == "STEP_STATUS_RESOLVED" and data["saga_status"] == "SAGA_STATUS_COMPENSATED"
    out = await env.cli("show", resolve_id)
    assert "resolved by ops-admin: scaled by hand" in out.stdout


async def test_errors_are_one_clear_line_never_a_traceback(env: Env, make_key: Any) -> None:
    [run_id] = await env.create(1)

    out = await env.cli("show", run_id, key=None)
    assert out.returncode == 1
    assert out.stderr.splitlines()[0].startswith("error: UNAUTHENTICATED: ")
    assert "hint: pass --key or set AWOOOP_API_KEY" in out.stderr

    out = await env.cli("show", "not-a-uuid")
    assert out.returncode == 1
    assert out.stderr.startswith("error: INVALID_ARGUMENT FIELD_INVALID: ")
    assert "run_id: must be a UUID" in out.stderr  # the BadRequest field violation

    out = await env.cli("show", "00000000-0000-0000-0000-000000000000")
    assert out.returncode == 1 and out.stderr.startswith("error: NOT_FOUND: ")

    # another tenant's key learns nothing about the run (NOT_FOUND, as for a missing one)
    stranger = key_of(await make_key("stranger", {"elsewhere": ["admin"]}))
    out = await env.cli("show", run_id, key=stranger)
    assert out.returncode == 1 and out.stderr.startswith("error: NOT_FOUND: ")
    out = await env.cli("list", "--project", PROJECT, key=stranger)
    assert out.returncode == 1 and out.stderr.startswith("error: PERMISSION_DENIED FORBIDDEN: ")

    env_down = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "awooop.cli", "runs", "list", "--project", PROJECT, "--scheduler", "127.0.0.1:1"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}, "AWOOOP_API_KEY": env.admin_key},
        cwd=env.cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert env_down.returncode == 1 and env_down.stderr.startswith("error: UNAVAILABLE")
    for o in (out, env_down):
        assert "Traceback" not in o.stderr


async def test_the_dev_key_file_is_used_when_no_key_is_given(env: Env) -> None:
    await env.create(1)
    (env.cwd / ".awooop").mkdir()
    (env.cwd / ".awooop" / "dev-admin.key").write_text(env.admin_key + "\n")
    out = await env.cli("list", "--project", PROJECT, "--json", key=None)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["runs"]) == 1
