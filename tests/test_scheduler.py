"""Scheduler: claims, fenced leases, heartbeats, worker writes, approvals, cancel, reads,
against real Postgres, real Redis and a real in-process gRPC server over real channels.

Concurrency, the reaper and the crash test live in test_scheduler_leases.py and
test_scheduler_crash.py; the helpers they share are in tests/harness/scheduler.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

import asyncpg
import grpc
import pytest
import pytest_asyncio

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import errors
from services.common.validate import to_struct
from tests.harness.helpers import eventually, expect_error
from tests.harness.scheduler import (
    Metadata,
    Sched,
    add_compensatable_step,
    approval_expired,
    audit_actions,
    claims_waiting,
    comp_request,
    dur,
    expire_lease,
    insert_runs,
    lease,
    make_sched,
    run_row,
    snapshot,
    wait_listening,
)

FP = grpc.StatusCode.FAILED_PRECONDITION

# --- fixtures -----------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services, channels, db, make_key) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


# --- claim ----------------------------------------------------------------------------------------


async def test_claim_takes_oldest_first_with_lease_and_fencing_token(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 3)
    runs = await s.claim(max_runs=2)
    assert [r.run.run_id for r in runs] == ids[:2]
    for r in runs:
        assert r.run.status == common_pb2.RUN_STATUS_RUNNING
        assert r.lease.attempt == 1 and r.run.attempt_count == 1 and not r.resumed
        assert r.run.worker_id == "w1"
        row = await run_row(s.db, r.run.run_id)
        assert row["status"] == "RUNNING" and row["worker_id"] == "w1" and row["attempt_count"] == 1
        assert row["lease_until"] > row["heartbeat_at"]
        assert r.lease_until.ToDatetime(tzinfo=row["lease_until"].tzinfo) == row["lease_until"]
        assert await audit_actions(s.db, r.run.run_id) == ["CLAIMED"]
    # the default lease is the configured one (5 min by default)
    row = await run_row(s.db, ids[0])
    assert abs((row["lease_until"] - row["heartbeat_at"]).total_seconds() - s.rt.settings.lease_ttl) < 1
    # the third, then nothing
    assert [r.run.run_id for r in await s.claim(max_runs=5)] == ids[2:]
    assert await s.claim(max_runs=5) == []


async def test_claim_needs_the_worker_role_in_every_project(s: Sched) -> None:
    await insert_runs(s.db, "p", 1)
    err = await expect_error(
        s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["p", "q"]), metadata=s.worker),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    info = errors.error_info(err)
    assert info is not None and info.metadata["project_id"] == "q"
    await expect_error(
        s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["p"]), metadata=s.approver),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    # nothing was claimed by the refused calls
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'PENDING'") == 1


async def test_claim_skips_other_projects_backoff_and_exhausted_runs(s: Sched) -> None:
    await insert_runs(s.db, "q", 1)
    (later,) = await insert_runs(s.db, "p", 1)
    (used_up,) = await insert_runs(s.db, "p", 1, max_attempts=1)
    await s.db.execute(
        "UPDATE awooop_run_state SET not_before = now() + interval '1 hour' WHERE run_id = $1", uuid.UUID(later)
    )
    # attempts used up (not reachable through the API; guards the claim all the same)
    await s.db.execute("UPDATE awooop_run_state SET attempt_count = 1 WHERE run_id = $1", uuid.UUID(used_up))
    assert await s.claim(max_runs=10) == []


@pytest.mark.parametrize("projects", [["p"], ["p", "q"]], ids=["one-project", "several-projects"])
async def test_a_locked_head_of_the_queue_is_skipped_not_waited_for(
    s: Sched, db_dsn: str, make_key: Any, projects: list[str]
) -> None:
    """FOR UPDATE SKIP LOCKED: while another transaction holds the oldest PENDING run's row lock
    (a concurrent claim, the reaper, an operator's UPDATE), a claim hands out the next run within
    the RPC instead of queueing behind the lock (both claim shapes: one project, several)."""
    worker = await make_key("worker-pq", {p: ["worker"] for p in projects}, "service")
    head, second = await insert_runs(s.db, "p", 2)
    holder = await asyncpg.connect(db_dsn)
    try:
        async with holder.transaction():
            locked = await holder.fetchval(
                """SELECT run_id FROM awooop_run_state WHERE status = 'PENDING'
                    ORDER BY created_at LIMIT 1 FOR UPDATE"""
            )
            assert str(locked) == head
            # a claim that waited on the lock would end in DEADLINE_EXCEEDED (the lock is held
            # until after the call): the deadline bounds the failing case only
            resp = await s.stub.ClaimRuns(
                pb.ClaimRunsRequest(worker_id="w1", project_ids=projects, max_runs=1),
                metadata=worker,
                timeout=5,
            )
            assert [r.run.run_id for r in resp.runs] == [second]
            # the locked run was left as it was
            assert (await run_row(s.db, head))["status"] == "PENDING"
    finally:
        await holder.close()
    # the lock released, the head is claimable again
    assert [r.run.run_id for r in await s.claim(md=worker, project_ids=projects, max_runs=1)] == [head]


async def test_long_poll_claim_is_woken_by_a_new_run(s: Sched) -> None:
    await wait_listening(s)
    task = asyncio.ensure_future(s.claim(wait=dur(60)))
    await eventually(lambda: claims_waiting(1), what="the claim to wait")
    assert not task.done()
    (run_id,) = await insert_runs(s.db, "p", 1)  # commits, then NOTIFY (as ingest does)
    runs = await asyncio.wait_for(task, 20)  # bounded: a lost wake-up would wait the full 60 s
    assert [r.run.run_id for r in runs] == [run_id]


async def test_long_poll_returns_empty_when_the_wait_ends_or_the_deadline_nears(s: Sched) -> None:
    assert await s.claim(wait=dur(0.3)) == []
    # a 60 s wait under a 5 s deadline answers (empty) instead of DEADLINE_EXCEEDED
    resp = await s.stub.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="w", project_ids=["p"], wait=dur(60)), metadata=s.worker, timeout=5
    )
    assert list(resp.runs) == []


# --- heartbeat --------------------------------------------------------------------------------------


async def test_heartbeat_renews_many_leases_in_request_order(s: Sched) -> None:
    await insert_runs(s.db, "p", 3)
    runs = await s.claim(max_runs=3, lease_ttl=dur(30))
    before = {r.run.run_id: (await run_row(s.db, r.run.run_id))["lease_until"] for r in runs}
    tokens = [r.lease for r in runs]
    stale = lease(runs[0].run.run_id, 7)
    unknown = lease(uuid.uuid4(), 1)
    out = await s.heartbeat("w1", tokens[2], stale, tokens[0], unknown, tokens[1], lease_ttl=dur(120))
    sent = [tokens[2], stale, tokens[0], unknown, tokens[1]]
    assert [o.lease.run_id for o in out] == [t.run_id for t in sent]
    assert [o.outcome for o in out] == [
        pb.LEASE_OUTCOME_RENEWED,
        pb.LEASE_OUTCOME_LEASE_LOST,
        pb.LEASE_OUTCOME_RENEWED,
        pb.LEASE_OUTCOME_LEASE_LOST,
        pb.LEASE_OUTCOME_RENEWED,
    ]
    for o in out:
        if o.outcome == pb.LEASE_OUTCOME_RENEWED:
            row = await run_row(s.db, o.lease.run_id)
            assert row["lease_until"] > before[o.lease.run_id]
            assert o.lease_until.ToDatetime(tzinfo=row["lease_until"].tzinfo) == row["lease_until"]
            assert not o.cancel_requested


async def test_heartbeat_of_another_worker_or_project_is_lease_lost(s: Sched) -> None:
    await insert_runs(s.db, "p", 1)
    r = await s.claim_one("w1")
    (o,) = await s.heartbeat("w2", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST
    # a worker of project q learns nothing about a lease in p, even with the right worker id
    (o,) = await s.heartbeat("w1", r.lease, md=s.outsider)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST
    (o,) = await s.heartbeat("w1", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_RENEWED


async def test_an_expired_lease_not_yet_reaped_is_renewed(s: Sched) -> None:
    """Documented choice: a lease is held until the reaper takes it (seed 000 D2 renews on
    status and worker); the reaper re-checks expiry under the row lock."""
    await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    await expire_lease(s.db, r.run.run_id)
    (o,) = await s.heartbeat("w1", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_RENEWED
    assert (await s.reap()).total == 0
    assert (await run_row(s.db, r.run.run_id))["status"] == "RUNNING"


# --- complete / fail / release ----------------------------------------------------------------------


async def test_complete_stores_output_and_ends_the_lease(s: Sched) -> None:
    await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    out = pb.CompleteRunRequest(lease=r.lease)
    out.output.update({"answer": 42, "notes": ["a", "b"]})
    resp = await s.stub.CompleteRun(out, metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_COMPLETED
    row = await run_row(s.db, r.run.run_id)
    assert row["status"] == "COMPLETED" and json.loads(row["output"]) == {"answer": 42, "notes": ["a", "b"]}
    assert row["lease_until"] is None and row["worker_id"] is None
    assert await audit_actions(s.db, r.run.run_id) == ["CLAIMED", "COMPLETED"]


async def test_retryable_failure_requeues_after_a_backoff_then_wakes_a_waiting_claim(s: Sched) -> None:
    await wait_listening(s)
    await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    resp = await s.stub.FailRun(
        pb.FailRunRequest(
            lease=r.lease, reason="tool timed out", error_code="E-TOOL-TIMEOUT", retryable=True, retry_after=dur(1.0)
        ),
        metadata=s.worker,
    )
    assert resp.run.status == common_pb2.RUN_STATUS_PENDING and not resp.compensation_requested
    row = await run_row(s.db, r.run.run_id)
    assert row["not_before"] is not None and row["lease_until"] is None and row["worker_id"] is None
    assert row["error_code"] == "E-TOOL-TIMEOUT" and row["failure_reason"] == "tool timed out"
    # not claimable during the backoff ...
    assert await s.claim() == []
    # ... and a waiting claim gets it when the backoff ends (it times its re-check to not_before)
    runs = await asyncio.wait_for(s.claim(wait=dur(30)), 20)
    assert [x.run.run_id for x in runs] == [r.run.run_id]
    assert runs[0].lease.attempt == 2 and runs[0].resumed
    assert await audit_actions(s.db, r.run.run_id) == ["CLAIMED", "RETRY_SCHEDULED", "CLAIMED"]


async def test_terminal_failure_fails_and_requests_compensation_when_steps_can_be_undone(s: Sched) -> None:
    a, b = await insert_runs(s.db, "p", 2)
    ra, rb = await s.claim(max_runs=2)
    await add_compensatable_step(s.db, a, "p")
    resp = await s.stub.FailRun(
        pb.FailRunRequest(lease=ra.lease, reason="boom", error_code="E-BOOM", retryable=False), metadata=s.worker
    )
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and resp.compensation_requested
    req = await comp_request(s.db, a)
    assert req is not None and req["trigger"] == "step_failed" and req["project_id"] == "p"
    assert await audit_actions(s.db, a) == ["CLAIMED", "FAILED", "COMPENSATION_REQUESTED"]
    # nothing to undo: no request
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=rb.lease, reason="boom"), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and not resp.compensation_requested
    assert await comp_request(s.db, b) is None


async def test_retryable_failure_with_attempts_used_up_fails(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=2)
    await add_compensatable_step(s.db, run_id, "p")
    r = await s.claim_one()
    resp = await s.stub.FailRun(
        pb.FailRunRequest(lease=r.lease, reason="flaky", retryable=True, retry_after=dur(0.001)), metadata=s.worker
    )
    assert resp.run.status == common_pb2.RUN_STATUS_PENDING and not resp.compensation_requested
    await eventually(lambda: _not_before_passed(s, run_id), what="the backoff to end")
    r = await s.claim_one()
    assert r.lease.attempt == 2
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=r.lease, reason="flaky", retryable=True), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and resp.compensation_requested
    assert await s.claim() == []


async def _not_before_passed(s: Sched, run_id: str) -> bool:
    sql = "SELECT not_before <= now() FROM awooop_run_state WHERE run_id = $1"
    return bool(await s.db.fetchval(sql, uuid.UUID(run_id)))


async def test_release_hands_the_run_back_without_spending_an_attempt(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=1)
    r = await s.claim_one()
    resp = await s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=r.lease, reason="draining"), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_PENDING
    r2 = await s.claim_one("w2")
    assert r2.lease.attempt == 2 and r2.resumed  # a new fencing token, although max_attempts is 1
    # the released attempt did not count: this failure is the run's only real attempt
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=r2.lease, reason="x", retryable=True), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED
    assert await audit_actions(s.db, run_id) == ["CLAIMED", "RELEASED", "CLAIMED", "FAILED"]


# --- waiting on a tool --------------------------------------------------------------------------------


async def test_wait_tool_keeps_the_lease_is_renewed_and_reaped_like_running(s: Sched) -> None:
    await insert_runs(s.db, "p", 2)
    ra, rb = await s.claim(max_runs=2)
    resp = await s.stub.WaitTool(pb.WaitToolRequest(lease=ra.lease, tool_id="k8s_exec_pod"), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_WAITING_TOOL and resp.run.worker_id == "w1"
    (o,) = await s.heartbeat("w1", ra.lease)
    assert o.outcome == pb.LEASE_OUTCOME_RENEWED
    resp = await s.stub.ResumeTool(pb.ResumeToolRequest(lease=ra.lease), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_RUNNING
    # a WAITING_TOOL run whose lease expired is reaped
    await s.stub.WaitTool(pb.WaitToolRequest(lease=rb.lease, tool_id="slow"), metadata=s.worker)
    await expire_lease(s.db, rb.run.run_id)
    assert (await s.reap()).requeued == 1
    row = await run_row(s.db, rb.run.run_id)
    assert row["status"] == "PENDING" and row["reaped_at"] is not None and row["worker_id"] is None
    assert await audit_actions(s.db, ra.run.run_id) == ["CLAIMED", "WAITING_TOOL", "TOOL_RETURNED"]


# --- fencing: a reaped worker changes nothing ---------------------------------------------------------


async def _every_worker_write_is_lease_lost(s: Sched, token: common_pb2.LeaseToken) -> None:
    w = s.worker
    calls = [
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=token), metadata=w),
        s.stub.FailRun(pb.FailRunRequest(lease=token, reason="late", retryable=True), metadata=w),
        s.stub.FailRun(pb.FailRunRequest(lease=token, reason="late"), metadata=w),
        s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=token), metadata=w),
        s.stub.WaitTool(pb.WaitToolRequest(lease=token, tool_id="t"), metadata=w),
        s.stub.ResumeTool(pb.ResumeToolRequest(lease=token), metadata=w),
        s.stub.RequestApproval(pb.RequestApprovalRequest(lease=token, summary="late"), metadata=w),
        s.stub.AcknowledgeCancel(pb.AcknowledgeCancelRequest(lease=token), metadata=w),
    ]
    for call in calls:
        err = await expect_error(call, FP, errors.LEASE_LOST)
        info = errors.error_info(err)
        assert info is not None and info.metadata["run_id"] == token.run_id


async def test_a_reaped_workers_late_writes_are_lease_lost_and_change_nothing(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    first = await s.claim_one("w1")
    await expire_lease(s.db, run_id)
    assert (await s.reap()).requeued == 1
    before = await snapshot(s, run_id)
    assert before[0]["status"] == "PENDING"
    (o,) = await s.heartbeat("w1", first.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST and not o.HasField("lease_until")
    await _every_worker_write_is_lease_lost(s, first.lease)
    assert await snapshot(s, run_id) == before
    # a successor claims with a new fencing token; the old token still changes nothing
    second = await s.claim_one("w2")
    assert second.lease.attempt == 2 and second.resumed
    before = await snapshot(s, run_id)
    (o,) = await s.heartbeat("w1", first.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST
    await _every_worker_write_is_lease_lost(s, first.lease)
    assert await snapshot(s, run_id) == before
    # the successor's lease is intact
    (o,) = await s.heartbeat("w2", second.lease)
    assert o.outcome == pb.LEASE_OUTCOME_RENEWED
    done = await s.stub.CompleteRun(pb.CompleteRunRequest(lease=second.lease), metadata=s.worker)
    assert done.run.status == common_pb2.RUN_STATUS_COMPLETED and done.run.attempt_count == 2


async def test_writes_after_the_reaper_failed_the_run_are_lease_lost(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=1)
    r = await s.claim_one()
    await expire_lease(s.db, run_id)
    assert (await s.reap()).failed == 1
    before = await snapshot(s, run_id)
    await _every_worker_write_is_lease_lost(s, r.lease)
    assert await snapshot(s, run_id) == before


# --- illegal transitions ----------------------------------------------------------------------------


async def test_every_illegal_transition_is_refused_and_changes_nothing(s: Sched) -> None:
    w, run_ids = s.worker, await insert_runs(s.db, "p", 4)
    running, waiting_tool, approval, done = await s.claim(max_runs=4)
    await s.stub.WaitTool(pb.WaitToolRequest(lease=waiting_tool.lease, tool_id="t"), metadata=w)
    await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=approval.lease, summary="ok?"), metadata=w)
    await s.stub.CompleteRun(pb.CompleteRunRequest(lease=done.lease), metadata=w)
    rl, tl, al, dl = running.lease, waiting_tool.lease, approval.lease, done.lease
    refused = [
        # worker writes that hold the lease (or held it last) but are not allowed from the status
        ("RUNNING", s.stub.ResumeTool(pb.ResumeToolRequest(lease=rl), metadata=w)),
        ("RUNNING", s.stub.AcknowledgeCancel(pb.AcknowledgeCancelRequest(lease=rl), metadata=w)),
        ("WAITING_TOOL", s.stub.CompleteRun(pb.CompleteRunRequest(lease=tl), metadata=w)),
        ("WAITING_TOOL", s.stub.RequestApproval(pb.RequestApprovalRequest(lease=tl), metadata=w)),
        ("WAITING_APPROVAL", s.stub.CompleteRun(pb.CompleteRunRequest(lease=al), metadata=w)),
        ("WAITING_APPROVAL", s.stub.FailRun(pb.FailRunRequest(lease=al), metadata=w)),
        ("WAITING_APPROVAL", s.stub.WaitTool(pb.WaitToolRequest(lease=al), metadata=w)),
        ("COMPLETED", s.stub.FailRun(pb.FailRunRequest(lease=dl), metadata=w)),
        ("COMPLETED", s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=dl), metadata=w)),
        ("COMPLETED", s.stub.RequestApproval(pb.RequestApprovalRequest(lease=dl), metadata=w)),
        # decisions and cancels
        ("RUNNING", _decide(s, running.run.run_id, "x" * 20, pb.DECISION_APPROVE)),
        ("COMPLETED", _decide(s, done.run.run_id, "x" * 20, pb.DECISION_REJECT)),
        ("COMPLETED", s.stub.CancelRun(pb.CancelRunRequest(run_id=done.run.run_id), metadata=s.admin)),
    ]
    before = [await snapshot(s, r) for r in run_ids]
    # WaitTool repeated by the lease that made the run WAITING_TOOL is a retry, not a transition:
    # it answers the same success and changes nothing (docs/operations.md, store faults)
    again = await s.stub.WaitTool(pb.WaitToolRequest(lease=tl, tool_id="t"), metadata=w)
    assert again.run.status == common_pb2.RUN_STATUS_WAITING_TOOL
    for status, call in refused:
        err = await expect_error(call, FP, errors.INVALID_TRANSITION)
        info = errors.error_info(err)
        assert info is not None and info.metadata["status"] == status, (status, err.details())
    assert [await snapshot(s, r) for r in run_ids] == before
    # terminal runs stay terminal: FAILED and CANCELLED cannot be cancelled or decided either
    await s.stub.CancelRun(pb.CancelRunRequest(run_id=running.run.run_id), metadata=s.admin)
    await s.stub.AcknowledgeCancel(pb.AcknowledgeCancelRequest(lease=rl), metadata=w)
    await s.stub.FailRun(pb.FailRunRequest(lease=tl, reason="x"), metadata=w)
    await expect_error(
        s.stub.CancelRun(pb.CancelRunRequest(run_id=waiting_tool.run.run_id), metadata=s.admin),
        FP,
        errors.INVALID_TRANSITION,
    )
    # the cancel that ended the run, repeated by its caller, is a retry: the same success
    again = await s.stub.CancelRun(pb.CancelRunRequest(run_id=running.run.run_id), metadata=s.admin)
    assert again.run.status == common_pb2.RUN_STATUS_CANCELLED


def _decide(s: Sched, run_id: str, token: str, decision: int, md: Metadata | None = None) -> Any:
    return s.stub.DecideApproval(
        pb.DecideApprovalRequest(run_id=run_id, approval_token=token, decision=decision),  # type: ignore[arg-type]
        metadata=md or s.approver,
    )


# --- approvals ----------------------------------------------------------------------------------------


async def _waiting_approval(s: Sched, ttl: float = 0, steps: bool = False) -> tuple[pb.ClaimedRun, str]:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    if steps:
        await add_compensatable_step(s.db, run_id, "p")
    resp = await s.stub.RequestApproval(
        pb.RequestApprovalRequest(lease=r.lease, summary="scale api to 1?", ttl=dur(ttl)), metadata=s.worker
    )
    assert resp.run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL
    assert resp.run.approval_summary == "scale api to 1?" and resp.approval_token
    assert resp.expires_at == resp.run.approval_expires_at
    return r, resp.approval_token


async def test_request_approval_releases_the_lease_and_stores_only_the_token_hash(s: Sched) -> None:
    r, token = await _waiting_approval(s)
    row = await run_row(s.db, r.run.run_id)
    assert row["lease_until"] is None and row["worker_id"] is None
    assert bytes(row["approval_token_hash"]) == hashlib.sha256(token.encode()).digest()
    ttl = (row["approval_expires_at"] - row["updated_at"]).total_seconds()
    assert abs(ttl - 900) < 1  # 15 min by default
    # the token appears nowhere in the store
    dump = await s.db.fetchval(
        "SELECT string_agg(t::text, '') FROM (SELECT a::text AS t FROM awooop_audit_log a UNION ALL "
        "SELECT r::text FROM awooop_run_state r) x"
    )
    assert token not in dump
    # the lease holder no longer holds it: heartbeats stop
    (o,) = await s.heartbeat("w1", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST


async def test_approve_resumes_with_a_new_fencing_token_and_the_token_is_single_use(s: Sched) -> None:
    await wait_listening(s)
    r, token = await _waiting_approval(s)
    waiting = asyncio.ensure_future(s.claim("w2", wait=dur(60)))
    await eventually(lambda: claims_waiting(1), what="a claim to wait")
    resp = await _decide(s, r.run.run_id, token, pb.DECISION_APPROVE)
    assert resp.run.status == common_pb2.RUN_STATUS_RESUMED and not resp.compensation_requested
    assert resp.run.approval_decided_by == "alice"
    # the waiting claim is woken by the approval and gets the next fencing token
    (claimed,) = await asyncio.wait_for(waiting, 20)
    assert claimed.run.run_id == r.run.run_id and claimed.lease.attempt == 2 and claimed.resumed
    # the token was used: reusing it is refused and changes nothing
    before = await snapshot(s, r.run.run_id)
    await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_APPROVE), FP, errors.INVALID_TRANSITION)
    await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_REJECT), FP, errors.INVALID_TRANSITION)
    assert await snapshot(s, r.run.run_id) == before
    # the pre-approval token is stale
    (o,) = await s.heartbeat("w1", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST
    assert await audit_actions(s.db, r.run.run_id) == ["CLAIMED", "APPROVAL_REQUESTED", "APPROVED", "CLAIMED"]


async def test_validate_only_checks_a_token_as_a_decision_would_and_decides_nothing(s: Sched) -> None:
    """DecideApproval with validate_only (the console's approval link asks before it shows the
    form): the right token answers the run unchanged, a made-up one APPROVAL_INVALID, a caller
    without the approver role FORBIDDEN whatever the token; nothing is written; the token still works."""
    r, token = await _waiting_approval(s)
    run_id = r.run.run_id

    def check(tok: str, md: Metadata | None = None) -> Any:
        return s.stub.DecideApproval(
            pb.DecideApprovalRequest(run_id=run_id, approval_token=tok, validate_only=True), metadata=md or s.approver
        )

    before = await snapshot(s, run_id)
    resp = await check(token)
    assert resp.run.run_id == run_id and resp.run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL
    await expect_error(check("x" * 43), FP, errors.APPROVAL_INVALID)
    await expect_error(check(token, s.worker), grpc.StatusCode.PERMISSION_DENIED, errors.FORBIDDEN)
    await expect_error(check("x" * 43, s.worker), grpc.StatusCode.PERMISSION_DENIED, errors.FORBIDDEN)
    await expect_error(check(token, s.outsider), grpc.StatusCode.NOT_FOUND, errors.NOT_FOUND)
    assert await snapshot(s, run_id) == before
    await s.db.execute(
        "UPDATE awooop_run_state SET approval_expires_at = now() - interval '1 second' WHERE run_id = $1", run_id
    )
    await expect_error(check(token), FP, errors.APPROVAL_EXPIRED)
    await s.db.execute(
        "UPDATE awooop_run_state SET approval_expires_at = now() + interval '1 minute' WHERE run_id = $1", run_id
    )
    assert (await _decide(s, run_id, token, pb.DECISION_APPROVE)).run.status == common_pb2.RUN_STATUS_RESUMED
    await expect_error(check(token), FP, errors.INVALID_TRANSITION)


async def test_waiting_for_approval_does_not_spend_an_attempt(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=1)
    r = await s.claim_one()
    resp = await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=r.lease), metadata=s.worker)
    await _decide(s, run_id, resp.approval_token, pb.DECISION_APPROVE)
    resumed = await s.claim_one()  # max_attempts=1, yet the approved run is claimable again
    assert resumed.lease.attempt == 2 and resumed.resumed
    done = await s.stub.CompleteRun(pb.CompleteRunRequest(lease=resumed.lease), metadata=s.worker)
    assert done.run.status == common_pb2.RUN_STATUS_COMPLETED


async def test_a_wrong_token_is_refused_and_a_second_approval_round_issues_a_new_token(s: Sched) -> None:
    r, token = await _waiting_approval(s)
    before = await snapshot(s, r.run.run_id)
    for wrong in ("not-the-token", token[:-1], token + "x"):
        await expect_error(_decide(s, r.run.run_id, wrong, pb.DECISION_APPROVE), FP, errors.APPROVAL_INVALID)
    assert await snapshot(s, r.run.run_id) == before
    await _decide(s, r.run.run_id, token, pb.DECISION_APPROVE)
    again = await s.claim_one()
    resp = await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=again.lease), metadata=s.worker)
    # the first token does not decide the second approval
    await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_APPROVE), FP, errors.APPROVAL_INVALID)
    ok = await _decide(s, r.run.run_id, resp.approval_token, pb.DECISION_APPROVE)
    assert ok.run.status == common_pb2.RUN_STATUS_RESUMED


async def test_ten_concurrent_decisions_with_one_token_only_one_wins(s: Sched) -> None:
    r, token = await _waiting_approval(s)
    decisions = [pb.DECISION_APPROVE if i % 2 else pb.DECISION_REJECT for i in range(10)]
    results = await asyncio.gather(*(_decide(s, r.run.run_id, token, d) for d in decisions), return_exceptions=True)
    decided = [a for a in await audit_actions(s.db, r.run.run_id) if a in ("APPROVED", "APPROVAL_REJECTED")]
    assert len(decided) == 1  # one decision
    won = pb.DECISION_APPROVE if decided == ["APPROVED"] else pb.DECISION_REJECT
    for d, x in zip(decisions, results, strict=True):
        if d == won:  # the winner, and the same approver's repeats of it, answered as replays
            assert not isinstance(x, BaseException), x
        else:
            assert isinstance(x, grpc.aio.AioRpcError), x
            assert x.code() == FP and errors.error_info(x).reason == errors.INVALID_TRANSITION  # type: ignore[union-attr]


async def test_reject_fails_the_run_and_requests_compensation(s: Sched) -> None:
    r, token = await _waiting_approval(s, steps=True)
    resp = await s.stub.DecideApproval(
        pb.DecideApprovalRequest(
            run_id=r.run.run_id, approval_token=token, decision=pb.DECISION_REJECT, reason="too risky"
        ),
        metadata=s.approver,
    )
    assert resp.run.status == common_pb2.RUN_STATUS_FAILED and resp.compensation_requested
    assert resp.run.error_code == "E-APPROVAL-REJECTED" and resp.run.failure_reason == "too risky"
    req = await comp_request(s.db, r.run.run_id)
    assert req is not None and req["trigger"] == "approval_rejected"
    assert (await audit_actions(s.db, r.run.run_id))[-2:] == ["APPROVAL_REJECTED", "COMPENSATION_REQUESTED"]


async def test_expired_approval_is_failed_by_the_sweep_with_e_approval_002(s: Sched) -> None:
    r, token = await _waiting_approval(s, ttl=0.2, steps=True)
    (fresh, _) = await _waiting_approval(s)  # 15 min: untouched
    await eventually(lambda: approval_expired(s, r.run.run_id), what="the approval to expire")
    assert await s.expire_approvals() == 1
    row = await run_row(s.db, r.run.run_id)
    assert row["status"] == "FAILED" and row["error_code"] == "E-APPROVAL-002"
    assert row["approval_token_hash"] is None
    req = await comp_request(s.db, r.run.run_id)
    assert req is not None and req["trigger"] == "approval_expired"
    assert (await run_row(s.db, fresh.run.run_id))["status"] == "WAITING_APPROVAL"
    # deciding now: APPROVAL_EXPIRED with the seed's code, and nothing changes
    before = await snapshot(s, r.run.run_id)
    err = await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_APPROVE), FP, errors.APPROVAL_EXPIRED)
    assert errors.error_info(err).metadata["code"] == "E-APPROVAL-002"  # type: ignore[union-attr]
    assert await snapshot(s, r.run.run_id) == before
    assert await s.expire_approvals() == 0  # idempotent


async def test_deciding_an_expired_approval_before_the_sweep_fails_the_run(s: Sched) -> None:
    r, token = await _waiting_approval(s, ttl=0.2)
    await eventually(lambda: approval_expired(s, r.run.run_id), what="the approval to expire")
    await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_APPROVE), FP, errors.APPROVAL_EXPIRED)
    row = await run_row(s.db, r.run.run_id)
    assert row["status"] == "FAILED" and row["error_code"] == "E-APPROVAL-002"
    assert await s.expire_approvals() == 0
    assert (await audit_actions(s.db, r.run.run_id)).count("APPROVAL_EXPIRED") == 1


async def test_the_approval_sweep_loop_runs_by_itself(start_services, channels, db, make_key) -> None:
    s = await make_sched(start_services, channels, db, make_key, approval_sweep_interval=0.2)
    r, _ = await _waiting_approval(s, ttl=0.3)

    async def failed() -> bool:
        return (await run_row(db, r.run.run_id))["error_code"] == "E-APPROVAL-002"

    await eventually(failed, what="the sweep to fail the expired approval")
    assert "APPROVAL_EXPIRED" in await audit_actions(db, r.run.run_id)


async def test_deciding_needs_the_approver_role_in_the_runs_project(s: Sched) -> None:
    r, token = await _waiting_approval(s)
    # a member without the approver role: PERMISSION_DENIED
    await expect_error(
        _decide(s, r.run.run_id, token, pb.DECISION_APPROVE, s.worker),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    # an approver of another project does not learn the run exists
    await expect_error(
        _decide(s, r.run.run_id, token, pb.DECISION_APPROVE, s.outsider), grpc.StatusCode.NOT_FOUND, errors.NOT_FOUND
    )
    assert (await run_row(s.db, r.run.run_id))["status"] == "WAITING_APPROVAL"
    ok = await _decide(s, r.run.run_id, token, pb.DECISION_APPROVE, s.admin)  # admin implies approver
    assert ok.run.status == common_pb2.RUN_STATUS_RESUMED


# --- cancel -------------------------------------------------------------------------------------------


async def test_cancel_ends_queued_and_waiting_runs_at_once(s: Sched) -> None:
    r, token = await _waiting_approval(s, steps=True)
    (pending,) = await insert_runs(s.db, "p", 1)
    resp = await s.stub.CancelRun(pb.CancelRunRequest(run_id=pending, reason="not needed"), metadata=s.approver)
    assert resp.run.status == common_pb2.RUN_STATUS_CANCELLED and not resp.compensation_requested
    assert resp.run.failure_reason == "not needed"
    resp = await s.stub.CancelRun(pb.CancelRunRequest(run_id=r.run.run_id), metadata=s.admin)
    assert resp.run.status == common_pb2.RUN_STATUS_CANCELLED and resp.compensation_requested
    assert (await comp_request(s.db, r.run.run_id))["trigger"] == "cancelled"  # type: ignore[index]
    # the approval token died with the run
    await expect_error(_decide(s, r.run.run_id, token, pb.DECISION_APPROVE), FP, errors.INVALID_TRANSITION)
    assert (await run_row(s.db, r.run.run_id))["approval_token_hash"] is None
    # a cancelled run is never claimed
    claimed = await s.claim(max_runs=10)
    assert pending not in {c.run.run_id for c in claimed}


async def test_cancel_of_a_running_run_is_delivered_in_the_heartbeat_and_acknowledged(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    await add_compensatable_step(s.db, run_id, "p")
    resp = await s.stub.CancelRun(pb.CancelRunRequest(run_id=run_id, reason="user said stop"), metadata=s.approver)
    assert resp.run.status == common_pb2.RUN_STATUS_RUNNING and resp.run.cancel_requested
    assert not resp.compensation_requested
    (o,) = await s.heartbeat("w1", r.lease)
    assert o.outcome == pb.LEASE_OUTCOME_RENEWED and o.cancel_requested
    # a run with a pending cancel cannot park itself in WAITING_APPROVAL
    await expect_error(
        s.stub.RequestApproval(pb.RequestApprovalRequest(lease=r.lease), metadata=s.worker),
        FP,
        errors.INVALID_TRANSITION,
    )
    ack = await s.stub.AcknowledgeCancel(pb.AcknowledgeCancelRequest(lease=r.lease), metadata=s.worker)
    assert ack.run.status == common_pb2.RUN_STATUS_CANCELLED and ack.compensation_requested
    assert ack.run.failure_reason == "user said stop"
    assert (await comp_request(s.db, run_id))["trigger"] == "cancelled"  # type: ignore[index]
    assert await audit_actions(s.db, run_id) == ["CLAIMED", "CANCEL_REQUESTED", "CANCELLED", "COMPENSATION_REQUESTED"]


async def test_a_cancel_requested_run_whose_lease_expires_is_cancelled_not_requeued(s: Sched) -> None:
    a, b = await insert_runs(s.db, "p", 2)
    _, rb = await s.claim(max_runs=2)
    for rid in (a, b):
        await s.stub.CancelRun(pb.CancelRunRequest(run_id=rid), metadata=s.admin)
    await expire_lease(s.db, a)
    assert (await s.reap()).cancelled == 1
    assert (await run_row(s.db, a))["status"] == "CANCELLED"
    # releasing or failing retryably while a cancel is pending ends the run too
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=rb.lease, reason="x", retryable=True), metadata=s.worker)
    assert resp.run.status == common_pb2.RUN_STATUS_CANCELLED
    assert (await audit_actions(s.db, a))[-1] == "REAPED_CANCELLED"


async def test_cancel_roles_and_tenant_isolation(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    await expect_error(
        s.stub.CancelRun(pb.CancelRunRequest(run_id=run_id), metadata=s.worker),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    await expect_error(
        s.stub.CancelRun(pb.CancelRunRequest(run_id=run_id), metadata=s.outsider),
        grpc.StatusCode.NOT_FOUND,
        errors.NOT_FOUND,
    )
    await expect_error(
        s.stub.CancelRun(pb.CancelRunRequest(run_id=str(uuid.uuid4())), metadata=s.admin),
        grpc.StatusCode.NOT_FOUND,
        errors.NOT_FOUND,
    )
    assert (await run_row(s.db, run_id))["status"] == "PENDING"


# --- tenant isolation of worker writes ------------------------------------------------------------------


async def test_worker_writes_of_another_tenant_are_not_found(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    before = await snapshot(s, run_id)
    for call in (
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=r.lease), metadata=s.outsider),
        s.stub.FailRun(pb.FailRunRequest(lease=r.lease), metadata=s.outsider),
        s.stub.RequestApproval(pb.RequestApprovalRequest(lease=r.lease), metadata=s.outsider),
        s.stub.GetRun(pb.GetRunRequest(run_id=run_id), metadata=s.outsider),
        s.stub.GetRunHistory(pb.GetRunHistoryRequest(run_id=run_id), metadata=s.outsider),
    ):
        await expect_error(call, grpc.StatusCode.NOT_FOUND, errors.NOT_FOUND)
    # a member without the worker role
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=r.lease), metadata=s.approver),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    assert await snapshot(s, run_id) == before
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=lease(uuid.uuid4(), 1)), metadata=s.worker),
        grpc.StatusCode.NOT_FOUND,
        errors.NOT_FOUND,
    )


# --- reads --------------------------------------------------------------------------------------------


async def test_get_run_and_history(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    await s.stub.CompleteRun(pb.CompleteRunRequest(lease=r.lease), metadata=s.worker)
    for md in (s.worker, s.approver, s.admin):
        got = await s.stub.GetRun(pb.GetRunRequest(run_id=run_id), metadata=md)
        assert got.run.run_id == run_id and got.run.status == common_pb2.RUN_STATUS_COMPLETED
        assert got.run.input["n"] == 1 and got.run.channel_type == common_pb2.CHANNEL_TYPE_API
    hist = await s.stub.GetRunHistory(pb.GetRunHistoryRequest(run_id=run_id), metadata=s.approver)
    assert [(e.action, e.from_status, e.to_status) for e in hist.events] == [
        ("CLAIMED", common_pb2.RUN_STATUS_PENDING, common_pb2.RUN_STATUS_RUNNING),
        ("COMPLETED", common_pb2.RUN_STATUS_RUNNING, common_pb2.RUN_STATUS_COMPLETED),
    ]
    assert hist.events[0].details["attempt"] == 1 and hist.events[0].details["worker_id"] == "w1"
    assert hist.events[0].actor == "service:worker-1"
    assert hist.events[0].at.ToDatetime() <= hist.events[1].at.ToDatetime()


async def test_list_runs_filters_by_status_and_pages_newest_first(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 23)
    await insert_runs(s.db, "q", 2)
    claimed = await s.claim(max_runs=5)
    seen: list[str] = []
    token = ""
    while True:
        resp = await s.stub.ListRuns(
            pb.ListRunsRequest(project_id="p", page_size=10, page_token=token), metadata=s.approver
        )
        seen += [r.run_id for r in resp.runs]
        assert all(r.project_id == "p" for r in resp.runs)
        token = resp.next_page_token
        if not token:
            break
    assert seen == list(reversed(ids))
    resp = await s.stub.ListRuns(
        pb.ListRunsRequest(project_id="p", statuses=[common_pb2.RUN_STATUS_RUNNING]), metadata=s.approver
    )
    assert {r.run_id for r in resp.runs} == {c.run.run_id for c in claimed} and not resp.next_page_token
    await expect_error(
        s.stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=s.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    for bad in ("garbage!", "eyJjIjoxfQ", "e30"):
        err = await expect_error(
            s.stub.ListRuns(pb.ListRunsRequest(project_id="p", page_token=bad), metadata=s.approver),
            grpc.StatusCode.INVALID_ARGUMENT,
            errors.FIELD_INVALID,
        )
        assert errors.bad_request(err).field_violations[0].field == "page_token"  # type: ignore[union-attr]


# --- bad input ----------------------------------------------------------------------------------------


async def test_bad_input_is_invalid_argument_with_field_violations(s: Sched) -> None:
    w = s.worker
    good = lease(uuid.uuid4(), 1)
    cases: list[tuple[Any, set[str]]] = [
        (s.stub.ClaimRuns(pb.ClaimRunsRequest(), metadata=w), {"worker_id", "project_ids"}),
        (
            s.stub.ClaimRuns(
                pb.ClaimRunsRequest(
                    worker_id="has space", project_ids=["ok", "bad/project"], max_runs=101, lease_ttl=dur(7200)
                ),
                metadata=w,
            ),
            {"worker_id", "project_ids[1]", "max_runs", "lease_ttl"},
        ),
        (s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["p"], wait=dur(-1)), metadata=w), {"wait"}),
        (s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w" * 129, project_ids=["p"]), metadata=w), {"worker_id"}),
        (s.stub.Heartbeat(pb.HeartbeatRequest(worker_id="w"), metadata=w), {"leases"}),
        (
            s.stub.Heartbeat(
                pb.HeartbeatRequest(worker_id="w", leases=[common_pb2.LeaseToken(run_id="nope", attempt=0)]), metadata=w
            ),
            {"leases[0].run_id", "leases[0].attempt"},
        ),
        (s.stub.Heartbeat(pb.HeartbeatRequest(worker_id="w", leases=[good] * 1001), metadata=w), {"leases"}),
        (s.stub.CompleteRun(pb.CompleteRunRequest(), metadata=w), {"lease.run_id", "lease.attempt"}),
        (
            s.stub.FailRun(pb.FailRunRequest(lease=good, reason="r" * 4097, error_code="E" * 65), metadata=w),
            {"reason", "error_code"},
        ),
        (s.stub.FailRun(pb.FailRunRequest(lease=good, retry_after=dur(-5)), metadata=w), {"retry_after"}),
        (s.stub.WaitTool(pb.WaitToolRequest(lease=good, tool_id="t\x00"), metadata=w), {"tool_id"}),
        (s.stub.RequestApproval(pb.RequestApprovalRequest(lease=good, summary="\x00"), metadata=w), {"summary"}),
        (s.stub.RequestApproval(pb.RequestApprovalRequest(lease=good, ttl=dur(8 * 86400)), metadata=w), {"ttl"}),
        (
            s.stub.DecideApproval(pb.DecideApprovalRequest(run_id="x"), metadata=s.approver),
            {"run_id", "approval_token", "decision"},
        ),
        (
            s.stub.DecideApproval(
                pb.DecideApprovalRequest(run_id=good.run_id, approval_token="t", decision=7),  # type: ignore[arg-type]
                metadata=s.approver,
            ),
            {"decision"},
        ),
        (s.stub.CancelRun(pb.CancelRunRequest(run_id=""), metadata=s.admin), {"run_id"}),
        (s.stub.GetRun(pb.GetRunRequest(run_id="123"), metadata=w), {"run_id"}),
        (s.stub.GetRunHistory(pb.GetRunHistoryRequest(run_id="123"), metadata=w), {"run_id"}),
        (
            s.stub.ListRuns(
                pb.ListRunsRequest(project_id="", statuses=[0, 42], page_size=501),
                metadata=w,  # type: ignore[list-item]
            ),
            {"project_id", "statuses[0]", "statuses[1]", "page_size"},
        ),
    ]
    for call, fields in cases:
        err = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, errors.FIELD_INVALID)
        br = errors.bad_request(err)
        assert br is not None and {v.field for v in br.field_violations} == fields, err.details()
    assert await s.db.fetchval("SELECT count(*) FROM awooop_audit_log") == 0


# --- grpcurl (the README's examples, run as written) --------------------------------------------------


async def _grpcurl(*args: str) -> tuple[int, str]:
    import shutil
    import sys
    from pathlib import Path

    exe = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert exe, "grpcurl not installed (part of the [dev] extra)"
    proc = await asyncio.create_subprocess_exec(
        exe, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


async def test_grpcurl_claim_heartbeat_complete_and_read(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    addr = f"127.0.0.1:{s.rt.ports['scheduler']}"
    auth = ["-H", f"authorization: {s.worker[0][1]}"]
    svc = "awooop.scheduler.v1.SchedulerService"
    code, out = await _grpcurl(
        "-plaintext", *auth, "-d", '{"worker_id":"w1","project_ids":["p"],"max_runs":1,"wait":"2s"}',
        addr, f"{svc}/ClaimRuns",
    )  # fmt: skip
    assert code == 0, out
    claimed = json.loads(out)["runs"][0]
    assert claimed["lease"] == {"run_id": run_id, "attempt": 1} and claimed["run"]["status"] == "RUN_STATUS_RUNNING"
    lease_json = json.dumps(claimed["lease"])
    code, out = await _grpcurl(
        "-plaintext", *auth, "-d", f'{{"worker_id":"w1","leases":[{lease_json}]}}', addr, f"{svc}/Heartbeat"
    )
    assert code == 0 and json.loads(out)["renewals"][0]["outcome"] == "LEASE_OUTCOME_RENEWED", out
    code, out = await _grpcurl(
        "-plaintext", *auth, "-d", f'{{"lease":{lease_json},"output":{{"ok":true}}}}', addr, f"{svc}/CompleteRun"
    )
    assert code == 0 and json.loads(out)["run"]["status"] == "RUN_STATUS_COMPLETED", out
    # a second completion with the same token (its answer was lost): the same success
    code, out = await _grpcurl("-plaintext", *auth, "-d", f'{{"lease":{lease_json}}}', addr, f"{svc}/CompleteRun")
    assert code == 0 and json.loads(out)["run"]["output"] == {"ok": True}, out
    # FailRun of the completed run: the rich error, as grpcurl prints it
    code, out = await _grpcurl(
        "-plaintext", "-format-error", *auth, "-d", f'{{"lease":{lease_json}}}', addr, f"{svc}/FailRun"
    )
    err = json.loads(out)
    assert code != 0 and err["code"] == FP.value[0] and err["details"][0]["reason"] == "INVALID_TRANSITION", out
    code, out = await _grpcurl("-plaintext", *auth, "-d", f'{{"run_id":"{run_id}"}}', addr, f"{svc}/GetRunHistory")
    assert code == 0 and [e["action"] for e in json.loads(out)["events"]] == ["CLAIMED", "COMPLETED"], out
    code, out = await _grpcurl(
        "-plaintext", *auth, "-d", '{"project_id":"p","statuses":["RUN_STATUS_COMPLETED"]}', addr, f"{svc}/ListRuns"
    )
    assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == [run_id], out


# --- the Run builder (on every claim) against protobuf's own conversions ---------------------------------------


def _reference_run(row: dict[str, Any]) -> common_pb2.Run:
    """The Run's enums and timestamps as protobuf's own helpers make them (enum Value(),
    Timestamp.FromDatetime), the rest as run_to_pb makes it."""
    from services.common.runs import _RUN_TIMES, run_to_pb

    saga = row["saga_status"]
    run = run_to_pb({**row, "status": "PENDING"})
    run.status = common_pb2.RunStatus.Value(f"RUN_STATUS_{row['status']}")
    run.channel_type = common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{row['channel_type'].upper()}")
    run.saga_status = common_pb2.SagaStatus.Value(f"SAGA_STATUS_{saga.upper()}") if saga else 0
    for name in _RUN_TIMES:
        run.ClearField(name)
        if row[name] is not None:
            getattr(run, name).FromDatetime(row[name])
    return run


async def test_the_run_builder_builds_what_protobufs_own_conversions_build(s: Sched) -> None:
    """run_to_pb (enums from dicts, timestamps by arithmetic) against protobuf's helpers: rows as
    the statements return them in several states, every timestamp set, times before 1970, naive
    times, unknown values."""
    import datetime as dt

    from services.common.runs import run_to_pb

    *_, c = await insert_runs(s.db, "p", 3)
    claimed = await s.claim(max_runs=2)
    done = pb.CompleteRunRequest(lease=claimed[0].lease, output=to_struct({"x": [1, "y"]}))
    await s.stub.CompleteRun(done, metadata=s.worker)
    await s.db.execute(
        """UPDATE awooop_run_state SET status = 'WAITING_APPROVAL', approval_expires_at = now() + interval '1 day',
                  approval_summary = 's', approval_decided_by = 'd', failure_reason = 'f', error_code = 'E',
                  reaped_at = '1969-12-31 23:59:58.5+00', compensation_started_at = now(),
                  compensation_completed_at = now(), not_before = now(), saga_status = 'compensating',
                  cancel_requested = true
            WHERE run_id = $1""",
        c,
    )
    rows = [dict(r) for r in await s.db.fetch("SELECT * FROM awooop_run_state")]  # as r.* returns them
    assert len(rows) == 3
    naive = {**rows[0], "created_at": dt.datetime(2026, 1, 2, 3, 4, 5, 678901)}
    odd = {**rows[1], "status": "SOMETHING_NEW"}
    for row in [*rows, naive]:
        assert run_to_pb(row) == _reference_run(row), row
    for build in (run_to_pb, _reference_run):  # a status no enum value names: both refuse it alike
        with pytest.raises(ValueError):
            build(odd)
    full = run_to_pb(next(r for r in rows if str(r["run_id"]) == c))
    assert full.HasField("reaped_at") and full.reaped_at.seconds == -2 and full.reaped_at.nanos == 500_000_000


def test_approval_tokens_never_look_like_an_option() -> None:
    # pasted after `--token` (the worker example prints `awooop runs approve RUN --token T`): a
    # token starting with '-' is taken for an option; without the rule 1 in 64 tokens did, so
    # 2,000 tokens without one fail the test with probability 1 - (63/64)**2000, about 1 - 2e-14
    from services.scheduler import approvals

    tokens = [approvals.new_token()[0] for _ in range(2000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens)
