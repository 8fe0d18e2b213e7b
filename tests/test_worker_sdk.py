"""Worker SDK against real services (ingest, scheduler, saga, gateway in-process, real channels,
real Postgres/Redis): claiming with concurrency, batched heartbeats, journaled steps that are
skipped on retry, a pending step retried with the same idempotency key, lease loss and cancel
stopping the handler at the next heartbeat, approvals, tool waits, and SIGTERM of a real worker
process handing its leases back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import (
    AwooopError,
    RunContext,
    RunFinished,
    StepCall,
    ToolClient,
    Worker,
    WorkerError,
)
from tests.harness import rpc_proxy
from tests.harness import suite as suite_harness
from tests.harness.helpers import ROOT, eventually, key_of
from tests.harness.rpc_runs import create_deployment
from tests.harness.suite import start_suite, stop_worker

PROJECT = "wp"


class Suite(suite_harness.Suite):
    claim_wait: ClassVar[float] = 2

    async def create_runs(self, n: int, inputs: list[dict[str, Any]] | None = None, **kw: Any) -> list[str]:
        given: list[dict[str, Any] | None] = list(inputs) if inputs else [None] * n
        return await self.ingest_each(given, **kw)


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> AsyncIterator[Suite]:
    rt, worker_key, admin, _ = await start_suite(start_services, make_key, PROJECT, worker="worker-pod", admin="boss")
    yield Suite(rt, PROJECT, worker_key, admin)
    await admin.close()


async def test_workers_process_runs_once_each_and_heartbeats_keep_short_leases(suite: Suite, db: Any) -> None:
    """20 runs, 3 workers of concurrency 4 with a 1.5 s lease: every run is claimed once, each step
    runs once, and handlers that outlive their lease TTL keep it through batched heartbeats."""
    run_ids = await suite.create_runs(20)
    executed: Counter[str] = Counter()
    handled_by: dict[str, str] = {}
    workers: list[Worker] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        def work(call: StepCall) -> dict[str, Any]:
            executed[call.run_id] += 1
            return {"n": ctx.input["n"], "key": call.idempotency_key}

        result = await ctx.step("work", work)
        # outlive the 1.5 s lease: only heartbeats keep it
        me = next(w for w in workers if w.worker_id == ctx.worker_id)
        start = me.heartbeats_sent
        await eventually(lambda: _holds(me.heartbeats_sent >= start + 9), timeout=30, what="heartbeats")
        handled_by[ctx.run_id] = ctx.worker_id
        return {"doubled": result["n"] * 2}

    for i in range(3):
        workers.append(suite.worker(handler, concurrency=4, lease_ttl=1.5, heartbeat_interval=0.2, worker_id=f"w{i}"))
    tasks = [asyncio.create_task(w.run(install_signal_handlers=False)) for w in workers]

    async def all_done() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE project_id = $1 AND status = 'COMPLETED'", PROJECT
        )
        return bool(n == 20)

    await eventually(all_done, timeout=60, what="20 completed runs")
    for w, t in zip(workers, tasks, strict=True):
        await stop_worker(w, t)
    rows = await db.fetch(
        "SELECT run_id::text, attempt_count, reaped_at, output FROM awooop_run_state WHERE project_id = $1", PROJECT
    )
    assert {r["run_id"] for r in rows} == set(run_ids)
    assert all(r["attempt_count"] == 1 and r["reaped_at"] is None for r in rows)  # never reaped, never re-claimed
    assert executed == Counter({r: 1 for r in run_ids})
    assert sorted(json.loads(r["output"])["doubled"] for r in rows) == [2 * i for i in range(20)]
    assert len(set(handled_by.values())) > 1  # the work was shared
    assert sum(w.stats.claimed for w in workers) == 20
    # one Heartbeat call per round renews all of a worker's leases: more renewals than calls
    assert sum(w.stats.leases_renewed for w in workers) > sum(w.stats.heartbeats_sent for w in workers)


def _holds(v: bool) -> Any:
    """An awaitable of v, for `eventually(lambda: _holds(<condition>))` on in-memory state."""

    async def f() -> bool:
        return v

    return f()


async def test_completed_steps_are_skipped_on_retry(suite: Suite, db: Any) -> None:
    [run_id] = await suite.create_runs(1)
    calls: Counter[str] = Counter()
    actions: list[dict[str, str]] = []
    results: list[dict[str, Any]] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        async def step_fn(call: StepCall) -> dict[str, Any]:
            calls[call.step_id] += 1
            return {"step": call.step_id, "replicas": 3, "nested": {"ok": True}}

        a = await ctx.step("a", step_fn, step_type="llm_call")
        b = await ctx.step("b", step_fn, tool_id="k8s_scale_deployment", params={"deployment": "x", "replicas": 3})
        results.append({"a": a, "b": b})
        actions.append(dict(ctx.actions))
        if ctx.attempt == 1:
            raise RuntimeError("boom after two steps")
        c = await ctx.step("c", step_fn)
        return {"c": c["step"]}

    worker = suite.worker(handler)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="completed")
    await stop_worker(worker, task)
    assert calls == Counter({"a": 1, "b": 1, "c": 1})
    assert actions == [{"a": "execute", "b": "execute"}, {"a": "skip", "b": "skip"}]
    assert results[0] == results[1]  # the recorded result, integers intact
    run = await suite.run(run_id)
    assert run.attempt_count == 2
    events = await suite.history(run_id)
    retry = [e for e in events if e.action == "RETRY_SCHEDULED"]
    assert retry and "RuntimeError: boom after two steps" in retry[0].reason
    steps = await db.fetch(
        "SELECT step_id, status, attempt FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert [(s["step_id"], s["status"], s["attempt"]) for s in steps] == [
        ("a", "completed", 1),
        ("b", "completed", 1),
        ("c", "completed", 2),
    ]


async def _status_is(suite: Suite, run_id: str, status: int) -> bool:
    return (await suite.run(run_id)).status == status


async def test_handler_exceptions_fail_the_run_when_attempts_are_used(suite: Suite) -> None:
    [run_id] = await suite.create_runs(1, max_attempts=2)
    seen: list[int] = []

    async def handler(ctx: RunContext) -> None:
        seen.append(ctx.attempt)
        raise ValueError(f"bad input on attempt {ctx.attempt}")

    worker = suite.worker(handler)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_FAILED), timeout=30, what="failed")
    await stop_worker(worker, task)
    run = await suite.run(run_id)
    assert seen == [1, 2]
    assert run.error_code == "E-WORKER-HANDLER" and "bad input on attempt 2" in run.failure_reason


async def test_explicit_fail_compensates_through_the_gateway_and_explicit_complete_keeps_output(
    suite: Suite, db: Any
) -> None:
    await create_deployment(suite.admin, PROJECT, replicas=2)
    failing, completing = await suite.create_runs(2, inputs=[{"fail": True}, {"fail": False}])
    tools = ToolClient(suite.gateway, key=suite.worker_key)
    after_end: list[str] = []

    def undo(result: dict[str, Any]) -> dict[str, Any]:
        params = {"deployment": "api", "replicas": result["previous_replicas"]}
        return {"tool_id": "k8s_scale_deployment", "params": params, "reason": "undo"}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input["fail"]:
            await ctx.step(
                "scale",
                tools.execute,
                tool_id="k8s_scale_deployment",
                params={"deployment": "api", "replicas": 5},
                compensation=undo,
            )
            await ctx.fail("the new pods crash-loop", error_code="E-DEMO-CRASHLOOP")
        else:
            await ctx.complete({"explicit": True})
        try:
            await ctx.step("too-late", lambda call: {})
        except RunFinished:
            after_end.append(ctx.run_id)
        return {"ignored": "the run already ended"}

    worker = suite.worker(handler, concurrency=2)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))

    async def compensated() -> bool:
        return await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id=$1", failing) == "compensated"

    await eventually(compensated, timeout=20, what="compensation")
    await eventually(lambda: _status_is(suite, completing, common_pb2.RUN_STATUS_COMPLETED), what="completed")
    await stop_worker(worker, task)
    await tools.close()
    assert sorted(after_end) == sorted([failing, completing])  # the context refuses use after the end
    run = await suite.run(failing)
    assert run.status == common_pb2.RUN_STATUS_FAILED and run.error_code == "E-DEMO-CRASHLOOP"
    assert (await suite.run(completing)).output["explicit"] is True
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id=$1", PROJECT) == 2


async def test_lease_loss_cancels_the_handler_at_the_next_heartbeat_and_the_pending_step_is_retried(
    suite: Suite, db: Any
) -> None:
    """The reaper takes the run back while attempt 1 is inside a step. The worker learns it from
    its next Heartbeat and cancels the handler (no RPC from the handler is needed); attempt 2
    finds the step pending and runs it again with the same idempotency key."""
    [run_id] = await suite.create_runs(1)
    inside = asyncio.Event()
    cancelled_at: list[int] = []
    keys: list[tuple[int, str, bool]] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        async def scale(call: StepCall) -> dict[str, Any]:
            keys.append((ctx.attempt, call.idempotency_key, call.retry))
            if ctx.attempt == 1:
                inside.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled_at.append(worker.heartbeats_sent)
                    raise
            return {"scaled": True}

        await ctx.step("scale", scale, tool_id="k8s_scale_deployment", params={"deployment": "api", "replicas": 3})
        return {"attempt": ctx.attempt}

    worker = suite.worker(handler, concurrency=1, heartbeat_interval=0.3, lease_ttl=30)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(inside.wait(), 20)

    async def reaped() -> bool:
        # make the lease look expired until the real reaper has taken the run (a heartbeat in
        # between renews it, hence the loop)
        await db.execute(
            "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' "
            "WHERE run_id = $1 AND status = 'RUNNING' AND attempt_count = 1",
            run_id,
        )
        return bool(await db.fetchval("SELECT reaped_at IS NOT NULL FROM awooop_run_state WHERE run_id = $1", run_id))

    await eventually(reaped, timeout=20, what="the reaper to take the run")
    sent_when_reaped = worker.heartbeats_sent
    await eventually(lambda: _holds(bool(cancelled_at)), timeout=20, what="handler cancelled")
    # cancelled while answering the first heartbeat sent after the reap: within one interval
    assert cancelled_at[0] <= sent_when_reaped + 1
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="done")
    await stop_worker(worker, task)
    assert [(a, r) for a, _, r in keys] == [(1, False), (2, True)]
    assert keys[0][1] == keys[1][1] == f"{run_id}:scale"
    assert worker.stats.lost == 1
    run = await suite.run(run_id)
    assert run.attempt_count == 2 and run.output["attempt"] == 2
    actions = [e.action for e in await suite.history(run_id)]
    assert "REAPED" in actions


async def test_a_stale_worker_gets_lease_lost_and_stops_without_touching_the_run(suite: Suite, db: Any) -> None:
    """After its lease moved on, a handler's own journal write answers LEASE_LOST: the SDK
    stops the handler and does not fail or complete the run it no longer owns."""
    [run_id] = await suite.create_runs(1)
    go_on = asyncio.Event()
    claimed = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        claimed.set()
        await go_on.wait()
        await ctx.step("late", lambda call: {"written": True})
        return {"should": "not complete"}

    # heartbeats far apart: the handler's own call must be what notices
    worker = suite.worker(handler, concurrency=1, heartbeat_interval=20, lease_ttl=60)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(claimed.wait(), 20)
    # another claim took over: the fencing token moved on
    await db.execute("UPDATE awooop_run_state SET attempt_count = attempt_count + 1 WHERE run_id = $1", run_id)
    go_on.set()
    await eventually(lambda: _holds(worker.stats.lost == 1), timeout=20, what="lease lost")
    await stop_worker(worker, task)
    run = await suite.run(run_id)
    assert run.status == common_pb2.RUN_STATUS_RUNNING and run.attempt_count == 2
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id) == 0


async def test_cancel_request_cancels_the_handler_at_the_next_heartbeat(suite: Suite, db: Any) -> None:
    [run_id] = await suite.create_runs(1)
    started = asyncio.Event()
    cancelled_at: list[int] = []

    async def handler(ctx: RunContext) -> None:
        await ctx.step("prepare", lambda call: {"ok": True})
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_at.append(worker.heartbeats_sent)
            raise

    worker = suite.worker(handler, heartbeat_interval=0.3)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(started.wait(), 20)
    resp = await suite.admin.call(
        suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id, reason="operator says stop")
    )
    assert resp.run.cancel_requested and resp.run.status == common_pb2.RUN_STATUS_RUNNING
    sent_when_requested = worker.heartbeats_sent
    await eventually(lambda: _holds(bool(cancelled_at)), timeout=20, what="handler cancelled")
    assert cancelled_at[0] <= sent_when_requested + 1
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_CANCELLED), timeout=20, what="ack")
    await stop_worker(worker, task)
    assert worker.stats.cancelled == 1
    last = (await suite.history(run_id))[-1]
    assert last.action == "CANCELLED" and last.to_status == common_pb2.RUN_STATUS_CANCELLED
    assert "worker-pod" in last.actor  # acknowledged by the worker's principal


async def test_a_refused_approval_request_leaves_the_run_to_the_worker(suite: Suite) -> None:
    """A cancel arrives before the handler asks for approval: RequestApproval is refused
    (INVALID_TRANSITION), the handler's error fails the attempt, and the pending cancel turns
    that into CANCELLED; the run is not left RUNNING without heartbeats."""
    [run_id] = await suite.create_runs(1)
    claimed, cancelled = asyncio.Event(), asyncio.Event()
    refused: list[str] = []

    async def handler(ctx: RunContext) -> None:
        claimed.set()
        await cancelled.wait()
        try:
            await ctx.request_approval("ship it?")
        except AwooopError as err:
            refused.append(err.reason)
            raise

    worker = suite.worker(handler, heartbeat_interval=20, lease_ttl=60)  # the heartbeat must not be first
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(claimed.wait(), 20)
    await suite.admin.call(suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id))
    cancelled.set()
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_CANCELLED), what="cancelled")
    await stop_worker(worker, task)
    assert refused == ["INVALID_TRANSITION"]


async def test_approval_resumes_the_handler_and_skips_completed_steps(suite: Suite, db: Any) -> None:
    [run_id] = await suite.create_runs(1)
    tokens: asyncio.Queue[str] = asyncio.Queue()
    inside_wait: list[str] = []
    attempts: list[dict[str, str]] = []

    async def handler(ctx: RunContext) -> dict[str, Any] | None:
        await ctx.step("prepare", lambda call: {"prepared": True})
        if ctx.attempt == 1:
            async with ctx.wait_tool("slow_tool"):
                inside_wait.append(await db.fetchval("SELECT status FROM awooop_run_state WHERE run_id=$1", run_id))
        approval = await ctx.request_approval("Apply the change?", ttl=120)
        attempts.append(dict(ctx.actions))
        if not approval.granted:
            await tokens.put(approval.token)
            return None
        await ctx.step("apply", lambda call: {"applied": True})
        return {"approved_by": approval.decided_by}

    worker = suite.worker(handler)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    token = await asyncio.wait_for(tokens.get(), 20)
    run = await suite.run(run_id)
    assert run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL and run.approval_summary == "Apply the change?"
    await eventually(lambda: _holds(worker.held == []), what="lease handed back")
    assert inside_wait == ["WAITING_TOOL"]
    await suite.admin.call(
        suite.admin.scheduler.DecideApproval,
        scheduler_pb2.DecideApprovalRequest(
            run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_APPROVE, reason="looks right"
        ),
    )
    await eventually(lambda: _status_is(suite, run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="done")
    await stop_worker(worker, task)
    assert attempts == [
        {"prepare": "execute", "approval": "execute"},
        {"prepare": "skip", "approval": "retry"},
    ]
    run = await suite.run(run_id)
    assert run.output["approved_by"] == "boss"
    steps = await db.fetch(
        "SELECT step_id, step_type, status FROM awooop_saga_step WHERE run_id=$1 ORDER BY seq", run_id
    )
    assert [(s["step_id"], s["step_type"], s["status"]) for s in steps] == [
        ("prepare", "callback", "completed"),
        ("approval", "approval_request", "completed"),
        ("apply", "callback", "completed"),
    ]


async def test_a_key_without_the_worker_role_stops_the_worker(suite: Suite, make_key: Any) -> None:
    key = key_of(await make_key("intruder", {"elsewhere": ["worker"]}))

    async def handler(ctx: RunContext) -> None:
        raise AssertionError("must not run")

    worker = Worker(handler, projects=[PROJECT], key=key, scheduler=suite.scheduler, saga=suite.saga, claim_wait=1)
    with pytest.raises(WorkerError) as err:
        await worker.run(install_signal_handlers=False)
    assert "PERMISSION_DENIED" in str(err.value)


async def test_rpc_errors_are_decoded(suite: Suite) -> None:
    with pytest.raises(AwooopError) as err:
        await suite.admin.call(suite.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id="not-a-uuid"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.reason == "FIELD_INVALID"
    assert err.value.details.violations and err.value.details.violations[0][0] == "run_id"


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    from awooop.worker import Worker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")

    async def handle(ctx):
        print("handler-started", ctx.input.get("mode"), ctx.run_id, flush=True)
        if ctx.input.get("mode") == "finish":
            await ctx.stopping.wait()          # finishes inside the shutdown grace period
            return {"finished_during_grace": True}
        await asyncio.Event().wait()           # never finishes: released after the grace period

    project, grace, call_timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    asyncio.run(Worker(handle, projects=[project], concurrency=2, lease_ttl=60, heartbeat_interval=1,
                       shutdown_grace=grace, call_timeout=call_timeout, claim_wait=2).run())
    """
)
STARTED = "handler-started"


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text()

    async def handlers_started(self, n: int) -> None:
        """Waits until n handlers run: the worker holds those runs (the database alone cannot
        tell: it says RUNNING as soon as the claim commits, before the worker has the answer)."""

        async def started() -> bool:
            return self.text().count(STARTED) >= n

        await eventually(started, timeout=30, what=f"{n} handlers started")

    async def sigterm(self) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, 30)


@contextlib.asynccontextmanager
async def worker_process(
    suite: Suite, tmp_path: Path, *, scheduler: str | None = None, grace: float = 1.0, call_timeout: float = 10.0
) -> AsyncIterator[WorkerProcess]:
    """A real worker process (WORKER_SCRIPT) on the suite's scheduler or on `scheduler` (a proxy)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {
        **os.environ,
        "AWOOOP_API_KEY": suite.worker_key,
        "AWOOOP_SCHEDULER_ADDR": scheduler or suite.scheduler,
        "AWOOOP_SAGA_ADDR": suite.saga,
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        args = [sys.executable, str(script), PROJECT, str(grace), str(call_timeout)]
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=out)
    try:
        yield WorkerProcess(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_finishes_or_releases_every_lease(suite: Suite, db: Any, tmp_path: Path) -> None:
    finish, hold = await suite.create_runs(2, inputs=[{"mode": "finish"}, {"mode": "hold"}])
    async with worker_process(suite, tmp_path) as worker:
        await worker.handlers_started(2)
        rc = await worker.sigterm()
    assert rc == 0, worker.text()
    rows = await suite.run_rows(db)
    assert rows[finish]["status"] == "COMPLETED", worker.text()
    assert json.loads(rows[finish]["output"]) == {"finished_during_grace": True}
    await suite.assert_handed_back(rows[hold])


async def test_sigterm_settles_every_run_when_completion_and_hand_back_calls_time_out_or_fail(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """Each settling call first hangs until its deadline (a scheduler that answers late), then
    fails UNAVAILABLE more often than the channel's own retries cover (the completion's
    failures come after the scheduler did it: the answer is lost). Every run still ends
    completed or handed back, inside the shutdown's budget."""
    finish, hold = await suite.create_runs(2, inputs=[{"mode": "finish"}, {"mode": "hold"}])
    async with suite.scheduler_proxy() as proxy:
        proxy.add("CompleteRuns", rpc_proxy.hang(), *[rpc_proxy.lose_answer()] * 4)
        proxy.add("ReleaseRun", rpc_proxy.hang(), *[rpc_proxy.fail()] * 4)
        async with worker_process(suite, tmp_path, scheduler=proxy.address, grace=3.0, call_timeout=3.0) as worker:
            await worker.handlers_started(2)
            rc = await worker.sigterm()
        assert proxy.faulted["CompleteRuns"] == 5 and proxy.faulted["ReleaseRun"] == 5, worker.text()
    assert rc == 0, worker.text()
    rows = await suite.run_rows(db)
    assert rows[finish]["status"] == "COMPLETED", worker.text()
    assert json.loads(rows[finish]["output"]) == {"finished_during_grace": True}
    await suite.assert_handed_back(rows[hold])


async def test_a_claim_answer_arriving_after_sigterm_is_handed_back(suite: Suite, db: Any, tmp_path: Path) -> None:
    """The scheduler claimed both runs, then SIGTERM comes before its answer reaches the worker.
    The worker must not drop the answer (the runs would stay RUNNING until their lease
    expires): it waits for it and hands both runs back without starting their handlers."""
    runs = await suite.create_runs(2, inputs=[{"mode": "finish"}, {"mode": "hold"}])
    async with suite.scheduler_proxy() as proxy:
        proxy.add("ClaimRuns", rpc_proxy.hold_answer())
        async with worker_process(suite, tmp_path, scheduler=proxy.address) as worker:

            async def claimed() -> bool:
                return proxy.answered.is_set()

            await eventually(claimed, timeout=30, what="the scheduler to answer the claim")
            worker.proc.send_signal(signal.SIGTERM)

            async def stopping() -> bool:  # the SDK logs its stop; an older one cancels the claim instead
                return "worker stopping" in worker.text() or proxy.cancelled["ClaimRuns"] > 0

            await eventually(stopping, timeout=30, what="the worker to begin stopping")
            proxy.release.set()
            rc = await asyncio.to_thread(worker.proc.wait, 30)
    assert rc == 0, worker.text()
    assert STARTED not in worker.text()
    rows = await suite.run_rows(db)
    for run_id in runs:
        await suite.assert_handed_back(rows[run_id])


async def test_runs_the_worker_cannot_settle_make_it_exit_non_zero_naming_them(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """The scheduler refuses every completion and hand-back through the whole grace period: the
    process must not exit 0 as if all were well, and its log names the runs left RUNNING."""
    runs = await suite.create_runs(2, inputs=[{"mode": "finish"}, {"mode": "hold"}])
    async with suite.scheduler_proxy() as proxy:
        proxy.always["CompleteRuns"] = proxy.always["ReleaseRun"] = rpc_proxy.fail()
        async with worker_process(suite, tmp_path, scheduler=proxy.address, grace=1.0, call_timeout=1.0) as worker:
            await worker.handlers_started(2)
            rc = await worker.sigterm()
    text = worker.text()
    assert rc != 0, text
    assert "could not settle 2 runs" in text and all(run_id in text for run_id in runs), text
    rows = await suite.run_rows(db)
    assert all(rows[run_id]["status"] == "RUNNING" for run_id in runs)
