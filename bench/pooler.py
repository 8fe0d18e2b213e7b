"""The services through PgBouncer in transaction mode against the same services connected
directly, in the same run: IngestEvent with unique ids (the insert path) and the claim cycle
(bench/claims.py's drain). Through the pooler the services run as documented for it:
AWOOOP_DB_STATEMENT_CACHE=false, LISTEN on AWOOOP_DATABASE_DIRECT_URL, and so the hot statements
as the server-side plan functions the migration of each fresh database created
(services/common/server_plans.py). PgBouncer gets as many server connections as one service
process' pool (AWOOOP_DB_POOL_MAX, 10)."""

from __future__ import annotations

import contextlib
from typing import Any

import asyncpg
import psutil

from bench import claims, env, procs
from bench.config import Config
from bench.ingest import UniqueIngest, _load, _median
from bench.report import Figure

PROJECT = "bench"


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "pgbouncer_ingest",
            f"IngestEvent unique ids through PgBouncer (transaction mode), {cfg.table_concurrency} in flight",
            "events/s",
            "ratio_ge",
            0.8,
            "≥ 0.8 ×",
            baseline_label="the same service connected to Postgres directly",
            baseline_unit="events/s",
        ),
        Figure(
            "pgbouncer_claims",
            f"claim → heartbeat → complete cycles through PgBouncer, {cfg.claim_workers} workers",
            "runs/s",
            "ratio_ge",
            0.8,
            "≥ 0.8 ×",
            baseline_label="the same scheduler connected to Postgres directly",
            baseline_unit="runs/s",
        ),
    ]


def _pooled_env(stores: env.Stores, dsn: str, bouncer: Any, **extra: object) -> dict[str, str]:
    return procs.service_env(
        bouncer.dsn_for(dsn),
        stores.redis_url,
        stores.redis_prefix,
        database_direct_url=dsn,
        db_statement_cache=False,
        **extra,
    )


async def _ingest(stores: env.Stores, cfg: Config, fig: Figure, bouncer: Any) -> None:
    dsn = await stores.create_database("pooler_ingest")
    md = await env.bench_key(dsn, PROJECT, ("ingest",))
    direct = await procs.spawn("ingest", procs.service_env(dsn, stores.redis_url, stores.redis_prefix), "direct")
    pooled = await procs.spawn("ingest", _pooled_env(stores, dsn, bouncer), "pgbouncer")
    try:
        got: dict[str, list[Any]] = {"direct": [], "pgbouncer": []}
        for r in range(max(2, cfg.table_rounds)):  # interleaved, so drift hits both alike
            for name, svc in (("direct", direct), ("pgbouncer", pooled)):
                params = {"address": svc.address, "metadata": [list(m) for m in md], "label": f"pool-{name}-{r}"}
                got[name].append(await _load(UniqueIngest, params, cfg, cfg.table_concurrency, svc))
    finally:
        direct.stop()
        pooled.stop()
    d, p = _median(got["direct"]), _median(got["pgbouncer"])
    fig.measured(p.units_per_s, d.units_per_s, pgbouncer=p.as_dict(), direct=d.as_dict())
    if p.errors:
        fig.note = f"errors through PgBouncer: {p.errors}"


async def _backends_cpu_ms(dsn: str) -> float:
    """CPU (ms) the server backends of this database used since they started: the drain's own
    Postgres work, whatever else the shared machine runs (wall-clock ratios carry that noise)."""
    conn = await asyncpg.connect(dsn)
    try:
        pids = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    total = 0.0
    for r in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(r["pid"]).cpu_times()
            total += t.user + t.system
    return total * 1000


async def _drain(stores: env.Stores, cfg: Config, svc_env: Any, tag: str) -> dict[str, Any]:
    dsn = await stores.create_database(f"pooler_claims_{tag}")
    await claims.seed_claimable(dsn, cfg.claim_jobs)
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    svc = await procs.spawn("scheduler", svc_env(dsn), tag)
    try:
        out = await claims.drain_awooop(cfg, svc, md, dsn, cfg.claim_jobs)
        out["postgres_cpu_ms_per_1000_runs"] = round(await _backends_cpu_ms(dsn) * 1000 / cfg.claim_jobs, 1)
        return out
    finally:
        svc.stop()
        await stores.drop_database(dsn)


async def _claims(stores: env.Stores, cfg: Config, fig: Figure, bouncer: Any) -> None:
    # each side twice, alternating, on fresh databases; the better drain of each. `plain` is the
    # pooled scheduler without its server-side plan functions (AWOOOP_DB_SERVER_PLANS=false):
    # what the statement cache off costs without them, in the same run
    sides: dict[str, Any] = {
        "direct": lambda dsn: procs.service_env(dsn, stores.redis_url, stores.redis_prefix),
        "pgbouncer": lambda dsn: _pooled_env(stores, dsn, bouncer),
        "plain": lambda dsn: _pooled_env(stores, dsn, bouncer, db_server_plans=False),
    }
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for r in range(2):
        for name, svc_env in sides.items():
            got[name].append(await _drain(stores, cfg, svc_env, f"{name[0]}{r}"))
    best = {k: max(v, key=lambda d: d["per_s"]) for k, v in got.items()}
    pooled, direct = best["pgbouncer"], best["direct"]
    fig.measured(
        pooled["per_s"],
        direct["per_s"],
        drains={k: [round(d["per_s"], 1) for d in v] for k, v in got.items()},
        plain_ratio=round(best["plain"]["per_s"] / direct["per_s"], 3) if direct["per_s"] else None,
        postgres_cpu_ms_per_1000_runs={k: [d["postgres_cpu_ms_per_1000_runs"] for d in v] for k, v in got.items()},
        pgbouncer=pooled,
        direct=direct,
        plain=best["plain"],
    )
    errors = {k: d["errors"] for k, d in best.items() if d["errors"]}
    if errors:
        fig.note = f"errors during the drains: {errors}"


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    # the tests' starter: Debian's pgbouncer on a free port
    from tests.harness.pgbouncer import installed, start_pgbouncer

    ingest_fig, claims_fig = figures
    if not installed():  # the starter would skip: a pytest outcome, which would end the whole run
        for f in figures:
            f.status, f.note = "not run", "pgbouncer is not installed (Debian's pgbouncer: .ci/install-debian)"
        return
    bouncer = start_pgbouncer(stores.pg_dsn, pool_size=10)
    try:
        await _ingest(stores, cfg, ingest_fig, bouncer)
        await _claims(stores, cfg, claims_fig, bouncer)
    finally:
        bouncer.stop()
