"""Server-side commands: serve, up, migrate, config."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

SERVICE_CHOICES = ("ingest", "scheduler", "saga", "gateway")
UP_SERVICES = ["ingest", "scheduler", "saga", "gateway"]


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
        default=os.environ.get("AWOOOP_DATA_DIR", ".awooop"),
        help="where the embedded Postgres and Redis keep their files (default .awooop)",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("config", help="list every AWOOOP_* setting with its default")
    p.set_defaults(func=cmd_config)


def cmd_serve(args: argparse.Namespace) -> int:
    from services.common.runtime import serve
    from services.common.settings import Settings

    settings = Settings.from_env()
    if args.migrate:
        settings = settings.with_(migrate_on_start=True)
    serve(list(dict.fromkeys(args.services)), settings)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from services.common import migrate
    from services.common.settings import Settings

    dsn = args.database_url or Settings.from_env().database_url
    if not dsn:
        print("AWOOOP_DATABASE_URL is not set")
        return 2
    applied = asyncio.run(migrate.migrate(dsn))
    print("applied: " + ", ".join(applied) if applied else "up to date")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from services.common.settings import describe

    for name, default in describe():
        print(f"{name}={default}")
    return 0


async def _dev_key(dsn: str, key_file: Path) -> str:
    """The dev admin key kept in the data dir, re-issued when missing or revoked."""
    import asyncpg

    from services.common.principals import bootstrap_admin, parse_key

    conn = await asyncpg.connect(dsn)
    try:
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
    finally:
        await conn.close()


def cmd_up(args: argparse.Namespace) -> int:
    from services.common import embedded, migrate
    from services.common.observability import setup_logging
    from services.common.runtime import Runtime
    from services.common.settings import Settings

    settings = Settings.from_env()
    setup_logging(settings.log_level)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stoppers = []
    if not settings.database_url:
        pg = embedded.start_postgres(data_dir / "postgres")
        stoppers.append(pg.stop)
        settings = settings.with_(database_url=pg.dsn)
    if not settings.redis_url:
        rd = embedded.start_redis(data_dir / "redis")
        stoppers.append(rd.stop)
        settings = settings.with_(redis_url=rd.url)
    try:
        asyncio.run(migrate.migrate(settings.database_url))
        key = asyncio.run(_dev_key(settings.database_url, data_dir / "dev-admin.key"))
        # the scheduler reaches the saga service in-process with the dev key
        settings = settings.with_(
            internal_api_key=settings.internal_api_key or key,
            saga_addr=settings.saga_addr or f"{settings.host}:{settings.saga_port}",
            gateway_addr=f"{settings.host}:{settings.gateway_port}",
        )
        runtime = Runtime(settings, UP_SERVICES)

        async def main() -> None:
            await runtime.start()
            _print_banner(settings, key)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            await runtime.stop()

        asyncio.run(main())
    finally:
        for stop in reversed(stoppers):
            stop()
    return 0


def _print_banner(settings: Any, key: str) -> None:
    h = settings.host
    lines = [
        "",
        "awooop is up.",
        f"  ingest     {h}:{settings.ingest_port}   (awooop.ingest.v1.IngestService)",
        f"  scheduler  {h}:{settings.scheduler_port}   (awooop.scheduler.v1.SchedulerService)",
        f"  saga       {h}:{settings.saga_port}   (awooop.saga.v1.SagaService)",
        f"  gateway    {h}:{settings.gateway_port}   (awooop.tools.v1.ToolGatewayService, reference tools)",
        f"  metrics    http://{h}:{settings.metrics_port}/metrics" if settings.metrics_port else "",
        "",
        f"  dev admin key: {key}",
        f"  export AWOOOP_API_KEY={key}",
        "",
        "Try:",
        f"  grpcurl -plaintext {h}:{settings.ingest_port} list",
        f"  grpcurl -plaintext -H 'authorization: Bearer {key}' \\",
        """    -d '{"project_id":"demo","channel_type":"CHANNEL_TYPE_TELEGRAM","payload":{"update_id":1001}}' \\""",
        f"    {h}:{settings.ingest_port} awooop.ingest.v1.IngestService/IngestEvent",
        "",
        "Stop with Ctrl-C.",
        "",
    ]
    print("\n".join(line for line in lines if line is not None), flush=True)
