"""Channels and stubs for the awooop services, as every client (worker, CLI, demo) uses them.

- Retries: the channel's service config retries UNAVAILABLE only (connection refused, server
  draining, STORE_UNAVAILABLE), up to 4 attempts with exponential backoff. Nothing else is
  retried: every other code is an answer.
- Deadlines: every call gets one (`timeout`, default 10 s) unless the caller passes its own.
- Auth: `authorization: Bearer <key>` metadata on every call.
- Addresses: argument, else AWOOOP_<SERVICE>_ADDR, else AWOOOP_<SERVICE>_PORT (on AWOOOP_HOST), else
  the `awooop up` default port. One address may name several replicas: a comma-separated list
  (`10.0.0.1:50052,10.0.0.2:50052`, host names resolved once when the channel opens) or any gRPC
  target such as `dns:///scheduler.internal:50052` (every A/AAAA record, re-resolved on reconnect).
- Balancing: round_robin over the resolved addresses with client health checking
  (grpc.health.v1 Watch): a replica that reports NOT_SERVING (draining) gets no new calls,
  and a call it refuses is retried on another replica.
- Channel options: `channel_options` are added to (and override) the defaults below.
- TLS: off unless `tls=True`, a CA file is given, or AWOOOP_TLS / AWOOOP_TLS_CA_FILE is set.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Callable, Sequence
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
        # every replica behind one target gets calls; with one address this behaves as pick_first
        "loadBalancingConfig": [{"round_robin": {}}],
        # "" is the whole server's health: a draining process turns it NOT_SERVING first
        "healthCheckConfig": {"serviceName": ""},
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
        ],
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

Req = TypeVar("Req")
R = TypeVar("R")


def client_host(host: str) -> str:
    """The address a local client dials for a listener bound to host."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def local_address(host: str, port: int | str) -> str:
    """host:port a local client dials for a listener bound to host on port (IPv6 in brackets)."""
    dial = client_host(host)
    return f"[{dial}]:{port}" if ":" in dial else f"{dial}:{port}"


def resolve_address(service: str, given: str | None = None) -> tuple[str, str]:
    """(address, where it came from): the given address ("argument"), else AWOOOP_<SERVICE>_ADDR,
    else AWOOOP_<SERVICE>_PORT on AWOOOP_HOST (the port the service was configured to listen on),
    else the `awooop up` default ("default")."""
    if given:
        return given, "argument"
    name = service.upper()
    if os.environ.get(f"AWOOOP_{name}_ADDR"):
        return os.environ[f"AWOOOP_{name}_ADDR"], f"AWOOOP_{name}_ADDR"
    port = os.environ.get(f"AWOOOP_{name}_PORT", "").strip()
    if port.isdigit():
        return local_address(os.environ.get("AWOOOP_HOST", "127.0.0.1").strip(), port), f"AWOOOP_{name}_PORT"
    return DEFAULT_ADDRESSES[service], "default"


def address(service: str, given: str | None = None) -> str:
    """Where a service is (see resolve_address)."""
    return resolve_address(service, given)[0]


def api_key(given: str | None = None) -> str:
    return given or os.environ.get("AWOOOP_API_KEY", "")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _split_host_port(item: str) -> tuple[str, str]:
    host, sep, port = item.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {item!r}: expected host:port")
    return host.strip("[]"), port


def channel_target(addr: str) -> str:
    """The gRPC target for an address: `host:port` and target URIs (`dns:///...`, `ipv4:...`,
    `unix:...`) as given; a comma-separated list becomes one `ipv4:`/`ipv6:` target naming
    every replica (host names in it are resolved now)."""
    if "," not in addr:
        return addr.strip()
    v4: list[str] = []
    v6: list[str] = []
    for item in (a for a in addr.split(",") if a.strip()):
        host, port = _split_host_port(item)
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            ips = list(dict.fromkeys(ipaddress.ip_address(i[4][0]) for i in infos))
        for ip in ips:
            (v4 if ip.version == 4 else v6).append(f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}")
    if v4 and v6:
        return "ipv4:" + ",".join(v4)  # one scheme per target: prefer IPv4 when both resolve
    return ("ipv4:" + ",".join(v4)) if v4 else ("ipv6:" + ",".join(v6))


def channel_options(extra: Sequence[tuple[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """The default options with `extra` added; an extra option replaces a default of its name."""
    given = list(extra or ())
    names = {k for k, _ in given}
    return [*(o for o in CHANNEL_OPTIONS if o[0] not in names), *given]


def open_channel(
    target: str,
    *,
    tls: bool | None = None,
    ca_file: str | None = None,
    options: Sequence[tuple[str, Any]] | None = None,
    interceptors: Sequence[Any] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel with round_robin, client health checking and the UNAVAILABLE-only
    retry policy, to one address, a list of them, or a gRPC target URI (interceptors: tracing's)."""
    ca_file = ca_file or os.environ.get("AWOOOP_TLS_CA_FILE") or None
    if tls is None:
        tls = bool(ca_file) or _env_flag("AWOOOP_TLS")
    target = channel_target(target)
    opts = channel_options(options)
    extra = list(interceptors) or None
    if not tls:
        return grpc.aio.insecure_channel(target, options=opts, interceptors=extra)
    root = None
    if ca_file:
        with open(ca_file, "rb") as f:
            root = f.read()
    return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root), options=opts, interceptors=extra)


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
        channel_options: Sequence[tuple[str, Any]] | None = None,
        tracer_provider: Any = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        self.key = api_key(key)
        # OpenTelemetry: given, or the application's global provider; None: calls are not traced
        self.tracer_provider = tracing.resolve(tracer_provider)
        given = {"ingest": ingest, "scheduler": scheduler, "saga": saga, "gateway": gateway}
        # (address, where it came from) per service: error messages name the setting to change
        self.sources = {service: resolve_address(service, g) for service, g in given.items()}
        self.addresses = {service: a for service, (a, _) in self.sources.items()}
        self.timeout = timeout
        self._tls = tls
        self._ca_file = ca_file
        self._channel_options = list(channel_options or ())
        # grpc.aio client interceptors of the application's own, after the tracing one
        self._interceptors = list(interceptors)
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
                options=self._channel_options,
                interceptors=[*tracing.client_interceptors(self.tracer_provider), *self._interceptors],
            )
            self._channels[service] = ch
            self._stubs[service] = STUBS[service](ch)
        return self._stubs[service]

    @property
    def ingest(self) -> ingest_pb2_grpc.IngestServiceAsyncStub:
        return self.stub("ingest")  # type: ignore[no-any-return]

    @property
    def scheduler(self) -> scheduler_pb2_grpc.SchedulerServiceAsyncStub:
        return self.stub("scheduler")  # type: ignore[no-any-return]

    @property
    def saga(self) -> saga_pb2_grpc.SagaServiceAsyncStub:
        return self.stub("saga")  # type: ignore[no-any-return]

    @property
    def gateway(self) -> tools_pb2_grpc.ToolGatewayServiceAsyncStub:
        return self.stub("gateway")  # type: ignore[no-any-return]

    async def call(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Req, R], request: Req, *, timeout: float | None = None
    ) -> R:
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
