"""Statuses that tell the truth: a run that ended with nothing to undo says saga `not_needed`
(not `in_progress`); a rejected or expired approval step ends `failed` with the decision and who
made it, instead of staying `pending` forever. Real scheduler and saga services, real store."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import grpc

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import errors
from services.common.runstate import LEASED
from services.saga import journal_sql
from tests.harness.helpers import eventually, expect_error, lock_waiters
from tests.harness.saga import struct
from tests.harness.scheduler import (
    Sched,
    approval_expired,
    audit_actions,
    comp_request,
    dur,
    insert_runs,
    make_sched,
)


async def _saga_status(s: Sched, run_id: str) -> str:
    return str(await s.db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id)))


async def _setup(start_services: Any, channels: Any, db: Any, make_key: Any) -> tuple[Sched, Any]:
    s = await make_sched(start_services, channels, db, make_key)
    rt = await start_services("saga")
    return s, saga_pb2_grpc.SagaServiceStub(channels(rt.ports["saga"]))


async def test_a_run_that_ended_with_nothing_to_undo_says_not_needed(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    s, saga = await _setup(start_services, channels, db, make_key)
    await insert_runs(s.db, "p", 3)

    # completed: a completed run is never compensated
    done = await s.claim_one()
    await saga.RecordStep(
        saga_pb2.RecordStepRequest(
            lease=done.lease, step_id="think", step_type=common_pb2.STEP_TYPE_LLM_CALL, result=struct({"a": 1})
        ),
        metadata=s.worker,
    )
    assert await _saga_status(s, done.run.run_id) == "in_progress"  # still going
    resp = await s.stub.CompleteRun(pb.CompleteRunRequest(lease=done.lease), metadata=s.worker)
    assert resp.run.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED
    assert await _saga_status(s, done.run.run_id) == "not_needed"
    # the batch path (CompleteRuns) too
    batch = await s.claim_one()
    out = await s.stub.CompleteRuns(
        pb.CompleteRunsRequest(runs=[pb.CompleteRunRequest(lease=batch.lease)]), metadata=s.worker
    )
    assert out.results[0].run.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED

    # failed for good with only an llm step: nothing to undo, no compensation request
    failed = await s.claim_one()
    await s.db.execute("UPDATE awooop_run_state SET max_attempts = 1 WHERE run_id = $1", uuid.UUID(failed.run.run_id))
    await saga.RecordStep(
        saga_pb2.RecordStepRequest(
            lease=failed.lease, step_id="think", step_type=common_pb2.STEP_TYPE_LLM_CALL, result=struct({"a": 1})
        ),
        metadata=s.worker,
    )
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=failed.lease, reason="boom"), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and not resp.compensation_requested
    assert resp.run.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED
    got = await s.stub.GetRun(pb.GetRunRequest(run_id=failed.run.run_id), metadata=s.worker)
    assert got.run.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED


async def test_a_failed_run_with_something_to_undo_stays_in_progress_until_compensated(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    s, saga = await _setup(start_services, channels, db, make_key)
    await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    await s.db.execute("UPDATE awooop_run_state SET max_attempts = 1 WHERE run_id = $1", uuid.UUID(r.run.run_id))
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=r.lease, step_id="scale", step_type=common_pb2.STEP_TYPE_TOOL_CALL, tool_id="k8s_scale_deployment"
        ),
        metadata=s.worker,
    )
    await saga.CompleteStep(
        saga_pb2.CompleteStepRequest(
            lease=r.lease,
            step_id="scale",
            result=struct({"ok": True}),
            compensation_cmd=common_pb2.CompensationCommand(tool_id="k8s_scale_deployment", params=struct({"r": 1})),
        ),
        metadata=s.worker,
    )
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=r.lease, reason="boom"), metadata=s.worker)
    assert resp.compensation_requested
    # compensation is owed: the saga is not over
    assert resp.run.saga_status == common_pb2.SAGA_STATUS_IN_PROGRESS


async def _waiting_with_approval_step(s: Sched, saga: Any, ttl: float = 0) -> tuple[str, str]:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=r.lease, step_id="approval", step_type=common_pb2.STEP_TYPE_APPROVAL_REQUEST),
        metadata=s.worker,
    )
    resp = await s.stub.RequestApproval(
        pb.RequestApprovalRequest(lease=r.lease, summary="ok?", ttl=dur(ttl)), metadata=s.worker
    )
    return run_id, resp.approval_token


async def _approval_step(s: Sched, run_id: str) -> Any:
    return await s.db.fetchrow(
        "SELECT status, error, result, completed_at FROM awooop_saga_step WHERE run_id = $1 AND step_id = 'approval'",
        uuid.UUID(run_id),
    )


async def test_a_rejected_approval_step_ends_failed_with_the_decision_and_who(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    s, saga = await _setup(start_services, channels, db, make_key)
    run_id, token = await _waiting_with_approval_step(s, saga)
    assert (await _approval_step(s, run_id))["status"] == "pending"
    resp = await s.stub.DecideApproval(
        pb.DecideApprovalRequest(run_id=run_id, approval_token=token, decision=pb.DECISION_REJECT, reason="too risky"),
        metadata=s.approver,
    )
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and resp.run.approval_decided_by == "alice"
    step = await _approval_step(s, run_id)
    assert step["status"] == "failed" and step["completed_at"] is not None
    assert step["error"] == "rejected by alice: too risky"
    assert json.loads(step["result"]) == {
        "approved": False,
        "decision": "rejected",
        "decided_by": "alice",
        "reason": "too risky",
    }
    # the journal as every client reads it says the same; nothing was left to undo
    journal = await saga.GetJournal(saga_pb2.GetJournalRequest(run_id=run_id), metadata=s.approver)
    assert [st.status for st in journal.steps] == [common_pb2.STEP_STATUS_FAILED]
    assert journal.saga_status == common_pb2.SAGA_STATUS_NOT_NEEDED


async def test_an_expired_approval_step_ends_failed_by_the_sweep_and_by_a_late_decision(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    s, saga = await _setup(start_services, channels, db, make_key)
    swept, _ = await _waiting_with_approval_step(s, saga, ttl=0.2)
    late, late_token = await _waiting_with_approval_step(s, saga, ttl=0.2)
    await eventually(lambda: approval_expired(s, swept), what="the first approval to expire")
    await eventually(lambda: approval_expired(s, late), what="the second approval to expire")

    # a decision that comes too late: the DecideApproval statement itself fails the run
    await expect_error(
        s.stub.DecideApproval(
            pb.DecideApprovalRequest(run_id=late, approval_token=late_token, decision=pb.DECISION_APPROVE),
            metadata=s.approver,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.APPROVAL_EXPIRED,
    )
    assert await s.expire_approvals() == 1  # the other one, by the sweep

    for run_id in (swept, late):
        step = await _approval_step(s, run_id)
        assert step["status"] == "failed" and step["error"] == "approval expired (E-APPROVAL-002)", run_id
        assert json.loads(step["result"]) == {
            "approved": False,
            "decision": "expired",
            "decided_by": None,
            "reason": "approval token expired",
        }
        assert await _saga_status(s, run_id) == "not_needed"


async def test_a_run_failed_while_its_journal_write_commits_an_undo_gets_its_compensation_request(
    start_services: Any, channels: Any, db: Any, db_dsn: str, make_key: Any
) -> None:
    """FinishStep holds the run row (FOR SHARE) while it completes a tool call with an undo; a
    FailRun of the same lease waits for that row. The request is decided after the wait, so it
    sees the step (migration 0210: the rule's function reads a fresh snapshot; the statement's
    own snapshot, taken before the wait, did not, while the saga_status trigger did). Its audit
    row and log row follow the FAILED one."""
    s, saga = await _setup(start_services, channels, db, make_key)
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=1)
    r = await s.claim_one()
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=r.lease, step_id="scale", step_type=common_pb2.STEP_TYPE_TOOL_CALL, tool_id="k8s_scale_deployment"
        ),
        metadata=s.worker,
    )
    journal_write = await asyncpg.connect(db_dsn)
    try:
        tx = journal_write.transaction()
        await tx.start()
        finished = await journal_sql.finish_step(
            journal_write,
            run_id=run_id,
            attempt=r.lease.attempt,
            step_id="scale",
            status="completed",
            result='{"ok": true}',
            compensation_cmd='{"tool_id": "k8s_scale_deployment", "params": {"r": 1}}',
            error=None,
            projects=None,
            leased=list(LEASED),
            irreversible=[],
        )
        assert finished is not None and finished["status"] == "completed"
        fail = asyncio.ensure_future(s.stub.FailRun(pb.FailRunRequest(lease=r.lease, reason="boom"), metadata=s.worker))
        await eventually(lambda: lock_waiters(s.db), what="FailRun to wait for the journal write's row lock")
        await tx.commit()
        resp = await fail
    finally:
        await journal_write.close()
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED
    assert resp.compensation_requested
    request = await comp_request(s.db, run_id)
    assert request is not None and request["trigger"] == "step_failed"
    assert resp.run.saga_status == common_pb2.SAGA_STATUS_IN_PROGRESS
    assert (await audit_actions(s.db, run_id))[-2:] == ["FAILED", "COMPENSATION_REQUESTED"]
    log = await s.db.fetch(
        "SELECT kind FROM awooop_run_event WHERE run_id = $1 AND source = 'state' ORDER BY seq", uuid.UUID(run_id)
    )
    assert [row["kind"] for row in log][-2:] == ["FAILED", "COMPENSATION_REQUESTED"]
