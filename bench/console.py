"""Console page times at size: `python -m bench.console [--steps 1000] [--runs 100000] [--quick]`.

Seeds a run of --steps journaled steps (through the saga's own RPCs) and a project of --runs runs
(one INSERT), starts scheduler + saga + the console in this process on the local (or embedded)
Postgres and Redis, and reports median times of:

  runs show (RPCs + text)  what `awooop runs show` does after start-up: GetRun, GetRunHistory and
                           GetJournal in turn, then the text timeline (printed to a buffer)
  runs show (process)      the whole `awooop runs show` command, interpreter start included
  console run page         GET /runs/<id>: the same three RPCs, concurrently, and the HTML page
                           (its first page: 200 timeline entries, 100 steps)
  runs list (RPC)          ListRuns, 50 newest of the big project
  console runs page        GET /projects/<p>/runs: ListRuns + CountRuns and the HTML page

Ratios are against `runs show (RPCs + text)` in the same run. Not part of `./dev bench`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import asyncpg  # noqa: E402

from awooop.cli import runs as runs_cli  # noqa: E402
from awooop.saga.v1 import saga_pb2  # noqa: E402
from awooop.scheduler.v1 import scheduler_pb2  # noqa: E402
from awooop.worker import Client  # noqa: E402
from bench import env  # noqa: E402
from services.common import principals  # noqa: E402
from services.common.runtime import Runtime  # noqa: E402
from services.common.settings import Settings  # noqa: E402
from services.console.app import ConsoleServer  # noqa: E402
from tests.harness import rpc_runs  # noqa: E402

PROJECT = "bench-console"
BIG = "bench-console-big"


async def median_ms(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    await fn()  # warm: connections, statement caches
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="200 steps, 10,000 runs, 5 repetitions")
    p.add_argument("--database-url", default=None)
    p.add_argument("--redis-url", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.runs, args.repeat = 200, 10_000, 5
    stores = await env.resolve(args.database_url, args.redis_url)
    try:
        await _bench(args, stores)
    finally:
        await stores.cleanup()


async def _bench(args: argparse.Namespace, stores: env.Stores) -> None:
    dsn = await stores.create_database("console")
    settings = Settings.from_env().with_(
        database_url=dsn,
        redis_url=stores.redis_url,
        redis_prefix=stores.redis_prefix,
        access_log=False,
        log_level="WARNING",
        metrics_port=0,
    )
    conn = await asyncpg.connect(dsn)
    await principals.create_principal(conn, "bench-admin", "user")
    await principals.grant_role(conn, "bench-admin", "*", "admin")
    key = (await principals.issue_key(conn, "bench-admin")).key
    rt = Runtime(settings, ["ingest", "scheduler", "saga"], port_zero=True)
    await rt.start()
    addrs = {s: f"127.0.0.1:{port}" for s, port in rt.ports.items()}
    client = Client(key=key, **addrs)
    assert rt.ctx is not None
    console = ConsoleServer(settings, addrs["scheduler"], addrs["saga"], pool=rt.ctx.pool)
    await console.start(port=0)
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        t0 = time.perf_counter()
        run_id = await _seed_run(client, args.steps)
        await conn.execute(
            """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, created_at)
               SELECT $1, 'telegram', 'u' || g, (ARRAY['PENDING','COMPLETED','FAILED','RUNNING'])[1 + g % 4],
                      now() - make_interval(secs => g) FROM generate_series(1, $2) g""",
            BIG,
            args.runs,
        )
        await conn.execute("ANALYZE awooop_run_state")
        print(
            f"seeded a run of {args.steps} steps and a project of {args.runs} runs in {time.perf_counter() - t0:.1f} s"
        )

        async with http.get(console.url + "/signin") as r:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)  # type: ignore[union-attr]
        async with http.post(console.url + "/signin", data={"csrf": csrf, "api_key": key}) as r:
            assert r.status == 200, r.status

        async def show() -> None:
            run = (await client.call(client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run
            hist = await client.call(client.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=run_id))
            journal = await client.call(client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id))
            with contextlib.redirect_stdout(io.StringIO()):
                runs_cli._print_run(run)
                runs_cli._print_timeline(list(hist.events), journal)
                runs_cli._print_journal(journal)

        async def page(path: str) -> None:
            async with http.get(console.url + path) as r:
                assert r.status == 200, (path, r.status)
                await r.read()

        async def show_process() -> None:
            cmd = [
                sys.executable,
                "-m",
                "awooop.cli",
                "runs",
                "show",
                run_id,
                "--scheduler",
                addrs["scheduler"],
                "--saga",
                addrs["saga"],
            ]
            child = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": key}
            out = await asyncio.to_thread(subprocess.run, cmd, env=child, capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr

        async def list_rpc() -> None:
            await client.call(client.scheduler.ListRuns, scheduler_pb2.ListRunsRequest(project_id=BIG, page_size=50))

        n = args.repeat
        base = await median_ms(show, n)
        rows = [
            (f"runs show (RPCs + text), {args.steps} steps", base),
            ("runs show (process)", await median_ms(show_process, max(3, n // 4))),
            (f"console run page, {args.steps} steps", await median_ms(lambda: page(f"/runs/{run_id}"), n)),
            (f"runs list (RPC), {args.runs} runs", await median_ms(list_rpc, n)),
            (f"console runs page, {args.runs} runs", await median_ms(lambda: page(f"/projects/{BIG}/runs"), n)),
            (
                "console runs page, filtered (FAILED, telegram)",
                await median_ms(lambda: page(f"/projects/{BIG}/runs?status=FAILED&channel=telegram"), n),
            ),
        ]
        print()
        print(f"{'what':<52} {'median ms':>10} {'x runs show':>12}")
        for what, ms in rows:
            print(f"{what:<52} {ms:>10.1f} {ms / base:>12.2f}")
    finally:
        await http.close()
        await console.stop()
        await client.close()
        await rt.stop(0.2)
        await conn.close()


async def _seed_run(client: Client, steps: int) -> str:
    run_id = await rpc_runs.ingest_run(client, PROJECT, {"ask": "many steps"}, "big-run")
    lease = await rpc_runs.claim_one(client, "bench", PROJECT, lease_ttl_s=3600)

    async def one(i: int) -> None:
        await rpc_runs.scale_step(
            client,
            lease,
            f"step-{i:04d}",
            {"deployment": f"svc-{i}", "replicas": 3},
            {"previous_replicas": 1, "replicas": 3},
            undo={"deployment": f"svc-{i}", "replicas": 1},
        )

    for start in range(0, steps, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(steps, start + 50))))
    return str(run_id)


if __name__ == "__main__":
    asyncio.run(main())
