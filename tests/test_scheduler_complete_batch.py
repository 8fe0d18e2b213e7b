"""CompleteRuns: many completions in one call and one statement, each item fenced on its own,
against real Postgres, a real in-process scheduler and real channels."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from typing import Any

import grpc
import pytest_asyncio
from google.protobuf import duration_pb2, struct_pb2

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.worker import AwooopError, Client, LeaseLost, RunContext, Worker
from awooop.worker.completions import CompletionBatcher
from services.common import errors
from tests.harness.helpers import eventually, expect_error
from tests.harness.scheduler import Sched, audit_actions, insert_runs, lease, make_sched, run_row, snapshot


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services, channels, db, make_key) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


def item(token: common_pb2.LeaseToken, **output: object) -> pb.CompleteRunRequest:
    out = struct_pb2.Struct()
    out.update(output)
    return pb.CompleteRunRequest(lease=token, output=out)


async def complete_actions(s: Sched, run_id: str) -> int:
    return sum(1 for a in await audit_actions(s.db, run_id) if a == "COMPLETED")


async def test_a_mixed_batch_answers_each_item_in_order_and_changes_only_the_valid_ones(s: Sched) -> None:
    a, b, c, d = await insert_runs(s.db, "p", 4)
    claimed = {r.run.run_id: r for r in await s.claim(max_runs=4)}
    assert set(claimed) == {a, b, c, d}
    # c: the lease is live but the run waits for a tool -> INVALID_TRANSITION
    await s.stub.WaitTool(pb.WaitToolRequest(lease=claimed[c].lease, tool_id="t"), metadata=s.worker)
    # d: handed back and claimed again -> the first token is stale (LEASE_LOST)
    await s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=claimed[d].lease), metadata=s.worker)
    d2 = await s.claim_one()
    assert d2.run.run_id == d and d2.lease.attempt == 2
    # a run of project q, leased by its own worker: the p worker has no role there -> NOT_FOUND
    (q_run,) = await insert_runs(s.db, "q", 1)
    q = await s.claim_one(worker_id="wq", project_ids=["q"], md=s.outsider)
    assert q.run.run_id == q_run
    unchanged = {rid: await snapshot(s, rid) for rid in (c, d, q_run)}

    batch = [
        item(claimed[a].lease, n=1),
        item(claimed[c].lease),
        item(lease(uuid.uuid4(), 1)),
        item(claimed[d].lease),
        item(q.lease),
        item(claimed[b].lease, n=2),
        item(claimed[a].lease, n=3),  # a again: completed by the first item, the same success (the first output)
    ]
    resp = await s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=batch), metadata=s.worker)
    got = [(r.run.run_id if r.HasField("run") else "", r.error_reason) for r in resp.results]
    assert got == [
        (a, ""),
        ("", errors.INVALID_TRANSITION),
        ("", errors.NOT_FOUND),
        ("", errors.LEASE_LOST),
        ("", errors.NOT_FOUND),
        (b, ""),
        (a, ""),
    ]
    assert resp.results[6].run.output == resp.results[0].run.output
    assert all(r.error_message for r in resp.results if r.error_reason)
    for rid, n in ((a, 1), (b, 2)):
        result = next(r for r in resp.results if r.run.run_id == rid)
        assert result.run.status == common_pb2.RUN_STATUS_COMPLETED and not result.run.worker_id
        row = await run_row(s.db, rid)
        assert row["status"] == "COMPLETED" and json.loads(row["output"]) == {"n": n} and row["lease_until"] is None
        assert await audit_actions(s.db, rid) == ["CLAIMED", "COMPLETED"]
    audit = await s.db.fetchrow(
        "SELECT from_status, to_status, details FROM awooop_audit_log WHERE run_id = $1 AND action = 'COMPLETED'",
        uuid.UUID(a),
    )
    assert audit["from_status"] == "RUNNING" and audit["to_status"] == "COMPLETED"
    assert json.loads(audit["details"]) == {"attempt": 1, "worker_id": "w1"}
    for rid, before in unchanged.items():
        assert await snapshot(s, rid) == before
    # the same items one by one through CompleteRun give the same errors
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=claimed[d].lease), metadata=s.worker),
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.LEASE_LOST,
    )
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=q.lease), metadata=s.worker),
        grpc.StatusCode.NOT_FOUND,
        errors.NOT_FOUND,
    )


async def test_a_member_without_the_worker_role_gets_forbidden_per_item(s: Sched) -> None:
    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    before = await snapshot(s, run_id)
    resp = await s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=[item(r.lease)]), metadata=s.approver)
    assert [x.error_reason for x in resp.results] == [errors.FORBIDDEN]
    assert await snapshot(s, run_id) == before


async def test_ten_concurrent_batches_over_disjoint_and_overlapping_runs_complete_each_run_once(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 30)
    claimed = await s.claim(max_runs=30)
    assert len(claimed) == 30
    tokens = [r.lease for r in claimed]
    # call k: its own 3 runs, the first run of call k+1, and run 0 that every call names
    batches = [[tokens[i] for i in range(3 * k, 3 * k + 3)] + [tokens[(3 * k + 3) % 30], tokens[0]] for k in range(10)]
    resps = await asyncio.gather(
        *(
            s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=[item(t) for t in batch]), metadata=s.worker)
            for batch in batches
        )
    )
    wins: Counter[str] = Counter()
    for batch, resp in zip(batches, resps, strict=True):
        assert len(resp.results) == len(batch)
        for t, result in zip(batch, resp.results, strict=True):
            # every call holds the lease: the first completes the run, the others get the same success
            assert result.run.run_id == t.run_id and not result.error_reason, result
            assert result.run.status == common_pb2.RUN_STATUS_COMPLETED
            wins[t.run_id] += 1
    assert set(wins) == set(ids)
    for rid in ids:
        assert (await run_row(s.db, rid))["status"] == "COMPLETED"
        assert await complete_actions(s, rid) == 1


async def test_bad_input_is_invalid_argument_naming_each_field(s: Sched) -> None:
    err = await expect_error(
        s.stub.CompleteRuns(pb.CompleteRunsRequest(), metadata=s.worker),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    assert [f.field for f in errors.bad_request(err).field_violations] == ["runs"]

    (run_id,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    assert s.rt.ctx is not None
    big = "x" * s.rt.ctx.settings.max_payload_bytes
    batch = [
        item(r.lease),
        item(common_pb2.LeaseToken(run_id="not-a-uuid", attempt=1)),
        item(lease(uuid.uuid4(), 0)),
        item(lease(uuid.uuid4(), 1), blob=big),
    ]
    err = await expect_error(
        s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=batch), metadata=s.worker),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    fields = [f.field for f in errors.bad_request(err).field_violations]
    assert fields == ["runs[1].lease.run_id", "runs[2].lease.attempt", "runs[3].output"]
    # nothing of a rejected batch is applied, not even its valid item
    assert (await run_row(s.db, run_id))["status"] == "RUNNING"

    too_many = [item(lease(uuid.uuid4(), 1))] * 1001
    err = await expect_error(
        s.stub.CompleteRuns(pb.CompleteRunsRequest(runs=too_many), metadata=s.worker),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    assert [f.field for f in errors.bad_request(err).field_violations] == ["runs"]


# --- the worker SDK's batcher ------------------------------------------------------------------------


def _client(s: Sched, md: tuple[tuple[str, str], ...]) -> Client:
    return Client(key=md[0][1].removeprefix("Bearer "), scheduler=f"127.0.0.1:{s.rt.ports['scheduler']}")


async def test_a_worker_completes_many_runs_through_shared_complete_runs_calls(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 60)

    async def handler(ctx: RunContext) -> dict[str, Any]:
        return {"n": ctx.input["n"]}

    async with _client(s, s.worker) as client:
        worker = Worker(handler, projects=["p"], client=client, concurrency=20, claim_wait=1, worker_id="sdk")
        task = asyncio.create_task(worker.run(install_signal_handlers=False))

        async def all_completed() -> bool:
            n = await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'COMPLETED'")
            return bool(n == 60)

        await eventually(all_completed, what="60 completed runs")
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert worker.stats.completed == 60 and worker.stats.claimed == 60
    # completions ready together shared calls (CompleteRuns, or the claims of a full worker):
    # fewer calls than runs
    assert 1 <= worker.completions.calls + worker.completions.claim_calls < 60
    assert worker.completions.carried >= 1 and worker.completions.carry
    for rid in ids:
        row = await run_row(s.db, rid)
        assert row["attempt_count"] == 1 and json.loads(row["output"]) == json.loads(row["input"])
        assert await complete_actions(s, rid) == 1


async def test_the_batcher_gives_each_caller_its_own_result_or_error(s: Sched) -> None:
    a, b, c = await insert_runs(s.db, "p", 3)
    claimed = {r.run.run_id: r for r in await s.claim(max_runs=3)}
    stale = lease(a, claimed[a].lease.attempt + 1)
    assert s.rt.ctx is not None
    big = "x" * s.rt.ctx.settings.max_payload_bytes
    async with _client(s, s.worker) as client:
        batcher = CompletionBatcher(client)
        first, *rest = await asyncio.gather(
            batcher.complete(item(claimed[a].lease, k="a")),
            batcher.complete(item(stale)),  # a stale token for a: LEASE_LOST, as from CompleteRun
            batcher.complete(item(claimed[b].lease, blob=big)),  # only this item is bad input
            batcher.complete(item(claimed[c].lease, k="c")),
            return_exceptions=True,
        )
    assert isinstance(first, common_pb2.Run) and first.status == common_pb2.RUN_STATUS_COMPLETED
    lost, bad, done = rest
    assert isinstance(lost, LeaseLost) and lost.reason == errors.LEASE_LOST
    assert isinstance(bad, AwooopError) and bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(done, common_pb2.Run) and done.run_id == c
    assert [(await run_row(s.db, r))["status"] for r in (a, b, c)] == ["COMPLETED", "RUNNING", "COMPLETED"]
    # without bad input the refusals come per item from one CompleteRuns call
    async with _client(s, s.worker) as client:
        batcher = CompletionBatcher(client)
        results = await asyncio.gather(
            batcher.complete(item(claimed[b].lease)),
            batcher.complete(item(stale)),
            batcher.complete(item(claimed[c].lease)),
            return_exceptions=True,
        )
        assert batcher.calls == 1
    done, lost, again = results
    assert isinstance(done, common_pb2.Run) and done.run_id == b
    assert isinstance(lost, LeaseLost) and lost.code == grpc.StatusCode.FAILED_PRECONDITION
    # c was completed by this lease above: the retry answers the same success
    assert isinstance(again, common_pb2.Run) and again.run_id == c and again.status == common_pb2.RUN_STATUS_COMPLETED


# --- completions carried by ClaimRuns ----------------------------------------------------------------


async def test_claim_runs_completes_the_carried_runs_per_item_then_claims(s: Sched) -> None:
    a, b, c = await insert_runs(s.db, "p", 3)
    claimed = {r.run.run_id: r for r in await s.claim(max_runs=3)}
    # c: handed back and claimed again -> its first token is stale (LEASE_LOST)
    await s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=claimed[c].lease), metadata=s.worker)
    c2 = await s.claim_one()
    assert c2.run.run_id == c
    d, e = await insert_runs(s.db, "p", 2)
    batch = [
        item(claimed[a].lease, n=1),
        item(claimed[c].lease),
        item(lease(uuid.uuid4(), 1)),
        item(claimed[b].lease, n=2),
        item(claimed[a].lease, n=3),  # a again: completed by the first item, the same success
    ]
    resp = await s.stub.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], max_runs=5, complete=batch), metadata=s.worker
    )
    got = [(r.run.run_id if r.HasField("run") else "", r.error_reason) for r in resp.completed]
    assert got == [
        (a, ""),
        ("", errors.LEASE_LOST),
        ("", errors.NOT_FOUND),
        (b, ""),
        (a, ""),
    ]
    assert all(r.run.status == common_pb2.RUN_STATUS_COMPLETED for r in resp.completed if not r.error_reason)
    # then the claim: only the two pending runs, oldest first, with their leases
    assert [r.run.run_id for r in resp.runs] == [d, e]
    assert all(r.run.status == common_pb2.RUN_STATUS_RUNNING and r.lease.attempt == 1 for r in resp.runs)
    for rid, n in ((a, 1), (b, 2)):
        row = await run_row(s.db, rid)
        assert row["status"] == "COMPLETED" and json.loads(row["output"]) == {"n": n}
        assert await complete_actions(s, rid) == 1
    assert (await run_row(s.db, c))["status"] == "RUNNING"  # c2's lease is untouched
    assert [a for a in await audit_actions(s.db, d)] == ["CLAIMED"]


async def test_claim_runs_carrying_completions_does_not_wait_for_work(s: Sched) -> None:
    (a,) = await insert_runs(s.db, "p", 1)
    r = await s.claim_one()
    started = asyncio.get_running_loop().time()
    resp = await s.stub.ClaimRuns(
        pb.ClaimRunsRequest(
            worker_id="w1", project_ids=["p"], wait=duration_pb2.Duration(seconds=20), complete=[item(r.lease)]
        ),
        metadata=s.worker,
        timeout=30,
    )
    assert asyncio.get_running_loop().time() - started < 10  # answered, not held for the 20 s wait
    assert not resp.runs and [x.run.run_id for x in resp.completed] == [a]


async def test_claim_runs_with_a_bad_completion_changes_nothing(s: Sched) -> None:
    a, b = await insert_runs(s.db, "p", 2)
    r = await s.claim_one()
    bad = [item(r.lease), item(common_pb2.LeaseToken(run_id="not-a-uuid", attempt=1))]
    err = await expect_error(
        s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], complete=bad), metadata=s.worker),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    assert [f.field for f in errors.bad_request(err).field_violations] == ["complete[1].lease.run_id"]
    # neither the valid completion nor the claim happened
    assert (await run_row(s.db, r.run.run_id))["status"] == "RUNNING"
    other = b if r.run.run_id == a else a
    assert (await run_row(s.db, other))["status"] == "PENDING"


async def test_concurrent_claims_carrying_completions_complete_and_claim_each_run_once(s: Sched) -> None:
    """8 workers cycle ClaimRuns(complete = the previous batch) over 200 runs at once."""
    ids = set(await insert_runs(s.db, "p", 200))
    claimed_by: Counter[str] = Counter()

    async def worker(w: int) -> None:
        finished: list[pb.CompleteRunRequest] = []
        while True:
            resp = await s.stub.ClaimRuns(
                pb.ClaimRunsRequest(worker_id=f"w{w}", project_ids=["p"], max_runs=7, complete=finished),
                metadata=s.worker,
            )
            assert len(resp.completed) == len(finished)
            assert all(not r.error_reason for r in resp.completed)
            claimed_by.update(r.run.run_id for r in resp.runs)
            finished = [item(r.lease, w=w) for r in resp.runs]
            if not finished:
                return

    await asyncio.gather(*(worker(w) for w in range(8)))
    assert set(claimed_by) == ids and set(claimed_by.values()) == {1}
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'") == 0
    counts = await s.db.fetch(
        "SELECT action, count(*) AS n FROM awooop_audit_log WHERE project_id = 'p' GROUP BY action ORDER BY action"
    )
    assert {r["action"]: r["n"] for r in counts} == {"CLAIMED": 200, "COMPLETED": 200}


class _SchedulerWithoutCarriedCompletions:
    """A scheduler stub that drops ClaimRunsRequest.complete, as a scheduler that predates the
    field ignores it (an unknown field)."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def ClaimRuns(self, request: pb.ClaimRunsRequest, **kw: Any) -> pb.ClaimRunsResponse:
        old = pb.ClaimRunsRequest()
        old.CopyFrom(request)
        old.ClearField("complete")
        return await self._stub.ClaimRuns(old, **kw)  # type: ignore[no-any-return]


async def test_a_worker_completes_through_complete_runs_when_the_scheduler_ignores_carried_completions(
    s: Sched,
) -> None:
    await insert_runs(s.db, "p", 40)

    async def handler(ctx: RunContext) -> dict[str, Any]:
        return {"n": ctx.input["n"]}

    async with _client(s, s.worker) as client:
        client._stubs["scheduler"] = _SchedulerWithoutCarriedCompletions(client.stub("scheduler"))
        worker = Worker(handler, projects=["p"], client=client, concurrency=10, claim_wait=1, worker_id="sdk")
        task = asyncio.create_task(worker.run(install_signal_handlers=False))

        async def all_completed() -> bool:
            n = await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'COMPLETED'")
            return bool(n == 40)

        await eventually(all_completed, what="40 completed runs")
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert worker.stats.completed == 40 and not worker.stats.by_outcome.get("error")
    # the first carried batch came back unanswered: sent again with CompleteRuns, never carried again
    assert not worker.completions.carry and worker.completions.carried == 0 and worker.completions.calls >= 1


async def test_completions_held_for_a_claim_get_each_callers_own_result(s: Sched) -> None:
    """The batcher's carrier path as the Worker drives it: held completions go in one ClaimRuns;
    a refused item raises CompleteRun's error (LeaseLost) for its caller only."""
    a, b = await insert_runs(s.db, "p", 2)
    claimed = {r.run.run_id: r for r in await s.claim(max_runs=2)}
    stale = lease(b, claimed[b].lease.attempt + 1)
    woken: list[int] = []
    async with _client(s, s.worker) as client:
        batcher = CompletionBatcher(client)
        batcher.set_carrier(lambda: True, lambda: woken.append(1))
        calls = [
            asyncio.create_task(batcher.complete(item(claimed[a].lease, k="a"))),
            asyncio.create_task(batcher.complete(item(stale))),
        ]
        await asyncio.sleep(0)  # the callers run up to their wait
        assert batcher.held == 2 and len(woken) == 2 and batcher.calls == 0
        held = batcher.take()
        resp = await s.stub.ClaimRuns(
            pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], complete=[r for r, _ in held]), metadata=s.worker
        )
        batcher.settle(held, resp.completed)
        done, lost = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(done, common_pb2.Run) and done.run_id == a and done.status == common_pb2.RUN_STATUS_COMPLETED
    assert isinstance(lost, LeaseLost) and lost.reason == errors.LEASE_LOST
    assert batcher.carried == 2 and batcher.claim_calls == 1 and batcher.calls == 0
    assert (await run_row(s.db, b))["status"] == "RUNNING"
