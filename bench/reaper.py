"""Reaper figures, run against the scheduler's own statement and pass (imported from
services/scheduler/reaper.py, executed over the service's own pool setup).

- Statement cost with many finished runs: the same database holds `reaper_expired` RUNNING
  runs with expired leases plus first 10k, then 1M finished runs (COMPLETED / FAILED /
  CANCELLED, seeded with one INSERT ... SELECT generate_series). ReapExpiredLeases (reaper.sql, one batch) is
  timed several times at each size, the expired runs being put back between executions
  (untimed); the median is the figure. EXPLAIN (ANALYZE, BUFFERS) of one execution at each
  size is kept, rolled back, as the secondary output.
- One pass over 10,000 expired leases: reaper.reap() on a fresh set, timed once.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import asyncpg

from bench import env
from bench.config import Config
from bench.report import Figure
from services.scheduler import reaper_sql

PROJECT = "bench"
FEW_EXPIRED = 10  # the secondary measurement: a pass with only a few expired leases

SEED_FINISHED_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input, output,
                              attempt_count, heartbeat_at, worker_id, created_at, updated_at)
SELECT $1, 'api', 'done-' || ($2 + g),
       (ARRAY['COMPLETED', 'COMPLETED', 'COMPLETED', 'FAILED', 'CANCELLED'])[1 + g % 5],
       '{"n": 1}'::jsonb, '{"ok": true}'::jsonb, 1, now() - interval '1 day', 'w-' || (g % 64),
       now() - interval '2 days' + make_interval(secs => g / 1000.0), now() - interval '1 day'
  FROM generate_series(1, $3) AS g
"""

SEED_EXPIRED_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, input,
                              attempt_count, lease_until, heartbeat_at, worker_id, created_at)
SELECT $1, 'api', $2 || g, 'RUNNING', '{"n": 1}'::jsonb, 1,
       now() - interval '1 minute' - make_interval(secs => g / 1000.0), now() - interval '2 minutes',
       'w-' || (g % 16), now() - interval '10 minutes'
  FROM generate_series(1, $3) AS g
"""

# put the first $1 of the benchmark's expired runs back as they were before a reap (the
# others wait as PENDING, out of the reaper's way)
RESET_EXPIRED_SQL = """
UPDATE awooop_run_state
   SET status = CASE WHEN substr(provider_event_id, 9)::int <= $1 THEN 'RUNNING' ELSE 'PENDING' END,
       lease_until = CASE WHEN substr(provider_event_id, 9)::int <= $1 THEN now() - interval '1 minute' END,
       attempt_count = 1, worker_id = 'w-reset', reaped_at = NULL, not_before = NULL
 WHERE provider_event_id LIKE 'expired-%'
"""


def declare(cfg: Config) -> list[Figure]:
    big, small = cfg.reaper_finished_big, cfg.reaper_finished_small
    return [
        Figure(
            "reaper_cost",
            f"reaper statement cost with {big:,} finished runs in the table",
            "ms",
            "ratio_le",
            1.5,
            "≤ 1.5 ×",
            baseline_label=f"the same with {small:,}",
        ),
        Figure(
            "reap_pass",
            f"reap of {cfg.reap_pass:,} expired leases, one pass",
            "ms",
            "report",
            None,
            "reported (ms)",
        ),
    ]


async def _settle(seed: asyncpg.Connection) -> None:
    """After seeding: VACUUM ANALYZE, then a CHECKPOINT so the seed's dirty pages are written
    before the timing starts rather than during it (the first executions after a 1M-row load
    otherwise ran at twice the later ones' time while the checkpointer flushed)."""
    await seed.execute("VACUUM ANALYZE awooop_run_state")
    try:
        await seed.execute("CHECKPOINT")
    except asyncpg.InsufficientPrivilegeError:  # not superuser / pg_checkpoint: time it as it is
        pass


def _reap_args(reaper: Any, policy: str) -> tuple[Any, ...]:
    """One batch of the reaper's statement, any run (not one)."""
    return tuple(
        reaper_sql.REAP_EXPIRED_LEASES.args(
            batch=reaper.REAP_BATCH, actor=reaper.REAPER_ACTOR, channel=_channel(), policy=policy, only_run=None
        )
    )


async def _time_statement(pool: asyncpg.Pool, reaper: Any, expired: int, repeats: int, policy: str) -> dict[str, Any]:
    """Median of `repeats` executions of the reaper's statement with `expired` leases to take."""
    times = []
    for _ in range(repeats):
        async with pool.acquire() as conn:
            await conn.execute(RESET_EXPIRED_SQL, expired)
            t0 = time.perf_counter()
            rows = await conn.fetch(reaper_sql.REAP_EXPIRED_LEASES.sql, *_reap_args(reaper, policy))
            times.append((time.perf_counter() - t0) * 1000)
        if len(rows) != min(expired, reaper.REAP_BATCH):
            raise RuntimeError(f"reaper statement reaped {len(rows)} runs, expected {expired}")
    async with pool.acquire() as conn:
        await conn.execute(RESET_EXPIRED_SQL, expired)
        tx = conn.transaction()
        await tx.start()
        try:
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) " + reaper_sql.REAP_EXPIRED_LEASES.sql, *_reap_args(reaper, policy)
            )
        finally:
            await tx.rollback()
    return {
        "median_ms": statistics.median(times),
        "all_ms": [round(t, 2) for t in times],
        "explain": [r[0] for r in plan],
    }


def _channel() -> str:
    from services.common.runs import RUN_READY_CHANNEL

    return RUN_READY_CHANNEL


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    cost, pass_fig = figures
    from services.common import retry_policy
    from services.common.db import create_pool
    from services.common.settings import Settings
    from services.scheduler import reaper
    from services.scheduler.saga_client import SagaNudger

    dsn = await stores.create_database("reaper")
    settings = Settings().with_(database_url=dsn, db_pool_max=4)
    pool = await create_pool(settings)
    policy = json.dumps(retry_policy.defaults(settings))  # the service's retry policy, as the reaper passes it
    # seeding runs on its own connection: the service pool's statement_timeout is 10 s
    seed = await asyncpg.connect(dsn)
    try:
        await seed.execute(SEED_EXPIRED_SQL, PROJECT, "expired-", cfg.reaper_expired)
        await seed.execute(SEED_FINISHED_SQL, PROJECT, 0, cfg.reaper_finished_small)
        await _settle(seed)
        small = await _time_statement(pool, reaper, cfg.reaper_expired, cfg.reaper_repeats, policy)
        small_few = await _time_statement(pool, reaper, FEW_EXPIRED, cfg.reaper_repeats, policy)
        t0 = time.perf_counter()
        more = cfg.reaper_finished_big - cfg.reaper_finished_small
        await seed.execute(SEED_FINISHED_SQL, PROJECT, cfg.reaper_finished_small, more)
        await _settle(seed)
        seed_s = time.perf_counter() - t0
        size = await seed.fetchval("SELECT pg_size_pretty(pg_total_relation_size('awooop_run_state'))")
        big = await _time_statement(pool, reaper, cfg.reaper_expired, cfg.reaper_repeats, policy)
        big_few = await _time_statement(pool, reaper, FEW_EXPIRED, cfg.reaper_repeats, policy)
        cost.measured(
            big["median_ms"],
            small["median_ms"],
            expired_runs=cfg.reaper_expired,
            batch=reaper.REAP_BATCH,
            small=small,
            big=big,
            seed_seconds=round(seed_s, 1),
            table_size_big=size,
            # secondary: the same statement when only a few leases expired (the usual pass)
            few_expired={
                "expired": FEW_EXPIRED,
                "small_median_ms": round(small_few["median_ms"], 3),
                "big_median_ms": round(big_few["median_ms"], 3),
                "big_explain": big_few["explain"],
            },
        )

        # one pass over a fresh set of expired leases
        await seed.execute("DELETE FROM awooop_run_state WHERE provider_event_id LIKE 'expired-%'")
        await seed.execute(SEED_EXPIRED_SQL, PROJECT, "pass-", cfg.reap_pass)
        await seed.execute("VACUUM ANALYZE awooop_run_state")
        t0 = time.perf_counter()
        result = await reaper.reap(pool, SagaNudger(settings), policy_defaults=policy)
        ms = (time.perf_counter() - t0) * 1000
        if result.total != cfg.reap_pass:
            raise RuntimeError(f"one reaper pass took back {result.total} of {cfg.reap_pass} expired leases")
        pass_fig.measured(
            ms,
            None,
            reaped=result.total,
            requeued=result.requeued,
            statements=-(-cfg.reap_pass // reaper.REAP_BATCH),
            finished_runs_in_table=cfg.reaper_finished_big,
            per_lease_us=round(ms * 1000 / cfg.reap_pass, 1),
        )
    finally:
        await seed.close()
        await pool.close()
        await stores.drop_database(dsn)
