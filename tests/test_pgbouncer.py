"""The services behind a real PgBouncer in transaction mode (Debian's pgbouncer, started here
on a free port): the RPC pools go through the pooler with AWOOOP_DB_STATEMENT_CACHE=false, and
LISTEN, migrations and `awooop admin` use AWOOOP_DATABASE_DIRECT_URL. Misconfigurations are
named once in the log and answer UNAVAILABLE, never INTERNAL.

Written for PgBouncer 1.18 (Debian 12, .ci/install-debian prints the version): transaction mode
without its prepared-statement support (1.21 and later), hence the statement cache off."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from awooop.worker import Client, RunContext, ToolClient, Worker, to_struct
from services.common import db as store
from services.common.embedded import free_port
from tests.harness.helpers import ROOT, eventually, key_of, start_with_gateway
from tests.harness.infra import Tally, tg_event
from tests.harness.pgbouncer import PgBouncer, start_pgbouncer
from tests.harness.rpc_runs import create_deployment

PROJECT = "ops"


@pytest.fixture
def bouncer(db_dsn: str) -> Iterator[PgBouncer]:
    b = start_pgbouncer(db_dsn, pool_size=4)
    try:
        yield b
    finally:
        b.stop()


def _gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_the_suite_works_through_pgbouncer_in_transaction_mode(
    bouncer: PgBouncer, start_services: Any, make_key: Any, db: Any, db_dsn: str
) -> None:
    pooled = {"database_url": bouncer.dsn_for(db_dsn), "database_direct_url": db_dsn, "db_statement_cache": False}
    gw, rt = await start_with_gateway(start_services, pooled, retry_backoff=0.05, **pooled)
    # the pools really go through the pooler: PgBouncer's server connections carry our name
    assert await eventually(
        lambda: db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'awooop'"),
        what="pooled connections",
    )
    await eventually(lambda: _true(_gauge("awooop_scheduler_listener_connected") == 1), what="LISTEN up")
    assert _gauge("awooop_scheduler_listen_unavailable") == 0  # the probe notification arrived

    ingest_md = await make_key("hook", {PROJECT: ["ingest"]}, "service")
    worker_key = key_of(await make_key("pod", {PROJECT: ["worker"]}, "service"))
    admin = Client(
        key=key_of(await make_key("boss", {PROJECT: ["admin"]})),
        ingest=f"127.0.0.1:{rt.ports['ingest']}",
        scheduler=f"127.0.0.1:{rt.ports['scheduler']}",
        gateway=f"127.0.0.1:{gw.ports['gateway']}",
    )
    ingest = ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['ingest']}"))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['scheduler']}"))

    # a long-poll waiting before the event exists is woken by the event (LISTEN on the direct URL)
    waiting = asyncio.ensure_future(
        sched.ClaimRuns(
            spb.ClaimRunsRequest(worker_id="early", project_ids=[PROJECT], max_runs=1, wait=_dur(20)),
            metadata=(("authorization", f"Bearer {worker_key}"),),
        )
    )
    await eventually(lambda: _true(_gauge("awooop_scheduler_claims_waiting") >= 1), what="the long-poll")
    await ingest.IngestEvent(tg_event(PROJECT, 1), metadata=ingest_md)
    early = await asyncio.wait_for(waiting, 20)
    assert len(early.runs) == 1
    await sched.CompleteRun(
        spb.CompleteRunRequest(lease=early.runs[0].lease), metadata=(("authorization", f"Bearer {worker_key}"),)
    )

    # ingest under concurrency, duplicates included: one run per event, no error
    tally = Tally()
    sem = asyncio.Semaphore(20)

    async def send(uid: int) -> None:
        async with sem:
            try:
                await ingest.IngestEvent(tg_event(PROJECT, uid), metadata=ingest_md, timeout=20)
                tally.ok()
            except grpc.aio.AioRpcError as err:
                tally.failed(err)

    await asyncio.gather(*(send(2 + i % 100) for i in range(200)))
    assert tally.codes == {"OK": 200}, tally.reasons

    # workers: claim, heartbeat, journal steps; one run fails and is compensated through the gateway
    await create_deployment(admin, PROJECT, replicas=2)
    failing = (
        (
            await admin.call(
                admin.ingest.IngestEvent,
                ingest_pb2.IngestEventRequest(
                    project_id=PROJECT,
                    channel_type=common_pb2.CHANNEL_TYPE_API,
                    provider_event_id="fail-1",
                    payload=to_struct({"x": 1}),
                    input=to_struct({"fail": True}),
                ),
            )
        )
        .outcomes[0]
        .run_id
    )
    tools = ToolClient(f"127.0.0.1:{gw.ports['gateway']}", key=worker_key)

    def undo(result: dict[str, Any]) -> dict[str, Any]:
        return {
            "tool_id": "k8s_scale_deployment",
            "params": {"deployment": "api", "replicas": result["previous_replicas"]},
        }

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input.get("fail"):
            await ctx.step(
                "scale",
                tools.execute,
                tool_id="k8s_scale_deployment",
                params={"deployment": "api", "replicas": 5},
                compensation=undo,
            )
            await ctx.fail("crash-loop", error_code="E-DEMO-CRASHLOOP")
            return {}
        await ctx.step("think", lambda call: {"seen": ctx.run_id}, step_type="llm_call")
        await asyncio.sleep(0.3)  # long enough for a heartbeat
        return {"ok": True}

    workers = [
        Worker(
            handler,
            projects=[PROJECT],
            key=worker_key,
            scheduler=f"127.0.0.1:{rt.ports['scheduler']}",
            saga=f"127.0.0.1:{rt.ports['saga']}",
            concurrency=8,
            heartbeat_interval=0.1,
            lease_ttl=30,
            claim_wait=2,
        )
        for _ in range(3)
    ]
    tasks = [asyncio.create_task(w.run(install_signal_handlers=False)) for w in workers]

    async def all_done() -> bool:
        return bool(
            await db.fetchval("SELECT count(*) = 0 FROM awooop_run_state WHERE status NOT IN ('COMPLETED', 'FAILED')")
            and await db.fetchval(
                "SELECT saga_status = 'compensated' FROM awooop_run_state WHERE run_id = $1::uuid", failing
            )
        )

    try:
        await eventually(all_done, timeout=60, what="every run finished and the failed one compensated")
    except AssertionError:
        states = await db.fetch("SELECT status, saga_status, count(*) FROM awooop_run_state GROUP BY 1, 2")
        raise AssertionError(f"runs by state: {[tuple(r) for r in states]}") from None
    finally:
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await tools.close()
        await admin.close()
    rows = await db.fetch("SELECT status, attempt_count FROM awooop_run_state")
    assert len(rows) == 102
    assert {r["attempt_count"] for r in rows} == {1}  # no run was handed out twice
    assert (
        await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE step_id = 'think' AND status = 'completed'")
        == 100
    )
    assert sum(w.stats.leases_renewed for w in workers) > 0
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = $1", PROJECT) == 2


async def test_listen_through_a_transaction_pooler_is_reported_once_and_claims_poll(
    bouncer: PgBouncer, start_services: Any, make_key: Any, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="awooop.scheduler.wakeup")
    rt = await start_services("ingest", "scheduler", database_url=bouncer.dsn_for(db_dsn), db_statement_cache=False)
    await eventually(lambda: _true(_gauge("awooop_scheduler_listen_unavailable") == 1), timeout=20, what="the metric")
    lines = [r.getMessage() for r in caplog.records if "delivers no notifications" in r.getMessage()]
    assert len(lines) == 1 and "AWOOOP_DATABASE_DIRECT_URL" in lines[0]
    assert _gauge("awooop_scheduler_listener_connected") == 0
    # claims still find work, by polling
    md = await make_key("w", {PROJECT: ["worker", "ingest"]})
    await ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['ingest']}")).IngestEvent(
        tg_event(PROJECT, 7), metadata=md
    )
    sched = scheduler_pb2_grpc.SchedulerServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['scheduler']}"))
    resp = await sched.ClaimRuns(
        spb.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=1, wait=_dur(10)), metadata=md
    )
    assert len(resp.runs) == 1


async def test_the_statement_cache_behind_a_transaction_pooler_answers_unavailable_and_says_what_to_set(
    start_services: Any, make_key: Any, db_dsn: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    small = start_pgbouncer(db_dsn, pool_size=2)
    pooled = small.dsn_for(db_dsn)
    try:
        caplog.set_level(logging.WARNING, logger="awooop.db")
        store._warned.clear()  # the lines are once per process; this test wants to see them
        # one client connection, used one call at a time: its statements are prepared on the one
        # server connection PgBouncer has opened so far
        rt = await start_services("ingest", database_url=pooled, db_statement_cache=True, db_pool_min=1, db_pool_max=1)
        md = await make_key("hook", {PROJECT: ["ingest"]}, "service")
        ingest = ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['ingest']}"))
        await ingest.IngestEvent(tg_event(PROJECT, 1), metadata=md)
        # the next call gets a fresh server connection, where the cached statement does not
        # exist: what a transaction-mode pooler does all the time (closing the ones open, rather
        # than keeping one busy with another client, which a background query could take first)
        small.admin("RECONNECT")
        tally = Tally()
        for uid in (2, 3):
            try:
                await ingest.IngestEvent(tg_event(PROJECT, uid), metadata=md, timeout=20)
                tally.ok()
            except grpc.aio.AioRpcError as err:
                tally.failed(err)
    finally:
        small.stop()
    assert tally.unexpected() == {}, tally.reasons  # never INTERNAL
    assert tally.codes["UNAVAILABLE"] >= 1, f"no prepared statement error was provoked: {tally.codes}"
    messages = [r.getMessage() for r in caplog.records if r.name == "awooop.db"]
    pooler = [m for m in messages if "AWOOOP_DB_STATEMENT_CACHE=false" in m and "prepared statement" in m]
    assert len(pooler) == 1, messages
    startup = [m for m in messages if "refused a startup parameter" in m]
    assert len(startup) == 1 and "statement_timeout" in startup[0], messages


def test_migrate_and_admin_use_the_direct_url(db_dsn: str) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"  # nothing listens: only the direct URL works
    env = {**os.environ, "AWOOOP_DATABASE_URL": dead, "AWOOOP_DATABASE_DIRECT_URL": db_dsn}
    for args, expect in (
        (["migrate"], "up to date"),
        (["admin", "create-principal", "ops-bot", "--type", "service"], "ready"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "awooop.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert expect in proc.stdout


async def _true(value: bool) -> bool:
    return value


def _dur(seconds: float) -> Any:
    from google.protobuf import duration_pb2

    d = duration_pb2.Duration()
    d.FromSeconds(int(seconds))
    return d
