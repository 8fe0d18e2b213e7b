"""The console's aiohttp application and server: routes, the middlewares every request
passes (security headers, session, CSRF, mapping of service errors to pages), and the
`awooop serve console` entry point.

Middleware order (outermost first): headers on every answer; service errors become pages;
the session cookie is resolved; every POST is checked for CSRF before any handler runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import asyncpg
import jinja2
from aiohttp import web

from awooop.cli.client import when
from awooop.worker.errors import AwooopError
from services.common import http_log
from services.common.db import create_pool
from services.common.observability import start_metrics
from services.common.settings import Settings
from services.console import security
from services.console.backend import Backend
from services.console.debounce_views import DebounceViews
from services.console.sessions import SessionStore
from services.console.throttle import SigninThrottle
from services.console.views import SESSION, TOKEN, Console

log = logging.getLogger("awooop.console")
HERE = Path(__file__).resolve().parent
PRUNE_INTERVAL = 3600.0

# service answers -> HTTP status of the page that explains them
HTTP_STATUS = {
    "NOT_FOUND": 404,
    "PERMISSION_DENIED": 403,
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 409,
    "ALREADY_EXISTS": 409,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

CONSOLE_KEY = web.AppKey("console", Console)


def error_title(err: AwooopError) -> str:
    """A service error's page title: the code, and the reason when it says more (not `NOT_FOUND NOT_FOUND`)."""
    words = err.code.name.replace("_", " ").capitalize()
    return words if err.reason in ("", err.code.name) else f"{words} ({err.reason})"


def templates() -> jinja2.Environment:
    # autoescape everything: payloads are provider JSON, i.e. attacker-controlled text
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["when"] = when
    env.globals["with_param"] = with_param
    return env


def with_param(query: Mapping[str, str], name: str, value: object) -> str:
    """This page's query string with one parameter changed (pagers keep the other page's place)."""
    return "?" + urlencode([*((k, v) for k, v in query.items() if k not in (name, "msg")), (name, str(value))])


def make_app(console: Console) -> web.Application:
    app = web.Application(
        middlewares=[security.security_headers, _service_errors, _session, _csrf], client_max_size=64 * 1024
    )
    app[CONSOLE_KEY] = console
    c = console
    app.router.add_get("/", c.home)
    app.router.add_get("/signin", c.signin_form)
    app.router.add_post("/signin", c.signin)
    app.router.add_post("/signout", c.signout)
    app.router.add_get("/projects/{project}/runs", c.runs)
    app.router.add_get("/projects/{project}/approvals", c.approvals)
    app.router.add_get("/projects/{project}/compensations", c.compensations)
    app.router.add_get("/projects/{project}/schedules", c.schedules)
    app.router.add_get("/projects/{project}/workers", c.workers)
    app.router.add_post("/projects/{project}/schedules/delete", c.unschedule)
    debounce = DebounceViews(c)
    app.router.add_get("/projects/{project}/debounce", debounce.page)
    app.router.add_post("/projects/{project}/debounce", debounce.set_rule)
    app.router.add_post("/projects/{project}/debounce/delete", debounce.delete_rule)
    app.router.add_get("/runs/{run_id}", c.run)
    app.router.add_post("/runs/{run_id}/decide", c.decide)
    app.router.add_post("/runs/{run_id}/cancel", c.cancel)
    app.router.add_post("/runs/{run_id}/waits/{wait_id}/{end:complete|expire}", c.end_wait)
    app.router.add_post("/runs/{run_id}/compensation/retry", c.retry)
    app.router.add_post("/runs/{run_id}/compensation/resolve", c.resolve)
    app.router.add_get("/approvals/{run_id}/{token}", c.approval_link)
    app.router.add_post("/approvals/{run_id}/{token}", c.approval_link_post)
    app.router.add_get("/healthz", _healthz)
    app.router.add_static("/static", HERE / "static", show_index=False)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


@web.middleware
async def _session(request: web.Request, handler: security.Handler) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    token = request.cookies.get(security.SESSION_COOKIE, "")
    request[TOKEN] = token
    session = await console.sessions.get(token) if token else None
    if session is not None:
        request[SESSION] = session
    return await handler(request)


@web.middleware
async def _csrf(request: web.Request, handler: security.Handler) -> web.StreamResponse:
    if request.method != "POST":
        return await handler(request)
    if not security.same_origin(request):
        raise web.HTTPForbidden(text="cross-origin form post refused")
    try:  # read here first, so a form that does not decode is refused before any handler
        form = await request.post()
    except ValueError:  # UnicodeDecodeError: bytes that are not UTF-8
        raise web.HTTPBadRequest(text="the form is not valid UTF-8") from None
    given = str(form.get("csrf", ""))
    if request.path == "/signin":
        expected = request.cookies.get(security.SIGNIN_COOKIE, "")
    else:
        session = request.get(SESSION)
        if session is None:
            raise web.HTTPSeeOther("/signin?msg=expired")
        expected = session.csrf
    if not security.tokens_match(given, expected):
        raise web.HTTPForbidden(text="missing or wrong CSRF token: reload the page and try again")
    return await handler(request)


@web.middleware
async def _service_errors(request: web.Request, handler: security.Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AwooopError as err:
        console = request.app[CONSOLE_KEY]
        if err.code.name == "UNAUTHENTICATED":  # the key was revoked since sign-in: end the session
            await console.sessions.revoke(request.get(TOKEN, ""))
            response = web.HTTPSeeOther("/signin?msg=expired")
            response.del_cookie(security.SESSION_COOKIE, path="/")
            raise response from None
        status = HTTP_STATUS.get(err.code.name, 502)
        return console.render(
            request,
            "message.html",
            status=status,
            title=error_title(err),
            text=err.details.message,
            run_id="",
        )


# --- the server ----------------------------------------------------------------------------------


@dataclass
class ConsoleServer:
    """The console on host:port (0: an ephemeral port, for tests); start() returns the port."""

    settings: Settings
    scheduler_addr: str
    saga_addr: str
    pool: asyncpg.Pool | None = None
    port: int = 0
    _runner: web.AppRunner | None = None
    _backend: Backend | None = None
    _own_pool: bool = False
    _pruner: asyncio.Task[None] | None = None

    @property
    def tls(self) -> bool:
        return bool(self.settings.tls_cert_file and self.settings.tls_key_file)

    @property
    def url(self) -> str:
        from awooop.worker.client import client_host

        return f"{'https' if self.tls else 'http'}://{client_host(self.settings.host)}:{self.port}"

    async def start(self, port: int | None = None) -> int:
        s = self.settings
        if self.pool is None:
            self.pool = await create_pool(s)
            self._own_pool = True
        sessions = SessionStore(self.pool, s.console_session_ttl)
        # the services serve TLS with this certificate: trust it as the CA when calling them
        self._backend = Backend(self.scheduler_addr, self.saga_addr, ca_file=s.tls_cert_file if self.tls else "")
        throttle = SigninThrottle(s.console_signin_max_failures, s.console_signin_window)
        console = Console(
            templates(),
            sessions,
            self._backend,
            trace_url=s.console_trace_url,
            secure=s.console_secure_cookie,
            throttle=throttle,
        )
        self._runner = web.AppRunner(make_app(console), access_log=None, logger=http_log.server_logger())
        await self._runner.setup()
        context = None
        if self.tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(s.tls_cert_file, s.tls_key_file)
        site = web.TCPSite(
            self._runner, s.host, s.console_port if port is None else port, ssl_context=context, reuse_port=False
        )
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise SystemExit(f"console: cannot listen on {s.host}:{s.console_port} (in use?): {exc}") from exc
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        self._pruner = asyncio.create_task(self._prune(sessions), name="console:prune-sessions")
        log.info("serving", extra={"service": "console", "address": f"{s.host}:{self.port}", "tls": self.tls})
        return self.port

    async def _prune(self, sessions: SessionStore) -> None:
        while True:
            try:
                await sessions.prune()
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("console: pruning sessions failed", extra={"error": repr(exc)})
            await asyncio.sleep(PRUNE_INTERVAL)

    async def stop(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        if self._runner is not None:
            await self._runner.cleanup()
        if self._backend is not None:
            await self._backend.close()
        if self._own_pool and self.pool is not None:
            await self.pool.close()


async def run_until_signal(settings: Settings, others: list[str]) -> None:
    """`awooop serve console [services...]`: the console (and any gRPC services named with it)
    until SIGTERM or SIGINT."""
    from services.common.runtime import Runtime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = Runtime(settings, others) if others else None
    if runtime is not None:
        await runtime.start()  # serves /metrics for the whole process
    else:
        try:
            start_metrics(settings.host, settings.metrics_port)
        except OSError as exc:
            raise SystemExit(
                f"port {settings.metrics_port} on {settings.host}: {exc.strerror}: set AWOOOP_METRICS_PORT"
            ) from exc
    console = ConsoleServer(settings, settings.console_scheduler_addr, settings.console_saga_addr)
    try:
        await console.start()
        await stop.wait()
    finally:
        await console.stop()
        if runtime is not None:
            await runtime.stop()


def serve(others: list[str] | None = None, settings: Settings | None = None) -> None:
    from services.common import migrate
    from services.common.runtime import process_settings

    settings = process_settings(settings)
    if not settings.database_url:
        raise SystemExit("AWOOOP_DATABASE_URL is not set: the console keeps its sessions in Postgres")
    if settings.migrate_on_start and not others:
        asyncio.run(migrate.migrate(settings.database_url))
    asyncio.run(run_until_signal(settings, others or []))
