"""Child runs against the real services (ingest, scheduler, saga, the reference gateway; real
Postgres and Redis; real worker processes): a parent fans out 20 children over 4 worker
processes, two of them SIGKILLed mid-way, each child's steps execute once and the parent resumes
once with 20 results; cancelling a parent cancels its unfinished children and compensates its
finished ones newest first, each in reverse step order, before its own steps; a parent run
again never starts a child twice; fail-fast; the depth and fan-out limits; another project's
worker cannot reach a run's children; GetRun shows the run tree."""

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
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import grpc
import pytest
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Child, Client, RunContext, ToolClient, Worker, to_struct
from awooop.worker.children import read_outcome
from services.common import errors
from services.common.runtime import Runtime
from services.common.settings import Settings
from services.saga import driver_sql
from tests.harness import suite as suite_harness
from tests.harness.helpers import ROOT, eventually, key_of, service_key, settings_env, spawn_services
from tests.harness.rpc_runs import ingest_runs
from tests.harness.suite import addresses, start_suite, stop_worker

PROJECT = "cr"
OTHER = "cr-other"
DEPTH = 2  # AWOOOP_MAX_CHILD_DEPTH of these tests
FAN_OUT = 25  # AWOOOP_MAX_CHILDREN_PER_RUN of these tests


@dataclass
class Suite(suite_harness.Suite):
    worker_client: Client
    other: Client  # a worker of another project
    gw: Runtime  # the reference gateway's

    async def create_runs(self, inputs: list[dict[str, Any]], **kw: Any) -> list[str]:
        return await ingest_runs(self.admin, PROJECT, inputs, **kw)

    async def get(self, run_id: str) -> scheduler_pb2.GetRunResponse:
        return await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))

    async def claim(self, run_id: str) -> common_pb2.LeaseToken:
        """Claims run_id by hand: the caller made it the project's highest priority; a run claimed
        instead (run_id still in a retry backoff) is released and the claim tried again."""
        c = self.worker_client
        for _ in range(50):
            claimed = await c.call(
                c.scheduler.ClaimRuns,
                scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=1),
            )
            for r in claimed.runs:
                if r.lease.run_id == run_id:
                    return r.lease
                await c.call(c.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=r.lease))
            await asyncio.sleep(0.1)
        raise AssertionError(f"run {run_id} was never claimed")

    async def start_children(
        self, lease: common_pb2.LeaseToken, step_ids: list[str], client: Client | None = None, **kw: Any
    ) -> scheduler_pb2.StartChildRunsResponse:
        c = client or self.worker_client
        specs = [scheduler_pb2.ChildRunSpec(step_id=s, input=to_struct({"step": s})) for s in step_ids]
        return await c.call(
            c.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=lease, children=specs, **kw)
        )


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> AsyncIterator[Suite]:
    rt, worker_key, admin, gw = await start_suite(
        start_services,
        make_key,
        PROJECT,
        worker="cr-worker",
        admin="cr-boss",
        wait_sweep_interval=0.2,
        max_child_depth=DEPTH,
        max_children_per_run=FAN_OUT,
    )
    other_key = key_of(await make_key("cr-other", {OTHER: ["worker"]}, "service"))
    worker_client = Client(key=worker_key, **addresses(rt))
    other = Client(key=other_key, **addresses(rt))
    yield Suite(rt, PROJECT, worker_key, admin, worker_client, other, gw)
    for c in (admin, worker_client, other):
        await c.close()


async def _status(db: asyncpg.Connection, run_id: str) -> str:
    return str(await db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id)))


async def _output(db: asyncpg.Connection, run_id: str) -> Any:
    raw = await db.fetchval("SELECT output FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
    return json.loads(raw) if raw is not None else None


def undo(result: dict[str, Any]) -> dict[str, Any]:
    """A knowledge entry's compensation: delete it."""
    return {"tool_id": "knowledge_delete", "params": {"entry_id": result["entry_id"]}, "reason": "undo"}


def writer(tools: ToolClient) -> Any:
    """write(ctx, step, entry): a tool step writing a knowledge entry, compensated by deleting it."""

    async def write(ctx: RunContext, step: str, entry: str) -> None:
        params = {"entry_id": entry, "content": {}}
        await ctx.step(step, tools.execute, tool_id="knowledge_write", params=params, compensation=undo)

    return write


# --- fan-out over worker processes, two SIGKILLed ----------------------------------------------

WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, os, sys
    from awooop.worker import ToolClient, Worker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    tools = ToolClient(os.environ["GATEWAY"], key=os.environ["AWOOOP_API_KEY"])

    async def handle(ctx):
        if ctx.input.get("role") == "child":
            i = ctx.input["i"]
            for part in ("a", "b"):
                await ctx.step(part, tools.execute, tool_id="knowledge_write",
                               params={"entry_id": f"c{i}-{part}", "content": {"i": i}})
                await asyncio.sleep(0.4)
            return {"i": i, "square": i * i}
        outcomes = await ctx.run_children([{"role": "child", "i": i} for i in range(20)])
        print("resumed", ctx.run_id, len(outcomes), flush=True)
        return {"results": [[o.status, o.output.get("square")] for o in outcomes]}

    asyncio.run(Worker(handle, projects=[sys.argv[1]], lease_ttl=2, heartbeat_interval=0.3, claim_wait=1,
                       concurrency=3).run())
    """
)


@contextlib.asynccontextmanager
async def worker_processes(suite: Suite, tmp: Path, n: int) -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    script = tmp / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "AWOOOP_API_KEY": suite.worker_key, "AWOOOP_SCHEDULER_ADDR": suite.scheduler,
           "AWOOOP_SAGA_ADDR": suite.saga, "GATEWAY": suite.gateway}  # fmt: skip
    procs = []
    for i in range(n):
        with open(tmp / f"worker{i}.log", "wb") as out:
            procs.append(
                subprocess.Popen([sys.executable, str(script), PROJECT], env=env, cwd=ROOT, stdout=out, stderr=out)
            )
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


async def test_a_parent_fans_out_20_children_over_4_workers_two_sigkilled_each_step_once_one_resume(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    [parent] = await suite.create_runs([{"role": "parent"}])
    async with worker_processes(suite, tmp_path, 4) as procs:

        async def some_children_done() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM awooop_run_state WHERE parent_run_id = $1 AND status = 'COMPLETED'",
                uuid.UUID(parent),
            )
            return bool(n >= 4)

        await eventually(some_children_done, timeout=60, what="a few children completed")
        # two workers die mid-way, with children in their hands
        for p in procs[:2]:
            p.send_signal(signal.SIGKILL)
            await asyncio.to_thread(p.wait, 10)

        async def parent_done() -> bool:
            return await _status(db, parent) == "COMPLETED"

        await eventually(parent_done, timeout=120, what="the parent completed")
        for p in procs[2:]:
            p.send_signal(signal.SIGTERM)
            await asyncio.to_thread(p.wait, 30)
    out = await _output(db, parent)
    assert out == {"results": [["completed", i * i] for i in range(20)]}
    logs = "".join((tmp_path / f"worker{i}.log").read_text() for i in range(4))
    assert logs.count(f"resumed {parent} 20") == 1, logs[-3000:]
    # every child step executed by the gateway exactly once (a killed attempt's retry replays)
    kids = await db.fetch("SELECT run_id FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
    assert len(kids) == 20
    executed = await db.fetch(
        "SELECT idempotency_key, count(*) AS n FROM awooop_refgw_request WHERE project_id = $1 AND outcome = 'executed'"
        " GROUP BY idempotency_key",
        PROJECT,
    )
    counts = {r["idempotency_key"]: r["n"] for r in executed}
    want = {f"{k['run_id']}:{part}" for k in kids for part in ("a", "b")}
    assert set(counts) == want and set(counts.values()) == {1}, counts
    # the kills left work behind that other workers took over (reaped leases)
    reaped = await db.fetchval(
        "SELECT count(*) FROM awooop_audit_log a JOIN awooop_run_state r ON r.run_id = a.run_id"
        " WHERE r.parent_run_id = $1 AND a.action = 'REAPED'",
        uuid.UUID(parent),
    )
    assert reaped >= 1
    # the parent parked once on its children and resumed once
    actions = [
        r["action"]
        for r in await db.fetch(
            "SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(parent)
        )
    ]
    assert actions.count("WAIT_PARKED") == 1 and actions.count("WAIT_COMPLETED") == 1, actions


# --- cancel cascades, compensation order -------------------------------------------------------


async def test_cancelling_a_parent_cancels_its_children_and_compensates_the_finished_ones_newest_first(
    suite: Suite, db: Any
) -> None:
    tools = ToolClient(suite.gateway, key=suite.worker_key)

    def undo(result: dict[str, Any]) -> dict[str, Any]:
        return {"tool_id": "knowledge_delete", "params": {"entry_id": result["entry_id"]}, "reason": "undo"}

    async def write(ctx: RunContext, step: str, entry: str) -> None:
        await ctx.step(
            step,
            tools.execute,
            tool_id="knowledge_write",
            params={"entry_id": entry, "content": {}},
            compensation=undo,
        )

    async def handler(ctx: RunContext) -> dict[str, Any]:
        role = ctx.input.get("role")
        if role == "fast":
            await write(ctx, "a", f"{ctx.input['name']}-a")
            await write(ctx, "b", f"{ctx.input['name']}-b")
            return {"done": ctx.input["name"]}
        if role == "slow":
            await ctx.wait(await ctx.create_wait(timeout=600))
            return {"unexpected": True}
        await write(ctx, "own", "parent-own")
        kids = [Child({"role": "fast", "name": f"f{i}"}, step_id=f"f{i}") for i in range(3)]
        kids += [Child({"role": "slow"}, step_id=f"s{i}") for i in range(2)]
        await ctx.run_children(kids)
        return {"unexpected": True}

    [parent] = await suite.create_runs([{"role": "parent"}])
    worker = suite.worker(handler, concurrency=6)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def settled() -> bool:
            rows = await db.fetch(
                "SELECT parent_step_id, status, worker_id FROM awooop_run_state WHERE parent_run_id = $1",
                uuid.UUID(parent),
            )
            by = {r["parent_step_id"]: (r["status"], r["worker_id"]) for r in rows}
            return (
                len(by) == 5
                and all(by[f"f{i}"][0] == "COMPLETED" for i in range(3))
                and all(by[f"s{i}"] == ("WAITING_TOOL", None) for i in range(2))
                and await _status(db, parent) == "WAITING_TOOL"
            )

        await eventually(settled, timeout=30, what="fast children done, slow ones and the parent parked")
        await suite.admin.call(
            suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=parent, reason="operator")
        )

        async def compensated() -> bool:
            return (
                await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent))
                == "compensated"
            )

        await eventually(compensated, timeout=30, what="the parent compensated")
    finally:
        await stop_worker(worker, task)
        await tools.close()
    tree = await suite.get(parent)
    assert tree.run.status == common_pb2.RUN_STATUS_CANCELLED
    by_step = {c.step_id: c for c in tree.children}
    assert [c.step_id for c in tree.children] == ["f0", "f1", "f2", "s0", "s1"]
    assert all(by_step[f"s{i}"].status == common_pb2.RUN_STATUS_CANCELLED for i in range(2))
    assert all(by_step[f"f{i}"].status == common_pb2.RUN_STATUS_COMPLETED for i in range(3))
    # the gateway's record of the compensations: newest child first, each child's steps in
    # reverse, then the parent's own step
    rows = await db.fetch(
        "SELECT idempotency_key FROM awooop_refgw_request WHERE project_id = $1 AND idempotency_key LIKE '%:compensate'"
        " AND outcome = 'executed' ORDER BY request_id",
        PROJECT,
    )
    names = {str(c.run_id): c.step_id for c in tree.children} | {parent: "parent"}
    order = [f"{names[k.split(':')[0]]}:{k.split(':')[1]}" for k in (r["idempotency_key"] for r in rows)]
    assert order == ["f2:b", "f2:a", "f1:b", "f1:a", "f0:b", "f0:a", "parent:own"], order
    left = await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE project_id = $1", PROJECT)
    assert left == 0
    for c in tree.children:
        child = await suite.get(c.run_id)
        assert child.run.parent_run_id == parent and child.run.parent_step_id == c.step_id
        assert child.run.child_depth == 1


async def test_a_child_handler_reads_its_parent_from_the_claimed_run(suite: Suite, db: Any) -> None:
    """ctx.run is the run as ClaimRuns answered it: a child's names its parent and step id, a
    root's names none; a claim replayed by its claim id answers the same."""
    seen: dict[str, tuple[str, str, int]] = {}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen[ctx.input["role"]] = (ctx.run.parent_run_id, ctx.run.parent_step_id, ctx.run.child_depth)
        if ctx.input["role"] == "parent":
            [out] = await ctx.run_children([Child({"role": "child"}, step_id="kid")])
            return {"child": out.status}
        return {}

    [parent] = await suite.create_runs([{"role": "parent"}])
    worker = suite.worker(handler, concurrency=2)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await eventually(lambda: _done(db, parent), timeout=30, what="the parent completed")
    finally:
        await stop_worker(worker, task)
    assert seen["parent"] == ("", "", 0)
    assert seen["child"] == (parent, "kid", 1)
    # by hand, with a claim id: the first answer and its replay carry the tree alike
    [root] = await suite.create_runs([{"role": "root"}], priority=100)
    lease = await suite.claim(root)
    [child] = (await suite.start_children(lease, ["by-hand"])).children
    await db.execute("UPDATE awooop_run_state SET priority = 90 WHERE run_id = $1", uuid.UUID(child.run_id))
    c = suite.worker_client
    ask = scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=1, claim_id="tree-1")
    first = await c.call(c.scheduler.ClaimRuns, ask)
    again = await c.call(c.scheduler.ClaimRuns, ask)
    for answer in (first, again):
        [got] = answer.runs
        assert got.run.run_id == child.run_id
        assert (got.run.parent_run_id, got.run.parent_step_id, got.run.child_depth) == (root, "by-hand", 1)


async def _done(db: asyncpg.Connection, run_id: str) -> bool:
    return await _status(db, run_id) == "COMPLETED"


# --- a parent run again, fail-fast ---------------------------------------------------------------


async def test_a_parent_run_again_finds_its_children_and_never_starts_them_twice(suite: Suite, db: Any) -> None:
    [parent] = await suite.create_runs([{"role": "parent"}])
    lease = await suite.claim(parent)
    # the children continue the parent's trace (tracing is off here: the parent's stored context)
    trace_id = os.urandom(16).hex()
    await db.execute(
        "UPDATE awooop_run_state SET traceparent = $2 WHERE run_id = $1",
        uuid.UUID(parent),
        f"00-{trace_id}-{os.urandom(8).hex()}-01",
    )
    first = await suite.start_children(lease, ["x", "y"])
    traces = await db.fetch("SELECT traceparent FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
    assert [t["traceparent"].split("-")[1] for t in traces] == [trace_id, trace_id]
    assert [c.started for c in first.children] == [True, True]
    # the same attempt again (a retried call) and a later attempt (the reaper took the lease)
    again = await suite.start_children(lease, ["x", "y"])
    assert [c.run_id for c in again.children] == [c.run_id for c in first.children]
    assert not any(c.started for c in again.children)
    await db.execute(
        "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' WHERE run_id = $1", uuid.UUID(parent)
    )

    async def requeued() -> bool:
        return await _status(db, parent) == "PENDING"

    await eventually(requeued, timeout=10, what="the reaper took the lease back")
    # the children are claimable too: make the parent the one claimed first
    await db.execute("UPDATE awooop_run_state SET priority = 10 WHERE run_id = $1", uuid.UUID(parent))
    second = await suite.claim(parent)
    assert second.attempt == lease.attempt + 1
    with pytest.raises(AwooopError) as stale:
        await suite.start_children(lease, ["z"])
    assert stale.value.reason == errors.LEASE_LOST
    third = await suite.start_children(second, ["x", "y", "z"], wait_step_id="all")
    assert [c.run_id for c in third.children[:2]] == [c.run_id for c in first.children]
    assert [c.started for c in third.children] == [False, False, True]
    assert third.wait.kind == scheduler_pb2.WAIT_KIND_CHILDREN and third.wait.status == scheduler_pb2.WAIT_STATUS_OPEN
    # only its children end it: CompleteWait is refused, naming the kind, and changes nothing
    with pytest.raises(AwooopError) as by_hand:
        await suite.worker_client.call(
            suite.worker_client.scheduler.CompleteWait, scheduler_pb2.CompleteWaitRequest(wait_id=third.wait.wait_id)
        )
    assert by_hand.value.reason == errors.WAIT_CLOSED and by_hand.value.details.metadata["kind"] == "children"
    with pytest.raises(AwooopError) as elsewhere:
        await suite.other.call(
            suite.other.scheduler.CompleteWait, scheduler_pb2.CompleteWaitRequest(wait_id=third.wait.wait_id)
        )
    assert elsewhere.value.code == grpc.StatusCode.NOT_FOUND
    status = await db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", uuid.UUID(third.wait.wait_id))
    assert status == "open"
    n = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
    assert n == 3
    created = await db.fetchval(
        "SELECT count(*) FROM awooop_audit_log a JOIN awooop_run_state r ON r.run_id = a.run_id"
        " WHERE r.parent_run_id = $1 AND a.action = 'RUN_CREATED'",
        uuid.UUID(parent),
    )
    assert created == 3


async def test_fail_fast_ends_the_wait_at_the_first_failed_child_and_cancels_the_rest(suite: Suite, db: Any) -> None:
    seen: list[list[tuple[str, str]]] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        role = ctx.input.get("role")
        if role == "fails":
            await ctx.fail("broken", error_code="E-CHILD")
            return {}
        if role == "slow":
            await ctx.wait(await ctx.create_wait(timeout=600))
            return {}
        if role == "ok":
            return {"fine": True}
        mode = ctx.input["mode"]
        kids = [
            Child({"role": "slow"}, step_id="slow"),
            Child({"role": "ok"}, step_id="ok"),
            Child({"role": "fails"}, step_id="fails"),
        ]
        outcomes = await ctx.run_children(kids if mode == "fast" else kids[1:], fail_fast=mode == "fast")
        seen.append([(o.step_id, o.status) for o in outcomes])
        return {"statuses": {o.step_id: o.status for o in outcomes}, "errors": [o.error_code for o in outcomes]}

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    fast, collect = await suite.create_runs([{"role": "parent", "mode": "fast"}, {"role": "parent", "mode": "all"}])
    worker = suite.worker(handler, concurrency=8)  # registers the worker's metrics
    before = {
        "sdk": sample("awooop_worker_children_started_total"),
        "scheduler": sample("awooop_scheduler_children_started_total"),
        "failed": sample("awooop_worker_children_ended_total", status="failed"),
    }
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def both_done() -> bool:
            slow = await db.fetchval(
                "SELECT status FROM awooop_run_state WHERE parent_run_id = $1 AND parent_step_id = 'slow'",
                uuid.UUID(fast),
            )
            done = await _status(db, fast) == "COMPLETED" and await _status(db, collect) == "COMPLETED"
            return done and slow == "CANCELLED"

        await eventually(both_done, timeout=30, what="both parents completed, the slow sibling cancelled")
    finally:
        await stop_worker(worker, task)
    out = await _output(db, fast)
    # the slow sibling: cancelled at once when parked, or asked to cancel while leased (still
    # "running" when the parent read it; it ends CANCELLED, below)
    assert out["statuses"]["fails"] == "failed" and out["statuses"]["slow"] in ("cancelled", "running"), out
    assert out["errors"][2] == "E-CHILD"
    # the counters: 5 children started (each once), and each parent saw its failed child once
    assert sample("awooop_worker_children_started_total") - before["sdk"] == 5
    assert sample("awooop_scheduler_children_started_total") - before["scheduler"] == 5
    assert sample("awooop_worker_children_ended_total", status="failed") - before["failed"] == 2
    assert await _output(db, collect) == {
        "statuses": {"ok": "completed", "fails": "failed"},
        "errors": ["", "E-CHILD"],
    }
    # the cancelled sibling's history says who cancelled it and why (leased, it was asked to
    # cancel; parked, it was cancelled at once)
    slow = await db.fetchrow(
        "SELECT run_id, status FROM awooop_run_state WHERE parent_run_id = $1 AND parent_step_id = 'slow'",
        uuid.UUID(fast),
    )
    assert slow["status"] == "CANCELLED"
    why = await db.fetchrow(
        "SELECT action, reason FROM awooop_audit_log WHERE run_id = $1 AND actor = 'system:fail-fast'", slow["run_id"]
    )
    assert why["action"] in ("CANCELLED", "CANCEL_REQUESTED") and "fail-fast" in why["reason"], why


# --- limits and isolation ----------------------------------------------------------------------


async def test_depth_and_fan_out_limits_answer_clear_errors(suite: Suite, db: Any) -> None:
    [root] = await suite.create_runs([{"role": "root"}], priority=100)
    lease = await suite.claim(root)
    [child] = (await suite.start_children(lease, ["c"])).children
    await db.execute("UPDATE awooop_run_state SET priority = 50 WHERE run_id = $1", uuid.UUID(child.run_id))
    child_lease = await suite.claim(child.run_id)
    [grandchild] = (await suite.start_children(child_lease, ["g"])).children  # depth 2: the limit
    await db.execute("UPDATE awooop_run_state SET priority = 40 WHERE run_id = $1", uuid.UUID(grandchild.run_id))
    grand_lease = await suite.claim(grandchild.run_id)
    with pytest.raises(AwooopError) as deep:
        await suite.start_children(grand_lease, ["too-deep"])
    assert deep.value.code == grpc.StatusCode.FAILED_PRECONDITION and deep.value.reason == errors.CHILD_LIMIT
    assert deep.value.details.metadata["limit"] == str(DEPTH) and deep.value.details.metadata["depth"] == "2"
    # the fan-out limit counts every child the run ever started
    await suite.start_children(lease, [f"k{i}" for i in range(FAN_OUT - 1)])
    with pytest.raises(AwooopError) as wide:
        await suite.start_children(lease, ["one-too-many"])
    assert wide.value.code == grpc.StatusCode.FAILED_PRECONDITION and wide.value.reason == errors.CHILD_LIMIT
    assert wide.value.details.metadata["children"] == str(FAN_OUT)
    again = await suite.start_children(lease, ["c", *[f"k{i}" for i in range(FAN_OUT - 1)]])  # found, not new
    assert not any(c.started for c in again.children)
    # one call's size and its fields are input errors, all named at once
    with pytest.raises(AwooopError) as bad:
        await suite.start_children(lease, ["dup", "dup", ""])
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.value.reason == errors.FIELD_INVALID
    fields = {f for f, _ in bad.value.details.violations}
    assert {"children[1].step_id", "children[2].step_id"} <= fields, fields
    with pytest.raises(AwooopError) as empty:
        await suite.start_children(lease, [])
    assert empty.value.code == grpc.StatusCode.INVALID_ARGUMENT
    n = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(root))
    assert n == FAN_OUT  # nothing refused was started


async def test_another_projects_worker_cannot_start_or_read_a_runs_children(suite: Suite, db: Any) -> None:
    [parent] = await suite.create_runs([{"role": "parent"}])
    lease = await suite.claim(parent)
    [child] = (await suite.start_children(lease, ["c"])).children
    with pytest.raises(AwooopError) as other:
        await suite.start_children(lease, ["c2"], client=suite.other)
    assert other.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(AwooopError) as read:
        await suite.other.call(suite.other.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=child.run_id))
    assert read.value.code == grpc.StatusCode.NOT_FOUND
    # a CHILDREN wait is made only with its children, never by CreateWait
    with pytest.raises(AwooopError) as kind:
        await suite.worker_client.call(
            suite.worker_client.scheduler.CreateWait,
            scheduler_pb2.CreateWaitRequest(lease=lease, step_id="w", kind=scheduler_pb2.WAIT_KIND_CHILDREN),
        )
    assert kind.value.code == grpc.StatusCode.INVALID_ARGUMENT
    n = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
    assert n == 1
    tree = await suite.get(parent)
    assert [(c.run_id, c.step_id) for c in tree.children] == [(child.run_id, "c")]
    assert (await suite.get(child.run_id)).run.parent_run_id == parent
    # `awooop runs show` shows the tree both ways
    shown = await _cli(suite, "show", parent)
    assert shown.returncode == 0, shown.stderr
    assert "children (1, in start order)" in shown.stdout and f"c  {child.run_id}  PENDING" in shown.stdout
    shown = await _cli(suite, "show", child.run_id)
    assert shown.returncode == 0, shown.stderr
    assert "parent" in shown.stdout and f"{parent}  (step c, depth 1)" in shown.stdout, shown.stdout


async def _cli(suite: Suite, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": suite.admin.key}
    cmd = [sys.executable, "-m", "awooop.cli", "runs", *args, "--scheduler", suite.scheduler, "--saga", suite.saga]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_children_ending_at_once_end_the_parents_wait_exactly_once(suite: Suite, db: Any) -> None:
    """The last children of a wait completing concurrently (one CompleteRun each, all at once):
    whichever commits last sees the others ended and resumes the parent, every round."""
    for round_no in range(3):
        [parent] = await suite.create_runs([{"round": round_no}], priority=100)
        lease = await suite.claim(parent)
        started = await suite.start_children(lease, [f"k{i}" for i in range(20)], wait_step_id="all")
        c = suite.worker_client
        parked = await c.call(
            c.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=started.wait.wait_id)
        )
        assert parked.parked
        claimed = await c.call(
            c.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="many", project_ids=[PROJECT], max_runs=20)
        )
        assert sorted(r.lease.run_id for r in claimed.runs) == sorted(k.run_id for k in started.children)
        await asyncio.gather(
            *(c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=r.lease)) for r in claimed.runs)
        )
        wait = await db.fetchrow(
            "SELECT status, completed_by FROM awooop_wait WHERE wait_id = $1", uuid.UUID(started.wait.wait_id)
        )
        assert wait["status"] == "completed" and wait["completed_by"] == "system:children"
        assert await _status(db, parent) == "PENDING"
        resumed = await db.fetchval(
            "SELECT count(*) FROM awooop_audit_log WHERE run_id = $1 AND action = 'WAIT_COMPLETED'", uuid.UUID(parent)
        )
        assert resumed == 1
        # the parent runs again: its children are found, ended, with their outputs
        again = await suite.claim(parent)
        after = await suite.start_children(again, [f"k{i}" for i in range(20)])
        assert all(k.status == common_pb2.RUN_STATUS_COMPLETED and not k.started for k in after.children)
        await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=again))


async def _deadlocks(db: asyncpg.Connection) -> int:
    """Deadlocks Postgres has detected in this test's database (its own: a fresh clone per test)."""
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return int(await db.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))


async def test_parents_cancelled_as_their_last_children_end_never_deadlock(suite: Suite, db: Any) -> None:
    """50 trees, each cancelled at its root at the very moment the last child of its parked
    wait ends (CompleteRun or FailRun, its worker's call), every pair sent at once, 6 rounds.
    Half the trees are a parent parked on two children; half a root parked on one child that is
    parked on two children of its own (the cancel cascades through it to the grandchild that is
    ending). The cancel takes the tree's locks in the order a child's end takes them (deeper
    runs, then a run's children wait, then the run), so no pair deadlocks: every call is answered
    OK the first time (no retries: a deadlock would surface as UNAVAILABLE), Postgres counts no
    deadlock, and each tree ends in the one state either order gives. (Without that order about
    one pair in 30 deadlocked; locking only the root's own children, every few two-level ones.)"""
    rounds, per_round = 6, 50
    no_retry = [("grpc.enable_retries", 0)]
    admin = Client(key=suite.admin.key, scheduler=suite.scheduler, channel_options=no_retry)
    c = Client(key=suite.worker_key, scheduler=suite.scheduler, channel_options=no_retry)
    before = await _deadlocks(db)

    @dataclass
    class Tree:
        root: str
        middle: str | None = None  # the parked child between root and the ending run (two levels)
        first: str = ""  # ends before the race
        last: str = ""  # ends in the race
        ends: str = "complete"

    trees: list[Tree] = []

    async def park(lease: common_pb2.LeaseToken, step_ids: list[str]) -> list[str]:
        """Starts the run's children and parks it on them; their run ids."""
        started = await suite.start_children(lease, step_ids, wait_step_id="all")
        parked = await c.call(
            c.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=lease, wait_id=started.wait.wait_id)
        )
        assert parked.parked
        return [k.run_id for k in started.children]

    async def claim(n: int) -> dict[str, common_pb2.LeaseToken]:
        request = scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=n)
        claimed = await c.call(c.scheduler.ClaimRuns, request)
        assert len(claimed.runs) == n
        return {r.lease.run_id: r.lease for r in claimed.runs}

    try:
        for round_no in range(rounds):
            roots = await suite.create_runs([{"round": round_no, "i": i} for i in range(per_round)])
            leases = await claim(per_round)
            batch = [Tree(root, ends="fail" if i % 4 >= 2 else "complete") for i, root in enumerate(roots)]
            one, two = batch[::2], batch[1::2]
            kids = await asyncio.gather(*(park(leases[t.root], ["first", "last"]) for t in one))
            for t, (first, last) in zip(one, kids, strict=True):
                t.first, t.last = first, last
            middles = await asyncio.gather(*(park(leases[t.root], ["middle"]) for t in two))
            for t, (middle,) in zip(two, middles, strict=True):
                t.middle = middle
            leases |= await claim(2 * len(one) + len(two))
            kids = await asyncio.gather(*(park(leases[t.middle], ["first", "last"]) for t in two if t.middle))
            for t, (first, last) in zip(two, kids, strict=True):
                t.first, t.last = first, last
            leases |= await claim(2 * len(two))
            ok = [
                c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=leases[t.first])) for t in batch
            ]
            await asyncio.gather(*ok)
            calls: list[Awaitable[Any]] = []
            for t in batch:
                cancel = scheduler_pb2.CancelRunRequest(run_id=t.root, reason="race")
                calls.append(admin.call(admin.scheduler.CancelRun, cancel))
                ending = leases[t.last]
                if t.ends == "fail":
                    failing = scheduler_pb2.FailRunRequest(lease=ending, reason="broke")
                    calls.append(c.call(c.scheduler.FailRun, failing))
                else:
                    calls.append(c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=ending)))
            # each tree's pair next to each other, all sent at once
            answers = await asyncio.gather(*calls, return_exceptions=True)
            failed = [a for a in answers if isinstance(a, BaseException)]
            assert not failed, (round_no, len(failed), failed[:3])
            trees += batch
    finally:
        await admin.close()
        await c.close()
    # every tree ended in the one state both orders give: the root cancelled once, a parked
    # child between cancelled by the cascade (queued again first, when its last child ended
    # first), the last child ended as its worker said (a cancel arriving first only asked the
    # leased child to stop)
    for t in trees:
        assert await _status(db, t.root) == "CANCELLED"
        if t.middle is not None:
            assert await _status(db, t.middle) == "CANCELLED"
        assert await _status(db, t.last) == ("FAILED" if t.ends == "fail" else "COMPLETED")
        for run in filter(None, (t.root, t.middle)):
            actions = [
                r["action"]
                for r in await db.fetch(
                    "SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(run)
                )
            ]
            assert actions.count("CANCELLED") == 1, actions
            # resumed by its last child (that child ended first) or not (the cancel came first), never both
            assert actions.count("WAIT_COMPLETED") <= 1, actions
            if "WAIT_COMPLETED" in actions:
                assert actions.index("WAIT_COMPLETED") < actions.index("CANCELLED"), actions
    # the services' connections close: their backends report what they counted
    for rt in (suite.rt, suite.gw):
        await rt.stop(0.2)

    async def closed() -> bool:
        n = await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return bool(n == 1)  # this connection only

    await eventually(closed, what="the services' connections closed")
    assert await _deadlocks(db) - before == 0


async def test_a_parent_that_fails_compensates_its_finished_children_before_its_own_steps(
    suite: Suite, db: Any
) -> None:
    tools = ToolClient(suite.gateway, key=suite.worker_key)

    write = writer(tools)

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input.get("role") == "child":
            await write(ctx, "a", f"{ctx.input['name']}-a")
            await write(ctx, "b", f"{ctx.input['name']}-b")
            return {}
        await write(ctx, "own", "parent-own")
        outcomes = await ctx.run_children(
            [Child({"role": "child", "name": f"c{i}"}, step_id=f"c{i}") for i in range(2)]
        )
        assert all(o.ok for o in outcomes)
        await ctx.fail("the children's work was not good enough", error_code="E-PARENT")
        return {}

    [parent] = await suite.create_runs([{"role": "parent"}])
    worker = suite.worker(handler, concurrency=3)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def compensated() -> bool:
            saga = await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent))
            return bool(saga == "compensated")

        await eventually(compensated, timeout=30, what="the failed parent compensated")
    finally:
        await stop_worker(worker, task)
        await tools.close()
    tree = await suite.get(parent)
    names = {c.run_id: c.step_id for c in tree.children} | {parent: "parent"}
    rows = await db.fetch(
        "SELECT idempotency_key FROM awooop_refgw_request WHERE project_id = $1 AND idempotency_key LIKE '%:compensate'"
        " AND outcome = 'executed' ORDER BY request_id",
        PROJECT,
    )
    order = [f"{names[k.split(':')[0]]}:{k.split(':')[1]}" for k in (r["idempotency_key"] for r in rows)]
    assert order == ["c1:b", "c1:a", "c0:b", "c0:a", "parent:own"], order
    sagas = await db.fetch("SELECT saga_status FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
    assert [s["saga_status"] for s in sagas] == ["compensated", "compensated"]
    triggers = await db.fetch(
        "SELECT q.trigger FROM awooop_compensation_request q JOIN awooop_run_state r ON r.run_id = q.run_id"
        " WHERE r.parent_run_id = $1",
        uuid.UUID(parent),
    )
    assert [t["trigger"] for t in triggers] == ["parent_ended", "parent_ended"]


async def _claimable_compensations(db: asyncpg.Connection) -> set[str]:
    """The runs whose compensation request the saga would claim now (its own statement, rolled back)."""
    tx = db.transaction()
    await tx.start()
    try:
        rows = await driver_sql.claim_compensation_requests(db, worker_id="probe", lease_ttl=30.0, batch=100)
    finally:
        await tx.rollback()
    return {str(r["run_id"]) for r in rows}


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
async def test_a_child_that_completes_after_its_parents_end_reached_it_is_compensated_before_the_parent(
    suite: Suite, db: Any, ending: str
) -> None:
    """Issue 41, item 1: the parent ends (an operator's cancel, or its own failure) while a child is
    leased mid-run; the child is asked to cancel, but its worker completes it before the next
    heartbeat delivers the request. The parent's compensation is not claimable while that child
    runs; the child's completion gets it a parent_ended request; the child's step is undone, then
    the parent's."""
    tools = ToolClient(suite.gateway, key=suite.worker_key)
    journaled, release = asyncio.Event(), asyncio.Event()

    write = writer(tools)

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input.get("role") == "late":
            await write(ctx, "a", f"late-{ending}-a")
            journaled.set()
            await release.wait()
            return {"late": True}
        await write(ctx, "own", f"parent-{ending}-own")
        if ending == "failed":
            await ctx.start_child({"role": "late"}, step_id="late")
            await journaled.wait()
            await ctx.fail("the parent gave up", error_code="E-PARENT")
            return {}
        await ctx.run_children([Child({"role": "late"}, step_id="late")])
        return {"unexpected": True}

    [parent] = await suite.create_runs([{"role": "parent"}])
    # heartbeats far apart: the child's worker hears of the cancel only after it completed the child
    worker = suite.worker(handler, concurrency=3, heartbeat_interval=60, lease_ttl=120)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(journaled.wait(), 30)
        child = await db.fetchval("SELECT run_id FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent))
        if ending == "cancelled":

            async def parked() -> bool:
                return await _status(db, parent) == "WAITING_TOOL"

            await eventually(parked, timeout=30, what="the parent parked on its children")
            await suite.admin.call(
                suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=parent, reason="operator")
            )
        else:

            async def failed() -> bool:
                return await _status(db, parent) == "FAILED"

            await eventually(failed, timeout=30, what="the parent failed")
        row = await db.fetchrow("SELECT status, cancel_requested FROM awooop_run_state WHERE run_id = $1", child)
        assert (row["status"], row["cancel_requested"]) == ("RUNNING", True)
        # the parent's request exists and waits for its running child
        assert await db.fetchval("SELECT status FROM awooop_compensation_request WHERE run_id = $1", uuid.UUID(parent))
        assert parent not in await _claimable_compensations(db)
        release.set()

        async def compensated() -> bool:
            sagas = await db.fetch(
                "SELECT saga_status FROM awooop_run_state WHERE run_id = ANY($1)", [uuid.UUID(parent), child]
            )
            return [s["saga_status"] for s in sagas] == ["compensated", "compensated"]

        await eventually(compensated, timeout=30, what="the late child and the parent compensated")
    finally:
        release.set()
        await stop_worker(worker, task)
        await tools.close()
    assert await _status(db, str(child)) == "COMPLETED"
    trigger = await db.fetchval("SELECT trigger FROM awooop_compensation_request WHERE run_id = $1", child)
    assert trigger == "parent_ended"
    rows = await db.fetch(
        "SELECT idempotency_key FROM awooop_refgw_request WHERE project_id = $1 AND idempotency_key LIKE '%:compensate'"
        " AND outcome = 'executed' ORDER BY request_id",
        PROJECT,
    )
    names = {str(child): "late", parent: "parent"}
    order = [f"{names[k.split(':')[0]]}:{k.split(':')[1]}" for k in (r["idempotency_key"] for r in rows)]
    assert order == ["late:a", "parent:own"], order
    left = await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE project_id = $1", PROJECT)
    assert left == 0


async def test_children_whose_outputs_do_not_fit_one_answer_are_marked_and_read_by_the_sdk(
    start_services: Any, make_key: Any
) -> None:
    """A fan-in of large outputs stays deliverable: StartChildRuns leaves out the outputs past the
    message limit (output_omitted) and the SDK reads those children with GetRun."""
    rt = await start_services(
        "ingest", "scheduler", max_payload_bytes=8192, max_step_result_bytes=8192, max_message_bytes=100_000
    )
    key = key_of(await make_key("cr-big", {PROJECT: ["worker", "ingest"]}, "service"))
    addrs = {"ingest": f"127.0.0.1:{rt.ports['ingest']}", "scheduler": f"127.0.0.1:{rt.ports['scheduler']}"}
    c = Client(key=key, **addrs)
    try:
        resp = await c.call(
            c.ingest.IngestEvents,
            ingest_pb2.IngestEventsRequest(
                events=[
                    ingest_pb2.IngestEventRequest(
                        project_id=PROJECT,
                        channel_type=common_pb2.CHANNEL_TYPE_API,
                        provider_event_id="big-parent",
                        payload=to_struct({"role": "parent"}),
                        priority=100,
                    )
                ]
            ),
        )
        parent = resp.results[0].outcomes[0].run_id
        claim = scheduler_pb2.ClaimRunsRequest(worker_id="big", project_ids=[PROJECT], max_runs=20)
        [lease] = [r.lease for r in (await c.call(c.scheduler.ClaimRuns, claim)).runs]
        assert lease.run_id == parent
        specs = [scheduler_pb2.ChildRunSpec(step_id=f"k{i}", input=to_struct({"i": i})) for i in range(20)]
        started = await c.call(
            c.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=lease, children=specs)
        )
        kids = (await c.call(c.scheduler.ClaimRuns, claim)).runs
        assert len(kids) == 20
        for k in kids:  # 7 KB each: 140 KB together, past the 100 KB message limit
            out = to_struct({"blob": "x" * 7000, "run": k.lease.run_id})
            await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=k.lease, output=out))
        again = await c.call(
            c.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=lease, children=specs)
        )
        assert [k.run_id for k in again.children] == [k.run_id for k in started.children]
        omitted = [k for k in again.children if k.output_omitted]
        kept = [k for k in again.children if k.HasField("output")]
        assert omitted and kept and len(omitted) + len(kept) == 20
        assert all(not k.HasField("output") for k in omitted)
        assert all(k.output["run"] == k.run_id for k in kept)
        # the SDK's reading: an omitted output is read from the child itself (read_outcome uses
        # only the context's client)
        outcome = await read_outcome(SimpleNamespace(client=c), omitted[0])  # type: ignore[arg-type]
        assert outcome.ok and outcome.output == {"blob": "x" * 7000, "run": omitted[0].run_id}
    finally:
        await c.close()


async def test_a_saga_killed_mid_tree_finishes_the_tree_in_order_without_repeating_a_compensation(
    start_services: Any, make_key: Any, db: Any, settings: Settings, tmp_path: Path
) -> None:
    """The saga process is SIGKILLed while the newest child's slow undo is in flight; a new saga
    process takes over (the request's lease) and finishes the tree in the same order, the
    interrupted undo replayed by the gateway, not executed twice."""
    gw_rt = await start_services("gateway")
    gw_addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    internal = dict(await service_key(gw_rt))["authorization"].removeprefix("Bearer ")
    env = settings_env(
        settings.with_(
            gateway_addr=gw_addr,
            compensation_interval=0.2,
            compensation_lease=3.0,
            tool_timeout=2.5,
            internal_api_key=internal,
        )
    )
    rt = await start_services("ingest", "scheduler", reaper_interval=0.1, auth_cache_seconds=0)
    worker_key = key_of(await make_key("cr-tree-worker", {PROJECT: ["worker"]}, "service"))
    admin_key = key_of(await make_key("cr-tree-boss", {PROJECT: ["admin"]}))
    first = await spawn_services(["saga"], env, tmp_path, name="saga-1")
    addrs = {
        "ingest": f"127.0.0.1:{rt.ports['ingest']}",
        "scheduler": f"127.0.0.1:{rt.ports['scheduler']}",
        "saga": f"127.0.0.1:{first.ports['saga']}",
    }
    admin = Client(key=admin_key, **addrs)
    tools = ToolClient(gw_addr, key=worker_key)

    async def write(ctx: RunContext, step: str, entry: str) -> None:
        undo = {"tool_id": "knowledge_delete", "params": {"entry_id": entry}}
        params = {"entry_id": entry, "content": {}}
        await ctx.step(step, tools.execute, tool_id="knowledge_write", params=params, compensation=undo)

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input.get("role") == "child":
            name = ctx.input["name"]
            await write(ctx, "a", f"{name}-a")
            # its undo is slow: the crash window
            undo = {"tool_id": "k8s_delete_resource", "params": {"kind": "ConfigMap", "name": name,
                                                                 "simulate_delay_ms": 1500}}  # fmt: skip
            params = {"kind": "ConfigMap", "name": name}
            await ctx.step("b", tools.execute, tool_id="k8s_create_resource", params=params, compensation=undo)
            return {}
        if ctx.input.get("role") == "slow":  # keeps the parent parked until it is cancelled
            await ctx.wait(await ctx.create_wait(timeout=600))
            return {}
        await write(ctx, "own", "parent-own")
        kids = [Child({"role": "child", "name": f"c{i}"}, step_id=f"c{i}") for i in range(2)]
        await ctx.run_children([*kids, Child({"role": "slow"}, step_id="slow")])
        return {"unexpected": True}

    worker = Worker(handler, projects=[PROJECT], key=worker_key, scheduler=addrs["scheduler"], saga=addrs["saga"],
                    heartbeat_interval=0.2, lease_ttl=30, claim_wait=1, concurrency=3)  # fmt: skip
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    second = None
    try:
        resp = await admin.call(
            admin.ingest.IngestEvents,
            ingest_pb2.IngestEventsRequest(
                events=[
                    ingest_pb2.IngestEventRequest(
                        project_id=PROJECT,
                        channel_type=common_pb2.CHANNEL_TYPE_API,
                        provider_event_id="tree",
                        payload=to_struct({"role": "parent"}),
                    )
                ]
            ),
        )
        parent = resp.results[0].outcomes[0].run_id

        async def children_done() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM awooop_run_state WHERE parent_run_id = $1 AND status = 'COMPLETED'",
                uuid.UUID(parent),
            )
            slow = await db.fetchval(
                "SELECT status FROM awooop_run_state WHERE parent_run_id = $1 AND parent_step_id = 'slow'",
                uuid.UUID(parent),
            )
            return bool(n == 2) and slow == "WAITING_TOOL" and await _status(db, parent) == "WAITING_TOOL"

        await eventually(children_done, timeout=30, what="the children done, the parent parked")
        await stop_worker(worker, task)
        await admin.call(admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=parent, reason="stop"))
        newest = await db.fetchval(
            "SELECT run_id FROM awooop_run_state WHERE parent_run_id = $1 AND parent_step_id = 'c1'", uuid.UUID(parent)
        )

        async def newest_undo_in_flight() -> bool:
            step = await db.fetchval("SELECT status FROM awooop_saga_step WHERE run_id = $1 AND step_id = 'b'", newest)
            received = await db.fetchval(
                "SELECT count(*) FROM awooop_refgw_request WHERE idempotency_key = $1",
                f"{newest}:b:compensate",
            )
            return step == "compensating" and received >= 1

        await eventually(newest_undo_in_flight, timeout=30, what="the newest child's slow undo in flight")
        first.kill()
        second = await spawn_services(["saga"], env, tmp_path, name="saga-2")

        async def compensated() -> bool:
            saga = await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent))
            return bool(saga == "compensated")

        await eventually(compensated, timeout=60, what="the tree compensated by the second saga")
    finally:
        if not task.done():
            await stop_worker(worker, task)
        first.kill()
        if second is not None:
            second.terminate()
        await tools.close()
        await admin.close()
    names = {
        str(r["run_id"]): r["parent_step_id"]
        for r in await db.fetch(
            "SELECT run_id, parent_step_id FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent)
        )
    } | {parent: "parent"}
    rows = await db.fetch(
        "SELECT idempotency_key, outcome FROM awooop_refgw_request WHERE project_id = $1"
        " AND idempotency_key LIKE '%:compensate' AND outcome IN ('executed', 'replayed') ORDER BY request_id",
        PROJECT,
    )
    calls = [(f"{names[r['idempotency_key'].split(':')[0]]}:{r['idempotency_key'].split(':')[1]}", r["outcome"])
             for r in rows]  # fmt: skip
    executed = [c for c, outcome in calls if outcome == "executed"]
    assert executed == ["c1:b", "c1:a", "c0:b", "c0:a", "parent:own"], calls
    assert [c for c, outcome in calls if outcome == "replayed"] == ["c1:b"], calls
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE project_id = $1", PROJECT) == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_resource WHERE project_id = $1", PROJECT) == 0
