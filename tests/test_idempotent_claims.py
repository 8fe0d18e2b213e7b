"""Idempotent claims (ClaimRunsRequest.claim_id): a claim that committed but whose answer the
worker never saw is answered again, the same leases at once, by its retry with the same claim id;
nothing is claimed twice, not even by ten retries racing each other. Real scheduler over real
gRPC, real store; the lost answer is lost on a real TCP connection (tests/harness/wire.py)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import grpc
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.scheduler import claim_answers
from services.scheduler.workers import NO_ROUTING
from tests.harness.helpers import eventually, expect_error, lock_waiters
from tests.harness.scheduler import Sched, audit_actions, dur, insert_runs, make_sched, run_row
from tests.harness.wire import HoldingProxy

LEASE = 600.0  # far beyond every bound below: a run left to its lease never comes back in time


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services: Any, channels: Any, db: asyncpg.Connection, make_key: Any) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


def _claim(claim_id: str, **kw: Any) -> pb.ClaimRunsRequest:
    kw.setdefault("project_ids", ["p"])
    kw.setdefault("worker_id", "w1")
    kw.setdefault("lease_ttl", dur(LEASE))
    return pb.ClaimRunsRequest(claim_id=claim_id, **kw)


def _leases(runs: Any) -> list[tuple[str, int, int]]:
    return [(c.lease.run_id, c.lease.attempt, c.lease_until.ToNanoseconds()) for c in runs]


async def _claims_of(s: Sched, run_id: str) -> int:
    return (await audit_actions(s.db, run_id)).count("CLAIMED")


@contextlib.asynccontextmanager
async def _answer_held(s: Sched, claim_id: str) -> AsyncIterator[None]:
    """Holds an uncommitted answer row of worker-1's claim_id (w1) until the block ends, then rolls
    it back: a claim of that id claims its runs and then waits, uncommitted, to record its own."""
    assert s.rt.ctx is not None
    conn = await asyncpg.connect(s.rt.ctx.settings.database_url)
    try:
        async with conn.transaction():
            await conn.execute(
                f"""INSERT INTO {claim_answers.TABLE} (principal, worker_id, claim_id, project_ids, max_runs, lease_ttl,
                                                      run_ids, attempts, expires_at)
                    VALUES ('service:worker-1', 'w1', $1, '{{p}}', 1, 1, '{{}}', '{{}}', now())""",
                claim_id,
            )
            yield
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()


class _RollBack(Exception):
    pass


async def _waiting_on_the_key(s: Sched) -> int:
    """Statements of this database waiting for another transaction (the held answer's)."""
    sql = """SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'transactionid' AND NOT l.granted AND a.datname = current_database()"""
    return int(await s.db.fetchval(sql))


async def test_a_claim_whose_answer_was_lost_is_answered_again_by_its_retry_at_once(s: Sched, channels: Any) -> None:
    ids = await insert_runs(s.db, "p", 3)
    proxy = await HoldingProxy(s.rt.ports["scheduler"]).start()
    try:
        lossy = scheduler_pb2_grpc.SchedulerServiceStub(channels(proxy.port))
        await lossy.GetRun(pb.GetRunRequest(run_id=ids[0]), metadata=s.worker)  # the connection is up
        proxy.held = True
        req = _claim("claim-1", max_runs=2, wait=dur(5))
        # the scheduler claims and answers; the answer never arrives and the deadline passes
        await expect_error(lossy.ClaimRuns(req, metadata=s.worker, timeout=1.0), grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        await proxy.close()
    rows = {rid: await run_row(s.db, rid) for rid in ids}
    taken = [rid for rid in ids if rows[rid]["status"] == "RUNNING"]
    assert taken == ids[:2] and all(rows[r]["attempt_count"] == 1 and rows[r]["worker_id"] == "w1" for r in taken)

    # the retry (wait as before: a claim would wait for work, a replay answers at once)
    loop = asyncio.get_running_loop()
    started = loop.time()
    again = await s.stub.ClaimRuns(req, metadata=s.worker, timeout=10)
    assert loop.time() - started < 4.0, "the replay waited for work"
    assert [(r, 1, rows[r]["lease_until"]) for r in taken] == [
        (c.lease.run_id, c.lease.attempt, c.lease_until.ToDatetime(tzinfo=dt.UTC)) for c in again.runs
    ]
    assert [c.run.input["n"] for c in again.runs] == [1.0, 2.0]
    assert all(c.run.status == common_pb2.RUN_STATUS_RUNNING and not c.resumed for c in again.runs)
    # nothing more was claimed: the third run is still queued, each taken run claimed once
    assert (await run_row(s.db, ids[2]))["status"] == "PENDING"
    assert [await _claims_of(s, r) for r in ids] == [1, 1, 0]

    # the runs complete with those leases
    done = await s.stub.CompleteRuns(
        pb.CompleteRunsRequest(runs=[pb.CompleteRunRequest(lease=c.lease) for c in again.runs]), metadata=s.worker
    )
    assert [r.run.status for r in done.results] == [common_pb2.RUN_STATUS_COMPLETED] * 2
    # and a retry now leaves them out (their lease is no longer held), still claiming nothing
    assert list((await s.stub.ClaimRuns(req, metadata=s.worker)).runs) == []
    assert (await run_row(s.db, ids[2]))["status"] == "PENDING"


async def test_different_claim_ids_claim_different_runs(s: Sched, make_key: Any) -> None:
    ids = await insert_runs(s.db, "p", 4)
    a = await s.stub.ClaimRuns(_claim("a", max_runs=2), metadata=s.worker)
    b = await s.stub.ClaimRuns(_claim("b", max_runs=2), metadata=s.worker)
    assert [c.lease.run_id for c in a.runs] == ids[:2] and [c.lease.run_id for c in b.runs] == ids[2:]
    # each answers its own claim again; another worker's or another principal's "a" is another claim
    assert _leases((await s.stub.ClaimRuns(_claim("b", max_runs=2), metadata=s.worker)).runs) == _leases(b.runs)
    assert _leases((await s.stub.ClaimRuns(_claim("a", max_runs=2), metadata=s.worker)).runs) == _leases(a.runs)
    more = await insert_runs(s.db, "p", 2)
    other = await s.stub.ClaimRuns(_claim("a", max_runs=2, worker_id="w2"), metadata=s.worker)
    assert [c.lease.run_id for c in other.runs] == more
    more = await insert_runs(s.db, "p", 2)
    md = await make_key("worker-2", {"p": ["worker"]}, "service")
    another = await s.stub.ClaimRuns(_claim("a", max_runs=2), metadata=md)
    assert [c.lease.run_id for c in another.runs] == more


async def test_ten_concurrent_retries_of_one_claim_answer_the_same_runs_and_claim_nothing_twice(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 40)
    # All ten claim before any records its answer: each holds 3 runs of its own, waiting on the
    # key's uncommitted row; when that goes, the first to record wins and the others' whole
    # statements fail on its key, are run again and replay its answer.
    async with _answer_held(s, "one-claim"):
        req = _claim("one-claim", max_runs=3)
        calls = [asyncio.ensure_future(s.stub.ClaimRuns(req, metadata=s.worker, timeout=30)) for _ in range(10)]

        async def all_claimed_and_waiting() -> bool:
            return await _waiting_on_the_key(s) == 10

        await eventually(all_claimed_and_waiting, what="ten claims waiting to record their answer")
        locked = await s.db.fetchval("SELECT count(*) FROM (SELECT FROM awooop_run_state FOR UPDATE SKIP LOCKED) x")
        assert locked == 40 - 30  # each of the ten holds 3 runs it claimed
    answers = await asyncio.gather(*calls)
    first = _leases(answers[0].runs)
    assert len(first) == 3 and all(_leases(a.runs) == first for a in answers)
    claimed = [r["run_id"] for r in await s.db.fetch("SELECT run_id FROM awooop_run_state WHERE attempt_count > 0")]
    assert sorted(str(r) for r in claimed) == sorted(r for r, _, _ in first)
    assert sum([await _claims_of(s, r) for r in ids]) == 3
    assert await s.db.fetchval(f"SELECT count(*) FROM {claim_answers.TABLE}") == 1


async def test_a_claim_id_reused_for_another_claim_is_refused_and_changes_nothing(s: Sched, make_key: Any) -> None:
    md = await make_key("worker-pq", {"p": ["worker"], "q": ["worker"]}, "service")
    await insert_runs(s.db, "p", 3)
    first = await s.stub.ClaimRuns(_claim("x", max_runs=1), metadata=md)
    assert len(first.runs) == 1
    for other, differs in (
        (_claim("x", max_runs=2), "max_runs"),
        (_claim("x", max_runs=1, lease_ttl=dur(60)), "lease_ttl"),
        (_claim("x", max_runs=2, project_ids=["p", "q"]), "project_ids,max_runs"),
    ):
        err = await expect_error(
            s.stub.ClaimRuns(other, metadata=md), grpc.StatusCode.ALREADY_EXISTS, errors.IDEMPOTENCY_CONFLICT
        )
        info = errors.error_info(err)
        assert info is not None and info.metadata["claim_id"] == "x" and info.metadata["differs"] == differs
    # the projects compare as a set
    same = await s.stub.ClaimRuns(_claim("x", max_runs=1, project_ids=["p", "p"]), metadata=md)
    assert _leases(same.runs) == _leases(first.runs)
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE attempt_count > 0") == 1


async def test_a_claim_that_took_nothing_records_nothing_so_its_retry_claims(s: Sched) -> None:
    empty = await s.stub.ClaimRuns(_claim("early"), metadata=s.worker)
    assert list(empty.runs) == []
    (rid,) = await insert_runs(s.db, "p", 1)
    again = await s.stub.ClaimRuns(_claim("early"), metadata=s.worker)
    assert [c.lease.run_id for c in again.runs] == [rid]


async def test_a_claim_carrying_completions_is_replayed_with_them(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 3)
    (held,) = await s.claim(lease_ttl=dur(LEASE))
    req = _claim("carrying", max_runs=1, complete=[pb.CompleteRunRequest(lease=held.lease)])
    first = await s.stub.ClaimRuns(req, metadata=s.worker)
    again = await s.stub.ClaimRuns(req, metadata=s.worker)
    assert [r.run.status for r in again.completed] == [common_pb2.RUN_STATUS_COMPLETED]
    assert not again.completed[0].error_reason
    assert _leases(again.runs) == _leases(first.runs) and [c.lease.run_id for c in first.runs] == [ids[1]]
    assert (await run_row(s.db, ids[2]))["status"] == "PENDING"
    # a plain retry of the same claim (the completions went another way) answers the same runs
    plain = await s.stub.ClaimRuns(_claim("carrying", max_runs=1), metadata=s.worker)
    assert _leases(plain.runs) == _leases(first.runs)


async def test_a_claim_whose_caller_is_gone_before_it_commits_is_handed_back_and_its_retry_takes_nothing(
    s: Sched,
) -> None:
    (rid,) = await insert_runs(s.db, "p", 1)
    async with _answer_held(s, "slow"):  # the claim claims, then waits to record its answer
        req = _claim("slow")
        await expect_error(s.stub.ClaimRuns(req, metadata=s.worker, timeout=1.0), grpc.StatusCode.DEADLINE_EXCEEDED)
        assert await _waiting_on_the_key(s) == 1

    # the scheduler knows the caller is gone: the claim, once committed, is handed back at once
    async def handed_back() -> bool:
        return "RELEASED" in await audit_actions(s.db, rid)

    await eventually(handed_back, what="the claim of the gone caller handed back")
    row = await run_row(s.db, rid)
    assert row["status"] == "PENDING" and row["released_count"] == 1
    # its retry answers at once with the runs still held: none; the next claim takes the run
    assert list((await s.stub.ClaimRuns(_claim("slow", wait=dur(5)), metadata=s.worker, timeout=3)).runs) == []
    nxt = await s.stub.ClaimRuns(_claim("next"), metadata=s.worker)
    assert [c.lease.run_id for c in nxt.runs] == [rid]


async def test_recorded_answers_are_pruned_once_their_lease_would_have_expired(s: Sched) -> None:
    await insert_runs(s.db, "p", 2)
    await s.stub.ClaimRuns(_claim("short", lease_ttl=dur(1)), metadata=s.worker)
    await s.stub.ClaimRuns(_claim("long"), metadata=s.worker)
    assert await s.db.fetchval(f"SELECT count(*) FROM {claim_answers.TABLE}") == 2

    async def pruned() -> int:
        return await claim_answers.prune(s.pool, batch=10)

    assert await eventually(pruned, what="the short claim's answer to expire and be pruned") == 1
    left = await s.db.fetch(f"SELECT claim_id FROM {claim_answers.TABLE}")
    assert [r["claim_id"] for r in left] == ["long"]


@pytest.mark.parametrize(
    "claim_id",
    ["x" * 129, "a\x01b", "two words", "naïve"],
)
async def test_a_bad_claim_id_is_invalid_argument_naming_the_field(s: Sched, claim_id: str) -> None:
    (rid,) = await insert_runs(s.db, "p", 1)
    err = await expect_error(
        s.stub.ClaimRuns(_claim(claim_id), metadata=s.worker), grpc.StatusCode.INVALID_ARGUMENT, errors.FIELD_INVALID
    )
    status = rpc_status.from_call(err)
    assert status is not None
    fields = []
    for d in status.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            fields += [v.field for v in br.field_violations]
    assert fields == ["claim_id"]
    assert (await run_row(s.db, rid))["status"] == "PENDING"
    # the longest accepted
    ok = await s.stub.ClaimRuns(_claim("y" * 128), metadata=s.worker)
    assert [c.lease.run_id for c in ok.runs] == [rid]


async def test_a_claim_without_a_claim_id_records_no_answer(s: Sched) -> None:
    """A claim without claim_id runs the same statement with its key NULL (claims.sql): it finds
    no answer recorded and records none, with or without completions."""
    (first, second) = await insert_runs(s.db, "p", 2)
    got = await s.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], max_runs=1), metadata=s.worker)
    assert [c.lease.run_id for c in got.runs] == [first]
    done = pb.CompleteRunRequest(lease=got.runs[0].lease)
    again = await s.stub.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="w1", project_ids=["p"], max_runs=1, complete=[done]), metadata=s.worker
    )
    assert [c.lease.run_id for c in again.runs] == [second] and len(again.completed) == 1
    assert await s.db.fetchval(f"SELECT count(*) FROM {claim_answers.TABLE}") == 0


async def test_through_its_plan_function_a_racing_retry_still_meets_the_first_answer(s: Sched, db_dsn: str) -> None:
    """Behind a transaction-mode pooler the claim runs as the PL/pgSQL function the migration
    created (services/common/server_plans.py): the racing retry's unique violation still names
    the answer's key, so it is run again and replays."""
    from services.common import server_plans
    from services.scheduler import claiming

    await insert_runs(s.db, "p", 4)
    st = claiming.claim_statement(1, 2)
    first, second = [await asyncpg.connect(db_dsn, statement_cache_size=0) for _ in range(2)]
    try:
        key = claim_answers.ClaimKey("service:worker-1", "w1", "racing", ("p",), 2, LEASE)
        args = st.args(
            projects=["p"],
            lease_secs=LEASE,
            worker_id="w1",
            actor="test",
            **NO_ROUTING.params(),
            **key.params(),
            **claiming.NO_COMPLETIONS,
        )
        call = server_plans.call_text(server_plans.function_name(st.sql), len(args))
        tx = first.transaction()
        await tx.start()
        took = [r["run_id"] for r in await first.fetch(call, *args)]
        assert len(took) == 2
        racing = asyncio.ensure_future(second.fetch(call, *args))

        await eventually(lambda: lock_waiters(s.db), what="the racing claim to wait for the first one's commit")
        await tx.commit()
        with pytest.raises(asyncpg.exceptions.UniqueViolationError) as err:
            await racing
        assert claim_answers.recorded_meanwhile(err.value)
        again = await second.fetch(call, *args)
        assert [r["run_id"] for r in again] == [None] and again[0]["recorded"]
    finally:
        await first.close()
        await second.close()
    # the racing claim's runs went back with its statement: only the first two were claimed
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE attempt_count > 0") == 2
