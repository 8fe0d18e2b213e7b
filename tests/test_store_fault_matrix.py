"""Faults at the store boundary, for every write path (issue 25): the path's statement (a) never
reaches Postgres, or (b) commits and then its connection is lost before the answer arrives. A
real fault: the services reach Postgres through a proxy that reads the wire protocol and drops
the connection at that statement (tests/harness/pgfault.py).

The outcome each path promises (docs/operations.md, "Store faults"): the caller sees UNAVAILABLE
/ STORE_UNAVAILABLE (never INTERNAL or UNKNOWN); the same request sent again answers what the
first would have (the same run, step action, lease outcome); and nothing is lost, doubled or
burned (no extra run, no attempt counted twice, no step or compensation executed twice).
Background writers (schedule ticks, the saga's compensation driver) have no caller: their next
pass finishes the work exactly once.

PATHS is the table: one function per write path, each run under both faults; the paths of
TIMEOUT_PATHS also under a commit whose answer is held back until the caller times out.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.db import store_error
from services.common.retry_policy import DEFAULTS_JSON
from services.common.runtime import Runtime
from services.common.settings import Settings
from services.ingest import api_channel_sql, store_sql
from services.saga import driver_sql, journal_sql
from services.scheduler import (
    approvals,
    approvals_sql,
    batch_complete,
    fenced_writes_sql,
    leases_sql,
    schedules,
    schedules_sql,
    transitions,
)
from tests.harness.helpers import eventually, expect_error, service_key
from tests.harness.infra import tg_event
from tests.harness.pgfault import Fault, PgFaultProxy
from tests.harness.saga import struct

P = "faults"
Metadata = tuple[tuple[str, str], ...]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

# a part of the claim statement, in every shape (one project or several, with completions or not)
CLAIM_NEEDLE = "'CLAIMED', from_status, 'RUNNING'"


@dataclass
class Env:
    proxy: PgFaultProxy
    db: asyncpg.Connection  # a direct connection (not through the proxy): arranging and asserting
    rt: Runtime
    md: Metadata  # every role in P
    channels: Callable[..., grpc.aio.Channel]
    stubs: dict[str, Any] = field(default_factory=dict)

    @property
    def ingest(self) -> ingest_pb2_grpc.IngestServiceStub:
        return self._stub("ingest", ingest_pb2_grpc.IngestServiceStub)

    @property
    def sched(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        return self._stub("scheduler", scheduler_pb2_grpc.SchedulerServiceStub)

    @property
    def saga(self) -> saga_pb2_grpc.SagaServiceStub:
        return self._stub("saga", saga_pb2_grpc.SagaServiceStub)

    def _stub(self, service: str, cls: Any) -> Any:
        if service not in self.stubs:
            self.stubs[service] = cls(self.channels(self.rt.ports[service], self.md))
        return self.stubs[service]

    @property
    def pool(self) -> asyncpg.Pool:
        assert self.rt.ctx is not None
        return self.rt.ctx.pool

    @property
    def settings(self) -> Settings:
        assert self.rt.ctx is not None
        return self.rt.ctx.settings

    async def faulted(self, needle: str, fault: Fault, call: Callable[[], Awaitable[Any]]) -> None:
        """call() with the fault armed on the statement containing needle: it must answer
        UNAVAILABLE / STORE_UNAVAILABLE, and the fault must have happened."""
        rule = self.proxy.arm(needle, fault)
        try:
            err = await expect_error(call(), UNAVAILABLE, errors.STORE_UNAVAILABLE)
            if fault is Fault.AFTER_COMMIT_TIMEOUT:  # the caller gave up waiting, not a broken connection
                assert "TimeoutError" in (err.details() or ""), err.details()
        finally:
            assert not rule.failed_instead, "the statement failed by itself, not by the injected fault"
            assert rule.fired.is_set(), f"the fault never happened (is {needle[:40]!r} the path's statement?)"

    async def retried(
        self,
        needle: str,
        fault: Fault,
        call: Callable[[Any], Awaitable[Any]],
        req: Any,
        run_id: str,
        status: str,
        audit: str,
    ) -> asyncpg.Record:
        """A run's transition: call(req) faulted (faulted()), then sent again. The second answer and
        the run's row say `status`, and the transition's audit action was written once. Returns the
        row."""
        await self.faulted(needle, fault, lambda: call(req))
        again = await call(req)
        assert again.run.run_id == run_id and common_pb2.RunStatus.Name(again.run.status) == f"RUN_STATUS_{status}"
        row = await self.run(run_id)
        assert row["status"] == status
        assert await self.audits(audit) == 1
        return row

    # --- arranging (direct, or through RPCs with no fault armed) ---

    async def pending_runs(self, n: int) -> list[str]:
        rows = await self.db.fetch(
            """INSERT INTO awooop_run_state (project_id, channel_type, input, created_at)
               SELECT $1, 'api', jsonb_build_object('n', g), clock_timestamp() FROM generate_series(1, $2) g
               RETURNING run_id, created_at""",
            P,
            n,
        )
        return [str(r["run_id"]) for r in sorted(rows, key=lambda r: r["created_at"])]

    async def claimed(self, n: int = 1) -> list[spb.ClaimedRun]:
        await self.pending_runs(n)
        resp = await self.sched.ClaimRuns(spb.ClaimRunsRequest(worker_id="w1", project_ids=[P], max_runs=n))
        assert len(resp.runs) == n
        return list(resp.runs)

    # --- asserting ---

    async def runs(self) -> list[asyncpg.Record]:
        return list(await self.db.fetch("SELECT * FROM awooop_run_state WHERE project_id = $1 ORDER BY created_at", P))

    async def run(self, run_id: str) -> asyncpg.Record:
        row = await self.db.fetchrow("SELECT * FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
        assert row is not None
        return row

    async def audits(self, action: str, run_id: str | None = None) -> int:
        return int(
            await self.db.fetchval(
                "SELECT count(*) FROM awooop_audit_log WHERE project_id = $1 AND action = $2"
                " AND ($3::uuid IS NULL OR run_id = $3::uuid)",
                P,
                action,
                run_id,
            )
        )

    async def steps(self, run_id: str) -> list[asyncpg.Record]:
        return list(
            await self.db.fetch("SELECT * FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq", uuid.UUID(run_id))
        )


# ------------------------------------------------------------------------------------ ingest


async def ingest_event(env: Env, fault: Fault) -> None:
    req = tg_event(P, 1)
    await env.faulted(store_sql.STORE_EVENTS.sql, fault, lambda: env.ingest.IngestEvent(req))
    again = await env.ingest.IngestEvent(req)
    (run,) = await env.runs()  # exactly one run
    assert again.outcomes[0].run_id == str(run["run_id"])
    # a committed first call makes the retry a duplicate of it
    assert again.outcomes[0].duplicate is (fault is not Fault.BEFORE)
    assert await env.audits("RUN_CREATED") == 1


async def ingest_events(env: Env, fault: Fault) -> None:
    req = ingest_pb2.IngestEventsRequest(events=[tg_event(P, i) for i in (1, 2, 3)])
    await env.faulted(store_sql.STORE_EVENTS.sql, fault, lambda: env.ingest.IngestEvents(req))
    again = await env.ingest.IngestEvents(req)
    runs = await env.runs()
    assert len(runs) == 3
    assert {o.run_id for r in again.results for o in r.outcomes} == {str(r["run_id"]) for r in runs}
    assert await env.audits("RUN_CREATED") == 3


async def ingest_api_event(env: Env, fault: Fault) -> None:
    req = ingest_pb2.IngestEventRequest(
        project_id=P, channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id="order-1", payload=struct({"n": 1})
    )
    await env.faulted(api_channel_sql.INGEST_API_EVENTS.sql, fault, lambda: env.ingest.IngestEvent(req))
    again = await env.ingest.IngestEvent(req)
    (run,) = await env.runs()
    assert again.outcomes[0].run_id == str(run["run_id"])
    assert again.outcomes[0].duplicate is (fault is not Fault.BEFORE)
    assert await env.audits("RUN_CREATED") == 1


async def http_api_event(env: Env, fault: Fault) -> None:
    url = f"http://127.0.0.1:{env.rt.http_ports['ingest']}/v1/projects/{P}/events"
    headers = {"Authorization": dict(env.md)["authorization"], "Idempotency-Key": "order-1"}

    async def post() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http, http.post(url, json={"n": 1}, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    rule = env.proxy.arm(api_channel_sql.INGEST_API_EVENTS.sql, fault)
    status, doc = await post()
    assert rule.fired.is_set() and not rule.failed_instead
    # RFC 9457 problem document carrying the same reason as gRPC's ErrorInfo
    assert status == 503, (status, doc)
    assert doc["reason"] == errors.STORE_UNAVAILABLE, doc
    if fault is Fault.AFTER_COMMIT_TIMEOUT:
        assert "TimeoutError" in doc["detail"], doc
    status, again = await post()
    assert status == 200, again
    (run,) = await env.runs()
    assert again["outcomes"][0]["run_id"] == str(run["run_id"])
    assert again["outcomes"][0]["duplicate"] is (fault is not Fault.BEFORE)


async def create_run(env: Env, fault: Fault) -> None:
    req = ingest_pb2.CreateRunRequest(project_id=P, idempotency_key="order-1", input=struct({"n": 1}))
    await env.faulted(store_sql.CREATE_RUN.sql, fault, lambda: env.ingest.CreateRun(req))
    again = await env.ingest.CreateRun(req)
    (run,) = await env.runs()
    assert again.run.run_id == str(run["run_id"])
    assert again.replayed is (fault is not Fault.BEFORE)


# --------------------------------------------------------------------------------- scheduler


async def claim_runs(env: Env, fault: Fault) -> None:
    (run_id,) = await env.pending_runs(1)
    # the SDK sends a claim id with every claim and keeps it across its retries
    req = spb.ClaimRunsRequest(worker_id="w1", project_ids=[P], max_runs=1, claim_id="claim-1")
    await env.faulted(CLAIM_NEEDLE, fault, lambda: env.sched.ClaimRuns(req))
    again = await env.sched.ClaimRuns(req)
    # before: nothing committed, the retry claims; after the commit: the retry replays the same lease
    assert [(c.run.run_id, c.lease.attempt) for c in again.runs] == [(run_id, 1)]
    assert await env.audits("CLAIMED") == 1 and len(await env.runs()) == 1
    row = await env.run(run_id)
    assert (row["status"], row["attempt_count"], row["worker_id"]) == ("RUNNING", 1, "w1")


async def heartbeat(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.HeartbeatRequest(worker_id="w1", leases=[c.lease])
    await env.faulted(leases_sql.HEARTBEAT.sql, fault, lambda: env.sched.Heartbeat(req))
    again = await env.sched.Heartbeat(req)
    assert [r.outcome for r in again.renewals] == [spb.LEASE_OUTCOME_RENEWED]
    row = await env.run(c.run.run_id)
    assert (row["status"], row["attempt_count"]) == ("RUNNING", 1)


async def complete_run(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.CompleteRunRequest(lease=c.lease, output=struct({"answer": 42}))
    row = await env.retried(
        transitions.COMPLETE.sql, fault, env.sched.CompleteRun, req, c.run.run_id, "COMPLETED", "COMPLETED"
    )
    assert row["attempt_count"] == 1


async def complete_runs(env: Env, fault: Fault) -> None:
    claimed = await env.claimed(2)
    req = spb.CompleteRunsRequest(runs=[spb.CompleteRunRequest(lease=c.lease) for c in claimed])
    await env.faulted(batch_complete.COMPLETE_MANY.sql, fault, lambda: env.sched.CompleteRuns(req))
    again = await env.sched.CompleteRuns(req)
    assert [(r.run.run_id, r.run.status, r.error_reason) for r in again.results] == [
        (c.run.run_id, common_pb2.RUN_STATUS_COMPLETED, "") for c in claimed
    ]
    assert await env.audits("COMPLETED") == 2


async def fail_run(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.FailRunRequest(lease=c.lease, reason="flaky", retryable=True)
    row = await env.retried(
        transitions.FAIL.sql, fault, env.sched.FailRun, req, c.run.run_id, "PENDING", "RETRY_SCHEDULED"
    )
    assert row["attempt_count"] == 1


async def release_run(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.ReleaseRunRequest(lease=c.lease, reason="shutting down")
    row = await env.retried(
        transitions.RELEASE.sql, fault, env.sched.ReleaseRun, req, c.run.run_id, "PENDING", "RELEASED"
    )
    # released once: the hand-back is not an attempt used
    assert (row["attempt_count"], row["released_count"]) == (1, 1)


async def wait_tool(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.WaitToolRequest(lease=c.lease, tool_id="k8s_scale_deployment")
    await env.retried(
        transitions.WAIT_TOOL.sql, fault, env.sched.WaitTool, req, c.run.run_id, "WAITING_TOOL", "WAITING_TOOL"
    )


async def resume_tool(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    await env.sched.WaitTool(spb.WaitToolRequest(lease=c.lease))
    req = spb.ResumeToolRequest(lease=c.lease)
    await env.retried(
        transitions.RESUME_TOOL.sql, fault, env.sched.ResumeTool, req, c.run.run_id, "RUNNING", "TOOL_RETURNED"
    )


async def acknowledge_cancel(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    await env.sched.CancelRun(spb.CancelRunRequest(run_id=c.run.run_id, reason="not needed"))
    req = spb.AcknowledgeCancelRequest(lease=c.lease)
    await env.retried(
        transitions.ACKNOWLEDGE_CANCEL.sql,
        fault,
        env.sched.AcknowledgeCancel,
        req,
        c.run.run_id,
        "CANCELLED",
        "CANCELLED",
    )


async def cancel_run(env: Env, fault: Fault) -> None:
    (run_id,) = await env.pending_runs(1)
    req = spb.CancelRunRequest(run_id=run_id, reason="not needed")
    await env.retried(
        fenced_writes_sql.CANCEL_RUN.sql, fault, env.sched.CancelRun, req, run_id, "CANCELLED", "CANCELLED"
    )


async def request_approval(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = spb.RequestApprovalRequest(lease=c.lease, summary="scale api to 3?")
    await env.faulted(approvals.REQUEST.sql, fault, lambda: env.sched.RequestApproval(req))
    again = await env.sched.RequestApproval(req)
    assert again.run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL and again.approval_token
    # the token of the answer that arrived is the one that decides
    decided = await env.sched.DecideApproval(
        spb.DecideApprovalRequest(
            run_id=c.run.run_id, approval_token=again.approval_token, decision=spb.DECISION_APPROVE
        )
    )
    assert decided.run.status == common_pb2.RUN_STATUS_RESUMED
    row = await env.run(c.run.run_id)
    assert (row["attempt_count"], row["released_count"]) == (1, 1)
    assert await env.audits("APPROVAL_REQUESTED") == 1
    # the lost answer's token was replaced by the retry's
    assert await env.audits("APPROVAL_TOKEN_REISSUED") == (1 if fault is not Fault.BEFORE else 0)


async def _waiting_approval(env: Env) -> tuple[str, str]:
    (c,) = await env.claimed()
    resp = await env.sched.RequestApproval(spb.RequestApprovalRequest(lease=c.lease, summary="ok?"))
    return c.run.run_id, resp.approval_token


async def _decide(env: Env, fault: Fault, decision: spb.Decision.ValueType, status: str, audit: str) -> None:
    run_id, token = await _waiting_approval(env)
    req = spb.DecideApprovalRequest(run_id=run_id, approval_token=token, decision=decision, reason="looked at it")
    await env.retried(approvals_sql.DECIDE_APPROVAL.sql, fault, env.sched.DecideApproval, req, run_id, status, audit)


async def approve(env: Env, fault: Fault) -> None:
    await _decide(env, fault, spb.DECISION_APPROVE, "RESUMED", "APPROVED")


async def reject(env: Env, fault: Fault) -> None:
    await _decide(env, fault, spb.DECISION_REJECT, "FAILED", "APPROVAL_REJECTED")


async def set_schedule(env: Env, fault: Fault) -> None:
    req = spb.SetScheduleRequest(
        schedule=spb.Schedule(project_id=P, name="nightly", cron="0 3 * * *", time_zone="UTC", input=struct({"n": 1}))
    )
    await env.faulted(schedules_sql.SET_SCHEDULE.sql, fault, lambda: env.sched.SetSchedule(req))
    again = await env.sched.SetSchedule(req)
    rows = await env.db.fetch("SELECT name, next_tick FROM awooop_schedule WHERE project_id = $1", P)
    assert [(r["name"], r["next_tick"]) for r in rows] == [("nightly", again.schedule.next_tick.ToDatetime(dt.UTC))]


async def schedule_tick(env: Env, fault: Fault) -> None:
    """The scheduler's schedule loop (no caller): a failed pass is logged as the store being
    unavailable, and the next pass fires the tick exactly once."""
    await env.db.execute(
        """INSERT INTO awooop_schedule (project_id, name, cron, time_zone, input, next_tick, created_by)
           VALUES ($1, 'nightly', '0 3 * * *', 'UTC', '{"n": 1}', now() - interval '1 minute', 'test')""",
        P,
    )
    rule = env.proxy.arm(schedules_sql.ADVANCE_SCHEDULE.sql, fault)
    with pytest.raises(Exception) as failed:
        await schedules.tick(env.pool, policy_defaults=DEFAULTS_JSON)
    mapped = store_error(failed.value)
    assert mapped is not None and mapped.reason == errors.STORE_UNAVAILABLE, repr(failed.value)
    assert rule.fired.is_set()
    created = await schedules.tick(env.pool, policy_defaults=DEFAULTS_JSON)
    assert created == (1 if fault is Fault.BEFORE else 0)
    assert len(await env.runs()) == 1
    assert await env.db.fetchval("SELECT next_tick > now() FROM awooop_schedule WHERE project_id = $1", P)


# -------------------------------------------------------------------------------------- saga

SCALE = "k8s_scale_deployment"


def begin_scale(lease: common_pb2.LeaseToken) -> saga_pb2.BeginStepRequest:
    """The tool step the saga rows journal: scale api to 3."""
    return saga_pb2.BeginStepRequest(
        lease=lease,
        step_id="scale",
        step_type=common_pb2.STEP_TYPE_TOOL_CALL,
        tool_id=SCALE,
        tool_params=struct({"deployment": "api", "replicas": 3}),
    )


async def begin_step(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = begin_scale(c.lease)
    await env.faulted(journal_sql.BEGIN_STEP.sql, fault, lambda: env.saga.BeginStep(req))
    again = await env.saga.BeginStep(req)
    # run it, with the step's key. A pending row of this attempt answers RETRY by design
    # (tests/test_saga.py: the service cannot tell a lost answer from a step already under way);
    # the SDK runs the step either way, and the key makes its tool call execute once.
    want = saga_pb2.STEP_ACTION_EXECUTE if fault is Fault.BEFORE else saga_pb2.STEP_ACTION_RETRY
    assert again.action == want, saga_pb2.StepAction.Name(again.action)
    assert again.idempotency_key == f"{c.run.run_id}:scale"
    (step,) = await env.steps(c.run.run_id)
    assert (step["status"], step["attempt"]) == ("pending", 1)


async def complete_step(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    await env.saga.BeginStep(begin_scale(c.lease))
    req = saga_pb2.CompleteStepRequest(
        lease=c.lease,
        step_id="scale",
        result=struct({"replicas": 3}),
        compensation_cmd=common_pb2.CompensationCommand(
            tool_id=SCALE, params=struct({"deployment": "api", "replicas": 1})
        ),
    )
    await env.faulted(journal_sql.FINISH_STEP.sql, fault, lambda: env.saga.CompleteStep(req))
    again = await env.saga.CompleteStep(req)
    assert again.step.status == common_pb2.STEP_STATUS_COMPLETED
    (step,) = await env.steps(c.run.run_id)
    assert (step["status"], json.loads(step["result"])) == ("completed", {"replicas": 3})


async def record_step(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    req = saga_pb2.RecordStepRequest(
        lease=c.lease, step_id="think", step_type=common_pb2.STEP_TYPE_LLM_CALL, result=struct({"plan": "scale"})
    )
    await env.faulted(journal_sql.RECORD_STEP.sql, fault, lambda: env.saga.RecordStep(req))
    again = await env.saga.RecordStep(req)
    assert again.step.status == common_pb2.STEP_STATUS_COMPLETED
    (step,) = await env.steps(c.run.run_id)
    assert (step["status"], json.loads(step["result"])) == ("completed", {"plan": "scale"})


async def fail_step(env: Env, fault: Fault) -> None:
    (c,) = await env.claimed()
    await env.saga.BeginStep(begin_scale(c.lease))
    req = saga_pb2.FailStepRequest(lease=c.lease, step_id="scale", error="quota exceeded")
    await env.faulted(journal_sql.FINISH_STEP.sql, fault, lambda: env.saga.FailStep(req))
    again = await env.saga.FailStep(req)
    assert again.step.status == common_pb2.STEP_STATUS_FAILED
    (step,) = await env.steps(c.run.run_id)
    assert (step["status"], step["error"]) == ("failed", "quota exceeded")


async def compensation_mark(env: Env, fault: Fault) -> None:
    """The saga's compensation driver (no caller): the transaction that marks a step
    `compensating` before the gateway call (the durable intent) fails or commits unheard; once
    the request's lease expires the driver takes it again, and the gateway executes the undo once."""
    await _compensation(env, fault, driver_sql.MARK_STEP_COMPENSATING.sql, gateway_calls=["executed"])


async def compensation_record(env: Env, fault: Fault) -> None:
    """The same driver: the transaction that records the step compensated after the gateway
    call fails or commits unheard. Rolled back, the step is still `compensating` and the driver
    sends the same key again: the gateway replays instead of executing twice."""
    calls = ["executed", "replayed"] if fault is Fault.BEFORE else ["executed"]
    await _compensation(env, fault, driver_sql.STEP_COMPENSATED.sql, gateway_calls=calls)


async def _compensation(env: Env, fault: Fault, needle: str, gateway_calls: list[str]) -> None:
    await env.db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 3)", P)
    run_id = str(
        await env.db.fetchval(
            """INSERT INTO awooop_run_state (project_id, channel_type, status, attempt_count)
               VALUES ($1, 'api', 'FAILED', 1) RETURNING run_id""",
            P,
        )
    )
    await env.db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, status,
                                         compensation_cmd, attempt, completed_at)
           VALUES ($1, 'scale', $2, 1, 'tool_call', $3, 'completed',
                   '{"tool_id": "k8s_scale_deployment", "params": {"deployment": "api", "replicas": 1}}', 1, now())""",
        uuid.UUID(run_id),
        P,
        SCALE,
    )
    rule = env.proxy.arm(needle, fault)
    await env.db.execute(
        "INSERT INTO awooop_compensation_request (run_id, project_id, trigger) VALUES ($1, $2, 'step_failed')",
        uuid.UUID(run_id),
        P,
    )

    async def done() -> bool:
        return (
            await env.db.fetchval("SELECT status FROM awooop_compensation_request WHERE run_id = $1", uuid.UUID(run_id))
            == "done"
        )

    await eventually(done, timeout=20, what="the compensation to end after the fault")
    assert rule.fired.is_set() and not rule.failed_instead
    (step,) = await env.steps(run_id)
    assert step["status"] == "compensated"
    assert (await env.run(run_id))["saga_status"] == "compensated"
    outcomes = [
        r["outcome"]
        for r in await env.db.fetch(
            "SELECT outcome FROM awooop_refgw_request WHERE idempotency_key = $1 ORDER BY request_id",
            f"{run_id}:scale:compensate",
        )
    ]
    assert outcomes == gateway_calls
    assert await env.db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = $1", P) == 1
    assert await env.audits("SAGA_STEP_COMPENSATED", run_id) == 1


@dataclass(frozen=True)
class Path:
    name: str
    check: Callable[[Env, Fault], Awaitable[None]]
    services: tuple[str, ...]


PATHS = [
    Path("IngestEvent", ingest_event, ("ingest",)),
    Path("IngestEvents", ingest_events, ("ingest",)),
    Path("IngestEvent(api)", ingest_api_event, ("ingest",)),
    Path("POST events", http_api_event, ("ingest",)),
    Path("CreateRun", create_run, ("ingest",)),
    Path("ClaimRuns", claim_runs, ("scheduler",)),
    Path("Heartbeat", heartbeat, ("scheduler",)),
    Path("CompleteRun", complete_run, ("scheduler",)),
    Path("CompleteRuns", complete_runs, ("scheduler",)),
    Path("FailRun", fail_run, ("scheduler",)),
    Path("ReleaseRun", release_run, ("scheduler",)),
    Path("WaitTool", wait_tool, ("scheduler",)),
    Path("ResumeTool", resume_tool, ("scheduler",)),
    Path("AcknowledgeCancel", acknowledge_cancel, ("scheduler",)),
    Path("CancelRun", cancel_run, ("scheduler",)),
    Path("BeginStep", begin_step, ("scheduler", "saga")),
    Path("CompleteStep", complete_step, ("scheduler", "saga")),
    Path("RecordStep", record_step, ("scheduler", "saga")),
    Path("FailStep", fail_step, ("scheduler", "saga")),
    Path("compensation mark", compensation_mark, ("gateway", "saga")),
    Path("compensation record", compensation_record, ("gateway", "saga")),
    Path("RequestApproval", request_approval, ("scheduler",)),
    Path("Approve", approve, ("scheduler",)),
    Path("Reject", reject, ("scheduler",)),
    Path("SetSchedule", set_schedule, ("scheduler",)),
    Path("schedule tick", schedule_tick, ("scheduler",)),
]


FIRST_PASSES = ("scheduler.reaper", "scheduler.approval_sweep", "scheduler.schedules")


def _passes(loop: str) -> float:
    return sum(
        REGISTRY.get_sample_value("awooop_background_runs_total", {"loop": loop, "outcome": outcome}) or 0
        for outcome in ("ok", "error")
    )


@pytest_asyncio.fixture(loop_scope="session")
async def proxy(db_dsn: str) -> Any:
    p = await PgFaultProxy(db_dsn).start()
    yield p
    await p.close()


# A timeout after the commit is the lost connection's outcome reached through asyncpg's
# command_timeout (a few seconds each): one path per kind of statement.
TIMEOUT_PATHS = {"IngestEvent", "POST events", "ClaimRuns", "CompleteRun", "BeginStep", "Approve"}
# the timeout cases' AWOOOP_DB_STATEMENT_TIMEOUT (asyncpg gives up a second after it)
TIMEOUT_CASE_STATEMENT_TIMEOUT = 1.5


def _cases() -> list[Any]:
    return [
        pytest.param(path, fault, id=f"{path.name}-{fault.value}")
        for path in PATHS
        for fault in Fault
        if fault is not Fault.AFTER_COMMIT_TIMEOUT or path.name in TIMEOUT_PATHS
    ]


@pytest.mark.parametrize(("path", "fault"), _cases())
async def test_a_store_fault_answers_store_unavailable_and_the_retry_the_same(
    path: Path, fault: Fault, proxy: PgFaultProxy, start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    services = [s for s in path.services if s != "gateway"]
    overrides: dict[str, Any] = dict(
        database_url=proxy.dsn,
        # the loops stay out of the way: a test drives what it needs
        reaper_interval=3600,
        approval_sweep_interval=3600,
        schedule_interval=3600,
    )
    if fault is Fault.AFTER_COMMIT_TIMEOUT:
        overrides["db_statement_timeout"] = TIMEOUT_CASE_STATEMENT_TIMEOUT
    if "gateway" in path.services:
        gw = await start_services("gateway")  # straight to the store: the faults are the saga's
        overrides.update(
            gateway_addr=f"127.0.0.1:{gw.ports['gateway']}",
            compensation_interval=0.2,
            compensation_lease=1.0,
            tool_timeout=0.8,
            internal_api_key=dict(await service_key(gw))["authorization"].removeprefix("Bearer "),
        )
    before = {loop: _passes(loop) for loop in FIRST_PASSES}
    rt = await start_services(*services, **overrides)
    if "scheduler" in services:
        # each loop's first pass runs at start-up: once over, what a test arranges is left to it

        async def first_passes_done() -> bool:
            return all(_passes(loop) > n for loop, n in before.items())

        await eventually(first_passes_done, what="the scheduler's first background passes")
    md = await make_key("op", {P: ["ingest", "worker", "approver", "admin"]}, "service")
    env = Env(proxy=proxy, db=db, rt=rt, md=md, channels=channels)
    await path.check(env, fault)
