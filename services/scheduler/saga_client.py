"""Nudges the saga service after a compensation request was recorded.

The request row (awooop_compensation_request) is written in the same transaction as the
state change that causes it, and the saga service's recovery loop drives every recorded
request to an end. This RPC only makes compensation start without waiting for that loop:
it is fire-and-forget, short, and a failure is logged and counted, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common.peers import peer_channel
from services.common.settings import Settings
from services.scheduler import metrics

log = logging.getLogger("awooop.scheduler.saga")

NUDGE_TIMEOUT = 2.0  # seconds; the recovery loop covers anything slower


class SagaNudger:
    def __init__(self, settings: Settings) -> None:
        self.addr = settings.saga_addr
        self.metadata = (("authorization", f"Bearer {settings.internal_api_key}"),)
        self._tls_cert = settings.tls_cert_file
        self._channel: grpc.aio.Channel | None = None
        self._stub: saga_pb2_grpc.SagaServiceAsyncStub | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.addr)

    def nudge(self, run_id: str, trigger: str, reason: str = "") -> None:
        """Sends SagaService.Compensate in the background (no-op without AWOOOP_SAGA_ADDR)."""
        if not self.addr:
            return
        task = asyncio.get_running_loop().create_task(self._send(run_id, trigger, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stub_now(self) -> saga_pb2_grpc.SagaServiceAsyncStub:
        if self._stub is None:
            self._channel = peer_channel(self.addr, self._tls_cert)
            self._stub = saga_pb2_grpc.SagaServiceStub(self._channel)
        return self._stub

    async def _send(self, run_id: str, trigger: str, reason: str) -> None:
        request = saga_pb2.CompensateRequest(
            run_id=run_id,
            trigger=saga_pb2.CompensationTrigger.Value(f"COMPENSATION_TRIGGER_{trigger.upper()}"),
            reason=reason[:4096],
        )
        try:
            await self._stub_now().Compensate(request, metadata=self.metadata, timeout=NUDGE_TIMEOUT)
            metrics.SAGA_NUDGES.labels("ok").inc()
        except grpc.aio.AioRpcError as exc:
            metrics.SAGA_NUDGES.labels("error").inc()
            log.warning(
                "saga nudge failed; its recovery loop will pick the request up",
                extra={"run_id": run_id, "trigger": trigger, "code": exc.code().name, "error": exc.details()},
            )
        except Exception:
            metrics.SAGA_NUDGES.labels("error").inc()
            log.exception("saga nudge failed", extra={"run_id": run_id, "trigger": trigger})

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=NUDGE_TIMEOUT)
        for t in list(self._tasks):
            t.cancel()
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
