"""grpc.health.v1 for one server, with per-service status.

Like grpc_health's asyncio reference servicer (same `set` and `enter_graceful_shutdown`),
except that a Watch stream ends once the server shuts down: the reference keeps every
Watch open until the grace period runs out, so one watching load balancer would hold
every shutdown for the full AWOOOP_SHUTDOWN_GRACE. Here watchers get NOT_SERVING and then
the end of the stream, and the grace period is spent only on real in-flight RPCs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# a ServingStatus value (types-grpcio-health-checking declares the enum without its ValueType)
ServingStatus = int


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self) -> None:
        self._status: dict[str, ServingStatus] = {"": SERVING}
        self._changed = asyncio.Condition()
        self._shutting_down = False
        self._watchers = 0
        self._no_watchers = asyncio.Event()
        self._no_watchers.set()

    def status(self, service: str = "") -> ServingStatus | None:
        return self._status.get(service)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        self._watchers += 1
        self._no_watchers.clear()
        try:
            while True:
                async with self._changed:
                    status = self._status.get(request.service, SERVICE_UNKNOWN)
                    if status == last and not self._shutting_down:
                        await self._changed.wait()
                        continue
                if status != last:
                    # grpc sends each yielded message before asking for the next one, so once
                    # this generator ends its last message has been written
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                if self._shutting_down:
                    return
        finally:
            self._watchers -= 1
            if self._watchers == 0:
                self._no_watchers.set()

    async def set(self, service: str, status: ServingStatus) -> None:
        """Sets one service's status (ignored once shutting down, as in the reference)."""
        if self._shutting_down:
            return
        async with self._changed:
            self._status[service] = status
            self._changed.notify_all()

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good; open Watch streams get it and then end."""
        async with self._changed:
            self._shutting_down = True
            for service in self._status:
                self._status[service] = NOT_SERVING
            self._changed.notify_all()

    async def watchers_done(self, timeout: float) -> bool:
        """Waits (up to timeout) until every Watch stream has sent its last message and ended."""
        try:
            await asyncio.wait_for(self._no_watchers.wait(), timeout)
            return True
        except TimeoutError:
            return False


async def wait_serving(address: str, timeout: float) -> bool:
    """Polls the server at address with Health/Check until it answers SERVING (True) or timeout
    seconds pass (False). For whatever starts a server process and must wait for it."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as ch:
        stub: Any = health_pb2_grpc.HealthStub(ch)  # the stubs declare no methods on HealthStub
        while True:
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if r.status == SERVING:
                    return True
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)


class Readiness:
    """A verdict beyond "the server is up" on one plane of a service: while it names a problem (the
    saga has no key the tool gateway accepts), that plane's health name is NOT_SERVING, so a
    healthcheck shows what a log line alone would hide. Runtime attaches it to the plane's name
    (ServiceParts.planes), never to the service's own names; the service sets or clears it."""

    def __init__(self, problem: str | None = None) -> None:
        self.problem = problem
        self._attached: list[tuple[HealthServicer, list[str]]] = []

    @property
    def status(self) -> ServingStatus:
        return SERVING if self.problem is None else NOT_SERVING

    async def attach(self, hs: HealthServicer, services: list[str]) -> None:
        """Reports the current verdict on hs for services (and every later change)."""
        self._attached.append((hs, services))
        for name in services:
            await hs.set(name, self.status)

    async def set(self, problem: str | None) -> bool:
        """Sets the problem (None: none); True when the verdict changed."""
        if problem == self.problem:
            return False
        self.problem = problem
        for hs, services in self._attached:
            for name in services:
                await hs.set(name, self.status)
        return True
