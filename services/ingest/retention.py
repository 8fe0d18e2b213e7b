"""Retention (seed ADR-114 risks, seed 003 section 3): dedupe rows older than
AWOOOP_DEDUPE_RETENTION (7 days) and idempotency keys past expires_at are deleted in batches
of AWOOOP_PRUNE_BATCH by a loop every AWOOOP_PRUNE_INTERVAL.

Each batch is one short statement whose victims are chosen with FOR UPDATE SKIP LOCKED, so
any number of ingest replicas can prune at once without waiting on each other or deleting a
row twice. A pass stops at the first short batch, or after MAX_BATCHES_PER_PASS batches (the
rest waits for the next pass).

Finished runs (COMPLETED, FAILED, CANCELLED) go after AWOOOP_RUN_RETENTION (30 days; 0 keeps
them) with their journal, compensation request, alerts (ON DELETE CASCADE) and audit rows, in
the same kind of batch. A run is kept while anything may still answer with it: its event's
dedupe row (a provider retry replays the run), an unexpired idempotency key naming it (a
CreateRun retry), a compensation that is not done, an alert not yet delivered, or a saga that
is compensating or failed to compensate (an operator still has to act on it). So a replay
never meets a pruned run; a GetRun of one answers NOT_FOUND.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from services.common.cache import Cache
from services.common.settings import Settings
from services.ingest import dedupe_cache, metrics, retention_sql

MAX_BATCHES_PER_PASS = 20


@dataclass(slots=True)
class Pruned:
    dedupe: int = 0
    idempotency_keys: int = 0
    runs: int = 0


async def prune_dedupe(pool: asyncpg.Pool, cache: Cache, *, retention: float, batch: int) -> int:
    """Deletes expired dedupe rows (and their Redis keys); returns how many."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        rows = await retention_sql.prune_dedupe(pool, retention=float(retention), batch=batch)
        if rows:
            total += len(rows)
            metrics.PRUNED.labels("awooop_channel_event_dedupe").inc(len(rows))
            keys = [dedupe_cache.key(cache, r["project_id"], r["channel_type"], r["provider_event_id"]) for r in rows]
            await dedupe_cache.forget(cache, keys)
        if len(rows) < batch:
            break
    return total


async def prune_idempotency_keys(pool: asyncpg.Pool, *, batch: int) -> int:
    """Deletes expired idempotency keys; returns how many."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        status = await retention_sql.prune_idempotency_keys(pool, batch=batch)
        n = int(status.split()[-1])
        if n:
            total += n
            metrics.PRUNED.labels("awooop_idempotency_key").inc(n)
        if n < batch:
            break
    return total


async def prune_runs(pool: asyncpg.Pool, *, retention: float, batch: int) -> int:
    """Deletes finished runs older than retention (0: none) with their rows; returns how many."""
    if retention <= 0:
        return 0
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        status = await retention_sql.prune_runs(pool, retention=float(retention), batch=batch)
        n = int(status.split()[-1])
        if n:
            total += n
            metrics.PRUNED.labels("awooop_run_state").inc(n)
        if n < batch:
            break
    return total


async def prune(pool: asyncpg.Pool, cache: Cache, settings: Settings) -> Pruned:
    """One retention pass (what the background loop runs): dedupe rows and keys first, so the
    runs they referenced can go in the same pass."""
    dedupe = await prune_dedupe(pool, cache, retention=settings.dedupe_retention, batch=settings.prune_batch)
    keys = await prune_idempotency_keys(pool, batch=settings.prune_batch)
    await retention_sql.prune_debounce_windows(
        pool, retention=float(settings.dedupe_retention), batch=settings.prune_batch
    )
    runs = await prune_runs(pool, retention=settings.run_retention, batch=settings.prune_batch)
    return Pruned(dedupe=dedupe, idempotency_keys=keys, runs=runs)
