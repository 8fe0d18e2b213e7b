"""Watching a run: its log (state changes, journal steps, progress events) from an offset, then
live, then the ended run (WatchRun). A dropped stream is resumed from the last offset received,
so a caller sees every event once, in order."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client
from awooop.worker.errors import AwooopError
from awooop.worker.structs import from_struct

SOURCES = {
    scheduler_pb2.RUN_EVENT_SOURCE_STATE: "state",
    scheduler_pb2.RUN_EVENT_SOURCE_STEP: "step",
    scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS: "progress",
}
RESUME_CODES = (grpc.StatusCode.UNAVAILABLE,)  # a replica draining, a dropped connection
RESUME_BACKOFF = 0.2


@dataclass(frozen=True)
class Event:
    """One row of a run's log."""

    offset: int
    source: str  # state | step | progress
    kind: str
    data: dict[str, Any]
    attempt: int
    at: Any  # datetime (UTC)


@dataclass(frozen=True)
class Tokens:
    """Tokens of a run's stream (watch_run with tokens), live or from a checkpoint row."""

    stream: str
    attempt: int  # a new attempt starts again at seq 1
    first_seq: int
    tokens: list[str]
    produced_at: Any  # datetime (UTC): when the first was produced
    from_checkpoint: bool

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.tokens) - 1


@dataclass(frozen=True)
class TokenGap:
    """Tokens from_seq..to_seq of an attempt the watcher will not get live (reason: trimmed from
    the live channel, or lost with Redis); the run's stream_checkpoint rows hold them."""

    stream: str
    attempt: int
    from_seq: int
    to_seq: int
    reason: str


@dataclass(frozen=True)
class TokenChannel:
    """The live channel went away (live False: tokens come only with checkpoints) or came back."""

    live: bool
    message: str


WatchItem = Event | Tokens | TokenGap | TokenChannel


def token_item_of(msg: scheduler_pb2.WatchRunResponse) -> Tokens | TokenGap | TokenChannel | None:
    if msg.HasField("token_batch"):
        b = msg.token_batch
        at = b.produced_at.ToDatetime(dt.UTC) if b.HasField("produced_at") else None
        return Tokens(b.stream, b.attempt, b.first_seq, list(b.tokens), at, b.from_checkpoint)
    if msg.HasField("token_gap"):
        g = msg.token_gap
        return TokenGap(g.stream, g.attempt, g.from_seq, g.to_seq, g.reason)
    if msg.HasField("token_channel"):
        return TokenChannel(msg.token_channel.live, msg.token_channel.message)
    return None


def event_of(pb: scheduler_pb2.WatchEvent) -> Event:
    return Event(
        pb.offset,
        SOURCES.get(pb.source, "unknown"),
        pb.kind,
        from_struct(pb.data),
        pb.attempt,
        pb.at.ToDatetime(dt.UTC),
    )


async def watch_run(
    client: Client,
    run_id: str,
    *,
    after: int = 0,
    until_saga_ends: bool = False,
    tokens: bool = False,
    token_stream: str = "output",
) -> AsyncIterator[WatchItem | common_pb2.Run]:
    """Yields the run's events after `after`, in order, then the ended Run (with its output), and
    stops; with until_saga_ends, a failed or cancelled run's compensation is followed to its end
    first (compensated, compensation_failed or not_needed). With tokens, also the token stream's
    Tokens (each token once, in order), a TokenGap for tokens it will not get live, and a
    TokenChannel when the live channel goes away or returns. Resumes after the last offset (and
    token) when the stream drops (UNAVAILABLE); other failures raise AwooopError (NOT_FOUND,
    INVALID_ARGUMENT for a bad offset, ...)."""
    token_attempt, token_after = 0, 0
    while True:
        request = scheduler_pb2.WatchRunRequest(
            run_id=run_id,
            after=after,
            until_saga_ends=until_saga_ends,
            tokens=tokens,
            token_stream=token_stream,
            token_attempt=token_attempt,
            token_after=token_after,
        )
        call = client.scheduler.WatchRun(request, metadata=client.metadata)
        try:
            async for msg in call:
                if msg.HasField("run"):
                    yield msg.run
                    return
                item = token_item_of(msg)
                if item is None:
                    after = msg.event.offset
                    yield event_of(msg.event)
                    continue
                if isinstance(item, (Tokens, TokenGap)):
                    token_attempt = item.attempt
                    token_after = item.last_seq if isinstance(item, Tokens) else item.to_seq
                yield item
        except grpc.aio.AioRpcError as err:
            if err.code() not in RESUME_CODES:
                raise AwooopError.from_rpc(err, "/awooop.scheduler.v1.SchedulerService/WatchRun") from None
            await asyncio.sleep(RESUME_BACKOFF)
            continue
        finally:
            call.cancel()
        # the stream ended without the run (a server that closed it cleanly): resume
        await asyncio.sleep(RESUME_BACKOFF)


async def read_events(client: Client, run_id: str, *, after: int = 0) -> list[Event]:
    """The rows the run's log holds now (WatchRun with snapshot: no following)."""
    call = client.scheduler.WatchRun(
        scheduler_pb2.WatchRunRequest(run_id=run_id, after=after, snapshot=True),
        metadata=client.metadata,
        timeout=client.timeout,
    )
    try:
        return [event_of(msg.event) async for msg in call if msg.HasField("event")]
    except grpc.aio.AioRpcError as err:
        raise AwooopError.from_rpc(err, "/awooop.scheduler.v1.SchedulerService/WatchRun") from None
