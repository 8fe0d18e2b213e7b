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
    client: Client, run_id: str, *, after: int = 0, until_saga_ends: bool = False
) -> AsyncIterator[Event | common_pb2.Run]:
    """Yields the run's events after `after`, in order, then the ended Run (with its output), and
    stops; with until_saga_ends, a failed or cancelled run's compensation is followed to its end
    first (compensated, compensation_failed or not_needed). Resumes after the last offset when the
    stream drops (UNAVAILABLE); other failures raise AwooopError (NOT_FOUND, INVALID_ARGUMENT for a
    bad offset, ...)."""
    while True:
        call = client.scheduler.WatchRun(
            scheduler_pb2.WatchRunRequest(run_id=run_id, after=after, until_saga_ends=until_saga_ends),
            metadata=client.metadata,
        )
        try:
            async for msg in call:
                if msg.HasField("run"):
                    yield msg.run
                    return
                after = msg.event.offset
                yield event_of(msg.event)
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
