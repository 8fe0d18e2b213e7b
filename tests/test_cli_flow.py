"""`awooop flow ...` and `awooop runs show`'s waiting line, as real subprocesses against real servers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Client

PROJECT = "ops"


async def _cli(rt: Any, key: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env["AWOOOP_API_KEY"] = key
    cmd = [sys.executable, "-m", "awooop.cli", *args, "--scheduler", f"127.0.0.1:{rt.ports['scheduler']}"]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


async def test_flow_set_show_limit_and_runs_show_says_why_a_run_waits(
    start_services: Any, make_key: Any, tmp_path: Path
) -> None:
    rt = await start_services("ingest", "scheduler", auth_cache_seconds=0)
    admin_key = (await make_key("ops-admin", {PROJECT: ["admin", "ingest", "worker"]}))[0][1].removeprefix("Bearer ")
    addrs = {s: f"127.0.0.1:{p}" for s, p in rt.ports.items()}
    client = Client(key=admin_key, **addrs)
    try:
        out = await _cli(
            rt,
            admin_key,
            tmp_path,
            "flow",
            "set",
            "--project",
            PROJECT,
            "--initial-backoff",
            "30",
            "--max-attempts",
            "4",
            "--non-retryable",
            "E-BAD",
            "--weight",
            "3",
        )
        assert out.returncode == 0, out.stderr
        assert "weight 3" in out.stdout and "initial 30s" in out.stdout
        out = await _cli(
            rt,
            admin_key,
            tmp_path,
            "flow",
            "limit",
            "--project",
            PROJECT,
            "llm:provider-x",
            "1",
            "--starts",
            "60",
            "--per",
            "60",
        )
        assert out.returncode == 0 and "at most 1 running" in out.stdout and "60 starts per 60s" in out.stdout, out
        out = await _cli(rt, admin_key, tmp_path, "flow", "show", "--project", PROJECT, "--json")
        shown = json.loads(out.stdout)
        assert shown["flow"]["weight"] == 3 and shown["limits"][0]["key"] == "llm:provider-x"
        out = await _cli(
            rt,
            admin_key,
            tmp_path,
            "flow",
            "schedule",
            "--project",
            PROJECT,
            "daily",
            "0 6 * * *",
            "--tz",
            "Europe/Berlin",
            "--input",
            '{"report": "daily"}',
        )
        assert out.returncode == 0 and "next tick" in out.stdout, out
        out = await _cli(rt, admin_key, tmp_path, "flow", "schedules", "--project", PROJECT)
        assert "daily" in out.stdout and "Europe/Berlin" in out.stdout, out
        out = await _cli(rt, admin_key, tmp_path, "flow", "unschedule", "--project", PROJECT, "daily")
        assert "deleted" in out.stdout, out
        bad = await _cli(rt, admin_key, tmp_path, "flow", "set", "--project", PROJECT, "--jitter", "3")
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "jitter" in bad.stderr

        async def create(key: str, **kw: Any) -> str:
            resp = await client.call(
                client.ingest.CreateRun,
                ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key=key, **kw),
            )
            return resp.run.run_id

        held = await create("held", concurrency_key="llm:provider-x")
        # two keys, one of them limited and busy: the show names both and the busy one
        parked = await create("parked", concurrency_keys=["llm:provider-x", "k8s:deployment/api"])
        claim = scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=5)
        (c,) = (await client.call(client.scheduler.ClaimRuns, claim)).runs
        assert c.run.run_id == held
        backoff = await create("flaky")
        (c,) = (await client.call(client.scheduler.ClaimRuns, claim)).runs
        await client.call(client.scheduler.FailRun, scheduler_pb2.FailRunRequest(lease=c.lease, retryable=True))
        later = common_pb2.Run()
        later.not_before.GetCurrentTime()
        later.not_before.seconds += 3600
        delayed = await create("delayed", not_before=later.not_before)

        for run_id, words in (
            (parked, "concurrency key llm:provider-x is at its limit"),
            (parked, "k8s:deployment/api, llm:provider-x"),
            (backoff, "retry backoff until"),
            (delayed, "delayed: not claimable before"),
        ):
            out = await _cli(rt, admin_key, tmp_path, "runs", "show", run_id, "--saga", "127.0.0.1:1")
            assert words in out.stdout, (run_id, out.stdout)
    finally:
        await client.close()


async def test_flow_debounce_debounces_undebounce_and_runs_show_says_a_batch_is_gathering(
    start_services: Any, make_key: Any, tmp_path: Path
) -> None:
    rt = await start_services("ingest", "scheduler", auth_cache_seconds=0, debounce_rule_cache_seconds=0)
    admin_key = (await make_key("ops-admin", {PROJECT: ["admin", "ingest", "worker"]}))[0][1].removeprefix("Bearer ")
    client = Client(key=admin_key, **{s: f"127.0.0.1:{p}" for s, p in rt.ports.items()})
    try:
        out = await _cli(
            rt, admin_key, tmp_path, "flow", "debounce", "--project", PROJECT, "telegram", "message.chat.id",
            "--window", "600", "--mode", "last",
        )  # fmt: skip
        assert out.returncode == 0 and "batched by message.chat.id" in out.stdout and "600s quiet" in out.stdout, out
        out = await _cli(rt, admin_key, tmp_path, "flow", "debounces", "--project", PROJECT)
        assert "message.chat.id" in out.stdout and "6000s" in out.stdout and "last" in out.stdout, out
        bad = await _cli(
            rt, admin_key, tmp_path, "flow", "debounce", "--project", PROJECT, "line", "a..b", "--window", "1"
        )
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "key_expression" in bad.stderr, bad

        payload = {"update_id": 1, "message": {"chat": {"id": 42}, "text": "hi"}}
        req = ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM)
        req.payload.update(payload)
        (o,) = (await client.call(client.ingest.IngestEvent, req)).outcomes
        out = await _cli(rt, admin_key, tmp_path, "runs", "show", o.run_id, "--saga", "127.0.0.1:1")
        assert "debouncing: gathering its key's events until" in out.stdout, out.stdout
        out = await _cli(rt, admin_key, tmp_path, "flow", "undebounce", "--project", PROJECT, "telegram", "--json")
        assert json.loads(out.stdout) == {"deleted": True}, out
        out = await _cli(rt, admin_key, tmp_path, "flow", "debounces", "--project", PROJECT, "--json")
        assert json.loads(out.stdout) == {"rules": []}, out
    finally:
        await client.close()
