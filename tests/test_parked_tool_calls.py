"""Parked tool calls (`ctx.call_tool_parked`) against the real services: the reference gateway
runs a slow tool in the background and posts its outcome to the wait's callback URL on ingest's
HTTP server; the run parks meanwhile (no lease, no worker). A worker SIGKILLed while the tool
works loses nothing: 30 s later the tool posts, another worker process resumes the run and
completes it without calling the tool again. The step compensates as any tool step; a tool that
posts an error fails the step; a callback URL the gateway cannot post to is refused; a repeat of
a call still at work runs nothing and redirects its outcome, a later one gets the replay. A key of
the tool role completes a wait of its project and may do nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from aiohttp import web
from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker import AwooopError, Client, ParkedToolFailed, RunContext, Worker, to_struct
from services.common import errors
from services.common.runtime import Runtime
from tests.harness.helpers import ROOT, eventually, key_of, start_with_callbacks
from tests.harness.rpc_runs import ingest_runs

PROJECT = "ptc"
TOOL_DELAY_MS = 30000  # the "30 s later the tool posts its result"


@dataclass
class Suite:
    rt: Runtime
    worker_key: str
    admin: Client
    addrs: dict[str, str]

    async def create_runs(self, n: int) -> list[str]:
        return await ingest_runs(self.admin, PROJECT, [{"n": i} for i in range(n)])

    def worker(self, handler: Any) -> Worker:
        return Worker(
            handler,
            projects=[PROJECT],
            key=self.worker_key,
            scheduler=self.addrs["scheduler"],
            saga=self.addrs["saga"],
            gateway=self.addrs["gateway"],
            heartbeat_interval=0.2,
            lease_ttl=30,
            claim_wait=1,
        )


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> Any:
    gw, ing, rt = await start_with_callbacks(start_services)
    addrs = {
        "ingest": f"127.0.0.1:{ing.ports['ingest']}",
        "scheduler": f"127.0.0.1:{rt.ports['scheduler']}",
        "saga": f"127.0.0.1:{rt.ports['saga']}",
        "gateway": f"127.0.0.1:{gw.ports['gateway']}",
    }
    worker_key = key_of(await make_key("ptc-worker", {PROJECT: ["worker"]}, "service"))
    admin = Client(key=key_of(await make_key("ptc-boss", {PROJECT: ["admin"]})), **addrs)
    yield Suite(rt, worker_key, admin, addrs)
    await admin.close()


async def _row(db: asyncpg.Connection, run_id: str) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT status, worker_id, lease_until, output, error_code, saga_status FROM awooop_run_state"
        " WHERE run_id = $1",
        uuid.UUID(run_id),
    )
    assert row is not None
    out = dict(row)
    out["output"] = json.loads(out["output"]) if out["output"] is not None else None
    return out


def _parked(row: dict[str, Any]) -> bool:
    return bool(row["status"] == "WAITING_TOOL" and row["worker_id"] is None and row["lease_until"] is None)


async def _tool_requests(db: asyncpg.Connection, key: str) -> list[str]:
    """The gateway's log of ExecuteTool calls with this idempotency key: their outcomes (received: at work)."""
    rows = await db.fetch(
        "SELECT outcome FROM awooop_refgw_request WHERE project_id = $1 AND idempotency_key = $2 ORDER BY request_id",
        PROJECT,
        key,
    )
    return [r["outcome"] for r in rows]


# --- the done-when: SIGKILL while the tool works, resume 30 s later on another worker ---

WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    from awooop.worker import Worker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")

    def side_effect(name):
        def fn(call):
            print("ran", name, call.run_id, flush=True)
            return {"done": name}
        return fn

    async def handle(ctx):
        await ctx.step("before", side_effect("before"))
        print("calling deploy", ctx.run_id, flush=True)
        entry = "deploy-" + ctx.run_id
        result = await ctx.call_tool_parked(
            "knowledge_write", {"entry_id": entry, "content": "deployed", "simulate_delay_ms": int(sys.argv[2])},
            timeout=300, step_id="deploy",
            compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "undo deploy"})
        await ctx.step("after", side_effect("after"))
        return {"tool_result": result}

    asyncio.run(Worker(handle, projects=[sys.argv[1]], lease_ttl=30, heartbeat_interval=0.5, claim_wait=1).run())
    """
)


@contextlib.asynccontextmanager
async def worker_process(suite: Suite, log: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    script = log.parent / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "AWOOOP_API_KEY": suite.worker_key, "AWOOOP_SCHEDULER_ADDR": suite.addrs["scheduler"],
           "AWOOOP_SAGA_ADDR": suite.addrs["saga"], "AWOOOP_GATEWAY_ADDR": suite.addrs["gateway"]}  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), PROJECT, str(TOOL_DELAY_MS)], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_slow_tool_outlives_its_sigkilled_worker_and_another_worker_completes_the_run_without_calling_it_again(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    [run_id] = await suite.create_runs(1)
    key = f"{run_id}:deploy"  # the step's idempotency key (the saga's "<run_id>:<step_id>")
    first_log = tmp_path / "first.log"
    async with worker_process(suite, first_log) as first:

        async def parked() -> bool:
            return _parked(await _row(db, run_id))

        await eventually(parked, timeout=30, what="the run parked on its tool")
        # the tool is at work (its call is logged, no outcome yet) when the worker dies
        assert await _tool_requests(db, key) == ["received"]
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 10)
    killed_at = await db.fetchval("SELECT now()")
    assert first_log.read_text().count(f"ran before {run_id}") == 1

    second_log = tmp_path / "second.log"
    async with worker_process(suite, second_log) as second:

        async def done() -> bool:
            return (await _row(db, run_id))["status"] == "COMPLETED"

        await eventually(done, timeout=TOOL_DELAY_MS / 1000 + 60, what="the tool posted, the run resumed and completed")
        second.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.wait, 30)
    row = await _row(db, run_id)
    assert row["output"] == {"tool_result": {"entry_id": f"deploy-{run_id}", "created": True}}
    text = second_log.read_text()
    assert f"calling deploy {run_id}" in text  # the handler ran again from the top ...
    assert f"ran before {run_id}" not in text and text.count(f"ran after {run_id}") == 1  # ... skipping "before"
    # the tool ran once: one ExecuteTool call in the gateway's log, one recorded key
    assert await _tool_requests(db, key) == ["executed"]
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_call WHERE idempotency_key = $1", key) == 1
    # its outcome came through the callback URL, after the first worker was gone
    wait = await db.fetchrow(
        "SELECT status, completed_by, completed_at FROM awooop_wait WHERE run_id = $1", uuid.UUID(run_id)
    )
    assert wait["status"] == "completed" and wait["completed_by"] == "callback:wait-url"
    assert wait["completed_at"] > killed_at
    steps = await db.fetch(
        "SELECT step_id, status, step_type, tool_id, compensation_cmd IS NOT NULL AS undoable"
        " FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq",
        uuid.UUID(run_id),
    )
    assert [(s["step_id"], s["status"]) for s in steps] == [
        ("before", "completed"),
        ("deploy", "completed"),
        ("deploy:wait", "completed"),
        ("deploy:wait:outcome", "completed"),
        ("after", "completed"),
    ]
    [deploy] = [s for s in steps if s["step_id"] == "deploy"]
    assert deploy["step_type"] == "tool_call" and deploy["tool_id"] == "knowledge_write" and deploy["undoable"]


# --- in-process workers: compensation, a tool's error, refused input ----------------------------


async def test_a_parked_tool_step_compensates_like_any_tool_step_and_a_posted_error_fails_the_step(
    suite: Suite, db: Any
) -> None:
    failing, erring = await suite.create_runs(2)
    seen: dict[str, list[str]] = {}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen.setdefault(ctx.run_id, []).append("start")
        entry = f"kb-{ctx.run_id}"
        params: dict[str, Any] = {"entry_id": entry, "content": "x", "simulate_delay_ms": 300}
        if ctx.run_id == erring:
            params["simulate_failure"] = "quota exceeded"
        try:
            result = await ctx.call_tool_parked(
                "knowledge_write",
                params,
                timeout=60,
                compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "undo"},
            )
        except ParkedToolFailed as exc:
            return {"tool_failed": exc.message, "code": exc.code}
        seen[ctx.run_id].append(f"written {result['entry_id']}")
        await ctx.fail("a later step went wrong", error_code="E-LATER")
        return None

    worker = suite.worker(handler)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))

    async def settled() -> bool:
        a, b = await _row(db, failing), await _row(db, erring)
        return a["saga_status"] == "compensated" and b["status"] == "COMPLETED"

    await eventually(settled, timeout=30, what="compensated, and the error seen")
    worker.stop()
    await asyncio.wait_for(task, 30)
    # parked once, resumed by the tool's post: the handler ran twice, the tool once
    assert seen[failing] == ["start", "start", f"written kb-{failing}"]
    assert await _tool_requests(db, f"{failing}:tool-1") == ["executed"]
    # the compensation undid it: the knowledge entry is gone
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE entry_id = $1", f"kb-{failing}") == 0
    step = await db.fetchrow(
        "SELECT status FROM awooop_saga_step WHERE run_id = $1 AND step_id = 'tool-1'", uuid.UUID(failing)
    )
    assert step["status"] == "compensated"
    out = (await _row(db, erring))["output"]
    assert out == {"tool_failed": "quota exceeded", "code": errors.TOOL_FAILED}, out
    step = await db.fetchrow(
        "SELECT status, error FROM awooop_saga_step WHERE run_id = $1 AND step_id = 'tool-1'", uuid.UUID(erring)
    )
    assert step["status"] == "failed" and "quota exceeded" in step["error"]


async def test_the_gateway_refuses_a_callback_url_it_cannot_post_to(suite: Suite) -> None:
    for url in ("/v1/waits/abc", "ftp://example.com/x", "http://" + "a" * 3000):
        with pytest.raises(AwooopError) as info:
            await suite.admin.call(
                suite.admin.gateway.ExecuteTool,
                tools_pb2.ExecuteToolRequest(
                    tool_id="knowledge_write",
                    params=to_struct({"content": "x"}),
                    idempotency_key=f"k-{uuid.uuid4()}",
                    project_id=PROJECT,
                    callback_url=url,
                ),
            )
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "callback_url" in str(info.value)


# --- the tool role: completes waits in its project, nothing else --------------------------------


async def _cli_tool_key(db_dsn: str, principal: str, project: str) -> str:
    """A tool key made the operator's way: `awooop admin` as real processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_DATABASE_URL": db_dsn}
    for args in (
        ("create-principal", principal, "--type", "service"),
        ("grant", principal, project, "tool"),
        ("issue-key", principal, "--label", "ci tool"),
    ):
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "awooop.cli", "admin", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    return out.stdout.strip()


async def test_a_tool_key_completes_a_wait_of_its_project_and_may_do_nothing_else(
    suite: Suite, db: Any, db_dsn: str
) -> None:
    tool_key = await _cli_tool_key(db_dsn, "ci-tool", PROJECT)
    stranger_key = await _cli_tool_key(db_dsn, "other-tool", "ptc-other")
    tool, stranger = Client(key=tool_key, **suite.addrs), Client(key=stranger_key, **suite.addrs)
    [run_id] = await suite.create_runs(1)
    worker = Client(key=suite.worker_key, **suite.addrs)
    try:
        claimed = await worker.call(
            worker.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=1),
        )
        [lease] = [r.lease for r in claimed.runs]
        created = await worker.call(
            worker.scheduler.CreateWait,
            scheduler_pb2.CreateWaitRequest(
                lease=lease, step_id="w", kind=scheduler_pb2.WAIT_KIND_TOKEN, timeout=duration_pb2.Duration(seconds=600)
            ),
        )
        parked = await worker.call(
            worker.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=created.wait.wait_id)
        )
        assert parked.parked
        complete = scheduler_pb2.CompleteWaitRequest(wait_id=created.wait.wait_id, result=to_struct({"ok": 1}))

        # another project's tool key: the wait does not exist for it
        with pytest.raises(AwooopError) as info:
            await stranger.call(stranger.scheduler.CompleteWait, complete)
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        # nothing else: claiming, reading the run or its journal, running a tool
        refused = [
            tool.call(
                tool.scheduler.ClaimRuns,
                scheduler_pb2.ClaimRunsRequest(worker_id="tool", project_ids=[PROJECT], max_runs=1),
            ),
            tool.call(tool.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id)),
            tool.call(tool.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id)),
            tool.call(
                tool.gateway.ExecuteTool,
                tools_pb2.ExecuteToolRequest(
                    tool_id="knowledge_write",
                    params=to_struct({"content": "x"}),
                    idempotency_key="k",
                    project_id=PROJECT,
                ),
            ),
        ]
        for call in refused:
            with pytest.raises(AwooopError) as info:
                await call
            assert info.value.code == grpc.StatusCode.PERMISSION_DENIED, info.value
        # its own project's wait: completed, the run resumed, the tool named as who did it
        resp = await tool.call(tool.scheduler.CompleteWait, complete)
        assert resp.resumed and resp.wait.status == scheduler_pb2.WAIT_STATUS_COMPLETED
        assert resp.wait.completed_by == "service:ci-tool"
        assert (await _row(db, run_id))["status"] == "PENDING"
    finally:
        for c in (tool, stranger, worker):
            await c.close()


# --- the gateway's side: one run of the tool, its outcome to the newest URL ----------------------


class Receiver:
    """A real HTTP server standing in for callback URLs: records each POST by path."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.posts.append((request.path, await request.json()))
        return web.json_response({"ok": True})

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/{path:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_a_repeat_while_the_tool_works_runs_nothing_and_redirects_the_outcome_and_a_later_one_gets_the_replay(
    suite: Suite, db: Any
) -> None:
    receiver = await Receiver().start()
    key = f"k-{uuid.uuid4()}"

    def request(path: str) -> tools_pb2.ExecuteToolRequest:
        return tools_pb2.ExecuteToolRequest(
            tool_id="knowledge_write",
            params=to_struct({"entry_id": key, "content": "x", "simulate_delay_ms": 1500}),
            idempotency_key=key,
            project_id=PROJECT,
            callback_url=receiver.url(path),
        )

    try:
        gw = suite.admin.gateway
        first = await suite.admin.call(gw.ExecuteTool, request("first"))
        assert first.accepted and not first.replayed and not first.HasField("result")
        # the caller's next attempt (a new callback token) while the tool still works
        second = await suite.admin.call(gw.ExecuteTool, request("second"))
        assert second.accepted and second.replayed
        await eventually(lambda: _posted(receiver), timeout=30, what="the outcome posted")
        assert receiver.posts == [("/second", {"result": {"entry_id": key, "created": True}})]
        # after it finished: the recorded result is posted to the new URL, the tool not run again
        third = await suite.admin.call(gw.ExecuteTool, request("third"))
        assert third.accepted and not third.replayed  # nothing at work: answered by a replay
        await eventually(lambda: _posted(receiver, 2), timeout=30, what="the replay posted")
        assert receiver.posts[1] == ("/third", {"result": {"entry_id": key, "created": True}})
        assert await _tool_requests(db, key) == ["executed", "replayed"]
        assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE entry_id = $1", key) == 1
    finally:
        await receiver.stop()


async def _posted(receiver: Receiver, n: int = 1) -> bool:
    return len(receiver.posts) >= n


async def test_an_attempt_that_died_after_starting_the_tool_and_before_parking_is_finished_by_the_next(
    suite: Suite, db: Any
) -> None:
    """The gap the SIGKILL test does not cover: the tool was started with the first attempt's
    callback URL, then that attempt's lease ran out before it parked. The next attempt (a real SDK
    worker) finds the step pending and the wait open, gets a new token (the first URL is void now)
    and starts the tool again with the same idempotency key: the gateway runs nothing again and
    posts the outcome to the new URL, and the run completes with it."""
    [run_id] = await suite.create_runs(1)
    params = {"entry_id": f"gap-{run_id}", "content": "x", "simulate_delay_ms": 2000}
    c = Client(key=suite.worker_key, **suite.addrs)
    try:
        claimed = await c.call(
            c.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(
                worker_id="doomed", project_ids=[PROJECT], max_runs=1, lease_ttl=duration_pb2.Duration(seconds=1)
            ),
        )
        [lease] = [r.lease for r in claimed.runs]
        begin = await c.call(
            c.saga.BeginStep,
            saga_pb2.BeginStepRequest(
                lease=lease,
                step_id="tool-1",
                step_type=common_pb2.STEP_TYPE_TOOL_CALL,
                tool_id="knowledge_write",
                tool_params=to_struct(params),
            ),
        )
        created = await c.call(
            c.scheduler.CreateWait,
            scheduler_pb2.CreateWaitRequest(
                lease=lease,
                step_id="tool-1:wait",
                kind=scheduler_pb2.WAIT_KIND_TOKEN,
                timeout=duration_pb2.Duration(seconds=120),
            ),
        )
        started = await c.call(
            c.gateway.ExecuteTool,
            tools_pb2.ExecuteToolRequest(
                tool_id="knowledge_write",
                params=to_struct(params),
                idempotency_key=begin.idempotency_key,
                project_id=PROJECT,
                run_id=run_id,
                callback_url=created.callback_url,
            ),
        )
        assert started.accepted
    finally:
        await c.close()
    # the doomed attempt sends nothing more: the reaper takes the run back after its 1 s lease

    async def handler(ctx: RunContext) -> dict[str, Any]:
        return {"written": await ctx.call_tool_parked("knowledge_write", params, timeout=120)}

    worker = suite.worker(handler)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def done() -> Any:
            row = await _row(db, run_id)
            return row["output"] if row["status"] == "COMPLETED" else None

        output = await eventually(done, timeout=60, what="the next attempt finished the run")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert output == {"written": {"entry_id": f"gap-{run_id}", "created": True}}
    assert await _tool_requests(db, begin.idempotency_key) == ["executed"]  # the tool ran once
    assert "REAPED" in [
        r["action"] for r in await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1", uuid.UUID(run_id))
    ]
    # the first attempt's URL still names the wait (every token issued for it does, migration
    # 0290): the wait has ended, so it is refused naming the outcome, never a 404
    async with aiohttp.ClientSession() as http, http.post(created.callback_url, json={"late": True}) as r:
        body = await r.json(content_type=None)
        assert (r.status, body["reason"], body["outcome"]) == (409, "WAIT_CLOSED", "completed"), body
