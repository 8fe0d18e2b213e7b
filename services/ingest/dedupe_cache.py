"""The Redis fast path for duplicates: `<prefix>dedupe:{<project>}:<channel>:<provider_event_id>` -> run_id.

Redis only ever holds what Postgres committed (keys are written after the commit, or from a
committed dedupe row), so a hit is a true duplicate and a miss just costs the Postgres path,
whose unique constraint stays the authority. A key never outlives its dedupe row: its TTL is
at most the time the row has left before retention prunes it, and the pruner deletes the keys
of the rows it removes. Every call degrades (services.common.cache): with Redis down or
flushed, lookups miss and writes are dropped, and the next successful write refills it.
The project is the key's hash tag: on a Redis Cluster one project's keys share a slot, and a
batch spanning projects is sent as one command per project.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from services.common.cache import Cache
from services.ingest import metrics

PART = "dedupe"


def key(cache: Cache, project_id: str, channel: str, provider_event_id: str) -> str:
    return f"{cache.prefix}{PART}:{{{project_id}}}:{channel}:{provider_event_id}"


# MGET with each hit's time to live, so what a hit teaches the process's own memory
# (services/ingest/recent.py) expires no later than the key: [value, pttl, value, pttl, ...].
GET_MANY = (
    "local out = {} for i, k in ipairs(KEYS) do local v = redis.call('GET', k) "
    "out[2 * i - 1] = v out[2 * i] = v and redis.call('PTTL', k) or -2 end return out"
)


async def lookup(cache: Cache, keys: Sequence[str]) -> list[tuple[str, float] | None]:
    """(run_id, seconds left) per key (None: not cached, or Redis unavailable); one round trip."""
    if not keys:
        return []
    values = await _get_many(cache, keys) if cache.enabled else None
    if values is None:
        metrics.REDIS_UNAVAILABLE.inc(len(keys))
        return [None] * len(keys)
    out: list[tuple[str, float] | None] = [
        (v.decode(), ttl / 1000) if v is not None else None for v, ttl in zip(values[::2], values[1::2], strict=True)
    ]
    hits = sum(1 for v in out if v is not None)
    if hits:
        metrics.REDIS_HITS.inc(hits)
    if hits < len(out):
        metrics.REDIS_MISSES.inc(len(out) - hits)
    return out


async def _get_many(cache: Cache, keys: Sequence[str]) -> list[Any] | None:
    """GET_MANY over keys, one command per hash tag group; None when any group failed."""
    groups = cache.by_tag(keys)
    if len(groups) == 1:
        result = await cache.call("eval", GET_MANY, len(keys), *keys)
        return list(result) if result is not None else None
    parts = await asyncio.gather(*(cache.call("eval", GET_MANY, len(g), *(keys[i] for i in g)) for g in groups))
    out: list[Any] = [None, -2] * len(keys)
    for g, part in zip(groups, parts, strict=True):
        if part is None:
            return None
        for j, i in enumerate(g):
            out[2 * i], out[2 * i + 1] = part[2 * j], part[2 * j + 1]
    return out


# One command for a whole flush: a pipeline of SETs costs redis-py a parsed reply per key
# (about 5x the CPU of this script at 500 keys). On a Redis Cluster one command per project:
# the keys of one command must share a hash slot.
SET_MANY = "for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[2 * i - 1], 'EX', ARGV[2 * i]) end return #KEYS"


async def remember(cache: Cache, entries: Iterable[tuple[str, str, float]]) -> None:
    """SETs (key, run_id, ttl seconds) with one command; entries with no time left are skipped."""
    keys: list[str] = []
    args: list[str | int] = []
    for k, run_id, ttl in entries:
        if ttl >= 1:
            keys.append(k)
            args += (run_id, int(ttl))
    if keys and cache.enabled:
        groups = cache.by_tag(keys)
        await asyncio.gather(
            *(
                cache.call(
                    "eval", SET_MANY, len(g), *(keys[i] for i in g), *(a for i in g for a in args[2 * i : 2 * i + 2])
                )
                for g in groups
            )
        )


async def forget(cache: Cache, keys: Sequence[str], chunk: int = 1000) -> None:
    """Deletes keys (after their dedupe rows were pruned)."""
    if not cache.enabled:
        return
    for group in cache.by_tag(keys):
        same = [keys[i] for i in group]
        for i in range(0, len(same), chunk):
            await cache.call("delete", *same[i : i + chunk])
