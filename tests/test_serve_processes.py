"""`awooop serve <one service>` as a platform team first runs it: three real processes on one host
with no port setting but the store's, each on its own default gRPC and /metrics port (only the
ingest service binds the HTTP port), and each stopping within 5 s of SIGTERM (the saga's
compensation loop no longer sleeps out its interval first).

The processes bind a loopback address of their own (127.x.y.z, all of which reach this host), so
the default ports are tested as they are without colliding with anything else on the machine."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from services.common.settings import SERVICE_METRICS_PORTS, Settings
from tests.harness.helpers import ROOT, eventually

STOP_WITHIN = 5.0  # seconds from SIGTERM to exit


def metrics_answer(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as resp:
            return resp.status == 200 and b"grpc_server" in resp.read()
    except OSError:
        return False


async def test_three_single_service_processes_share_a_host_and_stop_within_5_s(
    db_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    host = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_HOST": host,
        "AWOOOP_DATABASE_URL": db_dsn,
        "AWOOOP_REDIS_URL": redis_url,
        "AWOOOP_REDIS_PREFIX": f"awooop:{uuid.uuid4().hex}:",
        # a long interval: the saga must not wait it out on SIGTERM
        "AWOOOP_COMPENSATION_INTERVAL": "60",
    }
    defaults = Settings()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for service in ("ingest", "scheduler", "saga"):
            with open(tmp_path / f"{service}.err", "wb") as err:
                procs[service] = subprocess.Popen(
                    [sys.executable, "-m", "awooop.cli", "serve", service],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )

        def log(service: str) -> str:
            return (tmp_path / f"{service}.err").read_text(errors="replace")

        for service, proc in procs.items():

            async def serving(service: str = service, proc: subprocess.Popen[bytes] = proc) -> bool:
                assert proc.poll() is None, f"serve {service} exited with {proc.returncode}:\n{log(service)}"
                return '"msg": "serving"' in log(service)

            await eventually(serving, timeout=60, what=f"serve {service} to serve")

        # each process has its own metrics port; only ingest listens for HTTP (webhooks)
        for service in procs:
            port = SERVICE_METRICS_PORTS[service]
            await eventually(
                lambda port=port: asyncio.to_thread(metrics_answer, host, port),  # type: ignore[misc]
                timeout=30,
                what=f"{service} /metrics on {port}",
            )
        socket.create_connection((host, defaults.http_port), timeout=5).close()

        stopped: dict[str, float] = {}
        for service, proc in procs.items():
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 30)
            stopped[service] = time.monotonic() - started
            assert code == 0, f"serve {service} exited with {code}:\n{log(service)}"
        slow = {s: round(t, 1) for s, t in stopped.items() if t > STOP_WITHIN}
        assert not slow, f"took longer than {STOP_WITHIN} s to stop on SIGTERM: {slow}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
