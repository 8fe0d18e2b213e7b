"""The claim cycle (bench/claims.py's drain) while finished runs are being pruned, against the
same drain on the same seed without pruning, in the same run.

Each side gets a fresh database seeded with `reaper_finished_big` finished runs last changed
40 days ago (1M full, 200k quick) and `claim_jobs` claimable runs. On the pruning side an ingest
process runs its retention loop flat out (AWOOOP_RUN_RETENTION 1 day, AWOOOP_PRUNE_INTERVAL
0.2 s, batches of AWOOOP_PRUNE_BATCH) from before the drain starts; the other side has no
pruner. The figure is the drain's runs/s; how many runs were pruned during it is recorded."""

from __future__ import annotations

from typing import Any

import asyncpg

from bench import claims, env, procs
from bench.config import Config
from bench.reaper import SEED_FINISHED_SQL
from bench.report import Figure

PROJECT = "bench"
OLD = "UPDATE awooop_run_state SET updated_at = now() - interval '40 days' WHERE status <> 'PENDING'"
FINISHED = "SELECT count(*) FROM awooop_run_state WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')"


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "claims_while_pruning",
            f"claim cycles/s while {cfg.reaper_finished_big:,} finished runs are being pruned",
            "runs/s",
            "report",
            None,
            "reported (ratio)",
            baseline_label="the same drain on the same seed without pruning",
            baseline_unit="runs/s",
        )
    ]


async def _side(stores: env.Stores, cfg: Config, prune: bool) -> dict[str, Any]:
    dsn = await stores.create_database(f"retention_{'p' if prune else 'n'}")
    await claims.seed_claimable(dsn, cfg.claim_jobs, (SEED_FINISHED_SQL, PROJECT, 0, cfg.reaper_finished_big), (OLD,))
    before = await _finished(dsn)
    md = await env.bench_key(dsn, PROJECT, ("worker",))
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
    pruner = None
    if prune:
        pruner = await procs.spawn(
            "ingest", {**base, "AWOOOP_RUN_RETENTION": "86400", "AWOOOP_PRUNE_INTERVAL": "0.2"}, "pruner"
        )
    sched = await procs.spawn("scheduler", base, "retention")
    try:
        out = await claims.drain_awooop(
            cfg,
            sched,
            md,
            dsn,
            cfg.claim_jobs,
        )
    finally:
        sched.stop()
        if pruner is not None:
            pruner.stop()
    # the drained runs are finished now too, but fresh: the pruner leaves them
    out["pruned_during_drain"] = before + cfg.claim_jobs - await _finished(dsn)
    await stores.drop_database(dsn)
    return out


async def _finished(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(FINISHED))
    finally:
        await conn.close()


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    (fig,) = figures
    without = await _side(stores, cfg, prune=False)
    pruning = await _side(stores, cfg, prune=True)
    fig.measured(pruning["per_s"], without["per_s"], pruning=pruning, without=without)
    if pruning["pruned_during_drain"] == 0:
        fig.note = "nothing was pruned during the drain: the figure does not show the pruner's cost"
    elif pruning["errors"] or without["errors"]:
        fig.note = f"errors: pruning {pruning['errors']}, without {without['errors']}"
