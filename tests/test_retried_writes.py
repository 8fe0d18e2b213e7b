"""Retried worker writes are idempotent for the same lease: a CompleteRun, a CompleteRuns item,
a ClaimRuns.complete item or a FailRun whose first attempt committed (its answer lost to a crash
or a dropped connection) answers the same success again, and writes nothing twice. Another
lease's retry is still refused. Real scheduler, real store."""

from __future__ import annotations

from typing import Any

import grpc
import pytest_asyncio

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import errors
from tests.harness.helpers import expect_error
from tests.harness.scheduler import Sched, audit_actions, insert_runs, make_sched, run_row

FP = grpc.StatusCode.FAILED_PRECONDITION


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services: Any, channels: Any, db: Any, make_key: Any) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


async def test_complete_run_retried_by_the_same_lease_answers_the_same_success(s: Sched) -> None:
    (rid,) = await insert_runs(s.db, "p", 1)
    c = await s.claim_one()
    req = pb.CompleteRunRequest(lease=c.lease)
    req.output.update({"answer": 42})
    first = await s.stub.CompleteRun(req, metadata=s.worker)
    again = await s.stub.CompleteRun(req, metadata=s.worker)
    assert again.run == first.run and again.run.status == common_pb2.RUN_STATUS_COMPLETED
    assert (await audit_actions(s.db, rid)).count("COMPLETED") == 1
    # in a batch, and carried by a claim, the same
    batch = await s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=[req, req]), metadata=s.worker)
    assert [r.run for r in batch.results] == [first.run, first.run]
    carried = await s.stub.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], complete=[req]), metadata=s.worker
    )
    assert [r.run for r in carried.completed] == [first.run] and not carried.completed[0].error_reason
    assert (await audit_actions(s.db, rid)).count("COMPLETED") == 1
    # other runs' refusals are unchanged: FailRun of a completed run is still INVALID_TRANSITION
    await expect_error(
        s.stub.FailRun(pb.FailRunRequest(lease=c.lease), metadata=s.worker), FP, errors.INVALID_TRANSITION
    )


async def test_a_batch_completed_twice_answers_every_item_the_same(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 3)
    claimed = await s.claim(max_runs=3)
    items = [pb.CompleteRunRequest(lease=c.lease) for c in claimed]
    first = await s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=items), metadata=s.worker)
    again = await s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=items), metadata=s.worker)
    assert [r.run for r in again.results] == [r.run for r in first.results]
    assert all(not r.error_reason for r in again.results)
    for rid in ids:
        assert (await audit_actions(s.db, rid)).count("COMPLETED") == 1


async def test_fail_run_retried_by_the_same_lease_answers_the_same_success(s: Sched) -> None:
    retry_id, final_id = await insert_runs(s.db, "p", 2)
    retry, final = await s.claim(max_runs=2)
    assert (retry.run.run_id, final.run.run_id) == (retry_id, final_id)
    again_req = pb.FailRunRequest(lease=retry.lease, reason="flaky", retryable=True)
    first = await s.stub.FailRun(again_req, metadata=s.worker)
    assert first.run.status == common_pb2.RUN_STATUS_PENDING
    again = await s.stub.FailRun(again_req, metadata=s.worker)
    assert again.run == first.run
    final_req = pb.FailRunRequest(lease=final.lease, reason="broken", retryable=False)
    done = await s.stub.FailRun(final_req, metadata=s.worker)
    assert done.run.status == common_pb2.RUN_STATUS_FAILED
    assert (await s.stub.FailRun(final_req, metadata=s.worker)).run == done.run
    assert (await audit_actions(s.db, retry_id)).count("RETRY_SCHEDULED") == 1
    assert (await audit_actions(s.db, final_id)).count("FAILED") == 1
    # a retried run claimed again: the old lease's FailRun and CompleteRun are stale now
    await s.db.execute("UPDATE awooop_run_state SET not_before = NULL WHERE run_id = $1::uuid", retry_id)
    second = await s.claim_one()
    assert second.run.run_id == retry_id and second.lease.attempt == 2
    await expect_error(s.stub.FailRun(again_req, metadata=s.worker), FP, errors.LEASE_LOST)
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=retry.lease), metadata=s.worker), FP, errors.LEASE_LOST
    )
    assert (await run_row(s.db, retry_id))["status"] == "RUNNING"
    # a released run (no FailRun) is not mistaken for a failed one
    await s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=second.lease), metadata=s.worker)
    await expect_error(s.stub.FailRun(pb.FailRunRequest(lease=second.lease), metadata=s.worker), FP, errors.LEASE_LOST)


async def test_request_approval_repeated_by_the_same_lease_answers_a_new_token_that_decides(s: Sched) -> None:
    (rid,) = await insert_runs(s.db, "p", 1)
    c = await s.claim_one()
    req = pb.RequestApprovalRequest(lease=c.lease, summary="scale api to 3?")
    lost = await s.stub.RequestApproval(req, metadata=s.worker)  # committed; say its answer never arrived
    again = await s.stub.RequestApproval(req, metadata=s.worker)
    assert again.run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL
    assert again.approval_token != lost.approval_token and again.expires_at == lost.expires_at
    # only the token of the last answer decides
    await expect_error(
        s.stub.DecideApproval(
            pb.DecideApprovalRequest(run_id=rid, approval_token=lost.approval_token, decision=pb.DECISION_APPROVE),
            metadata=s.approver,
        ),
        FP,
        errors.APPROVAL_INVALID,
    )
    decided = await s.stub.DecideApproval(
        pb.DecideApprovalRequest(run_id=rid, approval_token=again.approval_token, decision=pb.DECISION_APPROVE),
        metadata=s.approver,
    )
    assert decided.run.status == common_pb2.RUN_STATUS_RESUMED
    assert await audit_actions(s.db, rid) == ["CLAIMED", "APPROVAL_REQUESTED", "APPROVAL_TOKEN_REISSUED", "APPROVED"]
    # resumed and claimed again (attempt 2) and waiting again: attempt 1's repeat is refused
    second = await s.claim_one()
    await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=second.lease), metadata=s.worker)
    await expect_error(s.stub.RequestApproval(req, metadata=s.worker), FP, errors.LEASE_LOST)
    assert (await audit_actions(s.db, rid)).count("APPROVAL_TOKEN_REISSUED") == 1


async def test_a_decision_repeated_by_its_approver_answers_the_same_and_nothing_else_does(s: Sched) -> None:
    approved_id, rejected_id = await insert_runs(s.db, "p", 2)
    tokens = {}
    for c in await s.claim(max_runs=2):
        resp = await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=c.lease), metadata=s.worker)
        tokens[c.run.run_id] = resp.approval_token

    def decide(run_id: str, decision: Any, md: Any) -> Any:
        req = pb.DecideApprovalRequest(run_id=run_id, approval_token=tokens[run_id], decision=decision, reason="ok")
        return s.stub.DecideApproval(req, metadata=md)

    first = await decide(approved_id, pb.DECISION_APPROVE, s.approver)
    assert (await decide(approved_id, pb.DECISION_APPROVE, s.approver)).run == first.run
    rejected = await decide(rejected_id, pb.DECISION_REJECT, s.approver)
    again = await decide(rejected_id, pb.DECISION_REJECT, s.approver)
    assert again.run == rejected.run and again.compensation_requested == rejected.compensation_requested
    # the other decision, or another approver with the same token, is still refused
    await expect_error(decide(approved_id, pb.DECISION_REJECT, s.approver), FP, errors.INVALID_TRANSITION)
    await expect_error(decide(approved_id, pb.DECISION_APPROVE, s.admin), FP, errors.INVALID_TRANSITION)
    await expect_error(decide(rejected_id, pb.DECISION_APPROVE, s.approver), FP, errors.INVALID_TRANSITION)
    assert (await audit_actions(s.db, approved_id)).count("APPROVED") == 1
    assert (await audit_actions(s.db, rejected_id)).count("APPROVAL_REJECTED") == 1
