"""Saga compensation (seed ADR-119 D3–D6): reverse order through the reference ToolGateway,
failures that do not stop the others, escalation (audit + Redis stream + Telegram stand-in),
operator retry / resolve, several replicas, and a saga process killed mid-compensation.
Runs end through the scheduler's own transitions (FailRun, CancelRun + AcknowledgeCancel, the
reaper, a rejected approval), so a scheduler that stopped requesting compensation fails these
tests. Real Postgres, Redis, gRPC servers and processes; the gateway and Telegram stand-in are
real local servers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from awooop.worker import Client
from services.common.embedded import free_port
from services.common.settings import Settings
from services.saga.app import COMPENSATION
from tests.harness.helpers import ROOT, eventually, expect_error, service_key, settings_env, spawn_services
from tests.harness.saga import PROJECT, check_seed_format, new_run, struct
from tests.harness.telegram_stub import TelegramStub

Undo = Callable[[dict[str, Any]], dict[str, Any]] | None
SAGA_SERVICE = saga_pb2.DESCRIPTOR.services_by_name["SagaService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Step:
    step_id: str
    tool_id: str = ""  # empty: an llm_call
    params: dict[str, Any] | None = None
    undo: Undo = None  # result -> compensation command


def scale(step_id: str, deployment: str, replicas: int, **undo_extra: Any) -> Step:
    return Step(
        step_id,
        "k8s_scale_deployment",
        {"deployment": deployment, "replicas": replicas},
        lambda r: {
            "tool_id": "k8s_scale_deployment",
            "params": {"deployment": deployment, "replicas": r["previous_replicas"], **undo_extra},
            "reason": "SAGA compensation: scale deployment back",
        },
    )


def create_cm(step_id: str, name: str, **undo_extra: Any) -> Step:
    return Step(
        step_id,
        "k8s_create_resource",
        {"kind": "ConfigMap", "name": name},
        lambda r: {"tool_id": "k8s_delete_resource", "params": {"kind": "ConfigMap", "name": name, **undo_extra}},
    )


def insert_row(step_id: str, **undo_extra: Any) -> Step:
    return Step(
        step_id,
        "pg_mutate",
        {"op": "INSERT", "table": "incidents", "row": {"title": step_id}},
        lambda r: {
            "tool_id": "pg_mutate",
            "params": {"op": "DELETE", "table": "incidents", "id": r["inserted_id"], **undo_extra},
        },
    )


def write_kb(step_id: str, entry_id: str, **undo_extra: Any) -> Step:
    return Step(
        step_id,
        "knowledge_write",
        {"entry_id": entry_id, "content": {"text": "runbook"}},
        lambda r: {"tool_id": "knowledge_delete", "params": {"entry_id": r["entry_id"], **undo_extra}},
    )


def as_dict(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(s)
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in out.items()}


@dataclass
class Harness:
    saga: saga_pb2_grpc.SagaServiceStub
    sched: scheduler_pb2_grpc.SchedulerServiceStub
    gw: tools_pb2_grpc.ToolGatewayServiceStub
    worker: Any
    admin: Any
    db: asyncpg.Connection
    gateway_addr: str
    leases: dict[str, common_pb2.LeaseToken] = field(default_factory=dict)
    saga_port: int = 0

    async def saga_health(self, service: str = SAGA_SERVICE) -> int:
        """The saga server's grpc.health.v1 status for service ("" : the whole server)."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.saga_port}") as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))
            return int(reply.status)

    async def run_with_steps(self, steps: list[Step], max_attempts: int = 3) -> str:
        """A run claimed from the scheduler whose worker executed steps through the gateway and
        journaled them."""
        run_id = await new_run(self.db, max_attempts=max_attempts)
        claimed = await self.sched.ClaimRuns(
            scheduler_pb2.ClaimRunsRequest(worker_id="w1", project_ids=[PROJECT], max_runs=1), metadata=self.worker
        )
        assert [c.run.run_id for c in claimed.runs] == [run_id]
        now = self.leases[run_id] = claimed.runs[0].lease
        for st in steps:
            kind = common_pb2.STEP_TYPE_TOOL_CALL if st.tool_id else common_pb2.STEP_TYPE_LLM_CALL
            begun = await self.saga.BeginStep(
                saga_pb2.BeginStepRequest(
                    lease=now, step_id=st.step_id, step_type=kind, tool_id=st.tool_id, tool_params=struct(st.params)
                ),
                metadata=self.worker,
            )
            result: dict[str, Any] = {"text": "thought"}
            if st.tool_id:
                resp = await self.gw.ExecuteTool(
                    tools_pb2.ExecuteToolRequest(
                        tool_id=st.tool_id,
                        params=struct(st.params),
                        idempotency_key=begun.idempotency_key,
                        project_id=PROJECT,
                        run_id=run_id,
                    )
                )
                result = as_dict(resp.result)
            cmd = None
            if st.undo is not None:
                c = st.undo(result)
                cmd = common_pb2.CompensationCommand(
                    tool_id=c["tool_id"], params=struct(c["params"]), reason=c.get("reason", "")
                )
            await self.saga.CompleteStep(
                saga_pb2.CompleteStepRequest(
                    lease=now, step_id=st.step_id, result=struct(result), compensation_cmd=cmd
                ),
                metadata=self.worker,
            )
        return run_id

    async def fail_run(self, run_id: str) -> None:
        """The worker fails the run for good (FailRun, not retryable): the scheduler's FAILED
        transition records the compensation request."""
        resp = await self.sched.FailRun(
            scheduler_pb2.FailRunRequest(lease=self.leases[run_id], reason="step 7 failed", retryable=False),
            metadata=self.worker,
        )
        assert resp.run.status == common_pb2.RUN_STATUS_FAILED and resp.compensation_requested

    async def cancel_run(self, run_id: str) -> None:
        """An operator cancels the running run (CancelRun), the worker acknowledges it: CANCELLED,
        and the scheduler records the compensation request."""
        asked = await self.sched.CancelRun(
            scheduler_pb2.CancelRunRequest(run_id=run_id, reason="operator cancelled"), metadata=self.admin
        )
        assert asked.run.cancel_requested and not asked.compensation_requested
        acked = await self.sched.AcknowledgeCancel(
            scheduler_pb2.AcknowledgeCancelRequest(lease=self.leases[run_id]), metadata=self.worker
        )
        assert acked.run.status == common_pb2.RUN_STATUS_CANCELLED and acked.compensation_requested

    async def abandon_run(self, run_id: str) -> None:
        """The worker stops heartbeating and its lease runs out (moved into the past here rather
        than waited for); the scheduler's reaper loop takes the run back."""
        await self.db.execute(
            "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' WHERE run_id = $1", run_id
        )

    async def statuses(self, run_id: str) -> dict[str, str]:
        rows = await self.db.fetch("SELECT step_id, status FROM awooop_saga_step WHERE run_id = $1", run_id)
        return {r["step_id"]: r["status"] for r in rows}

    async def saga_status(self, run_id: str) -> str:
        return str(await self.db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id))

    async def request_lease(self, run_id: str) -> tuple[str, int]:
        """(worker_id, attempt_count) of the run's compensation request: the driver's fencing token."""
        row = await self.db.fetchrow(
            "SELECT worker_id, attempt_count FROM awooop_compensation_request WHERE run_id = $1", run_id
        )
        assert row is not None
        return row["worker_id"], row["attempt_count"]

    async def request_done(self, run_id: str) -> bool:
        return bool(
            await self.db.fetchval("SELECT status = 'done' FROM awooop_compensation_request WHERE run_id = $1", run_id)
        )

    async def compensation_calls(self, run_id: str) -> list[tuple[str, str]]:
        """(step_id, outcome) of every compensation call the gateway received, in arrival order."""
        rows = await self.db.fetch(
            """SELECT idempotency_key, outcome FROM awooop_refgw_request
                WHERE idempotency_key LIKE $1 || ':%:compensate' ORDER BY request_id""",
            run_id,
        )
        return [(r["idempotency_key"].split(":")[1], r["outcome"]) for r in rows]


async def scheduler_stub(
    start_services: Any, channels: Any, **settings: Any
) -> scheduler_pb2_grpc.SchedulerServiceStub:
    rt = await start_services("scheduler", **settings)
    return scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))


async def harness(
    start_services: Any,
    channels: Any,
    make_key: Any,
    db: asyncpg.Connection,
    scheduler: dict[str, Any] | None = None,
    **saga: Any,
) -> Harness:
    """The reference gateway, a saga service compensating through it every 0.2 s (saga settings),
    and a scheduler (scheduler settings) whose transitions request the compensations."""
    gw_rt = await start_services("gateway")
    addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    saga_rt = await start_services("saga", **{"gateway_addr": addr, "compensation_interval": 0.2, **saga})
    await db.execute(
        "INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1), ($1, 'web', 2)",
        PROJECT,
    )
    return Harness(
        saga=saga_pb2_grpc.SagaServiceStub(channels(saga_rt.ports["saga"])),
        sched=await scheduler_stub(start_services, channels, **(scheduler or {})),
        gw=tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt))),
        worker=await make_key("worker", {PROJECT: ["worker"]}, "service"),
        admin=await make_key("operator", {PROJECT: ["admin"]}),
        db=db,
        gateway_addr=addr,
        saga_port=saga_rt.ports["saga"],
    )


async def audit_actions(db: asyncpg.Connection, run_id: str) -> list[str]:
    rows = await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", run_id)
    return [r["action"] for r in rows]


# ---------------------------------------------------------------- seed criterion: approval reject


async def test_approval_reject_scales_the_deployment_back_to_its_original_replicas(
    start_services, channels, make_key, db
) -> None:
    """Worker scales api 1 -> 3, asks for approval, the approver rejects (real scheduler); the
    scheduler records the request and nudges the saga, whose compensation scales api back to 1."""
    gw_rt = await start_services("gateway")
    gw_addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    # a long interval: the compensation below starts from the scheduler's nudge, not the timer
    saga_rt = await start_services("saga", gateway_addr=gw_addr, compensation_interval=60)
    internal = await make_key("scheduler-svc", {"*": ["admin"]}, "service")
    sched_rt = await start_services(
        "scheduler",
        saga_addr=f"127.0.0.1:{saga_rt.ports['saga']}",
        internal_api_key=internal[0][1].removeprefix("Bearer "),
    )
    saga = saga_pb2_grpc.SagaServiceStub(channels(saga_rt.ports["saga"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(sched_rt.ports["scheduler"]))
    gw = tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt)))
    worker = await make_key("worker", {PROJECT: ["worker"]}, "service")
    approver = await make_key("alice", {PROJECT: ["approver"]})
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT)
    run_id = await new_run(db)

    claimed = await sched.ClaimRuns(
        scheduler_pb2.ClaimRunsRequest(worker_id="pod-1", project_ids=[PROJECT]), metadata=worker
    )
    (c,) = claimed.runs
    assert c.run.run_id == run_id
    params = {"deployment": "api", "replicas": 3}
    begun = await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=c.lease,
            step_id="scale-api",
            step_type=common_pb2.STEP_TYPE_TOOL_CALL,
            tool_id="k8s_scale_deployment",
            tool_params=struct(params),
        ),
        metadata=worker,
    )
    done = await gw.ExecuteTool(
        tools_pb2.ExecuteToolRequest(
            tool_id="k8s_scale_deployment",
            params=struct(params),
            idempotency_key=begun.idempotency_key,
            project_id=PROJECT,
            run_id=run_id,
        )
    )
    previous = as_dict(done.result)["previous_replicas"]
    assert previous == 1
    await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(
            lease=c.lease,
            step_id="scale-api",
            result=done.result,
            compensation_cmd=common_pb2.CompensationCommand(
                tool_id="k8s_scale_deployment",
                params=struct({"deployment": "api", "replicas": previous}),
                reason="SAGA compensation: scale deployment back",
            ),
        ),
        metadata=worker,
    )
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 3
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=c.lease, step_id="approval", step_type=common_pb2.STEP_TYPE_APPROVAL_REQUEST),
        metadata=worker,
    )
    asked = await sched.RequestApproval(
        scheduler_pb2.RequestApprovalRequest(lease=c.lease, summary="scale api to 3"), metadata=worker
    )
    decided = await sched.DecideApproval(
        scheduler_pb2.DecideApprovalRequest(
            run_id=run_id,
            approval_token=asked.approval_token,
            decision=scheduler_pb2.DECISION_REJECT,
            reason="not during the freeze",
        ),
        metadata=approver,
    )
    assert decided.run.status == common_pb2.RUN_STATUS_FAILED and decided.compensation_requested

    async def scaled_back() -> bool:
        replicas = await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'")
        status = await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id)
        return replicas == 1 and status == "compensated"

    await eventually(scaled_back, timeout=15, what="api scaled back to 1 and the saga compensated")
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=worker)
    assert journal.saga_status == common_pb2.SAGA_STATUS_COMPENSATED
    assert journal.compensation_started_at.ToDatetime() <= journal.compensation_completed_at.ToDatetime()
    by_id = {s.step_id: s for s in journal.steps}
    assert by_id["scale-api"].status == common_pb2.STEP_STATUS_COMPENSATED
    assert by_id["scale-api"].HasField("compensated_at")
    # not a tool call, nothing to undo; the rejection ended it, with who decided
    assert by_id["approval"].status == common_pb2.STEP_STATUS_FAILED
    assert by_id["approval"].error == "rejected by alice: not during the freeze"
    seed = {s["step_id"]: s for s in check_seed_format(journal.saga_steps_json)}
    assert seed["scale-api"]["status"] == "compensated"
    trigger = await db.fetchval("SELECT trigger FROM awooop_compensation_request WHERE run_id = $1", run_id)
    assert trigger == "approval_rejected"
    actions = await audit_actions(db, run_id)
    assert actions.index("SAGA_COMPENSATION_STARTED") < actions.index("SAGA_STEP_COMPENSATED")
    assert actions[-1] == "SAGA_COMPENSATION_ENDED"


# ---------------------------------------------------------------- order and failures


async def test_compensation_runs_in_exact_reverse_order_and_a_failing_middle_does_not_stop_the_rest(
    start_services, channels, make_key, db
) -> None:
    h = await harness(start_services, channels, make_key, db)
    run_id = await h.run_with_steps(
        [
            Step("plan"),
            create_cm("create-cm", "cfg"),
            insert_row("insert-row", simulate_failure="incidents table is read-only"),
            Step("exec", "k8s_exec_pod", {"pod": "api-0", "command": "restart"}),
            write_kb("write-kb", "kb-1"),
            scale("scale-web", "web", 5),
        ]
    )
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'web'") == 5
    await h.fail_run(run_id)
    request = await db.fetchrow("SELECT trigger, reason FROM awooop_compensation_request WHERE run_id = $1", run_id)
    assert (request["trigger"], request["reason"]) == ("step_failed", "step 7 failed")

    await eventually(lambda: h.request_done(run_id), what="the compensation request to end")
    # every compensation command ran once, last step first; llm_call and irreversible steps never
    assert await h.compensation_calls(run_id) == [
        ("scale-web", "executed"),
        ("write-kb", "executed"),
        ("insert-row", "failed"),
        ("create-cm", "executed"),
    ]
    assert await h.statuses(run_id) == {
        "plan": "completed",
        "create-cm": "compensated",
        "insert-row": "compensation_failed",
        "exec": "completed",
        "write-kb": "compensated",
        "scale-web": "compensated",
    }
    assert await h.saga_status(run_id) == "compensation_failed"
    # the world was put back, except the row whose compensation failed
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'web'") == 2
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_resource WHERE name = 'cfg'") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_row") == 1
    run = await db.fetchrow(
        "SELECT compensation_started_at, compensation_completed_at FROM awooop_run_state WHERE run_id = $1", run_id
    )
    assert run["compensation_started_at"] <= run["compensation_completed_at"]
    started = await db.fetchval(
        """SELECT details FROM awooop_audit_log WHERE run_id = $1 AND action = 'SAGA_COMPENSATION_STARTED'""", run_id
    )
    details = json.loads(started)
    assert details["order"] == ["scale-web", "write-kb", "insert-row", "create-cm"]
    assert {s["step_id"] for s in details["not_compensated"]} == {"plan", "exec"}
    failed = await db.fetchrow(
        "SELECT reason, details FROM awooop_audit_log WHERE run_id = $1 AND action = 'SAGA_COMPENSATION_FAILED'", run_id
    )
    assert "read-only" in failed["reason"] and json.loads(failed["details"])["step_id"] == "insert-row"
    journal = await h.saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=h.worker)
    assert journal.saga_status == common_pb2.SAGA_STATUS_COMPENSATION_FAILED
    seed = {s["step_id"]: s for s in check_seed_format(journal.saga_steps_json)}
    assert seed["insert-row"]["status"] == "compensation_failed" and "read-only" in seed["insert-row"]["error"]


async def test_compensation_failed_writes_the_audit_log_and_delivers_the_alert(
    start_services, channels, make_key, db, settings: Settings, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed criterion: compensation_failed -> audit_log + Telegram alert (here also the Redis
    stream), and an error in the saga's log. The Telegram stand-in fails the first delivery; the
    notifier retries it."""
    telegram = TelegramStub(fail_first=1).start()
    try:
        h = await harness(
            start_services,
            channels,
            make_key,
            db,
            telegram_api_base=telegram.base_url,
            telegram_bot_token="123:secret",
            telegram_chat_id="-1001",
        )
        run_id = await h.run_with_steps([scale("scale-api", "api", 4, simulate_failure="cluster unreachable")])
        await h.cancel_run(run_id)
        trigger = await db.fetchval("SELECT trigger FROM awooop_compensation_request WHERE run_id = $1", run_id)
        assert trigger == "cancelled"
        await eventually(lambda: h.request_done(run_id), what="the compensation request to end")
        assert await h.saga_status(run_id) == "compensation_failed"
        audit = await db.fetchrow(
            """SELECT actor, from_status, to_status, reason, details FROM awooop_audit_log
                WHERE run_id = $1 AND action = 'SAGA_COMPENSATION_FAILED'""",
            run_id,
        )
        assert audit["to_status"] == "compensation_failed" and "cluster unreachable" in audit["reason"]
        assert json.loads(audit["details"])["compensation_cmd"]["tool_id"] == "k8s_scale_deployment"
        logged = [
            r for r in caplog.records if r.name == "awooop.saga.driver" and r.getMessage() == "compensation failed"
        ]
        assert [r.levelname for r in logged] == ["ERROR"], caplog.text
        extra = vars(logged[0])  # the log record's fields, as the JSON log line carries them
        assert extra["run_id"] == run_id and extra["step_id"] == "scale-api" and "cluster unreachable" in extra["error"]

        async def telegram_delivered() -> list[Any]:
            return telegram.delivered()

        (msg,) = await eventually(telegram_delivered, what="the Telegram alert")
        assert msg.path == "/bot123:secret/sendMessage"
        assert msg.body["chat_id"] == "-1001"
        assert run_id in msg.body["text"] and "scale-api" in msg.body["text"]
        assert "cluster unreachable" in msg.body["text"]
        assert [r.answered for r in telegram.received] == [502, 200]

        r = aioredis.from_url(redis_url)
        try:
            entries = await r.xrange(f"{settings.redis_prefix}{settings.alert_stream}")
        finally:
            await r.aclose()
        assert len(entries) == 1
        fields = {k.decode(): v.decode() for k, v in entries[0][1].items()}
        assert fields["run_id"] == run_id and fields["step_id"] == "scale-api" and fields["project_id"] == PROJECT
        assert fields["kind"] == "compensation_failed" and "cluster unreachable" in fields["error"]

        # the notifier records the delivery after Telegram answered: wait for that write
        async def alert_done() -> bool:
            done = await db.fetchval("SELECT done_at IS NOT NULL FROM awooop_saga_alert WHERE run_id = $1", run_id)
            return bool(done)

        await eventually(alert_done, what="the alert's delivery to be recorded")
        alert = await db.fetchrow("SELECT * FROM awooop_saga_alert WHERE run_id = $1", run_id)
        assert alert["done_at"] is not None and alert["redis_sent_at"] is not None
        assert alert["telegram_sent_at"] is not None

        # the operator resolves it by hand (audited, with the reason); the saga reaches its end
        await expect_error(
            h.saga.ResolveCompensation(
                saga_pb2.ResolveCompensationRequest(run_id=run_id, step_id="scale-api", reason="x"), metadata=h.worker
            ),
            grpc.StatusCode.PERMISSION_DENIED,
            "FORBIDDEN",
        )
        resolved = await h.saga.ResolveCompensation(
            saga_pb2.ResolveCompensationRequest(
                run_id=run_id, step_id="scale-api", reason="scaled back by hand with kubectl"
            ),
            metadata=h.admin,
        )
        assert resolved.step.status == common_pb2.STEP_STATUS_RESOLVED
        assert resolved.step.resolved_by == "operator"
        assert resolved.saga_status == common_pb2.SAGA_STATUS_COMPENSATED
        assert await h.saga_status(run_id) == "compensated"
        row = await db.fetchrow(
            "SELECT actor, reason FROM awooop_audit_log WHERE run_id = $1 AND action = 'SAGA_COMPENSATION_RESOLVED'",
            run_id,
        )
        assert row["actor"] == "user:operator" and row["reason"] == "scaled back by hand with kubectl"
        await expect_error(
            h.saga.ResolveCompensation(
                saga_pb2.ResolveCompensationRequest(run_id=run_id, step_id="scale-api", reason="again"),
                metadata=h.admin,
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "INVALID_TRANSITION",
        )
    finally:
        telegram.stop()


async def test_retry_compensation_runs_a_failed_compensation_again(start_services, channels, make_key, db) -> None:
    # the scheduler's reaper loop fails the run: its lease expired with its one attempt used
    h = await harness(start_services, channels, make_key, db, scheduler={"reaper_interval": 0.2})
    await db.execute(
        """INSERT INTO awooop_refgw_fault (project_id, tool_id, code, message)
           VALUES ($1, 'knowledge_delete', 'FAILED_PRECONDITION', 'knowledge base is read-only')""",
        PROJECT,
    )
    run_id = await h.run_with_steps(
        [write_kb("kb-a", "a"), write_kb("kb-b", "b"), scale("scale-api", "api", 2)], max_attempts=1
    )
    await h.abandon_run(run_id)
    await eventually(lambda: h.request_done(run_id), what="the first compensation pass")
    run = await db.fetchrow("SELECT status, error_code FROM awooop_run_state WHERE run_id = $1", run_id)
    assert (run["status"], run["error_code"]) == ("FAILED", "E-RUN-MAX-ATTEMPTS")
    trigger = await db.fetchval("SELECT trigger FROM awooop_compensation_request WHERE run_id = $1", run_id)
    assert trigger == "step_failed"
    assert await h.statuses(run_id) == {
        "kb-a": "compensation_failed",
        "kb-b": "compensation_failed",
        "scale-api": "compensated",
    }
    assert await h.saga_status(run_id) == "compensation_failed"
    await expect_error(
        h.saga.RetryCompensation(
            saga_pb2.RetryCompensationRequest(run_id=run_id, step_id="scale-api"), metadata=h.admin
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )
    await expect_error(
        h.saga.RetryCompensation(saga_pb2.RetryCompensationRequest(run_id=run_id, step_id="nope"), metadata=h.admin),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    await expect_error(
        h.saga.RetryCompensation(saga_pb2.RetryCompensationRequest(run_id=run_id), metadata=h.worker),
        grpc.StatusCode.PERMISSION_DENIED,
        "FORBIDDEN",
    )

    # one step, while the knowledge base is still read-only: it fails again, the other stays failed
    retried = await h.saga.RetryCompensation(
        saga_pb2.RetryCompensationRequest(run_id=run_id, step_id="kb-b"), metadata=h.admin
    )
    assert retried.saga_status == common_pb2.SAGA_STATUS_COMPENSATING
    await eventually(lambda: h.request_done(run_id), what="the retry of kb-b")
    assert (await h.statuses(run_id))["kb-b"] == "compensation_failed"
    assert await h.saga_status(run_id) == "compensation_failed"

    # the knowledge base is back: retry all, with the same idempotency keys
    await db.execute("DELETE FROM awooop_refgw_fault")
    await h.saga.RetryCompensation(saga_pb2.RetryCompensationRequest(run_id=run_id), metadata=h.admin)

    async def compensated() -> bool:
        return await h.request_done(run_id) and await h.saga_status(run_id) == "compensated"

    await eventually(compensated, what="every compensation to succeed")
    assert set((await h.statuses(run_id)).values()) == {"compensated"}
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge") == 0
    calls = await h.compensation_calls(run_id)
    assert calls.count(("kb-b", "failed")) == 2 and calls.count(("kb-a", "failed")) == 1
    assert [c for c in calls if c[1] == "executed"] == [
        ("scale-api", "executed"),
        ("kb-b", "executed"),
        ("kb-a", "executed"),
    ]
    actions = await audit_actions(db, run_id)
    assert actions.count("SAGA_COMPENSATION_RETRY") == 2 and actions.count("SAGA_COMPENSATION_FAILED") == 3
    # escalations: one alert per failure
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_alert WHERE run_id = $1", run_id) == 3


# ---------------------------------------------------------------- Compensate RPC


async def test_compensate_rpc_is_idempotent_and_only_for_ended_runs(start_services, channels, make_key, db) -> None:
    h = await harness(start_services, channels, make_key, db)
    manual = saga_pb2.COMPENSATION_TRIGGER_MANUAL

    running = await h.run_with_steps([scale("scale-api", "api", 3)])
    err = await expect_error(
        h.saga.Compensate(saga_pb2.CompensateRequest(run_id=running, trigger=manual), metadata=h.admin),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert "RUNNING" in err.details()
    await expect_error(
        h.saga.Compensate(
            saga_pb2.CompensateRequest(run_id="5b2e9a3c-1d1e-4f7a-8a51-7f8a4c2d9e10", trigger=manual), metadata=h.admin
        ),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )

    # 10 concurrent requests for one failed run: one request, compensated once
    await db.execute("UPDATE awooop_run_state SET status = 'FAILED' WHERE run_id = $1", running)
    resps = await asyncio.gather(
        *(
            h.saga.Compensate(
                saga_pb2.CompensateRequest(run_id=running, trigger=manual, reason="operator asked"), metadata=h.admin
            )
            for _ in range(10)
        )
    )
    assert all([s.step_id for s in r.steps] == ["scale-api"] for r in resps)
    await eventually(lambda: h.request_done(running), what="compensation to end")
    assert await h.saga_status(running) == "compensated"
    assert await h.compensation_calls(running) == [("scale-api", "executed")]
    actions = await audit_actions(db, running)
    assert actions.count("SAGA_COMPENSATION_REQUESTED") == 1 and actions.count("SAGA_COMPENSATION_STARTED") == 1
    again = await h.saga.Compensate(saga_pb2.CompensateRequest(run_id=running, trigger=manual), metadata=h.admin)
    assert again.saga_status == common_pb2.SAGA_STATUS_COMPENSATED
    assert [s.status for s in again.steps] == [common_pb2.STEP_STATUS_COMPENSATED]

    # seed D6: a cancelled run with nothing compensatable just ends; the audit log records it and the
    # saga says not_needed (set when the run was cancelled; a manual request changes nothing)
    cancelled = await h.run_with_steps([Step("think"), Step("exec", "k8s_exec_pod", {"pod": "p", "command": "ls"})])
    await db.execute("UPDATE awooop_run_state SET status = 'CANCELLED' WHERE run_id = $1", cancelled)
    resp = await h.saga.Compensate(
        saga_pb2.CompensateRequest(run_id=cancelled, trigger=saga_pb2.COMPENSATION_TRIGGER_CANCELLED),
        metadata=h.admin,
    )
    assert list(resp.steps) == [] and resp.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED
    await eventually(lambda: h.request_done(cancelled), what="the skip to be recorded")
    assert await h.saga_status(cancelled) == "not_needed"
    run = await db.fetchrow("SELECT compensation_started_at FROM awooop_run_state WHERE run_id = $1", cancelled)
    assert run["compensation_started_at"] is None
    assert await audit_actions(db, cancelled) == ["CLAIMED", "SAGA_COMPENSATION_REQUESTED", "SAGA_COMPENSATION_SKIPPED"]
    assert await h.statuses(cancelled) == {"think": "completed", "exec": "completed"}
    assert await h.compensation_calls(cancelled) == []


# ---------------------------------------------------------------- durability


async def test_several_replicas_drive_every_request_exactly_once(start_services, channels, make_key, db) -> None:
    h = await harness(start_services, channels, make_key, db)
    for _ in range(2):  # three saga replicas in all, sharing the store
        await start_services("saga", gateway_addr=h.gateway_addr, compensation_interval=0.2)
    await db.execute(
        """INSERT INTO awooop_refgw_deployment (project_id, name, replicas)
           SELECT $1, 'd' || i, 1 FROM generate_series(0, 9) i""",
        PROJECT,
    )
    runs = [await h.run_with_steps([create_cm(f"cm-{i}", f"cm-{i}"), scale(f"s-{i}", f"d{i}", 4)]) for i in range(10)]
    # all ten fail at once (FailRun), each recording its compensation request
    await asyncio.gather(*(h.fail_run(run_id) for run_id in runs))

    async def all_done() -> bool:
        return bool(
            await db.fetchval(
                "SELECT bool_and(status = 'done') FROM awooop_compensation_request WHERE run_id = ANY($1::uuid[])", runs
            )
        )

    await eventually(all_done, timeout=30, what="every request to end")
    for i, run_id in enumerate(runs):
        assert await h.saga_status(run_id) == "compensated"
        assert await h.compensation_calls(run_id) == [(f"s-{i}", "executed"), (f"cm-{i}", "executed")]
        assert (await audit_actions(db, run_id)).count("SAGA_COMPENSATION_STARTED") == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_resource") == 0
    assert await db.fetchval("SELECT sum(replicas) FROM awooop_refgw_deployment WHERE name LIKE 'd%'") == 10


async def test_killing_the_saga_mid_compensation_finishes_the_rest_without_repeating_any(
    start_services, channels, make_key, db, settings: Settings, tmp_path: Path
) -> None:
    gw_rt = await start_services("gateway")
    gw_addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    gw = tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt)))
    env = settings_env(
        settings.with_(
            gateway_addr=gw_addr,
            compensation_interval=0.2,
            compensation_lease=3.0,
            tool_timeout=2.5,
            internal_api_key=dict(await service_key(gw_rt))["authorization"].removeprefix("Bearer "),
        )
    )
    first = await spawn_services(["saga"], env, tmp_path, name="saga-1")
    try:
        saga = saga_pb2_grpc.SagaServiceStub(channels(first.ports["saga"]))
        h = Harness(
            saga=saga,
            sched=await scheduler_stub(start_services, channels),
            gw=gw,
            worker=await make_key("worker", {PROJECT: ["worker"]}, "service"),
            admin=await make_key("operator", {PROJECT: ["admin"]}),
            db=db,
            gateway_addr=gw_addr,
        )
        await db.execute(
            "INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT
        )
        run_id = await h.run_with_steps(
            [
                write_kb("s1-kb", "kb-1"),
                create_cm("s2-cm", "cfg", simulate_delay_ms=1500),  # its compensation is slow: the crash window
                scale("s3-scale", "api", 3),
            ]
        )
        await h.fail_run(run_id)

        async def s2_in_flight() -> bool:
            return (await h.statuses(run_id))["s2-cm"] == "compensating" and (
                ("s2-cm", "received") in await h.compensation_calls(run_id)
            )

        await eventually(s2_in_flight, what="s2's compensation call to be in flight")
        first.kill()
    finally:
        first.kill()
    assert await h.statuses(run_id) == {"s1-kb": "completed", "s2-cm": "compensating", "s3-scale": "compensated"}
    assert await h.saga_status(run_id) == "compensating"
    # the request is held under the killed replica's lease, named as a run's: worker_id, attempt_count
    crashed, attempt = await h.request_lease(run_id)
    assert crashed.startswith("saga-") and attempt == 1

    second = await spawn_services(["saga"], env, tmp_path, name="saga-2")
    try:

        async def finished() -> bool:
            return await h.request_done(run_id)

        await eventually(finished, timeout=20, what="the restarted saga to finish the compensation")
    finally:
        second.terminate()
    # taken over once its lease expired: another worker_id, the next attempt (the old token is stale)
    took_over, attempt = await h.request_lease(run_id)
    assert took_over != crashed and took_over.startswith("saga-") and attempt >= 2
    assert await h.statuses(run_id) == {"s1-kb": "compensated", "s2-cm": "compensated", "s3-scale": "compensated"}
    assert await h.saga_status(run_id) == "compensated"
    # never twice: one execution per compensation; s2 was asked again and replayed, s3 never again
    assert await h.compensation_calls(run_id) == [
        ("s3-scale", "executed"),
        ("s2-cm", "executed"),
        ("s2-cm", "replayed"),
        ("s1-kb", "executed"),
    ]
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_resource") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge") == 0
    replayed = await db.fetchval(
        """SELECT details->>'replayed' FROM awooop_audit_log
            WHERE run_id = $1 AND action = 'SAGA_STEP_COMPENSATED' AND details->>'step_id' = 's2-cm'""",
        run_id,
    )
    assert replayed == "true"
    assert (await audit_actions(db, run_id)).count("SAGA_COMPENSATION_STARTED") == 1


async def test_an_unreachable_gateway_is_a_failed_compensation_not_a_stuck_one(
    start_services, channels, make_key, db
) -> None:
    gw_rt = await start_services("gateway")  # the worker's gateway; the saga is pointed at a dead address
    saga_rt = await start_services(
        "saga", gateway_addr=f"127.0.0.1:{free_port()}", compensation_interval=0.2, tool_timeout=0.5
    )
    h = Harness(
        saga=saga_pb2_grpc.SagaServiceStub(channels(saga_rt.ports["saga"])),
        sched=await scheduler_stub(start_services, channels),
        gw=tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt))),
        worker=await make_key("worker", {PROJECT: ["worker"]}, "service"),
        admin=await make_key("operator", {PROJECT: ["admin"]}),
        db=db,
        gateway_addr="",
    )
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT)
    run_id = await h.run_with_steps([scale("scale-api", "api", 3)])
    await h.cancel_run(run_id)
    await eventually(lambda: h.request_done(run_id), what="the compensation to end")
    assert await h.statuses(run_id) == {"scale-api": "compensation_failed"}
    assert await h.saga_status(run_id) == "compensation_failed"
    error = await db.fetchval("SELECT error FROM awooop_saga_step WHERE run_id = $1", run_id)
    assert error.startswith("UNAVAILABLE")
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_alert WHERE run_id = $1", run_id) == 1
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 3


# ---------------------------------------------------------------- the saga's key at the gateway


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def compensation_passes(n: int) -> None:
    """Waits until the saga's compensation loop has run n more passes (a real counter)."""
    target = counter("awooop_background_runs_total", loop="saga_compensation", outcome="ok") + n

    async def done() -> bool:
        return counter("awooop_background_runs_total", loop="saga_compensation", outcome="ok") >= target

    await eventually(done, what=f"{n} compensation loop passes")


def key_lines(caplog: Any, text: str) -> list[str]:
    """ERROR lines of the saga that contain text."""
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and text in r.getMessage()]


async def test_a_saga_without_a_key_is_not_serving_says_what_to_set_and_compensates_nothing(
    start_services, channels, make_key, db, caplog
) -> None:
    """No AWOOOP_INTERNAL_API_KEY: every compensation call would be refused by the gateway. The saga
    says so once, at ERROR, naming the setting; its compensation plane's health is NOT_SERVING
    while the journal (SagaService, the whole server) stays SERVING (issue 41, item 3: a whole-server
    NOT_SERVING stopped every project's steps); the recorded request waits, claimed by nobody,
    instead of ending compensation_failed step by step."""
    caplog.set_level(logging.ERROR, logger="awooop.saga")
    h = await harness(start_services, channels, make_key, db, internal_api_key="")
    assert await h.saga_health(COMPENSATION) == NOT_SERVING
    assert await h.saga_health() == SERVING and await h.saga_health("") == SERVING
    (line,) = key_lines(caplog, "AWOOOP_INTERNAL_API_KEY is not set")
    assert "set AWOOOP_INTERNAL_API_KEY" in line and h.gateway_addr in line

    # journaling still works (nothing a worker sends is lost); compensation waits
    run_id = await failed_and_waiting(h, db)
    assert await h.statuses(run_id) == {"scale-api": "completed"}
    # through the SDK's channel, which health-checks the whole server before any call: answered
    sdk = Client(key=h.admin[0][1].removeprefix("Bearer "), saga=f"127.0.0.1:{h.saga_port}", timeout=10)
    try:
        journal = await sdk.call(sdk.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id))
        assert [s.step_id for s in journal.steps] == ["scale-api"]
    finally:
        await sdk.close()
    assert len(key_lines(caplog, "AWOOOP_INTERNAL_API_KEY is not set")) == 1  # one line, not one per pass


async def failed_and_waiting(h: Harness, db: asyncpg.Connection) -> str:
    """A run with one completed scale step, failed: its compensation request is recorded and,
    three passes later, still waits, with no call to the gateway."""
    run_id = await h.run_with_steps([scale("scale-api", "api", 3)])
    await h.fail_run(run_id)
    await compensation_passes(3)
    assert await db.fetchval("SELECT status FROM awooop_compensation_request WHERE run_id = $1", run_id) == "pending"
    assert await h.compensation_calls(run_id) == []
    return run_id


async def key_restored_then_compensated(h: Harness, db: asyncpg.Connection, run_id: str, key_id: str) -> None:
    """The revoked key valid again: the saga is SERVING and the waiting request compensates the
    scale once (api back to 1 replica)."""
    await db.execute("UPDATE awooop_api_key SET revoked_at = NULL WHERE key_id = $1", key_id)

    async def compensated() -> bool:
        return await h.request_done(run_id) and await h.saga_status(run_id) == "compensated"

    await eventually(compensated, timeout=15, what="the compensation once the key is accepted")
    assert await h.saga_health(COMPENSATION) == SERVING
    assert await h.compensation_calls(run_id) == [("scale-api", "executed")]
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 1


async def test_a_key_the_gateway_refuses_is_not_serving_and_compensation_resumes_once_it_is_accepted(
    start_services, channels, make_key, db, caplog
) -> None:
    caplog.set_level(logging.ERROR, logger="awooop.saga")
    md = await make_key("saga-svc", {"*": ["admin"]}, "service")
    key = md[0][1].removeprefix("Bearer ")
    key_id = key.split("_")[1]
    await db.execute("UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1", key_id)
    refused_before = counter("awooop_saga_gateway_auth_probes_total", outcome="refused")
    h = await harness(start_services, channels, make_key, db, internal_api_key=key)

    async def not_serving() -> bool:
        return await h.saga_health(COMPENSATION) == NOT_SERVING

    await eventually(not_serving, what="the saga's compensation to report NOT_SERVING")
    assert await h.saga_health() == SERVING and await h.saga_health("") == SERVING
    assert counter("awooop_saga_gateway_auth_probes_total", outcome="refused") > refused_before
    (line,) = key_lines(caplog, "refuses AWOOOP_INTERNAL_API_KEY (UNAUTHENTICATED")
    assert "set AWOOOP_INTERNAL_API_KEY" in line and h.gateway_addr in line

    run_id = await failed_and_waiting(h, db)

    # the key becomes valid (here: the revocation undone): SERVING again, and the request is driven
    await key_restored_then_compensated(h, db, run_id, key_id)


async def test_a_compensation_refused_unauthenticated_logs_an_error_counts_it_and_waits_for_the_key(
    start_services, channels, make_key, db, caplog
) -> None:
    """The key worked at start-up and is revoked later: the compensation call that meets the
    refusal is logged at ERROR and counted; nothing ran, so the step is not compensation_failed:
    the request waits (NOT_SERVING meanwhile) and finishes with the same idempotency key."""
    caplog.set_level(logging.ERROR, logger="awooop.saga")
    md = await make_key("saga-svc", {"*": ["admin"]}, "service")
    key = md[0][1].removeprefix("Bearer ")
    key_id = key.split("_")[1]
    accepted_before = counter("awooop_saga_gateway_auth_probes_total", outcome="accepted")
    # the gateway re-reads a key on every call (no 5 s trust), so the revocation bites at once
    gw_rt = await start_services("gateway", auth_cache_seconds=0)
    addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    saga_rt = await start_services("saga", gateway_addr=addr, compensation_interval=0.2, internal_api_key=key)
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT)
    h = Harness(
        saga=saga_pb2_grpc.SagaServiceStub(channels(saga_rt.ports["saga"])),
        sched=await scheduler_stub(start_services, channels),
        gw=tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt))),
        worker=await make_key("worker", {PROJECT: ["worker"]}, "service"),
        admin=await make_key("operator", {PROJECT: ["admin"]}),
        db=db,
        gateway_addr=addr,
        saga_port=saga_rt.ports["saga"],
    )

    async def probed() -> bool:
        return counter("awooop_saga_gateway_auth_probes_total", outcome="accepted") > accepted_before

    await eventually(probed, what="the gateway to accept the saga's key")
    assert await h.saga_health(COMPENSATION) == SERVING
    run_id = await h.run_with_steps([scale("scale-api", "api", 3)])
    refused_before = counter("awooop_saga_gateway_unauthenticated_total")
    await db.execute("UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1", key_id)
    await h.fail_run(run_id)

    async def refused() -> bool:
        return counter("awooop_saga_gateway_unauthenticated_total") > refused_before

    await eventually(refused, what="the compensation call to be refused")
    (line,) = key_lines(caplog, "compensation of step scale-api refused UNAUTHENTICATED")
    assert "set AWOOOP_INTERNAL_API_KEY" in line
    assert await h.saga_health(COMPENSATION) == NOT_SERVING
    assert await h.saga_health() == SERVING
    await compensation_passes(2)
    assert await db.fetchval("SELECT status FROM awooop_compensation_request WHERE run_id = $1", run_id) == "pending"
    assert await h.statuses(run_id) == {"scale-api": "compensating"}  # started, nothing ran: called again later
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_alert WHERE run_id = $1", run_id) == 0

    await key_restored_then_compensated(h, db, run_id, key_id)


async def test_awooop_serve_saga_without_a_key_fails_its_compensation_healthcheck_and_logs_what_to_set(
    start_services, settings: Settings, tmp_path: Path
) -> None:
    """As a deployment sees it: `awooop serve saga` with no AWOOOP_INTERNAL_API_KEY next to a real
    gateway; `awooop health --service compensation` fails while the image's healthcheck and the
    readiness probe's name (`--service saga`) and the whole server pass (the journal serves), and
    the process's log has the one ERROR line saying what to set."""
    gw = await start_services("gateway")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env |= settings_env(settings.with_(gateway_addr=f"127.0.0.1:{gw.ports['gateway']}"))
    env |= {"AWOOOP_SAGA_PORT": str(port), "AWOOOP_METRICS_PORT": "0", "AWOOOP_INTERNAL_API_KEY": ""}
    log_path = tmp_path / "saga.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awooop.cli", "serve", "saga"], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    try:

        def healthcheck(service: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-m", "awooop.cli", "health", f"127.0.0.1:{port}", "--service", service]
            return subprocess.run(argv, capture_output=True, text=True, timeout=30)

        async def answered() -> subprocess.CompletedProcess[str] | None:
            assert proc.poll() is None, log_path.read_text()
            out = await asyncio.to_thread(healthcheck, "compensation")
            return out if "unreachable" not in out.stdout + out.stderr else None

        verdict = await eventually(answered, timeout=30, interval=0.2, what="the saga to answer its healthcheck")
        assert verdict.returncode == 1 and "compensation: NOT_SERVING" in verdict.stderr, verdict.stderr
        for service in ("saga", ""):
            journal = await asyncio.to_thread(healthcheck, service)
            assert journal.returncode == 0, (service, journal.stdout + journal.stderr)
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        errors = [entry["msg"] for entry in lines if entry["level"] == "error"]
        assert len(errors) == 1 and "AWOOOP_INTERNAL_API_KEY is not set" in errors[0], errors
        assert "set AWOOOP_INTERNAL_API_KEY" in errors[0]
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
