"""The haproxy recipe of docs/operations.md, run: Debian's haproxy (.ci/install-debian) in front
of two scheduler replicas over h2c, checking each replica's grpc.health.v1 status with a raw
tcp-check (haproxy has no gRPC health check: the check sends one HTTP/2 Health/Check request
for the whole server, "", and expects the SERVING answer). A replica that drains (health
NOT_SERVING during AWOOOP_SHUTDOWN_DELAY) is taken out by the check before it refuses calls,
and the clients behind the proxy see no error.

Written for HAProxy 2.6 (Debian 12, .ci/install-debian prints the version): `proto h2` servers and
the raw tcp-check send-binary / expect binary rules."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import grpc

from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common.embedded import free_port, wait_port
from tests.harness.helpers import eventually
from tests.harness.infra import Tally, require_program

PROJECT = "ops"


def health_probe_hex() -> str:
    """One HTTP/2 connection's bytes asking grpc.health.v1.Health/Check for "": the preface, an
    empty SETTINGS frame, HEADERS (HPACK literals, no Huffman) and one DATA frame holding an empty
    request. This is the hex string docs/operations.md gives for `tcp-check send-binary`."""

    def literal(index: int, value: bytes) -> bytes:  # literal without indexing, indexed name
        return (bytes([index]) if index < 15 else bytes([0x0F, index - 15])) + bytes([len(value)]) + value

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    headers = (
        bytes([0x83, 0x86])  # :method POST, :scheme http
        + literal(4, b"/grpc.health.v1.Health/Check")  # :path
        + literal(1, b"localhost")  # :authority
        + literal(31, b"application/grpc")  # content-type
        + bytes([0x00, 2])
        + b"te"
        + bytes([8])
        + b"trailers"
    )
    data = b"\x00\x00\x00\x00\x00"  # not compressed, 0 bytes: HealthCheckRequest(service="")
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    return (preface + frame(4, 0, 0, b"") + frame(1, 0x4, 1, headers) + frame(0, 0x1, 1, data)).hex()


# SERVING is the DATA payload 00 00000002 0801; NOT_SERVING (0802) never matches, so the check
# fails at its timeout and the server is taken out
CONFIG = """
global
    log stdout format raw local0 info
defaults
    timeout connect 2s
    timeout client 90s
    timeout server 90s
    timeout check 1s
backend scheduler
    mode http
    balance roundrobin
    option tcp-check
    tcp-check connect
    tcp-check send-binary {probe}
    tcp-check expect binary 00000000020801
    default-server check inter 500ms fall 1 rise 2 proto h2
    server s1 127.0.0.1:{p1}
    server s2 127.0.0.1:{p2}
frontend grpc
    mode http
    bind 127.0.0.1:{front} proto h2
    default_backend scheduler
"""


async def test_haproxy_with_grpc_health_checks_drains_a_replica_without_client_errors(
    start_services: Any, make_key: Any, tmp_path: Path
) -> None:
    exe = require_program("haproxy", "/usr/sbin/haproxy")
    a = await start_services("scheduler", shutdown_delay=3.0)
    b = await start_services("scheduler")
    md = await make_key("w", {PROJECT: ["worker"]})
    front = free_port()
    cfg = Path(tempfile.mkdtemp(prefix="awooop-haproxy-")) / "haproxy.cfg"
    cfg.write_text(
        CONFIG.format(probe=health_probe_hex(), p1=a.ports["scheduler"], p2=b.ports["scheduler"], front=front)
    )
    check = subprocess.run([exe, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    log = tmp_path / "haproxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT)
    tally = Tally()
    try:
        wait_port("127.0.0.1", front, timeout=15)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{front}")
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                try:
                    request = spb.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=1)
                    await stub.ClaimRuns(request, metadata=md, timeout=5)
                    tally.ok()
                except grpc.aio.AioRpcError as err:
                    tally.failed(err)
                await asyncio.sleep(0.01)

        callers = [asyncio.create_task(caller()) for _ in range(4)]
        await eventually(lambda: _true(tally.codes["OK"] >= 50), timeout=20, what="calls through haproxy")
        # replica a drains: NOT_SERVING for 3 s while still serving, then it stops
        await a.stop(1.0)
        after = tally.codes["OK"]
        await eventually(lambda: _true(tally.codes["OK"] >= after + 50), timeout=20, what="calls after the drain")
        stop.set()
        await asyncio.gather(*callers)
        await channel.close()
    finally:
        proc.terminate()
        proc.wait(10)
    text = log.read_text(errors="replace")
    assert "scheduler/s1 is DOWN" in text and "Layer7" in text, text  # the check saw NOT_SERVING
    assert "scheduler/s2 is DOWN" not in text, text
    assert set(tally.codes) == {"OK"}, (tally.reasons, text[-2000:])


async def _true(value: bool) -> bool:
    return value
