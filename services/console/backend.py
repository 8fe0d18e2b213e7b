"""The console's gRPC side: one channel per service, shared by every operator; each call
carries the signed-in operator's own key, so the services decide what that operator may see
and do. Reads for a page run concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.worker.client import open_channel
from awooop.worker.errors import AwooopError

R = TypeVar("R")
TIMEOUT = 10.0


@dataclass
class RunView:
    """Everything the run page shows: GetRun, GetRunHistory and GetJournal, as `awooop runs show`."""

    run: Any
    history: list[scheduler_pb2.RunEvent]
    journal: saga_pb2.GetJournalResponse | None
    problems: list[str]
    waits: list[scheduler_pb2.Wait] = field(default_factory=list)  # ListWaits: open ones first
    progress: list[scheduler_pb2.WatchEvent] = field(default_factory=list)  # the handler's ctx.emit events
    children: list[scheduler_pb2.ChildRunRef] = field(default_factory=list)  # the run tree, start order
    more_children: bool = False  # GetRun listed only the first children: the runs page lists them all
    waiting_for_build: bool = False  # GetRun: queued, pinned to a build no live worker runs
    # the run's streamed tokens (ctx.stream_token): the checkpoints' and the live tail's batches, gaps
    tokens: list[scheduler_pb2.WatchRunResponse] = field(default_factory=list)


class Backend:
    def __init__(self, scheduler_addr: str, saga_addr: str, *, ca_file: str = "") -> None:
        tls = bool(ca_file)
        self._channels = [
            open_channel(scheduler_addr, tls=tls, ca_file=ca_file or None),
            open_channel(saga_addr, tls=tls, ca_file=ca_file or None),
        ]
        self.scheduler = scheduler_pb2_grpc.SchedulerServiceStub(self._channels[0])
        self.saga = saga_pb2_grpc.SagaServiceStub(self._channels[1])

    async def call(self, method: Callable[..., Awaitable[R]], request: Any, key: str) -> R:
        try:
            return await method(request, timeout=TIMEOUT, metadata=(("authorization", f"Bearer {key}"),))
        except grpc.aio.AioRpcError as err:
            raise AwooopError.from_rpc(err) from None

    async def run_view(self, key: str, run_id: str) -> RunView:
        """The run, its history, its journal and its durable waits in one round of concurrent
        calls. The run must be readable (its error is raised); the others' errors are reported,
        not raised."""
        run_call = self.call(self.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id), key)
        history_call = self.call(self.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=run_id), key)
        journal_call = self.call(self.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id), key)
        waits_call = self.call(self.scheduler.ListWaits, scheduler_pb2.ListWaitsRequest(run_id=run_id), key)
        progress_call = self.progress(key, run_id)
        run_r, hist_r, journal_r, waits_r, progress_r = await asyncio.gather(
            _answer(run_call), _answer(history_call), _answer(journal_call), _answer(waits_call), _answer(progress_call)
        )
        if isinstance(run_r, AwooopError):
            raise run_r
        problems = []
        history: list[scheduler_pb2.RunEvent] = []
        journal = None
        if isinstance(hist_r, AwooopError):
            problems.append(f"history: {hist_r.details.render()}")
        else:
            history = list(hist_r.events)
        if isinstance(journal_r, AwooopError):
            problems.append(f"journal: {journal_r.details.render()}")
        else:
            journal = journal_r
        waits: list[scheduler_pb2.Wait] = []
        if isinstance(waits_r, AwooopError):
            problems.append(f"waits: {waits_r.details.render()}")
        else:
            waits = list(waits_r.waits)
        progress: list[scheduler_pb2.WatchEvent] = []
        tokens: list[scheduler_pb2.WatchRunResponse] = []
        if isinstance(progress_r, AwooopError):
            problems.append(f"progress events: {progress_r.details.render()}")
        else:
            progress, tokens = progress_r
        return RunView(
            run_r.run,
            history,
            journal,
            problems,
            waits,
            progress,
            list(run_r.children),
            run_r.more_children,
            run_r.waiting_for_build,
            tokens,
        )

    async def progress(
        self, key: str, run_id: str
    ) -> tuple[list[scheduler_pb2.WatchEvent], list[scheduler_pb2.WatchRunResponse]]:
        """The run's progress events so far and its streamed tokens (WatchRun with snapshot and
        tokens: the log as it is and the live tokens there are now, no following)."""
        call = self.scheduler.WatchRun(
            scheduler_pb2.WatchRunRequest(run_id=run_id, snapshot=True, tokens=True),
            timeout=TIMEOUT,
            metadata=(("authorization", f"Bearer {key}"),),
        )
        events: list[scheduler_pb2.WatchEvent] = []
        tokens: list[scheduler_pb2.WatchRunResponse] = []
        try:
            async for m in call:
                if m.HasField("event"):
                    if m.event.source == scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS:
                        events.append(m.event)
                elif not m.HasField("run"):
                    tokens.append(m)
        except grpc.aio.AioRpcError as err:
            raise AwooopError.from_rpc(err) from None
        return events, tokens

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()


async def _answer(call: Awaitable[R]) -> R | AwooopError:
    """The call's answer, or its error as a value (other exceptions propagate)."""
    try:
        return await call
    except AwooopError as err:
        return err
