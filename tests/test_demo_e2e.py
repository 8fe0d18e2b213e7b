"""The demo scenario end to end with real processes: the services as `awooop serve` processes
(gateway; saga; ingest + scheduler), `awooop demo` as a process, and the two demo worker
processes it spawns, the first of which it kills with SIGKILL once step 2 is journaled.
Asserts the demo's own summary, then the store: journal, run state, history and the reference
gateway's deployment and call log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.common.settings import Settings
from tests.harness.helpers import ServiceProcess, key_of, settings_env, spawn_services

PROJECT = "demo-e2e"


async def _suite(settings: Settings, make_key: Any, tmp_path: Path) -> tuple[list[ServiceProcess], dict[str, str]]:
    internal = key_of(await make_key("scheduler-svc", {"*": ["admin"]}, "service"))
    env = settings_env(settings) | {
        "AWOOOP_REAPER_INTERVAL": "0.3",
        "AWOOOP_COMPENSATION_INTERVAL": "0.5",
        "AWOOOP_SHUTDOWN_GRACE": "1",
    }
    procs = []
    gw = await spawn_services(["gateway"], env, tmp_path, "gateway")
    procs.append(gw)
    gateway = f"127.0.0.1:{gw.ports['gateway']}"
    saga_env = env | {"AWOOOP_GATEWAY_ADDR": gateway, "AWOOOP_INTERNAL_API_KEY": internal}
    saga = await spawn_services(["saga"], saga_env, tmp_path, "saga")
    procs.append(saga)
    saga_addr = f"127.0.0.1:{saga.ports['saga']}"
    core = await spawn_services(
        ["ingest", "scheduler"],
        env | {"AWOOOP_SAGA_ADDR": saga_addr, "AWOOOP_INTERNAL_API_KEY": internal},
        tmp_path,
        "core",
    )
    procs.append(core)
    addrs = {
        "ingest": f"127.0.0.1:{core.ports['ingest']}",
        "scheduler": f"127.0.0.1:{core.ports['scheduler']}",
        "saga": saga_addr,
        "gateway": gateway,
    }
    return procs, addrs


def _demo_cmd(addrs: dict[str, str], *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "awooop.cli", "demo", "--json"]
    for service, addr in addrs.items():
        cmd += [f"--{service}", addr]
    return [*cmd, *extra]


def _clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}, **extra}


async def test_demo_story_with_real_processes_and_a_sigkilled_worker(
    settings: Settings, make_key: Any, db: Any, tmp_path: Path
) -> None:
    procs, addrs = await _suite(settings, make_key, tmp_path)
    key = key_of(await make_key("approver-admin", {"*": ["admin"]}))
    try:
        out = await asyncio.to_thread(
            subprocess.run,
            _demo_cmd(addrs, "--project", PROJECT, "--lease-ttl", "1", "--reaper-timeout", "60"),
            env=_clean_env(AWOOOP_API_KEY=key),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        for p in reversed(procs):
            p.terminate()
    assert out.returncode == 0, out.stdout + out.stderr + "".join(p.log()[-3000:] for p in procs)
    summary = json.loads(out.stdout)
    story = out.stderr

    # the demo's own account
    assert summary["ok"] is True and all(summary["checks"].values()), summary
    run_id = summary["run_id"]
    assert [d["run_id"] for d in summary["deliveries"]] == [run_id] * 3
    assert [d["duplicate"] for d in summary["deliveries"]] == [False, True, True]
    assert summary["deliveries"][1]["code"] == "E-IDEMPOTENT-001"
    assert summary["worker_a_killed"] is True and summary["worker_a_pid"] != summary["worker_b_pid"]
    assert summary["worker_b_actions"] == {"diagnose": "skip", "scale": "skip"}
    assert summary["replicas_before"] == 1 and summary["replicas_scaled"] == 3
    assert summary["replicas_after_compensation"] == 1
    assert summary["run_status"] == "FAILED" and summary["saga_status"] == "compensated"
    assert summary["worker_b_exit"] == 0
    for line in ("Worker A crashes (SIGKILL)", "The reaper finds the expired lease", "The approver", "rejects"):
        assert line in story, story

    # the store agrees
    run = await db.fetchrow(
        "SELECT status, error_code, attempt_count, reaped_at, saga_status FROM awooop_run_state WHERE run_id = $1",
        run_id,
    )
    assert run["status"] == "FAILED" and run["error_code"] == "E-APPROVAL-REJECTED"
    assert run["attempt_count"] == 2 and run["reaped_at"] is not None and run["saga_status"] == "compensated"
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE project_id = $1", PROJECT) == 1
    steps = await db.fetch(
        "SELECT step_id, step_type, status, attempt FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert [(s["step_id"], s["step_type"], s["status"], s["attempt"]) for s in steps] == [
        ("diagnose", "llm_call", "completed", 1),
        ("scale", "tool_call", "compensated", 1),
        ("approval", "approval_request", "failed", 2),  # asked by attempt 2, ended by the rejection
    ]
    actions = await db.fetch(
        "SELECT action, actor, details->>'worker_id' AS worker FROM awooop_audit_log "
        "WHERE run_id = $1 ORDER BY audit_id",
        run_id,
    )
    names = [a["action"] for a in actions]
    assert names.index("REAPED") < names.index("APPROVAL_REJECTED") < names.index("SAGA_STEP_COMPENSATED")
    claims = [a["worker"] for a in actions if a["action"] == "CLAIMED"]
    assert len(claims) == 2 and claims[0] != claims[1]  # two worker processes
    assert next(a["actor"] for a in actions if a["action"] == "REAPED") == "system:reaper"

    # the gateway: scaled once (worker B did not call it again), compensated once, back to 1 replica
    assert (
        await db.fetchval(
            "SELECT replicas FROM awooop_refgw_deployment WHERE project_id = $1 AND name = 'api'", PROJECT
        )
        == 1
    )
    calls = await db.fetch(
        "SELECT idempotency_key, tool_id, outcome FROM awooop_refgw_request WHERE project_id = $1 ORDER BY request_id",
        PROJECT,
    )
    assert [(c["idempotency_key"], c["outcome"]) for c in calls if c["tool_id"] == "k8s_scale_deployment"] == [
        (f"{run_id}:scale", "executed"),
        (f"{run_id}:scale:compensate", "executed"),
    ]


async def test_demo_without_a_running_suite_says_what_to_do(tmp_path: Path) -> None:
    dead = {s: "127.0.0.1:1" for s in ("ingest", "scheduler", "saga", "gateway")}
    out = await asyncio.to_thread(
        subprocess.run,
        _demo_cmd(dead, "--timeout", "2"),
        env=_clean_env(AWOOOP_API_KEY="awk_x_y"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    summary = json.loads(out.stdout)
    assert summary["ok"] is False and summary["error"].startswith("UNAVAILABLE")
    assert "start it with `./dev up`" in out.stderr and "Traceback" not in out.stderr
