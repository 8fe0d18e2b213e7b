"""A handler's token streams (ctx.stream_token; docs/worker-sdk.md "Token streams"): high-rate
partial output, such as an LLM's tokens, for whoever watches the run.

Tokens are numbered 1, 2, 3, ... per (run, attempt, stream) and sent in batches (PublishTokens),
one call at a time (a batch due while one is in flight goes when it ends, so the calls a handler
makes do not depend on timing):
a batch leaves BATCH_INTERVAL after its first token, or at once for a stream's first token (the
answer carries the scheduler's checkpoint cadence) and when the handler awaits a flush.
Every batch goes to the live channel; every so often (the scheduler's cadence: so many tokens,
milliseconds or bytes, answered with each publish) a batch carries all the tokens since the last
checkpoint and the scheduler writes them as one durable row. ctx.emit, ctx.complete and ctx.fail
checkpoint first, so the run's log holds the whole output when the run ends. A failed call is
retried with the same batch: the scheduler keeps a token once, by its seq."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING

import grpc
from google.protobuf import timestamp_pb2

from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.errors import AwooopError

if TYPE_CHECKING:
    from awooop.worker.run_scope import RunScope

DEFAULT_STREAM = "output"
BATCH_INTERVAL = 0.02  # seconds a token waits for others to share its call
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RETRIES = 5
TOKEN_OVERHEAD = 4  # bytes a token adds to a checkpoint's JSON ("",): the scheduler's budget counts them


class TokenStream:
    """One stream of one attempt: the tokens not yet sent, and those since the last checkpoint."""

    def __init__(self, ctx: RunScope, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.seq = 0  # the last token numbered
        self.sent = 0  # the last token sent live
        self.since: list[str] = []  # tokens after the last checkpoint (checkpointed = seq - len(since))
        self.since_bytes = 0
        self.first_at = 0.0  # wall clock of the oldest unsent token
        self.checkpoint_started = 0.0  # monotonic time of the first token after the last checkpoint
        self.every_tokens, self.every_ms, self.every_bytes = 500, 2000, 32 * 1024  # until the scheduler says
        self.lock = asyncio.Lock()
        self.timer: asyncio.Task[None] | None = None
        self.error: BaseException | None = None  # a background send's failure, raised to the handler
        self.live = True  # the last publish reached the live channel

    def add(self, text: str) -> bool:
        """Numbers a token; True when a send is due now (the first token, a checkpoint's worth)."""
        if self.error is not None:
            raise self.error
        if not self.since:
            self.checkpoint_started = time.monotonic()
        if self.sent == self.seq:
            self.first_at = time.time()
        self.seq += 1
        self.since.append(text)
        self.since_bytes += len(text.encode()) + TOKEN_OVERHEAD
        if self.timer is None or self.timer.done():
            self.timer = asyncio.create_task(self._later())
        # the first token goes at once: the scheduler's answer tells the cadence of the rest
        return self.seq == 1 or self._checkpoint_due()

    def _checkpoint_due(self) -> bool:
        waited = (time.monotonic() - self.checkpoint_started) * 1000
        return bool(self.since) and (
            len(self.since) >= self.every_tokens or self.since_bytes >= self.every_bytes or waited >= self.every_ms
        )

    async def _later(self) -> None:
        await asyncio.sleep(BATCH_INTERVAL)
        if self.lock.locked():  # a send is in flight: it schedules the next batch as it ends
            return
        try:
            await self.send()
        except Exception as exc:  # the handler gets it with its next token or flush
            self.error = exc

    async def send(self, *, checkpoint: bool = False) -> None:
        """Sends the unsent tokens; with checkpoint (or when one is due), all since the last one."""
        async with self.lock:
            if self.error is not None:
                raise self.error
            checkpoint = bool(self.since) and (checkpoint or self._checkpoint_due())
            if self.sent == self.seq and not checkpoint:
                return
            first = self.seq - len(self.since) + 1 if checkpoint else self.sent + 1
            tokens = list(self.since if checkpoint else self.since[len(self.since) - (self.seq - self.sent) :])
            at = timestamp_pb2.Timestamp()
            at.FromNanoseconds(int(self.first_at * 1e9))
            request = scheduler_pb2.PublishTokensRequest(
                lease=self.ctx.lease,
                stream=self.name,
                first_seq=first,
                tokens=tokens,
                produced_at=at,
                checkpoint=checkpoint,
            )
            resp = await self._publish(request)
            self.sent = first + len(tokens) - 1
            self.live = resp.live
            if resp.checkpoint_tokens > 0:
                self.every_tokens, self.every_ms = resp.checkpoint_tokens, resp.checkpoint_ms
                self.every_bytes = resp.checkpoint_bytes
            if checkpoint:  # tokens added during the call stay for the next one
                self.since = self.since[len(tokens) :]
                self.since_bytes = sum(len(t.encode()) + TOKEN_OVERHEAD for t in self.since)
                self.checkpoint_started = time.monotonic()
            timer = self.timer
            if self.sent < self.seq and (timer is None or timer.done() or timer is asyncio.current_task()):
                self.timer = asyncio.create_task(self._later())  # the tokens added meanwhile

    async def _publish(self, request: scheduler_pb2.PublishTokensRequest) -> scheduler_pb2.PublishTokensResponse:
        client = self.ctx.client
        for attempt in range(RETRIES):
            try:
                return await client.call(client.scheduler.PublishTokens, request)
            except AwooopError as err:
                if err.code not in RETRY_CODES or attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)  # the same batch again: kept once, by seq
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self.timer is not None and not self.timer.done():
            self.timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.timer


class TokenStreams:
    """A RunScope's streams by name."""

    def __init__(self, ctx: RunScope) -> None:
        self.ctx = ctx
        self.streams: dict[str, TokenStream] = {}

    async def token(self, text: str, stream: str) -> None:
        s = self.streams.get(stream)
        if s is None:
            s = self.streams[stream] = TokenStream(self.ctx, stream)
        if s.add(text):
            await s.send()

    async def checkpoint(self) -> None:
        """Every stream's tokens sent and written durably (before an emit and the run's end)."""
        for s in self.streams.values():
            await s.send(checkpoint=True)

    async def close(self) -> None:
        for s in self.streams.values():
            await s.close()

    async def pipe(self, chunks: AsyncIterable[str], stream: str) -> str:
        parts = []
        async for chunk in chunks:
            parts.append(chunk)
            await self.token(chunk, stream)
        await self.checkpoint()
        return "".join(parts)
