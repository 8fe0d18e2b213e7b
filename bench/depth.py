"""Queue depth figures: what an autoscaler or a dashboard pays to read the queue, with 10,000
and then 1,000,000 finished runs retained (200,000 quick), on the same database in the same run.

Two databases hold the same live backlog spread over 10 projects (PENDING, some in backoff,
RUNNING, WAITING_TOOL, WAITING_APPROVAL), and 10,000 or 1,000,000 finished runs in the measured
project, seeded with one INSERT ... SELECT generate_series each (bench/reaper.py's). Timed on both,
alternately, through the service's own pool setup (asyncpg's statement cache, so the plan is the
one a service runs):

- CountRuns: the scheduler's own statement (overview.CountLiveRuns), what `CountRuns` without
  `include_finished` runs: its claimable count, oldest claimable run and per-status counts;
- the queue gauges: queue.SampleQueue, the statement behind awooop_scheduler_runs,
  awooop_scheduler_runs_claimable and the oldest claimable age.

Each is executed `depth_repeats` times on each database, the two sizes back to back (the order
flipping every round), the median the figure; the shared buffers one execution touches at each
size (EXPLAIN (ANALYZE, BUFFERS): what the plan reads, whatever the machine's load) and the big
size's plan are kept. For comparison the JSON keeps the same
medians of the statements before this change (CountRuns grouping every run of the project by
status, SampleQueue filtering one `status IN (...)` list), run on the same database.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

import asyncpg

from bench.config import Config
from bench.reaper import SEED_FINISHED_SQL, _settle
from bench.report import Figure

PROJECT = "bench"
PROJECTS = 10

# the live backlog: per project, (status, runs, not_before) ; the measured project is one of them
SEED_LIVE_SQL = """
INSERT INTO awooop_run_state (project_id, channel_type, input, status, not_before, attempt_count, worker_id,
                              lease_until, created_at)
SELECT $1, 'api', '{"n": 1}'::jsonb, $2::text, $3::text::timestamptz, CASE WHEN $2::text = 'PENDING' THEN 0 ELSE 1 END,
       CASE WHEN $2::text IN ('RUNNING', 'WAITING_TOOL') THEN 'w-' || (g % 16) END,
       CASE WHEN $2::text IN ('RUNNING', 'WAITING_TOOL') THEN now() + interval '1 hour' END,
       now() - make_interval(secs => g)
  FROM generate_series(1, $4) AS g
"""
LIVE: tuple[tuple[str, int, str | None], ...] = (
    ("PENDING", 300, None),
    ("PENDING", 30, "2999-01-01"),  # in backoff: queued, not claimable
    ("RUNNING", 60, None),
    ("WAITING_TOOL", 10, None),
    ("WAITING_APPROVAL", 5, None),
)

# the statements as they were before they read unfinished runs only (main at ce3726b), kept here
# only to show what the change bought on the same database
BEFORE_COUNT_RUNS = """
SELECT (SELECT COALESCE(jsonb_object_agg(status, n), '{}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM awooop_run_state WHERE project_id = $1 GROUP BY status) c
       ) AS counts,
       (SELECT min(created_at) FROM awooop_run_state
         WHERE project_id = $1 AND status IN ('PENDING', 'RESUMED')
           AND (not_before IS NULL OR not_before <= now())
           AND attempt_count - released_count < max_attempts
           AND NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = $1 AND f.paused)
       ) AS oldest,
       now() AS db_now
"""
BEFORE_SAMPLE_QUEUE = """
SELECT project_id, status, count(*) AS n,
       count(*) FILTER (WHERE claimable) AS claimable,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(ready_since) FILTER (WHERE claimable)), 0)::float8
           AS oldest
  FROM (SELECT project_id, status,
               (status IN ('PENDING', 'RESUMED')
                AND (not_before IS NULL OR not_before <= now())
                AND attempt_count - released_count < max_attempts
                AND NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = r.project_id AND f.paused))
                   AS claimable,
               GREATEST(updated_at, not_before) AS ready_since
          FROM awooop_run_state r
         WHERE status IN ('PENDING', 'RESUMED', 'RUNNING', 'WAITING_TOOL', 'WAITING_APPROVAL')) unfinished
 GROUP BY project_id, status
"""


def declare(cfg: Config) -> list[Figure]:
    big, small = cfg.reaper_finished_big, cfg.reaper_finished_small
    return [
        Figure(
            "depth_count_runs",
            f"CountRuns (claimable, per-status counts) with {big:,} finished runs retained",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label=f"the same with {small:,}",
        ),
        Figure(
            "depth_gauges",
            f"queue gauges' sample (SampleQueue) with {big:,} finished runs retained",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label=f"the same with {small:,}",
        ),
    ]


async def _time(
    pools: dict[str, asyncpg.Pool], statements: dict[str, tuple[str, tuple[Any, ...]]], repeats: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Median ms of each statement on each database over `repeats` rounds; within a round every
    statement runs on both databases back to back, the order of the two flipping every round, so
    the machine's drift (it is shared) hits both sizes alike."""
    times: dict[str, dict[str, list[float]]] = {size: {k: [] for k in statements} for size in pools}
    sizes = list(pools)
    for r in range(repeats):
        for name, (text, args) in statements.items():
            for size in sizes if r % 2 == 0 else sizes[::-1]:
                async with pools[size].acquire() as conn:
                    t0 = time.perf_counter()
                    await conn.fetch(text, *args)
                    times[size][name].append((time.perf_counter() - t0) * 1000)
    return {
        size: {k: {"median_ms": statistics.median(v), "p90_ms": sorted(v)[int(0.9 * len(v))]} for k, v in by.items()}
        for size, by in times.items()
    }


async def _explain(pool: asyncpg.Pool, text: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one execution, and the shared buffers it touched (hit + read:
    what the plan reads, independent of the machine's load)."""
    async with pool.acquire() as conn:
        lines = [r[0] for r in await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + text, *args)]
    top = next((ln for ln in lines if "Buffers: shared" in ln), "")
    buffers = sum(int(x) for x in re.findall(r"(?:hit|read)=(\d+)", top))
    return {"buffers": buffers, "plan": lines}


async def _database(stores: Any, name: str, finished: int) -> str:
    """A fresh database with the live backlog of every project and `finished` finished runs in PROJECT."""
    dsn: str = await stores.create_database(name)
    seed = await asyncpg.connect(dsn)
    try:
        for i in range(PROJECTS):
            for status, n, not_before in LIVE:
                await seed.execute(SEED_LIVE_SQL, PROJECT if i == 0 else f"{PROJECT}-{i}", status, not_before, n)
        await seed.execute(SEED_FINISHED_SQL, PROJECT, 0, finished)
        await _settle(seed)
    finally:
        await seed.close()
    return dsn


async def run(stores: Any, cfg: Config, figures: list[Figure]) -> None:
    count_fig, gauges_fig = figures
    from services.common.db import create_pool
    from services.common.settings import Settings
    from services.scheduler import overview_sql, queue_sql

    live_args = tuple(overview_sql.COUNT_LIVE_RUNS.args(project_id=PROJECT))
    statements = {
        "count_runs": (overview_sql.COUNT_LIVE_RUNS.sql, live_args),
        "sample_queue": (queue_sql.SAMPLE_QUEUE.sql, ()),
        "count_runs_before": (BEFORE_COUNT_RUNS, (PROJECT,)),
        "sample_queue_before": (BEFORE_SAMPLE_QUEUE, ()),
    }
    dsns: dict[str, str] = {}
    pools: dict[str, asyncpg.Pool] = {}
    try:
        t0 = time.perf_counter()
        dsns["big"] = await _database(stores, "depth_big", cfg.reaper_finished_big)
        seed_s = round(time.perf_counter() - t0, 1)
        dsns["small"] = await _database(stores, "depth_small", cfg.reaper_finished_small)
        for size, dsn in dsns.items():
            pools[size] = await create_pool(Settings().with_(database_url=dsn, db_pool_max=2))
        conn = await asyncpg.connect(dsns["big"])
        try:
            table_size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('awooop_run_state'))")
        finally:
            await conn.close()
        got = await _time(pools, statements, cfg.depth_repeats)
        small, big = got["small"], got["big"]
        live = sum(n for _, n, _ in LIVE) * PROJECTS
        common = {
            "live_runs": live,
            "projects": PROJECTS,
            "repeats": cfg.depth_repeats,
            "seed_seconds_big": seed_s,
            "table_size_big": table_size,
        }
        for fig, key in ((count_fig, "count_runs"), (gauges_fig, "sample_queue")):
            text, args = statements[key]
            before = f"{key}_before"
            explain_small = await _explain(pools["small"], text, args)
            explain_big = await _explain(pools["big"], text, args)
            before_small = await _explain(pools["small"], *statements[before])
            before_big = await _explain(pools["big"], *statements[before])
            fig.measured(
                big[key]["median_ms"],
                small[key]["median_ms"],
                small=small[key],
                big=big[key],
                buffers={"small": explain_small["buffers"], "big": explain_big["buffers"]},
                explain_big=explain_big["plan"],
                # the statement before this change, same databases and rounds: it grew with the history
                before_change={
                    "small_median_ms": round(small[before]["median_ms"], 3),
                    "big_median_ms": round(big[before]["median_ms"], 3),
                    "ratio": round(big[before]["median_ms"] / small[before]["median_ms"], 2),
                    "buffers": {"small": before_small["buffers"], "big": before_big["buffers"]},
                },
                **common,
            )
    finally:
        for pool in pools.values():
            await pool.close()
        for dsn in dsns.values():
            await stores.drop_database(dsn)
