"""One way to start any service: `awooop serve <name>`, `python -m services.<name>`,
`awooop up` (all of them in one process) and the tests all go through Runtime.

A service package provides `app.build(ctx) -> ServiceParts`: its servicers, the full
names of its gRPC services, its background loops, and optionally the health names of planes
that can fail on their own (NOT_SERVING while that plane cannot work: the saga's compensation
without a key the gateway accepts; its journal stays SERVING). Runtime adds
the rest: one grpc.aio server per service with the interceptor, grpc.health.v1 (per-service status),
server reflection (v1 and v1alpha, with proto comments), optional TLS, Prometheus metrics, and graceful shutdown:

  1. ctx.stopping is set: background loops finish their current pass, long-polls return;
  2. health turns NOT_SERVING (Watch streams get it and end);
  3. AWOOOP_SHUTDOWN_DELAY seconds of still serving, for load balancers to move away;
  4. server.stop(AWOOOP_SHUTDOWN_GRACE): new RPCs are refused, in-flight ones may finish;
  5. background loops are awaited (then cancelled), on_stop closers run, Redis and the
     pool close.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import importlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import grpc
from grpc_health.v1 import health, health_pb2_grpc

from services.common import migrate, reflection, tracing
from services.common.auth import Authenticator
from services.common.cache import Cache
from services.common.db import create_pool
from services.common.health import SERVING, HealthServicer, Readiness
from services.common.interceptor import ServiceInterceptor
from services.common.observability import (
    metrics_serving,
    preset_grpc_metrics,
    setup_logging,
    start_metrics,
)
from services.common.settings import (
    Settings,
    SettingsError,
    deliverability_problem,
    metrics_port_for,
    problems,
    unknown_env,
)

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
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    # closers run after the server stopped
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # gateway-style services that need no API key (errors, metrics and access log still apply)
    public: bool = False
    # an aiohttp web.Application served on AWOOOP_HTTP_PORT (the ingest service's webhooks)
    http_app: Any = None
    # health names of the service's planes that can fail on their own (the saga's compensation), each
    # NOT_SERVING while its verdict names a problem; the service's names and "" stay SERVING: one
    # plane's problem must not take the others out of their load balancers
    planes: dict[str, Readiness] = field(default_factory=dict)


def load_service(name: str) -> Callable[[AppContext], ServiceParts]:
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; one of {', '.join(SERVICES)}")
    module = importlib.import_module(f"services.{name}.app")
    return module.build  # type: ignore[no-any-return]


def pending_limit(max_concurrent_rpcs: int) -> int:
    """gRPC core's queue of calls not yet picked up: far above what the interceptor admits, so
    a burst meets the explicit OVERLOADED answer, not core's silent CANCELLED."""
    return max(65536, 4 * max_concurrent_rpcs)


def listeners(settings: Settings, services: list[str]) -> list[tuple[int, str]]:
    """(port, the setting that chose it) of every socket these services will listen on."""
    out = [(settings.port_of(name), f"AWOOOP_{name.upper()}_PORT") for name in services]
    if "ingest" in services and settings.http_port:  # the ingest service's webhook port
        out.append((settings.http_port, "AWOOOP_HTTP_PORT"))
    if settings.metrics_port and not metrics_serving(settings.metrics_port):
        out.append((settings.metrics_port, "AWOOOP_METRICS_PORT"))
    return out


def port_clash(settings: Settings, services: list[str]) -> str | None:
    """A one-line message for the first port that is taken (or configured twice), else None.
    Checked before anything starts, so a clash costs no store start-up and leaves no half-started
    process; the binds themselves still fail cleanly if a port is taken in between."""
    seen: dict[int, str] = {}
    for port, setting in listeners(settings, services):
        if port in seen:
            return f"port {port} is configured twice ({seen[port]} and {setting}): change one of them"
        seen[port] = setting
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
            try:
                probe.bind((settings.host, port))
            except OSError as exc:
                why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                return f"port {port} on {settings.host or '*'} is {why}: set {setting} to a free port"
    return None


class Runtime:
    def __init__(self, settings: Settings, services: list[str], *, port_zero: bool = False) -> None:
        self.settings = settings
        self.services = list(services)
        self.port_zero = port_zero  # tests: bind ephemeral ports, no metrics endpoint
        self.ports: dict[str, int] = {}
        self.http_ports: dict[str, int] = {}
        self._http_runners: list[Any] = []
        self.servers: dict[str, grpc.aio.Server] = {}
        self.health: dict[str, HealthServicer] = {}
        self.ctx: AppContext | None = None
        self.authenticator: Authenticator | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._service_names: dict[str, list[str]] = {}
        self._stopped = False

    def _server_credentials(self) -> grpc.ServerCredentials | None:
        s = self.settings
        if not (s.tls_cert_file and s.tls_key_file):
            return None
        try:
            with open(s.tls_key_file, "rb") as kf, open(s.tls_cert_file, "rb") as cf:
                return grpc.ssl_server_credentials([(kf.read(), cf.read())])
        except OSError as exc:
            raise SystemExit(f"cannot read the TLS key or certificate: {exc}") from exc

    async def start(self) -> None:
        """Starts every service; on failure stops what was started and re-raises."""
        try:
            await self._start()
        except BaseException:
            await self._close(0)
            raise

    async def _start(self) -> None:
        s = self.settings
        problem = deliverability_problem(s)
        if problem is not None:  # what is accepted must be returnable: refuse to start otherwise
            raise SystemExit(f"configuration error: {problem}")
        credentials = self._server_credentials()  # fail before anything listens
        clash = None if self.port_zero else port_clash(s, self.services)
        if clash:
            raise SystemExit(clash)
        if s.migrate_on_start:
            await migrate.migrate(s.direct_url)
        if not self.port_zero:
            try:
                start_metrics(s.host, s.metrics_port)
            except OSError as exc:
                raise SystemExit(f"port {s.metrics_port} on {s.host}: {exc.strerror}: set AWOOOP_METRICS_PORT") from exc
        # OTEL_* variables (or a provider a test configured); off: no tracing interceptor, no cost
        if tracing.configure_from_env("awooop" if len(self.services) > 1 else f"awooop-{self.services[0]}"):
            log.info("tracing on", extra={"exporter": tracing.exporter_name()})
        pool = await create_pool(s)
        cache = Cache(s)
        await cache.connect()
        self.ctx = AppContext(s, pool, cache)
        authenticator = self.authenticator = Authenticator(pool, s.auth_cache_seconds, s.auth_key_refresh_seconds)
        options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second server on a taken port fails instead of sharing it
            # gRPC core cancels calls silently (CANCELLED, handler never run, nothing logged) once
            # more than 1000 wait to be picked up; the interceptor's limit answers overload instead
            ("grpc.server.max_pending_requests", pending_limit(s.max_concurrent_rpcs)),
            ("grpc.server.max_pending_requests_hard_limit", pending_limit(s.max_concurrent_rpcs)),
        ]
        for name in self.services:
            await self._serve(name, self.ctx, authenticator, credentials, options)

    async def _serve(
        self,
        name: str,
        ctx: AppContext,
        authenticator: Authenticator,
        credentials: grpc.ServerCredentials | None,
        options: list[tuple[str, Any]],
    ) -> None:
        """One service: its gRPC server (interceptors, health, reflection) bound and started, its
        HTTP side and its background loops."""
        s = self.settings
        parts = load_service(name)(ctx)
        interceptor = ServiceInterceptor(
            authenticator, s.access_log, authenticate=not parts.public, max_concurrent_rpcs=s.max_concurrent_rpcs
        )
        # tracing's interceptor (none while off) outside ours: its span covers the whole call
        server = grpc.aio.server(interceptors=[*tracing.server_interceptors(), interceptor], options=options)
        for add, servicer in parts.servicers:
            add(servicer, server)
        preset_grpc_metrics(parts.service_names)
        hs = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(hs, server)
        reflection.enable([*parts.service_names, health.SERVICE_NAME], server)
        port = 0 if self.port_zero else s.port_of(name)
        address = f"{s.host}:{port}"
        try:
            if credentials is not None:
                bound = server.add_secure_port(address, credentials)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's "Failed to bind to address"
            setting = f"AWOOOP_{name.upper()}_PORT"
            raise SystemExit(f"{name}: cannot listen on {address} (in use?): set {setting}: {exc}") from exc
        self.servers[name] = server
        self.health[name] = hs
        self._service_names[name] = parts.service_names
        self._on_stop.extend(parts.on_stop)
        await server.start()
        for svc in [*parts.service_names, ""]:
            await hs.set(svc, SERVING)
        for plane, readiness in parts.planes.items():
            await readiness.attach(hs, [plane])
        self.ports[name] = bound
        if parts.http_app is not None and s.http_port:
            self.http_ports[name] = await self._serve_http(name, parts.http_app)
        for loop in parts.background:
            self._tasks.append(asyncio.create_task(loop(), name=f"{name}:{loop.__name__}"))
        log.info(
            "serving",
            extra={"service": name, "address": f"{s.host}:{bound}", "tls": credentials is not None},
        )

    async def _serve_http(self, name: str, app: Any) -> int:
        from aiohttp import web  # only services with an HTTP side need it loaded

        from services.common import http_log

        runner = web.AppRunner(
            app, access_log=None, logger=http_log.server_logger(), shutdown_timeout=self.settings.shutdown_grace
        )
        await runner.setup()
        self._http_runners.append(runner)
        port = 0 if self.port_zero else self.settings.http_port
        s = self.settings
        ssl_context = None
        if s.tls_cert_file and s.tls_key_file:  # the gRPC ports' certificate: HTTPS only, like them
            import ssl

            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(s.tls_cert_file, s.tls_key_file)
        try:
            await web.TCPSite(runner, s.host, port, ssl_context=ssl_context, reuse_port=False).start()
        except OSError as exc:
            raise SystemExit(f"{name}: cannot listen for HTTP on {s.host}:{port} (in use?): {exc}") from exc
        bound = int(runner.addresses[0][1])
        log.info(
            "serving http", extra={"service": name, "address": f"{s.host}:{bound}", "tls": ssl_context is not None}
        )
        return bound

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown in the order of the module docstring; safe to call twice."""
        await self._close(self.settings.shutdown_grace if grace is None else grace)

    async def _close(self, grace: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.ctx is not None:
            self.ctx.stopping.set()
        # tell load balancers first, then drain
        for hs in self.health.values():
            await hs.enter_graceful_shutdown()
        # watchers get NOT_SERVING and the end of their stream before the server stops
        await asyncio.gather(*(hs.watchers_done(min(grace, 2.0)) for hs in self.health.values()))
        if self.settings.shutdown_delay > 0 and grace > 0 and self.servers:
            await asyncio.sleep(self.settings.shutdown_delay)
        await asyncio.gather(
            *(srv.stop(grace) for srv in self.servers.values()), *(r.cleanup() for r in self._http_runners)
        )
        # loops saw ctx.stopping and end after their current pass; cancel the ones that do not
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=max(grace, 1.0))
            for t in pending:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for closer in self._on_stop:
            try:
                await closer()
            except Exception:
                log.exception("on_stop closer failed")
        tracing.shutdown()  # flushes spans still batched (only a provider configured from OTEL_*)
        if self.ctx is not None:
            await self.ctx.cache.close()
            try:
                await asyncio.wait_for(self.ctx.pool.close(), timeout=max(grace, 1.0))
            except TimeoutError:
                self.ctx.pool.terminate()

    async def run_until_signal(self) -> None:
        """Serves until SIGTERM or SIGINT, then shuts down gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        # What start-up built (modules, protobuf descriptors, the tracing SDK) lives as long as the
        # process: frozen out of the collector's way, a full collection walks only what requests
        # allocate (with tracing on they come ~3x as often: docs/benchmarks.md)
        gc.collect()
        gc.freeze()
        await stop.wait()
        log.info(
            "shutting down",
            extra={"delay_s": self.settings.shutdown_delay, "grace_s": self.settings.shutdown_grace},
        )
        await self.stop()
        log.info("stopped")


def process_settings(settings: Settings | None = None) -> Settings:
    """A server process's first step (the services' and the console's): its settings (from the
    environment unless given; a bad one ends the process with the reason), then logging."""
    try:
        settings = settings or Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
    setup_logging(settings.log_level)
    return settings


def serve(services: list[str], settings: Settings | None = None) -> None:
    """The process entry point of `awooop serve` and `python -m services.<name>`."""
    settings = process_settings(settings)
    if not settings.database_url:
        raise SystemExit("AWOOOP_DATABASE_URL is not set (use `awooop up` for an embedded store)")
    settings = settings.with_(metrics_port=metrics_port_for(settings, services))
    for problem in problems(settings):
        log.warning("configuration: %s", problem)
    for name in unknown_env():
        log.warning("unknown setting %s ignored (see `awooop config`)", name)
    main = Runtime(settings, services).run_until_signal()
    if settings.uvloop:
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
