"""A ClaimRuns long-poll whose call ends (the client cancels, its deadline passes, its channel
closes) claims nothing for the worker that is gone: a run created afterwards goes to another
worker at once, and a claim that committed while the call ended is handed back at once without
spending an attempt (not left RUNNING until its lease expires and the reaper takes it).

The claim-in-flight case needs the claim's commit held open while the call ends: its own
throwaway Postgres (tests/harness/pgcluster.py) names a synchronous standby that does not exist,
so every commit waits (wait_event SyncRep) until the test removes it. Cancelling a statement in
that wait does not undo it ("already committed locally"), exactly as a cancel request that
arrives just after a claim committed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.scheduler import hand_back
from tests.harness.helpers import eventually
from tests.harness.infra import key_on
from tests.harness.pgcluster import PgCluster, create_migrated_db
from tests.harness.scheduler import (
    Sched,
    audit_actions,
    claims_waiting,
    dur,
    insert_runs,
    make_sched,
    run_row,
    wait_listening,
)

PROJECT = "p"
LONG_LEASE = 600.0  # far beyond every bound below: a run left to the reaper is never claimable in time


def _abandoned() -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_claims_abandoned_total") or 0.0


async def _no_claim_waiting() -> bool:
    return (REGISTRY.get_sample_value("awooop_scheduler_claims_waiting") or 0) == 0


async def _claim_at_once(stub: Any, md: Any, worker_id: str, run_id: str) -> pb.ClaimedRun:
    """Another worker claims run_id, polled with a bound far below the lease the gone worker
    asked for (so a run left RUNNING for it fails this)."""
    got: list[pb.ClaimedRun] = []

    async def claimed() -> bool:
        resp = await stub.ClaimRuns(pb.ClaimRunsRequest(worker_id=worker_id, project_ids=[PROJECT]), metadata=md)
        got.extend(resp.runs)
        return any(r.run.run_id == run_id for r in got)

    await eventually(claimed, timeout=15, what=f"{worker_id} to claim the run")
    (run,) = [r for r in got if r.run.run_id == run_id]
    return run


# --- the call ends while the long-poll waits (shared test database) ----------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services: Any, channels: Any, db: asyncpg.Connection, make_key: Any) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


@pytest.mark.parametrize("how", ["client cancels", "channel closes"])
async def test_a_long_poll_whose_call_ends_stops_waiting_and_the_next_run_goes_to_another_worker(
    s: Sched, channels: Any, how: str
) -> None:
    await wait_listening(s)
    channel = channels(s.rt.ports["scheduler"])
    gone = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    before = _abandoned()
    call = gone.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="gone", project_ids=[PROJECT], wait=dur(60), lease_ttl=dur(LONG_LEASE)),
        metadata=s.worker,
    )
    await eventually(lambda: claims_waiting(1), what="the long-poll to wait")
    if how == "client cancels":
        call.cancel()
    else:
        await channel.close()
    with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
        await call
    # the scheduler stopped waiting for it (no wake-up will find it)
    await eventually(_no_claim_waiting, what="the scheduler to stop waiting")
    assert _abandoned() > before

    (run_id,) = await insert_runs(s.db, PROJECT, 1)
    run = await _claim_at_once(s.stub, s.worker, "w2", run_id)
    assert run.run.worker_id == "w2" and run.lease.attempt == 1
    assert await audit_actions(s.db, run_id) == ["CLAIMED"]


# --- the call ends while its claim commits (own Postgres) ---------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    c = PgCluster.create()
    try:
        yield c
    finally:
        c.destroy()


async def _in_syncrep(conn: asyncpg.Connection, pid: int | None = None) -> int:
    """Backends (the scheduler's pool, or pid) whose commit waits for the synchronous standby."""
    if pid is not None:
        where, args = "pid = $1", [pid]
    else:
        where, args = "application_name = 'awooop' AND datname = current_database()", []
    return int(
        await conn.fetchval(f"SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND {where}", *args)
    )


async def _hold_commits(conn: asyncpg.Connection, dsn: str) -> None:
    """From now on every commit that asks for synchronous replication waits (this test's own
    connections commit with synchronous_commit = local). Proven with a probe commit that waits."""
    await conn.execute("CREATE TABLE IF NOT EXISTS sync_probe (at timestamptz)")
    await conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'awooop_nobody'")
    await conn.fetchval("SELECT pg_reload_conf()")
    probe = await asyncpg.connect(dsn)
    try:
        pid = probe.get_server_pid()
        task: asyncio.Future[Any] = asyncio.ensure_future(probe.execute("INSERT INTO sync_probe VALUES (now())"))

        async def held() -> bool:
            nonlocal task
            if task.done():  # committed before the reload took effect: try again
                task.result()
                task = asyncio.ensure_future(probe.execute("INSERT INTO sync_probe VALUES (now())"))
                return False
            return await _in_syncrep(conn, pid) == 1

        await eventually(held, what="commits to wait for the synchronous standby")
        await conn.fetchval("SELECT pg_cancel_backend($1)", pid)  # its commit stays (a warning)
        await asyncio.wait_for(task, 10)
    finally:
        await probe.close()


async def _release_commits(conn: asyncpg.Connection) -> None:
    await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
    await conn.fetchval("SELECT pg_reload_conf()")


@pytest.mark.parametrize("how", ["client cancels", "deadline passes"])
async def test_a_claim_that_commits_after_its_call_ended_is_handed_back_at_once_without_spending_an_attempt(
    start_services: Any, channels: Any, cluster: PgCluster, how: str
) -> None:
    dsn = await create_migrated_db(cluster.primary.dsn, f"awooop_{uuid.uuid4().hex[:8]}")
    rt = await start_services("scheduler", database_url=dsn, reaper_interval=3600, approval_sweep_interval=3600)
    md = await key_on(dsn, "worker-1", {PROJECT: ["worker"]})
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    conn = await asyncpg.connect(dsn, server_settings={"synchronous_commit": "local"})
    try:
        await eventually(
            lambda: conn.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'awooop-scheduler-listen'"
            ),
            what="the scheduler's LISTEN connection",
        )
        await _hold_commits(conn, dsn)
        try:
            req = pb.ClaimRunsRequest(worker_id="gone", project_ids=[PROJECT], wait=dur(60), lease_ttl=dur(LONG_LEASE))
            # the deadline leaves the scheduler about 4.8 s of wait (it answers before it): ample
            # to see it wait and wake it, and it passes while the claim's commit is held
            call = stub.ClaimRuns(req, metadata=md, timeout=6 if how == "deadline passes" else None)
            await eventually(lambda: claims_waiting(1), what="the long-poll to wait")
            before = _abandoned()
            (run_id,) = await insert_runs(conn, PROJECT, 1)  # commits, then NOTIFY: the long-poll claims it
            await eventually(lambda: _in_syncrep(conn), what="the claim's commit to be held")
            if how == "client cancels":
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            else:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await asyncio.wait_for(call, 20)
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

            async def seen() -> bool:
                # the scheduler saw the call end: it says so, or (had it cancelled the statement)
                # its backend left the wait with the claim committed
                return _abandoned() > before or await _in_syncrep(conn) == 0

            await eventually(seen, what="the scheduler to see the call end")
        finally:
            await _release_commits(conn)

        run = await _claim_at_once(stub, md, "w2", run_id)
        row = await run_row(conn, run_id)
        assert row["status"] == "RUNNING" and row["worker_id"] == "w2"
        # the gone worker's claim did not count: this is the run's first spent attempt
        assert row["attempt_count"] - row["released_count"] == 1
        assert run.lease.attempt == row["attempt_count"] == 2
        assert await audit_actions(conn, run_id) == ["CLAIMED", "RELEASED", "CLAIMED"]
        reason = await conn.fetchval(
            "SELECT reason FROM awooop_audit_log WHERE run_id = $1 AND action = 'RELEASED'", uuid.UUID(run_id)
        )
        assert reason == hand_back.CALLER_GONE
        assert (REGISTRY.get_sample_value("awooop_scheduler_claim_undelivered_total") or 0) >= 1
    finally:
        await conn.close()
