"""Completes runs in batches with CompleteRuns.

One CompleteRuns call is in flight at a time; completions that become ready meanwhile queue
and go together in the next call. No timers: a lone completion is sent at once, and the
batch size follows the load (the busier the worker, the more each call carries).

Each caller still sees CompleteRun's result or error for its own run: the scheduler answers
per item (LEASE_LOST -> LeaseLost, like CompleteRun). A failure of the whole call (scheduler
unreachable) is raised to every caller in it. A batch refused as INVALID_ARGUMENT (one bad
item, e.g. an oversized output) is resent item by item with CompleteRun, so only the bad
item's caller gets the error; a scheduler without CompleteRuns (UNIMPLEMENTED) is served the
same way from then on.
"""

from __future__ import annotations

import asyncio

import grpc

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client
from awooop.worker.errors import LEASE_LOST, AwooopError, ErrorDetails, LeaseLost

MAX_BATCH = 1000  # the scheduler's limit per CompleteRuns call
METHOD = "/awooop.scheduler.v1.SchedulerService/CompleteRuns"

# status code of each per-item reason, as CompleteRun would have answered it
_CODES = {
    LEASE_LOST: grpc.StatusCode.FAILED_PRECONDITION,
    "INVALID_TRANSITION": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "FORBIDDEN": grpc.StatusCode.PERMISSION_DENIED,
}

Future = asyncio.Future[common_pb2.Run]
_Pending = tuple[scheduler_pb2.CompleteRunRequest, Future]


def item_error(result: scheduler_pb2.CompleteRunResult) -> AwooopError:
    """The error CompleteRun would have raised for this refused item."""
    code = _CODES.get(result.error_reason, grpc.StatusCode.UNKNOWN)
    details = ErrorDetails(code, result.error_reason, result.error_message)
    kind = LeaseLost if result.error_reason == LEASE_LOST else AwooopError
    return kind(details, METHOD)


class CompletionBatcher:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._queue: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None
        self._batched = True  # False once the scheduler answered UNIMPLEMENTED
        self.calls = 0  # CompleteRuns calls sent (for tests and stats)

    async def complete(self, request: scheduler_pb2.CompleteRunRequest) -> common_pb2.Run:
        """Completes one run; returns it COMPLETED or raises CompleteRun's error for it."""
        future: Future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all(), name="awooop-complete-runs")
        return await future

    async def _send_all(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                await self._send(batch)
            except Exception as exc:  # never leave a caller waiting forever
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)

    async def _send(self, batch: list[_Pending]) -> None:
        if self._batched:
            self.calls += 1
            request = scheduler_pb2.CompleteRunsRequest(runs=[r for r, _ in batch])
            try:
                response = await self.client.call(self.client.scheduler.CompleteRuns, request)
            except AwooopError as err:
                if err.code == grpc.StatusCode.UNIMPLEMENTED:
                    self._batched = False
                elif err.code != grpc.StatusCode.INVALID_ARGUMENT or len(batch) == 1:
                    raise
                # resend one by one: each caller gets its own answer
            else:
                for (_, future), result in zip(batch, response.results, strict=True):
                    if future.done():  # the caller went away
                        continue
                    if result.error_reason:
                        future.set_exception(item_error(result))
                    else:
                        future.set_result(result.run)
                return
        await asyncio.gather(*(self._send_one(r, f) for r, f in batch))

    async def _send_one(self, request: scheduler_pb2.CompleteRunRequest, future: Future) -> None:
        try:
            response = await self.client.call(self.client.scheduler.CompleteRun, request)
        except AwooopError as err:
            if not future.done():
                future.set_exception(err)
            return
        if not future.done():
            future.set_result(response.run)
