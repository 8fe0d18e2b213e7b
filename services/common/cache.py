"""Redis as a cache and signal bus, never the only copy of anything.

Every call degrades instead of failing: when Redis is down or slow, reads miss and
writes are dropped, and the service falls back to Postgres. After a failure the client
stays "down" for a short back-off so a dead Redis costs no timeout per request; it
recovers by itself on the first call after the back-off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.common.settings import Settings

log = logging.getLogger("awooop.cache")

RETRY_AFTER = 1.0  # seconds Redis is considered down after an error


class Cache:
    def __init__(self, settings: Settings, url: str | None = None) -> None:
        self.prefix = settings.redis_prefix
        self.url = url if url is not None else settings.redis_url
        self._client: aioredis.Redis | None = None
        if self.url:
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
    def client(self) -> aioredis.Redis | None:
        return self._client

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

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
        except (RedisError, OSError, TimeoutError) as exc:
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
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return None

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except (RedisError, OSError):
                pass
