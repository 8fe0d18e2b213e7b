"""Test helpers: decoding rich errors, polling with a deadline, and real service processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import grpc

from services.common import errors
from services.common.embedded import free_port
from services.common.health import wait_serving
from services.common.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def reason_of(err: grpc.RpcError) -> str:
    info = errors.error_info(err)
    return info.reason if info else ""


def key_of(md: tuple[tuple[str, str], ...]) -> str:
    """The API key in make_key's metadata."""
    return md[0][1].removeprefix("Bearer ")


async def expect_error(call: Awaitable[Any], code: grpc.StatusCode, reason: str | None = None) -> grpc.aio.AioRpcError:
    """Awaits call, asserts it fails with code (and ErrorInfo reason); returns the error."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()}"
        if reason is not None:
            assert reason_of(err) == reason, f"expected reason {reason}, got {reason_of(err)}: {err.details()}"
        return err
    raise AssertionError(f"expected {code}, call succeeded")


async def eventually(
    check: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Polls check() until it returns a truthy value; fails after timeout. Not a sleep-and-hope:
    the assertion is the condition, the timeout only bounds a failing test."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def lock_waiters(db: asyncpg.Connection) -> int:
    """How many other sessions of db's database wait for a lock (a row or a transaction another
    holds): what a test polls to know a racing statement reached the point it blocks at. The
    activity view is read afresh: inside a transaction Postgres keeps the first read's snapshot of
    it, so a poll from a connection holding the lock the racer waits for saw no waiter, forever."""
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await db.fetchval(
            """SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"""
        )
    )


@dataclass
class ServiceProcess:
    """A real `awooop serve` process, for crash tests."""

    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    log_path: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


async def wait_healthy(port: int, timeout: float = 20.0) -> None:
    if not await wait_serving(f"127.0.0.1:{port}", timeout):
        raise AssertionError(f"service on port {port} not healthy after {timeout}s")


async def spawn_services(
    services: list[str],
    env: dict[str, str],
    tmp_path: Path,
    name: str = "svc",
    fixed: Mapping[str, int] | None = None,
    healthy_within: float = 20.0,
    metrics_port: int = 0,
) -> ServiceProcess:
    """Starts `python -m awooop.cli serve <services>` with AWOOOP_* env; waits until healthy.
    fixed: a service's gRPC port (a restart on the port its clients know); else a free one.
    metrics_port: where the process serves /metrics (0: nowhere)."""
    ports = {s: (fixed or {}).get(s) or free_port() for s in services}
    # the ingest HTTP port defaults to 8080: a child gets a free one unless env names one
    full_env = {**os.environ, "AWOOOP_HTTP_PORT": str(free_port()), **env}
    full_env.update({"AWOOOP_METRICS_PORT": str(metrics_port), "AWOOOP_ACCESS_LOG": "false"})
    for s, p in ports.items():
        full_env[f"AWOOOP_{s.upper()}_PORT"] = str(p)
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awooop.cli", "serve", *services],
            env=full_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    sp = ServiceProcess(proc, ports, log_path)
    try:
        for p in ports.values():
            await wait_healthy(p, healthy_within)
    except AssertionError:
        sp.kill()
        raise AssertionError(f"{services} did not start:\n{sp.log()}") from None
    return sp


def settings_env(settings: Any) -> dict[str, str]:
    """AWOOOP_* variables reproducing a Settings object in a child process."""
    from dataclasses import fields

    out = {}
    for f in fields(settings):
        if f.name == "extra":
            continue
        v = getattr(settings, f.name)
        out[f"AWOOOP_{f.name.upper()}"] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    if settings.http_port:  # never the fixed default in a child: tests run in parallel
        out["AWOOOP_HTTP_PORT"] = str(free_port())
    return out


class WithKey(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if not details.metadata:
            details = details._replace(metadata=grpc.aio.Metadata(*self.metadata))
        return await continuation(details, request)


async def internal_key(dsn: str) -> str:
    """A fresh key of a new service principal with the admin role in every project, made in the
    store at dsn: what AWOOOP_INTERNAL_API_KEY names (without it the saga is NOT_SERVING)."""
    import asyncpg

    from services.common import principals

    conn = await asyncpg.connect(dsn)
    try:
        name = f"internal-{os.urandom(4).hex()}"
        await principals.create_principal(conn, name, "service")
        await principals.grant_role(conn, name, principals.ALL_PROJECTS, "admin")
        return (await principals.issue_key(conn, name)).key
    finally:
        await conn.close()


async def service_key(rt: Any) -> tuple[tuple[str, str], ...]:
    """Call metadata with a fresh key of a service principal holding a role in every project
    (as the saga's AWOOOP_INTERNAL_API_KEY), made in rt's store."""
    from services.common import principals

    name = f"svc-{os.urandom(4).hex()}"
    pool = rt.ctx.pool
    await principals.create_principal(pool, name, "service")
    await principals.grant_role(pool, name, principals.ALL_PROJECTS, "admin")
    issued = await principals.issue_key(pool, name)
    return (("authorization", f"Bearer {issued.key}"),)


def served(method: str, code: str) -> float:
    """grpc_server_handled_total of the in-process servers for '/pkg.Svc/Method' and a status name
    ('UNAVAILABLE')."""
    from prometheus_client import REGISTRY

    from services.common.observability import GRPC_CODE_NAMES, UNARY, split_method

    service, name = split_method(method)
    labels = {
        "grpc_type": UNARY,
        "grpc_service": service,
        "grpc_method": name,
        "grpc_code": GRPC_CODE_NAMES[grpc.StatusCode[code]],
    }
    return REGISTRY.get_sample_value("grpc_server_handled_total", labels) or 0.0


async def start_with_gateway(
    start_services: Callable[..., Awaitable[Runtime]], gateway: Mapping[str, Any] | None = None, **settings: Any
) -> tuple[Runtime, Runtime]:
    """The reference gateway (with the `gateway` settings), then ingest, scheduler and saga, the
    saga compensating through that gateway every 0.2 s unless settings say otherwise. Returns
    (gateway, services); the services' ports name the gateway's too."""
    gw = await start_services("gateway", **(gateway or {}))
    rt = await start_services(
        "ingest",
        "scheduler",
        "saga",
        **{"gateway_addr": f"127.0.0.1:{gw.ports['gateway']}", "compensation_interval": 0.2, **settings},
    )
    rt.ports["gateway"] = gw.ports["gateway"]
    return gw, rt


async def start_with_callbacks(
    start_services: Callable[..., Awaitable[Runtime]], **settings: Any
) -> tuple[Runtime, Runtime, Runtime]:
    """The reference gateway, ingest, then the scheduler and saga issuing durable-wait callback URLs
    on ingest's HTTP address (where the gateway posts a parked tool call's outcome), with quick
    reaps, retries, compensation and wait sweeps unless settings say otherwise. Returns
    (gateway, ingest, scheduler and saga)."""
    gw = await start_services("gateway")
    ing = await start_services("ingest")  # first: its HTTP address is what the callback URLs start with
    rt = await start_services(
        "scheduler",
        "saga",
        **{
            "gateway_addr": f"127.0.0.1:{gw.ports['gateway']}",
            "wait_callback_base_url": f"http://127.0.0.1:{ing.http_ports['ingest']}",
            "reaper_interval": 0.1,
            "retry_backoff": 0.05,
            "compensation_interval": 0.2,
            "wait_sweep_interval": 0.2,
            "auth_cache_seconds": 0,
            **settings,
        },
    )
    return gw, ing, rt
