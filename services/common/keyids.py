"""The set of live API key ids each process keeps, so a request with a key id that does not
exist costs the store nothing per request.

A key id not in the set is looked up again only through a refresh of the whole set, and
refreshes start at most once per `min_interval` seconds however many requests miss: a
flood of random, well-formed, all different keys costs one small query per interval, not one
each. A request that misses waits for a refresh that starts after it arrived (at most
min_interval), so a key issued a moment ago works on its first request; a refresh already running
when it arrived that finds its key id answers it too (a burst of a new worker fleet's first
calls waits for one refresh, not for the next interval).

The set is a pre-filter only: a key id in it is still checked against the store (secret,
revocation, roles; auth.Authenticator), so a revoked id that lingers in the set until the next
refresh grants nothing."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from services.common import keyids_sql


class LiveKeyIds:
    def __init__(self, pool: asyncpg.Pool, min_interval: float) -> None:
        self.pool = pool
        self.min_interval = max(0.0, min_interval)
        self.refreshes = 0  # store queries made (tests and the docs' claim)
        self._ids: frozenset[str] = frozenset()
        self._started_at = float("-inf")  # monotonic start of the last refresh
        self._task: asyncio.Task[None] | None = None

    async def contains(self, key_id: str) -> bool:
        if key_id in self._ids:
            return True
        arrived = time.monotonic()
        while self._started_at < arrived:  # wait for a refresh that started after this request
            task = self._task
            if task is None or task.done():
                delay = max(0.0, self._started_at + self.min_interval - time.monotonic())
                task = self._task = asyncio.get_running_loop().create_task(self._refresh(delay))
            await asyncio.shield(task)  # one caller going away does not cancel the others' refresh
            if key_id in self._ids:
                return True
        return key_id in self._ids

    async def _refresh(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        self._started_at = time.monotonic()
        self.refreshes += 1
        rows = await keyids_sql.live_key_ids(self.pool)
        self._ids = frozenset(r["key_id"] for r in rows)
