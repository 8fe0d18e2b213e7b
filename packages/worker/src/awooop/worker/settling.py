"""Calls that settle a run (complete, fail, hand back, acknowledge a cancel), tried again until
a deadline.

The channel's own retry policy covers a refused connection for a few tenths of a second; a
scheduler that is slow or briefly away (a restart, a store that answers late) outlasts it. A
settling call that ended UNAVAILABLE or DEADLINE_EXCEEDED is safe to send again: the scheduler
answers a repeated CompleteRun / FailRun of the same lease with the same success, and a
repeated ReleaseRun with LEASE_LOST (the lease is no longer ours either way). Every other error
is an answer and is raised at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from awooop.worker.errors import AwooopError

# the call may not have reached the scheduler, or its answer was lost: worth another try
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
MIN_TIMEOUT = 0.5  # every try gets at least this long, even when the deadline is (nearly) over
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 1.0

T = TypeVar("T")


async def until(deadline: Callable[[], float], call: Callable[[float], Awaitable[T]]) -> T:
    """Awaits call(timeout) and again after UNAVAILABLE / DEADLINE_EXCEEDED while deadline()
    (monotonic seconds, asked before each try: it may move) has not passed; raises the last error.
    There is always a first try; timeout is the time left to the deadline (at least MIN_TIMEOUT)."""
    backoff = FIRST_BACKOFF
    while True:
        try:
            return await call(max(deadline() - time.monotonic(), MIN_TIMEOUT))
        except AwooopError as err:
            if err.code not in RETRY_CODES or time.monotonic() + backoff >= deadline():
                raise
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)
