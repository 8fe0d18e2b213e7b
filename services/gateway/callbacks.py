"""Posting a parked tool call's outcome to its callback URL (a durable wait's, on ingest's HTTP
server): {"result": {...}} or {"error": "...", "code": "..."}.

A refused post (4xx: the wait is unknown or already ended) is final and logged; a failed one (no
answer, 5xx) is tried again with backoff a few times, then given up and logged: the wait then
ends by its timeout, which the handler sees.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from prometheus_client import Counter

from services.common.observability import preset

log = logging.getLogger("awooop.gateway")

POSTS = Counter("awooop_gateway_callback_posts_total", "Parked tool calls' outcomes posted, by outcome", ["outcome"])
preset(POSTS, ("delivered", "refused", "gave_up"))
ATTEMPTS = 5
BACKOFF = 0.5  # seconds, doubled after each failed try
TIMEOUT = 10.0


class CallbackPoster:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(self, url: str, body: dict[str, Any]) -> str:
        """Delivers body to url; returns the outcome (delivered, refused or gave_up)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        delay = BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            try:
                async with self._session.post(url, json=body) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        POSTS.labels("delivered").inc()
                        return "delivered"
                    if resp.status < 500:
                        log.warning("callback %s refused the outcome (%s): %s", _redacted(url), resp.status, text[:500])
                        POSTS.labels("refused").inc()
                        return "refused"
                    failure = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            log.warning("callback %s failed (try %d of %d): %s", _redacted(url), attempt, ATTEMPTS, failure)
            if attempt < ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
        POSTS.labels("gave_up").inc()
        return "gave_up"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _redacted(url: str) -> str:
    """The URL without its token (the token is the credential)."""
    head, _, tail = url.rpartition("/")
    return f"{head}/{tail[:4]}…" if tail else url
