"""In-process memory of recently answered event keys: dedupe key -> run_id, least recently used
out first. A duplicate that this process has seen (created, or answered from Redis or Postgres)
is answered from here without a Redis round trip.

Only committed answers go in (a run id from Postgres, or from Redis, which only holds committed
ones), so a hit is a true duplicate on every replica. Entries expire no later than their dedupe
row's retention, like the Redis keys: each carries the time its source said it had left.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class RecentKeys:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float | None = None) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        run_id, expires = entry
        if expires <= (time.monotonic() if now is None else now):
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return run_id

    def put(self, key: str, run_id: str, ttl: float, now: float | None = None) -> None:
        """Remembers key for ttl seconds (nothing when ttl < 1 or the memory is off)."""
        if self.capacity <= 0 or ttl < 1:
            return
        self._entries[key] = (run_id, (time.monotonic() if now is None else now) + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
