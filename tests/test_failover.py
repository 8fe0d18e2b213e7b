"""A Postgres failover under load: a primary and a streaming standby (initdb, pg_basebackup,
`pg_ctl promote`), the services on a multi-host DSN with target_session_attrs=read-write.
While producers send events (retrying each until it is acknowledged, as providers do) and
workers claim and complete runs, the primary is stopped and the standby promoted. Every
acknowledged event and completion must be on the new primary, no event may have two runs,
no answer may be INTERNAL (only OK or UNAVAILABLE/STORE_UNAVAILABLE), and the services and
the LISTEN wake-up must come back by themselves. The unavailability is printed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import grpc
from google.protobuf import duration_pb2
from prometheus_client import REGISTRY

from awooop.ingest.v1 import ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from tests.harness.helpers import eventually
from tests.harness.infra import Tally, key_on, tg_event
from tests.harness.pgcluster import PgCluster, create_migrated_db, wait_sql

PROJECT = "ops"


def _wait(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


async def test_a_failover_under_load_loses_nothing_duplicates_nothing_and_recovers(
    start_services: Any, channels: Any, pg_cluster: PgCluster
) -> None:
    dsn = await create_migrated_db(pg_cluster.primary.dsn, "awooop")
    md = await key_on(dsn, "alice", {PROJECT: ["ingest", "worker"]})
    standby = pg_cluster.add_standby()
    assert await wait_sql(standby.dsn_for("awooop"), "SELECT pg_is_in_recovery()") is True
    multi = (
        f"postgresql://postgres@127.0.0.1:{pg_cluster.primary.port},127.0.0.1:{standby.port}/awooop"
        "?target_session_attrs=read-write"
    )
    rt = await start_services(
        "ingest",
        "scheduler",
        database_url=multi,
        db_connect_timeout=2.0,
        db_pool_min=2,
        reaper_interval=0.5,
        auth_cache_seconds=3600,  # the key is checked once: auth is not what this test is about
    )
    await eventually(lambda: _gauge_is("awooop_scheduler_listener_connected", 1), what="LISTEN up")
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))

    tally = Tally()
    acked: dict[int, str] = {}  # update_id -> run_id, once acknowledged
    completed: set[str] = set()  # run ids whose completion was acknowledged
    failures: list[float] = []  # when a call failed
    successes: list[float] = []  # when an event was acknowledged
    promoted_at: list[float] = []
    stop_producing = asyncio.Event()
    total_events = 0

    async def producer(p: int) -> None:
        nonlocal total_events
        n = 0
        while not stop_producing.is_set():
            n += 1
            uid = p * 1_000_000 + n
            total_events += 1
            while True:  # a provider retries until it is acknowledged
                try:
                    resp = await ingest.IngestEvent(tg_event(PROJECT, uid), metadata=md, timeout=10)
                    tally.ok()
                    acked[uid] = resp.outcomes[0].run_id
                    successes.append(time.monotonic())
                    break
                except grpc.aio.AioRpcError as err:
                    tally.failed(err)
                    failures.append(time.monotonic())
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.01)

    all_done = asyncio.Event()

    async def worker(w: int) -> None:
        while not all_done.is_set():
            try:
                resp = await sched.ClaimRuns(
                    spb.ClaimRunsRequest(
                        worker_id=f"w{w}", project_ids=[PROJECT], max_runs=10, wait=_wait(1), lease_ttl=_wait(5)
                    ),
                    metadata=md,
                    timeout=10,
                )
                tally.ok()
            except grpc.aio.AioRpcError as err:
                tally.failed(err)
                failures.append(time.monotonic())
                await asyncio.sleep(0.1)
                continue
            for claimed in resp.runs:
                try:
                    await sched.CompleteRun(spb.CompleteRunRequest(lease=claimed.lease), metadata=md, timeout=10)
                    tally.ok()
                    completed.add(claimed.lease.run_id)
                except grpc.aio.AioRpcError as err:
                    tally.failed(err)
                    failures.append(time.monotonic())
                    # retried by the reaper once the 5 s lease runs out

    producers = [asyncio.create_task(producer(p)) for p in range(3)]
    workers = [asyncio.create_task(worker(w)) for w in range(2)]
    try:
        await eventually(lambda: _at_least(len(completed), 30), timeout=30, what="load before the failover")
        stopped_at = time.monotonic()
        await asyncio.to_thread(pg_cluster.primary.stop, "fast")
        await asyncio.to_thread(standby.promote)
        promoted_at.append(time.monotonic())
        acked_before = len(acked)
        await eventually(lambda: _at_least(len(acked) - acked_before, 30), timeout=60, what="events after promotion")
        stop_producing.set()
        await asyncio.wait_for(asyncio.gather(*producers), 30)

        new_primary = standby.dsn_for("awooop")

        async def drained() -> bool:
            conn = await asyncpg.connect(new_primary)
            try:
                left = await conn.fetchval("SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'")
            finally:
                await conn.close()
            return bool(left == 0)

        await eventually(drained, timeout=60, what="every run completed after the failover")
    finally:
        stop_producing.set()
        all_done.set()
        await asyncio.wait_for(asyncio.gather(*producers, *workers, return_exceptions=True), 30)

    # the LISTEN wake-up came back by itself: a waiting claim is woken by a new event
    await eventually(lambda: _gauge_is("awooop_scheduler_listener_connected", 1), timeout=30, what="LISTEN back")
    waiting = asyncio.ensure_future(
        sched.ClaimRuns(
            spb.ClaimRunsRequest(worker_id="late", project_ids=[PROJECT], max_runs=1, wait=_wait(20)), metadata=md
        )
    )
    await eventually(lambda: _gauge_is("awooop_scheduler_claims_waiting", 1), what="the long-poll")
    await ingest.IngestEvent(tg_event(PROJECT, 99_000_000), metadata=md)
    assert len((await asyncio.wait_for(waiting, 20)).runs) == 1

    conn = await asyncpg.connect(standby.dsn_for("awooop"))
    try:
        rows = await conn.fetch("SELECT run_id::text, provider_event_id, status FROM awooop_run_state")
        dedupe = await conn.fetchval(
            "SELECT count(*) FROM (SELECT provider_event_id FROM awooop_run_state "
            "GROUP BY provider_event_id HAVING count(*) > 1) d"
        )
    finally:
        await conn.close()
    by_run = {r["run_id"]: r for r in rows}
    lost = [uid for uid, run_id in acked.items() if run_id not in by_run]
    lost_completions = [r for r in completed if r not in by_run or by_run[r]["status"] != "COMPLETED"]
    # from the first failed call after the stop to the first acknowledged event after the last one
    outage = [t for t in failures if t >= stopped_at]
    back = [t for t in successes if outage and t > max(outage)]
    unavailable_s = (min(back) - min(outage)) if outage and back else 0.0
    print(
        f"\nfailover: {len(acked)} events acknowledged of {total_events} sent, {len(completed)} completions "
        f"acknowledged; answers {dict(tally.codes)}; lost events {len(lost)}, lost completions "
        f"{len(lost_completions)}, events with two runs {dedupe}; unavailable for {unavailable_s:.1f} s "
        f"(promotion {promoted_at[0] - stopped_at:.1f} s after the stop)"
    )
    assert tally.unexpected() == {}, f"answers other than OK and UNAVAILABLE/STORE_UNAVAILABLE: {tally.reasons}"
    assert tally.codes["INTERNAL"] == 0
    assert lost == [] and lost_completions == []
    assert dedupe == 0
    assert len({r["provider_event_id"] for r in rows}) == len(rows)


async def _at_least(value: int, n: int) -> bool:
    return value >= n


async def _gauge_is(name: str, value: float) -> bool:
    return (REGISTRY.get_sample_value(name) or 0.0) == value
