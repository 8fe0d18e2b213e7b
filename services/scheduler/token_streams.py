"""Token streams (issue 46; docs/architecture.md "Token streams"): a run's high-rate partial output.

PublishTokens checks the caller's lease (a read, trusted for AWOOOP_STREAM_LEASE_CHECK), puts the
batch on the run's live channel (live_tokens.py) and, for a checkpoint batch, appends one durable
progress row of kind `stream_checkpoint` through the fenced, bounded emit (run_events.emit, keyed
by the batch's last seq, so a retried checkpoint is not written twice).

A watch with tokens (TokenTail) delivers, per stream, each token once and in order: from the
checkpoint rows it passes on, and from the live channel after the last token delivered. A token
it can no longer deliver live is announced as a TokenGap; Redis down is announced once
(TokenChannel live=False) and the watch goes on with checkpoints until Redis answers again."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.run_events import STREAM_CHECKPOINT, EventSource
from services.scheduler import reads_sql, run_events, token_streams_sql
from services.scheduler.live_tokens import Entry, LiveChannel, LiveUnavailable

CHECKPOINT_KIND = STREAM_CHECKPOINT
DEFAULT_STREAM = "output"
MAX_STREAM_NAME = 64
READ_BLOCK_MS = 200  # one XREAD's wait: a durable row (a woken watch) waits at most this long
RETRY_LIVE = 1.0  # seconds between a watch's tries of an unavailable Redis
MAX_CACHED_LEASES = 10_000
# bytes a token adds to a checkpoint's JSON beside its text ("",): a batch's size counts them, so a
# checkpoint of half AWOOOP_MAX_RUN_EVENT_BYTES fits in one event (escapes aside: checked)
TOKEN_OVERHEAD = 4


@dataclass(frozen=True)
class Published:
    live: bool
    checkpoint_offset: int


class LeaseChecks:
    """Leases PublishTokens found held, trusted for `ttl` seconds: a batch every few ms must not
    cost a query each. A reaped attempt may publish live tokens for at most that long; its
    checkpoints are refused at once (the emit locks the run and checks the lease)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.held: dict[tuple[str, int, str], float] = {}

    async def check(self, pool: asyncpg.Pool, principal: Principal, run_id: str, attempt: int) -> None:
        key = (run_id, attempt, principal.principal_id)
        now = time.monotonic()
        if self.held.get(key, 0.0) > now:
            return
        projects = projects_with(principal, run_events.WORKER_ROLE)
        if not await token_streams_sql.token_lease_holds(pool, run_id=run_id, attempt=attempt, projects=projects):
            self.held.pop(key, None)
            run = await reads_sql.get_run(pool, run_id=run_id)
            check_run_access(principal, run["project_id"] if run is not None else None, run_events.WORKER_ROLE, run_id)
            raise errors.lease_lost(run_id, attempt)
        if len(self.held) >= MAX_CACHED_LEASES:
            self.held = {k: t for k, t in self.held.items() if t > now}
        self.held[key] = now + self.ttl


@dataclass(frozen=True)
class Batch:
    run_id: str
    attempt: int
    stream: str
    first_seq: int
    tokens: list[str]
    produced_ms: int
    checkpoint: bool


def checkpoint_data(b: Batch) -> str:
    """A checkpoint row's data: the tokens since the previous checkpoint, one string each (a
    watcher that has some of them live takes the rest by seq)."""
    last = b.first_seq + len(b.tokens) - 1
    data = {"stream": b.stream, "attempt": b.attempt, "first_seq": b.first_seq, "last_seq": last, "tokens": b.tokens}
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


async def publish(
    pool: asyncpg.Pool,
    channel: LiveChannel,
    leases: LeaseChecks,
    principal: Principal,
    b: Batch,
    bounds: run_events.Bounds,
    max_bytes: int,
) -> Published:
    """Live first (a watcher then has the tokens before their checkpoint), then the checkpoint."""
    await leases.check(pool, principal, b.run_id, b.attempt)
    live = await channel.append(b.run_id, b.stream, b.attempt, b.first_seq, b.tokens, b.produced_ms)
    offset = 0
    if b.checkpoint and b.tokens:
        data = checkpoint_data(b)
        if len(data.encode()) > max_bytes:  # a text of many escapes: the event's own limit
            raise errors.invalid(
                [("tokens", f"the checkpoint is {len(data.encode())} bytes as JSON; at most {max_bytes}")]
            )
        key = f"tokens:{b.stream}:{b.attempt}:{b.first_seq + len(b.tokens) - 1}"
        emitted = await run_events.emit(pool, principal, b.run_id, b.attempt, CHECKPOINT_KIND, data, key, bounds)
        offset = emitted.offset
    return Published(live, offset)


# --- the watch's side ---


@dataclass(frozen=True)
class Tokens:
    stream: str
    attempt: int
    first_seq: int
    tokens: list[str]
    produced_at: dt.datetime | None
    from_checkpoint: bool


@dataclass(frozen=True)
class Gap:
    stream: str
    attempt: int
    from_seq: int
    to_seq: int
    reason: str  # trimmed | lost


@dataclass(frozen=True)
class Channel:
    live: bool
    message: str


TokenItem = Tokens | Gap | Channel


class TokenTail:
    """One watch's position in one token stream: the last token delivered, (attempt, seq)."""

    def __init__(self, channel: LiveChannel, run_id: str, stream: str, attempt: int, seq: int) -> None:
        self.channel = channel
        self.run_id = run_id
        self.stream = stream
        self.attempt = attempt
        self.seq = seq
        self.live: bool | None = None  # None: not tried yet
        self.lost = False  # Redis was unavailable since the last live token: a gap is a loss

    def _take(
        self, attempt: int, first: int, tokens: list[str], at: dt.datetime | None, durable: bool
    ) -> list[TokenItem]:
        """The part of a batch after the last token delivered, with the gap before it, if any."""
        if attempt < self.attempt or not tokens:
            return []  # an earlier attempt's, superseded
        if attempt > self.attempt:
            self.attempt, self.seq = attempt, 0
        last = first + len(tokens) - 1
        if last <= self.seq:
            return []
        out: list[TokenItem] = []
        if first > self.seq + 1:
            reason = "lost" if self.lost or durable else "trimmed"
            out.append(Gap(self.stream, attempt, self.seq + 1, first - 1, reason))
        start = max(first, self.seq + 1)
        out.append(Tokens(self.stream, attempt, start, tokens[start - first :], at, durable))
        self.seq = last
        return out

    def from_row(self, row: run_events.LogRow) -> list[TokenItem]:
        """The tokens of a checkpoint row of this stream that were not delivered live."""
        d = row.data
        if row.source is not EventSource.PROGRESS or row.kind != CHECKPOINT_KIND or d.get("stream") != self.stream:
            return []
        return self._take(int(d["attempt"]), int(d["first_seq"]), list(d["tokens"]), row.at, True)

    def _from_entry(self, e: Entry) -> list[TokenItem]:
        items = self._take(
            e.attempt, e.first_seq, e.tokens, dt.datetime.fromtimestamp(e.produced_ms / 1000, dt.UTC), False
        )
        self.lost = False
        return items

    async def wait(self, woken: asyncio.Event, timeout: float) -> AsyncIterator[TokenItem]:
        """Live tokens until the watch is woken (a new log row) or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while not woken.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                entries = await self.channel.read(
                    self.run_id, self.stream, self.attempt, self.seq, int(min(left, READ_BLOCK_MS / 1000) * 1000) or 1
                )
            except LiveUnavailable:
                if self.live is not False:
                    self.live, self.lost = False, True
                    yield Channel(False, "live tokens unavailable (Redis): tokens arrive with checkpoints")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=min(left, RETRY_LIVE))
                continue
            if self.live is False:
                yield Channel(True, "live tokens available again")
            self.live = True
            for e in entries:
                for item in self._from_entry(e):
                    yield item

    async def drain(self) -> list[TokenItem]:
        """The live tokens there are now, without waiting (a snapshot: the console's run page)."""
        try:
            entries = await self.channel.read(self.run_id, self.stream, self.attempt, self.seq, None)
        except LiveUnavailable:
            return [] if self.live is False else [Channel(False, "live tokens unavailable (Redis)")]
        return [item for e in entries for item in self._from_entry(e)]


def first_notice(tail: TokenTail) -> list[TokenItem]:
    """A watch on a scheduler without Redis is told at once that only checkpoints will come."""
    if tail.channel.cache.enabled:
        return []
    tail.live = False
    return [Channel(False, "no live channel (no Redis configured): tokens arrive with checkpoints")]
