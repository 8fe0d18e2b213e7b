"""`awooop health`, the container healthcheck.

Its verdict logic is client code over a synchronous channel, which is what grpcio-testing
drives: the test plays the server and answers each Check with statuses a real awooop
server rarely gives on demand (SERVICE_UNKNOWN, UNKNOWN, an error code), and sees the
exact request the CLI sent. The command itself then runs as a real process against a real
server, before and after that server stops.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc_testing
import pytest
from grpc_health.v1 import health_pb2

from awooop.cli import health as health_cli
from awooop.ingest.v1 import ingest_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2

CHECK = health_pb2.DESCRIPTOR.services_by_name["Health"].methods_by_name["Check"]
Status = health_pb2.HealthCheckResponse


def run_against(answer: Callable[[Any], tuple[Any, grpc.StatusCode, str]], service: str) -> tuple[int, str, Any]:
    """Runs health_cli.check on a grpc_testing channel; answer(request) -> (response, code, details)."""
    channel = grpc_testing.channel([health_pb2.DESCRIPTOR.services_by_name["Health"]], grpc_testing.strict_real_time())
    with ThreadPoolExecutor(1) as pool:
        verdict = pool.submit(health_cli.check, channel, service, 3.0)
        _metadata, request, rpc = channel.take_unary_unary(CHECK)
        response, code, details = answer(request)
        rpc.terminate(response, (), code, details)
        exit_code, message = verdict.result(timeout=10)
    return exit_code, message, request


@pytest.mark.parametrize(
    ("status", "exit_code"),
    [(Status.SERVING, 0), (Status.NOT_SERVING, 1), (Status.UNKNOWN, 1), (Status.SERVICE_UNKNOWN, 1)],
)
def test_only_serving_is_healthy(status: int, exit_code: int) -> None:
    code, message, request = run_against(
        lambda req: (Status(status=status), grpc.StatusCode.OK, ""), "awooop.ingest.v1.IngestService"
    )
    assert request.service == "awooop.ingest.v1.IngestService"
    assert code == exit_code
    assert message == f"awooop.ingest.v1.IngestService: {Status.ServingStatus.Name(status)}"


def test_a_service_the_server_does_not_know_is_unhealthy() -> None:
    code, message, _ = run_against(lambda req: (None, grpc.StatusCode.NOT_FOUND, "unknown service"), "nope")
    assert code == 1 and "SERVICE_UNKNOWN" in message


def test_an_unreachable_server_is_unhealthy_and_says_why() -> None:
    code, message, request = run_against(lambda req: (None, grpc.StatusCode.UNAVAILABLE, "connection refused"), "")
    assert request.service == ""  # no --service: the whole server
    assert code == 1 and message == "server: unreachable: UNAVAILABLE: connection refused"


def test_short_names_resolve_to_the_contract_names() -> None:
    expected = {
        "ingest": ingest_pb2.DESCRIPTOR.services_by_name["IngestService"].full_name,
        "scheduler": scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        "saga": saga_pb2.DESCRIPTOR.services_by_name["SagaService"].full_name,
        "gateway": tools_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name,
    }
    for short, full in expected.items():
        assert health_cli.resolve_service(short) == full
    assert health_cli.resolve_service("grpc.health.v1.Health") == "grpc.health.v1.Health"


async def test_the_command_against_a_real_server(start_services) -> None:
    rt = await start_services("ingest", "saga")

    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "awooop.cli", "health", *args], capture_output=True, text=True, timeout=60
        )

    ingest = f"127.0.0.1:{rt.ports['ingest']}"
    for args in ([ingest], [ingest, "--service", "ingest"], [f"127.0.0.1:{rt.ports['saga']}", "--service", "saga"]):
        out = await asyncio.to_thread(health, *args)
        assert out.returncode == 0 and out.stdout.strip().endswith("SERVING"), out
    out = await asyncio.to_thread(health, ingest, "--service", "scheduler")  # served elsewhere
    assert out.returncode == 1 and "SERVICE_UNKNOWN" in out.stderr
    await rt.stop(0)
    out = await asyncio.to_thread(health, ingest, "--timeout", "2", "-q")
    assert out.returncode == 1 and out.stdout == out.stderr == ""
