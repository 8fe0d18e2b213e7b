"""DBOS Transact's cost per step, the journal baseline: one workflow of N no-op steps on a
scratch Postgres database (its system database), per step = workflow time / N.

Runs in its own process (DBOS keeps global state and threads). Both DBOS styles are timed,
sync (`def` steps, its classic API) and async (`async def`), and the faster one is the
baseline, so the comparison is against the peer at its best. An empty workflow is timed too,
to show the fixed per-workflow cost that the division by N spreads out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def measure(sync: Callable[[Any], Awaitable[Any]], dsn: str, steps: int, repeats: int = 2) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "awooop-bench",
        "system_database_url": dsn,
        "log_level": "WARNING",
        "run_admin_server": False,  # type: ignore[typeddict-unknown-key]
    }
    try:
        DBOS(config=config)
    except TypeError:  # an older DBOS without run_admin_server
        config.pop("run_admin_server")  # type: ignore[misc]
        DBOS(config=config)

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def workflow(n: int) -> int:
        total = 0
        for i in range(n):
            total += noop(i)
        return total

    @DBOS.step()
    async def anoop(i: int) -> int:
        return i

    @DBOS.workflow()
    async def aworkflow(n: int) -> int:
        total = 0
        for i in range(n):
            total += await anoop(i)
        return total

    await asyncio.to_thread(DBOS.launch)
    await sync(None)
    out: dict[str, Any] = {"steps": steps}
    try:
        # warm both paths (connections, prepared statements)
        await asyncio.to_thread(workflow, 10)
        await aworkflow(10)
        sync_runs, async_runs, empty = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert await asyncio.to_thread(workflow, steps) == steps * (steps - 1) // 2
            sync_runs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert await aworkflow(steps) == steps * (steps - 1) // 2
            async_runs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await aworkflow(0)
            empty.append(time.perf_counter() - t0)
        best_sync, best_async = min(sync_runs), min(async_runs)
        out.update(
            sync_per_step_ms=best_sync / steps * 1000,
            async_per_step_ms=best_async / steps * 1000,
            per_step_ms=min(best_sync, best_async) / steps * 1000,
            style="sync" if best_sync <= best_async else "async",
            empty_workflow_ms=min(empty) * 1000,
            sync_runs_s=[round(x, 3) for x in sync_runs],
            async_runs_s=[round(x, 3) for x in async_runs],
        )
    finally:
        DBOS.destroy(destroy_registry=True)
    return out
