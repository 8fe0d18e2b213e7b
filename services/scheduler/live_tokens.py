"""A run's live token channel (docs/architecture.md "Token streams"): one Redis stream per (run,
stream name), an entry per published batch. The entry id is `<attempt>-<last seq>`, so ids grow
with (attempt, seq), a watcher's cursor is the last token it has, and a batch repeated by a retried
PublishTokens is recognised by its seq and not added again (the script below, one atomic call).
The stream keeps about AWOOOP_STREAM_LIVE_ENTRIES entries and expires AWOOOP_STREAM_LIVE_TTL after
its last batch. Redis is never the only copy: the checkpoints in Postgres are."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from services.common.cache import Cache

# ARGV: attempt, first seq, produced_at (ms), maxlen, ttl (ms), tokens... Answers the tokens added
# (0: all there already; -1: a later attempt published already, so this one is stale; -2: an id
# the stream had before, its entries all trimmed away: refused, the checkpoint carries them).
APPEND = """
local attempt = tonumber(ARGV[1]) local first = tonumber(ARGV[2]) local n = #ARGV - 5
local skip = 0
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last > 0 then
  local id = last[1][1] local dash = string.find(id, '-', 1, true)
  local la = tonumber(string.sub(id, 1, dash - 1)) local ls = tonumber(string.sub(id, dash + 1))
  if la > attempt then return -1 end
  if la == attempt then skip = ls - first + 1 end
end
if skip < 0 then skip = 0 end
if skip >= n then return 0 end
local toks = {}
for i = 6 + skip, #ARGV do toks[#toks + 1] = ARGV[i] end
local added = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], string.format('%d-%d', attempt, first + n - 1),
                          'f', string.format('%d', first + skip), 't', ARGV[3], 'x', cjson.encode(toks))
if type(added) == 'table' and added.err then return -2 end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return n - skip
"""


class LiveUnavailable(Exception):
    """Redis is not configured, down, or in its back-off after a failure."""


@dataclass(frozen=True)
class Entry:
    """One batch of the live channel."""

    attempt: int
    first_seq: int
    tokens: list[str]
    produced_ms: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.tokens) - 1


class LiveChannel:
    def __init__(self, cache: Cache, max_entries: int, ttl: float) -> None:
        self.cache = cache
        self.max_entries = max_entries
        self.ttl_ms = int(ttl * 1000)

    def key(self, run_id: str, stream: str) -> str:
        return self.cache.key("tokens", run_id, stream)

    async def append(
        self, run_id: str, stream: str, attempt: int, first_seq: int, tokens: list[str], at_ms: int
    ) -> bool:
        """Adds the batch's new tokens; False when Redis is unavailable (nothing raised: the
        checkpoint carries them)."""
        if not tokens:
            return True
        args = (attempt, first_seq, at_ms, self.max_entries, self.ttl_ms, *tokens)
        added = await self.cache.call("eval", APPEND, 1, self.key(run_id, stream), *args)
        return added is not None and int(added) >= 0

    async def read(self, run_id: str, stream: str, attempt: int, seq: int, block_ms: int | None) -> list[Entry]:
        """The entries after token (attempt, seq), waiting up to block_ms for one (None: not at
        all); raises LiveUnavailable."""
        if not self.cache.available():
            raise LiveUnavailable
        cursor = f"{attempt}-{seq}" if attempt > 0 else "0-0"
        answer = await self.cache.call("xread", {self.key(run_id, stream): cursor}, count=100, block=block_ms)
        if answer is None and not self.cache.available():
            raise LiveUnavailable
        out = []
        for _key, entries in answer or []:
            for entry_id, fields in entries:
                a = int(entry_id.split(b"-")[0])
                out.append(Entry(a, int(fields[b"f"]), json.loads(fields[b"x"]), int(fields[b"t"])))
        return out


def now_ms() -> int:
    return int(time.time() * 1000)
