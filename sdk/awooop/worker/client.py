"""Channels and stubs for the awooop services, as every client (worker, CLI, demo) uses them.

- Retries: the channel's service config retries UNAVAILABLE only (connection refused, server
  draining, STORE_UNAVAILABLE), up to 4 attempts with exponential backoff. Nothing else is
  retried: every other code is an answer.
- Deadlines: every call gets one (`timeout`, default 10 s) unless the caller passes its own.
- Auth: `authorization: Bearer <key>` metadata on every call.
- Addresses: argument, else AWOOOP_<SERVICE>_ADDR, else the `awooop up` default port.
- TLS: off unless `tls=True`, a CA file is given, or AWOOOP_TLS / AWOOOP_TLS_CA_FILE is set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from awooop.ingest.v1 import ingest_pb2_grpc
from awooop.saga.v1 import saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2_grpc
from awooop.tools.v1 import tools_pb2_grpc
from awooop.worker import tracing
from awooop.worker.errors import AwooopError

DEFAULT_ADDRESSES = {
    "ingest": "127.0.0.1:50051",
    "scheduler": "127.0.0.1:50052",
    "saga": "127.0.0.1:50053",
    "gateway": "127.0.0.1:50054",
}
DEFAULT_TIMEOUT = 10.0

SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{}],  # every method of every service
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", SERVICE_CONFIG),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
]

STUBS: dict[str, Callable[[grpc.aio.Channel], Any]] = {
    "ingest": ingest_pb2_grpc.IngestServiceStub,
    "scheduler": scheduler_pb2_grpc.SchedulerServiceStub,
    "saga": saga_pb2_grpc.SagaServiceStub,
    "gateway": tools_pb2_grpc.ToolGatewayServiceStub,
}

R = TypeVar("R")


def address(service: str, given: str | None = None) -> str:
    """Where a service is: the given address, else AWOOOP_<SERVICE>_ADDR, else the default port."""
    return given or os.environ.get(f"AWOOOP_{service.upper()}_ADDR") or DEFAULT_ADDRESSES[service]


def api_key(given: str | None = None) -> str:
    return given or os.environ.get("AWOOOP_API_KEY", "")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def open_channel(
    target: str, *, tls: bool | None = None, ca_file: str | None = None, interceptors: Sequence[Any] = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel with the UNAVAILABLE-only retry policy (interceptors: tracing's)."""
    ca_file = ca_file or os.environ.get("AWOOOP_TLS_CA_FILE") or None
    if tls is None:
        tls = bool(ca_file) or _env_flag("AWOOOP_TLS")
    extra = list(interceptors) or None
    if not tls:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS, interceptors=extra)
    root = None
    if ca_file:
        with open(ca_file, "rb") as f:
            root = f.read()
    return grpc.aio.secure_channel(
        target, grpc.ssl_channel_credentials(root), options=CHANNEL_OPTIONS, interceptors=extra
    )


class Client:
    """Stubs for the awooop services, opened on first use and closed together.

    client = Client(key=..., scheduler="host:50052")
    run = await client.call(client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=...))
    """

    def __init__(
        self,
        *,
        key: str | None = None,
        ingest: str | None = None,
        scheduler: str | None = None,
        saga: str | None = None,
        gateway: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tls: bool | None = None,
        ca_file: str | None = None,
        tracer_provider: Any = None,
    ) -> None:
        self.key = api_key(key)
        # OpenTelemetry: given, or the application's global provider; None: calls are not traced
        self.tracer_provider = tracing.resolve(tracer_provider)
        self.addresses = {
            "ingest": address("ingest", ingest),
            "scheduler": address("scheduler", scheduler),
            "saga": address("saga", saga),
            "gateway": address("gateway", gateway),
        }
        self.timeout = timeout
        self._tls = tls
        self._ca_file = ca_file
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        # False once the saga service answered RecordStep with UNIMPLEMENTED (an older service):
        # every step is then journaled with BeginStep + CompleteStep
        self.record_steps = True

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),) if self.key else ()

    def stub(self, service: str) -> Any:
        if service not in self._stubs:
            ch = open_channel(
                self.addresses[service],
                tls=self._tls,
                ca_file=self._ca_file,
                interceptors=tracing.client_interceptors(self.tracer_provider),
            )
            self._channels[service] = ch
            self._stubs[service] = STUBS[service](ch)
        return self._stubs[service]

    @property
    def ingest(self) -> ingest_pb2_grpc.IngestServiceStub:
        return self.stub("ingest")  # type: ignore[no-any-return]

    @property
    def scheduler(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        return self.stub("scheduler")  # type: ignore[no-any-return]

    @property
    def saga(self) -> saga_pb2_grpc.SagaServiceStub:
        return self.stub("saga")  # type: ignore[no-any-return]

    @property
    def gateway(self) -> tools_pb2_grpc.ToolGatewayServiceStub:
        return self.stub("gateway")  # type: ignore[no-any-return]

    async def call(self, method: Callable[..., Awaitable[R]], request: Any, *, timeout: float | None = None) -> R:
        """One RPC with a deadline and the key; a failure raises AwooopError (LeaseLost for LEASE_LOST)."""
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as err:
            raise AwooopError.from_rpc(err, _method_name(method)) from None

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._stubs.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _method_name(method: Any) -> str:
    raw = getattr(method, "_method", b"")
    return raw.decode() if isinstance(raw, bytes) else str(raw)
