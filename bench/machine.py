"""Machine facts recorded with every result: numbers mean little without the box they came from."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

PG_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "max_connections",
    "work_mem",
    "effective_cache_size",
    "wal_level",
    "max_wal_size",
    "checkpoint_timeout",
    "jit",
    # off on some machines (CI's Postgres here): no analyze ever refreshes the planner's statistics,
    # so a run's plans are made on what the tables looked like when created (docs/benchmarks.md)
    "autovacuum",
)
PACKAGES = ("grpcio", "protobuf", "asyncpg", "redis", "uvloop", "pgqueuer", "dbos", "psycopg", "SQLAlchemy")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "services", "packages/worker", "bench"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


async def facts(pg_dsn: str, redis_url: str, pg_source: str, redis_source: str) -> dict[str, Any]:
    conn = await asyncpg.connect(pg_dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        # SHOW gives human units (128MB rather than 16384 x 8kB)
        settings = {name: await conn.fetchval(f"SHOW {name}") for name in PG_SETTINGS}
    finally:
        await conn.close()
    client = aioredis.from_url(redis_url)
    try:
        info = await client.info("server")
        redis_version = info.get("redis_version", "unknown")
    finally:
        await client.aclose()
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_mb": _mem_total_mb(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": _versions(),
        "postgres": {"version": version, "source": pg_source, "settings": settings},
        "redis": {"version": redis_version, "source": redis_source},
        "load_average_at_start": [round(x, 2) for x in load],
        "git_commit": _git_commit(),
    }


async def commit_latency(dsn: str, n: int = 200) -> dict[str, float]:
    """Milliseconds per sequential single-row autocommit INSERT, with synchronous_commit on
    (each commit waits for its WAL flush: the disk's fsync) and off (no wait), on a scratch
    database. It is the floor under every figure that commits per item."""
    import time

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE commit_probe (i int)")
        out = {}
        for mode in ("on", "off"):
            await conn.execute(f"SET synchronous_commit = {mode}")
            for i in range(20):  # warm
                await conn.execute("INSERT INTO commit_probe VALUES ($1)", i)
            t0 = time.perf_counter()
            for i in range(n):
                await conn.execute("INSERT INTO commit_probe VALUES ($1)", i)
            out[f"synchronous_commit_{mode}_ms"] = round((time.perf_counter() - t0) / n * 1000, 3)
        return out
    finally:
        await conn.close()
