"""RecordStep: a step without side effects (llm_call, callback) journaled once, after it ran.
Same fencing and seq allocation as BeginStep; the first completed result stands. Real Postgres,
real gRPC, concurrent callers for the races."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from tests.harness.helpers import expect_error
from tests.harness.saga import LLM, PROJECT, TOOL, claim, field_names, lease, new_run, reap, saga_stub, struct

CALLBACK = common_pb2.STEP_TYPE_CALLBACK
COMPLETED, FAILED = common_pb2.STEP_STATUS_COMPLETED, common_pb2.STEP_STATUS_FAILED


def record(now: common_pb2.LeaseToken, step_id: str, **kw: Any) -> saga_pb2.RecordStepRequest:
    kw.setdefault("step_type", LLM)
    return saga_pb2.RecordStepRequest(lease=now, step_id=step_id, **kw)


async def leased(start_services, channels, make_key, db) -> tuple[Any, Any, str, common_pb2.LeaseToken]:  # type: ignore[no-untyped-def]
    """(saga stub, worker metadata, run id, lease) for a fresh saga server and a claimed run."""
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    return saga, md, run_id, lease(run_id, await claim(db, run_id))


async def test_record_journals_a_completed_step_once_and_the_first_result_stands(
    start_services, channels, make_key, db
) -> None:
    saga, md, run_id, now = await leased(start_services, channels, make_key, db)

    first = await saga.RecordStep(
        record(now, "think", result=struct({"answer": "scale"}), params=struct({"prompt": "why?"})), metadata=md
    )
    assert first.recorded
    assert first.step.status == COMPLETED and first.step.seq == 1 and first.step.attempt == now.attempt
    assert dict(first.step.result) == {"answer": "scale"} and dict(first.step.tool_params) == {"prompt": "why?"}
    assert first.step.HasField("completed_at")

    again = await saga.RecordStep(record(now, "think", result=struct({"answer": "other"})), metadata=md)
    assert not again.recorded
    assert dict(again.step.result) == {"answer": "scale"}

    # interleaves with BeginStep/CompleteStep steps in one order (seq)
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=now, step_id="scale", step_type=TOOL, tool_id="k8s_scale_deployment"),
        metadata=md,
    )
    last = await saga.RecordStep(record(now, "report", step_type=CALLBACK), metadata=md)
    assert last.step.seq == 3 and dict(last.step.result) == {}

    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md)
    assert [(s.step_id, s.seq) for s in journal.steps] == [("think", 1), ("scale", 2), ("report", 3)]
    assert dict(journal.steps[0].result) == {"answer": "scale"}
    # a completed step begun again is skipped, as if it had been begun and completed
    skip = await saga.BeginStep(saga_pb2.BeginStepRequest(lease=now, step_id="think", step_type=LLM), metadata=md)
    assert skip.action == saga_pb2.STEP_ACTION_SKIP and dict(skip.step.result) == {"answer": "scale"}


async def test_record_a_failure_then_a_later_attempt_records_the_step_completed(
    start_services, channels, make_key, db
) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    first = lease(run_id, await claim(db, run_id))

    failed = await saga.RecordStep(record(first, "think", error="TimeoutError: model"), metadata=md)
    assert failed.recorded and failed.step.status == FAILED and failed.step.error == "TimeoutError: model"
    # a pending step left by a crashed attempt (begun, never ended) is also taken over
    await saga.BeginStep(saga_pb2.BeginStepRequest(lease=first, step_id="plan", step_type=LLM), metadata=md)

    await reap(db, run_id)
    second = lease(run_id, await claim(db, run_id, "w2"))
    await expect_error(
        saga.RecordStep(record(first, "think", result=struct({"x": 1})), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_LOST",
    )
    for step_id in ("think", "plan"):
        done = await saga.RecordStep(record(second, step_id, result=struct({"ok": step_id})), metadata=md)
        assert done.recorded and done.step.status == COMPLETED and done.step.attempt == second.attempt
        assert done.step.error == ""
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md)
    assert [(s.step_id, s.seq, s.status) for s in journal.steps] == [("think", 1, COMPLETED), ("plan", 2, COMPLETED)]


async def test_record_refuses_bad_input_other_kinds_and_strangers(start_services, channels, make_key, db) -> None:
    saga = await saga_stub(start_services, channels)
    md = await make_key("worker", {PROJECT: ["worker"]})
    outsider = await make_key("outsider", {"elsewhere": ["worker"]})
    run_id = await new_run(db)
    now = lease(run_id, await claim(db, run_id))

    err = await expect_error(
        saga.RecordStep(record(now, "scale", step_type=TOOL), metadata=md), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert field_names(err) == {"step_type"}
    err = await expect_error(
        saga.RecordStep(saga_pb2.RecordStepRequest(step_id="", result=struct({"a": 1}), error="boom"), metadata=md),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert field_names(err) == {"lease", "step_id", "step_type", "result"}

    # a step id already journaled as a tool call names that step: recording it as llm_call is refused
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=now, step_id="scale", step_type=TOOL, tool_id="k8s_scale_deployment"),
        metadata=md,
    )
    err = await expect_error(
        saga.RecordStep(record(now, "scale", result=struct({"a": 1})), metadata=md), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert field_names(err) == {"step_id"}
    await expect_error(saga.RecordStep(record(now, "x"), metadata=outsider), grpc.StatusCode.NOT_FOUND)
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md)
    assert [(s.step_id, s.status) for s in journal.steps] == [("scale", common_pb2.STEP_STATUS_PENDING)]


async def test_ten_concurrent_records_take_distinct_positions_and_one_wins_each_step(
    start_services, channels, make_key, db
) -> None:
    saga, md, run_id, now = await leased(start_services, channels, make_key, db)

    distinct = await asyncio.gather(
        *(saga.RecordStep(record(now, f"s{i}", result=struct({"i": i})), metadata=md) for i in range(10))
    )
    assert all(r.recorded for r in distinct)
    assert sorted(r.step.seq for r in distinct) == list(range(1, 11))

    same = await asyncio.gather(
        *(saga.RecordStep(record(now, "same", result=struct({"i": i})), metadata=md) for i in range(10))
    )
    winners = [r for r in same if r.recorded]
    assert len(winners) == 1
    assert {dict(r.step.result)["i"] for r in same} == {dict(winners[0].step.result)["i"]}
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id) == 11


async def test_record_commits_asynchronously_for_its_own_transaction_only(db) -> None:
    """The statement turns synchronous_commit off inside its transaction (a lost record only means
    the step runs again) and the connection, a pooled one in the service, keeps its setting."""
    import json

    from services.common.runstate import LEASED
    from services.saga import journal_sql

    run_id = await new_run(db)
    token = await claim(db, run_id)
    before = await db.fetchval("SHOW synchronous_commit")
    async with db.transaction():
        row = await journal_sql.record_step(
            db,
            run_id=run_id,
            attempt=token,
            step_id="think",
            step_type="llm_call",
            status="completed",
            result=json.dumps({"a": 1}),
            error=None,
            projects=None,
            leased=list(LEASED),
            params=None,
        )
        assert row is not None and row["status"] == "completed"
        assert await db.fetchval("SHOW synchronous_commit") == "off"
    assert await db.fetchval("SHOW synchronous_commit") == before
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id) == 1


async def test_a_journal_too_large_to_read_whole_is_refused_and_the_sdk_asks_step_by_step(
    start_services, channels, make_key, db
) -> None:
    """GetJournal answers RESOURCE_EXHAUSTED / JOURNAL_TOO_LARGE past the message limit; the worker
    SDK then journals llm_call / callback steps with BeginStep, which still skips completed ones."""
    from awooop.scheduler.v1 import scheduler_pb2
    from awooop.worker.client import Client
    from awooop.worker.context import RunContext

    # the smallest message limit the payload limits allow (settings.deliverability_problem)
    rt = await start_services(
        "saga", max_message_bytes=160 * 1024, max_payload_bytes=32 * 1024, max_step_result_bytes=32 * 1024
    )
    saga = saga_pb2_grpc.SagaServiceStub(channels(rt.ports["saga"]))
    md = await make_key("worker", {PROJECT: ["worker"]})
    run_id = await new_run(db)
    first = await claim(db, run_id)
    await db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, status, result, attempt,
                                         completed_at)
           SELECT $1, 'big-' || g, $2, g, 'callback', 'completed', jsonb_build_object('blob', repeat('x', 20000)),
                  $3, now()
             FROM generate_series(1, 10) g""",
        run_id,
        PROJECT,
        first,
    )
    err = await expect_error(
        saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=md),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "JOURNAL_TOO_LARGE",
    )
    assert "AWOOOP_MAX_MESSAGE_BYTES" in err.details()

    await reap(db, run_id)
    second = await claim(db, run_id, "w2")
    async with Client(key=dict(md)["authorization"].removeprefix("Bearer "), saga=f"127.0.0.1:{rt.ports['saga']}") as c:
        claimed = scheduler_pb2.ClaimedRun(
            run=common_pb2.Run(run_id=run_id, project_id=PROJECT), lease=lease(run_id, second), resumed=True
        )
        ctx = RunContext(c, claimed, "w2")
        ran: list[str] = []

        def step_fn(call: Any) -> dict[str, Any]:
            ran.append(call.step_id)
            return {"ran": call.step_id}

        skipped = await ctx.step("big-3", step_fn)
        assert len(skipped["blob"]) == 20000 and ran == []
        assert await ctx.step("new", step_fn) == {"ran": "new"} and ran == ["new"]
        assert ctx.actions == {"big-3": "skip", "new": "execute"}
    row = await db.fetchrow("SELECT status, seq FROM awooop_saga_step WHERE run_id = $1 AND step_id = 'new'", run_id)
    assert (row["status"], row["seq"]) == ("completed", 11)
