"""Stopping a worker process exactly at one point of one of its calls (issue 41), as
tests/harness/pgfault.py does for the store: a grpc.aio client interceptor in the worker's Client
(awooop.worker.Client(interceptors=...)) that SIGKILLs its own process.

A crash point is (label, n, phase): the n-th call with that label among the calls made for the
runs the handler tracks (`CrashPoint.track(run_id)` at the handler's start, so the runs of other
handlers, such as an event's own run, never shift the count), and where in that call:

- `before`: the request is never sent;
- `committed`: the server answered (it committed, or refused), the SDK never sees the answer;
- `answered`: the SDK has the answer, and the process dies at the next turn of its event loop.

Labels are the RPC's method name, except that a run's completion is `complete` whichever RPC
carried it (CompleteRun, CompleteRuns, or a ClaimRuns carrying completions), and the calls a worker
makes on a timer (Heartbeat, ClaimRuns carrying nothing) are not counted: a crash between them is
the `before` point of the next counted call. In `record` mode nothing is killed and every counted
label is appended to a file: the enumeration a test derives its crash points from.

With `pause_dir`, the process is not killed but frozen at the point (its event loop blocked: no
heartbeat, no other run moves) until the test has acted (cancelled a parent, say) and created
`go` there; `paused` there says it has reached the point. The cancel-point enumeration uses it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

PHASES = ("before", "committed", "answered")
COMPLETIONS = {"CompleteRun", "CompleteRuns"}
TIMERS = {"Heartbeat"}


@dataclass(frozen=True)
class Point:
    label: str
    n: int
    phase: str

    def __str__(self) -> str:
        return f"{self.label}#{self.n}:{self.phase}"

    @classmethod
    def parse(cls, text: str) -> Point:
        call, phase = text.rsplit(":", 1)
        label, n = call.rsplit("#", 1)
        assert phase in PHASES, text
        return cls(label, int(n), phase)


def enumerate_points(labels: list[str]) -> list[Point]:
    """Every crash point of a recorded call sequence: each call, each phase."""
    seen: Counter[str] = Counter()
    points = []
    for label in labels:
        seen[label] += 1
        points += [Point(label, seen[label], phase) for phase in PHASES]
    return points


def _run_ids(request: Any) -> list[str]:
    lease = getattr(request, "lease", None)
    if lease is not None and lease.run_id:
        return [lease.run_id]
    if getattr(request, "run_id", ""):
        return [request.run_id]
    items = list(getattr(request, "runs", [])) or list(getattr(request, "complete", []))
    return [i.lease.run_id for i in items]


def label_of(method: str, request: Any) -> str | None:
    """The call's label, or None for a call that is not counted."""
    name = method.rsplit("/", 1)[-1]
    if name in TIMERS:
        return None
    if name == "ClaimRuns":
        return "complete" if list(request.complete) else None
    return "complete" if name in COMPLETIONS else name


class CrashPoint(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Kills this process at `point` (a Point's text), or, with point "record", appends every
    counted label to `record_to`."""

    def __init__(self, point: str, record_to: str | None = None, pause_dir: str | None = None) -> None:
        self.point = None if point == "record" else Point.parse(point)
        self.record_to = record_to
        self.tracked: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.pause_dir = pause_dir
        self._kill: Callable[[], None] = self._freeze if pause_dir else self._sigkill

    @staticmethod
    def _sigkill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def _freeze(self) -> None:
        assert self.pause_dir is not None
        with open(os.path.join(self.pause_dir, "paused"), "w") as marker:
            marker.write(str(self.point))
        go = os.path.join(self.pause_dir, "go")
        while not os.path.exists(go):
            time.sleep(0.02)

    def track(self, run_id: str) -> None:
        self.tracked.add(run_id)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        label = label_of(method, request)
        if label is None or not self.tracked.intersection(_run_ids(request)):
            return await continuation(details, request)
        self.counts[label] += 1
        if self.record_to is not None:
            with open(self.record_to, "a") as out:
                out.write(label + "\n")
        hit = self.point is not None and (label, self.counts[label]) == (self.point.label, self.point.n)
        if hit and self.point is not None and self.point.phase == "before":
            self._kill()
        call = await continuation(details, request)
        if hit and self.point is not None and self.point.phase != "before":
            try:
                await call  # the server's answer (or error) has arrived
            except grpc.aio.AioRpcError:
                pass
            if self.point.phase == "committed":
                self._kill()
            else:  # answered: once the SDK has it
                asyncio.get_running_loop().call_soon(self._kill)
        return call
