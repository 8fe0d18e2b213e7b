"""Retention (seed ADR-114 risks, seed 003 section 3): dedupe rows older than
AWOOOP_DEDUPE_RETENTION (7 days) and idempotency keys past expires_at are deleted in batches
of AWOOOP_PRUNE_BATCH by a loop every AWOOOP_PRUNE_INTERVAL.

Each batch is one short statement whose victims are chosen with FOR UPDATE SKIP LOCKED, so
any number of ingest replicas can prune at once without waiting on each other or deleting a
row twice. A pass stops at the first short batch, or after MAX_BATCHES_PER_PASS batches (the
rest waits for the next pass). Runs are never pruned: only their dedupe rows and keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from services.common.cache import Cache
from services.common.settings import Settings
from services.ingest import dedupe_cache, metrics

MAX_BATCHES_PER_PASS = 20

PRUNE_DEDUPE_SQL = """
DELETE FROM awooop_channel_event_dedupe
 WHERE dedupe_id IN (SELECT dedupe_id FROM awooop_channel_event_dedupe
                      WHERE created_at < now() - make_interval(secs => $1)
                      ORDER BY created_at
                      LIMIT $2
                        FOR UPDATE SKIP LOCKED)
RETURNING project_id, channel_type, provider_event_id
"""

PRUNE_KEYS_SQL = """
DELETE FROM awooop_idempotency_key
 WHERE idempotency_id IN (SELECT idempotency_id FROM awooop_idempotency_key
                           WHERE expires_at <= now()
                           ORDER BY expires_at
                           LIMIT $1
                             FOR UPDATE SKIP LOCKED)
"""


@dataclass(slots=True)
class Pruned:
    dedupe: int = 0
    idempotency_keys: int = 0


async def prune_dedupe(pool: asyncpg.Pool, cache: Cache, *, retention: float, batch: int) -> int:
    """Deletes expired dedupe rows (and their Redis keys); returns how many."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        rows = await pool.fetch(PRUNE_DEDUPE_SQL, float(retention), batch)
        if rows:
            total += len(rows)
            metrics.PRUNED.labels("awooop_channel_event_dedupe").inc(len(rows))
            await dedupe_cache.forget(cache, [dedupe_cache.key(cache, *r) for r in rows])
        if len(rows) < batch:
            break
    return total


async def prune_idempotency_keys(pool: asyncpg.Pool, *, batch: int) -> int:
    """Deletes expired idempotency keys; returns how many."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        status = await pool.execute(PRUNE_KEYS_SQL, batch)
        n = int(status.split()[-1])
        if n:
            total += n
            metrics.PRUNED.labels("awooop_idempotency_key").inc(n)
        if n < batch:
            break
    return total


async def prune(pool: asyncpg.Pool, cache: Cache, settings: Settings) -> Pruned:
    """One retention pass over both tables (what the background loop runs)."""
    return Pruned(
        dedupe=await prune_dedupe(pool, cache, retention=settings.dedupe_retention, batch=settings.prune_batch),
        idempotency_keys=await prune_idempotency_keys(pool, batch=settings.prune_batch),
    )
