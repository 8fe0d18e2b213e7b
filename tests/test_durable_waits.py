"""Durable waits against the real services (ingest with its HTTP server, scheduler, saga, gateway;
real Postgres and Redis; real worker processes): a run parks on a wait holding no lease, survives
its worker's SIGKILL, is resumed through the callback URL by another worker that skips the
finished steps; timeouts reach the handler (and, uncaught, fail and compensate the run); sleeps
resume; 1,000 parked runs hold nothing and all resume; an operator completes or expires a wait
by hand (RPC and CLI), audited; and every race for a wait's outcome (completion twice, completion
vs timeout, completion vs cancel, completion vs a hand expiry) has one winner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Child, Client, RunContext, ToolClient, WaitTimeout, to_struct
from services.common import errors
from services.scheduler import waits
from tests.harness import suite as suite_harness
from tests.harness.helpers import ROOT, eventually, key_of
from tests.harness.rpc_runs import create_deployment, ingest_runs
from tests.harness.suite import addresses, start_suite, stop_worker

PROJECT = "dw"
OTHER = "dw-other"


@dataclass
class Suite(suite_harness.Suite):
    worker_client: Client
    other: Client  # a worker of another project
    parks: int = 0  # park_one's runs so far: each new one outranks the older (requeued) ones

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.rt.http_ports['ingest']}"

    async def create_runs(self, n: int, **kw: Any) -> list[str]:
        return await ingest_runs(self.admin, PROJECT, [{"n": i} for i in range(n)], **kw)

    async def complete_wait(self, wait_id: str, result: dict[str, Any], client: Client | None = None) -> Any:
        c = client or self.worker_client
        return await c.call(
            c.scheduler.CompleteWait, scheduler_pb2.CompleteWaitRequest(wait_id=wait_id, result=to_struct(result))
        )

    async def park_one(self, timeout: float = 600.0, kind: int = scheduler_pb2.WAIT_KIND_TOKEN) -> tuple[str, Any]:
        """A run claimed by hand, a wait created and the run parked on it: (run_id, CreateWaitResponse)."""
        return await self.park_one_with(timeout=timeout, kind=kind)

    async def park_one_with(
        self, timeout: float = 600.0, kind: int = scheduler_pb2.WAIT_KIND_TOKEN, **run_options: Any
    ) -> tuple[str, Any]:
        """park_one for a run created with run_options (IngestEventRequest fields)."""
        self.parks += 1
        [run_id] = await self.create_runs(1, priority=self.parks, **run_options)
        c = self.worker_client
        claimed = await c.call(
            c.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=1),
        )
        [lease] = [r.lease for r in claimed.runs if r.lease.run_id == run_id]
        request = scheduler_pb2.CreateWaitRequest(lease=lease, step_id="w", kind=kind, timeout=_duration(timeout))  # type: ignore[arg-type]
        created = await c.call(c.scheduler.CreateWait, request)
        parked = await c.call(
            c.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=created.wait.wait_id)
        )
        assert parked.parked
        return run_id, (created, lease)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> AsyncIterator[Suite]:
    rt, worker_key, admin, _ = await start_suite(
        start_services, make_key, PROJECT, worker="dw-worker", admin="dw-boss", wait_sweep_interval=0.2
    )
    other_key = key_of(await make_key("dw-other", {OTHER: ["worker"]}, "service"))
    worker_client = Client(key=worker_key, **addresses(rt))
    other = Client(key=other_key, **addresses(rt))
    yield Suite(rt, PROJECT, worker_key, admin, worker_client, other)
    for c in (admin, worker_client, other):
        await c.close()


async def _row(db: asyncpg.Connection, run_id: str) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT status, worker_id, lease_until, attempt_count, released_count, output, error_code, saga_status"
        " FROM awooop_run_state WHERE run_id = $1",
        uuid.UUID(run_id),
    )
    assert row is not None
    out = dict(row)
    out["output"] = json.loads(out["output"]) if out["output"] is not None else None  # no jsonb codec here
    return out


async def _audit(db: asyncpg.Connection, run_id: str) -> list[str]:
    rows = await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(run_id))
    return [r["action"] for r in rows]


async def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def _parked(row: Any) -> bool:
    return bool(row["status"] == "WAITING_TOOL" and row["worker_id"] is None and row["lease_until"] is None)


# --- a parked run survives its worker, resumes through the callback URL ------------------------

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
        await ctx.step("start-tool", side_effect("start-tool"))
        token = await ctx.create_wait(timeout=300)
        if token.callback_url:
            print("callback", token.callback_url, flush=True)
        result = await ctx.wait(token)
        await ctx.step("after", side_effect("after"))
        return {"tool_result": result}

    asyncio.run(Worker(handle, projects=[sys.argv[1]], lease_ttl=30, heartbeat_interval=0.5, claim_wait=1).run())
    """
)


@contextlib.asynccontextmanager
async def worker_process(suite: Suite, log: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    script = log.parent / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "AWOOOP_API_KEY": suite.worker_key, "AWOOOP_SCHEDULER_ADDR": suite.scheduler,
           "AWOOOP_SAGA_ADDR": suite.saga}  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), PROJECT], env=env, cwd=ROOT, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_parked_run_survives_sigkill_and_resumes_through_its_callback_url_on_another_worker(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    [run_id] = await suite.create_runs(1)
    first_log = tmp_path / "first.log"
    async with worker_process(suite, first_log) as first:

        async def parked() -> bool:
            return _parked(await _row(db, run_id))

        await eventually(parked, timeout=30, what="the run parked")
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 10)
    text = first_log.read_text()
    assert text.count(f"ran start-tool {run_id}") == 1
    [path] = re.findall(r"callback (\S+)", text)
    assert path.startswith("/v1/waits/")  # no AWOOOP_WAIT_CALLBACK_BASE_URL here: the path
    # parked means nothing the reaper could take, and nothing written: ten of its 0.1 s passes
    # later the row is the same row version
    start = await db.fetchval("SELECT clock_timestamp()")
    version = await db.fetchval("SELECT xmin::text FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))

    async def passes() -> bool:
        return bool(await db.fetchval("SELECT clock_timestamp() > $1::timestamptz + interval '1 second'", start))

    await eventually(passes, timeout=10, what="ten reaper intervals")
    row = await _row(db, run_id)
    assert _parked(row) and row["attempt_count"] == 2 and row["released_count"] == 2  # attempts used: 0
    assert await db.fetchval("SELECT xmin::text FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id)) == version
    assert "REAPED" not in await _audit(db, run_id)

    second_log = tmp_path / "second.log"
    async with worker_process(suite, second_log) as second:
        status, body = await _post(suite.http + path, {"build": "green", "n": 7})
        assert status == 200 and body["resumed"] is True and body["status"] == "completed", body

        async def done() -> bool:
            return (await _row(db, run_id))["status"] == "COMPLETED"

        await eventually(done, timeout=30, what="resumed and completed")
        second.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.wait, 30)
    row = await _row(db, run_id)
    assert row["output"] == {"tool_result": {"build": "green", "n": 7}}
    text = second_log.read_text()
    assert f"ran start-tool {run_id}" not in text and text.count(f"ran after {run_id}") == 1
    steps = await db.fetch(
        "SELECT step_id, status FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq", uuid.UUID(run_id)
    )
    assert [(s["step_id"], s["status"]) for s in steps] == [
        ("start-tool", "completed"),
        ("wait-1", "completed"),
        ("wait-1:outcome", "completed"),
        ("after", "completed"),
    ]
    audit = await _audit(db, run_id)
    assert audit.count("WAIT_PARKED") == 1 and audit.count("WAIT_COMPLETED") == 1
    # single use: the same URL again names the first outcome
    status, body = await _post(suite.http + path, {"again": True})
    assert status == 409 and body["reason"] == errors.WAIT_CLOSED and body["outcome"] == "completed", body
    status, body = await _post(suite.http + "/v1/waits/" + "x" * 43, {})
    assert status == 404, body


# --- timeouts and sleeps ----------------------------------------------------------------------


async def test_a_timeout_reaches_the_handler_and_uncaught_fails_and_compensates_the_run(suite: Suite, db: Any) -> None:
    await create_deployment(suite.admin, PROJECT, replicas=2)
    uncaught, caught, sleeper = await suite.create_runs(3)
    tools = ToolClient(suite.gateway, key=suite.worker_key)
    seen: dict[str, list[str]] = {}

    def undo(result: dict[str, Any]) -> dict[str, Any]:
        params = {"deployment": "api", "replicas": result["previous_replicas"]}
        return {"tool_id": "k8s_scale_deployment", "params": params, "reason": "undo"}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen.setdefault(ctx.run_id, []).append("start")
        if ctx.run_id == sleeper:
            await ctx.sleep(0.5)
            return {"slept": True}
        if ctx.run_id == uncaught:
            await ctx.step(
                "scale",
                tools.execute,
                tool_id="k8s_scale_deployment",
                params={"deployment": "api", "replicas": 5},
                compensation=undo,
            )
        token = await ctx.create_wait(timeout=0.5)
        try:
            await ctx.wait(token)
        except WaitTimeout:
            seen[ctx.run_id].append("timeout")
            if ctx.run_id == uncaught:
                raise
            return {"gave_up": True}
        return {"unexpected": True}

    worker = suite.worker(handler, concurrency=3)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))

    async def settled() -> bool:
        rows = [await _row(db, r) for r in (uncaught, caught, sleeper)]
        return rows[0]["saga_status"] == "compensated" and all(r["status"] == "COMPLETED" for r in rows[1:])

    await eventually(settled, timeout=30, what="timeouts seen, compensation done")
    await stop_worker(worker, task)
    await tools.close()
    row = await _row(db, uncaught)
    assert row["status"] == "FAILED" and row["error_code"] == "E-WAIT-TIMEOUT"
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 2
    assert (await _row(db, caught))["output"] == {"gave_up": True}
    assert (await _row(db, sleeper))["output"] == {"slept": True}
    # each handler ran twice: parked, then resumed by the sweep's timeout
    assert seen == {uncaught: ["start", "start", "timeout"], caught: ["start", "start", "timeout"],
                    sleeper: ["start", "start"]}  # fmt: skip
    for run_id in (uncaught, caught, sleeper):
        audit = await _audit(db, run_id)
        assert audit.count("WAIT_PARKED") == 1 and audit.count("WAIT_TIMED_OUT") == 1, audit


# --- many parked runs -------------------------------------------------------------------------


async def test_1000_parked_runs_hold_no_lease_nor_worker_slot_and_all_resume_when_completed(
    suite: Suite, db: Any
) -> None:
    n = 1000
    run_ids = [r for _ in range(n // 250) for r in await suite.create_runs(250)]
    wait_ids: dict[str, str] = {}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        token = await ctx.create_wait(timeout=600)
        wait_ids[ctx.run_id] = token.wait_id
        return {"got": await ctx.wait(token)}

    worker = suite.worker(handler, concurrency=200)  # 1,000 parked through 200 slots: each parked run freed its own
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    count_parked = (
        "SELECT count(*) FROM awooop_run_state WHERE project_id = $1 AND status = 'WAITING_TOOL'"
        " AND worker_id IS NULL AND lease_until IS NULL"
    )

    async def all_parked() -> bool:
        return bool(await db.fetchval(count_parked, PROJECT) == n)

    await eventually(all_parked, timeout=120, what=f"{n} runs parked")

    # no worker slot taken: the worker holds nothing in flight. A park commits before its answer
    # reaches the worker, which frees the slot on that answer: the last few are still on the way
    async def nothing_held() -> bool:
        return worker.held == []

    await eventually(nothing_held, what="the worker's slots freed by the parks' answers")
    leased = (
        "SELECT count(*) FROM awooop_run_state WHERE project_id = $1"
        " AND (lease_until IS NOT NULL OR worker_id IS NOT NULL)"
    )
    assert await db.fetchval(leased, PROJECT) == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_wait WHERE project_id=$1 AND status='open'", PROJECT) == n
    for i in range(0, n, 100):  # at most 100 completions in flight
        await asyncio.gather(*(suite.complete_wait(wait_ids[r], {"r": r}) for r in run_ids[i : i + 100]))

    async def all_done() -> bool:
        done = "SELECT count(*) FROM awooop_run_state WHERE project_id = $1 AND status = 'COMPLETED'"
        return bool(await db.fetchval(done, PROJECT) == n)

    await eventually(all_done, timeout=120, what=f"{n} runs resumed and completed")
    await stop_worker(worker, task)
    outputs = await db.fetch("SELECT run_id, output FROM awooop_run_state WHERE project_id = $1", PROJECT)
    assert {str(o["run_id"]): json.loads(o["output"]) for o in outputs} == {r: {"got": {"r": r}} for r in run_ids}


# --- by hand: an operator completes or expires a wait ------------------------------------------


async def test_an_approver_expires_or_completes_a_wait_by_hand_audited_and_others_may_not(
    suite: Suite, db: Any, make_key: Any
) -> None:
    approver_key = key_of(await make_key("dw-approver", {PROJECT: ["approver"]}))
    approver = Client(key=approver_key, scheduler=suite.scheduler, saga=suite.saga)
    try:
        run_id, (created, _) = await suite.park_one()
        wait_id = created.wait.wait_id
        listed = await approver.call(approver.scheduler.ListWaits, scheduler_pb2.ListWaitsRequest(run_id=run_id))
        assert [(w.wait_id, w.status) for w in listed.waits] == [(wait_id, scheduler_pb2.WAIT_STATUS_OPEN)]
        expire = scheduler_pb2.ExpireWaitRequest(wait_id=wait_id)
        with pytest.raises(AwooopError) as denied:  # a worker of the project is no operator
            await suite.worker_client.call(suite.worker_client.scheduler.ExpireWait, expire)
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(AwooopError) as hidden:  # another project's key learns nothing (not the run's id)
            await suite.other.call(suite.other.scheduler.ExpireWait, expire)
        assert hidden.value.code == grpc.StatusCode.NOT_FOUND
        assert dict(hidden.value.details.metadata) == {"wait_id": wait_id}
        with pytest.raises(AwooopError) as unknown:
            await approver.call(
                approver.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=str(uuid.uuid4()))
            )
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(AwooopError) as bad:
            await approver.call(approver.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id="nope"))
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert (await _row(db, run_id))["status"] == "WAITING_TOOL"

        resp = await approver.call(approver.scheduler.ExpireWait, expire)
        assert resp.resumed and resp.wait.status == scheduler_pb2.WAIT_STATUS_TIMED_OUT
        assert resp.wait.completed_by == "user:dw-approver"
        assert (await _row(db, run_id))["status"] == "PENDING"
        audit = await db.fetchrow(
            "SELECT actor, action, from_status, to_status, details FROM awooop_audit_log"
            " WHERE run_id = $1 ORDER BY audit_id DESC LIMIT 1",
            uuid.UUID(run_id),
        )
        assert (audit["actor"], audit["action"], audit["from_status"], audit["to_status"]) == (
            "user:dw-approver", "WAIT_TIMED_OUT", "WAITING_TOOL", "PENDING"
        )  # fmt: skip
        with pytest.raises(AwooopError) as again:
            await approver.call(approver.scheduler.ExpireWait, expire)
        assert again.value.reason == errors.WAIT_CLOSED and again.value.details.metadata["outcome"] == "timed_out"

        # a completion by hand: the approver's result reaches the parked run
        run_id, (created, _) = await suite.park_one()
        done = await suite.complete_wait(created.wait.wait_id, {"by": "hand"}, client=approver)
        assert done.resumed and done.wait.completed_by == "user:dw-approver"
        assert (await _audit(db, run_id))[-1] == "WAIT_COMPLETED"
    finally:
        await approver.close()


async def test_the_cli_lists_completes_and_expires_a_runs_wait(suite: Suite, db: Any, make_key: Any) -> None:
    approver_key = key_of(await make_key("dw-cli", {PROJECT: ["approver"]}))

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
        env["AWOOOP_API_KEY"] = approver_key
        cmd = [sys.executable, "-m", "awooop.cli", "runs", "waits", *args, "--scheduler", suite.scheduler]
        return await asyncio.to_thread(
            subprocess.run, cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )

    run_id, (created, _) = await suite.park_one()
    listed = await cli("list", run_id)
    assert listed.returncode == 0, listed.stderr
    assert created.wait.wait_id in listed.stdout and "open" in listed.stdout and "token" in listed.stdout
    done = await cli("complete", run_id, "--result", '{"answer": 42}')
    assert done.returncode == 0, done.stderr
    assert f"wait {created.wait.wait_id} (w) of run {run_id} completed; its run resumes" in done.stdout
    row = await db.fetchrow(
        "SELECT status, result FROM awooop_wait WHERE wait_id = $1", uuid.UUID(created.wait.wait_id)
    )
    assert row["status"] == "completed" and json.loads(row["result"]) == {"answer": 42}
    none_open = await cli("expire", run_id)
    assert none_open.returncode == 1 and "has no open wait" in none_open.stderr
    bad = await cli("complete", run_id, "--result", "[1]")
    assert bad.returncode == 2 and "a JSON object" in bad.stderr

    run_id, (created, _) = await suite.park_one()
    expired = await cli("expire", run_id, "--wait", created.wait.wait_id, "--json")
    assert expired.returncode == 0, expired.stderr
    answer = json.loads(expired.stdout)
    assert answer["resumed"] is True and answer["wait"]["status"] == "WAIT_STATUS_TIMED_OUT"
    closed = await cli("expire", run_id, "--wait", created.wait.wait_id)
    assert closed.returncode == 1 and "WAIT_CLOSED" in closed.stderr

    # a sleep whose time came ended as a sleep ends: listed "ended", not as a wait that timed out
    run_id, (created, _) = await suite.park_one(kind=scheduler_pb2.WAIT_KIND_SLEEP)
    assert (await cli("expire", run_id)).returncode == 0
    listed = await cli("list", run_id)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line.split() for line in listed.stdout.splitlines() if line.startswith(created.wait.wait_id)]
    assert row[2:4] == ["sleep", "ended"], listed.stdout


async def test_open_waits_are_gauged_by_project_and_kind_and_ended_waits_counted_by_outcome(
    suite: Suite, db: Any, db_dsn: str, make_key: Any
) -> None:
    from prometheus_client import REGISTRY

    from services.common import wait_outcomes
    from services.scheduler.queue import QueueSampler

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    ended = {o: sample("awooop_waits_ended_total", outcome=o) for o in ("completed", "timed_out", "cancelled")}
    tokens = [await suite.park_one() for _ in range(2)]
    slept, _ = await suite.park_one(kind=scheduler_pb2.WAIT_KIND_SLEEP)
    cancelled, (doomed, _) = await suite.park_one(timeout=3600)
    # the oldest open wait: ten minutes old, one hour overdue. Until the first sample is read, a KEY
    # SHARE lock keeps the timeout sweep (FOR UPDATE SKIP LOCKED) off it; it does not block the update
    holder = await asyncpg.connect(db_dsn)
    held = holder.transaction()
    await held.start()
    await holder.execute("SELECT 1 FROM awooop_wait WHERE run_id = $1 FOR KEY SHARE", uuid.UUID(slept))
    await db.execute(
        "UPDATE awooop_wait SET created_at = now() - interval '10 minutes', expires_at = now() - interval '1 hour'"
        " WHERE run_id = $1",
        uuid.UUID(slept),
    )
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=2)
    sampler = QueueSampler(pool)  # one, as the scheduler keeps: it zeroes the labels it has seen
    try:
        try:
            await sampler.sample()
        finally:
            await held.rollback()
            await holder.close()
        assert sample("awooop_scheduler_waits_open", project=PROJECT, kind="token") == 3
        assert sample("awooop_scheduler_waits_open", project=PROJECT, kind="sleep") == 1
        assert sample("awooop_scheduler_waits_open", project=PROJECT, kind="event") == 0
        assert 600 <= sample("awooop_scheduler_oldest_open_wait_age_seconds", project=PROJECT) < 900
        assert 3600 <= sample("awooop_scheduler_wait_overdue_seconds", project=PROJECT) < 3900
        assert sample("awooop_scheduler_runs", project=PROJECT, status="WAITING_TOOL") == 4

        # one completed, one expired by hand, the overdue sleep swept, one cancelled run's wait closed
        approver_key = key_of(await make_key("dw-gauge", {PROJECT: ["approver"]}))
        approver = Client(key=approver_key, scheduler=suite.scheduler, saga=suite.saga)
        try:
            await suite.complete_wait(tokens[0][1][0].wait.wait_id, {"ok": 1})
            expire = scheduler_pb2.ExpireWaitRequest(wait_id=tokens[1][1][0].wait.wait_id)
            await approver.call(approver.scheduler.ExpireWait, expire)
        finally:
            await approver.close()
        await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=cancelled))
        await db.execute("UPDATE awooop_wait SET expires_at = now() WHERE wait_id = $1", uuid.UUID(doomed.wait.wait_id))

        async def all_ended() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM awooop_wait WHERE status = 'open'") == 0)

        await eventually(all_ended, timeout=30, what="the sweep to end the overdue waits")
        await sampler.sample()
        for kind in ("token", "sleep"):
            assert sample("awooop_scheduler_waits_open", project=PROJECT, kind=kind) == 0
        assert sample("awooop_scheduler_oldest_open_wait_age_seconds", project=PROJECT) == 0
        assert sample("awooop_scheduler_wait_overdue_seconds", project=PROJECT) == 0
    finally:
        await pool.close()
    got = {o: sample("awooop_waits_ended_total", outcome=o) - ended[o] for o in ended}
    assert got == {"completed": 1, "timed_out": 2, wait_outcomes.CANCELLED: 1}, got


async def test_a_hand_expiry_racing_completions_has_one_winner(suite: Suite, db: Any, make_key: Any) -> None:
    approver_key = key_of(await make_key("dw-racer", {PROJECT: ["approver"]}))
    approver = Client(key=approver_key, scheduler=suite.scheduler, saga=suite.saga)
    try:
        for _ in range(5):
            run_id, (created, _) = await suite.park_one()
            wait_id = created.wait.wait_id

            async def expire(wait_id: str = wait_id) -> str:
                try:
                    await approver.call(approver.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait_id))
                except AwooopError as err:
                    assert err.reason == errors.WAIT_CLOSED, err
                    return err.details.metadata["outcome"]
                return "expired"

            async def complete(i: int, wait_id: str = wait_id) -> str:
                try:
                    await suite.complete_wait(wait_id, {"i": i})
                except AwooopError as err:
                    assert err.reason == errors.WAIT_CLOSED, err
                    return err.details.metadata["outcome"]
                return "completed-won"

            results = await asyncio.gather(*(x for i in range(4) for x in (expire(), complete(i))))
            winners = [r for r in results if r in ("expired", "completed-won")]
            assert len(winners) == 1, results
            first = "timed_out" if winners == ["expired"] else "completed"
            assert sorted(r for r in results if r not in winners) == [first] * 7, results
            final = await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", uuid.UUID(wait_id))
            assert final == first
            audit = await _audit(db, run_id)
            assert audit.count("WAIT_COMPLETED") + audit.count("WAIT_TIMED_OUT") == 1, audit
            assert (await _row(db, run_id))["status"] == "PENDING"
    finally:
        await approver.close()


# --- one outcome under races ------------------------------------------------------------------


async def test_a_completion_posted_many_times_at_once_has_one_winner(suite: Suite, db: Any) -> None:
    run_id, (created, _) = await suite.park_one()
    wait_id, path = created.wait.wait_id, created.callback_url

    async def by_rpc(i: int) -> str:
        try:
            resp = await suite.complete_wait(wait_id, {"by": f"rpc-{i}"})
        except AwooopError as err:
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == errors.WAIT_CLOSED, err
            assert err.details.metadata["outcome"] == "completed"
            return "refused"
        assert resp.resumed
        return "won"

    async def by_url(i: int) -> str:
        status, body = await _post(suite.http + path, {"by": f"url-{i}"})
        if status == 409:
            assert body["reason"] == errors.WAIT_CLOSED and body["outcome"] == "completed", body
            return "refused"
        assert status == 200, body
        return "won"

    outcomes = await asyncio.gather(*(by_rpc(i) for i in range(8)), *(by_url(i) for i in range(8)))
    assert outcomes.count("won") == 1, outcomes
    assert (await _row(db, run_id))["status"] == "PENDING"
    assert (await _audit(db, run_id)).count("WAIT_COMPLETED") == 1


async def test_a_parked_run_says_what_it_waits_for_and_until_when_and_stops_saying_it_when_resumed(
    suite: Suite, db: Any
) -> None:
    """GetRun (so `awooop runs show` and the console, through the shared timeline wording) names
    a parked run's wait, its expiry and when it parked; the completion clears both."""
    from awooop.cli.timeline import waiting_reason

    run_id, (created, _) = await suite.park_one(timeout=600)
    run = await suite.run(run_id)
    assert run.status == common_pb2.RUN_STATUS_WAITING_TOOL and run.wait_reason == "wait_token"
    assert run.not_before.ToDatetime() == created.wait.expires_at.ToDatetime()
    text = waiting_reason(run, time.time())
    assert text.startswith("parked on a wait token") and "until " in text and "parked since " in text, text
    assert "holds the lease" not in text
    await suite.complete_wait(created.wait.wait_id, {"ok": True})
    run = await suite.run(run_id)
    assert run.status == common_pb2.RUN_STATUS_PENDING and run.wait_reason == "" and not run.HasField("not_before")
    assert not waiting_reason(run, time.time()).startswith("parked")


async def test_completion_racing_the_timeout_has_one_winner(suite: Suite, db: Any, db_dsn: str) -> None:
    for _ in range(5):
        run_id, (created, _) = await suite.park_one(timeout=1.0)
        wait_id = created.wait.wait_id
        expires = created.wait.expires_at.ToNanoseconds() / 1e9

        async def due(expires: float = expires) -> bool:
            return bool(await db.fetchval("SELECT extract(epoch FROM now())") >= expires - 0.05)

        await eventually(due, timeout=5, what="the wait nearly due")

        async def complete(i: int, wait_id: str = wait_id) -> str:
            try:
                await suite.complete_wait(wait_id, {"i": i})
            except AwooopError as err:
                assert err.reason == errors.WAIT_CLOSED, err
                return err.details.metadata["outcome"]
            return "won"

        pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=3)
        try:
            results = await asyncio.gather(*(complete(i) for i in range(6)), *(waits.expire(pool) for _ in range(3)))
        finally:
            await pool.close()
        final = await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", uuid.UUID(wait_id))
        audit = await _audit(db, run_id)
        assert audit.count("WAIT_COMPLETED") + audit.count("WAIT_TIMED_OUT") == 1, audit
        completions = results[:6]
        if final == "completed":  # a completion won: the others name it, the sweeps found nothing
            assert completions.count("won") == 1 and completions.count("completed") == 5, results
            assert results[6:] == [0, 0, 0], results
        else:  # the timeout won (by a sweep, or by a completion that found the time up)
            assert final == "timed_out" and completions.count("timed_out") == 6, results
        assert (await _row(db, run_id))["status"] == "PENDING"


async def test_a_completion_after_the_wait_expired_but_before_any_sweep_is_the_timeout(
    start_services: Any, make_key: Any, db: Any
) -> None:
    """Migration 0160's rule (issue 41, item 7): a completion that arrives when the wait's time is
    up, before the sweep has ended it, commits the timeout instead and is refused naming it, by the
    callback URL and by CompleteWait alike; the parked run resumes to see the timeout. The sweep is
    an hour away here, so only the rule can end these waits."""
    rt, worker_key, admin, _ = await start_suite(
        start_services, make_key, PROJECT, worker="dw-late", admin="dw-late-boss", wait_sweep_interval=3600
    )
    worker_client = Client(key=worker_key, **addresses(rt))
    late = Suite(rt, PROJECT, worker_key, admin, worker_client, worker_client)
    try:
        for by in ("url", "rpc"):
            run_id, (created, _) = await late.park_one(timeout=0.3)
            wait_id = uuid.UUID(created.wait.wait_id)

            async def due(wait_id: uuid.UUID = wait_id) -> bool:
                query = "SELECT expires_at <= now() FROM awooop_wait WHERE wait_id = $1"
                return bool(await db.fetchval(query, wait_id))

            await eventually(due, timeout=10, what="the wait's time up")
            assert await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", wait_id) == "open"
            if by == "url":
                status, body = await _post(late.http + created.callback_url, {"late": True})
                assert (status, body["reason"], body["outcome"]) == (409, errors.WAIT_CLOSED, "timed_out"), body
            else:
                with pytest.raises(AwooopError) as refused:
                    await late.complete_wait(created.wait.wait_id, {"late": True})
                assert refused.value.reason == errors.WAIT_CLOSED
                assert refused.value.details.metadata["outcome"] == "timed_out"
            wait = await db.fetchrow("SELECT status, result FROM awooop_wait WHERE wait_id = $1", wait_id)
            assert (wait["status"], wait["result"]) == ("timed_out", None)
            assert (await _row(db, run_id))["status"] == "PENDING"  # resumed, to meet its timeout
            audit = await _audit(db, run_id)
            assert audit.count("WAIT_TIMED_OUT") == 1 and "WAIT_COMPLETED" not in audit, audit
    finally:
        await worker_client.close()
        await admin.close()


async def test_cancel_reaches_a_parked_run_at_once_and_a_racing_completion_loses_cleanly(suite: Suite, db: Any) -> None:
    # alone: one CancelRun ends the parked run
    run_id, (created, lease) = await suite.park_one()
    resp = await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id))
    assert resp.run.status == common_pb2.RUN_STATUS_CANCELLED
    with pytest.raises(AwooopError) as refused:
        await suite.complete_wait(created.wait.wait_id, {"late": True})
    assert refused.value.reason == errors.INVALID_TRANSITION and refused.value.details.metadata["status"] == "CANCELLED"
    # the parked attempt's token is spent: nothing it still sends touches the run
    with pytest.raises(AwooopError) as lost:
        await suite.worker_client.call(
            suite.worker_client.scheduler.FailRun, scheduler_pb2.FailRunRequest(lease=lease, reason="late")
        )
    assert lost.value.reason == errors.LEASE_LOST
    # racing: the run ends CANCELLED whichever commits first, and is never claimed again
    for _ in range(5):
        run_id, (created, _) = await suite.park_one()

        async def cancel(run_id: str = run_id) -> str:
            await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id))
            return "cancelled"

        async def complete(wait_id: str = created.wait.wait_id) -> str:
            try:
                await suite.complete_wait(wait_id, {"x": 1})
            except AwooopError as err:
                assert err.reason == errors.INVALID_TRANSITION and err.details.metadata["status"] == "CANCELLED"
                return "refused"
            return "completed"

        results = await asyncio.gather(cancel(), complete())
        audit = await _audit(db, run_id)
        assert (await _row(db, run_id))["status"] == "CANCELLED"
        assert audit.count("WAIT_COMPLETED") == (1 if results[1] == "completed" else 0), (results, audit)
        assert audit[-1] == "CANCELLED" and "CLAIMED" not in audit[audit.index("WAIT_PARKED") :], audit


async def test_cancels_and_callback_posts_racing_on_many_parked_runs_end_each_run_once(suite: Suite, db: Any) -> None:
    """The second test of the cancel-against-completion promise (issue 41, item 7), through the
    callback URL and many runs at once: every run ends CANCELLED exactly once, never claimed again;
    a post that won answered 200 and its wait is completed, one that lost answered 409 naming the
    cancelled run, and no wait is completed by a post that was refused."""
    parked = [await suite.park_one() for _ in range(12)]

    async def cancel(run_id: str) -> None:
        await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id))

    answers = await asyncio.gather(
        *(cancel(run_id) for run_id, _ in parked),
        *(_post(suite.http + created.callback_url, {"raced": True}) for _, (created, _) in parked),
    )
    posts = answers[len(parked) :]
    for (run_id, (created, _)), (status, body) in zip(parked, posts, strict=True):
        audit = await _audit(db, run_id)
        assert (await _row(db, run_id))["status"] == "CANCELLED" and audit.count("CANCELLED") == 1, audit
        assert "CLAIMED" not in audit[audit.index("WAIT_PARKED") :], audit
        wait = await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", uuid.UUID(created.wait.wait_id))
        if status == 200:
            assert wait == "completed" and audit.count("WAIT_COMPLETED") == 1, (body, audit)
        else:
            assert (status, body["reason"]) == (409, errors.INVALID_TRANSITION), body
            assert wait != "completed" and "WAIT_COMPLETED" not in audit, (wait, audit)


# --- the boundary ------------------------------------------------------------------------------


async def test_unknown_and_other_projects_waits_are_not_found_and_sleeps_take_no_completion(suite: Suite) -> None:
    _, (created, _) = await suite.park_one()
    for wait_id, client in ((str(uuid.uuid4()), suite.worker_client), (created.wait.wait_id, suite.other)):
        with pytest.raises(AwooopError) as nf:
            await suite.complete_wait(wait_id, {}, client)
        assert nf.value.code == grpc.StatusCode.NOT_FOUND
    _, (sleep, _) = await suite.park_one(kind=scheduler_pb2.WAIT_KIND_SLEEP)
    assert sleep.token == "" and sleep.callback_url == ""
    with pytest.raises(AwooopError) as closed:
        await suite.complete_wait(sleep.wait.wait_id, {})
    assert closed.value.reason == errors.WAIT_CLOSED and closed.value.details.metadata["kind"] == "sleep"
    with pytest.raises(AwooopError) as bad:
        await suite.complete_wait("not-a-uuid", {})
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_completion_before_the_handler_waits_is_kept_and_a_repeated_create_keeps_every_token_valid(
    suite: Suite, db: Any
) -> None:
    suite.parks += 1
    [run_id] = await suite.create_runs(1, priority=suite.parks)
    c = suite.worker_client
    claimed = await c.call(
        c.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="early", project_ids=[PROJECT], max_runs=1)
    )
    [lease] = [r.lease for r in claimed.runs if r.lease.run_id == run_id]
    request = scheduler_pb2.CreateWaitRequest(lease=lease, step_id="w", timeout=_duration(600))
    first = await c.call(c.scheduler.CreateWait, request)
    again = await c.call(c.scheduler.CreateWait, request)  # its answer lost, say: the same wait, a new token
    assert first.created and not again.created and again.wait.wait_id == first.wait.wait_id
    assert again.token and again.token != first.token
    # the first URL may have been handed out already (issue 41, item 2): it still names the wait
    status, body = await _post(suite.http + first.callback_url, {"early": True})
    assert status == 200 and body["resumed"] is False, body  # nobody parked on it yet
    status, body = await _post(suite.http + again.callback_url, {"late": True})
    assert status == 409 and body["reason"] == errors.WAIT_CLOSED, body  # one wait, one outcome
    assert (await _row(db, run_id))["status"] == "RUNNING"
    answer = await c.call(
        c.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=first.wait.wait_id)
    )
    assert not answer.parked and answer.wait.status == scheduler_pb2.WAIT_STATUS_COMPLETED
    assert dict(answer.wait.result) == {"early": True}
    assert (await _row(db, run_id))["status"] == "RUNNING"  # the run goes on under its lease
    assert (await _audit(db, run_id))[-1] == "WAIT_ENDED"
    ended = await c.call(c.scheduler.CreateWait, request)
    assert ended.token == "" and ended.callback_url == ""  # an ended wait issues no token


# --- event waits ------------------------------------------------------------------------------


async def test_an_api_event_with_the_correlation_key_satisfies_a_wait_also_one_that_arrived_just_before(
    suite: Suite, db: Any
) -> None:
    async def send_event(key: str, **payload: Any) -> str:
        resp = await suite.admin.call(
            suite.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=PROJECT,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({"correlation_key": key, **payload}),
            ),
        )
        return resp.outcomes[0].run_id

    early_event = await send_event("order-1", paid=True)  # before the wait exists: its look-back finds it
    [waiting] = await suite.create_runs(1, input=to_struct({"order": "order-2"}))
    [late_waiter] = await suite.create_runs(1, input=to_struct({"order": "order-1"}))

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if "correlation_key" in ctx.input:  # the events are runs of their own
            return {"event": True}
        event = await ctx.wait_for_event(ctx.input["order"], timeout=60, lookback=120)
        return {"paid": event["payload"]["paid"], "event_run": event["run_id"]}

    worker = suite.worker(handler, concurrency=4)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))

    async def done(run_id: str) -> bool:
        return (await _row(db, run_id))["status"] == "COMPLETED"

    await eventually(lambda: done(late_waiter), timeout=30, what="the look-back found the earlier event")
    assert (await _row(db, late_waiter))["output"] == {"paid": True, "event_run": early_event}

    async def parked() -> bool:
        return _parked(await _row(db, waiting))

    await eventually(parked, timeout=30, what="waiting for order-2")
    await send_event("order-3", paid=False)  # another key: nothing happens
    later_event = await send_event("order-2", paid=False)
    await eventually(lambda: done(waiting), timeout=30, what="the event resumed the run")
    await stop_worker(worker, task)
    assert (await _row(db, waiting))["output"] == {"paid": False, "event_run": later_event}
    audit = await _audit(db, waiting)
    assert audit.count("WAIT_COMPLETED") == 1, audit


# --- who may end a wait, and when -------------------------------------------------------------


async def test_completing_a_wait_by_rpc_takes_the_worker_tool_or_approver_role_and_an_ingest_key_is_denied(
    suite: Suite, db: Any, make_key: Any
) -> None:
    """Issue 27's rule: CompleteWait takes the worker or tool role of the wait's project (or an
    operator's approver role, by hand; admin implies them all). A key that only feeds events in
    (ingest) is refused PERMISSION_DENIED naming the roles, and the wait stays open."""
    keys = {
        role: key_of(await make_key(f"dw-{role}-role", {PROJECT: [role]}, "service"))
        for role in ("ingest", "tool", "approver")
    }
    clients = {role: Client(key=key, scheduler=suite.scheduler) for role, key in keys.items()}
    # ingest here, worker elsewhere: its worker role does not reach this project
    mixed = Client(
        key=key_of(await make_key("dw-mixed", {PROJECT: ["ingest"], OTHER: ["worker"]}, "service")),
        scheduler=suite.scheduler,
    )
    try:
        for client in (clients["ingest"], mixed):
            run_id, (created, _) = await suite.park_one()
            wait_id = created.wait.wait_id
            with pytest.raises(AwooopError) as denied:
                await suite.complete_wait(wait_id, {"by": "ingest"}, client=client)
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED and denied.value.reason == errors.FORBIDDEN
            meta = denied.value.details.metadata
            assert (meta["project_id"], meta["role"], meta["wait_id"]) == (
                PROJECT,
                "worker or tool or approver",
                wait_id,
            )
            assert (await _row(db, run_id))["status"] == "WAITING_TOOL"
            assert await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", uuid.UUID(wait_id)) == "open"
            assert "WAIT_COMPLETED" not in await _audit(db, run_id)
        # the roles that may: each completes a wait of its own, and its run resumes
        for name, client in (
            ("worker", suite.worker_client),
            ("tool", clients["tool"]),
            ("approver", clients["approver"]),
            ("admin", suite.admin),
        ):
            run_id, (created, _) = await suite.park_one()
            done = await suite.complete_wait(created.wait.wait_id, {"by": name}, client=client)
            assert done.resumed and done.wait.status == scheduler_pb2.WAIT_STATUS_COMPLETED, name
            assert (await _row(db, run_id))["status"] == "PENDING", name
        # no role in the project at all: the wait does not exist for the caller (nor its run's id)
        _, (created, _) = await suite.park_one()
        with pytest.raises(AwooopError) as hidden:
            await suite.complete_wait(created.wait.wait_id, {}, client=suite.other)
        assert hidden.value.code == grpc.StatusCode.NOT_FOUND
        assert dict(hidden.value.details.metadata) == {"wait_id": created.wait.wait_id}
    finally:
        for c in (*clients.values(), mixed):
            await c.close()


async def test_expiring_by_hand_a_wait_of_a_run_that_has_ended_is_refused_naming_the_runs_status(
    suite: Suite, db: Any, make_key: Any
) -> None:
    """The run is over (cancelled while parked; completed or failed without waiting on it): an
    operator's ExpireWait answers FAILED_PRECONDITION / INVALID_TRANSITION with the run's status,
    as CompleteWait does, writes nothing, and leaves the wait to the sweep; once the sweep has
    closed it, the answer is WAIT_CLOSED naming that outcome."""
    approver = Client(key=key_of(await make_key("dw-ended", {PROJECT: ["approver"]})), scheduler=suite.scheduler)
    c = suite.worker_client
    try:
        cancelled, (parked, _) = await suite.park_one()
        await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=cancelled))
        ended = {cancelled: (parked.wait.wait_id, "CANCELLED")}
        for how in ("COMPLETED", "FAILED"):  # a wait created, then the run ended under its lease
            suite.parks += 1
            [run_id] = await suite.create_runs(1, priority=suite.parks)
            claimed = await c.call(
                c.scheduler.ClaimRuns,
                scheduler_pb2.ClaimRunsRequest(worker_id="end", project_ids=[PROJECT], max_runs=1),
            )
            [lease] = [r.lease for r in claimed.runs if r.lease.run_id == run_id]
            created = await c.call(
                c.scheduler.CreateWait,
                scheduler_pb2.CreateWaitRequest(lease=lease, step_id="w", timeout=_duration(600)),
            )
            if how == "COMPLETED":
                await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
            else:
                await c.call(
                    c.scheduler.FailRun, scheduler_pb2.FailRunRequest(lease=lease, reason="no", retryable=False)
                )
            ended[run_id] = (created.wait.wait_id, how)
        for run_id, (wait_id, status) in ended.items():
            assert (await _row(db, run_id))["status"] == status
            audit = await _audit(db, run_id)
            with pytest.raises(AwooopError) as refused:
                await approver.call(approver.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait_id))
            err = refused.value
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == errors.INVALID_TRANSITION, err
            assert (err.details.metadata["status"], err.details.metadata["run_id"]) == (status, run_id)
            assert f"in status {status}" in str(err)
            wait = await db.fetchrow(
                "SELECT status, completed_by FROM awooop_wait WHERE wait_id = $1", uuid.UUID(wait_id)
            )
            assert (wait["status"], wait["completed_by"]) == ("open", None)  # left to the sweep
            assert await _audit(db, run_id) == audit
        # the sweep closes them (timed out, the run untouched); an expiry then names that outcome
        await db.execute(
            "UPDATE awooop_wait SET expires_at = now() WHERE wait_id = ANY($1::uuid[])",
            [uuid.UUID(w) for w, _ in ended.values()],
        )

        async def swept() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM awooop_wait WHERE wait_id = ANY($1::uuid[]) AND status = 'timed_out'",
                [uuid.UUID(w) for w, _ in ended.values()],
            )
            return bool(n == len(ended))

        await eventually(swept, timeout=30, what="the sweep to close the ended runs' waits")
        for run_id, (wait_id, status) in ended.items():
            with pytest.raises(AwooopError) as closed:
                await approver.call(approver.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait_id))
            assert closed.value.reason == errors.WAIT_CLOSED and closed.value.details.metadata["outcome"] == "timed_out"
            assert (await _row(db, run_id))["status"] == status
    finally:
        await approver.close()


# --- waits and concurrency keys ---------------------------------------------------------------


async def test_a_parked_run_gives_its_concurrency_slots_back_so_its_children_with_the_key_can_run(
    suite: Suite, db: Any
) -> None:
    """A run holds a slot of each of its keys while it holds its lease (docs/flow-control.md); a
    run parked on a durable wait holds no lease, so it holds no slot either: another run with the
    key is claimable at once, and a parent fanning out to children that carry its key (a limit of
    1: mutual exclusion) is not deadlocked by its own slot. Resumed, the run takes a slot again
    through the claim, as any queued run."""
    key = "deploy"
    await suite.admin.call(
        suite.admin.scheduler.SetConcurrencyLimit,
        scheduler_pb2.SetConcurrencyLimitRequest(project_id=PROJECT, key=key, max_running=1),
    )

    async def running() -> int:
        return int(
            await db.fetchval(
                "SELECT running FROM awooop_concurrency_limit WHERE project_id = $1 AND key = $2", PROJECT, key
            )
        )

    run_id, (created, _) = await suite.park_one_with(concurrency_keys=[key])
    assert await running() == 0  # parked: the slot is back
    [other] = await suite.create_runs(1, concurrency_keys=[key], priority=1000)
    c = suite.worker_client
    claimed = await c.call(
        c.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="next", project_ids=[PROJECT], max_runs=5)
    )
    assert [r.run.run_id for r in claimed.runs] == [other]
    assert await running() == 1
    # the parked run resumes while the other holds the key: it waits for the key, then takes it
    await suite.complete_wait(created.wait.wait_id, {"ok": True})
    row = await db.fetchrow("SELECT status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
    assert row["status"] == "PENDING" and await running() == 1
    [lease] = [r.lease for r in claimed.runs]
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
    again = await c.call(
        c.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(worker_id="again", project_ids=[PROJECT], max_runs=5, wait=_duration(5)),
    )
    assert [r.run.run_id for r in again.runs] == [run_id] and await running() == 1
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=again.runs[0].lease))
    assert await running() == 0


async def test_a_parent_whose_children_carry_its_key_of_limit_1_resumes_when_they_ran(suite: Suite, db: Any) -> None:
    """The deadlock a parked run's slot made: the parent parks on its children, which need the
    key it holds; they run one at a time while it is parked, and it resumes with their outputs."""
    key = "deploy"
    await suite.admin.call(
        suite.admin.scheduler.SetConcurrencyLimit,
        scheduler_pb2.SetConcurrencyLimitRequest(project_id=PROJECT, key=key, max_running=1),
    )

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if "child" in ctx.input:  # (a claimed run does not carry its parent: GetRun's tree fields)
            return {"child": ctx.input["child"]}
        outcomes = await ctx.run_children([Child({"child": n}, concurrency_keys=[key]) for n in range(2)])
        return {"children": [o.output for o in outcomes]}

    [parent] = await suite.create_runs(1, concurrency_keys=[key])
    worker = suite.worker(handler, concurrency=4)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def done() -> bool:
            return bool((await _row(db, parent))["status"] == "COMPLETED")

        await eventually(done, timeout=30, what="the parent resumed after its children ran under its key")
    finally:
        await stop_worker(worker, task)
    assert (await _row(db, parent))["output"] == {"children": [{"child": 0}, {"child": 1}]}
    slots = await db.fetchval("SELECT running FROM awooop_concurrency_limit WHERE project_id = $1", PROJECT)
    assert slots == 0
