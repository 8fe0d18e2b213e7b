"""Server-side commands: serve, up, migrate, config. Service code is imported lazily: the client
command loads this module (an `awooop.cli_commands` entry point) for every command it runs."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from awooop.worker.client import client_host, local_address

if TYPE_CHECKING:  # service code is imported lazily, where it is used
    from services.common.runtime import Runtime
    from services.console.app import ConsoleServer

SERVICE_CHOICES = ("ingest", "scheduler", "saga", "gateway", "console")
UP_SERVICES = ["ingest", "scheduler", "saga", "gateway"]
SERVICE_NAMES = {
    "ingest": "awooop.ingest.v1.IngestService",
    "scheduler": "awooop.scheduler.v1.SchedulerService",
    "saga": "awooop.saga.v1.SagaService",
    "gateway": "awooop.tools.v1.ToolGatewayService",
}
DEV_KEY_FILE = "dev-admin.key"
ENV_FILE = "up.env"  # the banner's export lines, for `source` in another terminal
INTERNAL_KEY_FILE = "internal-api-key"  # the internal service key (awooop admin ensure-service-key)


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve one or more services (settings from AWOOOP_* variables)")
    p.add_argument("services", nargs="+", choices=SERVICE_CHOICES)
    p.add_argument("--migrate", action="store_true", help="apply migrations before serving")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("migrate", help="apply pending migrations to AWOOOP_DATABASE_URL")
    p.add_argument("--database-url", default=None)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "up",
        help="run the whole suite in one process, on the configured Postgres/Redis or embedded ones",
    )
    p.add_argument(
        "--data-dir",
        default=os.environ.get("AWOOOP_DATA_DIR") or ".awooop",
        help="where the embedded Postgres and Redis and the dev admin key live (default .awooop; AWOOOP_DATA_DIR)",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "config", help="list every AWOOOP_* setting: its value here and where it came from (secrets masked)"
    )
    p.add_argument("--markdown", action="store_true", help="print docs/configuration.md (with meanings)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_config)


def _settings() -> Any:
    from services.common.settings import Settings, SettingsError

    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"configuration error: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from services.common.runtime import serve

    settings = _settings()
    if args.migrate:
        settings = settings.with_(migrate_on_start=True)
    services = list(dict.fromkeys(args.services))
    if "console" in services:  # HTTP, not a gRPC service: served beside the others named with it
        from services.console.app import serve as serve_console

        serve_console([s for s in services if s != "console"], settings)
        return 0
    serve(services, settings)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from services.common import migrate

    dsn = args.database_url or _settings().direct_url
    if not dsn:
        print("AWOOOP_DATABASE_URL is not set (or pass --database-url)", file=sys.stderr)
        return 2
    try:
        applied = asyncio.run(migrate.migrate(dsn))
    except (OSError, TimeoutError) as exc:
        print(f"cannot reach the store: {exc}", file=sys.stderr)
        return 1
    print("applied: " + ", ".join(applied) if applied else "up to date")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Each setting as this environment configures it, where it came from, and what a command
    changes on top (`awooop up`'s development defaults, a one-service process's metrics port)."""
    from services.common.settings import SERVICE_METRICS_PORTS, SettingsError, effective, markdown

    if args.markdown:
        print(markdown(), end="")
        return 0
    try:
        settings = effective()
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 1
    ports = ", ".join(f"{port} {service}" for service, port in SERVICE_METRICS_PORTS.items())
    notes = {f"AWOOOP_{k.upper()}": f"`awooop up` uses {v:g}" for k, v in DEV_DEFAULTS.items()}
    notes["AWOOOP_METRICS_PORT"] = f"a process serving one service uses its own: {ports}"
    if args.json:
        print(
            json.dumps(
                {
                    "settings": [
                        {"name": e.name, "value": e.value, "source": e.source}
                        | ({"note": notes[e.name]} if e.source == "default" and e.name in notes else {})
                        for e in settings
                    ]
                },
                indent=2,
            )
        )
        return 0
    for e in settings:
        note = f"; {notes[e.name]}" if e.source == "default" and e.name in notes else ""
        print(f"{e.name}={e.text()}  # {e.source}{note}")
    return 0


async def _dev_store(dsn: str, key_file: Path) -> str:
    """The development store's first contents: the dev admin key (returned) and the demo
    project's `api` deployment in the reference gateway, which the README's worker scales."""
    import asyncpg

    from services.gateway.seed import seed_demo

    conn = await asyncpg.connect(dsn)
    try:
        key = await _dev_key(conn, key_file)
        await seed_demo(conn)
        return key
    finally:
        await conn.close()


async def _internal_key(dsn: str, key_file: Path) -> str:
    """The internal service key kept in the data dir, re-issued when missing or no longer valid."""
    import asyncpg

    from services.cli.admin import ensure_key_file
    from services.common.principals import INTERNAL_PRINCIPAL

    conn = await asyncpg.connect(dsn)
    try:
        key, _ = await ensure_key_file(conn, key_file, INTERNAL_PRINCIPAL)
        return key
    finally:
        await conn.close()


async def _dev_key(conn: Any, key_file: Path) -> str:
    """The dev admin key kept in the data dir, re-issued when missing or revoked."""
    from services.common.principals import bootstrap_admin, parse_key

    if key_file.exists():
        key = key_file.read_text().strip()
        parsed = parse_key(key)
        if parsed and await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM awooop_api_key WHERE key_id = $1 AND revoked_at IS NULL)", parsed[0]
        ):
            return key
    issued = await bootstrap_admin(conn)
    key_file.write_text(issued.key + "\n")
    key_file.chmod(0o600)
    return issued.key


def _terminate_on_sigterm(signum: int, frame: Any) -> None:
    # before the event loop owns the signals: unwind through `finally` so the embedded
    # Postgres and Redis are stopped, not orphaned
    raise SystemExit(128 + signum)


def _embedded_stores(settings: Any, data_dir: Path, stoppers: list[Callable[[], None]]) -> tuple[Any, str, str]:
    """An embedded Postgres and Redis under data_dir for what settings leave unset (each one's
    stop added to stoppers): the settings naming them, and how the banner describes each."""
    from services.common import embedded

    store = redis = "configured"
    if not settings.database_url:
        pg = embedded.start_postgres(data_dir / "postgres")
        stoppers.append(pg.stop)
        settings = settings.with_(database_url=pg.dsn)
        store = f"embedded, {data_dir / 'postgres'}"
    if not settings.redis_url:
        rd = embedded.start_redis(data_dir / "redis")
        stoppers.append(rd.stop)
        settings = settings.with_(redis_url=rd.url)
        redis = "embedded"
    return settings, store, redis


async def _serve_up(
    runtime: Runtime,
    console: ConsoleServer,
    settings: Any,
    env_path: Path,
    key: str,
    banner_text: Callable[..., str],
) -> None:
    """Serves the suite and the console until SIGTERM or SIGINT; the banner printed once all listen."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runtime.start()
    try:
        await console.start()
    except BaseException:
        await runtime.stop()
        raise
    env_file = write_env_file(env_path, settings, key)
    print(banner_text(settings, console=console.url, env=env_file), flush=True)
    await stop.wait()
    logging.getLogger("awooop.up").info("shutting down")
    await console.stop()
    await runtime.stop()


def cmd_up(args: argparse.Namespace) -> int:
    from services.common import migrate
    from services.common.observability import setup_logging
    from services.common.runtime import Runtime, port_clash
    from services.console.app import ConsoleServer

    settings = _dev_defaults(_settings())
    clash = port_clash(settings, [*UP_SERVICES, "console"])
    if clash:  # before the embedded stores start: one line, nothing to clean up
        print(f"error: {clash}", file=sys.stderr)
        return 1
    setup_logging(settings.log_level)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _terminate_on_sigterm)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stoppers: list[Callable[[], None]] = []
    try:
        settings, store, redis = _embedded_stores(settings, data_dir, stoppers)
        try:
            applied = asyncio.run(migrate.migrate(settings.database_url))
            key = asyncio.run(_dev_store(settings.database_url, data_dir / DEV_KEY_FILE))
            # the saga's key at the gateway (and the scheduler's at the saga), unless one is configured
            internal = settings.internal_api_key or asyncio.run(
                _internal_key(settings.database_url, data_dir / INTERNAL_KEY_FILE)
            )
        except (OSError, TimeoutError) as exc:
            print(f"cannot reach the store at {settings.database_url}: {exc}", file=sys.stderr)
            return 1
        local = client_host(settings.host)
        # in this mode the scheduler reaches the saga, and the saga the gateway, in this process
        settings = settings.with_(
            internal_api_key=internal,
            saga_addr=settings.saga_addr or f"{local}:{settings.saga_port}",
            gateway_addr=f"{local}:{settings.gateway_port}",
            scheduler_addr=f"{local}:{settings.scheduler_port}",  # ingest's run streams relay to its own
            wait_callback_base_url=settings.wait_callback_base_url or http_base(settings),
        )
        runtime = Runtime(settings, UP_SERVICES)
        console = ConsoleServer(settings, f"{local}:{settings.scheduler_port}", f"{local}:{settings.saga_port}")
        banner_text = functools.partial(banner, key=key, store=store, redis=redis, migrated=applied)
        asyncio.run(_serve_up(runtime, console, settings, data_dir / ENV_FILE, key, banner_text))
    except KeyboardInterrupt:
        pass
    finally:
        # a second Ctrl-C or SIGTERM must not cut the embedded stores' shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stop in reversed(stoppers):
            stop()
    return 0


def redact(url: str) -> str:
    """url without its password, for printing."""
    from urllib.parse import urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def grpcurl_target(settings: Any) -> str:
    """grpcurl's transport flags for these settings: -plaintext, or the server's own cert as CA."""
    if settings.tls_cert_file and settings.tls_key_file:
        return f"-cacert {Path(settings.tls_cert_file).resolve()}"
    return "-plaintext"


# `awooop up` is the development mode: the reaper passes every 2 s instead of 60 s so a crashed
# worker's run comes back within seconds (the demo shows it). An AWOOOP_* variable still wins.
DEV_DEFAULTS = {"reaper_interval": 2.0}


def _dev_defaults(settings: Any) -> Any:
    unset = {k: v for k, v in DEV_DEFAULTS.items() if f"AWOOOP_{k.upper()}" not in os.environ}
    return settings.with_(**unset)


def http_base(settings: Any) -> str:
    """ingest's HTTP address as a local client reaches it ("" when HTTP is off): in `awooop up` the
    start of every durable wait's callback URL, unless AWOOOP_WAIT_CALLBACK_BASE_URL says otherwise."""
    if not settings.http_port:
        return ""
    scheme = "https" if settings.tls_cert_file and settings.tls_key_file else "http"
    return f"{scheme}://{local_address(settings.host, settings.http_port)}"


def client_exports(settings: Any, key: str, *, with_password: bool = False) -> list[str]:
    """The shell lines that give a second terminal what this process knows: the venv's programs
    (awooop, grpcurl, python) on PATH, the key, the store for `awooop admin`, and the listeners
    the CLI and SDK would not guess (a host or ports other than the defaults), as the settings they
    read: AWOOOP_HOST and AWOOOP_<SERVICE>_PORT, AWOOOP_HTTP_PORT. A store password is printed only
    with_password (the env file, readable by its owner alone, like the key file beside it)."""
    from services.common.settings import Settings

    lines = [
        f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
        f"export AWOOOP_API_KEY={key}",
    ]
    if urlsplit(settings.database_url).password and not with_password:  # the URL you gave has it
        lines.append(f"export AWOOOP_DATABASE_URL=...  # yours, with its password: {redact(settings.database_url)}")
    else:
        lines.append(f"export AWOOOP_DATABASE_URL={shlex.quote(settings.database_url)}")
    defaults = Settings()
    if client_host(settings.host) != defaults.host:  # the address a client dials (0.0.0.0: loopback)
        lines.append(f"export AWOOOP_HOST={shlex.quote(client_host(settings.host))}")
    for name in [*UP_SERVICES, "http"]:
        port = getattr(settings, f"{name}_port")
        if port != getattr(defaults, f"{name}_port"):
            lines.append(f"export AWOOOP_{name.upper()}_PORT={port}")
    return lines


def write_env_file(path: Path, settings: Any, key: str) -> Path:
    """The banner's export lines as a file a shell can `source` (mode 0600: it holds the key)."""
    text = "# written by `awooop up`: source it in another terminal\n"
    text += "\n".join(client_exports(settings, key, with_password=True)) + "\n"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)
    return path


def banner(
    settings: Any,
    key: str,
    *,
    store: str,
    redis: str,
    migrated: list[str],
    console: str = "",
    env: Path | None = None,
) -> str:
    """What `awooop up` prints once every service is SERVING; the grpcurl lines work when pasted."""
    from services.common.migrate import summary

    h = client_host(settings.host)
    flags = grpcurl_target(settings)
    ingest = f"{h}:{settings.ingest_port}"
    rows = [f"  {name:<10} {h}:{settings.port_of(name):<6} {SERVICE_NAMES[name]}" for name in UP_SERVICES]
    lines = [
        "",
        "awooop is up.",
        *rows,
    ]
    if console:
        lines.append(f"  {'console':<10} {console}  (sign in with the dev admin key below; AWOOOP_CONSOLE_PORT)")
    if settings.metrics_port:
        lines.append(f"  {'metrics':<10} http://{h}:{settings.metrics_port}/metrics")
    if settings.http_port:
        lines.append(f"  {'webhooks':<10} http://{h}:{settings.http_port}/v1/webhooks/... (awooop channels add)")
    if settings.wait_callback_base_url:
        lines.append(
            f"  {'callbacks':<10} {settings.wait_callback_base_url}/v1/waits/... (AWOOOP_WAIT_CALLBACK_BASE_URL)"
        )
    lines += [
        "",
        f"  postgres   {store} ({summary(migrated)})",
        f"             {redact(settings.database_url)}",
        f"  redis      {redis}, {redact(settings.redis_url)}",
        f"  reaper     every {settings.reaper_interval:g} s, default lease {settings.lease_ttl:g} s"
        " (AWOOOP_REAPER_INTERVAL, AWOOOP_LEASE_TTL)",
        "",
        f"  dev admin key (admin in every project): {key}",
        "  demo       project demo has a deployment api in the reference gateway, for python examples/worker.py",
        "",
        "In another terminal, paste these first (then the commands below, the README's and `awooop admin` work)"
        + (f", or run: source {shlex.quote(str(env))}" if env else "")
        + ":",
        *(f"  {line}" for line in client_exports(settings, key)),
        "",
        "Try:",
        f"  grpcurl {flags} {ingest} list",
        f"  grpcurl {flags} -H 'authorization: Bearer {key}' \\",
        """    -d '{"project_id":"demo","channel_type":"CHANNEL_TYPE_TELEGRAM","payload":{"update_id":1001}}' \\""",
        f"    {ingest} awooop.ingest.v1.IngestService/IngestEvent",
        "  awooop demo        # the seeds' story end to end, from another terminal (./dev demo)",
        "",
        "Stop with Ctrl-C.",
        "",
    ]
    return "\n".join(lines)
