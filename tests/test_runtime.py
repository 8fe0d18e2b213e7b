"""The service runtime as processes see it: graceful shutdown on SIGTERM, Prometheus
metrics, the JSON access log, `python -m services.<name>`, migrate-on-start, TLS, and the
interceptor's error mapping (UNIMPLEMENTED / INTERNAL / UNAVAILABLE / deadlines)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import errors, migrate, tracing
from services.common.auth import Authenticator, current_principal
from services.common.db import create_pool
from services.common.embedded import free_port
from services.common.interceptor import ServiceInterceptor
from services.common.observability import GRPC_CODE_NAMES
from services.common.runtime import Runtime
from services.common.settings import Settings
from tests.harness.helpers import (
    ROOT,
    eventually,
    expect_error,
    lock_waiters,
    reason_of,
    served,
    settings_env,
    wait_healthy,
)
from tests.harness.tls import self_signed

INGEST = "awooop.ingest.v1.IngestService"
SAGA = "awooop.saga.v1.SagaService"
CREATE_RUN = f"/{INGEST}/CreateRun"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    stderr_path: Path
    port: int

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def wait(self, timeout: float = 30) -> int:
        return await asyncio.to_thread(self.popen.wait, timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


async def spawn(argv: list[str], env: dict[str, str], tmp_path: Path, port: int) -> Proc:
    """A real server process (stderr to a file), once its health answers SERVING."""
    path = tmp_path / f"stderr-{uuid.uuid4().hex[:6]}.log"
    with open(path, "wb") as err:
        popen = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    proc = Proc(popen, path, port)
    try:
        await wait_healthy(port)
    except AssertionError:
        proc.kill()
        raise AssertionError(f"{argv} did not become healthy:\n{proc.stderr()}") from None
    return proc


def child_env(settings: Settings, **overrides: Any) -> tuple[dict[str, str], int]:
    """The environment of a child serving ingest with these settings, and its port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env.update(settings_env(settings.with_(ingest_port=port, metrics_port=0, **overrides)))
    return env, port


@pytest.fixture
def procs() -> Any:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


# ---------------------------------------------------------------- graceful shutdown


async def test_sigterm_turns_health_not_serving_and_drains_in_flight_rpcs(
    settings: Settings, db: asyncpg.Connection, db_dsn: str, make_key, tmp_path: Path, procs: list[Proc]
) -> None:
    md = await make_key("drain", {"p": ["admin"]})
    env, port = child_env(settings, auth_cache_seconds=0, shutdown_grace=20, access_log=True)
    proc = await spawn([sys.executable, "-m", "awooop.cli", "serve", "ingest"], env, tmp_path, port)
    procs.append(proc)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=INGEST))
        assert (await watch.read()).status == SERVING

        # one call first, so the server's pool is connected and the held call below waits on the
        # lock alone (auth_cache_seconds=0: it reads the key again)
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        warm = ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="drain-0")
        await stub.CreateRun(warm, metadata=md, timeout=30)

        # hold the API key table so an authenticated call is in flight inside the server
        tx = db.transaction()
        await tx.start()
        await db.execute("LOCK TABLE awooop_api_key IN ACCESS EXCLUSIVE MODE")
        req = ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="drain-1")
        in_flight = asyncio.ensure_future(stub.CreateRun(req, metadata=md, timeout=60))

        async def blocked() -> int:
            # a call that ended (refused, failed) never blocks: say how, not "timed out"
            assert not in_flight.done(), f"the call ended before it blocked: {in_flight.exception()!r}"
            return await lock_waiters(db)

        await eventually(blocked, timeout=30, what="the in-flight call to wait on the lock")

        proc.popen.send_signal(signal.SIGTERM)
        assert (await watch.read()).status == NOT_SERVING
        assert await watch.read() == grpc.aio.EOF  # the Watch stream ends instead of holding the shutdown
        assert (await watch.code()) == grpc.StatusCode.OK

        # draining: new calls are refused while the in-flight one still runs
        async def refused() -> bool:
            try:
                await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                return False
            except grpc.aio.AioRpcError as err:
                return err.code() == grpc.StatusCode.UNAVAILABLE

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as fresh:
            health = health_pb2_grpc.HealthStub(fresh)
            await eventually(refused, what="new calls to be refused during the drain")
        assert proc.popen.poll() is None, "the process exited with an RPC still in flight"
        assert not in_flight.done()

        await tx.rollback()  # release: the in-flight call completes instead of being cancelled
        try:
            await in_flight
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as err:
            code = err.code()
        # the call reached the handler (authenticated); UNIMPLEMENTED until the ingest RPCs land
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED), code
    assert await proc.wait() == 0, proc.stderr()
    messages = [json.loads(line)["msg"] for line in proc.stderr().splitlines() if line.startswith("{")]
    assert "shutting down" in messages and messages[-1] == "stopped"


async def test_stop_ends_health_watch_streams(start_services, channels) -> None:
    rt = await start_services("ingest", shutdown_grace=30)
    health = health_pb2_grpc.HealthStub(channels(rt.ports["ingest"]))
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
    assert (await watch.read()).status == SERVING
    # read while stopping: grpc.aio's read() on a call that has already ended returns EOF and
    # drops a message still buffered, so a read started after stop() could miss NOT_SERVING
    last = asyncio.ensure_future(watch.read())
    await rt.stop()  # a 30 s grace: only a stream that ends lets this return with OK below
    assert (await last).status == NOT_SERVING
    assert await watch.read() == grpc.aio.EOF
    assert await watch.code() == grpc.StatusCode.OK


async def test_shutdown_delay_keeps_serving_while_health_says_not_serving(start_services, channels) -> None:
    rt = await start_services("ingest", shutdown_delay=3)
    health = health_pb2_grpc.HealthStub(channels(rt.ports["ingest"]))
    stopping = asyncio.ensure_future(rt.stop(5))

    async def answered_not_serving() -> bool:
        # answered at all: the server still serves; NOT_SERVING: load balancers are told to leave
        r = await health.Check(health_pb2.HealthCheckRequest(service=INGEST), timeout=2)
        return r.status == NOT_SERVING

    await eventually(answered_not_serving, what="NOT_SERVING answered during the shutdown delay")
    assert not stopping.done()
    await stopping
    await expect_error(health.Check(health_pb2.HealthCheckRequest(), timeout=2), grpc.StatusCode.UNAVAILABLE)


# ---------------------------------------------------------------- metrics and access log, python -m


async def test_python_m_service_exposes_metrics_and_writes_json_access_log(
    settings: Settings, make_key, tmp_path: Path, procs: list[Proc]
) -> None:
    md = await make_key("metrics", {"p": ["ingest"]})
    metrics_port = free_port()
    env, port = child_env(settings, access_log=True, log_level="DEBUG")  # the access log is written at DEBUG
    env["AWOOOP_METRICS_PORT"] = str(metrics_port)
    proc = await spawn([sys.executable, "-m", "services.ingest"], env, tmp_path, port)
    procs.append(proc)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        for _ in range(3):
            await expect_error(
                stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p")), grpc.StatusCode.UNAUTHENTICATED
            )
        # an authenticated call with a bad field: whatever the handler answers, it is counted by its code
        try:
            await stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="bad project!"), metadata=md)
            authed_code = "OK"
        except grpc.aio.AioRpcError as err:
            authed_code = err.code().name
        assert authed_code in ("INVALID_ARGUMENT", "UNIMPLEMENTED")

    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    )
    counts = {
        (f"/{s.labels['grpc_service']}/{s.labels['grpc_method']}", s.labels["grpc_code"]): s.value
        for fam in text_string_to_metric_families(body)
        if fam.name == "grpc_server_handled"
        for s in fam.samples
        if s.name == "grpc_server_handled_total"
    }
    assert counts[(CREATE_RUN, "Unauthenticated")] == 3
    assert counts[(CREATE_RUN, GRPC_CODE_NAMES[grpc.StatusCode[authed_code]])] == 1
    assert counts[(CREATE_RUN, "Internal")] == 0  # every code of every method exported from the start
    assert "grpc_server_handling_seconds_bucket" in body
    assert "_created" not in body and "awooop_worker_" not in body

    proc.popen.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0, proc.stderr()
    records = [json.loads(line) for line in proc.stderr().splitlines() if line.startswith("{")]
    rpc = [r for r in records if r.get("logger") == "awooop.rpc" and r.get("method") == CREATE_RUN]
    assert [r["code"] for r in rpc] == ["UNAUTHENTICATED"] * 3 + [authed_code]
    for r in rpc:
        assert isinstance(r["ms"], float | int) and r["ms"] >= 0
        assert r["level"] == "debug" and r["peer"].startswith("ipv")
    assert rpc[-1]["principal"] == "metrics" and rpc[0]["principal"] == ""


# ---------------------------------------------------------------- migrate on start


async def test_migrate_on_start_migrates_an_empty_database(
    settings: Settings, pg_server_dsn: str, tmp_path: Path, procs: list[Proc]
) -> None:
    from tests.harness.databases import admin_connection, with_database

    name = f"awooop_mos_{uuid.uuid4().hex[:8]}"
    admin = await admin_connection(pg_server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = with_database(pg_server_dsn, name)
    try:
        env, port = child_env(settings.with_(database_url=dsn), migrate_on_start=True)
        env["AWOOOP_MIGRATE_ON_START"] = "yes"  # any documented spelling of true
        proc = await spawn([sys.executable, "-m", "awooop.cli", "serve", "ingest"], env, tmp_path, port)
        procs.append(proc)
        conn = await asyncpg.connect(dsn)
        try:
            versions = [r["version"] for r in await conn.fetch("SELECT version FROM awooop_schema_migrations")]
            assert sorted(versions) == [m.version for m in migrate.load()]
        finally:
            await conn.close()
        proc.popen.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_serve_refuses_a_setting_that_does_not_parse(settings: Settings, tmp_path: Path) -> None:
    env, _ = child_env(settings)
    env["AWOOOP_LEASE_TTL"] = "five minutes"
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "awooop.cli", "serve", "ingest"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "AWOOOP_LEASE_TTL='five minutes' is not a valid float" in out.stderr


async def test_port_in_use_is_a_clear_error_and_nothing_stays_up(settings: Settings) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        free = free_port()
        rt = Runtime(settings.with_(ingest_port=free, scheduler_port=taken), ["ingest", "scheduler"])
        # found before anything listens, with the setting to change
        expected = f"port {taken} on 127.0.0.1 is in use: set AWOOOP_SCHEDULER_PORT to a free port"
        with pytest.raises(SystemExit, match=expected):
            await rt.start()
    # the ingest server never stayed up
    async with grpc.aio.insecure_channel(f"127.0.0.1:{free}") as ch:
        await expect_error(
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2),
            grpc.StatusCode.UNAVAILABLE,
        )


# ---------------------------------------------------------------- TLS


async def test_tls_serves_only_secure_channels(start_services, make_key, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    rt = await start_services("ingest", tls_cert_file=str(cert), tls_key_file=str(key))
    port = rt.ports["ingest"]
    md = await make_key("tls", {"p": ["admin"]})
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=INGEST))
        assert r.status == SERVING
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        await expect_error(stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p")), grpc.StatusCode.UNAUTHENTICATED)
        try:
            await stub.CreateRun(ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="t1"), metadata=md)
        except grpc.aio.AioRpcError as err:  # until the ingest RPCs land
            assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plain:
        await expect_error(
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5),
            grpc.StatusCode.UNAVAILABLE,
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "awooop.cli", "health", *args], capture_output=True, text=True, timeout=60
        )

    # the HTTP port serves TLS with the same certificate, and nothing in plaintext
    url = f"https://localhost:{rt.http_ports['ingest']}/v1/webhooks/p/telegram/none"
    trusted = ssl.create_default_context(cafile=str(cert))
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=b"{}", ssl=trusted) as r:
            assert r.status == 404  # answered over TLS: no such endpoint
        with pytest.raises(aiohttp.ClientError):
            async with http.post(url.replace("https:", "http:"), data=b"{}") as r:
                await r.read()

    ok = await asyncio.to_thread(cli, f"127.0.0.1:{port}", "--tls", "--ca-file", str(cert), "--service", "ingest")
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stderr
    no_tls = await asyncio.to_thread(cli, f"127.0.0.1:{port}", "--timeout", "2")
    assert no_tls.returncode == 1 and "unreachable" in no_tls.stderr

    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    out = await asyncio.to_thread(
        subprocess.run,
        [grpcurl, "-cacert", str(cert), f"localhost:{port}", "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and INGEST in out.stdout.split(), out.stderr


# ---------------------------------------------------------------- the interceptor's answers


class Probe(ingest_pb2_grpc.IngestServiceServicer):
    """IngestEvent sleeps (deadlines), IngestEvents fails like a bug or a dead store by its
    project_id; CreateRun is the generated base: not implemented."""

    async def IngestEvent(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        current_principal()  # the interceptor authenticated the caller before this runs
        await asyncio.sleep(30)
        return ingest_pb2.IngestEventResponse()

    async def IngestEvents(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.events[0].project_id == "store":
            raise ConnectionRefusedError("connection refused")
        raise KeyError("secret internals")


@pytest.fixture
async def probe(settings: Settings) -> AsyncIterator[tuple[grpc.aio.Channel, int]]:
    """A real server with the interceptor and the Probe servicer (plus reflection, for grpcurl),
    and tracing's interceptor before it as the runtime installs it (none while tracing is off)."""
    from grpc_reflection.v1alpha import reflection

    pool = await create_pool(settings)
    interceptors = [*tracing.server_interceptors(), ServiceInterceptor(Authenticator(pool, 0), access_log=False)]
    server = grpc.aio.server(interceptors=interceptors)
    ingest_pb2_grpc.add_IngestServiceServicer_to_server(Probe(), server)
    reflection.enable_server_reflection([INGEST, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch, port
    await server.stop(0)
    await pool.close()


def _counter(method: str, code: str) -> float:
    return served(method, code)


async def test_unimplemented_method_answers_unimplemented_with_error_info(probe, make_key) -> None:
    ch, port = probe
    md = await make_key("impl", {"p": ["admin"]})
    before = _counter(CREATE_RUN, "UNIMPLEMENTED")
    err = await expect_error(
        ingest_pb2_grpc.IngestServiceStub(ch).CreateRun(ingest_pb2.CreateRunRequest(project_id="p"), metadata=md),
        grpc.StatusCode.UNIMPLEMENTED,
        "UNIMPLEMENTED",
    )
    assert errors.error_info(err).domain == "awooop"  # type: ignore[union-attr]
    assert _counter(CREATE_RUN, "UNIMPLEMENTED") == before + 1
    # and as grpcurl shows it, with the ErrorInfo detail
    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    argv = [grpcurl, "-plaintext", "-format-error", "-H", f"authorization: {md[0][1]}", "-d", '{"project_id":"p"}']
    out = await asyncio.to_thread(
        subprocess.run,
        [*argv, f"127.0.0.1:{port}", f"{INGEST}/CreateRun"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    shown = json.loads(out.stdout or out.stderr)
    assert out.returncode != 0 and shown["code"] == grpc.StatusCode.UNIMPLEMENTED.value[0], out
    assert shown["details"][0]["reason"] == "UNIMPLEMENTED" and shown["details"][0]["domain"] == "awooop"


async def test_a_bug_is_internal_without_leaking_and_a_dead_store_is_unavailable(probe, make_key) -> None:
    ch, _ = probe
    md = await make_key("bug", {"p": ["admin"]})
    stub = ingest_pb2_grpc.IngestServiceStub(ch)

    def batch(project: str) -> ingest_pb2.IngestEventsRequest:
        return ingest_pb2.IngestEventsRequest(events=[ingest_pb2.IngestEventRequest(project_id=project)])

    err = await expect_error(stub.IngestEvents(batch("p"), metadata=md), grpc.StatusCode.INTERNAL, "INTERNAL")
    assert "secret internals" not in (err.details() or "")
    await expect_error(stub.IngestEvents(batch("store"), metadata=md), grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")


@pytest.fixture
def traced() -> Iterator[Any]:
    """Tracing on, spans kept in memory (before `probe`: its server gets tracing's interceptor)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.configure(provider)
    try:
        yield memory
    finally:
        tracing.configure(None)


async def test_with_tracing_on_a_bug_s_span_records_it_and_has_ended_when_the_caller_holds_the_answer(
    traced, probe, make_key
) -> None:
    from opentelemetry.trace import StatusCode

    memory = traced
    ch, _ = probe
    md = await make_key("traced-bug", {"p": ["admin"]})
    stub = ingest_pb2_grpc.IngestServiceStub(ch)
    for project, code in (("p", grpc.StatusCode.INTERNAL), ("store", grpc.StatusCode.UNAVAILABLE)):
        request = ingest_pb2.IngestEventsRequest(events=[ingest_pb2.IngestEventRequest(project_id=project)])
        with pytest.raises(grpc.aio.AioRpcError) as answered:
            await stub.IngestEvents(request, metadata=md)
        assert answered.value.code() == code

        # the span ends as grpc's abort returns, just after the status was sent
        async def ended() -> Any:
            return memory.get_finished_spans()

        (span,) = await eventually(ended, what="the call's server span")
        memory.clear()
        assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] == code.value[0]
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == f"{code}:{answered.value.details()}"
        # beside grpc's AbortError (the instrumentation records the abort that answers the call)
        raised = [e.attributes["exception.type"] for e in span.events if e.attributes and e.name == "exception"]
        if code is grpc.StatusCode.INTERNAL:  # a bug: its exception is on the span, not in the answer
            assert raised[0] == "KeyError" and "secret internals" not in (answered.value.details() or "")
        else:  # an outage answered as such is no unhandled exception
            assert "KeyError" not in raised


async def test_deadline_is_reported_as_deadline_exceeded(probe, make_key) -> None:
    ch, _ = probe
    md = await make_key("slow", {"p": ["admin"]})
    method = f"/{INGEST}/IngestEvent"
    before = _counter(method, "DEADLINE_EXCEEDED")
    await expect_error(
        ingest_pb2_grpc.IngestServiceStub(ch).IngestEvent(ingest_pb2.IngestEventRequest(), metadata=md, timeout=0.3),
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    await eventually(
        lambda: asyncio.sleep(0, _counter(method, "DEADLINE_EXCEEDED") == before + 1),
        what="the server to count the call as DEADLINE_EXCEEDED",
    )


async def test_unauthenticated_never_reaches_the_handler(probe) -> None:
    ch, _ = probe
    err = await expect_error(
        ingest_pb2_grpc.IngestServiceStub(ch).IngestEvent(ingest_pb2.IngestEventRequest(), timeout=5),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    assert reason_of(err) == "UNAUTHENTICATED"  # answered at once, not after the handler's 30 s sleep


async def test_with_tls_the_saga_compensates_through_the_gateway_over_tls(
    start_services, db, make_key, tmp_path: Path
) -> None:
    """Every service serves TLS: the saga's key check and compensation calls to the gateway use it too."""
    cert, key = self_signed(tmp_path)
    tls = {"tls_cert_file": str(cert), "tls_key_file": str(key)}
    gateway = await start_services("gateway", **tls)
    saga = await start_services(
        "saga", gateway_addr=f"localhost:{gateway.ports['gateway']}", compensation_interval=0.2, **tls
    )
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ('p', 'api', 3)")
    run_id = await db.fetchval(
        """INSERT INTO awooop_run_state (project_id, channel_type, status, attempt_count, failure_reason)
           VALUES ('p', 'api', 'FAILED', 1, 'boom') RETURNING run_id"""
    )
    await db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, status,
                                         compensation_cmd, attempt, completed_at)
           VALUES ($1, 'scale', 'p', 1, 'tool_call', 'k8s_scale_deployment', 'completed',
                   '{"tool_id": "k8s_scale_deployment", "params": {"deployment": "api", "replicas": 1}}', 1, now());
           INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
           VALUES ($1, 'p', 'step_failed', 'boom')""".replace("$1", f"'{run_id}'")  # two statements: no params
    )

    async def compensated() -> bool:
        return bool(await db.fetchval("SELECT status = 'compensated' FROM awooop_saga_step WHERE run_id = $1", run_id))

    await eventually(compensated, timeout=30, what="the step compensated through the TLS gateway")
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 1
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{saga.ports['saga']}", creds) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SAGA))
        assert r.status == SERVING  # its key check reached the gateway
