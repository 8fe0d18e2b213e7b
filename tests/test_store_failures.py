"""Store failures answer UNAVAILABLE / STORE_UNAVAILABLE (the status clients retry), never
INTERNAL, and the connection that saw them leaves the pool: a Postgres fast restart under
load, and a server that turns read-only under the pool's feet (what a demoted primary or a
standby behind a proxy looks like). Each on its own throwaway Postgres (tests/pgcluster.py),
since both change the server for everyone on it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import grpc
import pytest

from awooop.ingest.v1 import ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import db as store
from services.common import errors
from tests.harness.helpers import eventually, expect_error
from tests.harness.infra import Tally, key_on, tg_event
from tests.harness.pgcluster import PgCluster, create_migrated_db

PROJECT = "ops"


async def _fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """sql on a connection of its own, not one of the pools under test."""
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _stored(dsn: str) -> int:
    rows = await _fetch(dsn, "SELECT count(*) FROM awooop_run_state WHERE project_id = $1", PROJECT)
    return int(rows[0][0])


async def _services(
    start_services: Any, channels: Any, pg_cluster: PgCluster, **pool: Any
) -> tuple[str, Any, ingest_pb2_grpc.IngestServiceStub, scheduler_pb2_grpc.SchedulerServiceStub]:
    """ingest and scheduler (with the pool settings) on a fresh migrated database of the
    throwaway server: its DSN, a key with both roles, and the two stubs."""
    dsn = await create_migrated_db(pg_cluster.primary.dsn, "awooop")
    rt = await start_services("ingest", "scheduler", database_url=dsn, **pool)
    md = await key_on(dsn, "alice", {PROJECT: ["ingest", "worker"]})
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    return dsn, md, ingest, sched


async def test_a_fast_restart_under_load_answers_unavailable_and_recovers(
    start_services: Any, channels: Any, pg_cluster: PgCluster
) -> None:
    dsn, md, ingest, sched = await _services(
        start_services, channels, pg_cluster, db_connect_timeout=1.0, db_pool_min=4
    )
    tally, acked = Tally(), set()
    restarted = asyncio.Event()
    after_restart_ok = 0

    async def sender(worker: int) -> None:
        nonlocal after_restart_ok
        n = 0
        while after_restart_ok < 20:
            n += 1
            uid = worker * 1_000_000 + n
            try:
                await ingest.IngestEvent(tg_event(PROJECT, uid), metadata=md, timeout=10)
                tally.ok()
                acked.add(uid)
                if restarted.is_set():
                    after_restart_ok += 1
            except grpc.aio.AioRpcError as err:
                tally.failed(err)
                await asyncio.sleep(0.05)

    senders = [asyncio.create_task(sender(w)) for w in range(4)]
    await eventually(lambda: _ok_at_least(tally, 20), timeout=30, what="load before the restart")
    await asyncio.to_thread(pg_cluster.primary.restart, "fast")
    restarted.set()
    await asyncio.wait_for(asyncio.gather(*senders), timeout=60)

    assert tally.unexpected() == {}, f"answers other than OK and UNAVAILABLE/STORE_UNAVAILABLE: {tally.reasons}"
    assert tally.codes["UNAVAILABLE"] >= 1, f"the restart was never seen; the test proves nothing: {tally.codes}"
    assert await _stored(dsn) >= len(acked)  # every acknowledged event is a stored run
    # the scheduler's pool recovered too, without a restart of the service
    resp = await sched.ClaimRuns(spb.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=5), metadata=md)
    assert len(resp.runs) == 5


async def _ok_at_least(tally: Tally, n: int) -> bool:
    return tally.codes["OK"] >= n


async def _pool_pids(dsn: str) -> set[int]:
    rows = await _fetch(
        dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = 'awooop' AND datname = current_database()"
    )
    return {r["pid"] for r in rows}


async def test_a_read_only_server_answers_unavailable_and_its_connection_leaves_the_pool(
    start_services: Any, channels: Any, pg_cluster: PgCluster
) -> None:
    # one connection, so the one that saw the read-only error is the one that must go
    dsn, md, ingest, sched = await _services(start_services, channels, pg_cluster, db_pool_min=1, db_pool_max=1)
    await ingest.IngestEvent(tg_event(PROJECT, 1), metadata=md)
    before = await _pool_pids(dsn)
    assert before

    admin = await asyncpg.connect(pg_cluster.primary.dsn)
    try:
        await admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        await admin.execute("SELECT pg_reload_conf()")
        await eventually(lambda: _read_only(dsn), timeout=10, what="the reload")
        await expect_error(
            ingest.IngestEvent(tg_event(PROJECT, 2), metadata=md), grpc.StatusCode.UNAVAILABLE, errors.STORE_UNAVAILABLE
        )
        await expect_error(
            sched.ClaimRuns(spb.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT]), metadata=md),
            grpc.StatusCode.UNAVAILABLE,
            errors.STORE_UNAVAILABLE,
        )

        async def gone() -> bool:
            return not (before & await _pool_pids(dsn))

        await eventually(gone, timeout=10, what="the read-only connections to leave the pools")
        await admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()

    async def writes_again() -> bool:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await ingest.IngestEvent(tg_event(PROJECT, 3), metadata=md)
            return True
        return False

    await eventually(writes_again, timeout=10, what="writes after the server is writable again")
    resp = await sched.ClaimRuns(spb.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=5), metadata=md)
    assert len(resp.runs) == 2


async def _read_only(dsn: str) -> bool:
    rows = await _fetch(dsn, "SELECT current_setting('default_transaction_read_only') = 'on'")
    return bool(rows[0][0])


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        asyncpg.exceptions.TargetServerAttributeNotMatched('None of the hosts match the target attribute "read-write"'),
        asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.exceptions.InvalidSQLStatementNameError('prepared statement "__asyncpg_stmt_1__" does not exist'),
        asyncpg.exceptions.DuplicatePreparedStatementError('prepared statement "__asyncpg_stmt_1__" already exists'),
    ],
    ids=lambda e: type(e).__name__,
)
def test_store_events_map_to_store_unavailable(exc: BaseException) -> None:
    # the classes asyncpg raises for a restart, failover, standby and pooler; the end-to-end
    # proofs are the tests above, test_failover.py and test_pgbouncer.py
    mapped = store.store_error(exc)
    assert mapped is not None
    assert (mapped.code, mapped.reason) == (grpc.StatusCode.UNAVAILABLE, errors.STORE_UNAVAILABLE)


def test_a_bug_is_still_not_a_store_failure() -> None:
    assert store.store_error(KeyError("x")) is None
    assert store.store_error(asyncpg.exceptions.UndefinedColumnError("column x does not exist")) is None
