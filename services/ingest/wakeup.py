"""Wake-ups for waiting claimers: NOTIFY RUN_READY_CHANNEL with the project id of new runs.

Why after the commit and not inside the ingest transaction: Postgres serializes the commits
of every transaction that sent a NOTIFY (one cluster-wide lock held through the commit's WAL
flush), which capped unique ingest at about one commit per disk flush (~150 events/s here).
So the ingest transaction only writes; after it commits the projects are handed to this
notifier, which sends one NOTIFY statement for everything that became ready while the
previous one was in flight. Idle, that adds one round trip of latency; under load it costs
one NOTIFY commit per batch of commits instead of one per event.

A wake-up is an optimization, never the only copy: a notification lost to a crash between
the commit and the NOTIFY only delays a waiting claim until its next poll or deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import asyncpg

from services.common.db import store_error
from services.common.runs import RUN_READY_CHANNEL
from services.ingest import metrics, wakeup_sql

log = logging.getLogger("awooop.ingest.wakeup")

RETRY_AFTER = 0.5  # seconds before retrying a NOTIFY that failed (store unreachable)


class Notifier:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._ready: set[str] = set()
        self._wake = asyncio.Event()

    def ready(self, projects: Iterable[str]) -> None:
        """Projects with new claimable runs (call after the commit)."""
        self._ready.update(projects)
        if self._ready:
            self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Background loop until stopping; sends what is pending once more before it ends."""
        # stopping wakes the loop too, so each pass waits on one event (no tasks made per pass)
        watch = asyncio.ensure_future(self._wake_when(stopping))
        try:
            while not stopping.is_set():
                await self._wake.wait()
                if stopping.is_set():
                    break
                if not await self.flush():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stopping.wait(), timeout=RETRY_AFTER)
        finally:
            watch.cancel()
        await self.flush()

    async def _wake_when(self, stopping: asyncio.Event) -> None:
        await stopping.wait()
        self._wake.set()

    async def flush(self) -> bool:
        """Sends the pending wake-ups in one statement; False when the store refused them
        (they stay pending)."""
        self._wake.clear()
        if not self._ready:
            return True
        projects, self._ready = sorted(self._ready), set()
        try:
            await wakeup_sql.notify_projects(self.pool, channel=RUN_READY_CHANNEL, projects=projects)
        except Exception as exc:
            if store_error(exc) is None:
                log.exception("run-ready NOTIFY failed")
            self._ready.update(projects)
            metrics.WAKEUP_FAILURES.inc()
            return False
        metrics.WAKEUPS.inc(len(projects))
        return True
