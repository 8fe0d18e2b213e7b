"""One way to start any service: `awooop serve <name>`, `python -m services.<name>`,
`awooop up` (all of them in one process) and the tests all go through Runtime.

A service package provides `app.build(ctx) -> ServiceParts`: its servicers, the full
names of its gRPC services, and its background loops. Runtime adds the rest: one
grpc.aio server per service with the interceptor, grpc.health.v1 (per-service status),
server reflection, Prometheus metrics, and graceful shutdown (NOT_SERVING first, then
stop with a grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common import migrate
from services.common.auth import Authenticator
from services.common.cache import Cache
from services.common.db import create_pool, store_error
from services.common.interceptor import ServiceInterceptor
from services.common.observability import LOOP_RUNS, setup_logging, start_metrics
from services.common.settings import Settings

log = logging.getLogger("awooop.runtime")

SERVICES = ("ingest", "scheduler", "saga", "gateway")


@dataclass
class AppContext:
    """What a service's logic gets: settings, the store pool, the Redis cache."""

    settings: Settings
    pool: asyncpg.Pool
    cache: Cache
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class ServiceParts:
    # (add_XServicer_to_server function, servicer instance)
    servicers: list[tuple[Callable[[Any, grpc.aio.Server], None], Any]]
    # full names for health and reflection, e.g. "awooop.ingest.v1.IngestService"
    service_names: list[str]
    # background loops: coroutine functions run until shutdown
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # closers run after the server stopped
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # gateway-style services that need no API key
    public: bool = False


def load_service(name: str) -> Callable[[AppContext], ServiceParts]:
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; one of {', '.join(SERVICES)}")
    module = importlib.import_module(f"services.{name}.app")
    return module.build  # type: ignore[no-any-return]


async def periodic(name: str, interval: float, fn: Callable[[], Awaitable[Any]], stopping: asyncio.Event) -> None:
    """Runs fn every interval (with 10 % jitter so replicas spread out) until stopping.
    A failed pass is logged and counted, never fatal."""
    while not stopping.is_set():
        try:
            await fn()
            LOOP_RUNS.labels(name, "ok").inc()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            LOOP_RUNS.labels(name, "error").inc()
            if store_error(exc) is not None:
                log.warning("background loop: store unavailable", extra={"loop": name, "error": repr(exc)})
            else:
                log.exception("background loop failed", extra={"loop": name})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=interval * random.uniform(0.9, 1.1))


class Runtime:
    def __init__(self, settings: Settings, services: list[str], *, port_zero: bool = False) -> None:
        self.settings = settings
        self.services = list(services)
        self.port_zero = port_zero  # tests: bind ephemeral ports
        self.ports: dict[str, int] = {}
        self.servers: dict[str, grpc.aio.Server] = {}
        self.health: dict[str, health.aio.HealthServicer] = {}  # type: ignore[name-defined]
        self.ctx: AppContext | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._service_names: dict[str, list[str]] = {}

    async def start(self) -> None:
        s = self.settings
        if s.migrate_on_start:
            await migrate.migrate(s.database_url)
        pool = await create_pool(s)
        cache = Cache(s)
        self.ctx = AppContext(s, pool, cache)
        authenticator = Authenticator(pool, s.auth_cache_seconds)
        options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        for name in self.services:
            parts = load_service(name)(self.ctx)
            interceptors = [] if parts.public else [ServiceInterceptor(authenticator, s.access_log)]
            server = grpc.aio.server(interceptors=interceptors, options=options)
            for add, servicer in parts.servicers:
                add(servicer, server)
            hs = health.aio.HealthServicer()  # type: ignore[attr-defined]
            health_pb2_grpc.add_HealthServicer_to_server(hs, server)
            reflection.enable_server_reflection(
                [*parts.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
            )
            port = 0 if self.port_zero else s.port_of(name)
            address = f"{s.host}:{port}"
            if s.tls_cert_file and s.tls_key_file:
                with open(s.tls_key_file, "rb") as kf, open(s.tls_cert_file, "rb") as cf:
                    creds = grpc.ssl_server_credentials([(kf.read(), cf.read())])
                bound = server.add_secure_port(address, creds)
            else:
                bound = server.add_insecure_port(address)
            await server.start()
            for svc in [*parts.service_names, ""]:
                await hs.set(svc, health_pb2.HealthCheckResponse.SERVING)
            self.servers[name] = server
            self.health[name] = hs
            self.ports[name] = bound
            self._service_names[name] = parts.service_names
            self._on_stop.extend(parts.on_stop)
            for loop in parts.background:
                self._tasks.append(asyncio.create_task(loop(), name=f"{name}:{loop.__name__}"))
            log.info("serving", extra={"service": name, "address": f"{s.host}:{bound}"})
        if not self.port_zero:
            start_metrics(s.host, s.metrics_port)

    async def stop(self, grace: float | None = None) -> None:
        grace = self.settings.shutdown_grace if grace is None else grace
        assert self.ctx is not None
        self.ctx.stopping.set()
        # tell load balancers first, then drain
        for name, hs in self.health.items():
            for svc in [*self._service_names[name], ""]:
                await hs.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.gather(*(srv.stop(grace) for srv in self.servers.values()))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for closer in self._on_stop:
            with contextlib.suppress(Exception):
                await closer()
        await self.ctx.cache.close()
        await self.ctx.pool.close()

    async def run_until_signal(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down", extra={"grace_s": self.settings.shutdown_grace})
        await self.stop()


def serve(services: list[str], settings: Settings | None = None) -> None:
    settings = settings or Settings.from_env()
    setup_logging(settings.log_level)
    if not settings.database_url:
        raise SystemExit("AWOOOP_DATABASE_URL is not set (use `awooop up` for an embedded store)")
    main = Runtime(settings, services).run_until_signal()
    if settings.uvloop:
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
