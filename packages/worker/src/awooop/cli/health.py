"""`awooop health ADDR [--service NAME]`: one grpc.health.v1 Check, exit 0 when SERVING.

It is the healthcheck of the Docker image and of docker-compose.yml, so it stays small:
client-side only (grpc and the health stubs), no service code, no store. Any other answer
(NOT_SERVING, an unknown service, an unreachable or TLS-mismatched server) exits 1, the
only failure code Docker healthchecks define.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# short names for the awooop services; anything else is passed through as a full name
SERVICE_ALIASES = {
    "ingest": "awooop.ingest.v1.IngestService",
    "scheduler": "awooop.scheduler.v1.SchedulerService",
    "saga": "awooop.saga.v1.SagaService",
    "gateway": "awooop.tools.v1.ToolGatewayService",
}
# health names of a service's planes that can fail on their own: the saga's compensation is
# NOT_SERVING while the tool gateway refuses its key, while its journal (saga, "") stays SERVING
PLANE_ALIASES = {"compensation": "awooop.saga.compensation"}
HEALTHY = 0
UNHEALTHY = 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "health",
        help="check a server's grpc.health.v1 status (exit 0 when SERVING); used by container healthchecks",
    )
    p.add_argument("address", help="host:port of an awooop service, e.g. 127.0.0.1:50051")
    p.add_argument(
        "--service",
        default="",
        help="ingest, scheduler, saga, compensation, gateway or a full gRPC service name; default: the whole server",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    p.add_argument("--tls", action="store_true", help="connect with TLS (the server has AWOOOP_TLS_CERT_FILE set)")
    p.add_argument("--ca-file", default=None, help="TLS: CA (or self-signed cert) to trust; default: system roots")
    p.add_argument("--server-name", default=None, help="TLS: name expected in the server certificate")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing; the exit code tells")
    p.set_defaults(func=cmd_health)


def resolve_service(name: str) -> str:
    return SERVICE_ALIASES.get(name) or PLANE_ALIASES.get(name, name)


def check(channel: Any, service: str = "", timeout: float = 3.0) -> tuple[int, str]:
    """(exit code, one-line verdict) of one Health/Check over a synchronous channel."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs declare no methods on HealthStub
    label = service or "server"
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as err:
        code = err.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return UNHEALTHY, f"{label}: SERVICE_UNKNOWN (the server does not serve it)"
        return UNHEALTHY, f"{label}: unreachable: {code.name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return (HEALTHY if reply.status == health_pb2.HealthCheckResponse.SERVING else UNHEALTHY), f"{label}: {status}"


def open_channel(address: str, *, tls: bool, ca_file: str | None, server_name: str | None) -> Any:
    import grpc

    if not tls:
        return grpc.insecure_channel(address)
    roots = None
    if ca_file:
        with open(ca_file, "rb") as f:
            roots = f.read()
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=roots), options=options)


def cmd_health(args: argparse.Namespace) -> int:
    try:
        channel = open_channel(args.address, tls=args.tls, ca_file=args.ca_file, server_name=args.server_name)
    except OSError as exc:
        print(f"cannot read --ca-file: {exc}", file=sys.stderr)
        return UNHEALTHY
    with channel:
        code, verdict = check(channel, resolve_service(args.service), args.timeout)
    if not args.quiet:
        print(verdict, file=sys.stdout if code == HEALTHY else sys.stderr)
    return code
