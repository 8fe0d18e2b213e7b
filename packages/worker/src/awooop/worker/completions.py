"""Completes runs in batches with CompleteRuns, or on the worker's next ClaimRuns.

One CompleteRuns call is in flight at a time; completions that become ready meanwhile queue
and go together in the next call. No timers: a lone completion is sent at once, and the
batch size follows the load (the busier the worker, the more each call carries).

A full worker (every slot busy, its claim loop waiting for a slot) has a ClaimRuns to send as
soon as a run finishes: completions ready then are held for that call instead
(ClaimRunsRequest.complete; the Worker takes them with take() and hands the answers back with
settle()), so a busy worker's cycle is ClaimRuns + Heartbeat. They are answered per item
exactly as CompleteRuns answers. A scheduler that predates the field answers no results for
them: they are sent with CompleteRuns, and none is held again.

Each caller still sees CompleteRun's result or error for its own run: the scheduler answers
per item (LEASE_LOST -> LeaseLost, like CompleteRun). A failure of the whole call (scheduler
unreachable) is raised to every caller in it. A batch refused as INVALID_ARGUMENT (one bad
item, e.g. an oversized output) is resent item by item with CompleteRun, so only the bad
item's caller gets the error; a scheduler without CompleteRuns (UNIMPLEMENTED) is served the
same way from then on.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence

import grpc

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client
from awooop.worker.errors import (
    FORBIDDEN,
    INVALID_TRANSITION,
    LEASE_LOST,
    NOT_FOUND,
    AwooopError,
    ErrorDetails,
    LeaseLost,
)

MAX_BATCH = 1000  # the scheduler's limit per CompleteRuns call
METHOD = "/awooop.scheduler.v1.SchedulerService/CompleteRuns"

# status code of each per-item reason, as CompleteRun would have answered it
_CODES = {
    LEASE_LOST: grpc.StatusCode.FAILED_PRECONDITION,
    INVALID_TRANSITION: grpc.StatusCode.FAILED_PRECONDITION,
    NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
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
        self._held: list[_Pending] = []  # waiting for the worker's next ClaimRuns
        self._sender: asyncio.Task[None] | None = None
        self._batched = True  # False once the scheduler answered UNIMPLEMENTED
        self._carrier: Callable[[], bool] | None = None
        self._on_held: Callable[[], None] | None = None
        self.carry = True  # False once a scheduler ignored completions carried by ClaimRuns
        self.calls = 0  # CompleteRuns calls sent (for tests and stats)
        self.carried = 0  # completions answered by ClaimRuns calls (for tests and stats)
        self.claim_calls = 0  # ClaimRuns calls that answered carried completions

    def set_carrier(self, wants: Callable[[], bool], on_held: Callable[[], None]) -> None:
        """wants(): True while a ClaimRuns will go out as soon as a run finishes (the worker is
        full); a completion made then is held for it and on_held() is called (to wake the claim
        loop). The caller must then take() the held completions and settle() them."""
        self._carrier, self._on_held = wants, on_held

    async def complete(self, request: scheduler_pb2.CompleteRunRequest) -> common_pb2.Run:
        """Completes one run; returns it COMPLETED or raises CompleteRun's error for it."""
        future: Future = asyncio.get_running_loop().create_future()
        if self.carry and self._carrier is not None and self._on_held is not None and self._carrier():
            self._held.append((request, future))
            self._on_held()
        else:
            self._enqueue([(request, future)])
        return await future

    @property
    def held(self) -> int:
        """Completions waiting for the next ClaimRuns."""
        return len(self._held)

    def take(self) -> list[_Pending]:
        """The held completions (at most MAX_BATCH), for ClaimRunsRequest.complete."""
        batch, self._held = self._held[:MAX_BATCH], self._held[MAX_BATCH:]
        return batch

    def settle(self, batch: list[_Pending], results: Sequence[scheduler_pb2.CompleteRunResult]) -> None:
        """Answers the callers of a batch carried by ClaimRuns from ClaimRunsResponse.completed.
        No results at all: the scheduler predates the field and did not complete them."""
        if len(results) != len(batch):
            self.carry = False
            self._enqueue(batch)
            return
        self.claim_calls += 1
        self.carried += len(batch)
        _answer(batch, results)

    def claim_failed(self, batch: list[_Pending], err: AwooopError) -> None:
        """The ClaimRuns carrying batch failed as a whole. Bad input (one bad item, or the claim
        itself): sent again with CompleteRuns, which answers each caller on its own. Otherwise
        the outcome is unknown: each caller gets the error, as from a failed CompleteRuns."""
        if err.code == grpc.StatusCode.INVALID_ARGUMENT:
            self._enqueue(batch)
            return
        for _, future in batch:
            if not future.done():
                future.set_exception(err)

    def release_held(self) -> None:
        """Sends whatever is held with CompleteRuns (the claim loop is not going to send it)."""
        if self._held:
            batch, self._held = self._held, []
            self._enqueue(batch)

    def _enqueue(self, batch: list[_Pending]) -> None:
        self._queue.extend(batch)
        if self._sender is None or self._sender.done():
            # in a context of its own: the task outlives the run that started it and sends other
            # runs' completions, so its calls must not be spans of that run's trace
            self._sender = asyncio.create_task(
                self._send_all(), name="awooop-complete-runs", context=contextvars.Context()
            )

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
                _answer(batch, response.results)
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


def _answer(batch: list[_Pending], results: Sequence[scheduler_pb2.CompleteRunResult]) -> None:
    for (_, future), result in zip(batch, results, strict=True):
        if future.done():  # the caller went away
            continue
        if result.error_reason:
            future.set_exception(item_error(result))
        else:
            future.set_result(result.run)
