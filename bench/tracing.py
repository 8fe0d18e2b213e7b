"""What tracing costs: the ingest and claim loads of bench/ingest.py and bench/claims.py, each on
a service process with tracing off and on an identical one with tracing on (OpenTelemetry, every
RPC sampled, spans exported over OTLP/gRPC to a sink in this process that counts and discards
them), in the same run; ingest also with one trace in ten sampled
(parentbased_traceidratio 0.1, what docs/operations.md recommends for a busy production).

Ingest: unique IngestEvent calls at the table concurrency, in ten interleaved rounds a side (the
order rotating: off, on, sampled; on, sampled, off; ...) so drift of the machine hits all alike
and no side always runs after another, each round on a freshly started process that is the only
service process running; each side's figure is its median round, and the details keep each
round's ratio to the untraced round beside it.
Claims: the claim → heartbeat → complete drain of bench/claims.py, three a side (off, on, on,
off, off, on), each on its own freshly seeded database and scheduler process (runs with a trace
context, as ingested with tracing on); each side's figure is its median drain. The sampler is
OTEL_TRACES_SAMPLER(_ARG) of the bench's environment, else every RPC and run is sampled (the
worst case).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg

from bench import env, procs
from bench.claims import SEED_RUNS_SQL, drain
from bench.config import Config
from bench.ingest import PROJECT as INGEST_PROJECT
from bench.ingest import UniqueIngest, _load, _median
from bench.loadgen import split
from bench.otlp_sink import Sink
from bench.report import Figure

CLAIM_PROJECT = "bench"
DRAINS = 3  # claim drains a side, the side that runs first alternating
ROUNDS = 10  # ingest rounds a side at least (the untraced side alone moves by ±20% between rounds here)


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "tracing_ingest",
            f"IngestEvent events/s with tracing on (every RPC sampled), {cfg.table_concurrency} in flight",
            "events/s",
            "ratio_ge",
            0.85,
            "≥ 0.85 ×",
            baseline_label="the same load on an identical ingest process with tracing off, interleaved rounds",
            baseline_unit="events/s",
        ),
        Figure(
            "tracing_ingest_sampled",
            f"IngestEvent events/s with tracing on, one trace in ten sampled, {cfg.table_concurrency} in flight",
            "events/s",
            "ratio_ge",
            0.85,
            "≥ 0.85 ×",
            baseline_label="the untraced rounds of the figure above",
            baseline_unit="events/s",
        ),
        Figure(
            "tracing_claims",
            f"claim → heartbeat → complete cycles/s with tracing on, {cfg.claim_workers} workers",
            "runs/s",
            "ratio_ge",
            0.85,
            "≥ 0.85 ×",
            baseline_label="the same drain on a scheduler with tracing off",
            baseline_unit="runs/s",
        ),
    ]


SAMPLED = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}


def _traced(sink: Sink) -> dict[str, str]:
    # every RPC sampled unless the bench's own environment names a sampler, e.g.
    # OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_SAMPLER": os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        "OTEL_TRACES_SAMPLER_ARG": os.environ.get("OTEL_TRACES_SAMPLER_ARG", ""),
    }


# the drained runs carry a (sampled) trace context, as runs ingested with tracing on do, so the
# traced scheduler hands each one's context (and claimable_since) to the worker
TRACEPARENTS_SQL = """
UPDATE awooop_run_state
   SET traceparent = '00-' || md5(run_id::text) || '-' || left(md5(run_id::text || 's'), 16) || '-01'
"""


def _untraced() -> dict[str, str]:
    # explicit, so `run.py --tracing` does not turn the baseline on
    return {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ""}


async def _spawn(name: str, env_: dict[str, str], otel: dict[str, str], tag: str) -> procs.Service:
    saved = dict(procs.EXTRA_ENV)
    procs.EXTRA_ENV.update(otel)  # spawn applies EXTRA_ENV after the service's own env
    try:
        return await procs.spawn(name, env_, tag)
    finally:
        procs.EXTRA_ENV.clear()
        procs.EXTRA_ENV.update(saved)


async def _ingest(stores: env.Stores, cfg: Config, figs: tuple[Figure, Figure], sink: Sink) -> None:
    dsn = await stores.create_database("tracing_ingest")
    svc_env = procs.service_env(dsn, stores.redis_url, stores.redis_prefix + "t:")
    md = [list(m) for m in await env.bench_key(dsn, INGEST_PROJECT, ("ingest",))]
    otel = {"off": _untraced(), "on": _traced(sink), "sampled": {**_traced(sink), **SAMPLED}}
    sides = list(otel)
    got: dict[str, list[Any]] = {side: [] for side in sides}
    tc = cfg.table_concurrency
    for r in range(max(ROUNDS, cfg.table_rounds)):
        # each round on a process of its own, the only service process alive: of three identical
        # ingest processes started together on one database, the first started measured 1.00 x,
        # the others 0.87 and 0.78 x (docs/benchmarks.md), which favoured the side started first
        for side in sides[r % 3 :] + sides[: r % 3]:
            svc = await _spawn("ingest", svc_env, otel[side], f"{side}{r}")
            try:
                params = {"address": svc.address, "metadata": md, "label": f"trace-{side}-{r}"}
                got[side].append(await _load(UniqueIngest, params, cfg, tc, svc))
            finally:
                svc.stop()
    off = _median(got["off"])
    rounds = {k: [round(x.units_per_s, 1) for x in v] for k, v in got.items()}
    for fig, side in zip(figs, ("on", "sampled"), strict=True):
        pairs = sorted(round(a.units_per_s / b.units_per_s, 3) for a, b in zip(got[side], got["off"], strict=True))
        o = _median(got[side])
        fig.measured(
            o.units_per_s, off.units_per_s, rounds=rounds, round_ratios=pairs, on=o.as_dict(), off=off.as_dict()
        )
    errors = sum(sum(x.errors.values()) for v in got.values() for x in v)
    if errors:
        for fig in figs:
            fig.note = f"{errors} errors during the loads"


async def _drain_once(stores: env.Stores, cfg: Config, otel: dict[str, str], tag: str) -> dict[str, Any]:
    n = cfg.claim_jobs
    dsn = await stores.create_database(f"tracing_claims_{tag}")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SEED_RUNS_SQL, CLAIM_PROJECT, n)
        await conn.execute(TRACEPARENTS_SQL)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    md = [list(m) for m in await env.bench_key(dsn, CLAIM_PROJECT, ("worker",))]
    svc = await _spawn("scheduler", procs.service_env(dsn, stores.redis_url, stores.redis_prefix), otel, tag)
    try:
        shares = split(cfg.claim_workers, cfg.processes)
        return await asyncio.to_thread(
            drain,
            "bench.claims:awooop_workers",
            [
                {"address": svc.address, "metadata": md, "proc_idx": i, "workers": w, "batch": cfg.claim_batch}
                for i, w in enumerate(shares)
            ],
            dsn,
            "SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'",
            n,
            svc.pid,
        )
    finally:
        svc.stop()
        await stores.drop_database(dsn)


async def _claims(stores: env.Stores, cfg: Config, fig: Figure, sink: Sink) -> None:
    got: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    otel = {"off": _untraced(), "on": _traced(sink)}
    for r in range(DRAINS):
        for side in ("off", "on") if r % 2 == 0 else ("on", "off"):
            got[side].append(await _drain_once(stores, cfg, otel[side], f"{side}{r}"))
    # each side's median drain
    median = {k: sorted(v, key=lambda d: d["per_s"])[len(v) // 2] for k, v in got.items()}
    fig.measured(
        median["on"]["per_s"],
        median["off"]["per_s"],
        drains={k: [round(d["per_s"], 1) for d in v] for k, v in got.items()},
        on=median["on"],
        off=median["off"],
    )
    errors = {k: d["errors"] for k, d in median.items() if d["errors"]}
    if errors:
        fig.note = f"errors during the drains: {errors}"


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    ingest, sampled, claims = figures
    sink = Sink().start()
    try:
        await _ingest(stores, cfg, (ingest, sampled), sink)
        await _claims(stores, cfg, claims, sink)
    finally:
        spans = sink.stop()
    for f in figures:
        f.details["spans_exported"] = spans
    if not spans:
        for f in figures:
            f.note = (f.note + "; " if f.note else "") + "no span reached the sink: tracing was not on"
