"""ClaimRuns with long-poll: try to claim; when nothing is claimable, wait for a wake-up
(a NOTIFY for one of the projects), the end of the earliest retry backoff, or the end of
the wait, and try again. The wait never holds a store connection."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg

from services.scheduler import leases, metrics
from services.scheduler.wakeup import RunReadyListener


async def claim_runs(
    pool: asyncpg.Pool,
    listener: RunReadyListener,
    *,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    actor: str,
    wait: float,
) -> list[asyncpg.Record]:
    """Claims up to max_runs; waits up to `wait` seconds for work. Returns [] when the wait
    ends empty (or the service is stopping)."""
    deadline = time.monotonic() + wait
    while True:
        with listener.subscribe(projects) as woken:
            rows = await leases.claim(pool, projects, max_runs, lease_ttl, worker_id, actor)
            if rows:
                metrics.count_claims(rows)
                return rows
            left = deadline - time.monotonic()
            if left <= 0 or listener.stopping.is_set():
                return []
            timeout = left
            next_ready = await leases.seconds_until_ready(pool, projects)
            if next_ready is not None:
                timeout = min(timeout, next_ready + 0.001)
            poll = listener.poll_interval
            if poll is not None:
                timeout = min(timeout, poll)
            metrics.CLAIMS_WAITING.inc()
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=timeout)
            finally:
                metrics.CLAIMS_WAITING.dec()
