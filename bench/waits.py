"""Durable waits' figures: what parked runs cost the statements that run all the time, run
against the scheduler's own statements (services/scheduler/claiming.py, reaper.py) over the
service's own pool setup.

- Claim statement cost with `waits_parked` parked runs (WAITING_TOOL without a lease, each with
  its open wait) in the table, against a database alike but without them, the two measured
  alternately: a claim of `claim_batch` runs out of `waits_claimable` PENDING ones, the claimed
  runs put back before each execution (untimed); medians of `waits_repeats` executions each.
- Reaper statement cost, the same way (no lease expired, the usual pass): parked runs are in the
  leased runs' partial index (WAITING_TOOL), so the reaper reads them and checks `lease_until` on
  each row. Reported, not judged.
"""

from __future__ import annotations

import json
import statistics
import time

import asyncpg

from bench import env
from bench.config import Config
from bench.report import Figure

PROJECT = "bench"

SEED_PENDING_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input, created_at)
SELECT $1, 'api', 'pending-' || g, 'PENDING', '{"n": 1}'::jsonb,
       now() - interval '1 hour' + make_interval(secs => g / 1000.0)
  FROM generate_series(1, $2) AS g
"""

# parked as AwaitWait leaves a run: WAITING_TOOL, no lease, token spent; its wait open
SEED_PARKED_SQL = """
WITH runs AS (
    INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input, attempt_count,
                                  released_count, created_at)
    SELECT $1, 'api', 'parked-' || g, 'WAITING_TOOL', '{"n": 1}'::jsonb, 2, 2, now() - interval '2 hours'
      FROM generate_series(1, $2) AS g
    RETURNING run_id, project_id
)
INSERT INTO awooop_wait (project_id, run_id, step_id, kind, token_hash, expires_at, parked_attempt)
SELECT project_id, run_id, 'wait-1', 'token', sha256(run_id::text::bytea), now() + interval '1 day', 2 FROM runs
"""

PUT_BACK_SQL = """
UPDATE awooop_run_state SET status = 'PENDING', lease_until = NULL, worker_id = NULL, attempt_count = 0
 WHERE project_id = $1 AND status = 'RUNNING'
"""


def declare(cfg: Config) -> list[Figure]:
    n = cfg.waits_parked
    return [
        Figure(
            "waits_claim_cost",
            f"claim statement cost with {n:,} parked runs (durable waits)",
            "ms",
            "ratio_le",
            1.1,
            "≤ 1.1 ×",
            baseline_label="the same with none",
        ),
        Figure(
            "waits_reaper_cost",
            f"reaper statement cost with {n:,} parked runs (no lease expired)",
            "ms",
            "report",
            None,
            "reported (ms; ratio in details)",
        ),
    ]


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    claim_fig, reaper_fig = figures
    from services.common import retry_policy
    from services.common.db import create_pool
    from services.common.runs import RUN_READY_CHANNEL
    from services.common.settings import Settings
    from services.scheduler import claiming, reaper

    settings = Settings()
    policy = json.dumps(retry_policy.defaults(settings))
    # two databases, alike but for the parked runs, measured alternately (so load on the shared
    # machine falls on both alike)
    dsns = [await stores.create_database("waits_none"), await stores.create_database("waits_parked")]
    pools = [await create_pool(settings.with_(database_url=d, db_pool_max=4)) for d in dsns]
    seeds = [await asyncpg.connect(d) for d in dsns]
    try:
        for seed in seeds:
            await seed.execute(SEED_PENDING_SQL, PROJECT, cfg.waits_claimable)
        await seeds[1].execute(SEED_PARKED_SQL, PROJECT, cfg.waits_parked)
        for seed in seeds:
            await seed.execute("VACUUM ANALYZE awooop_run_state")

        async def claim(i: int) -> float:
            await seeds[i].execute(PUT_BACK_SQL, PROJECT)
            t0 = time.perf_counter()
            got = await claiming.claim_once(pools[i], [PROJECT], cfg.claim_batch, 300.0, "bench-w", "bench", None)
            ms = (time.perf_counter() - t0) * 1000
            if len(got.rows) != cfg.claim_batch:
                raise RuntimeError(f"claimed {len(got.rows)} runs, expected {cfg.claim_batch}")
            return ms

        async def reap(i: int) -> float:
            t0 = time.perf_counter()
            await pools[i].fetch(
                reaper.REAP_SQL, reaper.REAP_BATCH, reaper.REAPER_ACTOR, RUN_READY_CHANNEL, policy, None
            )
            return (time.perf_counter() - t0) * 1000

        for i in (0, 1):  # warm the plan caches and the pages
            await claim(i)
            await reap(i)
        claims: list[list[float]] = [[], []]
        reaps: list[list[float]] = [[], []]
        for _ in range(cfg.waits_repeats):
            for i in (0, 1):
                claims[i].append(await claim(i))
                reaps[i].append(await reap(i))
        claim_none, claim_parked = (statistics.median(c) for c in claims)
        reap_none, reap_parked = (statistics.median(r) for r in reaps)
        claim_fig.measured(
            claim_parked, claim_none, parked=cfg.waits_parked, claimable=cfg.waits_claimable, batch=cfg.claim_batch
        )
        reaper_fig.measured(
            reap_parked,
            None,
            parked=cfg.waits_parked,
            none_ms=round(reap_none, 3),
            ratio=round(reap_parked / reap_none, 2) if reap_none else None,
        )
    finally:
        for seed in seeds:
            await seed.close()
        for pool in pools:
            await pool.close()
        for d in dsns:
            await stores.drop_database(d)
