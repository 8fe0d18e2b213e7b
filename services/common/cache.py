"""Redis as a cache and signal bus, never the only copy of anything.

Every call degrades instead of failing: when Redis is down or slow, reads miss and
writes are dropped, and the service falls back to Postgres. After a failure the client
stays "down" for a short back-off so a dead Redis costs no timeout per request; it
recovers by itself on the first call after the back-off.

With AWOOOP_REDIS_CLUSTER the client is redis-py's RedisCluster. Keys that one command takes
together carry the same hash tag (`{project}`), and callers split a multi-key command by
tag (`by_tag`), so no command spans slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisClusterException, RedisError

from services.common.settings import Settings

log = logging.getLogger("awooop.cache")

RETRY_AFTER = 1.0  # seconds Redis is considered down after an error
# What a call may raise when Redis fails it: RedisClusterException is not a RedisError (e.g. no
# node of the cluster answers). AttributeError and TypeError too: redis-py's asyncio client lets a
# connection closed under a write escape as those (its writer already None; redis/redis-py#3546),
# e.g. when the cluster client replaces a node while it rediscovers slots.
_CLIENT_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError, AttributeError, TypeError)


class Cache:
    def __init__(self, settings: Settings, url: str | None = None) -> None:
        self.prefix = settings.redis_prefix
        self.url = url if url is not None else settings.redis_url
        self.cluster = settings.redis_cluster
        self._client: Any = None  # aioredis.Redis, or RedisCluster with AWOOOP_REDIS_CLUSTER
        if self.url and self.cluster:
            from redis.asyncio.cluster import RedisCluster
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = RedisCluster.from_url(
                self.url,
                socket_timeout=0.5,
                socket_connect_timeout=0.5,
                # a primary that is down costs its own slots, not the cluster's other keys
                require_full_coverage=False,
                retry=Retry(NoBackoff(), 1),  # one retry after a MOVED / dead node, then degrade
            )
        elif self.url:
            self._client = aioredis.from_url(
                self.url,
                socket_timeout=0.5,
                socket_connect_timeout=0.5,
                health_check_interval=10,
                retry_on_timeout=False,
            )
        self._down_until = 0.0

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> Any:
        return self._client

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def by_tag(self, keys: Sequence[str]) -> list[list[int]]:
        """Indices of keys grouped so each group may go in one command: all of them on one
        Redis; one group per hash tag ({...}) on a Redis Cluster."""
        if not self.cluster:
            return [list(range(len(keys)))] if keys else []
        groups: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            start = k.find("{")
            end = k.find("}", start + 1) if start >= 0 else -1
            groups.setdefault(k[start + 1 : end] if end > start + 1 else k, []).append(i)
        return list(groups.values())

    async def connect(self) -> None:
        """At start-up, before concurrent calls: a cluster client learns the slot map now. Its
        first commands would otherwise each start that discovery, and redis-py replaces the node
        a command is using meanwhile and closes its connection under it. A Redis that is down
        now is not fatal: the first call after its back-off tries again."""
        if self._client is None or not self.cluster:
            return
        try:
            await self._client.initialize()
        except _CLIENT_ERRORS as exc:
            self._failed(exc)

    def available(self) -> bool:
        return self._client is not None and time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        if time.monotonic() >= self._down_until:
            log.warning("redis unavailable, falling back to postgres", extra={"error": repr(exc)})
        self._down_until = time.monotonic() + RETRY_AFTER

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Runs one Redis command; None when Redis is unavailable."""
        if not self.available():
            return None
        assert self._client is not None
        try:
            return await getattr(self._client, method)(*args, **kwargs)
        except _CLIENT_ERRORS as exc:
            self._failed(exc)
            return None

    async def pipeline(self, commands: list[tuple[str, tuple[Any, ...]]]) -> list[Any] | None:
        """Runs commands in one round trip; None when Redis is unavailable."""
        if not self.available() or not commands:
            return None
        assert self._client is not None
        try:
            pipe = self._client.pipeline(transaction=False)
            for method, args in commands:
                getattr(pipe, method)(*args)
            return list(await pipe.execute())
        except _CLIENT_ERRORS as exc:
            self._failed(exc)
            return None

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except (RedisError, OSError):
                pass
