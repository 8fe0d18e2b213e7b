"""awooop benchmark suite: `./dev bench [--quick] [--only GROUP ...]`.

Starts what it needs (scratch databases, service processes, load processes, peers), measures
each figure against its baseline in the same run, and writes bench/results/results.json,
results.md and throughput.png. See docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repo root
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import datetime as dt  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from typing import Any  # noqa: E402

from bench import env, machine, procs, report, rss  # noqa: E402
from bench.config import Config  # noqa: E402
from bench.report import Figure  # noqa: E402

# group name -> module with declare(cfg) -> [Figure] and run(stores, cfg, figures); run in this order
GROUPS: dict[str, str] = {
    "ingest": "bench.ingest",
    "webhooks": "bench.webhooks",
    "claims": "bench.claims",
    "store_cost": "bench.store_cost",
    "journal": "bench.journal",
    "reaper": "bench.reaper",
    "waits": "bench.waits",
    "run_events": "bench.run_events",
    "token_streams": "bench.token_streams",
    "children": "bench.children",
    "crash": "bench.crash",
    "pooler": "bench.pooler",
    "retention": "bench.retention",
    "depth": "bench.depth",
    "tracing": "bench.tracing",
    "flow": "bench.flow",
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="./dev bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and shorter windows (~2 minutes)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GROUP",
        help=f"run only these groups ({', '.join(GROUPS)}); repeatable or comma-separated",
    )
    p.add_argument("--database-url", default=None, help="Postgres server to create scratch databases on")
    p.add_argument("--redis-url", default=None, help="Redis to use (keys under a per-run prefix)")
    p.add_argument("--embedded", action="store_true", help="use an embedded Postgres and Redis, not the machine's")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="output directory")
    p.add_argument("--duration", type=float, default=None, help="seconds measured per load point")
    p.add_argument("--processes", type=int, default=None, help="load-generator processes")
    p.add_argument("--uvloop", action="store_true", help="run the services with AWOOOP_UVLOOP=true")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every service process, e.g. --set db_pool_max=20 (AWOOOP_DB_POOL_MAX)",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry on in every service process (every RPC sampled, OTLP export to a local sink)",
    )
    p.add_argument("--note", action="append", default=[], help="a line for the results' notes (repeatable)")
    p.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="sample every service process with py-spy into DIR (read with `python -m bench.profile`)",
    )
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: native frames too (py-spy --native; slows the services, figures not comparable)",
    )
    return p.parse_args(argv)


async def _group(name: str, stores: env.Stores, cfg: Config, figures: list[Figure], sweep: dict[str, Any]) -> None:
    module = importlib.import_module(GROUPS[name])
    runner: Callable[..., Awaitable[Any]] = module.run
    if name == "ingest":
        await runner(stores, cfg, figures, sweep)
    else:
        await runner(stores, cfg, figures)


def _failed(figures: list[Figure], exc: BaseException) -> None:
    """Marks the figures of a group that could not finish, with the reason."""
    status = "not implemented" if isinstance(exc, NotImplementedError) else "error"
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    reason = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
    for f in figures:
        if f.status == "not run":
            f.status, f.note = status, reason


async def main(args: argparse.Namespace) -> int:
    cfg = Config.quick_mode() if args.quick else Config()
    if args.duration:
        cfg.duration = args.duration
    if args.processes:
        cfg.processes = args.processes
    cfg.service_uvloop = args.uvloop
    if args.uvloop:
        procs.EXTRA_SETTINGS["uvloop"] = "true"
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"--set {item}: expected NAME=VALUE", file=sys.stderr)
            return 2
        procs.EXTRA_SETTINGS[name.strip().lower().removeprefix("awooop_")] = value
    cfg.service_settings = dict(procs.EXTRA_SETTINGS)
    sink = None
    if args.tracing:
        from bench.otlp_sink import Sink

        sink = Sink().start()
        procs.EXTRA_ENV.update(
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            }
        )
        cfg.service_settings["tracing"] = "on (OTLP to a local sink)"
    if args.profile:
        procs.PROFILE_DIR = Path(args.profile).resolve()
        procs.PROFILE_NATIVE = args.profile_native
    only = [g for item in args.only for g in item.split(",") if g]
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        print(f"unknown group(s) {unknown}; choose from {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    groups = [g for g in GROUPS if not only or g in only]

    started = time.monotonic()
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    stores = await env.resolve(args.database_url, args.redis_url, embedded_only=args.embedded)
    figures: list[Figure] = []
    sweep: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        facts = await machine.facts(stores.pg_dsn, stores.redis_url, stores.pg_source, stores.redis_source)
        probe = await stores.create_database("probe", migrated=False)
        facts["postgres"]["commit_latency"] = await machine.commit_latency(probe)
        await stores.drop_database(probe)
        print(
            f"awooop bench ({'quick' if cfg.quick else 'full'}): Postgres {facts['postgres']['version']} "
            f"({stores.pg_source}), Redis {facts['redis']['version']} ({stores.redis_source}), "
            f"{facts['cores']} cores",
            flush=True,
        )
        for name in groups:
            t0 = time.monotonic()
            print(f"[{name}] ...", flush=True)
            got: list[Figure] = importlib.import_module(GROUPS[name]).declare(cfg)
            try:
                await _group(name, stores, cfg, got, sweep)
            except Exception as exc:
                errors[name] = traceback.format_exc()
                _failed(got, exc)
                print(f"[{name}] failed: {got[0].note}", flush=True)
            figures.extend(got)
            for f in got:
                report.mark_noisy(f)
                ratio = f" ratio {f.ratio:.2f}" if f.ratio is not None and f.rule.startswith("ratio") else ""
                print(f"  {f.key}: {f.value!s:.10} {f.unit} baseline {f.baseline!s:.10}{ratio} -> {report.verdict(f)}")
            print(f"[{name}] {time.monotonic() - t0:.1f}s", flush=True)
        figures.append(rss.figure())  # from the services the groups above ran
    finally:
        await stores.cleanup()
        if sink is not None:
            args.note.append(f"tracing on: {sink.stop()} spans exported by the service processes")
    elapsed = time.monotonic() - started
    meta = {
        "started_at": started_at,
        "elapsed_s": round(elapsed, 1),
        "mode": "quick" if cfg.quick else "full",
        "groups": groups,
        "config": cfg.as_dict(),
        "machine": facts,
        "errors": errors,
        "notes": [
            "Client load runs in separate processes on the same machine as the services, Postgres and Redis: "
            "every number here shares the same cores with its baseline.",
            *args.note,
        ],
    }
    out = Path(args.out)
    report.write(out, figures, meta, sweep)
    print(f"\nwrote {out}/results.json, results.md, throughput.png in {elapsed:.0f}s\n")
    print(report.markdown(figures, meta))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
