"""Event ingest: every channel event becomes exactly one run.

Per call: duplicates inside the call are folded onto their first occurrence; the rest are
looked up in Redis with one MGET (a hit is a committed duplicate, answered without Postgres);
the misses go to Postgres in one statement (store.INGEST_SQL), whose unique constraint
decides; what Postgres answered is then cached for the next duplicate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from services.common.cache import Cache
from services.common.settings import Settings
from services.ingest import dedupe_cache, metrics, store
from services.ingest.parsing import NewEvent

DUPLICATE_CODE = "E-IDEMPOTENT-001"


@dataclass(slots=True)
class Outcome:
    run_id: str
    provider_event_id: str
    duplicate: bool


class EventIngestor:
    def __init__(self, pool: asyncpg.Pool, cache: Cache, settings: Settings) -> None:
        self.pool = pool
        self.cache = cache
        self.retention = settings.dedupe_retention
        # a Redis key must never claim a duplicate for a row retention already removed
        self.redis_ttl = min(settings.redis_dedupe_ttl, settings.dedupe_retention)

    async def ingest(self, events: Sequence[NewEvent], *, principal_id: str, actor: str) -> list[Outcome]:
        """outcome[i] answers events[i]."""
        n = len(events)
        first: dict[tuple[str, str, str], int] = {}
        unique: list[int] = []
        repeats: list[tuple[int, int]] = []  # (index, index of its first occurrence in this call)
        for i, e in enumerate(events):
            j = first.setdefault((e.project_id, e.channel, e.provider_event_id), i)
            if j == i:
                unique.append(i)
            else:
                repeats.append((i, j))

        run_ids: list[str] = [""] * n
        duplicate = [True] * n
        keys = [
            dedupe_cache.key(self.cache, e.project_id, e.channel, e.provider_event_id)
            for e in (events[i] for i in unique)
        ]
        cached = await dedupe_cache.lookup(self.cache, keys)
        misses = [pos for pos, run_id in enumerate(cached) if run_id is None]
        for pos, run_id in enumerate(cached):
            if run_id is not None:
                run_ids[unique[pos]] = run_id
        if misses:
            stored = await store.ingest(
                self.pool,
                [events[unique[pos]] for pos in misses],
                principal_id=principal_id,
                actor=actor,
                retention=self.retention,
            )
            remember = []
            for pos, s in zip(misses, stored, strict=True):
                i = unique[pos]
                run_ids[i] = s.run_id
                duplicate[i] = not s.created
                ttl = self.redis_ttl if s.created else min(self.redis_ttl, s.ttl_left or 0.0)
                remember.append((keys[pos], s.run_id, ttl))
            await dedupe_cache.remember(self.cache, remember)
        for i, j in repeats:
            run_ids[i] = run_ids[j]

        out = []
        for i, e in enumerate(events):
            (metrics.DUPLICATE if duplicate[i] else metrics.CREATED)[e.channel].inc()
            out.append(Outcome(run_ids[i], e.provider_event_id, duplicate[i]))
        return out
