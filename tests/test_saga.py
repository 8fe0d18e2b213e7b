"""Saga journal (seed ADR-119 D1, D2): begin / complete / fail under the lease's fencing token,
resume-skip after a worker crash, the seed's saga_steps format, validation and tenant isolation.
Real Postgres, real gRPC; the crashing worker is a real process killed with SIGKILL."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import sys
from typing import Any

import asyncpg
import grpc

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common import errors
from tests.harness.helpers import ROOT, expect_error
from tests.harness.saga import (
    LLM,
    PROJECT,
    TOOL,
    check_seed_format,
    claim,
    field_names,
    lease,
    new_run,
    reap,
    saga_stub,
    struct,
)

EXECUTE, SKIP, RETRY = saga_pb2.STEP_ACTION_EXECUTE, saga_pb2.STEP_ACTION_SKIP, saga_pb2.STEP_ACTION_RETRY


# ---------------------------------------------------------------- seed criterion: crash after step 2 of 4

CRASHING_WORKER = r"""
import asyncio, sys
import grpc
from google.protobuf import struct_pb2
from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2_grpc, saga_pb2

def struct(d):
    s = struct_pb2.Struct(); s.update(d); return s

async def main(port, key, run_id, attempt):
    md = (("authorization", "Bearer " + key),)
    lease = common_pb2.LeaseToken(run_id=run_id, attempt=int(attempt))
    async with grpc.aio.insecure_channel("127.0.0.1:" + port) as ch:
        saga = saga_pb2_grpc.SagaServiceStub(ch)
        plan = [("step-1", common_pb2.STEP_TYPE_LLM_CALL, "", {"prompt": "plan"}, {"plan": ["scale", "notify"]}),
                ("step-2", common_pb2.STEP_TYPE_TOOL_CALL, "k8s_scale_deployment",
                 {"deployment": "api", "replicas": 3}, {"replicas": 3, "previous_replicas": 1})]
        for step_id, kind, tool, params, result in plan:
            b = await saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease, step_id=step_id, step_type=kind,
                                     tool_id=tool, tool_params=struct(params)), metadata=md)
            assert b.action == saga_pb2.STEP_ACTION_EXECUTE, b
            await saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=lease, step_id=step_id, result=struct(result)),
                                    metadata=md)
        await saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease, step_id="step-3",
                             step_type=common_pb2.STEP_TYPE_TOOL_CALL, tool_id="knowledge_write",
                             tool_params=struct({"content": "incident note"})), metadata=md)
        print("begun step-3", flush=True)
        await asyncio.sleep(3600)  # "working" on step 3 when it is killed

asyncio.run(main(*sys.argv[1:]))
"""


async def test_worker_crash_after_step_2_of_4_resumes_skipping_completed_steps(
    start_services, channels, make_key, db
) -> None:
    saga_rt = await start_services("saga")
    port = saga_rt.ports["saga"]
    md = await make_key("worker", {PROJECT: ["worker"]})
    key = md[0][1].removeprefix("Bearer ")
    run_id = await new_run(db)
    first = await claim(db, run_id, "worker-a")

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHING_WORKER,
        str(port),
        key,
        run_id,
        str(first),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)  # type: ignore[union-attr]
        assert line.strip() == b"begun step-3"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # the lease expires, the reaper takes the run back, another worker claims it
    await reap(db, run_id)
    second = await claim(db, run_id, "worker-b")
    assert second == first + 1
    saga = saga_pb2_grpc.SagaServiceStub(channels(port))
    now = lease(run_id, second)

    b1 = await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=now, step_id="step-1", step_type=LLM, tool_params=struct({"prompt": "plan"})),
        metadata=md,
    )
    assert b1.action == SKIP
    assert dict(b1.step.result)["plan"] == ["scale", "notify"]
    b2 = await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=now,
            step_id="step-2",
            step_type=TOOL,
            tool_id="k8s_scale_deployment",
            tool_params=struct({"deployment": "api", "replicas": 3}),
        ),
        metadata=md,
    )
    assert b2.action == SKIP
    assert dict(b2.step.result) == {"replicas": 3, "previous_replicas": 1}
    assert b2.step.attempt == first  # recorded by the crashed attempt, reused as is
    b3 = await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=now,
            step_id="step-3",
            step_type=TOOL,
            tool_id="knowledge_write",
            tool_params=struct({"content": "incident note"}),
        ),
        metadata=md,
    )
    assert b3.action == RETRY
    assert b3.idempotency_key == f"{run_id}:step-3"  # the same key the crashed attempt used
    assert b3.step.attempt == second and b3.step.seq == 3
    b4 = await saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="step-4", step_type=LLM), metadata=md)
    assert b4.action == EXECUTE and b4.step.seq == 4

    # the crashed attempt's token is stale: it writes nothing
    await expect_error(
        saga.CompleteStep(
            saga_pb2.CompleteStepRequest(lease=lease(run_id, first), step_id="step-3", result=struct({"x": 1})),
            metadata=md,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_LOST",
    )
    for step_id in ("step-3", "step-4"):
        await saga.CompleteStep(
            saga_pb2.CompleteStepRequest(lease=now, step_id=step_id, result=struct({"done": step_id})), metadata=md
        )
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md)
    assert [s.step_id for s in journal.steps] == ["step-1", "step-2", "step-3", "step-4"]
    assert [s.status for s in journal.steps] == [common_pb2.STEP_STATUS_COMPLETED] * 4
    assert dict(journal.steps[2].result) == {"done": "step-3"}
    # step 1 and 2 were each executed (begun) exactly once: their started_at/attempt never changed
    assert [s.attempt for s in journal.steps] == [first, first, second, second]


# ---------------------------------------------------------------- seed criterion: the saga_steps format


async def test_get_journal_returns_the_seed_saga_steps_format(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    token = await claim(db, run_id)
    now = lease(run_id, token)

    await saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="think", step_type=LLM), metadata=md)
    await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(lease=now, step_id="think", result=struct({"answer": "scale", "note": None})),
        metadata=md,
    )
    params = {"deployment": "api", "replicas": 3}
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=now, step_id="scale", step_type=TOOL, tool_id="k8s_scale_deployment", tool_params=struct(params)
        ),
        metadata=md,
    )
    cmd = common_pb2.CompensationCommand(
        tool_id="k8s_scale_deployment",
        params=struct({"deployment": "api", "replicas": 1}),
        reason="SAGA compensation: scale deployment back",
    )
    await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(
            lease=now, step_id="scale", result=struct({"previous_replicas": 1}), compensation_cmd=cmd
        ),
        metadata=md,
    )
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=now, step_id="notify", step_type=common_pb2.STEP_TYPE_CALLBACK), metadata=md
    )
    await saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="notify", error="webhook 500"), metadata=md)
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=now, step_id="approve", step_type=common_pb2.STEP_TYPE_APPROVAL_REQUEST),
        metadata=md,
    )

    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md)
    steps = check_seed_format(journal.saga_steps_json)
    assert [s["step_id"] for s in steps] == ["think", "scale", "notify", "approve"]
    assert [s["status"] for s in steps] == ["completed", "completed", "failed", "pending"]
    assert [s["step_type"] for s in steps] == ["llm_call", "tool_call", "callback", "approval_request"]
    think, scale, notify, _ = steps
    assert think["result"] == {"answer": "scale", "note": None}  # nulls inside values are kept
    assert "tool_id" not in think
    assert scale["tool_id"] == "k8s_scale_deployment"
    assert scale["tool_params"] == {"deployment": "api", "replicas": 3}  # integers stay integers
    assert scale["compensation_cmd"] == {
        "tool_id": "k8s_scale_deployment",
        "params": {"deployment": "api", "replicas": 1},
        "reason": "SAGA compensation: scale deployment back",
    }
    assert notify["error"] == "webhook 500"
    # the protobuf view of the same journal agrees, with positions and attempts
    assert [s.seq for s in journal.steps] == [1, 2, 3, 4]
    assert [s.step_id for s in journal.steps] == [s["step_id"] for s in steps]
    assert journal.saga_status == common_pb2.SAGA_STATUS_IN_PROGRESS
    assert journal.steps[1].compensation_cmd.tool_id == "k8s_scale_deployment"
    # and so does the store's view awooop_run_saga_steps (the seed's saga_steps column, assembled on read)
    view = await db.fetchval("SELECT saga_steps::text FROM awooop_run_saga_steps WHERE run_id = $1", run_id)
    assert json.loads(view) == steps


# ---------------------------------------------------------------- lifecycle rules


async def test_step_lifecycle_rules(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    token = await claim(db, run_id)
    now = lease(run_id, token)

    def begin(step_id: str, kind: int = TOOL, tool: str = "pg_mutate") -> Any:
        return saga.BeginStep(
            saga_pb2.BeginStepRequest(lease=now, step_id=step_id, step_type=kind, tool_id=tool), metadata=md
        )

    assert (await begin("a")).action == EXECUTE
    again = await begin("a")  # the same attempt begins it again (its reply was lost): still run it
    assert again.action == RETRY and again.step.seq == 1
    # a step id names one step: another type or tool is refused
    err = await expect_error(begin("a", LLM, ""), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert field_names(err) == {"step_id"}
    await expect_error(begin("a", TOOL, "knowledge_write"), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")

    done = await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(lease=now, step_id="a", result=struct({"inserted_id": "1"})), metadata=md
    )
    assert done.step.status == common_pb2.STEP_STATUS_COMPLETED
    # a repeated CompleteStep answers OK; the first result stands
    repeat = await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(lease=now, step_id="a", result=struct({"inserted_id": "2"})), metadata=md
    )
    assert dict(repeat.step.result) == {"inserted_id": "1"}
    assert (await begin("a")).action == SKIP
    await expect_error(
        saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="a", error="late"), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )

    # fail, then retry: the same step runs again
    await begin("b")
    failed = await saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="b", error="timeout"), metadata=md)
    assert failed.step.status == common_pb2.STEP_STATUS_FAILED and failed.step.error == "timeout"
    await saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="b", error="timeout"), metadata=md)  # idempotent
    await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="b"), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )
    retried = await begin("b")
    assert retried.action == RETRY and retried.step.status == common_pb2.STEP_STATUS_PENDING and not retried.step.error

    # compensation commands: tool_call steps only, never for irreversible tools
    cmd = common_pb2.CompensationCommand(tool_id="pg_mutate", params=struct({"op": "DELETE"}))
    await begin("c", LLM, "")
    err = await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="c", compensation_cmd=cmd), metadata=md),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    assert field_names(err) == {"compensation_cmd"}
    await begin("d", TOOL, "k8s_exec_pod")
    err = await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="d", compensation_cmd=cmd), metadata=md),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    assert "irreversible" in err.details()
    await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="nope"), metadata=md),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    # nothing of the refused writes reached the store
    rows = await db.fetch("SELECT step_id, status, compensation_cmd FROM awooop_saga_step WHERE run_id = $1", run_id)
    assert {r["step_id"]: r["status"] for r in rows} == {
        "a": "completed",
        "b": "pending",
        "c": "pending",
        "d": "pending",
    }
    assert all(r["compensation_cmd"] is None for r in rows)

    # a step begun by an earlier attempt must be begun again before this attempt completes it
    await reap(db, run_id)
    later = lease(run_id, await claim(db, run_id))
    await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=later, step_id="c"), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )


async def test_stale_or_missing_lease_is_lease_lost_and_writes_nothing(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)

    async def steps() -> int:
        return int(await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id))

    begin_a = saga_pb2.BeginStepRequest(lease=lease(run_id, 1), step_id="a", step_type=LLM)
    # not claimed yet (PENDING): no lease to write under
    await expect_error(saga.BeginStep(begin_a, metadata=md), grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
    first = await claim(db, run_id)
    await saga.BeginStep(begin_a, metadata=md)
    await reap(db, run_id)
    second = await claim(db, run_id)
    for call in (
        saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease(run_id, first), step_id="b", step_type=LLM), metadata=md),
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=lease(run_id, first), step_id="a"), metadata=md),
        saga.FailStep(saga_pb2.FailStepRequest(lease=lease(run_id, first), step_id="a", error="x"), metadata=md),
        saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease(run_id, first), step_id="a", step_type=LLM), metadata=md),
    ):
        err = await expect_error(call, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        assert errors.error_info(err).metadata["attempt"] == str(first)
    assert await steps() == 1
    row = await db.fetchrow("SELECT status, attempt FROM awooop_saga_step WHERE run_id = $1", run_id)
    assert (row["status"], row["attempt"]) == ("pending", first)
    # a finished run has no lease either
    await db.execute("UPDATE awooop_run_state SET status = 'COMPLETED' WHERE run_id = $1", run_id)
    await expect_error(
        saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease(run_id, second), step_id="a", step_type=LLM), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_LOST",
    )
    # WAITING_TOOL keeps the lease
    await db.execute("UPDATE awooop_run_state SET status = 'WAITING_TOOL' WHERE run_id = $1", run_id)
    resp = await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=lease(run_id, second), step_id="a", step_type=LLM), metadata=md
    )
    assert resp.action == RETRY
    await expect_error(
        saga.BeginStep(
            saga_pb2.BeginStepRequest(
                lease=lease("8a3d2a6e-2f4f-4f1e-9a57-0d6f3c1f0b11", 1), step_id="a", step_type=LLM
            ),
            metadata=md,
        ),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )


async def test_bad_input_is_invalid_argument_with_field_violations(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels, max_step_result_bytes=1024)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    now = lease(run_id, await claim(db, run_id))
    big = struct({"blob": "x" * 2000})
    cases: list[tuple[Any, set[str]]] = [
        (saga.BeginStep(saga_pb2.BeginStepRequest(step_id="a", step_type=LLM), metadata=md), {"lease"}),
        (
            saga.BeginStep(saga_pb2.BeginStepRequest(lease=lease("nope", 0), step_id="a", step_type=LLM), metadata=md),
            {"lease.run_id", "lease.attempt"},
        ),
        (saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_type=LLM), metadata=md), {"step_id"}),
        (
            saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="x" * 129, step_type=LLM), metadata=md),
            {"step_id"},
        ),
        (saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="a b", step_type=LLM), metadata=md), {"step_id"}),
        (saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="a"), metadata=md), {"step_type"}),
        (saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=99), metadata=md), {"step_type"}),
        (saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=TOOL), metadata=md), {"tool_id"}),
        (
            saga.BeginStep(
                saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=TOOL, tool_id="t" * 129), metadata=md
            ),
            {"tool_id"},
        ),
        (
            saga.BeginStep(
                saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=TOOL, tool_id="t", tool_params=big),
                metadata=md,
            ),
            {"tool_params"},
        ),
        (saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="a", result=big), metadata=md), {"result"}),
        (
            saga.CompleteStep(
                saga_pb2.CompleteStepRequest(
                    lease=now, step_id="a", compensation_cmd=common_pb2.CompensationCommand(params=big)
                ),
                metadata=md,
            ),
            {"compensation_cmd.tool_id", "compensation_cmd.params"},
        ),
        (
            saga.CompleteStep(
                saga_pb2.CompleteStepRequest(
                    lease=now, step_id="a", compensation_cmd=common_pb2.CompensationCommand(tool_id="k8s_exec_pod")
                ),
                metadata=md,
            ),
            {"compensation_cmd.tool_id"},
        ),
        (
            saga.BeginStep(
                saga_pb2.BeginStepRequest(
                    lease=now, step_id="a", step_type=TOOL, tool_id="t", tool_params=struct({"k": "nul\x00"})
                ),
                metadata=md,
            ),
            {"tool_params"},
        ),
        (
            saga.CompleteStep(
                saga_pb2.CompleteStepRequest(lease=now, step_id="a", result=struct({"k": float("inf")})), metadata=md
            ),
            {"result"},
        ),
        (saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="a"), metadata=md), {"error"}),
        (saga.FailStep(saga_pb2.FailStepRequest(lease=now, step_id="a", error="e" * 4097), metadata=md), {"error"}),
        (saga.GetJournal(saga_pb2.GetJournalRequest(run_id="not-a-uuid"), metadata=md), {"run_id"}),
        (saga.Compensate(saga_pb2.CompensateRequest(run_id=run_id), metadata=md), {"trigger"}),
        (
            saga.ResolveCompensation(saga_pb2.ResolveCompensationRequest(run_id=run_id, step_id="a"), metadata=md),
            {"reason"},
        ),
        (
            saga.ResolveCompensation(
                saga_pb2.ResolveCompensationRequest(run_id=run_id, step_id="a", reason="   "), metadata=md
            ),
            {"reason"},
        ),
    ]
    for call, fields in cases:
        err = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
        assert field_names(err) == fields, (fields, err.details())
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step") == 0

    # the result cap applies to what is stored: just under it is fine
    await saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=LLM), metadata=md)
    ok = await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(lease=now, step_id="a", result=struct({"blob": "x" * 900})), metadata=md
    )
    assert ok.step.status == common_pb2.STEP_STATUS_COMPLETED


async def test_tenant_isolation_and_roles(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels)
    worker = await make_key("worker", {PROJECT: ["worker"]})
    other = await make_key("other", {"other-proj": ["worker", "admin"]})
    approver = await make_key("approver", {PROJECT: ["approver"]})
    run_id = await new_run(db)
    now = lease(run_id, await claim(db, run_id))
    begin = saga_pb2.BeginStepRequest(lease=now, step_id="a", step_type=LLM)

    # another project's worker cannot learn the run exists: the same answer as an unknown run
    err = await expect_error(saga.BeginStep(begin, metadata=other), grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert run_id in err.details()
    await expect_error(
        saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=other), grpc.StatusCode.NOT_FOUND
    )
    await expect_error(
        saga.Compensate(
            saga_pb2.CompensateRequest(run_id=run_id, trigger=saga_pb2.COMPENSATION_TRIGGER_MANUAL), metadata=other
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    # a member without the worker role: PERMISSION_DENIED
    await expect_error(saga.BeginStep(begin, metadata=approver), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
    await expect_error(saga.BeginStep(begin), grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step") == 0

    await saga.BeginStep(begin, metadata=worker)
    # approvers may read the journal (what would be undone); workers may not request compensation
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=approver)
    assert [s.step_id for s in journal.steps] == ["a"]
    await db.execute("UPDATE awooop_run_state SET status = 'FAILED' WHERE run_id = $1", run_id)
    await expect_error(
        saga.Compensate(
            saga_pb2.CompensateRequest(run_id=run_id, trigger=saga_pb2.COMPENSATION_TRIGGER_MANUAL), metadata=worker
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "FORBIDDEN",
    )
    assert await db.fetchval("SELECT count(*) FROM awooop_compensation_request") == 0


# ---------------------------------------------------------------- concurrency


async def test_concurrent_begins_allocate_distinct_positions_and_execute_once(
    start_services, channels, make_key, db
) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    now = lease(run_id, await claim(db, run_id))

    # 10 different steps at once: 10 distinct positions 1..10, no error
    got = await asyncio.gather(
        *(
            saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id=f"s{i}", step_type=LLM), metadata=md)
            for i in range(10)
        )
    )
    assert sorted(r.step.seq for r in got) == list(range(1, 11))
    assert {r.action for r in got} == {EXECUTE}

    # 10 begins of one step at once: exactly one is told to execute it
    same = await asyncio.gather(
        *(
            saga.BeginStep(
                saga_pb2.BeginStepRequest(lease=now, step_id="once", step_type=TOOL, tool_id="pg_mutate"), metadata=md
            )
            for _ in range(10)
        )
    )
    assert [r.action for r in same].count(EXECUTE) == 1
    assert {r.step.seq for r in same} == {11}

    # 10 completes of one step at once: all answer the one recorded result
    done = await asyncio.gather(
        *(
            saga.CompleteStep(
                saga_pb2.CompleteStepRequest(lease=now, step_id="once", result=struct({"n": i})), metadata=md
            )
            for i in range(10)
        )
    )
    assert len({json.dumps(dict(r.step.result)) for r in done}) == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id) == 11


async def test_concurrent_reap_and_journal_writes_never_write_under_a_lost_lease(
    start_services, channels, make_key, db, db_dsn
) -> None:
    """10 workers' writes race a reap: each write either landed before the reap or got LEASE_LOST."""
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    token = await claim(db, run_id)
    now = lease(run_id, token)
    for i in range(10):
        await saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id=f"s{i}", step_type=LLM), metadata=md)

    reaper = await asyncpg.connect(db_dsn)
    try:

        async def complete(i: int) -> str:
            try:
                await saga.CompleteStep(
                    saga_pb2.CompleteStepRequest(lease=now, step_id=f"s{i}", result=struct({"i": i})), metadata=md
                )
                return "ok"
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                return "lost"

        async def reap_now() -> dt.datetime:
            await reaper.execute(
                "UPDATE awooop_run_state SET status = 'PENDING', reaped_at = now() WHERE run_id = $1", run_id
            )
            return await reaper.fetchval("SELECT clock_timestamp()")  # after the reap committed

        results = await asyncio.gather(*(complete(i) for i in range(10)), reap_now())
    finally:
        await reaper.close()
    reap_committed = results[-1]
    rows = await db.fetch("SELECT step_id, status, completed_at FROM awooop_saga_step WHERE run_id = $1", run_id)
    completed = {r["step_id"] for r in rows if r["status"] == "completed"}
    # what the workers were told is what the store holds, and no write began after the reap committed
    assert completed == {f"s{i}" for i, outcome in enumerate(results[:-1]) if outcome == "ok"}
    assert all(r["completed_at"] < reap_committed for r in rows if r["status"] == "completed")
    # after the reap, every write of that lease is refused
    await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=now, step_id="s0"), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_LOST",
    )
