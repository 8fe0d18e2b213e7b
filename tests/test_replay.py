"""Replay that notices changed code, against real services (ingest, scheduler, saga, the reference
gateway; real channels, Postgres and Redis) and SDK workers: a run journaled by one version of a
handler resumes on a worker deployed with another (docs/worker-sdk.md, "Replay and deploys").

- reordered steps, a changed parameter, a renamed tool call: the run is held (HoldRun), never
  skipped wrongly or repeated; nothing of the new code's steps runs;
- the operator's two ways out: UnholdRun once code that replays it is deployed (the run
  completes, every step ran once), or CancelRun (the completed steps are undone once, in reverse
  order);
- a change that only adds steps after the journal's end is no change to replay;
- HoldRun's crash points: its answer lost (the worker's retry is answered by the committed hold),
  and a cancel pending when the worker holds (the run ends CANCELLED and is compensated)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Client, RunContext, StepCall, ToolClient, Worker
from tests.harness import rpc_proxy
from tests.harness import suite as suite_harness
from tests.harness.helpers import eventually
from tests.harness.rpc_runs import create_deployment
from tests.harness.suite import start_suite, stop_worker

PROJECT = "replay"
TOOL = "k8s_scale_deployment"
HELD = "E-WORKER-NONDETERMINISM"

Handler = Callable[[RunContext], Awaitable[dict[str, Any] | None]]


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> AsyncIterator[suite_harness.Suite]:
    rt, worker_key, admin, _ = await start_suite(start_services, make_key, PROJECT, worker="replayer", admin="ops")
    yield suite_harness.Suite(rt, PROJECT, worker_key, admin)
    await admin.close()


def undo(result: dict[str, Any]) -> dict[str, Any]:
    params = {"deployment": "api", "replicas": result["previous_replicas"]}
    return {"tool_id": TOOL, "params": params, "reason": "undo"}


class Versions:
    """The handler's versions one test deploys, and what their step functions did."""

    def __init__(self, suite: suite_harness.Suite) -> None:
        self.suite = suite
        self.tools = ToolClient(suite.gateway, key=suite.worker_key)
        self.executed: Counter[tuple[str, str]] = Counter()  # (version, step id) -> calls of its function
        self.tokens: asyncio.Queue[tuple[str, str]] = asyncio.Queue()  # (run id, approval token)

    def fn(self, version: str, step_id: str, result: dict[str, Any] | None = None) -> Callable[[StepCall], Any]:
        def run(call: StepCall) -> dict[str, Any]:
            self.executed[(version, step_id)] += 1
            return result or {"by": version}

        return run

    def scale(self, version: str, replicas: int) -> Callable[[StepCall], Awaitable[dict[str, Any]]]:
        async def run(call: StepCall) -> dict[str, Any]:
            self.executed[(version, call.step_id)] += 1
            return await self.tools.execute(call)

        return run

    async def approval(self, ctx: RunContext) -> bool:
        approval = await ctx.request_approval("go on?", ttl=300)
        if not approval.granted:
            await self.tokens.put((ctx.run_id, approval.token))
        return approval.granted


async def _status(suite: suite_harness.Suite, run_id: str, status: int) -> bool:
    return (await suite.run(run_id)).status == status


async def _held(suite: suite_harness.Suite, run_id: str) -> bool:
    run = await suite.run(run_id)
    return run.status == common_pb2.RUN_STATUS_PENDING and run.wait_reason == "held"


async def _audit(db: Any, run_id: str) -> list[str]:
    rows = await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(run_id))
    return [r["action"] for r in rows]


async def _deploy(suite: suite_harness.Suite, handler: Handler, **kw: Any) -> tuple[Worker, asyncio.Task[None]]:
    worker = suite.worker(handler, **kw)
    return worker, asyncio.create_task(worker.run(install_signal_handlers=False))


async def test_reordered_steps_hold_the_run_until_an_operator_unholds_it_on_code_that_replays_it(
    suite: suite_harness.Suite, db: Any
) -> None:
    """v1 journals two steps and parks at an approval; v2 (its steps swapped) resumes it: held,
    none of v2's steps ran, the attempt not spent, and v2 claims on without taking it again. With
    v1 back, UnholdRun lets it finish: every step ran once, in v1's order."""
    v = Versions(suite)

    async def v1(ctx: RunContext) -> dict[str, Any] | None:
        await ctx.step("fetch", v.fn("v1", "fetch"), step_type="llm_call", params={"q": ctx.input["q"]})
        await ctx.step("plan", v.fn("v1", "plan"))
        if not await v.approval(ctx):
            return None
        await ctx.step("apply", v.fn("v1", "apply"))
        return {"version": "v1"}

    async def v2(ctx: RunContext) -> dict[str, Any] | None:
        await ctx.step("plan", v.fn("v2", "plan"))
        await ctx.step("fetch", v.fn("v2", "fetch"), step_type="llm_call", params={"q": ctx.input["q"]})
        if not await v.approval(ctx):
            return None
        await ctx.step("apply", v.fn("v2", "apply"))
        return {"version": "v2"}

    [run_id] = await suite.ingest_each([{"q": "disk full"}])
    worker, task = await _deploy(suite, v1)
    got, token = await asyncio.wait_for(v.tokens.get(), 30)
    assert got == run_id
    await stop_worker(worker, task)

    worker, task = await _deploy(suite, v2)
    await suite.admin.call(
        suite.admin.scheduler.DecideApproval,
        scheduler_pb2.DecideApprovalRequest(
            run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_APPROVE
        ),
    )
    await eventually(lambda: _held(suite, run_id), timeout=30, what="the run held")
    run = await suite.run(run_id)
    assert run.error_code == HELD and "at step 'fetch'" in run.failure_reason
    assert "before step 2 ('plan'), but called after it" in run.failure_reason
    row = await db.fetchrow(
        "SELECT attempt_count, released_count, not_before, worker_id FROM awooop_run_state WHERE run_id = $1",
        uuid.UUID(run_id),
    )
    # the approval's hand-back and the hold: neither attempt counts against max_attempts
    assert row["attempt_count"] == 2 and row["released_count"] == 2 and row["worker_id"] is None
    assert run.attempts_used == 0
    assert await db.fetchval(
        "SELECT not_before = 'infinity' FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id)
    )
    assert worker.stats.held == 1
    # v2 keeps claiming; the held run is not among what it can take
    claims = worker.stats.claims_sent
    await eventually(lambda: _true(worker.stats.claims_sent >= claims + 2), timeout=30, what="two more claims")
    assert await _held(suite, run_id) and worker.stats.claimed == 1
    await stop_worker(worker, task)
    assert not any(version == "v2" for version, _ in v.executed)  # nothing of v2's code ran

    worker, task = await _deploy(suite, v1)
    resp = await suite.admin.call(
        suite.admin.scheduler.UnholdRun, scheduler_pb2.UnholdRunRequest(run_id=run_id, reason="v1 is back")
    )
    assert resp.run.status == common_pb2.RUN_STATUS_PENDING and resp.run.wait_reason == ""
    await eventually(lambda: _status(suite, run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="completed")
    await stop_worker(worker, task)
    assert (await suite.run(run_id)).output["version"] == "v1"
    assert v.executed == Counter({("v1", "fetch"): 1, ("v1", "plan"): 1, ("v1", "apply"): 1})
    audit = await _audit(db, run_id)
    assert audit.count("HELD") == 1 and audit.count("UNHELD") == 1 and audit.index("HELD") < audit.index("UNHELD")
    with pytest.raises(AwooopError) as refused:  # only a held run can be unheld
        await suite.admin.call(suite.admin.scheduler.UnholdRun, scheduler_pb2.UnholdRunRequest(run_id=run_id))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and refused.value.reason == "INVALID_TRANSITION"
    await v.tools.close()


def _true(v: bool) -> Any:
    async def f() -> bool:
        return v

    return f()


async def test_a_changed_parameter_holds_and_cancel_compensates_in_reverse_order_while_an_added_step_is_replayed(
    suite: suite_harness.Suite, db: Any
) -> None:
    """Two runs parked at an approval under v1. v2 scales by another count in its second step (a
    completed step called with other parameters) and adds a step after the approval. The first run
    (scaled by v1) is held; CancelRun ends it and undoes both scalings once, the later one first.
    The second run (no tool step, only the added one differs) completes on v2."""
    await create_deployment(suite.admin, PROJECT, replicas=2)
    v = Versions(suite)

    def build(version: str, second: int, extra: bool) -> Handler:
        async def handler(ctx: RunContext) -> dict[str, Any] | None:
            if ctx.input["scale"]:
                params = {"deployment": "api", "replicas": 5}
                await ctx.step("scale-1", v.scale(version, 5), tool_id=TOOL, params=params, compensation=undo)
                params = {"deployment": "api", "replicas": second}
                await ctx.step("scale-2", v.scale(version, second), tool_id=TOOL, params=params, compensation=undo)
            else:
                await ctx.step("note", v.fn(version, "note"))
            if not await v.approval(ctx):
                return None
            if extra:
                await ctx.step("report", v.fn(version, "report"))
            return {"version": version}

        return handler

    scaled, noted = await suite.ingest_each([{"scale": True}, {"scale": False}])
    worker, task = await _deploy(suite, build("v1", 7, extra=False), concurrency=2)
    tokens = dict([await asyncio.wait_for(v.tokens.get(), 30), await asyncio.wait_for(v.tokens.get(), 30)])
    await stop_worker(worker, task)
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 7

    worker, task = await _deploy(suite, build("v2", 9, extra=True), concurrency=2)
    for run_id in (scaled, noted):
        await suite.admin.call(
            suite.admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id, approval_token=tokens[run_id], decision=scheduler_pb2.DECISION_APPROVE
            ),
        )
    await eventually(lambda: _held(suite, scaled), timeout=30, what="the scaled run held")
    await eventually(lambda: _status(suite, noted, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="completed")
    assert "other parameters" in (await suite.run(scaled)).failure_reason
    assert v.executed[("v2", "scale-2")] == 0 and v.executed[("v2", "report")] == 1
    assert (await suite.run(noted)).output["version"] == "v2"

    resp = await suite.admin.call(
        suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=scaled, reason="v1 is gone")
    )
    assert resp.run.status == common_pb2.RUN_STATUS_CANCELLED and resp.compensation_requested

    async def compensated() -> bool:
        return await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id=$1", scaled) == "compensated"

    await eventually(compensated, timeout=30, what="compensation")
    await stop_worker(worker, task)
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 2
    undone = await db.fetch(
        "SELECT step_id FROM awooop_saga_step WHERE run_id = $1 AND compensated_at IS NOT NULL ORDER BY compensated_at",
        uuid.UUID(scaled),
    )
    assert [r["step_id"] for r in undone] == ["scale-2", "scale-1"]
    assert v.executed[("v1", "scale-1")] == 1 and v.executed[("v1", "scale-2")] == 1
    await v.tools.close()


async def test_a_renamed_tool_call_is_found_even_when_the_handler_swallows_the_error(
    suite: suite_harness.Suite, db: Any
) -> None:
    """v1's first attempt runs a tool call and then fails (retryable). Its retry runs on v2, which
    renamed that step (same tool, same parameters: it would notify twice), catches every exception
    and returns: the run is held, not completed, and the tool did not run again."""
    v = Versions(suite)
    params = {"to": "ops", "text": "scaled"}

    async def v1(ctx: RunContext) -> dict[str, Any]:
        await ctx.step("one", v.fn("v1", "one"))
        await ctx.step("notify-ops", v.fn("v1", "notify"), tool_id="notify", params=params)
        raise RuntimeError("flaky downstream")

    swallowed: list[str] = []

    async def v2(ctx: RunContext) -> dict[str, Any]:
        try:
            await ctx.step("one", v.fn("v2", "one"))
            await ctx.step("tell-ops", v.fn("v2", "notify"), tool_id="notify", params=params)
            return {"version": "v2"}
        except Exception as exc:
            swallowed.append(type(exc).__name__)
            return {"swallowed": True}

    [run_id] = await suite.ingest_each([None], retry_policy=common_pb2.RetryPolicy(initial_backoff=_seconds(30)))
    worker, task = await _deploy(suite, v1)

    async def failed_once() -> bool:
        return "RETRY_SCHEDULED" in await _audit(db, run_id)

    await eventually(failed_once, timeout=30, what="v1's attempt failed")
    await stop_worker(worker, task)
    await db.execute("UPDATE awooop_run_state SET not_before = now() WHERE run_id = $1", uuid.UUID(run_id))
    worker, task = await _deploy(suite, v2)
    await eventually(lambda: _held(suite, run_id), timeout=30, what="held")
    await stop_worker(worker, task)
    run = await suite.run(run_id)
    assert "'tell-ops'" in run.failure_reason and "'notify-ops'" in run.failure_reason, run.failure_reason
    assert swallowed == ["Nondeterminism"] and v.executed[("v2", "notify")] == 0
    audit = await _audit(db, run_id)
    assert audit[-1] == "HELD" and "COMPLETED" not in audit
    await v.tools.close()


def _seconds(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromSeconds(int(s))
    return d


async def test_hold_run_crash_points_answer_lost_cancel_pending_and_a_stale_token(
    suite: suite_harness.Suite, db: Any
) -> None:
    """HoldRun's crash and cancel points. Its answer lost (the hold committed): the worker's retry
    is answered by the committed hold, one HELD row. A cancel pending when the changed code holds:
    the run ends CANCELLED and its completed step is undone once. A repeat after that answers the
    same; a token of another attempt is LEASE_LOST."""
    await create_deployment(suite.admin, PROJECT, replicas=2)
    v = Versions(suite)

    async def v1(ctx: RunContext) -> dict[str, Any] | None:
        if ctx.input["scale"]:
            params = {"deployment": "api", "replicas": 4}
            await ctx.step("scale", v.scale("v1", 4), tool_id=TOOL, params=params, compensation=undo)
        await ctx.step("a", v.fn("v1", "a"))
        return None if not await v.approval(ctx) else {"version": "v1"}

    async def v2(ctx: RunContext) -> dict[str, Any] | None:
        await ctx.step("b", v.fn("v2", "b"))  # new work inserted before "a"
        await ctx.step("a", v.fn("v2", "a"))
        return {"version": "v2"}

    lost, cancelled = await suite.ingest_each([{"scale": False}, {"scale": True}])
    worker, task = await _deploy(suite, v1, concurrency=2)
    tokens = dict([await asyncio.wait_for(v.tokens.get(), 30), await asyncio.wait_for(v.tokens.get(), 30)])
    await stop_worker(worker, task)
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 4
    for run_id in (lost, cancelled):
        await suite.admin.call(
            suite.admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id, approval_token=tokens[run_id], decision=scheduler_pb2.DECISION_APPROVE
            ),
        )

    # the cancel point, by hand with the worker's key: claimed, cancel requested, then held
    rpc = Client(key=suite.worker_key, scheduler=suite.scheduler)
    claim = await rpc.call(
        rpc.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(worker_id="by-hand", project_ids=[PROJECT], max_runs=2),
    )
    leases = {c.run.run_id: c.lease for c in claim.runs}
    assert set(leases) == {lost, cancelled}
    await rpc.call(rpc.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=leases[lost]))
    cancel = await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=cancelled))
    assert cancel.run.cancel_requested and cancel.run.status == common_pb2.RUN_STATUS_RUNNING
    hold = scheduler_pb2.HoldRunRequest(lease=leases[cancelled], reason="step 'b' is new", error_code=HELD)
    first = await rpc.call(rpc.scheduler.HoldRun, hold)
    again = await rpc.call(rpc.scheduler.HoldRun, hold)  # its answer lost, sent again
    assert first.run.status == again.run.status == common_pb2.RUN_STATUS_CANCELLED
    stale = common_pb2.LeaseToken(run_id=cancelled, attempt=leases[cancelled].attempt - 1)
    with pytest.raises(AwooopError) as refused:
        await rpc.call(rpc.scheduler.HoldRun, scheduler_pb2.HoldRunRequest(lease=stale))
    assert refused.value.reason == "LEASE_LOST"
    await rpc.close()

    # the answer lost through a real worker: HoldRun committed, the worker told UNAVAILABLE
    async with suite.scheduler_proxy() as proxy:
        proxy.add("HoldRun", rpc_proxy.lose_answer())
        worker = Worker(
            v2,
            projects=[PROJECT],
            key=suite.worker_key,
            scheduler=proxy.address,
            saga=suite.saga,
            heartbeat_interval=0.2,
            lease_ttl=30,
            claim_wait=1,
        )
        task = asyncio.create_task(worker.run(install_signal_handlers=False))
        await eventually(lambda: _held(suite, lost), timeout=30, what="held")
        await eventually(lambda: _true(worker.stats.held == 1), timeout=30, what="the hold settled")
        await stop_worker(worker, task)
        assert proxy.faulted["HoldRun"] == 1 and proxy.calls["HoldRun"] == 2

    assert (await _audit(db, lost)).count("HELD") == 1
    audit = await _audit(db, cancelled)
    assert "HELD" not in audit and audit.count("CANCELLED") == 1

    async def compensated() -> bool:
        return await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id=$1", cancelled) == "compensated"

    await eventually(compensated, timeout=30, what="compensation")
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 2
    # the inserted step ran once, in the lost run's attempt, before "a" showed the insertion: new
    # work, nothing skipped or repeated (the hold's retry did not run it again)
    assert v.executed[("v2", "b")] == 1
    await v.tools.close()
