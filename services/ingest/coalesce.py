"""Coalescing: many concurrent callers' items go through one flush (one Redis MGET, one
Postgres statement) instead of one round trip each.

A caller submits its items and awaits its own results. Flushes start on the next turn of the
event loop, so everything submitted in the same turn travels together, and at most
`max_in_flight` flushes run at once: under load, what arrives while they run waits for the
next one and goes in a single larger flush. Alone, a request is flushed at once, by itself,
so coalescing costs no latency when idle. A caller's items are never split across flushes,
so a batch RPC still costs one store round trip; a flush never takes more than `max_items`
unless a single submission is that large.

Linger: when a flush ends with items already waiting, the service is busy, and the next flush
waits `linger` seconds (or until `max_items` wait) so that what keeps arriving joins it. Without
it a busy event loop made its own flushes smaller: the slower each call, the fewer calls reach
the store during one flush, the more round trips each event pays for, the slower each call
(docs/benchmarks.md, "Third pass"). Idle, nothing lingers.

Blast radius of one: when a flush of several callers' items fails, the failure may be one
caller's item (a value the statement refuses that validation did not catch), so each caller's
items are flushed again on their own and each caller gets its own result or error. Only a
failure that every caller would have got alone (`shared(exc)`, e.g. the store is unavailable) is
given to all of them at once, without the retries; without `shared`, every failure is.
A caller that goes away (cancelled RPC) does not stop the flush its items are in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_in_flight: int,
        max_items: int,
        shared: Callable[[Exception], bool] | None = None,
        linger: float = 0.0,
    ) -> None:
        self._flush = flush
        self._shared = shared
        self.max_in_flight = max(1, max_in_flight)
        self.max_items = max(1, max_items)
        self.linger = max(0.0, linger)
        self._pending: list[tuple[Sequence[T], asyncio.Future[list[R]] | None]] = []
        self._pending_items = 0
        self._in_flight = 0
        self._scheduled = False
        self._lingering: asyncio.TimerHandle | None = None  # the next flush's start, when it lingers
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, items: Sequence[T]) -> list[R]:
        """The results for items, in order (result[i] answers items[i])."""
        fut: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._queue(items, fut)
        return await fut

    def submit_nowait(self, items: Sequence[T]) -> None:
        """Queues items whose results nobody waits for (errors are dropped)."""
        if items:
            self._queue(items, None)

    def _queue(self, items: Sequence[T], fut: asyncio.Future[list[R]] | None) -> None:
        self._pending.append((items, fut))
        self._pending_items += len(items)
        if self._lingering is not None and self._pending_items >= self.max_items:
            self._start_now()  # a full flush waits for nothing
        else:
            self._schedule()

    async def drain(self) -> None:
        """Waits until everything submitted so far has been flushed (used at shutdown)."""
        while self._pending or self._tasks:
            if self._lingering is not None:
                self._start_now()
            elif self._pending:
                self._schedule()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await asyncio.sleep(0)  # a flush is scheduled to start on the next turn

    def _schedule(self, busy: bool = False) -> None:
        if not self._scheduled and self._in_flight < self.max_in_flight:
            self._scheduled = True
            loop = asyncio.get_running_loop()
            if busy and self.linger:
                self._lingering = loop.call_later(self.linger, self._start)
            else:
                loop.call_soon(self._start)

    def _start_now(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
        self._start()

    def _start(self) -> None:
        self._scheduled = False
        self._lingering = None
        while self._pending and self._in_flight < self.max_in_flight:
            taken, size = 0, 0
            for items, _ in self._pending:
                if taken and size + len(items) > self.max_items:
                    break
                taken += 1
                size += len(items)
            batch, self._pending = self._pending[:taken], self._pending[taken:]
            self._pending_items -= size
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[Sequence[T], asyncio.Future[list[R]] | None]]) -> None:
        try:
            flat = [item for items, _ in batch for item in items]
            try:
                results = await self._flush(flat)
            except asyncio.CancelledError:
                for _, fut in batch:
                    if fut is not None and not fut.done():
                        fut.cancel()
                raise
            except Exception as exc:
                if len(batch) > 1 and self._shared is not None and not self._shared(exc):
                    await self._one_by_one(batch)
                    return
                for _, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)
                return
            start = 0
            for items, fut in batch:
                end = start + len(items)
                if fut is not None and not fut.done():
                    fut.set_result(list(results[start:end]))
                start = end
        finally:
            self._in_flight -= 1
            if self._pending:  # they came while this flush ran: busy
                self._schedule(busy=True)

    async def _one_by_one(self, batch: list[tuple[Sequence[T], asyncio.Future[list[R]] | None]]) -> None:
        """Settles each submission of a failed flush with a flush of its own items."""
        for items, fut in batch:
            try:
                results = await self._flush(list(items))
            except Exception as exc:
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                continue
            if fut is not None and not fut.done():
                fut.set_result(list(results))
